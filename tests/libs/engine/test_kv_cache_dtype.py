"""A KV cache narrower than the model (EngineConfig.kv_cache_dtype): blocks in bfloat16 or
float16 under a float32 model hold twice the tokens in the same budget, every attention layout
(grouped heads, windows, sinks, MLA's latent) runs on them, and the logprobs
stay within the narrow dtype's rounding of a float32 cache's; on GGUF weights the fused C++
layers give the Python path's bits with a narrow cache too."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from quire_tools import gguf_write

from quire import LLM, SamplingParams
from quire.cache.paged_kv import kv_bytes_per_block
from quire.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from quire.engine.loading import num_kv_blocks
from tests.checkpoints import tiny_checkpoint

# Largest |logprob difference| against a float32 cache, over every prompt position and the
# greedy steps both runs share: a few units of each dtype's rounding (bfloat16 keeps 8
# significant bits, float16 11) through a few layers of a random model.
TOLERANCE = {"bfloat16": 0.3, "float16": 0.04}


Run = list[tuple[list[float], list[int], list[float]]]


def logprobs(path: Path, kv_cache_dtype: str) -> tuple[LLM, Run]:
    """Per prompt under `kv_cache_dtype`: its tokens' prompt logprobs, its greedy tokens and
    their logprobs."""
    llm = LLM(
        model=str(path),
        dtype="float32",
        kv_cache_dtype=kv_cache_dtype,
        max_num_batched_tokens=24,  # the longer prompts are chunked beside the others' decodes
    )
    rng = random.Random(5)
    vocab = llm.engine.model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (3, 16, 17, 40)]
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0, prompt_logprobs=0
    )
    run = []
    for prompt, out in zip(
        prompts,
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False),
        strict=True,
    ):
        choice = out.outputs[0]
        assert out.prompt_logprobs is not None and choice.logprobs is not None
        prompt_values = [
            step[token].logprob
            for token, step in zip(prompt[1:], out.prompt_logprobs[1:], strict=True)
            if step is not None
        ]
        tokens = list(choice.token_ids)
        values = [step[t].logprob for t, step in zip(tokens, choice.logprobs, strict=True)]
        run.append((prompt_values, tokens, values))
    return llm, run


def largest_difference(a: Run, b: Run) -> float:
    """Over every prompt position, and the greedy steps before the two runs' tokens part."""
    differences = []
    for (prompt_a, tokens_a, values_a), (prompt_b, tokens_b, values_b) in zip(a, b, strict=True):
        assert len(prompt_a) == len(prompt_b) > 0
        differences += [abs(x - y) for x, y in zip(prompt_a, prompt_b, strict=True)]
        for ta, tb, x, y in zip(tokens_a, tokens_b, values_a, values_b, strict=True):
            if ta != tb:
                break
            differences.append(abs(x - y))
    return max(differences)


@functools.cache
def float32_run(path: Path) -> Run:
    return logprobs(path, "float32")[1]


@pytest.mark.parametrize(
    ("name", "kv_cache_dtype"),
    [
        ("tiny", "bfloat16"),  # grouped heads
        ("tiny", "float16"),
        ("tiny-gpt-oss", "bfloat16"),  # attention sinks and sliding windows
        ("tiny-deepseek-v2", "bfloat16"),  # MLA's latent cache
    ],
)
def test_a_narrow_cache_stays_within_its_rounding(
    model_zoo: dict[str, Path], name: str, kv_cache_dtype: str
) -> None:
    path = model_zoo[name]
    wide = float32_run(path)
    llm, narrow = logprobs(path, kv_cache_dtype)
    planes = [plane for layer in llm.engine.runner.kv.layers for plane in layer]
    assert {plane.dtype for plane in planes} == {getattr(torch, kv_cache_dtype)}
    difference = largest_difference(wide, narrow)
    assert 0 < difference < TOLERANCE[kv_cache_dtype], difference


def test_auto_is_the_model_s_dtype_and_the_budget_holds_twice_the_blocks(
    model_zoo: dict[str, Path],
) -> None:
    path = model_zoo["tiny"]
    wide = LLM(model=str(path), dtype="float32").engine
    assert wide.kv_dtype == torch.float32 and wide.runner.kv.dtype == torch.float32
    config = EngineConfig(model=str(path), dtype="float32", max_num_seqs=4096)
    narrow = EngineConfig(
        model=str(path), dtype="float32", kv_cache_dtype="bfloat16", max_num_seqs=4096
    )
    assert narrow.resolve_kv_cache_dtype(torch.float32) == torch.bfloat16
    assert config.resolve_kv_cache_dtype(torch.float32) == torch.float32
    loaded = wide_loaded(wide)
    model_config = wide.model.config
    assert num_kv_blocks(config, loaded) == DEFAULT_CPU_KV_CACHE_BYTES // kv_bytes_per_block(
        model_config, 16, torch.float32
    )
    assert num_kv_blocks(narrow, loaded) == DEFAULT_CPU_KV_CACHE_BYTES // kv_bytes_per_block(
        model_config, 16, torch.bfloat16
    )
    assert kv_bytes_per_block(model_config, 16, torch.bfloat16) * 2 == kv_bytes_per_block(
        model_config, 16, torch.float32
    )


def wide_loaded(engine: Any) -> Any:
    from quire.engine.loading import LoadedModel

    return LoadedModel(
        Path(engine.config.model),
        engine.device,
        engine.dtype,
        engine.model,
        engine.tokenizer,
        1 << 20,  # long enough that the budget, not max_num_seqs' lengths, caps the pool
        frozenset(),
    )


@pytest.mark.parametrize(
    ("activations", "kv_cache_dtype"), [("int8", "bfloat16"), ("float32", "float16")]
)
def test_fused_layers_give_the_python_path_s_bits_on_a_narrow_cache(
    tmp_path: Path, activations: str, kv_cache_dtype: str
) -> None:
    gguf = gguf_write.write_gguf(tiny_checkpoint(), tmp_path / "tiny.Q8_0.gguf", "Q8_0")
    runs = []
    for fused in (True, False):
        llm = LLM(
            model=str(gguf),
            dtype="float32",
            kv_cache_dtype=kv_cache_dtype,
            quantized_activations=activations,
            max_num_batched_tokens=24,
        )
        model: Any = llm.engine.model
        assert model.fused_layers is not None, "every layer qualifies"
        if not fused:
            model.fused_layers = None
        rng = random.Random(11)
        prompts = [[rng.randrange(3, 200) for _ in range(n)] for n in (1, 16, 17, 40)]
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        runs.append(
            [
                (
                    list(o.outputs[0].token_ids),
                    [{t: lp.logprob for t, lp in s.items()} for s in o.outputs[0].logprobs or []],
                )
                for o in outputs
            ]
        )
    assert runs[0] == runs[1]


def test_an_unknown_kv_cache_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto, float32, bfloat16, float16"):
        EngineConfig(model="m", kv_cache_dtype="fp8")
