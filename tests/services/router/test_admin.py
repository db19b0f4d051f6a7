"""The admin port: operations (/metrics, /dashboard, /cluster/status, the API's docs and schema)
are served there and nowhere on the public port, which keeps /v1/*, /health and /tokenize."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.router.__main__ import parse_settings
from services.stack.ports import free_port
from tests.services.router.conftest import MODEL, Cluster

REPO = Path(__file__).resolve().parents[3]
ADMIN_ONLY = (
    "/metrics",
    "/dashboard",
    "/dashboard/state",
    "/cluster/status",
    "/docs",
    "/redoc",
    "/openapi.json",
)


def test_the_public_port_serves_no_operations(cluster: Cluster) -> None:
    router = cluster.router(memory_manager="")
    with router.http() as http:
        for path in ADMIN_ONLY:
            response = http.get(path)
            assert response.status_code == 404, path
            assert "error" in response.json(), path  # in OpenAI's shape, as every error
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models").status_code == 200
        tokenized = http.post("/tokenize", json={"prompt": "one two"})
        assert tokenized.status_code == 200 and tokenized.json()["count"] >= 2


def test_the_admin_port_serves_them(cluster: Cluster) -> None:
    router = cluster.router(memory_manager="")
    with router.admin() as admin:
        status = {path: admin.get(path).status_code for path in (*ADMIN_ONLY, "/health")}
        schema = admin.get("/openapi.json").json()
        docs = admin.get("/docs").text
        metrics = admin.get("/metrics").text
        # The API itself is not served here.
        assert admin.get("/v1/models").status_code == 404
        assert admin.post("/v1/completions", json={"prompt": "x"}).status_code in (404, 405)
    assert set(status.values()) == {200}, status
    # The schema is the public API's: what clients can call on the public port, nothing else.
    assert set(schema["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
    }
    assert "/openapi.json" in docs
    assert "quire_router_requests_total" in metrics


def test_admin_settings_flag_env_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("QUIRE_")]:
        monkeypatch.delenv(name)
    defaults = parse_settings([])
    assert (defaults.admin_host, defaults.admin_port) == ("", 8001)
    monkeypatch.setenv("QUIRE_ADMIN_PORT", "9101")
    monkeypatch.setenv("QUIRE_ADMIN_HOST", "0.0.0.0")
    settings = parse_settings([])
    assert (settings.admin_host, settings.admin_port) == ("0.0.0.0", 9101)
    assert parse_settings(["--admin-port", "0"]).admin_port == 0


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the router exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@pytest.mark.parametrize("with_admin", [True, False])
def test_one_process_serves_both_ports(tmp_path: Path, with_admin: bool) -> None:
    """`python -m services.router`: both listeners in one process (none with --admin-port 0),
    and SIGTERM stops them both."""
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "services.router", "--model", MODEL, "--redis-url", ""]
    argv += ["--executors", "127.0.0.1:1", "--memory-manager", "", "--port", str(port)]
    argv += ["--admin-port", str(admin_port if with_admin else 0)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
        if with_admin:
            _wait_listening(admin_port, proc)
            assert httpx.get(f"http://127.0.0.1:{admin_port}/metrics").status_code == 200
        else:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{admin_port}/metrics")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
