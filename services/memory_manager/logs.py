"""Memory-manager logging: the shared JSON setup (services/common/jsonlog.py).

Step lines carry the executor's `request_ids` (its Step calls' `x-request-ids` metadata).
"""

from __future__ import annotations

from services.common import jsonlog

SERVICE = "memory-manager"


def configure_logging(level: str = "info") -> None:
    """JSON logs to stderr at `level` and above."""
    jsonlog.configure_logging(SERVICE, level)
