"""Batched sampling: penalties, logit bias, temperature, top-k/top-p/min-p, seeded draws, logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quire.engine.logits_processors import apply_logit_bias
from quire.outputs import Logprob
from quire.sampling_params import SamplingParams


@dataclass
class SampleRow:
    """One row of logits to sample from, and whose history penalties look at."""

    params: SamplingParams
    # The sequence's tokens, prompt first (not copied: only penalties slice it).
    token_ids: list[int]
    num_prompt_tokens: int
    # The output's seed (quire.engine.inputs.output_seeds); None: an unseeded draw.
    seed: int | None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


@dataclass
class SampleResult:
    token_id: int
    logprob: float  # of the sampled token under the unprocessed distribution
    top_logprobs: dict[int, Logprob] | None


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[SampleResult]:
    """Pick one token per row of `logits` `[num_rows, vocab]` (float32)."""
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    logits = _apply_penalties(logits, rows)
    logits = apply_logit_bias(logits, [r.params.logit_bias for r in rows])
    token_ids = logits.argmax(dim=-1)  # greedy rows keep this
    random_idx = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if random_idx:
        idx = torch.tensor(random_idx, device=logits.device)
        probs = _processed_probs(logits[idx], [rows[i] for i in random_idx])
        for j, i in enumerate(random_idx):
            token_ids[i] = _draw(probs[j], rows[i].seed, len(rows[i].token_ids))
    token_list = token_ids.tolist()
    chosen = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
    results = []
    for i, row in enumerate(rows):
        top = None
        if row.params.logprobs is not None:
            top = _top_logprobs(raw_logprobs[i], token_list[i], row.params.logprobs)
        results.append(SampleResult(token_list[i], chosen[i], top))
    return results


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    if not any(r.params.has_penalties for r in rows):
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        p = row.params
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(row.token_ids)),
                dtype=torch.long,
                device=logits.device,
            )
            vals = logits[i, seen]
            logits[i, seen] = torch.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
        output_token_ids = row.output_token_ids
        if output_token_ids and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(
                torch.tensor(output_token_ids, device=logits.device), minlength=vocab
            )[:vocab].to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return logits


def _processed_probs(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks; probabilities `[rows, vocab]`."""
    temps = torch.tensor([r.params.temperature for r in rows], device=logits.device)
    logits = logits / temps.unsqueeze(1)
    vocab = logits.shape[-1]
    top_ks = [r.params.top_k or vocab for r in rows]
    if any(k < vocab for k in top_ks):
        k = torch.tensor([min(k, vocab) for k in top_ks], device=logits.device)
        sorted_desc = logits.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    top_ps = torch.tensor([r.params.top_p for r in rows], device=logits.device)
    if bool((top_ps < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token once the mass before it already reaches top_p (keep at least one).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_ps.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    min_ps = torch.tensor([r.params.min_p for r in rows], device=logits.device)
    if bool((min_ps > 0).any()):
        threshold = probs.max(dim=-1, keepdim=True).values * min_ps.unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def draw_seed(seed: int, position: int) -> int:
    """The seed of one draw: the output's seed and the position of the token drawn (its
    index in prompt + output), mixed (SplitMix64's finalizer) so that neighbouring positions
    and outputs get unrelated streams."""
    x = (seed + 0x9E3779B97F4A7C15 * (position + 1)) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) >> 1  # a non-negative int64, as torch's manual_seed takes


def _draw(probs: torch.Tensor, seed: int | None, position: int) -> int:
    # probs: [vocab]; the generator lives on the CPU so seeds mean the same everywhere.
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(draw_seed(seed, position))
    return int(torch.multinomial(probs.cpu(), 1, generator=generator).item())


def _top_logprobs(logprobs: torch.Tensor, chosen: int, k: int) -> dict[int, Logprob]:
    """Top-k tokens plus the chosen one, with ranks under the unprocessed distribution."""
    out: dict[int, Logprob] = {}
    if k > 0:
        values, ids = logprobs.topk(k)
        for rank, (v, t) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), start=1):
            out[t] = Logprob(v, rank)
    if chosen not in out:
        value = logprobs[chosen]
        rank = int((logprobs > value).sum().item()) + 1
        out[chosen] = Logprob(float(value.item()), rank)
    return out
