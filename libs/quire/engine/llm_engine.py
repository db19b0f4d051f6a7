"""LLMEngine: requests in, one scheduler step + forward + sampling per `step()`, outputs out."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quire.block.allocator import AllocatorStats, BlockAllocator
from quire.block.manager import BlockManager
from quire.block.restore import LiveSequenceState
from quire.config import DEFAULT_CPU_KV_CACHE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, EngineConfig
from quire.engine.detokenizer import IncrementalDetokenizer, find_stop
from quire.engine.model_runner import ModelRunner, kv_bytes_per_block
from quire.engine.sampler import SampleRow, sample
from quire.engine.scheduler import Scheduler, SchedulerConfig
from quire.engine.sequence import Request, Sequence
from quire.model.llama import LlamaModel
from quire.model.loader import load_checkpoint, resolve_model_path
from quire.outputs import CompletionOutput, RequestOutput
from quire.sampling_params import SamplingParams

Prompt = str | dict[str, Any]


@dataclass(frozen=True)
class EngineStats:
    """Counters for dashboards and tests (prefix-cache figures in tokens)."""

    allocator: AllocatorStats
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_steps: int
    num_generated_tokens: int


class LLMEngine:
    """The paged engine: continuous batching over a block allocator and a model runner."""

    def __init__(
        self,
        config: EngineConfig,
        allocator: BlockAllocator | None = None,
        allocator_factory: Callable[[int], BlockAllocator] | None = None,
    ) -> None:
        """Load the model and size the KV pool.

        `allocator` is used as given; otherwise `allocator_factory(num_blocks)` builds one
        once the pool is sized (a remote allocator must know its size before the engine
        starts); otherwise an in-process `BlockManager`.
        """
        from transformers import AutoTokenizer

        if allocator is not None and allocator_factory is not None:
            raise ValueError("pass allocator or allocator_factory, not both")

        self.config = config
        path = resolve_model_path(config.model)
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        model_config, state = load_checkpoint(path, self.device, self.dtype)
        self.max_model_len = min(
            config.max_model_len or model_config.max_model_len, model_config.max_model_len
        )
        self.model = LlamaModel(model_config, state, self.device)
        del state
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load the tokenizer from {str(path)!r}: {exc}") from exc
        self.eos_token_ids = _eos_token_ids(path, model_config.eos_token_ids, self.tokenizer)
        if allocator is None:
            num_blocks = self._num_blocks(model_config)
            if allocator_factory is not None:
                allocator = allocator_factory(num_blocks)
            else:
                allocator = BlockManager(
                    num_blocks, config.block_size, config.enable_prefix_caching
                )
        self.allocator = allocator
        # The KV tensors hold exactly the blocks the allocator hands out.
        self.runner = ModelRunner(
            self.model, self.allocator.num_blocks, config.block_size, self.dtype, self.device
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs, config.max_num_batched_tokens, extra_key=str(path.name)
            ),
            self.allocator,
        )
        self.requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self.num_steps = 0
        self.num_generated_tokens = 0

    def _num_blocks(self, model_config: Any) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        per_block = kv_bytes_per_block(model_config, self.config.block_size, self.dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * DEFAULT_GPU_MEMORY_UTILIZATION)
        else:
            budget = DEFAULT_CPU_KV_CACHE_BYTES
        # No point holding more than every running sequence at full length could use.
        blocks_needed = self.config.max_num_seqs * -(-self.max_model_len // self.config.block_size)
        return max(1, min(budget // per_block, blocks_needed))

    # --- requests ----------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """Prompt text and token ids, or ValueError naming what is wrong with the prompt."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list | tuple) or not ids:
                raise ValueError("prompt_token_ids must be a non-empty list of token ids")
            vocab = self.model.config.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt_token_ids must be integers in [0, {vocab})")
            return prompt.get("prompt"), list(ids)
        raise ValueError('prompt must be a string or {"prompt_token_ids": [...]}')

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams) -> None:
        """Validate and queue a request; invalid input raises ValueError and changes nothing."""
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, ids = self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's context is {self.max_model_len} "
                "tokens and at least one must be left to generate"
            )
        blocks = -(-(len(ids) + 1) // self.config.block_size)
        if blocks > self.allocator.num_blocks:
            raise ValueError(
                f"prompt needs {blocks} KV blocks but the cache holds {self.allocator.num_blocks}"
            )
        arrival = next(self._arrivals)
        request = Request(request_id, text, ids, params, arrival)
        request.seqs.append(self._new_seq(request, 0, list(ids)))
        self.requests[request_id] = request
        self.scheduler.add(request.seqs[0])

    def _new_seq(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        params = request.params
        generator = None
        if not params.is_greedy:
            generator = torch.Generator()
            base = (
                params.seed
                if params.seed is not None
                else self.config.seed * 1_000_003 + request.arrival
            )
            generator.manual_seed((base * 7919 + index) % (2**63))
        seq = Sequence(
            seq_id=f"{request.request_id}#{index}",
            request=request,
            index=index,
            token_ids=token_ids,
            arrival=request.arrival,
            detokenizer=IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, params.skip_special_tokens
            ),
            generator=generator,
        )
        if params.logprobs is not None:
            seq.logprobs = []
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now; its blocks are freed on the next step. False if unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        for seq in request.seqs:
            if not seq.is_finished():
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        if not self.scheduler.has_work():
            self.scheduler.flush()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def live_sequences(self) -> list[LiveSequenceState]:
        """Every running sequence as the allocator last granted it.

        What an executor re-registers with after its memory manager lost state. A forked
        child whose fork the allocator has not processed yet has no block table and is left
        out (the pending fork creates it).
        """
        extra_key = self.scheduler.config.extra_key
        return [
            LiveSequenceState(
                seq_id=seq.seq_id,
                token_ids=tuple(seq.token_ids[: seq.num_allocated_tokens]),
                block_table=tuple(seq.block_table),
                num_computed_tokens=seq.num_computed_tokens,
                extra_key=extra_key,
            )
            for seq in self.scheduler.running
            if seq.block_table
        ]

    # --- one step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the requests that produced tokens or finished."""
        step = self.scheduler.schedule()
        self.num_steps += 1
        if step.is_empty():
            if not step.preempted and not self.scheduler.running and self.scheduler.waiting:
                # Nothing fits even in an empty pool: end the sequence rather than spin.
                seq = self.scheduler.waiting[0]
                seq.finish_reason = "length"
                self.scheduler.finish(seq)
                return self._outputs({seq.request.request_id})
            return []
        logits = self.runner.execute(step)
        rows: list[SampleRow] = []
        row_seqs: list[tuple[Sequence, int]] = []  # (sequence, row of `logits` it samples from)
        num_rows = 0
        for s in step.scheduled:
            seq = s.seq
            seq.num_computed_tokens += s.num_new_tokens
            self.scheduler.commit(seq)
            if not s.samples:
                continue
            row, num_rows = num_rows, num_rows + 1
            targets = [seq]
            if seq.request.params.n > 1 and len(seq.request.seqs) == 1:
                targets += [
                    self._new_seq(seq.request, i, list(seq.token_ids))
                    for i in range(1, seq.request.params.n)
                ]
                seq.request.seqs.extend(targets[1:])
            for target in targets:
                rows.append(
                    SampleRow(
                        target.request.params,
                        target.request.prompt_token_ids,
                        target.output_token_ids,
                        target.generator,
                    )
                )
                row_seqs.append((target, row))
        touched: set[str] = set()
        if rows:
            row_index = torch.tensor([r for _, r in row_seqs], device=logits.device)
            results = sample(logits[row_index], rows)
            for (seq, _), result in zip(row_seqs, results, strict=True):
                parent = seq.request.seqs[0]
                if seq is not parent and seq.num_output_tokens == 0:
                    self.scheduler.add_fork(parent, seq)
                self._append_token(seq, result.token_id, result.logprob, result.top_logprobs)
                touched.add(seq.request.request_id)
        if not self.scheduler.has_work():
            self.scheduler.flush()
        return self._outputs(touched)

    def _append_token(self, seq: Sequence, token_id: int, logprob: float, top: Any) -> None:
        seq.token_ids.append(token_id)
        self.num_generated_tokens += 1
        seq.cumulative_logprob += logprob
        if seq.logprobs is not None:
            seq.logprobs.append(top)
        params = seq.request.params
        new_text = seq.detokenizer.append(token_id)
        reason: str | None = None
        if not params.ignore_eos and token_id in self.eos_token_ids:
            reason = "stop"
        elif token_id in params.stop_token_ids:
            reason, seq.stop_reason = "stop", token_id
        elif params.stop and new_text:
            match = find_stop(seq.detokenizer.text, len(new_text), params.stop)
            if match is not None:
                stop, idx = match
                reason, seq.stop_reason = "stop", stop
                end = idx + len(stop) if params.include_stop_str_in_output else idx
                seq.detokenizer.text = seq.detokenizer.text[:end]
        if reason is None and (
            seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            reason = "length"
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)

    def _outputs(self, request_ids: set[str]) -> list[RequestOutput]:
        outputs = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            finished = request.is_finished()
            outputs.append(
                RequestOutput(
                    request_id=request_id,
                    prompt=request.prompt,
                    prompt_token_ids=request.prompt_token_ids,
                    outputs=[
                        CompletionOutput(
                            index=seq.index,
                            text=seq.detokenizer.text,
                            token_ids=list(seq.output_token_ids),
                            cumulative_logprob=seq.cumulative_logprob,
                            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                            finish_reason=seq.finish_reason,
                            stop_reason=seq.stop_reason,
                        )
                        for seq in request.seqs
                    ],
                    finished=finished,
                    num_cached_tokens=request.num_cached_tokens,
                )
            )
            if finished:
                del self.requests[request_id]
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            allocator=self.allocator.stats(),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.num_generated_tokens,
        )

    @property
    def model_name(self) -> str:
        return Path(self.config.model).name


def _eos_token_ids(path: Path, config_eos: tuple[int, ...], tokenizer: Any) -> frozenset[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer, as generate() does."""
    eos = set(config_eos)
    generation = path / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        eos.update(value if isinstance(value, list) else [] if value is None else [value])
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    return frozenset(eos)
