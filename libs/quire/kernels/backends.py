"""The one rule that picks a kernel backend: the torch reference, C++ (CPU) or Triton (CUDA).

`QUIRE_KERNEL_BACKEND=auto|cpp|torch|triton` (default auto) names the backend. auto is Triton
for CUDA tensors; for CPU tensors it is C++ when the library loads (built by `make kernels-cpu`
for these sources, this torch and this CPU; cpp_attention's loader says why not, once, in the
log), else the torch reference. A named backend is taken as named: cpp without its library
raises at the first call, triton on CPU tensors needs TRITON_INTERPRET=1 set before the Triton
modules are imported.

The backend follows each call's device (`kernel_backend`); a kernel family the backend does not
implement runs on the torch reference: block copies have no C++ kernel and the fused norm and
rotary ops no Triton one. The experts of a mixture-of-experts layer run on the CPU as the
reference's loop over experts: torch's grouped GEMM (grouped_experts) computes the same bits and
measured no faster there (`make bench-moe`), so it is not picked. Packed linears exist in C++ only, so they run where the CPU's backend
is cpp and the CPU has their instructions (`packed_linear`); elsewhere the model keeps its
weights in another layout (quire.model.linear).

Every family is a Protocol of quire.kernels.signatures, and the tables below are typed by it,
so mypy checks that each backend's module fits. Triton modules are imported on first use only:
importing quire.kernels never imports triton.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from quire.kernels import (
    cpp_attention,
    cpp_fused,
    reference,
    reference_experts,
    reference_fused,
)
from quire.kernels import packed_linear as cpp_packed_linear
from quire.kernels.signatures import (
    BlockCopy,
    ExpertMlp,
    FusedNormRotary,
    KVCacheWrite,
    PackedLinear,
    PagedAttention,
)

BACKEND_ENV_VAR = "QUIRE_KERNEL_BACKEND"
BACKENDS = ("auto", "cpp", "torch", "triton")
_CPU = torch.device("cpu")

Family = TypeVar("Family")


@functools.lru_cache(maxsize=16)
def _requested_backend(value: str) -> str:
    requested = value.strip().lower() or "auto"
    if requested not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV_VAR} must be one of {BACKENDS}, got {requested!r}")
    return requested


def kernel_backend(device: torch.device) -> str:
    """The backend, "cpp", "torch" or "triton", that calls on tensors of this device use
    (asked on every kernel call: the environment variable is read each time)."""
    requested = _requested_backend(os.environ.get(BACKEND_ENV_VAR, "auto"))
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "triton"
    return "cpp" if device.type == "cpu" and cpp_attention.is_available() else "torch"


def _triton_attention() -> PagedAttention:
    from quire.kernels import triton_attention

    return triton_attention


def _triton_cache() -> KVCacheWrite:
    from quire.kernels import triton_cache

    return triton_cache


def _triton_block_copy() -> BlockCopy:
    from quire.kernels import triton_cache

    return triton_cache


def _triton_experts() -> ExpertMlp:
    from quire.kernels import triton_experts

    return triton_experts


# family -> backend -> its module (loaded on first use); "torch" implements every family.
PAGED_ATTENTION: Mapping[str, Callable[[], PagedAttention]] = {
    "torch": lambda: reference,
    "cpp": lambda: cpp_attention,
    "triton": _triton_attention,
}
KV_CACHE_WRITE: Mapping[str, Callable[[], KVCacheWrite]] = {
    "torch": lambda: reference,
    "cpp": lambda: cpp_attention,
    "triton": _triton_cache,
}
BLOCK_COPY: Mapping[str, Callable[[], BlockCopy]] = {
    "torch": lambda: reference,
    "triton": _triton_block_copy,
}
FUSED_NORM_ROTARY: Mapping[str, Callable[[], FusedNormRotary]] = {
    "torch": lambda: reference_fused,
    "cpp": lambda: cpp_fused,
}
EXPERT_MLP: Mapping[str, Callable[[], ExpertMlp]] = {
    "torch": lambda: reference_experts,
    "triton": _triton_experts,
}


def family_backend(family: Mapping[str, Callable[[], Family]], device: torch.device) -> str:
    """The backend that runs this family (one of the tables above) for tensors of `device`."""
    backend = kernel_backend(device)
    return backend if backend in family else "torch"


def _implementation(family: Mapping[str, Callable[[], Family]], device: torch.device) -> Family:
    return family[family_backend(family, device)]()


def paged_attention(device: torch.device) -> PagedAttention:
    """The paged attention kernels for tensors of this device."""
    return _implementation(PAGED_ATTENTION, device)


def kv_cache_write(device: torch.device) -> KVCacheWrite:
    """The KV cache write for tensors of this device."""
    return _implementation(KV_CACHE_WRITE, device)


def block_copy(device: torch.device) -> BlockCopy:
    """The block copy for tensors of this device."""
    return _implementation(BLOCK_COPY, device)


def fused_norm_rotary(device: torch.device) -> FusedNormRotary:
    """The fused RMSNorm and rotary ops for tensors of this device."""
    return _implementation(FUSED_NORM_ROTARY, device)


def expert_mlp(device: torch.device) -> ExpertMlp:
    """The mixture-of-experts expert MLPs for tensors of this device."""
    return _implementation(EXPERT_MLP, device)


def packed_linear(dtype: torch.dtype) -> PackedLinear | None:
    """The packed linear kernel for CPU tensors of this dtype, None where it does not run: the
    CPU's backend is not cpp, or this CPU lacks its instructions (AVX2 and FMA; on a CPU with
    AVX-512, bfloat16 needs AVX512_BF16)."""
    if kernel_backend(_CPU) != "cpp" or not cpp_packed_linear.cpu_supports(dtype):
        return None
    return cpp_packed_linear
