"""CPU linear layers of the default model's shapes: F.linear, transposed weights, oneDNN.

    python -m benchmarks.linear_layouts [--dtypes float32 bfloat16] [--rows 1 8 64 256]

For each weight shape of SmolLM2-135M (fused qkv, o, fused gate/up, down, the LM head) and
each batch size M (decode batches are small, prefill chunks large), times `F.linear(x, W)`
against `torch.ops.mkldnn._linear_pointwise` with the weight reordered once by
`torch.ops.mkldnn._reorder_linear_weight` (what vLLM's CPU backend does with oneDNN) and
against `x @ W_t` on the weight stored transposed (Quire's torch backend), and checks that
they agree with a float64 product. Prints microseconds per call and each one's speedup over
F.linear.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from time import perf_counter

import torch
import torch.nn.functional as F

# (out_features, in_features) of SmolLM2-135M's matmuls.
SHAPES = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}


def best_of(fn: Callable[[], object], repeats: int = 5, inner: int = 10) -> float:
    """Best mean seconds per call over `repeats` rounds of `inner` calls (after a warmup)."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (perf_counter() - start) / inner)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 64, 256])
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()}")
    print(
        f"{'dtype':<9}{'shape':<9}{'M':>5}{'linear us':>11}{'W_t us':>9}{'speedup':>9}"
        f"{'prepacked us':>14}{'speedup':>9}"
    )
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for shape, (n, k) in SHAPES.items():
            weight = torch.randn(n, k, dtype=dtype) / k**0.5
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, max(args.rows))
            weight_t = weight.t().contiguous()
            for m in args.rows:
                x = torch.randn(m, k, dtype=dtype)
                ref = F.linear(x.double(), weight.double())
                out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                err = float((out.double() - ref).abs().max() / ref.abs().max())
                assert err < (1e-5 if dtype == torch.float32 else 2e-2), (shape, m, err)
                err_t = float(((x @ weight_t).double() - ref).abs().max() / ref.abs().max())
                assert err_t < (1e-5 if dtype == torch.float32 else 2e-2), (shape, m, err_t)
                plain = best_of(lambda x=x, w=weight: F.linear(x, w))
                transposed = best_of(lambda x=x, w=weight_t: torch.mm(x, w))
                prepacked = best_of(
                    lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(
                        x, p, None, "none", [], ""
                    )
                )
                print(
                    f"{name:<9}{shape:<9}{m:>5}{plain * 1e6:>11.0f}{transposed * 1e6:>9.0f}"
                    f"{plain / transposed:>9.2f}{prepacked * 1e6:>14.0f}{plain / prepacked:>9.2f}"
                )


if __name__ == "__main__":
    main()
