"""Where llama.cpp lives as a benchmark peer: its binaries and the GGUFs it serves.

`make peer-llamacpp` (benchmarks.peers.llamacpp_build) builds `llama-server`, `llama-quantize`
and `llama-perplexity` from llama.cpp's source into .peer-llamacpp/bin/ and writes the default
model's GGUFs into .peer-llamacpp/models/: the packaged Q4_1 file Quire's float32 checkpoint is
dequantized from, F32 / BF16 files `llama-quantize --allow-requantize` makes of it, and a Q8_0
file quantized from the F32 one.
Nothing here builds or imports anything; callers run the binaries as subprocesses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_DIR = REPO_ROOT / ".peer-llamacpp"
BIN_DIR = PEER_DIR / "bin"
MODELS_DIR = PEER_DIR / "models"
# Written by `make peer-llamacpp` last: the source, the build, the GGUFs and their check.
MANIFEST = PEER_DIR / "peer.json"
BINARIES = ("llama-server", "llama-quantize", "llama-perplexity")
MODEL_STEM = "SmolLM2-135M-Instruct"
# The GGUF of each weight format llama.cpp serves, by the dtype name the benchmarks use.
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16", "q4_1": "Q4_1", "q8_0": "Q8_0"}
# The quantized ones: served from the file as it is by llama.cpp and by Quire alike.
QUANTIZED_DTYPES = ("q4_1", "q8_0")
# The KV cache type llama-server runs each with: the weights' own dtype where llama.cpp has it
# (vLLM keeps its KV cache in the model's dtype), its default f16 for Q4_1 and Q8_0.
KV_CACHE_TYPES = {"float32": "f32", "bfloat16": "bf16", "q4_1": "f16", "q8_0": "f16"}
# Quire's kv_cache_dtype for each: the same as llama.cpp's (float16 keys and values under the
# GGUFs' float32 activations).
QUIRE_KV_CACHE_DTYPES = {
    dtype: {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[kind]
    for dtype, kind in KV_CACHE_TYPES.items()
}


class PeerNotBuiltError(RuntimeError):
    """llama.cpp's binaries or GGUFs are missing."""


def binary(name: str) -> Path:
    """The path of one of BINARIES, or raise telling how to build it."""
    path = BIN_DIR / name
    if not path.is_file() or not MANIFEST.is_file():
        raise PeerNotBuiltError(f"{path} is missing: run `make peer-llamacpp`")
    return path


def gguf_path(dtype: str, models_dir: Path = MODELS_DIR, stem: Path | None = None) -> Path:
    """The GGUF for `dtype` (a key of GGUF_TYPES): `<stem>.<TYPE>.gguf`, by default the default
    model's in `models_dir`."""
    if dtype not in GGUF_TYPES:
        raise ValueError(f"llama.cpp serves {sorted(GGUF_TYPES)}, not {dtype!r}")
    stem = models_dir / MODEL_STEM if stem is None else stem
    return stem.with_name(f"{stem.name}.{GGUF_TYPES[dtype]}.gguf")


def manifest() -> dict[str, Any]:
    """What `make peer-llamacpp` recorded, or raise telling how to build it."""
    if not MANIFEST.is_file():
        raise PeerNotBuiltError(f"{MANIFEST} is missing: run `make peer-llamacpp`")
    result: dict[str, Any] = json.loads(MANIFEST.read_text())
    return result
