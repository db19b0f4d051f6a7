"""`python -m services.router` on SIGTERM: it stops accepting at once, lets open streams finish
within --shutdown-grace-s, ends the ones that outlive it, and exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from services.stack.ports import free_port
from tests.services.conftest import LoopThread, wait_for
from tests.services.router.conftest import MODEL
from tests.services.router.fake_executor import Script, start_fake

REPO = Path(__file__).resolve().parents[3]
GRACE_S = 3.0


def read_stream(url: str, max_tokens: int, seen: dict[str, Any]) -> None:
    """Stream a completion, noting the first chunk, [DONE] and how it ended."""
    body = {"prompt": [5, 6, 7], "max_tokens": max_tokens, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                seen.setdefault("first", time.monotonic())
                if line == "data: [DONE]":
                    seen["done"] = True
    except httpx.HTTPError as exc:
        seen["error"] = repr(exc)
    seen["end"] = time.monotonic()


def test_sigterm_finishes_open_streams_within_the_grace_then_exits(
    bg_loop: LoopThread, tmp_path: Path
) -> None:
    fake = bg_loop.run(start_fake("ex-drain"))
    # One token every 0.1 s: a 10-token stream ends inside the grace, a 100-token one does not.
    fake.executor.reset(Script(tokens=list(range(10, 110)), delay_s=0.1))
    port = free_port()
    argv = [sys.executable, "-m", "services.router", "--model", MODEL, "--redis-url", ""]
    argv += ["--executors", fake.address, "--memory-manager", "", "--admin-port", "0"]
    argv += ["--port", str(port), "--shutdown-grace-s", str(GRACE_S)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "router.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _listening(port), 60, "the router's port")
            short: dict[str, Any] = {}
            long: dict[str, Any] = {}
            threads = [
                threading.Thread(target=read_stream, args=(url, 10, short)),
                threading.Thread(target=read_stream, args=(url, 100, long)),
            ]
            for thread in threads:
                thread.start()
            wait_for(lambda: "first" in short and "first" in long, 10, "both streams")
            sigterm_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # It stops accepting at once: a new connection is refused (readiness fails).
            wait_for(lambda: not _listening(port), 2, "the listener to close")
            assert proc.wait(GRACE_S + 10) == 0
            exited_at = time.monotonic()
            for thread in threads:
                thread.join(10)
        finally:
            if proc.poll() is None:
                proc.kill()
            bg_loop.run(fake.server.stop(None))
    assert short.get("done") and "error" not in short, short
    assert not long.get("done"), long  # cut at the end of the grace period
    assert exited_at - sigterm_at < GRACE_S + 5
    assert GRACE_S - 0.5 <= long["end"] - sigterm_at < GRACE_S + 1.9


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
