"""What n-gram drafts cost a step: one decoding stream's step with 0-8 drafts, per context.

    python -m benchmarks.draft_cost [--model PATH] [--dtypes float32,bfloat16]
        [--contexts 385,1025,2049] [--drafts 0,1,2,4,8] [--rounds 30]

For each dtype and context length it prefills one prompt offline, then times the model runner
on that stream's step with each number of drafts (the draft tokens are arbitrary: the cost does
not depend on them, and nothing is kept), the settings interleaved round by round so drift
hits all alike; per setting, the median over rounds after 5 warm-up rounds. Context lengths
are chosen one past a block boundary, so the last block has room for every draft. A step
with drafts leaves the decode-only attention path, which is what the context lengths show.
Writes bench/results/draft_cost.json.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common.report import model_parser, write_json
from benchmarks.offline.machine import machine_info

RESULTS_PATH = Path("bench/results/draft_cost.json")
WARMUP_ROUNDS = 5


def measure(
    model: str, dtype: str, context: int, drafts: list[int], rounds: int
) -> dict[int, float]:
    """Median milliseconds of the stream's step per number of drafts."""
    from quire import LLM, SamplingParams
    from quire.engine.scheduler import ScheduledSeq, SchedulerOutput

    llm = LLM(model=model, dtype=dtype, max_num_batched_tokens=max(2048, context))
    engine = llm.engine
    vocab = engine.model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompt = [(7919 * (i + 1)) % (vocab - 3) + 3 for i in range(context - 1)]
    engine.add_request("r", {"prompt_token_ids": prompt}, params)
    engine.step()  # the prompt, and the stream's first token: `context` tokens now
    (seq,) = engine.requests["r"].seqs
    assert (seq.num_tokens, seq.num_computed_tokens) == (context, context - 1)
    engine.scheduler.schedule()  # the decode step's allocation: a slot for every token
    times: dict[int, list[float]] = {k: [] for k in drafts}
    for round_ in range(rounds + WARMUP_ROUNDS):
        for k in drafts:
            step = SchedulerOutput(
                scheduled=[ScheduledSeq(seq, seq.num_computed_tokens, 1 + k, (0,), tuple([5] * k))]
            )
            start = time.perf_counter()
            engine.runner.execute(step)
            if round_ >= WARMUP_ROUNDS:
                times[k].append(time.perf_counter() - start)
    engine.abort_request("r")
    return {k: statistics.median(t) * 1e3 for k, t in times.items()}


def main() -> None:
    parser = model_parser(__doc__, RESULTS_PATH)
    parser.add_argument("--contexts", default="385,1025,2049")
    parser.add_argument("--drafts", default="0,1,2,4,8")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    drafts = [int(k) for k in args.drafts.split(",")]
    contexts = [int(n) for n in args.contexts.split(",")]
    for context in contexts:
        room = -(-context // 16) * 16 - context
        if max(drafts) > room:
            parser.error(f"--contexts: {context} leaves room for {room} drafts in its last block")
    results: dict[str, Any] = {
        "benchmark": "draft_cost",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": args.model,
        "machine_before": machine_info(),
        "step_ms": {},
    }
    for dtype in args.dtypes.split(","):
        for context in contexts:
            ms = measure(args.model, dtype, context, drafts, args.rounds)
            results["step_ms"][f"{dtype} {context}"] = ms
            cells = ", ".join(f"{k} drafts {v:.2f} ms" for k, v in ms.items())
            print(f"{dtype} context {context}: {cells}", flush=True)
    write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
