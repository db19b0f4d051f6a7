"""Container health checks with nothing but the image's Python (no grpc_health_probe, no curl).

    python -m services.common.healthcheck grpc 127.0.0.1:50051 [--service quire.v1.MemoryManager]
    python -m services.common.healthcheck http http://127.0.0.1:8000/health

Exit status 0 when healthy (gRPC: `grpc.health.v1.Health/Check` answers SERVING; HTTP: status
200), 1 otherwise, with one line on stderr saying why. Docker HEALTHCHECKs and compose
healthchecks run it; Kubernetes uses its native `grpc:` and `httpGet:` probes instead.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check_grpc(address: str, service: str = "", timeout_s: float = 2.0) -> str | None:
    """None when `address` reports SERVING for `service`, else the reason it is unhealthy."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return f"{address}: {exc.code().name} {exc.details() or ''}".rstrip()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_http(url: str, timeout_s: float = 2.0) -> str | None:
    """None when GET `url` answers 200, else the reason it is unhealthy."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.common.healthcheck",
        description="Exit 0 when a service is healthy.",
    )
    parser.add_argument("kind", choices=["grpc", "http"])
    parser.add_argument("target", help="host:port for grpc, a URL for http")
    parser.add_argument("--service", default="", help="gRPC health service name ('' = server)")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="deadline of the check")
    args = parser.parse_args(argv)
    if args.kind == "grpc":
        problem = check_grpc(args.target, args.service, args.timeout_s)
    else:
        problem = check_http(args.target, args.timeout_s)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
