"""Safetensors checkpoints quantized for GPUs (AWQ, GPTQ, compressed-tensors), loaded into the
block formats Quire's kernels compute on.

A quantized linear's file holds integers q, scales s and zero points z, w = s * (q - z), in each
method's own packing. At load they are unpacked and, where every weight keeps its exact value,
repacked as 32-weight blocks (quire.kernels.reference_quantized):

    4-bit, every zero point 8 (symmetric GPTQ and compressed-tensors)    -> Q4_0
    4-bit, other zero points (AWQ, asymmetric GPTQ and compressed-tensors) -> Q4_Z
    8-bit, q - z within -128..127 (GPTQ, compressed-tensors int8)          -> Q8_0

Exact needs each run of 32 inputs (one block) to share a scale and a zero point (groups of a
multiple of 32 inputs, or one per row; GPTQ's act-order groups where they keep runs whole) and
scales that float16 holds (AWQ and GPTQ store float16; compressed-tensors' bfloat16 scales
within float16's range, or float32 ones that happen to be float16 values). A weight that does
not convert, and FP8 weights (no block format here holds them), is dequantized into the
model's dtype instead, and the load logs which and why: served, in floats.

Layouts read (the methods' published packings; int32 words, value j of a word at bits
bits * j):
  AWQ (version gemm)  X.qweight [in, out / 8] and X.qzeros [in / g, out / 8] packed along out,
                      nibble j of a word holding column AWQ_ORDER[j] of its 8; X.scales
                      [in / g, out]
  GPTQ                X.qweight [in * bits / 32, out] packed along in; X.qzeros
                      [groups, out * bits / 32] along out, holding z - 1 (checkpoint_format
                      "gptq", the first version's offset) or z ("gptq_v2"); X.scales
                      [groups, out]; X.g_idx [in], each input's group (default i // group_size)
  compressed-tensors  pack-quantized: X.weight_packed [out, in * bits / 32] along in, holding
                      q + 2^(bits - 1); X.weight_scale [out, groups] (or one per tensor);
                      asymmetric: X.weight_zero_point packed along out; X.weight_shape;
                      X.weight_g_idx with act order.
                      int-quantized / naive-quantized: X.weight int8 [out, in], X.weight_scale
                      (and X.weight_zero_point). float-quantized: X.weight float8, X.weight_scale.
Static activation scales (X.input_scale) are not used: activations stay float, or take Quire's
own int8 quantization per 32 inputs (EngineConfig.quantized_activations).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quire.kernels import reference_quantized
from quire.model.quantization_methods import quantization_problem
from quire.model.quantized_linear import QuantizedTensor, Weight

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column of nibble j, within each word's 8 columns
_AWQ_COLUMNS = tuple(AWQ_ORDER.index(c) for c in range(8))  # nibble of column c
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class Integers:
    """One quantized linear unpacked, element by element: w = s * (q - z), `[out, in]` each
    (q, z int32; s in the file's dtype), with the width the file packed q in, and each input's
    group where the file names them (act order: groups over a permutation of the inputs)."""

    q: torch.Tensor
    z: torch.Tensor
    s: torch.Tensor
    bits: int
    g_idx: torch.Tensor | None = None


def load_quantized_weights(
    tensors: Mapping[str, torch.Tensor],
    quantization: Mapping[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    int8_activations: bool = False,
) -> dict[str, Weight]:
    """A quantized checkpoint's tensors (as its safetensors hold them) as the model's weights:
    each quantized linear's `X.weight` in blocks (QuantizedTensor) where it converts exactly,
    else in floats; every other tensor cast to `dtype`. All on `device`."""
    problem = quantization_problem(quantization)
    if problem is not None:
        raise ValueError(f"the checkpoint's quantization {problem}")
    method = quantization["quant_method"]
    unpack = {"awq": _awq, "gptq": _gptq, "compressed-tensors": _compressed}[method]
    weights: dict[str, Weight] = {}
    consumed: set[str] = set()
    in_floats: dict[str, str] = {}
    prefixes = _quantized_modules(tensors)
    for prefix in prefixes:
        unpacked, used = unpack(tensors, prefix, quantization)
        consumed |= used
        if isinstance(unpacked, torch.Tensor):  # FP8: no block format holds it
            weight: Weight = unpacked.to(device=device, dtype=dtype)
            reason: str | None = "FP8 weights have no block format here"
        else:
            weight, reason = to_weight(unpacked, dtype, int8_activations)
            if isinstance(weight, QuantizedTensor):
                order = weight.input_order
                weight = QuantizedTensor(
                    weight.quant,
                    weight.blocks.to(device),
                    weight.in_features,
                    dtype,
                    int8_activations,
                    None if order is None else order.to(device),
                )
            else:
                weight = weight.to(device)
        if reason is not None:
            in_floats[prefix] = reason
        weights[f"{prefix}.weight"] = weight
    for name, tensor in tensors.items():
        if name in consumed or name.endswith(".input_scale"):
            continue
        weights[name] = tensor.to(device=device, dtype=dtype)
    if in_floats:
        logger.warning(
            "%d of %d quantized linears load in floats (%s): %s",
            len(in_floats),
            len(prefixes),
            "; ".join(sorted(set(in_floats.values()))),
            ", ".join(sorted(in_floats)[:8]),
        )
    return weights


def to_weight(
    unpacked: Integers, dtype: torch.dtype, int8_activations: bool = False
) -> tuple[Weight, str | None]:
    """The weight s * (q - z) in blocks where they hold it exactly (the module docstring's
    rules), else dequantized into `dtype`, with the reason it is not in blocks."""
    order = None
    g_idx = unpacked.g_idx
    if g_idx is not None and bool((g_idx[1:] < g_idx[:-1]).any()):
        # act order: the inputs sorted by group, so that each group is one run of inputs
        order = torch.argsort(g_idx, stable=True)
        unpacked = Integers(
            unpacked.q[:, order], unpacked.z[:, order], unpacked.s[:, order], unpacked.bits
        )
    q, z, s = unpacked.q, unpacked.z, unpacked.s
    out_features, in_features = q.shape
    reason = _blocks_problem(unpacked)
    if reason is not None:
        weight = dequantize(unpacked)
        if order is not None:
            weight = torch.empty_like(weight).index_copy_(1, order, weight)
        return weight.to(dtype), reason
    runs = (out_features, in_features // 32, 32)
    d = s.reshape(runs)[..., 0].to(torch.float16)
    z0 = z.reshape(runs)[..., 0]
    if unpacked.bits == 4 and bool((z0 == 8).all()):
        quant, blocks = "Q4_0", reference_quantized.pack_blocks("Q4_0", q, d)
    elif unpacked.bits == 4:
        quant, blocks = "Q4_Z", reference_quantized.pack_blocks("Q4_Z", q, d, z0)
    else:
        quant, blocks = "Q8_0", reference_quantized.pack_blocks("Q8_0", q - z, d)
    return QuantizedTensor(quant, blocks, in_features, dtype, int8_activations, order), None


def dequantize(unpacked: Integers) -> torch.Tensor:
    """s * (q - z) in float32 (exact for float16 and bfloat16 scales): the oracle's weight."""
    return (unpacked.q - unpacked.z).float() * unpacked.s.float()


def _blocks_problem(unpacked: Integers) -> str | None:
    # why s * (q - z) has no exact block form, or None
    q, z, s = unpacked.q, unpacked.z, unpacked.s
    out_features, in_features = q.shape
    if in_features % 32:
        return f"{in_features} inputs are no whole number of 32-input blocks"
    runs = (out_features, in_features // 32, 32)
    s_runs, z_runs = s.reshape(runs), z.reshape(runs)
    if not bool((s_runs == s_runs[..., :1]).all() and (z_runs == z_runs[..., :1]).all()):
        return "groups that cut 32-input blocks"
    first = s_runs[..., 0]
    as_f16 = first.to(torch.float16)
    if not bool(torch.isfinite(as_f16).all() and (as_f16.to(first.dtype) == first).all()):
        return f"{str(first.dtype).removeprefix('torch.')} scales that float16 does not hold"
    if unpacked.bits == 4:
        if int(q.min()) < 0 or int(q.max()) > 15 or int(z.min()) < 0 or int(z.max()) > 255:
            return "4-bit values or zero points out of range"
        return None
    if unpacked.bits == 8:
        diff = q - z
        if int(diff.min()) < -128 or int(diff.max()) > 127:
            return "8-bit zero points that put q - z outside int8"
        return None
    return f"{unpacked.bits}-bit weights"


def unpack_words(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words holding 32 / bits values each, value j at bits * j (unsigned), spread along
    `dim` (0 or 1): `[r, c]` -> `[r * 32 / bits, c]` or `[r, c * 32 / bits]`, int32."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words = words.to(torch.int32)
    if dim == 0:
        values = (words.unsqueeze(1) >> shifts.view(1, -1, 1)) & ((1 << bits) - 1)
        return values.reshape(words.shape[0] * per_word, words.shape[1])
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(words.shape[0], words.shape[1] * per_word)


def _quantized_modules(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    # the prefixes X of the quantized linears: X.qweight, X.weight_packed, or an integer or
    # float8 X.weight beside X.weight_scale
    prefixes = []
    for name, tensor in tensors.items():
        for suffix in (".qweight", ".weight_packed"):
            if name.endswith(suffix):
                prefixes.append(name.removesuffix(suffix))
        stored = not tensor.dtype.is_floating_point or tensor.dtype in _FP8
        if name.endswith(".weight") and stored and f"{name}_scale" in tensors:
            prefixes.append(name.removesuffix(".weight"))
    return sorted(prefixes)


def _need(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise ValueError(f"quantized checkpoint lacks {name!r}")
    return tensors[name]


def _awq(
    tensors: Mapping[str, torch.Tensor], prefix: str, quantization: Mapping[str, Any]
) -> tuple[Integers, set[str]]:
    names = [f"{prefix}.{part}" for part in ("qweight", "qzeros", "scales")]
    qweight, qzeros, scales = (_need(tensors, n) for n in names)
    columns = list(_AWQ_COLUMNS)

    def unpack(words: torch.Tensor) -> torch.Tensor:  # [r, c / 8] -> [r, c], columns in order
        values = unpack_words(words, 4, dim=1)
        return values.reshape(values.shape[0], -1, 8)[:, :, columns].reshape(values.shape)

    q, z = unpack(qweight), unpack(qzeros)  # [in, out], [groups, out]
    group = q.shape[0] // z.shape[0]
    z = z.repeat_interleave(group, 0)
    s = scales.repeat_interleave(group, 0)
    return Integers(q.t().contiguous(), z.t().contiguous(), s.t().contiguous(), 4), set(names)


def _gptq(
    tensors: Mapping[str, torch.Tensor], prefix: str, quantization: Mapping[str, Any]
) -> tuple[Integers, set[str]]:
    bits = int(quantization["bits"])
    names = [f"{prefix}.{part}" for part in ("qweight", "qzeros", "scales")]
    qweight, qzeros, scales = (_need(tensors, n) for n in names)
    q = unpack_words(qweight, bits, dim=0)  # [in, out]
    z = unpack_words(qzeros, bits, dim=1)[:, : q.shape[1]]  # [groups, out]
    if quantization.get("checkpoint_format", "gptq") == "gptq":
        z = z + 1  # the first version stores z - 1
    in_features = q.shape[0]
    g_idx_name = f"{prefix}.g_idx"
    if g_idx_name in tensors:
        g_idx = tensors[g_idx_name].long()
        names.append(g_idx_name)
    else:
        group = int(quantization.get("group_size", -1))
        group = in_features if group <= 0 else group
        g_idx = torch.arange(in_features) // group
    return Integers(
        q.t().contiguous(), z[g_idx].t().contiguous(), scales[g_idx].t().contiguous(), bits, g_idx
    ), set(names)


def _compressed(
    tensors: Mapping[str, torch.Tensor], prefix: str, quantization: Mapping[str, Any]
) -> tuple[Integers | torch.Tensor, set[str]]:
    scale_name = f"{prefix}.weight_scale"
    scale = _need(tensors, scale_name)
    names = {scale_name}
    packed_name = f"{prefix}.weight_packed"
    if packed_name in tensors:
        shape_name = f"{prefix}.weight_shape"
        out_features, in_features = (int(n) for n in _need(tensors, shape_name).tolist())
        packed = tensors[packed_name]
        bits = packed.shape[1] * 32 // in_features
        if bits not in (4, 8) or packed.shape[1] * 32 != in_features * bits:
            raise ValueError(
                f"{packed_name}: {packed.shape[1]} words for {in_features} inputs is no 4- or "
                "8-bit packing (Quire reads those)"
            )
        names |= {packed_name, shape_name}
        q = unpack_words(packed, bits, dim=1)[:out_features, :in_features]  # q + 2^(bits-1)
        offset = 1 << (bits - 1)
        zp_name = f"{prefix}.weight_zero_point"
        if zp_name in tensors:
            names.add(zp_name)
            z = unpack_words(tensors[zp_name], bits, dim=0)[:out_features]  # zp + offset
        else:
            z = torch.full((out_features, 1), offset, dtype=torch.int32)
    else:
        weight_name = f"{prefix}.weight"
        weight = tensors[weight_name]
        names.add(weight_name)
        out_features, in_features = weight.shape
        if weight.dtype.is_floating_point:  # FP8
            return weight.float() * _per_element(
                scale, (out_features, in_features), None
            ).float(), names
        q = weight.to(torch.int32)
        bits = 8
        zp_name = f"{prefix}.weight_zero_point"
        if zp_name in tensors:
            names.add(zp_name)
            z = tensors[zp_name].to(torch.int32)
        else:
            z = torch.zeros((out_features, 1), dtype=torch.int32)
    g_idx_name = f"{prefix}.weight_g_idx"
    g_idx = None
    if g_idx_name in tensors:
        names.add(g_idx_name)
        g_idx = tensors[g_idx_name].long()
    shape = (out_features, in_features)
    return Integers(
        q, _per_element(z, shape, g_idx), _per_element(scale, shape, g_idx), bits, g_idx
    ), names


def _per_element(
    values: torch.Tensor, shape: tuple[int, int], g_idx: torch.Tensor | None
) -> torch.Tensor:
    # a per-tensor, per-row, per-group or per-2-d-block tensor spread to every element
    out_features, in_features = shape
    grid = values.reshape(1, 1) if values.numel() == 1 else values.reshape(values.shape[0], -1)
    grid = grid.repeat_interleave(out_features // grid.shape[0], 0)
    if g_idx is not None and grid.shape[1] > 1:  # act order: each input's group
        return grid[:, g_idx].contiguous()
    return grid.repeat_interleave(in_features // grid.shape[1], 1).contiguous()


def quantization_config(path: Path) -> dict[str, Any] | None:
    """The `quantization_config` of a checkpoint directory's config.json, or None."""
    import json

    config = json.loads((path / "config.json").read_text())
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    return quantization if isinstance(quantization, dict) and quantization else None
