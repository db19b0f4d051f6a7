"""Paged attention and the KV cache write (signatures.PagedAttention, KVCacheWrite) in C++ on
the CPU (csrc/paged_attention_cpu.cpp, cache_cpu.cpp), and the loader of the C++ library they,
the fused ops (cpp_fused.py) and the packed linears (packed_linear.py) are in.

The kernels read K/V blocks in place through the block tables (no gathered copies), one
(sequence, kv head, query tile) per task over torch's intra-op threads. The library is built
by `make kernels-cpu` (python -m quire.kernels.cpp_build), one variant per x86-64 level, and
loaded on first use: the newest built variant that is up to date (sources, torch) and whose
instructions this CPU has, so one image runs AVX-512 on an AVX-512 host and AVX2 elsewhere.
QUIRE_CPU_KERNELS_VARIANT=<variant> (a folder of build/quire_kernels_cpu/, e.g. x86-64-v3)
loads that one or none. If no variant can run, `unavailable_reason` says why, logged once, and
the "auto" backend (quire.kernels.backends) keeps the torch reference.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass

import torch

from quire.kernels import checks

logger = logging.getLogger(__name__)

VARIANT_ENV_VAR = "QUIRE_CPU_KERNELS_VARIANT"

_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class _LoadResult:
    variant: str | None  # the loaded variant, None when none is
    reason: str | None  # why none is, None when one is


def _why_not_usable(name: str) -> str | None:
    from quire.kernels import cpp_build

    manifest = cpp_build.read_manifest(name)
    if manifest is None or not cpp_build.library_path(name).exists():
        return f"not built ({cpp_build.variant_dir(name)})"
    if manifest.source_sha256 != cpp_build.source_sha256():
        return "built from older sources than quire/kernels/csrc/"
    if manifest.torch_version != torch.__version__:
        return f"built for torch {manifest.torch_version}, running {torch.__version__}"
    missing = sorted(set(manifest.cpu_flags) - cpp_build.cpu_flags())
    if missing:
        return f"built with -march={manifest.march}, but this CPU lacks {', '.join(missing)}"
    return None


def choose_variant() -> tuple[str | None, list[str]]:
    """The built variant this process should load, or None, and why each one before it (or
    every one, with None) was passed over. Nothing is loaded."""
    from quire.kernels import cpp_build

    forced = os.environ.get(VARIANT_ENV_VAR, "").strip()
    # Newest first: a variant this CPU cannot run (AVX-512 on an AVX2 host) or a stale one
    # gives way to the next.
    label = f"{VARIANT_ENV_VAR}=" if forced else ""
    passed_over: list[str] = []
    for name in [forced] if forced else cpp_build.built_variants():
        reason = _why_not_usable(name)
        if reason is None:
            return name, passed_over
        passed_over.append(f"{label}{name}: {reason}")
    return None, passed_over


@functools.cache
def _load() -> _LoadResult:
    # Imported here, not at the top: `python -m quire.kernels.cpp_build` must not find
    # itself already imported by the package.
    from quire.kernels import cpp_build

    name, passed_over = choose_variant()
    if name is None:
        if not passed_over:
            return _LoadResult(None, f"not built ({cpp_build.BUILD_DIR}); run `make kernels-cpu`")
        forced = os.environ.get(VARIANT_ENV_VAR, "").strip()
        rebuild = "make kernels-check" if forced in cpp_build.all_levels() else "make kernels-cpu"
        return _LoadResult(None, f"{'; '.join(passed_over)}; run `{rebuild}`")
    path = cpp_build.library_path(name)
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as error:
        return _LoadResult(None, f"{path} failed to load: {error}")
    note = f" (passed over {'; '.join(passed_over)})" if passed_over else ""
    logger.info("C++ CPU kernels: loaded %s%s", path, note)
    return _LoadResult(name, None)


def unavailable_reason() -> str | None:
    """Why the C++ kernels cannot run in this process, or None when they are loaded."""
    if _load.cache_info().currsize:  # decided already: every kernel call asks, skip the lock
        return _load().reason
    with _LOAD_LOCK:
        first_call = _load.cache_info().currsize == 0
        reason = _load().reason
    if first_call and reason is not None:
        logger.warning(
            "C++ CPU attention kernels unavailable: %s; using the torch reference", reason
        )
    return reason


def loaded_variant() -> str | None:
    """The variant (e.g. "x86-64-v4") of the C++ library loaded in this process, loading it if
    need be; None when none can run."""
    unavailable_reason()
    with _LOAD_LOCK:
        return _load().variant


def is_available() -> bool:
    """Whether the C++ kernels are built for this source, torch and CPU, and loaded."""
    return unavailable_reason() is None


def require_loaded() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the C++ CPU attention kernels are unavailable: {reason}")


def _check_cpu_layout(query: torch.Tensor, key_cache: torch.Tensor) -> None:
    if query.device.type != "cpu":
        raise ValueError(f"the C++ kernels take CPU tensors, got {query.device}")
    if key_cache.stride(3) != 1:
        raise ValueError(
            f"the C++ kernels need caches with head_dim stride 1, got strides {key_cache.stride()}"
        )


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Checks metadata only; caches need a head_dim stride of 1."""
    checks.check_decode(query, key_cache, value_cache, block_tables, context_lens)
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    _check_cpu_layout(query, key_cache)
    require_loaded()
    return torch.ops.quire_cpu.paged_decode_attention(
        _unit_last_stride(query),
        key_cache,
        value_cache,
        _unit_last_stride(block_tables),
        context_lens,
        float(scale),
        sliding_window,
        logits_soft_cap,
        None if sinks is None else sinks.contiguous(),
    )


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Checks metadata only; caches need a head_dim stride of 1."""
    checks.check_prefill(query, key_cache, value_cache, block_tables, cu_query_lens, context_lens)
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    _check_cpu_layout(query, key_cache)
    require_loaded()
    return torch.ops.quire_cpu.paged_prefill_attention(
        _unit_last_stride(query),
        key_cache,
        value_cache,
        _unit_last_stride(block_tables),
        cu_query_lens,
        context_lens,
        float(scale),
        sliding_window,
        logits_soft_cap,
        None if sinks is None else sinks.contiguous(),
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Checks metadata only; key and value views with a unit last stride are read in place."""
    checks.check_write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    _check_cpu_layout(key, key_cache)
    require_loaded()
    torch.ops.quire_cpu.write_kv_cache_(
        _unit_last_stride(key),
        _unit_last_stride(value),
        key_cache,
        value_cache,
        slot_mapping.contiguous(),
    )
