"""CPU linear layers of the default model's shapes, on each of Quire's linear backends.

    python -m benchmarks.linear_layouts [--dtypes float32 bfloat16] [--rows 1 8 64 256]
        [--backends torch onednn widened packed] [--no-plain]

For each weight shape of SmolLM2-135M (fused qkv, o, fused gate/up, down, the LM head) and
each batch size M (decode batches are small, prefill chunks large), times `F.linear(x, W)`
against `quire.model.linear.Linear` on each backend: `torch` (`x @ W_t` on the weight stored
transposed), `onednn` (the weight reordered once by `torch.ops.mkldnn._reorder_linear_weight`,
multiplied by `_linear_pointwise`: what vLLM's CPU backend does), `packed` (Quire's AVX-512 or
AVX2 kernel on the weight packed into 64-column tiles, where it runs) and, for 16-bit dtypes,
`widened` (the weight widened to float32 once, the product in float32, rounded back). Each is
checked against a float64 product. Prints microseconds per call and each one's speedup over
F.linear. Run it with OMP_NUM_THREADS=1 for per-core figures. On a CPU without AVX-512 torch's
own bfloat16 products take seconds a layer at prefill sizes (F.linear and `torch`):
`--backends widened packed --no-plain` leaves them out.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter

import torch
import torch.nn.functional as F

from quire.model.linear import Linear, can_run

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


def _call_each(fns: Sequence[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor) -> None:
    for fn in fns:
        fn(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 32, 64, 256])
    parser.add_argument(
        "--copies",
        type=int,
        default=30,
        help="distinct weights per decoder shape, cycled through per timed call (the model's "
        "30 layers: weights come from memory as in a forward pass; 1 = cache-hot)",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=("torch", "onednn", "widened", "packed"),
        default=["torch", "onednn", "widened", "packed"],
    )
    parser.add_argument(
        "--no-plain", action="store_true", help="leave out F.linear (the speedup columns' base)"
    )
    args = parser.parse_args(argv)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.copies} copies, "
        f"load {os.getloadavg()}"
    )
    backends = list(args.backends)
    print(
        f"{'dtype':<9}{'shape':<9}{'M':>5}{'F.linear us':>12}"
        + "".join(f"{b + ' us':>12}{'x':>6}" for b in backends)
    )
    for name in args.dtypes:
        dtype = getattr(torch, name)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        # per (backend, M): microseconds of one decoder layer's four matmuls
        layer_us: dict[tuple[str, int], float] = {}
        for shape, (n, k) in SHAPES.items():
            copies = 1 if shape == "lm_head" else args.copies
            weights = [torch.randn(n, k, dtype=dtype) / k**0.5 for _ in range(copies)]
            layers = {
                b: [Linear(w, None, b, batch_size_hint=max(args.rows)) for w in weights]
                for b in backends
                if (b != "widened" or dtype != torch.float32) and can_run(b, dtype)
            }
            for m in args.rows:
                x = torch.randn(m, k, dtype=dtype)
                ref = F.linear(x.double(), weights[0].double())
                row = f"{name:<9}{shape:<9}{m:>5}"
                plain = float("nan")
                if not args.no_plain:
                    plain = best_of(
                        partial(_call_each, [partial(F.linear, weight=w) for w in weights], x)
                    )
                    plain /= copies
                row += f"{plain * 1e6:>12.0f}"
                for b in backends:
                    if b not in layers:
                        row += f"{'-':>12}{'':>6}"
                        continue
                    err = float((layers[b][0](x).double() - ref).abs().max() / ref.abs().max())
                    assert err < tolerance, (b, shape, m, err)
                    took = best_of(partial(_call_each, layers[b], x)) / copies
                    row += f"{took * 1e6:>12.0f}{plain / took:>6.2f}"
                    if shape != "lm_head":
                        layer_us[b, m] = layer_us.get((b, m), 0.0) + took * 1e6
                print(row)
        for m in args.rows:
            times = "".join(
                f"{b} {layer_us[b, m]:>8.0f} us  " for b in backends if (b, m) in layer_us
            )
            print(f"{name:<9}one decoder layer, M={m:<5}{times}", flush=True)


if __name__ == "__main__":
    main()
