"""Decoder layers that run as one C++ call each (`quire_cpu::decoder_layer`, csrc/
decoder_layer_cpu.cpp): the C++ kernels a Llama-shaped layer calls, in the order
`DecoderModel.forward` calls them from Python, without Python and torch's dispatcher between
them. A lone decoding sequence's step is a few hundred small kernel calls, and their Python
wrappers and dispatch cost as much as the smaller matmuls; the fused call leaves one dispatch
per layer and gives the same bits (the same kernels on the same tensors).

A layer qualifies when it is exactly the Llama layer `decoder.DecoderModel.forward` runs
(`layers.Attention` without q/k norms, over the whole head's rotary, no soft cap or sinks;
`layers.GatedMLP`) and its four matmuls are bias-free and each either one quantized weight in a
format the C++ kernel multiplies (no input order; float32 activations) or a `packed` linear
(`linear.Linear`, float32 or bfloat16: the weight's dtype is the activations'), all four in one
activation dtype, on CPU. A model uses the fused calls only when every layer qualifies, and a
step only while the kernel backend is the C++ one; everything else takes the Python path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quire.kernels import backends, cpp_quantized, reference_quantized
from quire.model.attention import AttentionMetadata, KVCache
from quire.model.layers import Attention, GatedMLP
from quire.model.linear import Linear
from quire.model.quantized_linear import AnyLinear, QuantizedLinear, QuantizedTensor

PACKED = -1  # decoder_layer's type id of a matmul given as a packed weight (linear_cpu.cpp)


@dataclass(frozen=True)
class FusedLayer:
    """What `quire_cpu::decoder_layer` takes of one layer."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    # qkv, o, gate_up, down: each one's blocks and ggml type id, or packed weight and PACKED,
    # in decoder_layer's order
    matmuls: tuple[torch.Tensor | int, ...]
    int8_activations: bool
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    cos: torch.Tensor
    sin: torch.Tensor
    scale: float
    sliding_window: int | None

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        add_input: bool,
        eps: float,
        positions: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The layer's MLP output (the next layer's x); with `add_input`, x is the previous
        layer's and is added into `residual` and normed first (in place, as forward does)."""
        key_cache, value_cache = kv_cache
        return torch.ops.quire_cpu.decoder_layer(
            x,
            residual,
            add_input,
            self.input_norm,
            self.post_norm,
            eps,
            *self.matmuls,
            self.int8_activations,
            self.intermediate_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            positions,
            self.cos,
            self.sin,
            key_cache,
            value_cache,
            meta.slot_mapping,
            meta.block_tables,
            meta.context_lens,
            None if meta.is_decode_only else meta.cu_query_lens,
            self.scale,
            self.sliding_window,
        )


@dataclass(frozen=True)
class _Matmul:
    """One of a layer's matmuls as decoder_layer takes it."""

    weight: torch.Tensor  # quantized blocks, or a packed weight
    type_id: int  # the blocks' ggml type id, or PACKED
    activations: torch.dtype  # the dtype of x it multiplies
    int8_activations: bool | None  # a quantized weight's choice; None for a packed one


def _one_weight(linear: AnyLinear) -> _Matmul | None:
    """A bias-free linear as one weight the C++ layer multiplies, or None: a single quantized
    weight the quantized kernel multiplies, or a packed linear."""
    if linear.bias is not None:
        return None
    if isinstance(linear, Linear):  # packed weights are float32 or bfloat16 (pack_weight)
        if linear.backend != "packed":
            return None
        return _Matmul(linear.weight, PACKED, linear.weight.dtype, None)
    if not isinstance(linear, QuantizedLinear):
        return None
    if len(linear.parts) != 1 or not isinstance(part := linear.parts[0], QuantizedTensor):
        return None
    if part.input_order is not None or part.dtype != torch.float32:
        return None
    if not cpp_quantized.supports(part.quant, torch.float32):
        return None
    ggml_type = reference_quantized.block_format(part.quant).ggml_type
    return _Matmul(part.blocks, ggml_type, torch.float32, part.int8_activations)


def fuse(layers: list, device: torch.device) -> list[FusedLayer] | None:
    """Every layer (decoder.DecoderLayer) as `decoder_layer` takes it, or None when one does
    not qualify (the module docstring says which do) or the C++ kernels are not loaded."""
    if device.type != "cpu" or not layers:
        return None
    fused: list[FusedLayer] = []
    for layer in layers:
        attention, mlp = layer.attention, layer.mlp
        if type(attention) is not Attention or type(mlp) is not GatedMLP:
            return None
        paged = attention.paged
        if (
            attention.qk_norm is not None
            or attention.rotary.rotary_dim != attention.head_dim
            or paged.logits_soft_cap is not None
            or paged.sinks is not None
        ):
            return None
        weights = [_one_weight(w) for w in (attention.qkv, attention.o, mlp.gate_up, mlp.down)]
        if any(w is None for w in weights):
            return None
        matmuls = [w for w in weights if w is not None]
        if len({w.activations for w in matmuls}) != 1:
            return None
        int8 = {w.int8_activations for w in matmuls if w.int8_activations is not None}
        if len(int8) > 1:
            return None
        fused.append(
            FusedLayer(
                input_norm=layer.input_norm,
                post_norm=layer.post_norm,
                matmuls=tuple(a for w in matmuls for a in (w.weight, w.type_id)),
                int8_activations=True in int8,
                intermediate_size=mlp.down.in_features,
                num_heads=attention.num_heads,
                num_kv_heads=attention.num_kv_heads,
                head_dim=attention.head_dim,
                cos=attention.rotary.cos,
                sin=attention.rotary.sin,
                scale=float(paged.scale),
                sliding_window=paged.sliding_window,
            )
        )
    return fused


def runs_fused(device: torch.device) -> bool:
    """Whether a step on `device` takes the fused calls now (the C++ backend is chosen and
    loaded; the backend variable is read, as on every kernel call)."""
    return backends.kernel_backend(device) == "cpp"
