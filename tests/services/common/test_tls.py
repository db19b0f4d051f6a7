"""Optional gRPC TLS: a TLS memory manager talks to TLS clients and refuses plaintext ones."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from quire.block.tables import BlockTables
from services.executor.remote_allocator import AllocatorUnavailableError, RemoteBlockAllocator
from services.memory_manager.manager_server import MemoryManagerServer
from services.memory_manager.manager_settings import Settings


def _self_signed(directory: Path) -> tuple[str, str]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def _allocator(port: int, tls_ca: str) -> RemoteBlockAllocator:
    return RemoteBlockAllocator(
        target=f"localhost:{port}",
        executor_id="ex-tls",
        epoch=1,
        num_blocks=8,
        block_size=16,
        enable_prefix_caching=True,
        address="localhost:1",
        tables=BlockTables(16),
        timeout_s=5.0 if tls_ca else 1.0,
        retry_total_s=0.5,  # a plaintext client is refused, not retried for long
        tls_ca=tls_ca,
    )


def test_tls_memory_manager(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    settings = Settings(port=0, redis_url="", tls_cert=cert, tls_key=key, shutdown_grace_s=0)

    async def scenario() -> None:
        server = MemoryManagerServer(settings)
        port = await server.start()
        try:
            with _allocator(port, tls_ca=cert) as secure:
                assert await asyncio.to_thread(secure.register)
                assert (await asyncio.to_thread(secure.stats)).num_blocks_total == 8
            with _allocator(port, tls_ca="") as plain, pytest.raises(AllocatorUnavailableError):
                await asyncio.to_thread(plain.register)
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_cert_and_key_go_together() -> None:
    with pytest.raises(ValueError, match="tls-key"):
        Settings(tls_cert="cert.pem")
