"""The decoder's linear layers: on the CPU, bfloat16 weights are reordered once for oneDNN.

`F.linear` on a CPU bfloat16 weight hands oneDNN the plain row-major matrix on every call, and
oneDNN reorders it into its blocked layout each time; for the small batches of decode that
reorder is a large part of the call. `torch.ops.mkldnn._reorder_linear_weight` does it once at
load (what vLLM's CPU backend does), and `torch.ops.mkldnn._linear_pointwise` then runs on the
blocked weight. Results are the same kernel's, bit for bit (`benchmarks.linear_layouts`
measures both). Float32 keeps `F.linear`: there the blocked layout is slower for one row and
mixed for large batches on the machines measured, and float32 is the equivalence oracle.
On the CPU, torch-backend weights are stored transposed, `[in_features, out_features]`, and
the product is a plain `x @ W_t` (MKL's NN GEMM): `F.linear`'s NT GEMM repacks the weight on
every call, which for decode's few rows costs more than the multiply (1.1-1.8x slower per
layer at 4-64 rows, one thread; `benchmarks.linear_layouts` measures the layouts).

`QUIRE_LINEAR_BACKEND` picks: `auto` (the default: oneDNN for bfloat16 on a CPU where torch has
it, else torch), `onednn` (also float32; refused where unavailable) or `torch`.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "onednn", "torch")


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def use_onednn(dtype: torch.dtype, device: torch.device, backend: str | None = None) -> bool:
    """Whether linears of this dtype and device run on reordered oneDNN weights."""
    backend = backend or os.environ.get("QUIRE_LINEAR_BACKEND", "auto")
    if backend not in BACKENDS:
        raise ValueError(
            f"QUIRE_LINEAR_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}"
        )
    if device.type != "cpu" or backend == "torch":
        return False
    if backend == "onednn":
        if not _onednn_available():
            raise ValueError("QUIRE_LINEAR_BACKEND=onednn but this torch has no oneDNN linear")
        return dtype in (torch.float32, torch.bfloat16)
    return dtype == torch.bfloat16 and _onednn_available()


class Linear:
    """y = x W^T + b, with W kept in whichever layout its backend runs fastest on."""

    def __init__(
        self,
        weight: torch.Tensor,  # [out_features, in_features]
        bias: torch.Tensor | None,
        onednn: bool,
        batch_size_hint: int = 64,  # rows oneDNN tunes the blocked layout for
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.onednn = onednn
        # weight_t: [in_features, out_features] for the CPU's NN product, else None
        self.weight_t: torch.Tensor | None = None
        if onednn:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size_hint)
        elif weight.device.type == "cpu":
            self.weight_t = weight.t().contiguous()
            self.weight = self.weight_t.t()
        else:
            self.weight = weight

    @property
    def num_params(self) -> int:
        return self.out_features * self.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.weight_t is not None:
            if self.bias is None:
                return torch.mm(x, self.weight_t)
            return torch.addmm(self.bias, x, self.weight_t)
        return F.linear(x, self.weight, self.bias)
