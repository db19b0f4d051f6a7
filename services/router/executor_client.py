"""gRPC clients of the executors: one channel per address, SamplingParams on the wire."""

from __future__ import annotations

import grpc

from quire.sampling_params import SamplingParams
from services.common import tls
from services.rpc import executor_pb2, executor_pb2_grpc

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
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


def params_to_proto(params: SamplingParams) -> executor_pb2.SamplingParams:
    """quire.SamplingParams as the executor's wire message (every field set explicitly)."""
    wire = executor_pb2.SamplingParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k or 0,
        min_p=params.min_p,
        max_tokens=params.max_tokens,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
    )
    if params.seed is not None:
        wire.seed = params.seed % 2**64
    if params.logprobs is not None:
        wire.logprobs = params.logprobs
    return wire
