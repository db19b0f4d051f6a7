"""Greedy tokens of a GGUF under Quire against transformers' GGUF loader (which dequantizes every
weight to float32) on ShareGPT requests: how many requests come out token for token the same.

Both sides compute in float32 on the same token ids (ShareGPT's first turns tokenized with the
file's tokenizer, vLLM's sampling rule, seeded), each request to its ShareGPT output length
capped at `--max-tokens`, EOS ignored (transformers: no EOS in its generation config, so an
EOS is generated like any token, as Quire's `ignore_eos` does). Where a request's
tokens part, the reference's top-2 logit gap at that position is recorded: random near-ties
part float32 computations that sum in different orders.

    python -m benchmarks.gguf_greedy [--gguf PATH] [--num-requests 100] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from quire_tools.workloads import sharegpt
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from benchmarks.peers.llamacpp_env import gguf_path
from quire import LLM, SamplingParams


def reference(model: Any, prompt: list[int], num_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and the top-2 logit gap at each."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=num_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    gaps = []
    for logits in out.logits:
        top2 = logits[0].float().topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    return tokens, gaps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=gguf_path("q4_1"))
    parser.add_argument("--num-requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gguf_greedy.json"))
    args = parser.parse_args(argv)

    llm = LLM(model=str(args.gguf), dtype="float32")
    requests = sharegpt.sample_requests(
        sharegpt.read_conversations(sharegpt.DEFAULT_PATH),
        llm.engine.tokenizer,
        args.num_requests,
        args.seed,
    )
    lengths = [min(r.output_len, args.max_tokens) for r in requests]
    started = time.perf_counter()
    outputs = llm.generate(
        [{"prompt_token_ids": r.prompt_token_ids} for r in requests],
        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths],
        use_tqdm=True,
    )
    quire_s = time.perf_counter() - started
    model = AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32
    ).eval()
    model.generation_config.eos_token_id = None  # generate EOS like any token, never stop
    model.generation_config.pad_token_id = 0
    rows = []
    started = time.perf_counter()
    for r, n, out in tqdm(list(zip(requests, lengths, outputs, strict=True)), desc="transformers"):
        ref, gaps = reference(model, r.prompt_token_ids, n)
        got = list(out.outputs[0].token_ids)
        parted = next((j for j, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
        rows.append(
            {
                "prompt_len": len(r.prompt_token_ids),
                "output_len": n,
                "identical": got == ref,
                "parted_at": parted,
                "gap_where_parted": None if parted is None else gaps[parted],
            }
        )
    hf_s = time.perf_counter() - started
    identical = sum(row["identical"] for row in rows)
    result = {
        "gguf": str(args.gguf),
        "num_requests": len(rows),
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "identical": identical,
        "identical_fraction": identical / len(rows),
        "quire_s": quire_s,
        "transformers_s": hf_s,
        "requests": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    gaps = [row["gap_where_parted"] for row in rows if not row["identical"]]
    print(
        f"{identical} of {len(rows)} requests token for token the same "
        f"({identical / len(rows):.1%}); top-2 gaps where they parted: "
        f"{', '.join(f'{g:.2e}' for g in gaps) or 'none'}"
    )
    return result


if __name__ == "__main__":
    main()
