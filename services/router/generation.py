"""One HTTP request's generation: an executor stream per prompt, merged into choices.

Choice `i * n + j` is output `j` of prompt `i` (OpenAI's numbering for a list of prompts).
`Generation.choice_updates()` is the one streaming loop chat and completions share: it says,
per executor response, what each choice has new to send. The routes only put that into their
own chunk shapes; this module knows nothing of either. A stream whose executor is lost
mid-way goes on through continuations on other executors (services/router/migration.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from quire.engine.output_processor import SequenceText
from quire.outputs import Logprob
from quire.sampling_params import SamplingParams
from services.common.wire.executor import HANDOFF, delta_from_proto, params_to_proto
from services.router.dispatch import Dispatcher, ExecutorStream, open_all
from services.router.executor_lost import ExecutorLost
from services.router.migration import Leg, Migrations
from services.rpc import executor_pb2

log = structlog.get_logger("router.generation")


@dataclass
class PromptRun:
    """One prompt's first executor stream and its n output sequences."""

    stream: ExecutorStream
    outputs: list[SequenceText]
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)
    # Prompt tokens 1.. (token 0 has none), once the executor sent them (prompt_logprobs).
    prompt_logprobs: list[dict[int, Logprob]] | None = None


@dataclass(frozen=True)
class PromptInfo:
    """A choice's prompt, for echo and prompt logprobs: sent with its first update."""

    token_ids: list[int]
    # One per token 1.. of the prompt when they were asked for (token 0 has none).
    logprobs: list[dict[int, Logprob]] | None


@dataclass(frozen=True)
class ChoiceUpdate:
    """What one choice has to send: new text and tokens while streaming, or all of it."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]  # one dict per token; [] when none were asked for
    text_offsets: list[int]  # where each token's text starts in the choice's text
    num_logprobs: int  # top alternatives asked for per token
    finish_reason: str | None  # set once, on the update that finishes the choice
    stop_reason: int | str | None
    prompt: PromptInfo | None = None  # on a choice's first update (and whole choices)

    @classmethod
    def whole(cls, index: int, output: SequenceText, prompt: PromptInfo) -> ChoiceUpdate:
        """The whole choice, for a response that is not streamed."""
        return cls(
            prompt=prompt,
            index=index,
            text=output.text,
            token_ids=output.token_ids,
            logprobs=output.logprobs or [],
            text_offsets=output.text_offsets,
            num_logprobs=output.num_logprobs,
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason,
        )


@dataclass(frozen=True)
class Usage:
    """Token counts of a whole request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Generation:
    """Merged progress of a request's prompts; iterate `updates()` once, then read state."""

    def __init__(
        self,
        runs: list[PromptRun],
        n: int,
        migrations: Migrations | None = None,
        log_outputs: bool = False,
    ) -> None:
        """`migrations` continues the outputs of a lost executor (None: never migrate)."""
        self.runs = runs
        self.n = n
        self.migrations = migrations
        self.log_outputs = log_outputs  # log every choice's text once the request ends
        self.choices: list[SequenceText] = [o for run in runs for o in run.outputs]
        # The streams still open: each prompt's first, then the continuations that replace
        # a lost one.
        self.legs = [Leg(i, run.stream, tuple(range(n))) for i, run in enumerate(runs)]
        self._finish_sent: set[int] = set()
        self._first_sent: set[int] = set()

    @property
    def executor_ids(self) -> str:
        """Executors that served the request, for the x-quire-executor header."""
        return ",".join(dict.fromkeys(run.stream.executor_id for run in self.runs))

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=sum(run.num_prompt_tokens for run in self.runs),
            completion_tokens=sum(len(o.token_ids) for o in self.choices),
            cached_tokens=sum(run.num_cached_tokens for run in self.runs),
        )

    def _apply(self, leg: Leg, response: executor_pb2.GenerateResponse) -> list[int]:
        run = self.runs[leg.run_index]
        if not leg.is_continuation:
            # A continuation's prompt was counted by the first stream; its cache hits cover
            # the output's tokens too. The usage is the uninterrupted request's.
            if response.num_prompt_tokens:
                run.num_prompt_tokens = response.num_prompt_tokens
            run.num_cached_tokens = max(run.num_cached_tokens, response.num_cached_tokens)
        request_delta = delta_from_proto(leg.stream.request_id, response)
        if request_delta.prompt_logprobs is not None and run.prompt_logprobs is None:
            run.prompt_logprobs = request_delta.prompt_logprobs
        base = leg.run_index * self.n
        touched = []
        stopped = []
        for delta in request_delta.outputs:
            if delta.index not in leg.indices:
                continue
            if delta.finish_reason == HANDOFF:
                leg.handed_off.add(delta.index)  # continued once this leg ends
                delta = replace(delta, finish_reason=None)
            if run.outputs[delta.index].add(delta):
                stopped.append(delta.index)
            touched.append(base + delta.index)
        if stopped and not response.finished:
            # A stop string matched here: the executor only stops on tokens and lengths.
            if all(run.outputs[j].is_finished for j in leg.indices):
                leg.stream.close()
            else:
                leg.stream.end_outputs(stopped)
        if response.finished:
            for j in leg.indices:
                if not run.outputs[j].is_finished and j not in leg.handed_off:
                    run.outputs[j].finish_reason = "stop"
                    touched.append(base + j)
        return sorted(set(touched))

    async def updates(self) -> AsyncIterator[list[int]]:
        """Indices of the choices that advanced, one list per executor response."""
        try:
            while self.legs:
                if len(self.legs) > 1:
                    async with contextlib.aclosing(self._merged_updates()) as merged:
                        async for touched in merged:
                            yield touched
                    break
                leg = self.legs[0]  # one stream: read it here, no task or queue
                try:
                    async for response in leg.stream.responses():
                        yield self._apply(leg, response)
                    self.legs.remove(leg)
                    await self._hand_off(leg)
                except ExecutorLost as lost:
                    await self._migrate(leg, lost)
            self._log_outputs()
        finally:
            self.close()

    async def _merged_updates(self) -> AsyncGenerator[list[int], None]:
        """`updates()` over several streams at once, each pumped by its own task."""
        queue: asyncio.Queue[tuple[Leg, Any]] = asyncio.Queue()
        done = object()

        async def pump(leg: Leg) -> None:
            try:
                async for response in leg.stream.responses():
                    await queue.put((leg, response))
                await queue.put((leg, done))
            except Exception as error:
                await queue.put((leg, error))

        tasks = {leg: asyncio.create_task(pump(leg)) for leg in self.legs}
        try:
            while self.legs:
                leg, item = await queue.get()
                if item is done:
                    self.legs.remove(leg)
                    for new in await self._hand_off(leg):
                        tasks[new] = asyncio.create_task(pump(new))
                elif isinstance(item, ExecutorLost):
                    for new in await self._migrate(leg, item):
                        tasks[new] = asyncio.create_task(pump(new))
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield self._apply(leg, item)
        finally:
            for task in tasks.values():
                task.cancel()
            for task in tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _migrate(self, leg: Leg, lost: ExecutorLost) -> list[Leg]:
        """Replace a lost leg by continuations of its unfinished outputs (the new legs), or
        raise the client's error when it cannot be migrated."""
        self.legs.remove(leg)
        run = self.runs[leg.run_index]
        unfinished = {j: run.outputs[j] for j in leg.indices if not run.outputs[j].is_finished}
        if not unfinished:
            return []  # it was lost after its last token, before saying it was finished
        if self.migrations is None:
            raise lost.api_error() from lost
        streams = await self.migrations.continue_outputs(
            lost, run.stream.request_id, run.prompt_token_ids, unfinished
        )
        new = [Leg(leg.run_index, s, (j,)) for s, j in zip(streams, unfinished, strict=True)]
        self.legs.extend(new)
        return new

    async def _hand_off(self, leg: Leg) -> list[Leg]:
        """Continue the outputs a prefill executor handed on (the new legs)."""
        run = self.runs[leg.run_index]
        handed = {j: run.outputs[j] for j in sorted(leg.handed_off)}
        # A stop string may have ended one at its first token.
        unfinished = {j: output for j, output in handed.items() if not output.is_finished}
        if not unfinished:
            return []
        assert self.migrations is not None, "a generation that may be handed on continues"
        streams = await self.migrations.hand_off(
            run.stream.request_id, run.prompt_token_ids, unfinished
        )
        new = [Leg(leg.run_index, s, (j,)) for s, j in zip(streams, unfinished, strict=True)]
        self.legs.extend(new)
        return new

    async def choice_updates(self) -> AsyncIterator[list[ChoiceUpdate]]:
        """Per executor response, the choices with something to send: text past the
        stop-string hold-back, new logprobs, or their finish (sent once)."""
        async for touched in self.updates():
            updates = []
            for index in touched:
                output = self.choices[index]
                text = output.take_text()
                token_ids, logprobs, offsets = output.take_tokens()
                finish = None
                if output.is_finished and index not in self._finish_sent:
                    finish = output.finish_reason
                    self._finish_sent.add(index)
                if not text and finish is None and not logprobs:
                    # Their text is held back (a stop string may start, or a character is
                    # incomplete): the tokens go with the chunk that sends it.
                    output.num_tokens_sent -= len(token_ids)
                    continue
                prompt = None
                if index not in self._first_sent:
                    self._first_sent.add(index)
                    prompt = self.prompt_info(index // self.n)
                updates.append(
                    ChoiceUpdate(
                        index=index,
                        text=text,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        text_offsets=offsets,
                        num_logprobs=output.num_logprobs,
                        finish_reason=finish,
                        stop_reason=output.stop_reason if finish else None,
                        prompt=prompt,
                    )
                )
            if updates:
                yield updates

    def prompt_info(self, run_index: int) -> PromptInfo:
        run = self.runs[run_index]
        return PromptInfo(run.prompt_token_ids, run.prompt_logprobs)

    def whole_choices(self, n: int | None = None) -> list[ChoiceUpdate]:
        """Every choice in full (once `run_to_end` has returned).

        With `n` below the request's outputs per prompt (best_of), only each prompt's `n`
        outputs of highest cumulative logprob, best first, numbered `i * n + j`.
        """
        n = n or self.n
        choices = []
        for i, run in enumerate(self.runs):
            prompt = self.prompt_info(i)
            ranked = list(run.outputs)
            if n < self.n:
                # Stable: equal scores keep their output order.
                ranked.sort(key=lambda output: output.cumulative_logprob, reverse=True)
            for j, output in enumerate(ranked[:n]):
                choices.append(ChoiceUpdate.whole(i * n + j, output, prompt))
        return choices

    def usage_of(self, n: int | None = None) -> Usage:
        """Usage counting only the choices returned (best_of: the best n, as vLLM counts)."""
        usage = self.usage()
        if n is None or n >= self.n:
            return usage
        completion = sum(len(c.token_ids) for c in self.whole_choices(n))
        return replace(usage, completion_tokens=completion)

    def _log_outputs(self) -> None:
        if self.log_outputs:
            log.info(
                "outputs",
                outputs=[c.text for c in self.choices],
                finish_reasons=[c.finish_reason for c in self.choices],
            )

    async def run_to_end(self) -> None:
        """Consume every update (non-streaming responses)."""
        async for _ in self.updates():
            pass

    def close(self) -> None:
        """Cancel whatever still runs (a disconnected client's executor requests)."""
        for run in self.runs:
            run.stream.close()
        for leg in self.legs:
            leg.stream.close()


async def start_generation(
    dispatcher: Dispatcher,
    tokenizer: Any,
    request_id: str,
    prompts: list[list[int]],
    params: SamplingParams,
    stream: bool,
    arrival: float,
) -> Generation:
    """Open one executor stream per prompt (all or none) and wrap them in a Generation."""
    dispatcher.check_capacity(len(prompts))
    wire = params_to_proto(params)
    if dispatcher.log_prompts:
        log.info("prompts", prompts=[tokenizer.decode(ids) for ids in prompts])

    def sub_id(i: int) -> str:
        return request_id if len(prompts) == 1 else f"{request_id}-{i}"

    streams = await open_all(
        dispatcher.open(sub_id(i), ids, wire, arrival) for i, ids in enumerate(prompts)
    )
    runs = [
        PromptRun(
            stream=s,
            outputs=[SequenceText(tokenizer, ids, params, stream) for _ in range(params.n)],
            num_prompt_tokens=len(ids),
            prompt_token_ids=ids,
        )
        for s, ids in zip(streams, prompts, strict=True)
    ]
    migrations = Migrations(dispatcher, wire, arrival)
    return Generation(runs, params.n, migrations, log_outputs=dispatcher.log_prompts)
