"""Draft tokens from a sequence's own history (n-gram speculation, "prompt lookup").

A decoding stream often repeats itself and its prompt: code, lists, quoted text, a small model's
loops. Where its last `n` tokens occurred before, the tokens that followed them then are a
guess at what follows now. The scheduler puts such a guess (the drafts) after the stream's
last token in one step; the model runner computes every position's logits and samples each
as usual, and the stream keeps its drafts up to the first one the sample differs from, plus
that sample: each step still emits at least one token, and every emitted token is exactly the
one the model samples after the tokens before it (the drafts only let later positions run in
the same pass). Weights are read once per step whatever its length, so while a step is
bound by memory a kept draft costs a sliver of the step it saves.

`NgramIndex` is one sequence's index: every n-gram (`min_n <= n <= max_n`) of its tokens ->
where it last ended, built incrementally as tokens are appended, so a proposal costs
O(max_n - min_n) lookups however long the sequence. `DraftStats` counts a sequence's kept and
rejected drafts: the scheduler's estimate of how likely its next draft is to be kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """Where each n-gram of a sequence's tokens last ended (one past its last token)."""

    min_n: int
    max_n: int
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    _num_indexed: int = 0  # n-grams ending before this position are in `_ends`

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix
        of `token_ids` (`max_n` down to `min_n` tokens) found; [] if none occurred before."""
        num_tokens = len(token_ids)
        # index every n-gram that ends before the suffix's own end
        for end in range(max(self._num_indexed, 1), num_tokens):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(token_ids[end - n : end])] = end
        self._num_indexed = max(self._num_indexed, num_tokens)
        if k <= 0:
            return []
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            found = self._ends.get(tuple(token_ids[num_tokens - n :]))
            if found is not None:
                return token_ids[found : found + k]
        return []


@dataclass
class DraftStats:
    """A sequence's drafts so far: kept, and steps where one was rejected."""

    num_accepted: int = 0
    num_rejected: int = 0  # steps whose drafts stopped at a rejected one

    def acceptance(self) -> float:
        """The estimated chance that its next draft, reached, is kept: a draft is reached when
        every draft before it in its step was kept (Beta(1, 1) prior: 0.5 before any)."""
        return (self.num_accepted + 1) / (self.num_accepted + self.num_rejected + 2)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_accepted += num_accepted
        self.num_rejected += num_accepted < num_drafts
