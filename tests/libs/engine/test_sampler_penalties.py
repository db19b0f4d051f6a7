"""Presence and frequency penalties as OpenAI and vLLM define them, checked at their edges.

logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0), where count(t)
is how often t occurs in the output so far (prompt tokens are not counted). Each case puts a
penalized token just above or just below a rival, so the greedy choice flips exactly when the
formula says it does: a sampler that ignored a penalty, counted the prompt, or applied one
penalty per occurrence where the other is once per token would choose the other token.
"""

from __future__ import annotations

import pytest
import torch

from quire.engine.sampler import SampleRow, sample
from quire.sampling_params import SamplingParams

# Token 1 leads token 2 by 0.5; the rest are far behind.
LOGITS = [0.0, 3.0, 2.5, 1.0, 0.0]
PROMPT = [4, 4, 3]


def greedy(output: list[int], prompt: list[int] = PROMPT, **penalties: float) -> int:
    params = SamplingParams(temperature=0, max_tokens=8, **penalties)
    row = SampleRow(params, prompt + output, len(prompt), None)
    return sample(torch.tensor([LOGITS]), [row])[0].token_id


@pytest.mark.parametrize(
    ("output", "penalties", "chosen"),
    [
        ([], {"frequency_penalty": 2.0, "presence_penalty": 2.0}, 1),  # nothing generated yet
        ([1, 1], {"frequency_penalty": 0.2}, 1),  # 3.0 - 2 * 0.2 = 2.6 > 2.5
        ([1, 1], {"frequency_penalty": 0.3}, 2),  # 3.0 - 2 * 0.3 = 2.4 < 2.5
        ([1, 1, 1], {"presence_penalty": 0.4}, 1),  # once, however often: 2.6
        ([1, 1, 1], {"presence_penalty": 0.6}, 2),  # 2.4
        # Both said, 1 twice and 2 once: presence costs both the same, so only the frequency
        # gap (one occurrence) can close their 0.5 lead.
        ([1, 1, 2], {"frequency_penalty": 0.45, "presence_penalty": 0.5}, 1),  # 1.6 vs 1.55
        ([1, 1, 2], {"frequency_penalty": 0.55, "presence_penalty": 0.5}, 2),  # 1.4 vs 1.45
        ([2], {"frequency_penalty": -0.6}, 2),  # a negative penalty favours what was said
    ],
)
def test_penalties_follow_the_formula(
    output: list[int], penalties: dict[str, float], chosen: int
) -> None:
    assert greedy(output, **penalties) == chosen


def test_prompt_tokens_are_not_penalized() -> None:
    prompt = [1, 1, 1, 1]
    assert greedy([], prompt=prompt, frequency_penalty=2.0, presence_penalty=2.0) == 1
    # The same tokens as output are penalized.
    assert greedy([1, 1, 1, 1], prompt=[], frequency_penalty=2.0, presence_penalty=2.0) == 2


def test_the_logprob_is_of_the_unpenalized_distribution() -> None:
    params = SamplingParams(temperature=0, max_tokens=8, frequency_penalty=2.0, logprobs=1)
    row = SampleRow(params, [1, 1], 0, None)
    result = sample(torch.tensor([LOGITS]), [row])[0]
    assert result.token_id == 2
    expected = torch.log_softmax(torch.tensor(LOGITS), dim=-1)[2].item()
    assert result.logprob == pytest.approx(expected)
