"""Executor epochs: a restarted process must outrank its previous incarnation."""

from __future__ import annotations

import time

from services.executor.executor_server import new_epoch


def test_epochs_grow_across_restarts_and_fit_int63() -> None:
    first = new_epoch()
    time.sleep(0.002)
    second = new_epoch()
    # the memory manager refuses an epoch older than the one it holds
    assert second > first
    assert 0 < first < 2**63 and 0 < second < 2**63
