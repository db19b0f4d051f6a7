"""A failed chaos test's report carries its stack's warnings and errors, so that a failure on
a machine whose logs are gone afterwards (a CI run) can still be read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack.runner import Stack

LINES_PER_LOG = 12


def stack_log_dirs(item: pytest.Item) -> list[Path]:
    """The log folders of the stacks a test ran: its own (under tmp_path) or the shared one."""
    funcargs = getattr(item, "funcargs", {})
    dirs = []
    if isinstance(funcargs.get("tmp_path"), Path):
        dirs.append(funcargs["tmp_path"] / "logs")
    if isinstance(funcargs.get("whole_stack"), Stack):
        dirs.append(funcargs["whole_stack"].run_dir / "logs")
    return [d for d in dirs if d.is_dir()]


def warnings_of(log: Path) -> list[str]:
    """The last warning and error lines of one process's JSON log."""
    picked = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level", "")
        except (ValueError, AttributeError):
            level = "error" if "Traceback" in line else ""
        if level in ("warning", "error", "critical"):
            picked.append(line[:400])
    return picked[-LINES_PER_LOG:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    for folder in stack_log_dirs(item):
        for log in sorted(folder.glob("*.log")):
            lines = warnings_of(log)
            if lines:
                report.sections.append((f"stack log {log.name}", "\n".join(lines)))
