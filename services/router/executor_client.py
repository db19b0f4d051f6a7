"""gRPC clients of the executors: one channel per address."""

from __future__ import annotations

import grpc

from services.common import keepalive, tls
from services.rpc import executor_pb2_grpc

_CHANNEL_OPTIONS = [
    *keepalive.client_options(),  # the executors' servers accept these pings
    # Fail fast on a dead executor (we retry elsewhere) instead of waiting for it.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class ExecutorClients:
    """Executor stubs by address; channels are opened lazily and kept."""

    def __init__(self, tls_ca: str = "") -> None:
        """`tls_ca`: PEM CA bundle the executors' TLS certificates are checked against
        ('' = plaintext)."""
        self.tls_ca = tls_ca
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, executor_pb2_grpc.ExecutorStub] = {}

    def stub(self, address: str) -> executor_pb2_grpc.ExecutorStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = tls.aio_channel(address, self.tls_ca, _CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = executor_pb2_grpc.ExecutorStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()
        self._stubs.clear()
