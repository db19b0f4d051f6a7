"""LLMEngine: requests in, one step at a time, per-step deltas out.

A step has three named parts: schedule (the scheduler's decision and its one allocator call,
a `SchedulerOutput`), execute (the model runner's forward pass and sampling, a
`ModelRunnerOutput`) and update (`quire.engine.update`: advance, fork, append, stop). Each
step returns the requests' `RequestDelta`s and a `StepStats`. Text, stop strings and whole
outputs are the output processor's (`quire.engine.output_processor`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from quire.block.allocator import BlockAllocator
from quire.block.manager import BlockManager
from quire.block.tables import BlockTables
from quire.block.window import TableLayout
from quire.cache.block_transfer import PullStats, snapshot
from quire.cache.host_pool import HostBlockPool
from quire.cache.paged_kv import PagedKVCache
from quire.config import EngineConfig
from quire.engine.grammar_masks import StructuredOutputs
from quire.engine.inputs import (
    Continuation,
    Prompt,
    check_prompt_fits,
    output_seeds,
    tokenize_prompt,
)
from quire.engine.loading import load_engine_model, num_kv_blocks
from quire.engine.model_runner import ModelRunner, ModelRunnerOutput
from quire.engine.pull_choice import PullCostModel
from quire.engine.scheduler import BlockPuller, Scheduler, SchedulerConfig
from quire.engine.sequence import Request, Sequence
from quire.engine.stats import NO_SWAP, EngineStats, StepStats, step_stats
from quire.engine.swap import KVSwapper
from quire.engine.update import StopRules, finished_delta, request_delta, update_from_output
from quire.model.attention_layout import KVGroups, kv_groups
from quire.outputs import RequestDelta, SequenceDelta
from quire.sampling_params import SamplingParams

# (pool size in blocks, the model runner's block tables, the window every layer slides
# through when blocks outside it are to be released, else None) -> the engine's allocator
AllocatorFactory = Callable[[int, BlockTables, TableLayout], BlockAllocator]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: the deltas of every request that advanced or finished, and its stats."""

    outputs: list[RequestDelta]
    stats: StepStats


class LLMEngine:
    """The paged engine: continuous batching over a block allocator and a model runner."""

    def __init__(
        self,
        config: EngineConfig,
        allocator: BlockAllocator | None = None,
        allocator_factory: AllocatorFactory | None = None,
        puller_factory: Callable[[PagedKVCache], BlockPuller] | None = None,
    ) -> None:
        """Load the model and size the KV pool.

        `allocator` is used as given (every block kept in one table per sequence);
        otherwise `allocator_factory(num_blocks, tables, layout)` builds one once the pool is
        sized (a remote allocator must know its size before the engine starts, and
        re-registers from the model runner's `tables`); otherwise an in-process
        `BlockManager`. `layout` (quire.block.window.TableLayout) is what the allocator
        releases with `free_outside_window` on: one group and its window when every layer
        slides, a table entry per KV group when the model mixes sliding and global layers
        (`quire.model.attention_layout.kv_groups`), one group keeping every block otherwise.
        `puller_factory(kv_cache)` builds what copies blocks a peer
        holds into this engine's cache when the allocator offers them (none: offers are
        declined and those blocks computed).
        """
        if allocator is not None and allocator_factory is not None:
            raise ValueError("pass allocator or allocator_factory, not both")
        self.config = config
        loaded = load_engine_model(config)
        path, self.device, self.dtype = loaded.path, loaded.device, loaded.dtype
        self.kv_dtype = config.resolve_kv_cache_dtype(self.dtype)  # the KV blocks' dtype
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.max_model_len, self.eos_token_ids = loaded.max_model_len, loaded.eos_token_ids
        model_config = self.model.config
        groups = kv_groups(
            model_config.attention, model_config.num_layers, config.free_outside_window
        )
        if groups.is_grouped and allocator is not None:
            groups = KVGroups.single(model_config.num_layers)  # a given allocator's own tables
        num_blocks = (
            num_kv_blocks(config, loaded, groups) if allocator is None else allocator.num_blocks
        )
        # The KV tensors hold exactly the blocks the allocator hands out; the runner holds
        # the block tables that index them.
        self.runner = ModelRunner(
            self.model,
            num_blocks,
            config.block_size,
            self.kv_dtype,
            self.device,
            groups,
            huge_pages=config.huge_pages,
        )
        layout = TableLayout(groups.windows)
        if allocator is None and allocator_factory is not None:
            allocator = allocator_factory(num_blocks, self.runner.tables, layout)
        elif allocator is None:
            allocator = BlockManager(
                num_blocks, config.block_size, config.enable_prefix_caching, layout=layout
            )
        self.allocator = allocator
        extra_key = str(path.name)
        # Swap mode: preempted sequences' full blocks go to a host pool and come back on
        # resume (quire.engine.swap); None: they are recomputed.
        self.swapper: KVSwapper | None = None
        if config.swap_space_bytes > 0:
            host_pool = HostBlockPool(config.swap_space_bytes)
            self.swapper = KVSwapper(self.runner.kv, host_pool, extra_key)
        self.scheduler = Scheduler(
            SchedulerConfig.of(config, extra_key=extra_key, max_model_len=self.max_model_len),
            self.allocator,
            self.runner.tables,
            self.swapper,
            None if puller_factory is None else puller_factory(self.runner.kv),
        )
        self.scheduler.pull_costs = PullCostModel(always=config.pull_policy == "always")
        self.stop_rules = StopRules(self.eos_token_ids, self.max_model_len)
        self.requests: dict[str, Request] = {}
        # Deltas of sequences ended between steps (finish_sequences), sent with the next step.
        self._pending: dict[str, list[SequenceDelta]] = {}
        self._arrivals = itertools.count()
        self.num_steps = 0
        self.num_generated_tokens = 0
        self.num_draft_tokens = 0  # n-gram drafts run, and kept, since the engine started
        self.num_kept_drafts = 0

    # --- requests ----------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """Prompt text and token ids, or ValueError naming what is wrong with the prompt."""
        return tokenize_prompt(self.tokenizer, self.model.config.vocab_size, prompt)

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        continuation: Continuation | None = None,
    ) -> None:
        """Validate and queue a request; invalid input raises ValueError and changes nothing.

        With `continuation`, the request runs one output of `params` from its first tokens
        (`quire.engine.inputs.Continuation`): its deltas carry that output's index, and no
        prompt logprobs are computed (the run it continues had them).
        """
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        vocab_size = self.model.config.vocab_size
        params.check_vocab(vocab_size)
        text, ids = self.tokenize(prompt)
        output_ids: list[int] = []
        index = 0
        if continuation is not None:
            continuation.check(params, len(ids), self.max_model_len, vocab_size)
            output_ids, index = list(continuation.token_ids), continuation.output_index
        check_prompt_fits(
            len(ids) + len(output_ids),
            self.max_model_len,
            self.config.block_size,
            self.allocator,
            self.runner.groups.num_groups,
        )
        if params.structured is not None:
            self.structured_outputs().compile(params.structured)  # ValueError if it cannot
        arrival = next(self._arrivals)
        # A continuation runs its one output; the seeds are the whole request's.
        run_params = params if continuation is None else replace(params, n=1, prompt_logprobs=None)
        request = Request(request_id, text, ids, run_params, arrival)
        if not params.is_greedy:
            request.seeds = output_seeds(params, self.config.seed * 1_000_003 + arrival)
        seq = Sequence(f"{request_id}#{index}", request, index, [*ids, *output_ids], arrival)
        if continuation is not None:
            seq.cumulative_logprob = continuation.cumulative_logprob
            if params.structured is not None:  # the grammar has accepted the output so far
                try:
                    self.structured_outputs().matcher(request, index, output_ids)
                except AssertionError as exc:
                    raise ValueError(f"the continued output breaks its grammar: {exc}") from exc
        request.seqs.append(seq)
        self.requests[request_id] = request
        self.scheduler.add(seq)

    def structured_outputs(self) -> StructuredOutputs:
        """The engine's grammar compiler and masks, built on the first constrained request."""
        if self.runner.structured is None:
            self.runner.structured = StructuredOutputs(
                self.tokenizer, self.model.config.vocab_size, self.eos_token_ids
            )
        return self.runner.structured

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now, emitting nothing more; its blocks are freed next step."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        self._pending.pop(request_id, None)
        self._finish(request.seqs, "abort")
        return True

    def finish_sequences(self, request_id: str, indices: Iterable[int], reason: str) -> bool:
        """End some of a request's sequences (a stop string the output processor matched).

        Their last delta, and the request's if that finishes it, comes with the next step.
        False if the request is unknown.
        """
        request = self.requests.get(request_id)
        if request is None:
            return False
        wanted = set(indices)
        seqs = [s for s in request.seqs if s.index in wanted and not s.is_finished()]
        self._finish(seqs, reason)
        if seqs:
            deltas = [finished_delta(s) for s in seqs]
            self._pending.setdefault(request_id, []).extend(deltas)
        return True

    def _finish(self, seqs: Iterable[Sequence], reason: str) -> None:
        for seq in seqs:
            if not seq.is_finished():
                seq.finish_reason = reason
                self.scheduler.finish(seq)
        if not self.scheduler.has_work():
            self.scheduler.flush()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # --- one step ----------------------------------------------------------------------------

    def step(self) -> StepResult:
        """Schedule, execute, update: one engine step and what it produced."""
        started = time.perf_counter()
        puller = self.scheduler.puller
        pulled_before = None if puller is None else snapshot(puller.stats)
        step = self.scheduler.schedule()
        if self.swapper is not None:
            # Before the step's block copies and forward pass, which may overwrite them.
            for seq in step.preempted:
                self.swapper.swap_out(seq.token_ids, step.preempted_blocks[seq.seq_id])
        running, waiting = self.scheduler.running, self.scheduler.waiting
        occupancy = (len(running), len(waiting), sum(s.num_allocated_tokens for s in running))
        scheduled = time.perf_counter()
        self.num_steps += 1
        if step.is_empty():
            output = ModelRunnerOutput([], 0.0, 0.0)
            if not step.preempted and not running and waiting:
                # Nothing fits even in an empty pool: end the sequence rather than spin.
                seq = waiting[0]
                self.finish_sequences(seq.request.request_id, [seq.index], "length")
        else:
            output = self.runner.execute(step)
        executed = time.perf_counter()
        outputs = [
            request_delta(self.requests[rid], deltas) for rid, deltas in self._pending.items()
        ]
        self._pending = {}
        outputs += update_from_output(self.scheduler, step, output, self.stop_rules)
        self.num_generated_tokens += len(output.sampled)
        if not self.scheduler.has_work():
            self.scheduler.flush()
        for delta in outputs:
            if delta.finished:
                self.requests.pop(delta.request_id, None)
        times = (scheduled - started, executed - scheduled, time.perf_counter() - executed)
        swap = self.swapper.step_stats() if self.swapper is not None else NO_SWAP
        pull = (
            None if pulled_before is None or puller is None else puller.stats.since(pulled_before)
        )
        if puller is not None and any(
            s.num_computed_tokens < s.seq.num_prompt_tokens for s in step.scheduled
        ):
            # a pass over prompt tokens: what computing a prefix costs, for pull-or-compute
            self.scheduler.pull_costs.observe_compute(step.num_tokens, executed - scheduled)
        if self.scheduler.config.measures_steps and not step.is_empty():
            # its only readers: arrival order without drafts needs no step costs
            self.scheduler.step_costs.observe(step.num_tokens, time.perf_counter() - started)
        stats = step_stats(step, output, occupancy, times, swap, pull)
        self.num_draft_tokens += stats.num_draft_tokens
        self.num_kept_drafts += stats.num_kept_drafts
        return StepResult(outputs, stats)

    def stats(self) -> EngineStats:
        return EngineStats(
            allocator=self.allocator.stats(),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.num_generated_tokens,
            num_draft_tokens=self.num_draft_tokens,
            num_kept_drafts=self.num_kept_drafts,
            swap=self.swapper.total_stats() if self.swapper is not None else NO_SWAP,
            pull=PullStats()
            if self.scheduler.puller is None
            else snapshot(self.scheduler.puller.stats),
        )

    @property
    def model_name(self) -> str:
        return Path(self.config.model).name
