"""Perplexity of a GGUF under Quire against llama.cpp's `llama-perplexity` on the same file and
the same tokens.

The text: ShareGPT conversations (every turn's text, one after another) from the project's
ShareGPT file, written to one file `llama-perplexity` reads. Its method, reproduced on Quire's
side: the text tokenized (BOS first when the vocabulary adds one), cut into chunks of `--ctx`
tokens (the tail dropped), each chunk's first token replaced by BOS when the vocabulary adds
one, and the negative log-likelihood of each chunk's tokens ctx/2 + 1 .. ctx - 1 given the
ones before; PPL = exp(mean). `llama-perplexity` writes its tokens into its logits file
(`--kl-divergence-base`), and Quire scores exactly those (prompt logprobs: the model's raw
distribution), so the two figures differ only by the models' arithmetic.

    python -m benchmarks.gguf_perplexity [--gguf PATH] [--ctx 512] [--chunks 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from quire_tools.workloads import sharegpt

from benchmarks.peers.llamacpp_env import BIN_DIR, gguf_path
from quire import LLM, SamplingParams

PPL_LINE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def sharegpt_text(path: Path, num_conversations: int) -> str:
    """The first conversations' turns, one after another, blank lines between."""
    turns = []
    for record in sharegpt.read_conversations(path)[:num_conversations]:
        turns += [turn["value"] for turn in record.get("conversations", [])]
    return "\n\n".join(turns)


def read_logits_tokens(path: Path) -> tuple[int, list[list[int]]]:
    """n_ctx and the chunks of tokens from a `llama-perplexity --kl-divergence-base` file."""
    with path.open("rb") as f:
        if f.read(8) != b"_logits_":
            raise ValueError(f"{path} is not a llama-perplexity logits file")
        n_ctx, _n_vocab, n_chunk = np.frombuffer(f.read(12), dtype="<i4")
        tokens = np.frombuffer(f.read(4 * int(n_chunk) * int(n_ctx)), dtype="<i4")
    return int(n_ctx), [tokens[i * n_ctx : (i + 1) * n_ctx].tolist() for i in range(n_chunk)]


def llama_perplexity(gguf: Path, text_file: Path, ctx: int, chunks: int) -> dict[str, Any]:
    """llama.cpp's figure and the token chunks it scored."""
    with tempfile.TemporaryDirectory() as tmp:
        logits = Path(tmp) / "logits.bin"
        started = time.perf_counter()
        done = subprocess.run(
            [str(BIN_DIR / "llama-perplexity"), "-m", str(gguf), "-f", str(text_file)]
            + ["-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t", "2"]
            + ["--kl-divergence-base", str(logits)],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - started
        match = PPL_LINE.search(done.stdout + done.stderr)
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"llama-perplexity failed:\n{(done.stdout + done.stderr)[-3000:]}")
        n_ctx, token_chunks = read_logits_tokens(logits)
    assert n_ctx == ctx, f"llama-perplexity ran with n_ctx {n_ctx}, asked {ctx}"
    return {
        "ppl": float(match.group(1)),
        "ppl_error": float(match.group(2)),
        "seconds": seconds,
        "chunks": token_chunks,
    }


def quire_nll(llm: LLM, chunks: list[list[int]], bos: int | None) -> tuple[float, int]:
    """Summed NLL of each chunk's tokens ctx/2 + 1 .. ctx - 1, and how many, by Quire."""
    prompts = [{"prompt_token_ids": ([bos] + c[1:]) if bos is not None else c} for c in chunks]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=True)
    nll, count = 0.0, 0
    for chunk, out in zip(chunks, outputs, strict=True):
        assert out.prompt_logprobs is not None
        first = len(chunk) // 2
        for pos in range(first + 1, len(chunk)):
            entry = out.prompt_logprobs[pos]
            assert entry is not None
            nll -= entry[chunk[pos]].logprob
            count += 1
    return nll, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=gguf_path("q4_1"))
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    text_file = args.out / "perplexity.txt"
    text_file.write_text(sharegpt_text(sharegpt.DEFAULT_PATH, args.conversations))
    llama = llama_perplexity(args.gguf, text_file, args.ctx, args.chunks)
    chunks = llama.pop("chunks")
    llm = LLM(model=str(args.gguf), dtype=args.dtype, max_num_batched_tokens=args.ctx)
    tokenizer = llm.engine.tokenizer
    adds_bos = bool(getattr(tokenizer, "add_bos_token", False))
    bos = tokenizer.bos_token_id if adds_bos else None
    started = time.perf_counter()
    nll, count = quire_nll(llm, chunks, bos)
    quire = {"ppl": math.exp(nll / count), "seconds": time.perf_counter() - started}
    result = {
        "gguf": str(args.gguf),
        "ctx": args.ctx,
        "num_chunks": len(chunks),
        "num_scored_tokens": count,
        "dtype": args.dtype,
        "bos": bos,
        "llama_cpp": llama,
        "quire": quire,
        "ratio": quire["ppl"] / llama["ppl"],
    }
    (args.out / "perplexity.json").write_text(json.dumps(result, indent=2))
    print(
        f"PPL over {len(chunks)} chunks of {args.ctx} ({count} tokens scored): "
        f"llama.cpp {llama['ppl']:.4f} +/- {llama['ppl_error']:.4f}, Quire {quire['ppl']:.4f}, "
        f"Quire / llama.cpp {result['ratio']:.4f}"
    )


if __name__ == "__main__":
    main()
