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

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from quire.kernels import triton_attention, triton_cache, triton_experts, triton_quantized

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# The kernels' index arguments (and attention sinks, float32 in any dtype) and their element
# types; every other *_ptr points at the dtype's data.
INDEX_POINTERS = {
    "sinks_ptr": "*fp32",
    "block_tables_ptr": "*i32",
    "context_lens_ptr": "*i32",
    "cu_query_lens_ptr": "*i32",
    "slot_mapping_ptr": "*i64",
    "cache_ptrs_ptr": "*i64",
    "block_mapping_ptr": "*i64",
}


def _compile(
    kernel: triton.JITFunction,
    dtype: str,
    constexprs: dict[str, object],
    num_warps: int,
    num_stages: int = 2,
    pointers: dict[str, str] | None = None,  # element types of pointers not of the dtype
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
        elif pointers and name in pointers:
            signature[name] = pointers[name]
        else:
            signature[name] = _argument_type(name, dtype)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    triton.compile(
        source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages}
    )
    print(f"ok {kernel.__name__} {constexprs} num_warps={num_warps}")


def _argument_type(name: str, dtype: str) -> str:
    if name.endswith("_ptr"):
        return INDEX_POINTERS.get(name, f"*{dtype}")
    return "fp32" if name == "scale_log2e" else "i32"


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
                dtype,
                {**shared, "TILE_N": triton_attention._decode_tile(head_dim)},
                num_warps=8,
            )
            block_m, block_n, num_warps = triton_attention._prefill_tiles(head_dim, torch_dtype)
            _compile(
                triton_attention._paged_prefill_attention_kernel,
                dtype,
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
            dtype,
            {"NUM_KV_HEADS": 3, "NUM_KV_HEADS_PADDED": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16},
            num_warps=4,
        )
        _compile(
            triton_cache._copy_blocks_kernel,
            dtype,
            {"BLOCK_NUMEL": 16 * 8 * 128, "COPY_TILE": triton_cache.COPY_TILE},
            num_warps=4,
        )
        compile_experts(torch_dtype)
    compile_quantized()


def compile_quantized() -> None:
    """The dequantize-GEMM, per 32-weight block format, at each BLOCK_M the host picks (its
    activations and output are float32 whatever the model's dtype)."""
    pointers = {"x_ptr": "*fp32", "bytes_ptr": "*u8", "halves_ptr": "*fp16", "out_ptr": "*fp32"}
    for quant in triton_quantized.FORMAT_IDS:
        for rows in (1, 32, 64):
            _compile(
                triton_quantized._quantized_linear_kernel,
                "fp32",
                {
                    **triton_quantized.format_constants(quant),
                    "BLOCK_M": triton_quantized.block_m(rows),
                    "BLOCK_N": triton_quantized.BLOCK_N,
                },
                num_warps=triton_quantized.NUM_WARPS,
                pointers=pointers,
            )


def compile_experts(torch_dtype: torch.dtype) -> None:
    """The expert GEMM's two launches: gate/up (output in the dtype), down (float32 output,
    rows scaled by their router weights)."""
    dtype = DTYPES[torch_dtype]
    tiles = {
        "BLOCK_M": triton_experts.BLOCK_M,
        "BLOCK_N": triton_experts.BLOCK_N,
        "BLOCK_K": triton_experts.BLOCK_K,
        "DOT_PRECISION": triton_experts.dot_precision(torch_dtype),
        "DOT_IN_FLOAT32": False,
    }
    index = {"sorted_pairs_ptr": "*i64", "block_experts_ptr": "*i64", "weights_ptr": "*fp32"}
    for rows_are_tokens, weighted, c_type in ((True, False, f"*{dtype}"), (False, True, "*fp32")):
        _compile(
            triton_experts._expert_gemm_kernel,
            dtype,
            {
                **tiles,
                "TOP_K": 2,
                "A_ROWS_ARE_TOKENS": rows_are_tokens,
                "MUL_ROUTED_WEIGHT": weighted,
            },
            num_warps=4,
            pointers={**index, "c_ptr": c_type},
        )


if __name__ == "__main__":
    if triton.knobs.runtime.interpret or os.environ.get("TRITON_INTERPRET"):
        sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    compile_all()
