"""Skips for hardware a test cannot run on: with tests/skip_policy.py's environment skips, the
only skips the suite allows. Each is decided from the machine (CPU flags, CUDA), never from
whether something the build makes is there: a missing build output fails."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import cpp_build


def can_run_packed_linear(dtype: torch.dtype) -> bool:
    """Whether this CPU runs the packed linear in `dtype` (linear_cpu.cpp's supported()): the
    library loaded is the newest x86-64 level the CPU runs; its AVX-512 build multiplies float32,
    and bfloat16 with AVX512_BF16; its AVX2 build (a CPU without AVX-512) both."""
    flags = cpp_build.cpu_flags()
    if "avx512f" in flags:
        return dtype == torch.float32 or (dtype == torch.bfloat16 and "avx512_bf16" in flags)
    return dtype in (torch.float32, torch.bfloat16) and {"avx2", "fma"} <= flags


def needs_packed_linear(dtype: torch.dtype) -> pytest.MarkDecorator:
    """Skip where this CPU cannot run the packed linear in `dtype`."""
    return pytest.mark.skipif(
        not can_run_packed_linear(dtype),
        reason=f"needs AVX2 and FMA, or for bfloat16 with AVX-512 AVX512_BF16: Quire's packed "
        f"{dtype} linear",
    )


def can_run_onednn_bfloat16() -> bool:
    """Whether this CPU runs oneDNN's bfloat16 linear (AVX-512 BW/VL/DQ, or AVX-NE-CONVERT)."""
    flags = set(cpp_build.cpu_flags())
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


needs_onednn_bfloat16 = pytest.mark.skipif(
    not can_run_onednn_bfloat16(),
    reason="needs AVX-512 (avx512bw, avx512vl, avx512dq) or AVX-NE-CONVERT: oneDNN's bfloat16 "
    "linear",
)
