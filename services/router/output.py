"""Tokens out: incremental detokenization, stop strings and logprobs of one output sequence.

The router detokenizes the token ids the executor streams with the engine's own
`IncrementalDetokenizer` and `find_stop`, in the engine's order (stop token ids first, then
stop strings on the newly completed text), so a multi-byte character split across tokens
comes out whole and stop strings truncate exactly where the engine stops.

When streaming with stop strings, the last `max(len(stop)) - 1` characters are held back
until more text arrives: they might be the start of a stop string that must not be sent.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from quire.engine.detokenizer import IncrementalDetokenizer, find_stop
from quire.sampling_params import SamplingParams
from services.rpc import executor_pb2


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenText:
    """A single token's text and raw bytes, for logprobs (cached per token id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special_ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """(decoded text, UTF-8 bytes of the token itself) for one token id."""
        cached = self._cache.get(token_id)
        if cached is None:
            text = str(self.tokenizer.decode([token_id]))
            raw = text.encode("utf-8")
            if token_id not in self.special_ids:
                piece = self.tokenizer.convert_ids_to_tokens(token_id)
                decoder = _byte_decoder()
                if isinstance(piece, str) and piece and all(ch in decoder for ch in piece):
                    # Byte-level BPE: the piece spells the token's bytes, even half a char.
                    raw = bytes(decoder[ch] for ch in piece)
            cached = self._cache[token_id] = (text, list(raw))
        return cached


@dataclass
class TokenLogprob:
    """One generated token's logprob and the most likely alternatives (by rank)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class OutputState:
    """Text, tokens and finish state of one output sequence, fed by executor deltas."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        params: SamplingParams,
        stream: bool,
    ) -> None:
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, params.skip_special_tokens
        )
        self.stops = list(params.stop)
        self.stop_token_ids = set(params.stop_token_ids)
        self.include_stop = params.include_stop_str_in_output
        self.num_logprobs = params.logprobs
        self.holdback = max((len(s) for s in self.stops), default=1) - 1 if stream else 0
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.text_offsets: list[int] = []  # where each token's text starts in `text`
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_text_sent = 0
        self.num_tokens_sent = 0

    @property
    def text(self) -> str:
        return self.detokenizer.text

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, delta: executor_pb2.CompletionDelta) -> None:
        """Append one executor delta (new tokens, maybe the finish)."""
        if self.is_finished:
            return  # the engine stopped at our stop too; nothing after it is ours
        for i, token_id in enumerate(delta.token_ids):
            self.text_offsets.append(len(self.detokenizer.text))
            self.token_ids.append(token_id)
            if self.num_logprobs is not None and i < len(delta.logprobs):
                lp = delta.logprobs[i]
                top = sorted(lp.top, key=lambda t: t.rank)[: self.num_logprobs]
                self.logprobs.append(
                    TokenLogprob(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in top])
                )
            new_text = self.detokenizer.append(token_id)
            if token_id in self.stop_token_ids:
                self.finish_reason, self.stop_reason = "stop", token_id
                return
            if self.stops and new_text:
                match = find_stop(self.detokenizer.text, len(new_text), self.stops)
                if match is not None:
                    stop, idx = match
                    end = idx + len(stop) if self.include_stop else idx
                    self.detokenizer.text = self.detokenizer.text[:end]
                    self.finish_reason, self.stop_reason = "stop", stop
                    return
        if delta.finish_reason:
            self.finish_reason = delta.finish_reason
            if delta.stop_reason:
                reason = delta.stop_reason
                self.stop_reason = int(reason) if reason.isdigit() else reason

    def take_text(self) -> str:
        """Text not yet sent that is safe to send (all of it once finished)."""
        text = self.detokenizer.text
        end = len(text) if self.is_finished else max(self.num_text_sent, len(text) - self.holdback)
        new = text[self.num_text_sent : end]
        self.num_text_sent = end
        return new

    def take_tokens(self) -> tuple[list[int], list[TokenLogprob], list[int]]:
        """Token ids (with their logprobs and text offsets) not yet sent."""
        start = self.num_tokens_sent
        self.num_tokens_sent = len(self.token_ids)
        return (
            self.token_ids[start:],
            self.logprobs[start:] if self.num_logprobs is not None else [],
            self.text_offsets[start:],
        )
