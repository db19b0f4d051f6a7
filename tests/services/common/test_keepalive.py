"""services.common.keepalive: a stream that carries no data for many of its client's ping
intervals stays open on a server with `server_options`, and a server with gRPC's defaults cuts
it ("too many pings"), as it cut Generate streams waiting through a long prefill."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import keepalive

PING_MS = 100  # the test's client pings this often
QUIET_S = 4.0  # and the stream carries nothing for this long: 40 pings


async def quiet_stream(server_options: list[tuple[str, Any]]) -> str:
    """Watch a health status that never changes for QUIET_S; how the stream ended."""
    server = grpc.aio.server(options=server_options)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=keepalive.client_options(PING_MS)
    )
    try:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first = await stream.read()  # the current status, then nothing
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        try:
            await asyncio.wait_for(stream.read(), timeout=QUIET_S)
        except TimeoutError:
            return "open"
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
        return "ended"
    finally:
        await channel.close()
        await server.stop(None)


def test_a_quiet_stream_outlives_many_pings() -> None:
    assert asyncio.run(quiet_stream(keepalive.server_options(PING_MS))) == "open"


def test_grpc_s_default_server_cuts_it() -> None:
    ended = asyncio.run(quiet_stream([]))
    assert ended.startswith("UNAVAILABLE") and "ping" in ended.lower(), ended
