"""Continuing a request's outputs on another executor when theirs is lost mid-stream.

A `Leg` is one executor stream of a prompt: the request's first call, which carries all n of
its outputs, or a continuation, which carries one. When a leg raises `ExecutorLost`
(services/router/executor_lost.py), `Migrations.continue_outputs` opens one continuation per
output of that leg that has not finished, each on its own (n > 1 outputs migrate
independently, each keeping its output index and so its seeded draws). The outputs' text,
stop strings, logprobs and tool-call state stay where they always were, in the router's
`SequenceText`s and the route's shape: a continuation only sends more tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from quire.engine.output_processor import SequenceText
from services.router.dispatch import Dispatcher, ExecutorStream, open_all
from services.router.errors import ApiError
from services.router.executor_lost import ExecutorLost
from services.rpc import executor_pb2

log = structlog.get_logger("router.migration")


@dataclass(eq=False)  # hashed by identity: the generation keys its pumps by leg
class Leg:
    """One executor stream of prompt `run_index`, and the outputs it carries."""

    run_index: int
    stream: ExecutorStream
    indices: tuple[int, ...]  # output indices among the prompt's n
    # Outputs its (prefill) executor ran to their first token and handed on (HANDOFF).
    handed_off: set[int] = field(default_factory=set)

    @property
    def is_continuation(self) -> bool:
        return self.stream.continuation is not None


class Migrations:
    """The migrations of one HTTP request: at most `dispatcher.max_migrations` lost streams."""

    def __init__(
        self, dispatcher: Dispatcher, params: executor_pb2.SamplingParams, arrival: float
    ) -> None:
        self.dispatcher = dispatcher
        self.params = params  # the request's, unchanged: continuations sample the same way
        self.arrival = arrival
        self.num_migrations = 0

    async def continue_outputs(
        self,
        lost: ExecutorLost,
        request_id: str,
        prompt_ids: list[int],
        outputs: Mapping[int, SequenceText],
    ) -> list[ExecutorStream]:
        """One continuation stream per output in `outputs` (index -> its text so far): the
        unfinished outputs of the lost stream of executor request `request_id` (the prompt's
        first); `ApiError` (the client's error event) when the
        request has no migration left or no executor takes a continuation."""
        metrics = self.dispatcher.metrics.migrations
        if self.num_migrations >= self.dispatcher.max_migrations:
            metrics.labels(outcome="exhausted").inc()
            log.warning(
                "executor lost; no migration left",
                executor_id=lost.executor_id,
                reason=lost.reason,
                num_migrations=self.num_migrations,
            )
            raise lost.api_error() from lost
        self.num_migrations += 1
        try:
            streams = await self._continue(
                f"{request_id}~m{self.num_migrations}", prompt_ids, outputs, (lost.executor_id,)
            )
        except ApiError as error:
            metrics.labels(outcome="failed").inc()
            log.warning(
                "executor lost; no executor took the continuation",
                executor_id=lost.executor_id,
                reason=lost.reason,
                error=error.message,
            )
            raise
        metrics.labels(outcome="continued").inc()
        log.info(
            "executor lost; outputs continued elsewhere",
            executor_id=lost.executor_id,
            reason=lost.reason,
            outputs={i: len(o.token_ids) for i, o in outputs.items()},
            executors=[s.executor_id for s in streams],
            migration=self.num_migrations,
        )
        return streams

    async def hand_off(
        self, request_id: str, prompt_ids: list[int], outputs: Mapping[int, SequenceText]
    ) -> list[ExecutorStream]:
        """One continuation stream per output a prefill executor handed on (index -> its text
        so far), on decode executors; not a migration (the request's bound is untouched).
        `ApiError` when no executor takes one."""
        metrics = self.dispatcher.metrics.handoffs
        try:
            streams = await self._continue(f"{request_id}~h", prompt_ids, outputs, ())
        except ApiError:
            metrics.labels(outcome="failed").inc(len(outputs))
            raise
        metrics.labels(outcome="continued").inc(len(outputs))
        return streams

    async def _continue(
        self,
        request_id: str,
        prompt_ids: list[int],
        outputs: Mapping[int, SequenceText],
        avoid: tuple[str, ...],
    ) -> list[ExecutorStream]:
        return await open_all(
            self.dispatcher.open(
                f"{request_id}.{index}",
                prompt_ids,
                self.params,
                self.arrival,
                executor_pb2.Continuation(
                    output_index=index,
                    token_ids=output.token_ids,
                    cumulative_logprob=output.cumulative_logprob,
                ),
                avoid=avoid,
            )
            for index, output in outputs.items()
        )
