"""Incremental detokenization and stop-string matching for one output sequence."""

from __future__ import annotations

from typing import Any

# Characters a byte-level tokenizer yields while a multi-byte UTF-8 character is incomplete.
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, never splitting a UTF-8 character.

    Keeps two offsets into the output ids (as vLLM does): text is only emitted once the
    decoded window no longer ends in a replacement character, so a character split across
    tokens comes out whole.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Context from the prompt's tail makes leading spaces decode as they would in place.
        self.ids: list[int] = list(prompt_token_ids[-6:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def append(self, token_id: int) -> str:
        """Add one token; return the newly completed text (may be empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_INCOMPLETE):
            new = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += new
            return new
        return ""


def find_stop(text: str, new_len: int, stops: list[str]) -> tuple[str, int] | None:
    """First stop string that ends inside the last `new_len` chars; (stop, index) or None."""
    best: tuple[str, int] | None = None
    for stop in stops:
        start = max(0, len(text) - new_len - len(stop) + 1)
        idx = text.find(stop, start)
        if idx >= 0 and (best is None or idx < best[1]):
            best = (stop, idx)
    return best
