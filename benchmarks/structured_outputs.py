"""What structured outputs cost the engine: one batch, unconstrained and half constrained.

    python -m benchmarks.structured_outputs                 # make bench-structured
    python -m benchmarks.structured_outputs --quick         # quire-tiny, seconds

The same prompts run twice through the offline engine with greedy decoding: once with no
constraint, once with every other request under a JSON schema (an array of short strings long
enough that no output completes before `--max-tokens`, so both runs produce exactly the same
number of tokens and the batch keeps its shape). It reports output tokens per second of each,
their ratio, and the time spent filling and applying bitmasks (the constrained run's only
extra work); a third run of the unconstrained batch after the grammar machinery is warm
shows unconstrained steps pay nothing for it. Writes bench/results/structured.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import write_json
from benchmarks.offline.machine import machine_info
from quire import LLM, SamplingParams, StructuredOutputParams
from quire.engine.structured import StructuredOutputs

# Never completes within max_tokens: every constrained output runs the full length.
LONG_SCHEMA = {
    "type": "array",
    "items": {"type": "string", "maxLength": 6},
    "minItems": 500,
}


class TimedMasks:
    """Wraps an engine's StructuredOutputs to add up the seconds spent in mask_logits."""

    def __init__(self, inner: StructuredOutputs) -> None:
        self.inner = inner
        self.seconds = 0.0
        original = inner.mask_logits

        def timed(logits: torch.Tensor, rows: Any) -> int:
            started = time.perf_counter()
            try:
                return original(logits, rows)
            finally:
                self.seconds += time.perf_counter() - started

        inner.mask_logits = timed  # type: ignore[method-assign]


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
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="quire-tiny, 8 requests, 16 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.num_requests, args.max_tokens = "models/quire-tiny", 8, 16
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
    masks = TimedMasks(llm.engine.structured_outputs())
    unconstrained = run(llm, prompts, [plain] * args.num_requests)
    masks.seconds = 0.0
    rows_before = masks.inner.num_masked_rows
    half = run(llm, prompts, mixed)
    half["mask_seconds"] = masks.seconds
    half["masked_rows"] = masks.inner.num_masked_rows - rows_before
    masks.seconds = 0.0
    rows_before = masks.inner.num_masked_rows
    again = run(llm, prompts, [plain] * args.num_requests)
    again["mask_seconds"] = masks.seconds
    again["masked_rows"] = masks.inner.num_masked_rows - rows_before
    results = {
        "model": args.model,
        "num_requests": args.num_requests,
        "num_constrained": sum(1 for p in mixed if p.structured),
        "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len,
        "schema": LONG_SCHEMA,
        "unconstrained": unconstrained,
        "half_constrained": half,
        "unconstrained_after": again,
        "ratio_half_to_unconstrained": half["output_tok_s"] / unconstrained["output_tok_s"],
        # against the unconstrained run after it, when everything is warm: the fair ratio
        "ratio_half_to_warm_unconstrained": half["output_tok_s"] / again["output_tok_s"],
        "machine": machine_info(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "structured.json", results)
    print(f"{'run':<22}{'tokens':>8}{'seconds':>9}{'tok/s':>9}{'mask s':>9}")
    for name in ("unconstrained", "half_constrained", "unconstrained_after"):
        r = results[name]
        mask = f"{r['mask_seconds']:.3f}" if "mask_seconds" in r else "-"
        print(
            f"{name:<22}{r['output_tokens']:>8}{r['seconds']:>9.2f}{r['output_tok_s']:>9.1f}"
            f"{mask:>9}"
        )
    print(f"half constrained / unconstrained: {results['ratio_half_to_unconstrained']:.3f}")
    print(
        "half constrained / unconstrained after it (warm): "
        f"{results['ratio_half_to_warm_unconstrained']:.3f}"
    )
    print(f"wrote {args.out / 'structured.json'}")
    return results


if __name__ == "__main__":
    main()
