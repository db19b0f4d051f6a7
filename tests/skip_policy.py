"""A skip is allowed only for hardware or an environment the run does not have; any other skip
fails the run, and the allowed ones are counted in one line each at the end.

A skip that hides a missing build output (the C++ library, a model) would make a green run
mean less than it says, so the reasons are a closed list: a test skips with a reason that
starts with one of `EXPECTED`'s prefixes (tests/hardware.py builds the CPU ones).
"""

from __future__ import annotations

from collections import Counter

import pytest

# reason prefix -> why such a skip is expected
EXPECTED = {
    "needs CUDA": "no GPU on this machine; `make gpu-check` runs these where one is lent",
    "needs --device": "the other device's run (`--device cpu` / `--device cuda`) covers these",
    "needs AVX-512": "this CPU lacks the instructions; the kernel is not used on it",
    "needs x86-64-v3": "this CPU lacks AVX2, FMA or F16C; the kernel is not used on it",
    "needs the compose stack": "Docker and image builds; `make compose-test` runs these",
    "needs the grafana image": "no registry reachable and no package carries the image",
}


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def is_expected(reason: str) -> bool:
    return reason.startswith(tuple(EXPECTED))


class SkipPolicy:
    """One run's skips, by reason."""

    def __init__(self) -> None:
        self.skips: Counter[str] = Counter()

    def unexpected(self) -> list[str]:
        return [reason for reason in self.skips if not is_expected(reason)]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips[skip_reason(report)] += 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unexpected() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.skips:
            return
        terminalreporter.section("skips")
        for reason, count in sorted(self.skips.items()):
            if is_expected(reason):
                terminalreporter.line(f"{count:4d} expected: {reason}")
            else:
                terminalreporter.line(f"{count:4d} NOT ALLOWED (fails the run): {reason}", red=True)
        if self.unexpected():
            prefixes = ", ".join(repr(prefix) for prefix in EXPECTED)
            terminalreporter.line(f"a skip must start with one of: {prefixes}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(), "quire-skip-policy")
