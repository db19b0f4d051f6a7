"""logit_bias and prompt_logprobs through the offline engine on quire-tiny."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quire import LLM, SamplingParams
from quire.engine.logits_processors import apply_logit_bias

PROMPT = list(range(5, 45))  # 40 tokens: two full 16-token blocks and a partial one


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return LLM(model=str(tiny_model), max_model_len=256)


@pytest.fixture(scope="module")
def reference_logprobs(tiny_model: Path) -> torch.Tensor:
    """log_softmax of one full forward pass of transformers over PROMPT: `[len, vocab]`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _greedy(llm: LLM, **kwargs: object) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **kwargs)  # type: ignore[arg-type]
    return (
        llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids
    )


def test_logit_bias_bans_and_forces_in_greedy(llm: LLM) -> None:
    plain = _greedy(llm)
    banned = plain[0]
    unbanned = _greedy(llm, logit_bias={banned: -100})
    assert banned not in unbanned
    forced = _greedy(llm, logit_bias={7: 100})
    assert forced == [7] * 6 and plain != forced


def test_logit_bias_is_one_scatter_and_leaves_unbiased_rows_alone() -> None:
    logits = torch.zeros(3, 8)
    assert apply_logit_bias(logits, [None, None, None]) is logits
    out = apply_logit_bias(logits, [{1: 2.0, 3: -1.5}, None, {0: 100}])
    expected = torch.zeros(3, 8)
    expected[0, 1], expected[0, 3], expected[2, 0] = 2.0, -1.5, 100.0
    assert torch.equal(out, expected) and torch.equal(logits, torch.zeros(3, 8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": {1: float("nan")}}, "logit_bias"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_logit_bias_outside_the_vocab_is_refused_before_queueing(llm: LLM) -> None:
    with pytest.raises(ValueError, match="logit_bias token id 4096 is outside"):
        llm.engine.add_request(
            "x", {"prompt_token_ids": PROMPT}, SamplingParams(logit_bias={4096: 1})
        )
    assert not llm.engine.has_unfinished_requests()


def _check_prompt_logprobs(got: list[dict | None] | None, reference: torch.Tensor, k: int) -> None:
    assert got is not None and len(got) == len(PROMPT) and got[0] is None
    for position, entry in enumerate(got[1:]):
        assert entry is not None
        token = PROMPT[position + 1]
        row = reference[position]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        top = row.topk(k)
        by_rank = sorted(entry.items(), key=lambda item: item[1].rank)[:k]
        assert [t for t, _ in by_rank] == top.indices.tolist()
        for (_, lp), value in zip(by_rank, top.values.tolist(), strict=True):
            assert lp.logprob == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize(("prefix_caching", "chunk"), [(False, 2048), (True, 2048), (True, 12)])
def test_prompt_logprobs_equal_a_full_forward(
    tiny_model: Path, reference_logprobs: torch.Tensor, prefix_caching: bool, chunk: int
) -> None:
    engine = LLM(
        model=str(tiny_model),
        max_model_len=256,
        enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=chunk,
        dtype="float32",
    )
    prompt = {"prompt_token_ids": PROMPT}
    # Warm the prefix cache with the same prompt: the second request must not read it.
    warm = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3)
    out = engine.generate([prompt], params, use_tqdm=False)[0]
    _check_prompt_logprobs(out.prompt_logprobs, reference_logprobs, 3)
    assert out.num_cached_tokens == 0
    assert warm[0].prompt_logprobs is None
    # Outputs are unchanged by asking for prompt logprobs.
    assert out.outputs[0].token_ids[:2] == warm[0].outputs[0].token_ids
    if prefix_caching:
        again = engine.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False
        )
        assert again[0].num_cached_tokens == 32  # the blocks written above are still shared
