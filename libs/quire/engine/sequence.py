"""Sequence and Request: the token-accounting state the scheduler moves around."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from quire.engine.ngram_drafts import DraftStats, NgramIndex
from quire.outputs import Logprob
from quire.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One output stream. `num_computed_tokens` catches up to `num_tokens`.

    Prefill, chunked prefill, prefix hits and decode differ only in how far
    `num_computed_tokens` lags behind `len(token_ids)`.
    """

    seq_id: str
    request: Request
    index: int  # position among the request's n outputs
    token_ids: list[int]
    arrival: int  # global FCFS order (ties broken by index)
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    num_allocated_tokens: int = 0  # tokens the block allocator already holds slots for
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | None = None  # the stop token id that ended it
    waiting_since: float = 0.0  # time.monotonic() when it last began to wait (scheduler's)
    # waited in a burst under shortest-first: every chunk of its prefill beside decoding
    # streams keeps the step within max_decode_stall (scheduler's)
    in_burst: bool = False
    # the scheduler's step count when it last began to wait, and the step that computed its
    # prompt's last token (its first output came out at that step's end; None before): which
    # decoding streams were already streaming when a burst arrived (scheduler's)
    arrived_step: int = 0
    first_token_step: int | None = None
    # chained hashes of its leading full blocks so far, and how many of them are in the
    # scheduler's RecentPrefixes (quire.engine.recent_prefixes)
    block_hashes: list[bytes] = field(default_factory=list)
    num_recorded_blocks: int = 0
    # n-gram speculation (scheduler's, quire.engine.ngram_drafts): its tokens' n-gram index,
    # built on its first draft, and how its drafts have fared
    ngrams: NgramIndex | None = None
    draft_stats: DraftStats = field(default_factory=DraftStats)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def priority(self) -> tuple[int, int]:
        return (self.arrival, self.index)

    @property
    def seed(self) -> int | None:
        return self.request.seeds[self.index]

    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass
class Request:
    """A prompt with its sampling params; owns 1..n sequences once sampling forks."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int
    seqs: list[Sequence] = field(default_factory=list)
    num_cached_tokens: int = 0
    was_scheduled: bool = False  # admitted to the pool at least once
    # One per output index, set at arrival (None for greedy): output i's draws are keyed on
    # (seeds[i], position), forked or not (quire.engine.sampler).
    seeds: list[int | None] = field(default_factory=list)
    # Prompt tokens 1.. their logprobs so far (params.prompt_logprobs set; token 0 has none).
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs_sent: bool = False  # already in a RequestDelta
    # Structured outputs only: each output index's grammar matcher (quire.engine.grammar_masks),
    # which has accepted exactly that output's tokens.
    grammar_matchers: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seeds:
            self.seeds = [None] * self.params.n

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some are still to be computed."""
        return (
            self.params.prompt_logprobs is not None
            and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1
        )

    def is_finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished() for s in self.seqs)
