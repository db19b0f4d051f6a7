"""Running a call into a `concurrent.futures.Future` on the thread that owns the engine."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def resolve(fn: Callable[[], T], future: Future[T]) -> None:
    """Run `fn` into `future` (its result or error), unless the future was cancelled."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
