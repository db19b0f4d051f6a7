"""The perplexity benchmark's Quire side: llama-perplexity's logits-file header read back, and
the chunks' negative log-likelihood equal to transformers' on the same checkpoint."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.gguf_perplexity import quire_nll, read_logits_tokens
from quire import LLM

TINY = Path(__file__).resolve().parents[2] / "models" / "quire-tiny"


def test_logits_file_tokens_are_read_in_chunks(tmp_path: Path) -> None:
    tokens = list(range(100, 112))
    path = tmp_path / "logits.bin"
    path.write_bytes(
        b"_logits_" + struct.pack("<3i", 4, 49152, 3) + struct.pack("<12i", *tokens) + b"\0" * 64
    )
    assert read_logits_tokens(path) == (4, [tokens[0:4], tokens[4:8], tokens[8:12]])


def test_chunk_nll_is_transformers_second_half_nll() -> None:
    rng = random.Random(2)
    llm = LLM(model=str(TINY), dtype="float32")
    vocab = llm.engine.model.config.vocab_size
    chunks = [[rng.randrange(3, vocab) for _ in range(64)] for _ in range(3)]
    nll, count = quire_nll(llm, chunks, bos=1)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    expected = 0.0
    with torch.inference_mode():
        for chunk in chunks:
            ids = torch.tensor([[1] + chunk[1:]])  # the chunk's first token replaced by BOS
            logprobs = model(ids).logits[0].float().log_softmax(-1)
            for pos in range(33, 64):  # tokens ctx/2 + 1 .. ctx - 1, each given those before
                expected -= float(logprobs[pos - 1, ids[0, pos]])
    assert count == 3 * 31
    assert abs(nll - expected) <= 1e-3 * abs(expected)
