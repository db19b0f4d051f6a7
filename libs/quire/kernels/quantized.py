"""Linear layers over quantized blocks (reference_quantized's formats): which kernel runs a call.

The backend is quire.kernels.backends' rule for the call's device: `cpp` runs the C++ kernel
(cpp_quantized.py) where it supports the format, `triton` (CUDA) the Triton dequantize-GEMM
(triton_quantized.py) for the 32-weight formats, anything else the torch oracle (dequantize the
whole weight, then multiply): the K-quants on CUDA, every format where no kernel is built.
"""

from __future__ import annotations

import torch

from quire.kernels import backends, cpp_quantized, reference_quantized


def quantized_linear(
    x: torch.Tensor, blocks: torch.Tensor, quant: str, int8_activations: bool = False
) -> torch.Tensor:
    """x `[num_tokens, in_features]` times the weight in `blocks` `[out_features, row_bytes]`
    (format `quant`), transposed: `[num_tokens, out_features]` in x's dtype. With
    `int8_activations` the C++ kernel quantizes x to int8 where it can (cpp_quantized); the
    Triton kernel and the oracle multiply float32."""
    backend = backends.kernel_backend(x.device)
    if backend == "cpp" and cpp_quantized.supports(quant, x.dtype):
        return cpp_quantized.quantized_linear(x, blocks, quant, int8_activations)
    if backend == "triton":
        # imported here: TRITON_INTERPRET is read when the kernel is decorated
        from quire.kernels import triton_quantized

        if triton_quantized.supports(quant):
            return triton_quantized.quantized_linear(x, blocks, quant)
    return reference_quantized.quantized_linear(x, blocks, quant)
