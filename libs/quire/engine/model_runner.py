"""ModelRunner: owns the weights and the physical KV cache; runs one SchedulerOutput.

`execute` is the step's middle part: block copies, the forward pass over the flattened tokens
of every scheduled sequence, and sampling; it returns a `ModelRunnerOutput` and changes no
sequence (the engine's update part applies it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from quire.block.tables import BlockTables
from quire.block.window import kernel_table
from quire.cache.paged_kv import PagedKVCache
from quire.engine.grammar_masks import GrammarRow, MaskJob, StructuredOutputs
from quire.engine.prompt_logprobs import (
    LOGITS_SLICE_ROWS,
    PromptLogprobsChunk,
    PromptSpan,
    logprobs_of_targets,
    prompt_span,
)
from quire.engine.sampler import SampleRow, sample
from quire.engine.scheduler import ScheduledSeq, SchedulerOutput
from quire.engine.sequence import Sequence
from quire.model.attention import AttentionMetadata, KVCache
from quire.model.attention_layout import KVGroups
from quire.model.decoder import DecoderModel
from quire.outputs import Logprob


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One token drawn from the last logits row of `seq`'s chunk, for output `index`."""

    seq: Sequence
    index: int  # differs from seq.index only on an n>1 request's first token (a fork)
    token_id: int
    logprob: float  # of the token under the unprocessed distribution
    top_logprobs: dict[int, Logprob] | None
    ends_grammar: bool = False  # structured output: this token completed the grammar


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    """What the model produced for one step, in `step.scheduled` order."""

    sampled: list[SampledToken]
    forward_s: float  # copies, inputs and the forward pass (logits included)
    sample_s: float
    # Prompt logprobs computed this step (requests that asked for them, in chunk order).
    prompt_logprobs: list[PromptLogprobsChunk] = field(default_factory=list)
    # seq_id -> how many of its drafts were kept, for every sequence that ran drafts (its
    # tokens in `sampled`: the kept drafts, then the token sampled after them)
    num_kept_drafts: dict[str, int] = field(default_factory=dict)


class ModelRunner:
    """Turns the scheduler's step object into flat tensors, runs the model, returns logits."""

    def __init__(
        self,
        model: DecoderModel,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        device: torch.device,
        groups: KVGroups | None = None,
        huge_pages: bool = False,
    ) -> None:
        """`kv_dtype`: the KV blocks' (EngineConfig.kv_cache_dtype); `groups`: how the layers
        share blocks (quire.model.attention_layout); None: one table, every layer in every
        block; `huge_pages`: the blocks in huge pages where offered (EngineConfig.huge_pages)."""
        self.model = model
        self.block_size = block_size
        self.device = device
        # Grammar masks for structured outputs; None until the engine serves a constrained
        # request (then every step asks it, and it does nothing without constrained rows).
        self.structured: StructuredOutputs | None = None
        # The physical KV blocks, and the block copy path (read/write blocks as host buffers).
        self.kv = PagedKVCache(
            model.config, num_blocks, block_size, kv_dtype, device, groups, huge_pages
        )
        self.groups = self.kv.groups
        # The executor's one record of the block tables that index these tensors: the
        # scheduler's allocator steps apply to it, slot mappings are built from it. With
        # several KV groups a table interleaves theirs (quire.block.window.TableLayout).
        self.tables = BlockTables(block_size, self.groups.num_groups)

    @property
    def kv_caches(self) -> list[KVCache]:
        """Per layer (key, value): `[num_blocks, block_size, num_kv_heads, head_dim]` each (its
        slot's tensors: layers of different KV groups share them)."""
        return self.kv.layers

    def execute(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step's tokens through the model and sample every due output."""
        started = time.perf_counter()
        draws = _Draws.of([s for s in step.scheduled if s.samples])
        # Grammar masks are filled on their own thread while the forward pass runs.
        job = self.structured.start_masks(draws.grammar_rows()) if self.structured else None
        try:
            logits, prompt_logprobs = self.compute_logits(step)
        except BaseException:
            StructuredOutputs.finish(job)
            raise
        forwarded = time.perf_counter()
        sampled, kept = draws.verify(_sample(logits, draws, self.structured, job))
        return ModelRunnerOutput(
            sampled, forwarded - started, time.perf_counter() - forwarded, prompt_logprobs, kept
        )

    def compute_logits(
        self, step: SchedulerOutput
    ) -> tuple[torch.Tensor, list[PromptLogprobsChunk]]:
        """Logits `[num_rows, vocab]` float32, rows in `step.scheduled` order (one per
        sampling sequence, one more per draft), and the prompt logprobs of the chunks that
        need them."""
        vocab = self.model.config.vocab_size
        self.kv.copy_blocks(step.copies)
        input_ids: list[int] = []
        positions: list[int] = []
        num_groups = self.groups.num_groups
        # per KV group: the slot of every new token, and each sequence's table
        slots: list[list[int]] = [[] for _ in range(num_groups)]
        row_tables: list[list[list[int]]] = [[] for _ in range(num_groups)]
        cu_query_lens = [0]
        context_lens: list[int] = []
        sample_rows: list[int] = []
        spans: list[PromptSpan] = []
        bs = self.block_size
        for s in step.scheduled:
            if (span := prompt_span(s, cu_query_lens[-1])) is not None:
                spans.append(span)
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids.extend(s.seq.token_ids[start:end])  # up to its last token
            input_ids.extend(s.draft_token_ids)
            positions.extend(range(start, end))
            flat = self.tables.get(s.seq.seq_id)
            for group in range(num_groups):
                table = flat[group::num_groups] if num_groups > 1 else flat
                row_tables[group].append(kernel_table(table))
                slots[group].extend(table[p // bs] * bs + p % bs for p in range(start, end))
            cu_query_lens.append(cu_query_lens[-1] + s.num_new_tokens)
            context_lens.append(end)
            if s.samples:  # its last token's row, and each draft's
                last = cu_query_lens[-1] - 1
                sample_rows.extend(range(last - len(s.draft_token_ids), last + 1))

        def t(values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        context = t(context_lens, torch.int32)
        cu_query = t(cu_query_lens, torch.int32)
        decode_only = all(s.num_new_tokens == 1 for s in step.scheduled)
        metas = []
        for group in range(num_groups):
            max_blocks = max(len(table) for table in row_tables[group])
            tables = [table + [0] * (max_blocks - len(table)) for table in row_tables[group]]
            metas.append(
                AttentionMetadata(
                    slot_mapping=t(slots[group], torch.int64),
                    block_tables=t(tables, torch.int32),
                    context_lens=context,
                    cu_query_lens=cu_query,
                    is_decode_only=decode_only,
                )
            )
        meta = metas[0]
        if num_groups > 1:
            meta.layer_metas = [metas[group] for group in self.groups.layer_groups]
        hidden = self.model.forward(
            t(input_ids, torch.int64), t(positions, torch.int64), self.kv_caches, meta
        )
        prompt = _prompt_logprobs(
            spans, lambda rows: self.model.compute_logits(hidden[rows]), self.device
        )
        if not sample_rows:
            return hidden.new_empty((0, vocab), dtype=torch.float32), prompt
        return self.model.compute_logits(hidden[t(sample_rows, torch.int64)]), prompt


def _prompt_logprobs(
    spans: list[PromptSpan],
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
) -> list[PromptLogprobsChunk]:
    """Each span's logits, a slice of rows at a time, scored against its prompt tokens."""
    chunks = []
    for span in spans:
        k = span.request.params.prompt_logprobs or 0
        targets = span.target_token_ids
        logprobs: list[dict[int, Logprob]] = []
        for lo in range(0, span.num_positions, LOGITS_SLICE_ROWS):
            hi = min(lo + LOGITS_SLICE_ROWS, span.num_positions)
            rows = torch.arange(span.first_row + lo, span.first_row + hi, device=device)
            logprobs += logprobs_of_targets(logits_of(rows), targets[lo:hi], k)
        chunks.append(PromptLogprobsChunk(span.request, span.start, logprobs))
    return chunks


@dataclass(frozen=True, slots=True)
class _Draws:
    """The step's draws: one per (sequence, output index); an n>1 fork draws n times from
    its one logits row; a sequence with drafts draws once from its last token's row and once
    from each draft's, as if the drafts before it were its tokens."""

    rows: list[SampleRow]
    targets: list[tuple[Sequence, int]]
    row_index: list[int]  # the logits row of each draw
    # per sequence with drafts: its first draw's index, and its drafts
    drafted: list[tuple[int, tuple[int, ...]]]

    @classmethod
    def of(cls, due: list[ScheduledSeq]) -> _Draws:
        draws = cls([], [], [], [])
        row = 0
        for s in due:
            seq, request = s.seq, s.seq.request
            drafts = s.draft_token_ids
            if drafts:
                draws.drafted.append((len(draws.rows), drafts))
            for index in s.sample_indices:
                for j in range(len(drafts) + 1):
                    # the history this position's penalties and seeded draw see
                    history = [*seq.token_ids, *drafts[:j]] if j else seq.token_ids
                    draws.rows.append(
                        SampleRow(
                            request.params,
                            history,
                            len(request.prompt_token_ids),
                            request.seeds[index],
                        )
                    )
                    draws.targets.append((seq, index))
                    draws.row_index.append(row + j)
            row += len(drafts) + 1
        return draws

    def grammar_rows(self) -> list[GrammarRow]:
        return [(seq.request, index, seq.output_token_ids) for seq, index in self.targets]

    def verify(self, sampled: list[SampledToken]) -> tuple[list[SampledToken], dict[str, int]]:
        """`sampled` with each drafted sequence's draws cut after the first whose draft
        differs from what was sampled before it: what it emits (its kept drafts, each equal
        to its sample, then the sample after them), and how many drafts each kept."""
        if not self.drafted:
            return sampled, {}
        kept: dict[str, int] = {}
        cut: set[int] = set()  # indices of draws dropped
        for first, drafts in self.drafted:
            num_kept = 0
            while num_kept < len(drafts) and sampled[first + num_kept].token_id == drafts[num_kept]:
                num_kept += 1
            kept[sampled[first].seq.seq_id] = num_kept
            cut.update(range(first + num_kept + 1, first + len(drafts) + 1))
        return [t for i, t in enumerate(sampled) if i not in cut], kept


def _sample(
    logits: torch.Tensor,
    draws: _Draws,
    structured: StructuredOutputs | None,
    job: MaskJob | None,
) -> list[SampledToken]:
    """Sample every draw; constrained rows are masked by `job` (their grammars' bitmask for
    the step) first and each drawn token is fed back to its output's matcher."""
    if not draws.rows:
        StructuredOutputs.finish(job)
        return []
    if draws.row_index != list(range(logits.shape[0])):
        logits = logits[torch.tensor(draws.row_index, device=logits.device)]
    num_masked = structured.apply_masks(logits, job) if structured is not None else 0
    results = sample(logits, draws.rows)
    ends = [False] * len(draws.targets)
    if num_masked:
        for k, ((seq, index), r) in enumerate(zip(draws.targets, results, strict=True)):
            if seq.request.params.structured is not None:
                ends[k] = structured.accept(seq.request, index, r.token_id)  # type: ignore[union-attr]
    return [
        SampledToken(seq, index, r.token_id, r.logprob, r.top_logprobs, end)
        for (seq, index), r, end in zip(draws.targets, results, ends, strict=True)
    ]
