"""SIGTERM as an exception, so a benchmark stopped with `kill` still stops what it started."""

from __future__ import annotations

import signal
import sys
from types import FrameType


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit(143): `finally` blocks and context managers run (the
    stacks and peer servers a benchmark started are stopped) instead of being left behind."""

    def handler(signum: int, frame: FrameType | None) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
