"""Weights kept in llama.cpp's quantized blocks (GGUF), and the linear layer and embedding table
that compute on them.

A `QuantizedTensor` is a 2-d weight `[out_features, in_features]` as its file stores it: its
rows' blocks (quire.kernels.reference_quantized), plus the dtype the model computes in. A
`QuantizedLinear` is a linear layer on the same interface as quire.model.linear.Linear (called
on `[num_tokens, in_features]`, returns `[num_tokens, out_features]` in the activations' dtype);
which kernel multiplies is quire.kernels.quantized's rule. Weights fused along the output
dimension (q/k/v, gate/up) are their parts' rows end to end when the parts share a format (and an input
order), else one product per part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from quire.kernels import cpp_quantized, reference_quantized
from quire.kernels import quantized as quantized_kernels
from quire.model.linear import Linear


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight in blocks: `blocks` `[out_features, row_bytes]` uint8 in format `quant`."""

    quant: str  # a reference_quantized.FORMATS name
    blocks: torch.Tensor
    in_features: int
    dtype: torch.dtype  # the dtype the model computes in (activations, outputs)
    # whether the C++ kernel quantizes the activations to int8 where it can
    # (quire.kernels.quantized.quantized_linear)
    int8_activations: bool = False
    # `[in_features]` int64 or None: the blocks hold the weight's inputs in this order (act-order
    # GPTQ's groups made whole), and the kernel multiplies x[:, input_order]
    input_order: torch.Tensor | None = None

    def __post_init__(self) -> None:
        expected = reference_quantized.row_bytes(self.quant, self.in_features)
        if self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2:
            raise ValueError(f"{self.quant} blocks must be 2-d uint8, got {self.blocks.dtype}")
        if self.blocks.shape[1] != expected:
            raise ValueError(
                f"{self.quant} rows of {self.in_features} inputs are {expected} bytes, "
                f"got {self.blocks.shape[1]}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.in_features)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (the oracle's), its inputs in x's order."""
        weight = reference_quantized.dequantize(self.blocks, self.quant)
        if self.input_order is None:
            return weight
        return torch.empty_like(weight).index_copy_(1, self.input_order, weight)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x `[num_tokens, in_features]` in the order of the blocks' inputs."""
        return x if self.input_order is None else x.index_select(-1, self.input_order)


Weight = torch.Tensor | QuantizedTensor


def concat_rows(parts: Sequence[Weight]) -> Weight | list[Weight]:
    """Weights stacked along out_features: one weight where they allow it (all float, or all
    blocks of one format), else the parts as they are (a file may store v_proj in F16 beside
    a Q4_1 q_proj, or in Q6_K beside Q4_K)."""
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    if len(tensors) == len(parts):
        return torch.cat(tensors)
    quantized = [p for p in parts if isinstance(p, QuantizedTensor)]
    first = quantized[0]
    if len(quantized) == len(parts) and all(
        p.quant == first.quant and _same_order(p.input_order, first.input_order) for p in quantized
    ):
        blocks = torch.cat([p.blocks for p in quantized])
        return QuantizedTensor(
            first.quant,
            blocks,
            first.in_features,
            first.dtype,
            first.int8_activations,
            first.input_order,
        )
    return list(parts)


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


class QuantizedLinear:
    """y = x W^T + b with W in blocks: one part, or several stacked along out_features (each
    in blocks or a float Linear)."""

    def __init__(
        self, parts: Sequence[QuantizedTensor | Linear], bias: torch.Tensor | None
    ) -> None:
        assert parts, "a quantized linear needs at least one weight"
        self.parts = list(parts)
        self.in_features = parts[0].in_features
        assert all(p.in_features == self.in_features for p in parts), "parts differ in inputs"
        self.out_features = sum(_out_features(p) for p in parts)
        self.bias = bias

    @property
    def num_params(self) -> int:
        return self.out_features * self.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [
            quantized_kernels.quantized_linear(p.inputs(x), p.blocks, p.quant, p.int8_activations)
            if isinstance(p, QuantizedTensor)
            else p(x)
            for p in self.parts
        ]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return out if self.bias is None else out + self.bias


def _out_features(part: QuantizedTensor | Linear) -> int:
    return part.shape[0] if isinstance(part, QuantizedTensor) else part.out_features


AnyLinear = Linear | QuantizedLinear


def make_linear(
    weight: Weight | list[Weight], bias: torch.Tensor | None, backend: str
) -> AnyLinear:
    """The layer for `weight`: a Linear on `backend` for a float tensor, else a
    QuantizedLinear (whose kernel is chosen per call; float parts on `backend`), its
    quantized parts interleaved where that is faster (`interleaved`)."""
    if isinstance(weight, torch.Tensor):
        return Linear(weight, bias, backend)
    parts = [weight] if isinstance(weight, QuantizedTensor) else weight
    return QuantizedLinear(
        [
            interleaved(p) if isinstance(p, QuantizedTensor) else Linear(p, None, backend)
            for p in parts
        ],
        bias,
    )


def interleaved(weight: QuantizedTensor) -> QuantizedTensor:
    """`weight` in its row-interleaved layout (reference_quantized.INTERLEAVED) where the C++
    kernel multiplies that layout on this CPU (AVX512_VNNI) and the weight takes int8
    activations (the layout's only fast road), on the CPU, rows in 16s, inputs in order; else
    `weight` itself. The layout holds the same values (dequantize() is unchanged)."""
    name = reference_quantized.INTERLEAVED_OF.get(weight.quant)
    if (
        name is None
        or not weight.int8_activations
        or weight.input_order is not None
        or weight.blocks.device.type != "cpu"
        or weight.shape[0] % reference_quantized.INTERLEAVED_ROWS
        or not cpp_quantized.supports(name, weight.dtype)
    ):
        return weight
    try:
        blocks, name = reference_quantized.interleave(weight.blocks, weight.quant)
    except ValueError:  # a Q4_0 scale that -8 d would overflow: kept as it is
        return weight
    return replace(weight, quant=name, blocks=blocks)


def embedding(ids: torch.Tensor, table: Weight) -> torch.Tensor:
    """Rows `ids` (`[num_tokens]` int64) of an embedding table, float or in blocks."""
    if isinstance(table, torch.Tensor):
        return F.embedding(ids, table)
    if table.input_order is not None:
        return table.dequantize()[ids].to(table.dtype)
    return reference_quantized.quantized_embedding(ids, table.blocks, table.quant, table.dtype)
