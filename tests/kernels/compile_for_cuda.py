"""Compile every Triton kernel for an H100/H200 (sm_90) without a GPU.

    python -m tests.kernels.compile_for_cuda

The interpreter runs kernels as Python and so never meets the CUDA compiler; this takes each
kernel through Triton's whole pipeline down to a cubin (ptxas ships with Triton), with the
meta-parameters the host wrappers pick, so CUDA-only compile errors show up on a CPU machine.
TRITON_INTERPRET must be unset: interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from quire.kernels import triton_attention, triton_cache

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _compile(
    kernel: triton.JITFunction,
    pointer_type: Callable[[str], str | None],
    constexprs: dict[str, object],
    num_warps: int,
    num_stages: int = 2,
) -> None:
    # Non-pointer arguments are int32 (float for the softmax scale); a stride over a
    # contiguous last dim is 1 at run time, which Triton turns into a constant.
    signature: dict[str, str] = {}
    constants = dict(constexprs)
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_dim") and name.startswith("stride"):
            signature[name] = "constexpr"
            constants[name] = 1
        else:
            signature[name] = pointer_type(name) or ("fp32" if name == "scale_log2e" else "i32")
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    triton.compile(
        source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages}
    )
    print(f"ok {kernel.__name__} {constexprs} num_warps={num_warps}")


def _attention_pointers(dtype: str) -> Callable[[str], str | None]:
    def pointer_type(name: str) -> str | None:
        if name in ("block_tables_ptr", "context_lens_ptr", "cu_query_lens_ptr"):
            return "*i32"
        return f"*{dtype}" if name.endswith("_ptr") else None

    return pointer_type


def _cache_pointers(dtype: str) -> Callable[[str], str | None]:
    def pointer_type(name: str) -> str | None:
        if name in ("slot_mapping_ptr", "cache_ptrs_ptr", "block_mapping_ptr"):
            return "*i64"
        return f"*{dtype}" if name.endswith("_ptr") else None

    return pointer_type


def compile_all(
    dtypes: tuple[torch.dtype, ...] = tuple(DTYPES), head_dims: tuple[int, ...] = (64, 128, 256)
) -> None:
    """Compile each kernel for each dtype and head_dim as the host wrappers would launch it."""
    for torch_dtype in dtypes:
        dtype = DTYPES[torch_dtype]
        for head_dim in head_dims:
            shared = {"QUERY_GROUP_SIZE": 4, "BLOCK_SIZE": 16, "HEAD_DIM": head_dim}
            _compile(
                triton_attention._paged_decode_attention_kernel,
                _attention_pointers(dtype),
                {**shared, "TILE_N": triton_attention._decode_tile(head_dim)},
                num_warps=8,
            )
            block_m, block_n, num_warps = triton_attention._prefill_tiles(head_dim, torch_dtype)
            _compile(
                triton_attention._paged_prefill_attention_kernel,
                _attention_pointers(dtype),
                {
                    **shared,
                    "BLOCK_M": block_m,
                    "BLOCK_N": block_n,
                    "DOT_PRECISION": triton_attention._dot_precision(torch_dtype),
                },
                num_warps=num_warps,
            )
        _compile(
            triton_cache._write_kv_cache_kernel,
            _cache_pointers(dtype),
            {"NUM_KV_HEADS": 3, "NUM_KV_HEADS_PADDED": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16},
            num_warps=4,
        )
        _compile(
            triton_cache._copy_blocks_kernel,
            _cache_pointers(dtype),
            {"BLOCK_NUMEL": 16 * 8 * 128, "COPY_TILE": triton_cache.COPY_TILE},
            num_warps=4,
        )


if __name__ == "__main__":
    if triton.knobs.runtime.interpret or os.environ.get("TRITON_INTERPRET"):
        sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    compile_all()
