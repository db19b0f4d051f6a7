"""transformers in bfloat16 / float16 as the outside reference for Quire at the same dtype.

Two half-precision implementations of one float32 function cannot agree token for token: each
rounds different intermediate values, so wherever the two best logits are closer than their
rounding error, either choice is right. The reference is therefore scored on Quire's own text
(prompt + Quire's greedy tokens, one forward pass, so a near-tie early does not end the
comparison), and carries for every position how far its half-precision logits lie from the same
model's float32 logits on the same tokens (`rounding`: the largest |logit_half - logit_f32| over
the vocabulary). Every tolerance is stated in those units:

- Let t be the float32 logits, r the reference's and q Quire's, with |r - t| <= d (measured)
  and Quire no less accurate, |q - t| <= d. A log-softmax moves by at most twice its inputs'
  largest change (the normalizer moves by at most that change), so |lp_q - lp_r| <= 4 d; and
  the gap between two tokens' logits can differ by at most 4 d between r and q, so Quire's
  greedy token may differ from the reference's argmax only where the reference ranks it within
  4 d of its best.
- Those bounds assume Quire is as accurate as the reference; `Agreement.assert_as_accurate`
  checks the assumption over a whole run: the mean |lp_q - lp_t| over every compared position
  must not exceed the reference's own mean |lp_r - lp_t| by more than `ACCURACY_ALLOWANCE`
  (the two round different operations; measured within a few percent of each other, see
  docs/testing.md). A kernel that rounds wrongly moves Quire away from float32 and fails there
  even where each position stays inside its bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

# Quire's mean log-probability error against float32 may exceed the reference's by this factor.
ACCURACY_ALLOWANCE = 1.25
# The per-position bound in units of the reference's rounding `d` (see the module docstring).
BOUND = 4.0


@dataclass
class Scored:
    """The reference's view of one text: position i predicts token i + 1."""

    token_ids: list[int]  # prompt + Quire's generated tokens
    logits: torch.Tensor  # [positions, vocab] half-precision logits, as float32
    logprobs: torch.Tensor  # [positions, vocab] their log-softmax
    logprobs_f32: torch.Tensor  # [positions, vocab] the float32 model's log-softmax
    rounding: torch.Tensor  # [positions] max |logit_half - logit_f32| over the vocabulary


class HalfPrecisionOracle:
    """transformers at `dtype` and at float32 on the same checkpoint."""

    def __init__(self, path: Path, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        self.model_f32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    @torch.inference_mode()
    def score(self, token_ids: list[int]) -> Scored:
        ids = torch.tensor([token_ids])
        logits = self.model(ids).logits[0].float()
        logits_f32 = self.model_f32(ids).logits[0].float()
        return Scored(
            token_ids=token_ids,
            logits=logits,
            logprobs=torch.log_softmax(logits, -1),
            logprobs_f32=torch.log_softmax(logits_f32, -1),
            rounding=(logits - logits_f32).abs().amax(-1),
        )


@dataclass
class Agreement:
    """Figures over every request compared (its summary is the test's report)."""

    label: str
    num_identical: int = 0  # greedy tokens equal to the reference's argmax on the same text
    num_generated: int = 0
    max_logprob_gap: float = 0.0  # largest |lp_quire - lp_reference| over compared positions
    error_quire: list[float] = field(default_factory=list)  # |lp_quire - lp_f32| per position
    error_reference: list[float] = field(default_factory=list)  # |lp_reference - lp_f32|

    def check(
        self,
        oracle: HalfPrecisionOracle,
        prompt: list[int],
        token_ids: list[int],
        sample_logprobs: list[float],
        prompt_logprobs: list[float] | None = None,
    ) -> None:
        """One greedy request: `sample_logprobs[j]` is Quire's logprob of `token_ids[j]`,
        `prompt_logprobs[i]` its logprob of prompt token i + 1."""
        what = f"{self.label}, prompt of {len(prompt)}"
        ref = oracle.score(prompt + token_ids)
        positions = [
            (len(prompt) - 1 + j, t, lp)
            for j, (t, lp) in enumerate(zip(token_ids, sample_logprobs, strict=True))
        ]
        for pos, token, _ in positions:
            bound = BOUND * float(ref.rounding[pos])
            best = int(ref.logits[pos].argmax())
            behind = float(ref.logits[pos, best] - ref.logits[pos, token])
            assert behind <= bound, (
                f"{what}: greedy token {pos - len(prompt) + 1} is {token}, which the reference "
                f"ranks {behind:.4f} below its choice {best}, past {BOUND:g} x its rounding "
                f"({bound:.4f})"
            )
            self.num_identical += token == best
        self.num_generated += len(token_ids)
        if prompt_logprobs is not None:
            assert len(prompt_logprobs) == len(prompt) - 1, what
            positions += [(i, prompt[i + 1], lp) for i, lp in enumerate(prompt_logprobs)]
        for pos, token, got in positions:
            want = float(ref.logprobs[pos, token])
            bound = BOUND * float(ref.rounding[pos])
            assert abs(got - want) <= bound, (
                f"{what}: logprob of token {token} at position {pos} is {got:.4f}, "
                f"the reference's {want:.4f} (bound {bound:.4f})"
            )
            self.max_logprob_gap = max(self.max_logprob_gap, abs(got - want))
            f32 = float(ref.logprobs_f32[pos, token])
            self.error_quire.append(abs(got - f32))
            self.error_reference.append(abs(want - f32))

    def means(self) -> tuple[float, float]:
        """Mean |logprob - float32| of Quire and of the reference over compared positions."""
        assert self.error_quire, f"{self.label}: nothing was compared"
        n = len(self.error_quire)
        return sum(self.error_quire) / n, sum(self.error_reference) / n

    def summary(self) -> str:
        mean_q, mean_r = self.means()
        return (
            f"{self.label}: {self.num_identical}/{self.num_generated} greedy tokens the "
            f"reference's argmax, largest logprob gap {self.max_logprob_gap:.4f}; mean "
            f"|logprob - float32| Quire {mean_q:.4f}, reference {mean_r:.4f} over "
            f"{len(self.error_quire)} positions"
        )

    def assert_as_accurate(self) -> None:
        """Quire at this dtype is as close to float32 as transformers at this dtype."""
        mean_q, mean_r = self.means()
        assert mean_q <= ACCURACY_ALLOWANCE * mean_r, self.summary()
