"""A peer's HTTP server as a child process: started, waited on until /health says 200, stopped."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from services.stack.runner import terminate


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
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (output appended to `log_path`) until GET {base_url}/health answers 200, yield
    the process, and stop it when the block exits. RuntimeError with the log's tail when it
    exits or stays unhealthy past `startup_timeout_s`."""
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
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited ({proc.returncode}): {tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} not healthy after {startup_timeout_s} s: {tail}")
            time.sleep(0.5)
        yield proc
    finally:
        terminate(proc, timeout_s=20)
