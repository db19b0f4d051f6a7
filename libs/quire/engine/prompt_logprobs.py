"""Prompt logprobs (vLLM's `prompt_logprobs`): the model's log-probability of every prompt
token given the tokens before it, with the top-k alternatives.

Normally the runner computes logits only at the last scheduled position of a sequence whose
chunk reaches its end. A request that asks for prompt logprobs also gets logits at every
prompt position its chunk covers: position p scores prompt token p + 1, so positions
0 .. num_prompt_tokens - 2 are needed (token 0 has no logprob: None in the API). Chunked
prefill fills them chunk by chunk, in order. Such a request reads nothing from the prefix
cache (`AdmitRequest.skip_prefix_cache`, as vLLM skips reading it): a cached prefix has KV but
no logits, so its tokens are computed again; its blocks are still registered for others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quire.engine.scheduler import ScheduledSeq
from quire.engine.sequence import Request
from quire.outputs import Logprob

# Hidden rows turned into logits at once: bounds the [rows, vocab] float32 temporaries.
LOGITS_SLICE_ROWS = 512


@dataclass(frozen=True, slots=True)
class PromptSpan:
    """Prompt positions [start, end) of one scheduled chunk whose logits score a prompt token."""

    request: Request
    start: int  # first position; also the index in `request.prompt_logprobs` it fills
    end: int
    first_row: int  # the flattened batch row of position `start`

    @property
    def num_positions(self) -> int:
        return self.end - self.start

    @property
    def target_token_ids(self) -> list[int]:
        """The prompt tokens these positions score (positions + 1)."""
        return self.request.prompt_token_ids[self.start + 1 : self.end + 1]


@dataclass(frozen=True, slots=True)
class PromptLogprobsChunk:
    """What one step computed for a request: entries `start ..` of its prompt logprobs."""

    request: Request
    start: int
    logprobs: list[dict[int, Logprob]]


def prompt_span(s: ScheduledSeq, first_row: int) -> PromptSpan | None:
    """The positions of `s`'s chunk still missing a prompt logprob, or None.

    Only the next missing positions count: a chunk recomputed after a preemption adds
    nothing twice, and a chunk that starts past the missing ones (never, since such requests
    skip the prefix cache) adds nothing out of order.
    """
    request = s.seq.request
    if not request.needs_prompt_logprobs:
        return None
    done = len(request.prompt_logprobs)
    chunk_end = s.num_computed_tokens + s.num_new_tokens
    if s.num_computed_tokens > done:
        return None
    end = min(chunk_end, len(request.prompt_token_ids) - 1)
    if done >= end:
        return None
    return PromptSpan(request, done, end, first_row + done - s.num_computed_tokens)


def logprobs_of_targets(
    logits: torch.Tensor, target_token_ids: list[int], k: int
) -> list[dict[int, Logprob]]:
    """Per row of `logits` `[rows, vocab]`: the top-k, then the target if not among them.

    Logprobs are those of the raw distribution (no penalties, bias or temperature), ranks
    1-based as in vLLM.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(target_token_ids, dtype=torch.long, device=logits.device)
    chosen = logprobs.gather(1, targets.unsqueeze(1))  # [rows, 1]
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    chosen_list = chosen.squeeze(1).tolist()
    top_values: list[list[float]] = [[] for _ in target_token_ids]
    top_ids: list[list[int]] = [[] for _ in target_token_ids]
    if k > 0:
        values, ids = logprobs.topk(k, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    out = []
    for j, target in enumerate(target_token_ids):
        pairs = zip(top_values[j], top_ids[j], strict=True)
        entry = {t: Logprob(v, rank) for rank, (v, t) in enumerate(pairs, start=1)}
        entry.setdefault(target, Logprob(chosen_list[j], ranks[j]))
        out.append(entry)
    return out
