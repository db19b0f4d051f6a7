"""Single-token text for logprobs: each token's decoded text and its raw bytes.

The text of whole outputs (incremental detokenization, stop strings, streaming hold-back) is
`quire.engine.output_processor.SequenceText`'s, the same code the offline API uses.
"""

from __future__ import annotations

import functools
from typing import Any


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
