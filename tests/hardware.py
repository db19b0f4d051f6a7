"""Skips for hardware a test cannot run on: with tests/skip_policy.py's environment skips, the
only skips the suite allows. Each is decided from the machine (CPU flags, CUDA), never from
whether something the build makes is there: a missing build output fails."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import cpp_build

# The /proc/cpuinfo flag Quire's packed linear needs per dtype (linear_cpu.cpp's supported()).
PACKED_LINEAR_FLAGS = {torch.float32: "avx512f", torch.bfloat16: "avx512_bf16"}


def can_run_packed_linear(dtype: torch.dtype) -> bool:
    """Whether this CPU has the instructions of the packed linear in `dtype`."""
    flag = PACKED_LINEAR_FLAGS.get(dtype)
    return flag is not None and flag in cpp_build.cpu_flags()


def needs_packed_linear(dtype: torch.dtype) -> pytest.MarkDecorator:
    """Skip where this CPU cannot run the packed linear in `dtype`."""
    flag = PACKED_LINEAR_FLAGS.get(dtype, "none")
    return pytest.mark.skipif(
        not can_run_packed_linear(dtype),
        reason=f"needs AVX-512 ({flag}): Quire's packed {dtype} linear",
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
