"""The quantized linear alone: a GGUF's own weights, float32 activations against int8 ones.

    python -m benchmarks.quantized_linear [--gguf PATH] [--rows 1 2 4 8 16 32 47 64]
        [--out bench/results/quantized_linear.json]

For each matmul of a decoder layer as Quire's model fuses them (q/k/v rows end to end, gate/up
likewise, o, down) and the LM head, in the file's own blocks, and each number of rows of x M
(decode batches are small, prefill chunks large), times `quire.kernels.quantized
.quantized_linear` with float32 activations (each block dequantized, float32 FMAs; from 48
rows panels of W dequantized and multiplied by torch's GEMM) and with int8 activations
(`quantized_activations=int8`: x quantized to 8 bits per 32 inputs, integer dot products;
below `cpp_quantized.int8_row_limit()` rows of Q8_0, Q4_0 and Q4_1 only, else the same
float32 path) and, where the CPU has AVX512_VNNI, with int8 activations on the weights
interleaved as a model holds them there (`quantized_linear.interleaved`: Q8_0x16, Q4_1x16; the
`x16` columns, with their speedup over int8 on the file's layout). Each timed call takes
the next layer's weights in turn, so the weights come from memory as in a forward pass; both
results are checked against the torch oracles (dequantize then multiply; and its int8
counterpart). Prints microseconds per call, the weight bytes read per second, int8's speedup,
and per M the sum over one layer's four matmuls; torch's threads as set (OMP_NUM_THREADS=1 for
one core).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from benchmarks.linear_layouts import best_of
from benchmarks.peers.llamacpp_env import gguf_path
from quire.kernels import cpp_quantized, quantized, reference_quantized
from quire.model.gguf_checkpoint import load_gguf
from quire.model.quantized_linear import QuantizedTensor, Weight, concat_rows, interleaved

# a decoder layer's matmuls as the model fuses them: name -> the checkpoint names' suffixes
LAYER_MATMULS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


def matmul_weights(weights: dict[str, Weight], num_layers: int) -> dict[str, list[QuantizedTensor]]:
    """Per matmul, every layer's weight in blocks (fused as the model fuses them); the LM head
    once (output.weight, else the tied embedding)."""
    found: dict[str, list[QuantizedTensor]] = {}
    for name, parts in LAYER_MATMULS.items():
        for i in range(num_layers):
            fused = concat_rows([weights[f"model.layers.{i}.{p}.weight"] for p in parts])
            if isinstance(fused, QuantizedTensor):
                found.setdefault(name, []).append(fused)
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    if isinstance(head, QuantizedTensor):
        found["lm_head"] = [head]
    return found


def time_matmul(
    tensors: list[QuantizedTensor], rows: int, int8: bool, seed: int = 0
) -> tuple[float, float]:
    """Seconds per call cycling through `tensors`, and the first call's error against its oracle
    relative to the result's largest magnitude."""
    first = tensors[0]
    x = torch.randn(rows, first.in_features, generator=torch.Generator().manual_seed(seed))
    got = quantized.quantized_linear(x, first.blocks, first.quant, int8)
    takes_int8 = (
        int8
        and rows < cpp_quantized.int8_row_limit()
        and (
            first.quant in reference_quantized.INT8_FORMATS
            or first.quant in reference_quantized.INTERLEAVED
        )
    )
    if takes_int8:
        expected = reference_quantized.quantized_linear_int8(x, first.blocks, first.quant)
    else:
        expected = reference_quantized.quantized_linear(x.double(), first.blocks, first.quant)
    error = float((got.double() - expected).abs().max() / expected.abs().max())

    def call_each() -> None:
        for t in tensors:
            quantized.quantized_linear(x, t.blocks, t.quant, int8)

    return best_of(call_each, repeats=3, inner=3) / len(tensors), error


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=gguf_path("q4_1"))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 47, 64])
    parser.add_argument("--out", type=Path, default=Path("bench/results/quantized_linear.json"))
    args = parser.parse_args(argv)

    config, weights = load_gguf(args.gguf, torch.device("cpu"), torch.float32)
    matmuls = matmul_weights(weights, config.num_layers)
    print(
        f"{args.gguf.name}: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()}"
    )
    print(
        f"{'matmul':<9}{'format':<7}{'[N, K]':>14}{'M':>5}{'float32 us':>12}{'GB/s':>7}"
        f"{'int8 us':>10}{'GB/s':>7}{'int8 x':>8}{'x16 us':>9}{'GB/s':>7}{'x16 x':>7}"
    )
    rows: list[dict[str, Any]] = []
    for name, tensors in matmuls.items():
        first = tensors[0]
        # as a model with int8 activations holds them on this CPU (None: not interleaved here)
        packed = [interleaved(dataclasses.replace(t, int8_activations=True)) for t in tensors]
        x16 = packed if packed[0].quant in reference_quantized.INTERLEAVED else None
        for m in args.rows:
            row: dict[str, Any] = {
                "matmul": name,
                "format": first.quant,
                "shape": list(first.shape),
                "weight_bytes": first.nbytes,
                "rows": m,
            }
            for mode in ("float32", "int8"):
                seconds, error = time_matmul(tensors, m, mode == "int8")
                assert error < 1e-4, (name, m, mode, error)
                row[f"{mode}_us"] = seconds * 1e6
                row[f"{mode}_gb_s"] = first.nbytes / seconds / 1e9
            row["int8_speedup"] = row["float32_us"] / row["int8_us"]
            x16_cells = ""
            if x16 is not None:
                seconds, error = time_matmul(x16, m, True)
                assert error < 1e-4, (name, m, "x16", error)
                row["x16_format"] = x16[0].quant
                row["x16_us"] = seconds * 1e6
                row["x16_gb_s"] = x16[0].nbytes / seconds / 1e9
                row["x16_speedup"] = row["int8_us"] / row["x16_us"]
                x16_cells = (
                    f"{row['x16_us']:>9.0f}{row['x16_gb_s']:>7.1f}{row['x16_speedup']:>7.2f}"
                )
            rows.append(row)
            print(
                f"{name:<9}{first.quant:<7}{str(tuple(first.shape)):>14}{m:>5}"
                f"{row['float32_us']:>12.0f}{row['float32_gb_s']:>7.1f}"
                f"{row['int8_us']:>10.0f}{row['int8_gb_s']:>7.1f}{row['int8_speedup']:>8.2f}"
                + x16_cells,
                flush=True,
            )
    for m in args.rows:
        layer = [r for r in rows if r["rows"] == m and r["matmul"] in LAYER_MATMULS]
        f32, int8 = (sum(r[f"{mode}_us"] for r in layer) for mode in ("float32", "int8"))
        line = f"one decoder layer, M={m:<3} float32 {f32:8.0f} us  int8 {int8:8.0f} us  "
        line += f"{f32 / int8:.2f}x"
        if all("x16_us" in r for r in layer):
            packed_us = sum(r["x16_us"] for r in layer)
            line += f"  x16 {packed_us:8.0f} us  {int8 / packed_us:.2f}x int8's"
        print(line)
    result = {
        "gguf": str(args.gguf),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
