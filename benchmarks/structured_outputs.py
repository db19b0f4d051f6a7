"""What structured outputs cost the engine: one batch, unconstrained and half constrained.

    python -m benchmarks.structured_outputs                 # make bench-structured
    python -m benchmarks.structured_outputs --quick         # quire-tiny, seconds

The same prompts run through the offline engine with greedy decoding, after a warm-up that
compiles the grammar: unconstrained, then with every other request under a JSON schema (an
array of short strings long enough that no output completes before `--max-tokens`, so both
runs produce exactly the same number of tokens and the batch keeps its shape), alternating
`--repeats` times so that drift in the machine's speed falls on both. It reports each run's
output tokens per second, the ratio of the medians and of each pair, and the mask work (the
constrained run's only extra work): seconds filling bitmasks on the grammar thread,
overlapped with the forward pass, and seconds the step waited for a fill and applied it.
Unconstrained runs report zero mask work: they pay nothing for it. Writes
bench/results/structured.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from benchmarks.common.report import write_json
from benchmarks.offline.machine import machine_info
from quire import LLM, SamplingParams, StructuredOutputParams

# Never completes within max_tokens: every constrained output runs the full length.
LONG_SCHEMA = {
    "type": "array",
    "items": {"type": "string", "maxLength": 6},
    "minItems": 500,
}


def masked_run(
    llm: LLM, prompts: list[dict[str, Any]], params: list[SamplingParams]
) -> dict[str, Any]:
    """`run`, plus the mask work it did: rows masked, seconds filling bitmasks on the
    grammar thread (overlapped with the forward pass) and seconds the engine's step waited
    for a fill and applied the mask (the part not hidden)."""
    masks = llm.engine.structured_outputs()
    rows, fill, wait = masks.num_masked_rows, masks.fill_seconds, masks.wait_seconds
    result = run(llm, prompts, params)
    result["masked_rows"] = masks.num_masked_rows - rows
    result["fill_seconds"] = masks.fill_seconds - fill
    result["mask_wait_seconds"] = masks.wait_seconds - wait
    return result


def run(llm: LLM, prompts: list[dict[str, Any]], params: list[SamplingParams]) -> dict[str, Any]:
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"seconds": seconds, "output_tokens": tokens, "output_tok_s": tokens / seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default all)")
    parser.add_argument("--repeats", type=int, default=3, help="unconstrained/half pairs run")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="quire-tiny, 8 requests, 16 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.num_requests, args.max_tokens = "models/quire-tiny", 8, 16
        args.repeats = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, max_num_seqs=max(args.num_requests, 1))
    vocab = llm.engine.model.config.vocab_size
    prompts: list[dict[str, Any]] = [
        {"prompt_token_ids": [(97 * r + 13 * i) % (vocab - 10) + 5 for i in range(args.prompt_len)]}
        for r in range(args.num_requests)
    ]
    plain = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        structured=StructuredOutputParams(json=LONG_SCHEMA),
    )
    mixed = [constrained if r % 2 else plain for r in range(args.num_requests)]
    run(llm, prompts[:2], [plain, constrained])  # warm up, compile the grammar once
    runs: dict[str, list[dict[str, Any]]] = {"unconstrained": [], "half_constrained": []}
    for _ in tqdm(range(args.repeats), desc="unconstrained + half constrained", unit="pair"):
        runs["unconstrained"].append(masked_run(llm, prompts, [plain] * args.num_requests))
        runs["half_constrained"].append(masked_run(llm, prompts, mixed))
    medians = {name: statistics.median(r["output_tok_s"] for r in rs) for name, rs in runs.items()}
    results = {
        "model": args.model,
        "num_requests": args.num_requests,
        "num_constrained": sum(1 for p in mixed if p.structured),
        "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len,
        "repeats": args.repeats,
        "schema": LONG_SCHEMA,
        "runs": runs,
        "median_output_tok_s": medians,
        "ratio_half_to_unconstrained": medians["half_constrained"] / medians["unconstrained"],
        "pair_ratios": [
            h["output_tok_s"] / u["output_tok_s"]
            for u, h in zip(runs["unconstrained"], runs["half_constrained"], strict=True)
        ],
        "machine": machine_info(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "structured.json", results)
    print(
        f"{'run':<22}{'tokens':>8}{'seconds':>9}{'tok/s':>9}{'rows':>7}{'fill s':>8}{'wait s':>8}"
    )
    for k in range(args.repeats):
        for name, rs in runs.items():
            r = rs[k]
            print(
                f"{name:<22}{r['output_tokens']:>8}{r['seconds']:>9.2f}{r['output_tok_s']:>9.1f}"
                f"{r['masked_rows']:>7}{r['fill_seconds']:>8.3f}{r['mask_wait_seconds']:>8.3f}"
            )
    print(
        f"median tok/s: unconstrained {medians['unconstrained']:.1f}, half constrained "
        f"{medians['half_constrained']:.1f}; half constrained / unconstrained "
        f"{results['ratio_half_to_unconstrained']:.3f} (pairs: "
        + ", ".join(f"{x:.3f}" for x in results["pair_ratios"])
        + ")"
    )
    print(f"wrote {args.out / 'structured.json'}")
    return results


if __name__ == "__main__":
    main()
