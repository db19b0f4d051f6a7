"""A lone prompt's prefill: how fast one engine step computes it, against the machine's matmul.

    python -m benchmarks.prefill_rate [--model PATH] [--dtypes float32,bfloat16]
        [--lengths 64,128,256,512,1024] [--repeats 5]

For each dtype it loads the model offline, then prefills prompts of each length one at a time
(`max_tokens` 1, seeded token ids; the first of each length warms up) and records the median
wall time of the request (one engine step). It reports tokens/s and the GFLOP/s of the linear
layers' work (2 x the attention projections' and the gated MLP's weights per token; attention
over the context and the logits are left out, so the figure is a lower bound), and, for
scale, the GFLOP/s torch's own matmul reaches at the model's largest projection with as many
rows as the prompt ([length, hidden] x [hidden, intermediate], same dtype and threads): a
prefill near that rate cannot come much sooner on this machine. Writes
bench/results/prefill_rate.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import model_parser, write_json
from benchmarks.offline.machine import machine_info

RESULTS_PATH = Path("bench/results/prefill_rate.json")


def linear_flops_per_token(config: dict[str, Any]) -> int:
    """2 x the weights a token's hidden state meets in the attention projections and a dense
    gated MLP, over every layer (a mixture of experts or another MLP shape: not counted)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return 2 * config["num_hidden_layers"] * (attention + 3 * hidden * inter)


def matmul_rate(rows: int, hidden: int, inter: int, dtype: Any) -> float:
    """GFLOP/s of torch's [rows, hidden] x [hidden, inter] matmul here (the best of 20)."""
    import torch

    a, b = torch.randn(rows, hidden, dtype=dtype), torch.randn(hidden, inter, dtype=dtype)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * rows * hidden * inter / best / 1e9


def measure(model: str, dtype: str, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    import torch

    from quire import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype)
    engine = llm.engine
    config = json.loads((Path(model) / "config.json").read_text())
    flops = linear_flops_per_token(config)
    vocab = engine.model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rows = []
    for length in lengths:
        times = []
        for repeat in range(repeats + 1):  # the first warms up
            prompt = [
                (7919 * (repeat * 100_003 + i + length)) % (vocab - 3) + 3 for i in range(length)
            ]
            engine.add_request(f"p{length}-{repeat}", {"prompt_token_ids": prompt}, params)
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            if repeat:
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        assert isinstance(engine.dtype, torch.dtype)
        row = {
            "prompt_tokens": length,
            "prefill_ms": seconds * 1e3,
            "tokens_per_s": length / seconds,
            "linear_gflops": flops * length / seconds / 1e9,
            "matmul_gflops": matmul_rate(
                length, config["hidden_size"], config["intermediate_size"], engine.dtype
            ),
        }
        rows.append(row)
        print(
            f"{dtype} {length:5d} tokens: {row['prefill_ms']:7.1f} ms, "
            f"{row['tokens_per_s']:6.0f} tok/s, linear layers {row['linear_gflops']:4.0f} "
            f"GFLOP/s, torch matmul at that shape {row['matmul_gflops']:4.0f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = model_parser(__doc__, RESULTS_PATH)
    parser.add_argument("--lengths", default="64,128,256,512,1024")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    results: dict[str, Any] = {
        "benchmark": "prefill_rate",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": args.model,
        "machine_before": machine_info(),
        "dtypes": {
            dtype: measure(args.model, dtype, lengths, args.repeats)
            for dtype in args.dtypes.split(",")
        },
    }
    write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
