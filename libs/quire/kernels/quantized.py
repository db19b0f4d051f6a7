"""Linear layers over quantized blocks (reference_quantized's formats): which kernel runs a call.

The backend is quire.kernels.backends' rule for the call's device: `cpp` runs the C++ kernel
(cpp_quantized.py) where it supports the format, anything else the torch oracle (dequantize
the whole weight, then multiply), CUDA included until it has a kernel of its own.
"""

from __future__ import annotations

import torch

from quire.kernels import backends, cpp_quantized, reference_quantized


def quantized_linear(x: torch.Tensor, blocks: torch.Tensor, quant: str) -> torch.Tensor:
    """x `[num_tokens, in_features]` times the weight in `blocks` `[out_features, row_bytes]`
    (format `quant`), transposed: `[num_tokens, out_features]` in x's dtype."""
    if backends.kernel_backend(x.device) == "cpp" and cpp_quantized.supports(quant, x.dtype):
        return cpp_quantized.quantized_linear(x, blocks, quant)
    return reference_quantized.quantized_linear(x, blocks, quant)
