"""Optional TLS for Quire's gRPC hops: server credentials from a cert and key, channels
that verify the server against a CA bundle. Empty paths mean plaintext (the default)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

ChannelOptions = Sequence[tuple[str, Any]]


def check_server_paths(cert: str, key: str) -> None:
    """Raise ValueError unless both or neither of `cert` and `key` are given."""
    if bool(cert) != bool(key):
        raise ValueError("--tls-cert and --tls-key go together (give both or neither)")


def add_port(server: Any, address: str, cert: str = "", key: str = "") -> int:
    """Bind `address` on a grpc (or grpc.aio) server, with TLS when `cert` and `key` are set.

    Returns the bound port (0 when the bind failed, like grpc's own `add_*_port`).
    """
    check_server_paths(cert, key)
    if not cert:
        port: int = server.add_insecure_port(address)
        return port
    credentials = grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])
    port = server.add_secure_port(address, credentials)
    return port


def _credentials(ca: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())


def channel(target: str, ca: str = "", options: ChannelOptions = ()) -> grpc.Channel:
    """A synchronous channel; TLS verified against the CA bundle `ca` when it is set."""
    if not ca:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, _credentials(ca), options=list(options))


def aio_channel(target: str, ca: str = "", options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel; TLS verified against the CA bundle `ca` when it is set."""
    if not ca:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, _credentials(ca), options=list(options))
