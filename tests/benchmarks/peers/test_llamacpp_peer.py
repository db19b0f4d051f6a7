"""llama.cpp as a peer: the server's command line and where its GGUFs are (no binary needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.peers.llamacpp_env import (
    GGUF_TYPES,
    KV_CACHE_TYPES,
    PeerNotBuiltError,
    binary,
    gguf_path,
)
from benchmarks.peers.llamacpp_server import LlamaServerConfig, server_command


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_server_command_pins_slots_context_kv_type_and_threads(tmp_path: Path) -> None:
    gguf = tmp_path / "m.F32.gguf"
    config = LlamaServerConfig(
        gguf, port=8123, num_slots=16, kv_pool_tokens=8192, kv_cache_type="f32", threads=3
    )
    command = server_command(config, Path("/x/llama-server"))
    assert command[0] == "/x/llama-server"
    assert flag(command, "--model") == str(gguf) and flag(command, "--alias") == "m.F32"
    assert flag(command, "--port") == "8123" and flag(command, "--parallel") == "16"
    # one KV pool shared by the slots, each slot capped at the longest request
    assert "--kv-unified" in command and "--cont-batching" in command
    assert flag(command, "--ctx-size") == "8192"
    assert flag(command, "--kv-unified-per-slot") == "2048"
    assert flag(command, "--cache-type-k") == flag(command, "--cache-type-v") == "f32"
    assert flag(command, "--threads") == flag(command, "--threads-batch") == "3"
    with pytest.raises(ValueError):
        LlamaServerConfig(gguf, port=1, kv_pool_tokens=1024, ctx_per_slot=2048)
    with pytest.raises(ValueError):
        LlamaServerConfig(gguf, port=1, num_slots=0)


def test_each_dtype_has_its_gguf_and_kv_cache_type(tmp_path: Path) -> None:
    assert set(GGUF_TYPES) == set(KV_CACHE_TYPES) == {"float32", "bfloat16", "q4_1", "q8_0"}
    names = {d: gguf_path(d, tmp_path).name for d in GGUF_TYPES}
    assert names["float32"].endswith(".F32.gguf") and names["q4_1"].endswith(".Q4_1.gguf")
    assert names["q8_0"].endswith(".Q8_0.gguf")
    assert len(set(names.values())) == 4
    assert KV_CACHE_TYPES["float32"] == "f32" and KV_CACHE_TYPES["bfloat16"] == "bf16"
    # another model's files: STEM.<TYPE>.gguf beside the stem
    assert gguf_path("q8_0", stem=tmp_path / "bench-1b") == tmp_path / "bench-1b.Q8_0.gguf"
    with pytest.raises(ValueError):
        gguf_path("float16")


def test_a_missing_binary_says_how_to_build_it() -> None:
    with pytest.raises(PeerNotBuiltError, match="make peer-llamacpp"):
        binary("llama-no-such-tool")
