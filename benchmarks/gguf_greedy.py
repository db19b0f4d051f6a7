"""Greedy tokens of a GGUF under Quire against transformers' GGUF loader (which dequantizes every
weight to float32) on ShareGPT requests: how many requests come out token for token the same.

Both sides compute in float32 on the same token ids (ShareGPT's first turns tokenized with the
file's tokenizer, vLLM's sampling rule, seeded), each request to its ShareGPT output length
capped at `--max-tokens`, EOS ignored (transformers: no EOS in its generation config, so an
EOS is generated like any token, as Quire's `ignore_eos` does). Where a request's
tokens part, the reference's top-2 logit gap at that position is recorded: random near-ties
part float32 computations that sum in different orders.

    python -m benchmarks.gguf_greedy [--gguf PATH] [--num-requests 100] [--max-tokens 64]
        [--quantized-activations int8,float32]

Each value of --quantized-activations is its own Quire run on the same requests: float32
activations multiply the dequantized weights as transformers does; int8 ones (the default
serving mode) quantize the activations of short steps to 8 bits as llama.cpp does, so their
tokens part from the reference wherever the top-2 gap is smaller than that rounding moves it.
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
from quire.model.checkpoint import load_tokenizer


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
    parser.add_argument(
        "--quantized-activations",
        default="int8,float32",
        help="comma-separated EngineConfig.quantized_activations values, each measured",
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.quantized_activations.split(",") if m.strip()]

    tokenizer = load_tokenizer(args.gguf)
    requests = sharegpt.sample_requests(
        sharegpt.read_conversations(sharegpt.DEFAULT_PATH), tokenizer, args.num_requests, args.seed
    )
    lengths = [min(r.output_len, args.max_tokens) for r in requests]
    tokens: dict[str, list[list[int]]] = {}
    quire_s: dict[str, float] = {}
    for mode in modes:
        llm = LLM(model=str(args.gguf), dtype="float32", quantized_activations=mode)
        started = time.perf_counter()
        outputs = llm.generate(
            [{"prompt_token_ids": r.prompt_token_ids} for r in requests],
            [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths],
            use_tqdm=True,
        )
        quire_s[mode] = time.perf_counter() - started
        tokens[mode] = [list(out.outputs[0].token_ids) for out in outputs]
        del llm
    model = AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32
    ).eval()
    model.generation_config.eos_token_id = None  # generate EOS like any token, never stop
    model.generation_config.pad_token_id = 0
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    started = time.perf_counter()
    for i, (r, n) in enumerate(
        tqdm(list(zip(requests, lengths, strict=True)), desc="transformers")
    ):
        ref, gaps = reference(model, r.prompt_token_ids, n)
        for mode in modes:
            got = tokens[mode][i]
            parted = next(
                (j for j, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None
            )
            rows[mode].append(
                {
                    "prompt_len": len(r.prompt_token_ids),
                    "output_len": n,
                    "identical": got == ref,
                    "parted_at": parted,
                    "gap_where_parted": None if parted is None else gaps[parted],
                }
            )
    hf_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "gguf": str(args.gguf),
        "num_requests": len(requests),
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "transformers_s": hf_s,
        "quantized_activations": {},
    }
    for mode in modes:
        identical = sum(row["identical"] for row in rows[mode])
        result["quantized_activations"][mode] = {
            "identical": identical,
            "identical_fraction": identical / len(requests),
            "quire_s": quire_s[mode],
            "requests": rows[mode],
        }
        gaps = [row["gap_where_parted"] for row in rows[mode] if not row["identical"]]
        print(
            f"quantized_activations={mode}: {identical} of {len(requests)} requests token for "
            f"token the same ({identical / len(requests):.1%}); top-2 gaps where they parted: "
            f"{', '.join(f'{g:.2e}' for g in gaps) or 'none'}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
