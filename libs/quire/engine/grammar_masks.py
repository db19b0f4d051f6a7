"""Structured outputs: grammar-constrained decoding with xgrammar's token bitmasks.

One `StructuredOutputs` per engine. It compiles a request's `StructuredOutputParams` against
the served model's tokenizer (an LRU cache keyed by the spec), keeps one `GrammarMatcher` per
output sequence, and is called by the model runner at one point, around sampling:

- `start_masks` fills ONE bitmask tensor `[num_rows, ceil(vocab / 32)]` for the step's
  constrained rows on the grammar thread, while the caller runs the forward pass (xgrammar
  fills without holding the GIL); `apply_masks` waits for it and applies it in place to those
  rows only. A step with no constrained row never touches xgrammar, the thread or the logits.
  `mask_logits` does both at once.
- `accept` feeds each sampled token to its output's matcher and says which outputs the
  grammar has just ended (the engine finishes them with "stop").

Matchers live on the `Request`, by output index. An output's matcher has accepted exactly the
output's tokens, so preemption by recompute (which keeps every token) needs nothing, and a
fork re-creates the child's matcher by replaying the tokens the child starts with.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from quire.engine.sequence import Request
from quire.structured_params import StructuredOutputParams, first_line, parse_grammar

CACHE_SIZE = 256  # compiled grammars kept per engine (LRU)

# (request, output index, that output's tokens so far) for one logits row.
GrammarRow = tuple[Request, int, list[int]]


@dataclass(frozen=True, slots=True)
class MaskJob:
    """A step's bitmask being filled on the grammar thread."""

    rows: list[int]  # the constrained logits rows
    bitmask: Future[torch.Tensor]  # [num_rows, ceil(vocab / 32)] int32 once filled


class StructuredOutputs:
    """Grammar compilation, per-output matchers and the per-step bitmask for one engine."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        """`vocab_size` is the model's (its logits' width), which can exceed the tokenizer's."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_token_ids = sorted(eos_token_ids)
        self._compiler: Any = None  # built on the first constrained request (xgrammar import)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None  # started by the first mask
        self.num_masked_rows = 0  # rows masked so far (tests and stats)
        self.fill_seconds = 0.0  # filling bitmasks, on the grammar thread
        self.wait_seconds = 0.0  # the caller blocked on a fill, plus applying the mask

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._eos_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, params: StructuredOutputParams) -> Any:
        """The spec's `CompiledGrammar` (cached); ValueError if it does not compile."""
        key = params.key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        grammar = parse_grammar(params)
        try:
            compiled = self._get_compiler().compile_grammar(grammar)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"invalid {params.kind}: {first_line(exc)}") from exc
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, request: Request, index: int, token_ids: Sequence[int]) -> Any:
        """Output `index`'s matcher, created (replaying `token_ids`, its output so far) if new."""
        matchers: dict[int, Any] = request.grammar_matchers
        found = matchers.get(index)
        if found is not None:
            return found
        import xgrammar as xgr

        assert request.params.structured is not None, "only constrained requests have matchers"
        new = xgr.GrammarMatcher(self.compile(request.params.structured))
        for token_id in token_ids:
            if not new.accept_token(token_id):
                raise AssertionError(f"replayed token {token_id} rejected by the grammar")
        matchers[index] = new
        return new

    def start_masks(self, rows: Sequence[GrammarRow]) -> MaskJob | None:
        """Start filling the bitmask for `rows` (logits row `i` is `rows[i]`); None if no row
        is constrained. Every job must be given to `apply_masks` (or `finish`) before the
        step's tokens are accepted: until then the grammar thread owns the matchers."""
        constrained = [i for i, (req, _, _) in enumerate(rows) if req.params.structured]
        if not constrained:
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quire-grammar")
        work = [(i, *rows[i]) for i in constrained]
        return MaskJob(constrained, self._thread.submit(self._fill, len(rows), work))

    def _fill(self, num_rows: int, work: list[tuple[int, Request, int, list[int]]]) -> Any:
        import xgrammar as xgr

        started = time.perf_counter()
        # all ones (allow everything) outside the constrained rows, which are never applied
        bitmask = xgr.allocate_token_bitmask(num_rows, self.vocab_size)
        for i, request, index, output_ids in work:
            matcher = self.matcher(request, index, output_ids)
            if not matcher.is_terminated():  # a finished grammar ends its output anyway
                matcher.fill_next_token_bitmask(bitmask, i)
        self.fill_seconds += time.perf_counter() - started
        return bitmask

    def apply_masks(self, logits: torch.Tensor, job: MaskJob | None) -> int:
        """Wait for `job`'s bitmask and mask `logits` `[num_rows, vocab]` in place; returns how
        many rows were masked (0 for no job)."""
        if job is None:
            return 0
        import xgrammar as xgr

        started = time.perf_counter()
        bitmask = job.bitmask.result()
        xgr.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device), vocab_size=self.vocab_size, indices=job.rows
        )
        self.wait_seconds += time.perf_counter() - started
        self.num_masked_rows += len(job.rows)
        return len(job.rows)

    @staticmethod
    def finish(job: MaskJob | None) -> None:
        """Wait for a job whose logits will never come (the step failed)."""
        if job is not None:
            job.bitmask.exception()

    def mask_logits(self, logits: torch.Tensor, rows: Sequence[GrammarRow]) -> int:
        """Fill and apply at once: `start_masks` then `apply_masks`."""
        return self.apply_masks(logits, self.start_masks(rows))

    def accept(self, request: Request, index: int, token_id: int) -> bool:
        """Feed output `index`'s sampled token to its matcher; True if the grammar is done."""
        matcher = request.grammar_matchers[index]
        if matcher.is_terminated():
            return True
        if not matcher.accept_token(token_id):
            raise AssertionError(f"sampled token {token_id} is not allowed by the grammar")
        return bool(matcher.is_terminated())
