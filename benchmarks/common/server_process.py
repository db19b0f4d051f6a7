"""A peer's HTTP server as a child process: started, waited on until /health says 200, stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

LOG_TAIL_LINES = 40


def log_tail(path: Path, num_lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file (what an error quotes)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 30) -> None:
    """SIGTERM the process's group (a server and the workers it started), SIGKILL what stays."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # The leader may be gone while its children are not.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def serving_process(
    name: str,
    argv: Sequence[str],
    base_url: str,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    startup_timeout_s: float = 180,
    error: type[Exception] = RuntimeError,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in its own process group (output appended to `log_path`) until GET
    {base_url}/health answers 200, yield the process, and stop the group when the block exits,
    however it exits. `error` (with the log's tail) when it exits or stays unhealthy past
    `startup_timeout_s`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise error(
                    f"{name} exited with {proc.returncode} before becoming healthy; "
                    f"{log_path} ends:\n{log_tail(log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise error(
                    f"{name} not healthy after {startup_timeout_s:.0f} s; "
                    f"{log_path} ends:\n{log_tail(log_path)}"
                )
            time.sleep(0.5)
        yield proc
    finally:
        stop_group(proc)
