"""Write a float checkpoint as a GPU-style quantized one (AWQ, GPTQ, compressed-tensors), and
the float checkpoint of exactly the weights it holds: the quantized loader's test fixtures.

The integers come from round-to-nearest per group (not AWQ's or GPTQ's searches: the files'
layouts are what a loader reads, whatever chose the integers). Every decoder-layer linear is
quantized; embeddings, norms and the LM head stay float, as the methods' own tools leave
them. The packings are written here element by element from the methods' published layouts
(compressed-tensors' with its own library), independently of quire.model.quantized_checkpoint,
which reads them.

    python -m quire_tools.quantize_checkpoint --model models/quire-tiny --scheme awq \\
        --out /tmp/tiny-awq --reference-out /tmp/tiny-awq-float
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of an AWQ word holds column AWQ_ORDER[j]


@dataclass(frozen=True)
class Scheme:
    """How the linears are quantized and which file layout holds them."""

    method: str  # awq | gptq | compressed-tensors
    bits: int
    symmetric: bool
    group_size: int  # -1: one group per row
    act_order: bool = False  # GPTQ / compressed-tensors: groups over a permutation of inputs
    scale_dtype: torch.dtype = torch.float16
    activations: bool = False  # compressed-tensors W8A8: dynamic int8 activations per token


SCHEMES = {
    "awq": Scheme("awq", 4, False, 64),
    "gptq-4bit": Scheme("gptq", 4, True, 64),
    "gptq-4bit-asym": Scheme("gptq", 4, False, 32),
    "gptq-4bit-act-order": Scheme("gptq", 4, True, 32, act_order=True),
    "gptq-8bit": Scheme("gptq", 8, True, -1),
    "w4a16": Scheme("compressed-tensors", 4, True, 32, scale_dtype=torch.bfloat16),
    "w4a16-asym": Scheme("compressed-tensors", 4, False, 64, scale_dtype=torch.bfloat16),
    "w4a16-act-order": Scheme(
        "compressed-tensors", 4, True, 32, act_order=True, scale_dtype=torch.bfloat16
    ),
    "w8a16": Scheme("compressed-tensors", 8, True, -1, scale_dtype=torch.bfloat16),
    "w8a8": Scheme("compressed-tensors", 8, True, -1, scale_dtype=torch.float16, activations=True),
}


def _is_quantized(name: str, tensor: torch.Tensor) -> bool:
    return ".layers." in name and name.endswith("_proj.weight") and tensor.dim() == 2


def quantize(
    weight: torch.Tensor, scheme: Scheme, g_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest integers of `weight` `[out, in]` per group (`g_idx`: each input's
    group): q `[out, in]` and z `[out, groups]` unsigned (w ~ s * (q - z)), s `[out, groups]` in
    the scheme's scale dtype."""
    w = weight.float()
    groups = int(g_idx.max()) + 1
    top = (1 << scheme.bits) - 1
    lo = torch.stack([w[:, g_idx == g].amin(1) for g in range(groups)], 1).clamp(max=0)
    hi = torch.stack([w[:, g_idx == g].amax(1) for g in range(groups)], 1).clamp(min=0)
    if scheme.symmetric:
        half = 1 << (scheme.bits - 1)
        s = (torch.maximum(-lo, hi) / (half - 0.5)).clamp(min=1e-6).to(scheme.scale_dtype)
        z = torch.full_like(s, half, dtype=torch.int32)
    else:
        s = ((hi - lo) / top).clamp(min=1e-6).to(scheme.scale_dtype)
        z = torch.round(-lo / s.float()).clamp(0, top).to(torch.int32)
    q = torch.round(w / s.float()[:, g_idx]) + z[:, g_idx]
    return q.clamp(0, top).to(torch.int32), z, s


def dequantized(
    q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """s * (q - z) in float32, each element from its group: the reference checkpoint's weight."""
    return (q - z[:, g_idx]).float() * s.float()[:, g_idx]


def _words(values: np.ndarray, bits: int) -> np.ndarray:
    # [..., 32 / bits] unsigned values -> [...] int32 words, value j at bits * j
    out = np.zeros(values.shape[:-1], dtype=np.uint32)
    for j in range(values.shape[-1]):
        out |= values[..., j].astype(np.uint32) << np.uint32(bits * j)
    return out.view(np.int32)


def _awq_tensors(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> dict[str, torch.Tensor]:
    # along out: [r, out] -> [r, out / 8], nibble j holding column 8c + AWQ_ORDER[j]
    def pack(values: np.ndarray) -> torch.Tensor:
        runs = values.reshape(values.shape[0], -1, 8)[:, :, list(AWQ_ORDER)]
        return torch.from_numpy(_words(runs, 4))

    return {
        "qweight": pack(q.t().numpy()),
        "qzeros": pack(z.t().numpy()),
        "scales": s.t().contiguous(),
    }


def _gptq_tensors(
    q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> dict[str, torch.Tensor]:
    per_word = 32 // bits
    qt = q.t().numpy()  # [in, out]: packed along in
    qweight = _words(qt.reshape(-1, per_word, qt.shape[1]).transpose(0, 2, 1), bits)
    stored = (z.t().numpy() - 1) & ((1 << bits) - 1)  # the first version's z - 1, [groups, out]
    qzeros = _words(stored.reshape(stored.shape[0], -1, per_word), bits)
    return {
        "qweight": torch.from_numpy(qweight),
        "qzeros": torch.from_numpy(qzeros),
        "scales": s.t().contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }


def _compressed_tensors(
    q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, g_idx: torch.Tensor, scheme: Scheme
) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    half = 1 << (scheme.bits - 1)
    signed = (q - half).to(torch.int8)  # compressed-tensors' integers are signed
    tensors: dict[str, torch.Tensor] = {"weight_scale": s.contiguous()}
    if scheme.bits == 8:
        tensors["weight"] = signed
    else:
        tensors["weight_packed"] = pack_to_int32(signed, scheme.bits)
        tensors["weight_shape"] = torch.tensor(list(q.shape))
    if not scheme.symmetric:
        zero = (z - half).to(torch.int8)
        tensors["weight_zero_point"] = (
            pack_to_int32(zero, scheme.bits, packed_dim=0) if scheme.bits == 4 else zero
        )
    if scheme.act_order:
        tensors["weight_g_idx"] = g_idx.to(torch.int32)
    return tensors


def quantization_config(scheme: Scheme) -> dict[str, Any]:
    """The config.json `quantization_config` the method's own tools write for `scheme`."""
    if scheme.method == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": scheme.group_size,
            "zero_point": True,
            "version": "gemm",
        }
    if scheme.method == "gptq":
        return {
            "quant_method": "gptq",
            "bits": scheme.bits,
            "group_size": scheme.group_size,
            "desc_act": scheme.act_order,
            "sym": scheme.symmetric,
            "checkpoint_format": "gptq",
        }
    weights = {
        "num_bits": scheme.bits,
        "type": "int",
        "symmetric": scheme.symmetric,
        "strategy": "channel" if scheme.group_size < 0 else "group",
        "group_size": None if scheme.group_size < 0 else scheme.group_size,
        "dynamic": False,
        "actorder": "group" if scheme.act_order else None,
    }
    activations = (
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
        if scheme.activations
        else None
    )
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized" if scheme.bits == 4 else "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
            }
        },
        "ignore": ["lm_head"],
    }


def write_quantized(
    model: Path, out: Path, scheme_name: str, reference_out: Path | None = None, seed: int = 0
) -> Path:
    """`model`'s decoder-layer linears quantized per `scheme_name` (SCHEMES) into `out`, and
    with `reference_out` the float32 checkpoint of the very weights `out` holds."""
    scheme = SCHEMES[scheme_name]
    state = {}
    for file in sorted(model.glob("*.safetensors")):
        state.update(load_file(file))
    rng = torch.Generator().manual_seed(seed)
    quantized: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    # the rest of the model in the dtype such checkpoints come in (float16 for AWQ and GPTQ)
    half = torch.float16 if scheme.method != "compressed-tensors" else scheme.scale_dtype
    for name, tensor in state.items():
        if not _is_quantized(name, tensor):
            quantized[name] = tensor.to(half) if tensor.dim() > 1 else tensor
            reference[name] = quantized[name].float()
            continue
        in_features = tensor.shape[1]
        group = in_features if scheme.group_size < 0 else scheme.group_size
        g_idx = torch.arange(in_features) // group
        if scheme.act_order:  # groups over a permutation of the inputs
            g_idx = g_idx[torch.argsort(torch.rand(in_features, generator=rng))]
        q, z, s = quantize(tensor, scheme, g_idx)
        prefix = name.removesuffix(".weight")
        if scheme.method == "awq":
            parts = _awq_tensors(q, z, s)
        elif scheme.method == "gptq":
            parts = _gptq_tensors(q, z, s, g_idx, scheme.bits)
        else:
            parts = _compressed_tensors(q, z, s, g_idx, scheme)
        quantized.update({f"{prefix}.{part}": value for part, value in parts.items()})
        reference[name] = dequantized(q, z, s, g_idx)
    config = json.loads((model / "config.json").read_text())
    for target, tensors, extra in (
        (out, quantized, {"quantization_config": quantization_config(scheme)}),
        (reference_out, reference, {"dtype": "float32"}),
    ):
        if target is None:
            continue
        target.mkdir(parents=True, exist_ok=True)
        for file in model.iterdir():
            if file.is_file() and file.suffix != ".safetensors" and file.name != "config.json":
                shutil.copy(file, target / file.name)
        (target / "config.json").write_text(json.dumps({**config, **extra}, indent=2))
        save_file({k: v.contiguous() for k, v in tensors.items()}, target / "model.safetensors")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a float checkpoint folder")
    parser.add_argument("--scheme", choices=sorted(SCHEMES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reference-out", type=Path, help="the float32 checkpoint of its weights")
    parser.add_argument("--seed", type=int, default=0, help="act order's permutation")
    args = parser.parse_args(argv)
    write_quantized(args.model, args.out, args.scheme, args.reference_out, args.seed)
    print(f"wrote {args.out}" + (f" and {args.reference_out}" if args.reference_out else ""))


if __name__ == "__main__":
    main()
