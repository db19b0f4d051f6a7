"""EngineConfig: every knob of the engine, defined once with its default and its one-line help.

The offline `LLM`'s keyword arguments are these fields; the executor's settings take each
field's default and help from here (`engine_field`), so a default is written in one place.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30  # KV budget on CPU when num_kv_blocks is None
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90  # fraction of free GPU memory the KV cache may take
PREEMPTION_MODES = ("recompute", "swap")  # EngineConfig.preemption_mode's values
PULL_POLICIES = ("measured", "always")  # EngineConfig.pull_policy's values
SCHEDULING_POLICIES = ("fcfs", "shortest")  # EngineConfig.scheduling_policy's values
QUANTIZED_ACTIVATIONS = ("int8", "float32")  # EngineConfig.quantized_activations' values
FLOAT_DTYPES = ("float32", "bfloat16", "float16")  # dtype's and kv_cache_dtype's, besides auto


def _setting(default: Any, help: str) -> Any:
    """A field with its default and its one-line help (shown by every CLI that offers it)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. Validated on construction; `resolve_*` pick auto values."""

    model: str = field(metadata={"help": "local Hugging Face checkpoint directory"})
    block_size: int = _setting(16, "tokens per KV block (a power of two)")
    num_kv_blocks: int | None = _setting(
        None,
        "KV pool size in blocks (unset: sized from memory, 2 GiB on CPU, 90% of the free GPU "
        "memory on CUDA, capped at what max_num_seqs full-length sequences use)",
    )
    enable_prefix_caching: bool = _setting(True, "share full prompt blocks by chained hash")
    free_outside_window: bool = _setting(
        True,
        "release a running sequence's blocks that fell out of the sliding window: every block "
        "before it when every layer slides (Mistral); the sliding layers' blocks, in a table of "
        "their own, when the model also has global layers (Gemma 2/3, gpt-oss)",
    )
    max_num_seqs: int = _setting(256, "most sequences running at once")
    max_num_batched_tokens: int = _setting(
        2048, "most tokens per engine step (longer prompts are chunked)"
    )
    max_model_len: int | None = _setting(None, "context cap (default: the model's)")
    scheduling_policy: str = _setting(
        "fcfs",
        "which prompts a step prefills first: fcfs (arrival order) or shortest (the shortest "
        "remaining prefill first, a prompt's waiting time counted against its length so none "
        "starves; a burst split into the steps that give its first tokens soonest in sum, and "
        "a long prompt chunked so shorter arrivals go between its chunks: first tokens "
        "sooner, the streams' pauses longer)",
    )
    max_decode_stall: float = _setting(
        4.0,
        "under the shortest policy, in a burst (more than one prompt to prefill): how much "
        "longer than the decodes alone a step may run while streams decode that were already "
        "streaming when the burst arrived (a multiple of the decode step, both predicted from "
        "the fitted step costs); its prompt tokens are chunked to fit. The streams a burst "
        "starts itself and a prompt joining running streams alone are not bounded; 0: no bound",
    )
    num_speculative_tokens: int = _setting(
        0,
        "most draft tokens a decoding stream runs per step, guessed from its own earlier tokens "
        "(n-gram speculation, quire.engine.ngram_drafts): each emitted token is still the "
        "model's own sample after the tokens before it (float32 gives the tokens of decoding "
        "without drafts; in half precision a near-tie may fall the other way, as between "
        "batch sizes); a step takes the drafts whose expected "
        "kept tokens are worth their cost under the fitted step costs, so a memory-bound step "
        "(few streams) emits several tokens and a compute-bound one runs as without. Not for "
        "n>1 or structured outputs; 0: off",
    )
    speculative_ngram_min: int = _setting(
        2, "the shortest suffix of a stream's tokens looked up for drafts"
    )
    speculative_ngram_max: int = _setting(
        4, "the longest suffix of a stream's tokens looked up for drafts (the longest found wins)"
    )
    dtype: str = _setting(
        "auto",
        "auto (bfloat16 on CUDA and on CPUs with native bf16: AVX512_BF16 or AMX, else "
        "float32), float32, bfloat16 or float16",
    )
    kv_cache_dtype: str = _setting(
        "auto",
        "the dtype KV blocks are stored in: auto (the model's: the dtype its attention runs "
        "in), float32, bfloat16 or float16. A 16-bit cache under a float32 model (float32 "
        "weights, or quantized ones) holds twice the tokens in the same memory and reads half "
        "the bytes a decode step; its attention rounds queries, keys and values to that dtype "
        "and computes in float32",
    )
    device: str = _setting("auto", "auto (cuda when available, else cpu), cpu or cuda[:N]")
    seed: int = _setting(0, "default seed for unseeded random sampling")
    preemption_mode: str = _setting(
        "swap",
        "how a sequence preempted for room comes back: swap (its full computed KV blocks are "
        "copied to a host pool and loaded back when it resumes; what the pool lacks is "
        "recomputed) or recompute (all of it is recomputed, minus prefix-cache hits)",
    )
    swap_space: float = _setting(
        4.0,
        "GiB of host memory for KV blocks of preempted sequences (preemption_mode swap; "
        "least recently used blocks are dropped past it; 0 disables swapping)",
    )
    quantized_activations: str = _setting(
        "int8",
        "how weights in 32-weight blocks (a GGUF's Q8_0, Q4_0 and Q4_1; AWQ, GPTQ and "
        "compressed-tensors integers) meet a step of fewer than 96 tokens on the "
        "CPU: int8 (the activations quantized to 8 bits per 32 inputs and multiplied in "
        "integers, as llama.cpp does) or float32 (the dequantized weights times float32 "
        "activations, the torch oracle's values); longer steps and other formats are float32",
    )
    huge_pages: bool = _setting(
        True,
        "on a Linux CPU whose kernel offers transparent huge pages (enabled: madvise or "
        "always), keep the weights and the KV blocks in 2 MiB pages: a decode step streams "
        "every weight, and in 4 KiB pages that stream pays a TLB miss every 4 KiB",
    )
    pull_policy: str = _setting(
        "measured",
        "whether to copy an offered prefix from the peer that holds it: measured (only while "
        "a pulled token is measured cheaper than a computed one) or always",
    )

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.dtype not in ("auto", *FLOAT_DTYPES):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype}")
        if self.kv_cache_dtype not in ("auto", *FLOAT_DTYPES):
            raise ValueError(
                f"kv_cache_dtype must be auto, {', '.join(FLOAT_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.max_decode_stall != 0 and self.max_decode_stall < 1:
            raise ValueError(
                f"max_decode_stall must be 0 (no bound) or at least 1, got {self.max_decode_stall}"
            )
        if self.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}"
            )
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(
                "need 1 <= speculative_ngram_min <= speculative_ngram_max, got "
                f"{self.speculative_ngram_min} and {self.speculative_ngram_max}"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        if self.pull_policy not in PULL_POLICIES:
            raise ValueError(
                f"pull_policy must be one of {', '.join(PULL_POLICIES)}, got {self.pull_policy!r}"
            )
        if self.quantized_activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(
                f"quantized_activations must be int8 or float32, got {self.quantized_activations!r}"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be recompute or swap, got {self.preemption_mode!r}"
            )
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device}")

    def resolve_device(self) -> torch.device:
        import torch  # here, so that reading the settings (the router does) needs no torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device is cuda but no CUDA device is available")
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            native = device.type == "cuda" or cpu_has_native_bf16()
            return torch.bfloat16 if native else torch.float32
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    def resolve_kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV blocks' dtype for a model running in `model_dtype`."""
        import torch

        if self.kv_cache_dtype == "auto":
            return model_dtype
        return getattr(torch, self.kv_cache_dtype)  # type: ignore[no-any-return]

    @property
    def swap_space_bytes(self) -> int:
        """The host pool's capacity in bytes; 0 when preemption recomputes or swap is off."""
        if self.preemption_mode != "swap":
            return 0
        return int(self.swap_space * (1 << 30))


def engine_field(name: str) -> Field[Any]:
    """EngineConfig's field `name` (its default, and its help in `metadata["help"]`)."""
    for f in fields(EngineConfig):
        if f.name == name:
            return f
    raise KeyError(f"EngineConfig has no field {name!r}")


def engine_default(name: str) -> Any:
    """The default of EngineConfig's field `name` (KeyError for `model`, which has none)."""
    default = engine_field(name).default
    if default is MISSING:
        raise KeyError(f"EngineConfig's {name!r} has no default")
    return default


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
