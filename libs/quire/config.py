"""EngineConfig: every knob of the offline engine, with its default."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30  # KV budget on CPU when num_kv_blocks is None
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90  # fraction of free GPU memory the KV cache may take


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. Validated on construction; `resolve_*` pick auto values."""

    model: str  # local Hugging Face checkpoint directory
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # cap on the pool; None sizes it from memory
    enable_prefix_caching: bool = True  # share full prompt blocks by chained hash
    max_num_seqs: int = 256  # most sequences running at once
    max_num_batched_tokens: int = 2048  # most tokens per step (longer prompts are chunked)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    # auto = bfloat16 on CUDA and on CPUs with native bf16 (AVX512_BF16 or AMX), else float32
    dtype: str = "auto"
    device: str = "auto"  # auto = cuda when available, else cpu
    seed: int = 0  # default seed for unseeded random sampling

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype}")
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device is cuda but no CUDA device is available")
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            native = device.type == "cuda" or cpu_has_native_bf16()
            return torch.bfloat16 if native else torch.float32
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]


@functools.cache
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512_BF16 or AMX-BF16).

    Elsewhere bfloat16 is emulated and slower than float32, so `dtype="auto"` keeps float32
    (vLLM's CPU backend recommends the same).
    """
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False
