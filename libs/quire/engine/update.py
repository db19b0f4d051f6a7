"""The step's last part: apply a `ModelRunnerOutput` to the sequences, emit per-step deltas.

In order: every scheduled chunk's tokens count as computed (and are committed to the
allocator), prompt logprobs computed this step join their request's, n>1 requests fork on their first token, each sampled token is appended, and a
sequence stops on EOS, one of its stop token ids or a length limit. Stop strings are not the
engine core's: the output processor owns text and ends a sequence through
`LLMEngine.finish_sequences`.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.engine.model_runner import ModelRunnerOutput, SampledToken
from quire.engine.scheduler import Scheduler, SchedulerOutput
from quire.engine.sequence import Request, Sequence
from quire.outputs import RequestDelta, SequenceDelta


@dataclass(frozen=True)
class StopRules:
    """When the engine core ends a sequence by itself."""

    eos_token_ids: frozenset[int]
    max_model_len: int  # prompt + output tokens


def update_from_output(
    scheduler: Scheduler, step: SchedulerOutput, output: ModelRunnerOutput, rules: StopRules
) -> list[RequestDelta]:
    """Advance, fork, append and stop; the deltas of every request that produced a token.

    A sequence that ran drafts emits its kept drafts and the token sampled after them (the
    model runner's verdict): each kept draft counts as computed once appended, its rejected
    drafts' slots are written again later, and tokens after one that stops it are dropped.
    """
    kept = output.num_kept_drafts
    for s in step.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens - len(s.draft_token_ids)
        if s.draft_token_ids:
            s.seq.draft_stats.record(len(s.draft_token_ids), kept[s.seq.seq_id])
        else:
            scheduler.commit(s.seq)
    for chunk in output.prompt_logprobs:
        if chunk.start == len(chunk.request.prompt_logprobs):
            chunk.request.prompt_logprobs.extend(chunk.logprobs)
    # Children copy their parent's tokens before the parent's first output is appended.
    targets = [_fork(scheduler, t) if t.index != t.seq.index else t.seq for t in output.sampled]
    touched: dict[str, tuple[Request, dict[int, SequenceDelta]]] = {}
    for seq, token in zip(targets, output.sampled, strict=True):
        deltas = touched.setdefault(seq.request.request_id, (seq.request, {}))[1]
        earlier = deltas.get(seq.index)
        if earlier is not None and earlier.finish_reason is not None:
            continue  # a kept draft or its next token, after one that stopped it
        if seq.seq_id in kept and seq.num_computed_tokens < seq.num_tokens:
            seq.num_computed_tokens += 1  # the token before this one was a kept draft
        delta = _append(scheduler, seq, token, rules)
        deltas[seq.index] = delta if earlier is None else _joined(earlier, delta)
    for s in step.scheduled:
        if s.draft_token_ids:  # its kept drafts are computed now
            scheduler.commit(s.seq)
    return [request_delta(request, list(deltas.values())) for request, deltas in touched.values()]


def _joined(earlier: SequenceDelta, later: SequenceDelta) -> SequenceDelta:
    """One sequence's two deltas of one step as one (tokens in order, the later's state)."""
    logprobs = None
    if earlier.new_logprobs is not None and later.new_logprobs is not None:
        logprobs = earlier.new_logprobs + later.new_logprobs
    return SequenceDelta(
        index=later.index,
        new_token_ids=earlier.new_token_ids + later.new_token_ids,
        new_logprobs=logprobs,
        cumulative_logprob=later.cumulative_logprob,
        finish_reason=later.finish_reason,
        stop_reason=later.stop_reason,
    )


def request_delta(request: Request, deltas: list[SequenceDelta]) -> RequestDelta:
    """The request's delta; its prompt logprobs ride on the first one after they are done."""
    prompt_logprobs = None
    if (
        request.params.prompt_logprobs is not None
        and not request.prompt_logprobs_sent
        and not request.needs_prompt_logprobs
    ):
        prompt_logprobs = list(request.prompt_logprobs)
        request.prompt_logprobs_sent = True
    return RequestDelta(
        request_id=request.request_id,
        outputs=deltas,
        finished=request.is_finished(),
        num_prompt_tokens=len(request.prompt_token_ids),
        num_cached_tokens=request.num_cached_tokens,
        prompt_logprobs=prompt_logprobs,
    )


def finished_delta(seq: Sequence) -> SequenceDelta:
    """A sequence that ended outside a forward pass (no new token)."""
    return SequenceDelta(
        index=seq.index,
        new_token_ids=[],
        cumulative_logprob=seq.cumulative_logprob,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
    )


def _fork(scheduler: Scheduler, token: SampledToken) -> Sequence:
    parent, request = token.seq, token.seq.request
    child = Sequence(
        seq_id=f"{request.request_id}#{token.index}",
        request=request,
        index=token.index,
        token_ids=list(parent.token_ids),
        arrival=request.arrival,
    )
    request.seqs.append(child)
    scheduler.add_fork(parent, child)
    return child


def _append(
    scheduler: Scheduler, seq: Sequence, token: SampledToken, rules: StopRules
) -> SequenceDelta:
    token_id = token.token_id
    seq.token_ids.append(token_id)
    seq.cumulative_logprob += token.logprob
    params = seq.request.params
    if not params.ignore_eos and token_id in rules.eos_token_ids:
        seq.finish_reason = "stop"
    elif token_id in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token_id
    elif token.ends_grammar:
        seq.finish_reason = "stop"
    elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= rules.max_model_len:
        seq.finish_reason = "length"
    if seq.finish_reason is not None:
        scheduler.finish(seq)
    return SequenceDelta(
        index=seq.index,
        new_token_ids=[token_id],
        new_logprobs=None if token.top_logprobs is None else [token.top_logprobs],
        cumulative_logprob=seq.cumulative_logprob,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
    )
