"""Linear layers over quantized blocks (reference_quantized's formats): which kernel runs a call.

The backend is quire.kernels.backends' rule for the call's device: `cpp` runs the C++ kernel
(cpp_quantized.py) where it supports the format, anything else the torch oracle (dequantize
the whole weight, then multiply), CUDA included until it has a kernel of its own.
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
    oracle always multiplies float32."""
    if backends.kernel_backend(x.device) == "cpp" and cpp_quantized.supports(quant, x.dtype):
        return cpp_quantized.quantized_linear(x, blocks, quant, int8_activations)
    return reference_quantized.quantized_linear(x, blocks, quant)
