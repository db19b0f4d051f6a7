"""The one owner of output text: detokenization, stop strings and streaming hold-back.

The engine core emits per-step `RequestDelta`s (new token ids, new logprobs) and stops a
sequence only on EOS, its stop token ids or a length limit. Everything about text is here,
used by the offline `LLM` (through `OutputProcessor`) and by the router (one `SequenceText`
per choice, fed from the executor's stream). When a stop string matches, the caller ends the
sequence in the engine (`LLMEngine.finish_sequences`, or the executor's Abort); tokens the
engine made after the stop are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quire.engine.detokenizer import IncrementalDetokenizer, find_stop
from quire.outputs import CompletionOutput, Logprob, RequestDelta, RequestOutput, SequenceDelta
from quire.sampling_params import SamplingParams


class SequenceText:
    """Text, tokens, logprobs and finish state of one output sequence, fed by its deltas.

    With `stream`, the last `max(len(stop)) - 1` characters are held back by `take_text`
    until more text arrives: they might be the start of a stop string that must not be sent.
    """

    def __init__(
        self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams, stream: bool
    ) -> None:
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, params.skip_special_tokens
        )
        self.stops = list(params.stop)
        self.include_stop = params.include_stop_str_in_output
        self.holdback = max((len(s) for s in self.stops), default=1) - 1 if stream else 0
        self.num_logprobs = params.logprobs or 0  # top alternatives asked for per token
        self.token_ids: list[int] = []
        # One dict per token when logprobs were asked for (token id -> Logprob).
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.text_offsets: list[int] = []  # where each token's text starts in `text`
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_text_sent = 0
        self.num_tokens_sent = 0

    @property
    def text(self) -> str:
        return self.detokenizer.text

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, delta: SequenceDelta) -> bool:
        """Append one step's tokens; True if a stop string ended the sequence just now.

        Once finished, later deltas are ignored: the engine may run on for a step or two
        before it hears of a stop string, and nothing after the stop belongs to the output.
        """
        if self.is_finished:
            return False
        self.cumulative_logprob = delta.cumulative_logprob
        # The engine's own stop (EOS, a stop token id) on the last token wins over a stop
        # string that token completes; a length limit does not.
        last_is_engine_stop = delta.finish_reason == "stop"
        num_new = len(delta.new_token_ids)
        for i, token_id in enumerate(delta.new_token_ids):
            self.text_offsets.append(len(self.detokenizer.text))
            self.token_ids.append(token_id)
            if self.logprobs is not None and delta.new_logprobs is not None:
                self.logprobs.append(delta.new_logprobs[i])
            new_text = self.detokenizer.append(token_id)
            if last_is_engine_stop and i == num_new - 1:
                break
            if self.stops and new_text and self._match_stop(len(new_text)):
                return True
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason
        return False

    def _match_stop(self, new_len: int) -> bool:
        match = find_stop(self.detokenizer.text, new_len, self.stops)
        if match is None:
            return False
        stop, idx = match
        end = idx + len(stop) if self.include_stop else idx
        self.detokenizer.text = self.detokenizer.text[:end]
        self.finish_reason, self.stop_reason = "stop", stop
        return True

    def take_text(self) -> str:
        """Text not yet sent that is safe to send (all of it once finished)."""
        text = self.detokenizer.text
        end = len(text) if self.is_finished else max(self.num_text_sent, len(text) - self.holdback)
        new = text[self.num_text_sent : end]
        self.num_text_sent = end
        return new

    def take_tokens(self) -> tuple[list[int], list[dict[int, Logprob]], list[int]]:
        """Token ids (with their logprobs, if asked for, and text offsets) not yet sent."""
        start = self.num_tokens_sent
        self.num_tokens_sent = len(self.token_ids)
        return (
            self.token_ids[start:],
            self.logprobs[start:] if self.logprobs is not None else [],
            self.text_offsets[start:],
        )

    def completion(self, index: int) -> CompletionOutput:
        return CompletionOutput(
            index=index,
            text=self.text,
            token_ids=list(self.token_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


def top_alternatives(top: dict[int, Logprob], k: int) -> list[tuple[int, float]]:
    """The `k` most likely (token id, logprob) of one position, by rank."""
    ranked = sorted(top.items(), key=lambda item: item[1].rank)
    return [(token_id, lp.logprob) for token_id, lp in ranked[:k]]


@dataclass
class _RequestState:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[SequenceText]
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class ProcessedOutputs:
    """What one step's deltas came to."""

    finished: list[RequestOutput] = field(default_factory=list)
    # (request id, output indices) that a stop string ended: end them in the engine.
    stopped: list[tuple[str, list[int]]] = field(default_factory=list)


class OutputProcessor:
    """Engine deltas to whole `RequestOutput`s, for the offline API (no streaming)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, _RequestState] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        outputs = [
            SequenceText(self.tokenizer, prompt_token_ids, params, stream=False)
            for _ in range(params.n)
        ]
        self._requests[request_id] = _RequestState(prompt, prompt_token_ids, outputs)

    def abort_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def process(self, deltas: list[RequestDelta]) -> ProcessedOutputs:
        result = ProcessedOutputs()
        for delta in deltas:
            state = self._requests.get(delta.request_id)
            if state is None:
                continue  # aborted here, or already finished by a stop string
            state.num_cached_tokens = delta.num_cached_tokens
            if delta.prompt_logprobs is not None:
                state.prompt_logprobs = [None, *delta.prompt_logprobs]
            stopped = [d.index for d in delta.outputs if state.outputs[d.index].add(d)]
            if stopped:
                result.stopped.append((delta.request_id, stopped))
            if all(o.is_finished for o in state.outputs):
                del self._requests[delta.request_id]
                result.finished.append(
                    RequestOutput(
                        request_id=delta.request_id,
                        prompt=state.prompt,
                        prompt_token_ids=state.prompt_token_ids,
                        outputs=[o.completion(i) for i, o in enumerate(state.outputs)],
                        finished=True,
                        num_cached_tokens=state.num_cached_tokens,
                        prompt_logprobs=state.prompt_logprobs,
                    )
                )
        return result
