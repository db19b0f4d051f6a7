"""Executor incarnations: each process registers under its id with a new epoch.

One error for one meaning on both sides of the memory manager's API: the manager raises it
for a call that names an epoch other than the registered one, the executor's allocator
raises it when the manager answers FAILED_PRECONDITION (a newer incarnation of this executor
registered since).
"""

from __future__ import annotations


class StaleEpochError(Exception):
    """A call names an executor incarnation other than the one registered."""
