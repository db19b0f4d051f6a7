"""services.common.healthcheck: the container health checks of the Dockerfile and compose.yaml."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.healthcheck import main
from services.stack.ports import free_port


@pytest.fixture
def grpc_health() -> Iterator[tuple[health.HealthServicer, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_grpc_serving_not_serving_and_unknown_service(
    grpc_health: tuple[health.HealthServicer, str], capsys: pytest.CaptureFixture[str]
) -> None:
    servicer, address = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main(["grpc", address]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["grpc", address]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err
    assert main(["grpc", address, "--service", "quire.v1.Executor"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_grpc_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grpc", f"127.0.0.1:{free_port()}", "--timeout-s", "0.5"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_http_200_is_healthy_anything_else_is_not(capsys: pytest.CaptureFixture[str]) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["http", f"{base}/health"]) == 0
        assert main(["http", f"{base}/other"]) == 1
        assert "HTTP 503" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    assert main(["http", f"http://127.0.0.1:{free_port()}/health", "--timeout-s", "0.5"]) == 1
