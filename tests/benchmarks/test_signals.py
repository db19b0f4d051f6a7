"""A benchmark killed with SIGTERM unwinds (and so stops the servers it started)."""

from __future__ import annotations

import os
import signal

import pytest

from benchmarks.common.signals import exit_on_sigterm


def test_sigterm_unwinds_through_finally() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    cleaned: list[bool] = []
    try:
        exit_on_sigterm()
        with pytest.raises(SystemExit) as exited:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0)  # give the handler a bytecode boundary to run at
            finally:
                cleaned.append(True)
        assert exited.value.code == 128 + signal.SIGTERM
        assert cleaned == [True]
    finally:
        signal.signal(signal.SIGTERM, previous)
