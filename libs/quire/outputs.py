"""What generate() returns: RequestOutput holding one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Logprob:
    """Log-probability of one token under the model's (unprocessed) distribution."""

    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One generated sequence of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # One dict per generated token: token id -> Logprob (top-k plus the sampled token).
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that matched

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state after a step (streaming) or at the end (generate)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # One entry per prompt token when prompt_logprobs was asked for: None for the first,
    # then token id -> Logprob (top-k plus the prompt token), as vLLM returns them.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


# --- what the engine core emits each step: deltas, never whole lists --------------------------


@dataclass(frozen=True, slots=True)
class SequenceDelta:
    """What one output sequence gained in one engine step.

    The engine core stops a sequence on EOS, a stop token id or a length limit; text and stop
    strings are the output processor's (`quire.engine.output_processor`).
    """

    index: int
    new_token_ids: list[int]
    # One dict per new token when logprobs were asked for: token id -> Logprob (the top-k,
    # then the sampled token if it was not among them).
    new_logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0  # of all the sequence's output tokens so far
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | None = None  # the stop token id that matched


@dataclass(frozen=True, slots=True)
class RequestDelta:
    """One request's progress in one engine step: only the sequences that advanced."""

    request_id: str
    outputs: list[SequenceDelta]
    finished: bool  # every output sequence has finished
    num_prompt_tokens: int
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # Prompt tokens 1.. (token 0 has none), once, on the request's first delta after they
    # are all computed; None otherwise or when not asked for.
    prompt_logprobs: list[dict[int, Logprob]] | None = None
