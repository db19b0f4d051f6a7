"""Builders for paged-cache test batches and a naive dense attention to check them against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from quire.kernels import reference_quantized
from quire.kernels.signatures import PagedAttention


@dataclass(frozen=True)
class PagedBatch:
    """Sequences whose keys/values exist both densely (the truth) and in a paged cache."""

    keys: list[torch.Tensor]  # per sequence: [context_len, num_kv_heads, head_dim]
    values: list[torch.Tensor]  # per sequence: [context_len, num_kv_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor  # [num_seqs] int32

    def decode(
        self,
        kernels: PagedAttention,
        query: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A backend's decode attention over this batch, one query token per sequence."""
        # query: [num_seqs, num_heads, head_dim]
        return kernels.paged_decode_attention(
            query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.context_lens,
            scale,
            sliding_window,
            logits_soft_cap,
            sinks,
        )

    def prefill(
        self,
        kernels: PagedAttention,
        query: torch.Tensor,
        query_lens: list[int],
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A backend's prefill attention over this batch, query_lens[s] chunk tokens of
        sequence s back to back in `query` (the last ones of its context)."""
        # query: [sum(query_lens), num_heads, head_dim]
        return kernels.paged_prefill_attention(
            query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            cu_lens(query_lens, str(query.device)),
            self.context_lens,
            scale,
            sliding_window,
            logits_soft_cap,
            sinks,
        )


def make_paged_batch(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    shuffle: bool = True,
) -> PagedBatch:
    """Write random keys/values for each sequence into a paged cache.

    Blocks are handed out in a shuffled order (so block tables are not contiguous), unused
    slots hold NaN (so a kernel that reads past a context shows it), and block table
    entries past a sequence's used blocks point at arbitrary valid blocks.
    """
    generator = torch.Generator().manual_seed(seed)
    num_blocks_per_seq = [-(-context_len // block_size) for context_len in context_lens]
    max_blocks_per_seq = max(num_blocks_per_seq, default=0) + 1
    num_blocks = sum(num_blocks_per_seq) + 3
    order = torch.randperm(num_blocks, generator=generator) if shuffle else torch.arange(num_blocks)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, float("nan"))
    value_cache = torch.full(cache_shape, float("nan"))
    block_tables = torch.randint(
        num_blocks, (len(context_lens), max_blocks_per_seq), generator=generator
    )
    keys, values = [], []
    next_block = 0
    for seq, context_len in enumerate(context_lens):
        num_seq_blocks = num_blocks_per_seq[seq]
        block_ids = order[next_block : next_block + num_seq_blocks]
        next_block += num_seq_blocks
        block_tables[seq, :num_seq_blocks] = block_ids
        seq_keys = torch.randn(context_len, num_kv_heads, head_dim, generator=generator)
        seq_values = torch.randn(context_len, num_kv_heads, head_dim, generator=generator)
        positions = torch.arange(context_len)
        key_cache[block_ids[positions // block_size], positions % block_size] = seq_keys
        value_cache[block_ids[positions // block_size], positions % block_size] = seq_values
        keys.append(seq_keys.to(dtype=dtype, device=device))
        values.append(seq_values.to(dtype=dtype, device=device))
    return PagedBatch(
        keys=keys,
        values=values,
        key_cache=key_cache.to(dtype=dtype, device=device),
        value_cache=value_cache.to(dtype=dtype, device=device),
        block_tables=block_tables.to(dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
    )


def serial_and_parallel(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """run() on one intra-op thread, then on several (at least 2); the thread count is put
    back after."""
    num_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = run()
        torch.set_num_threads(max(2, num_threads))
        parallel = run()
    finally:
        torch.set_num_threads(num_threads)
    return serial, parallel


def random_queries(
    num_tokens: int,
    num_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 1,
) -> torch.Tensor:
    """Random queries, generated on the CPU so every device sees the same numbers."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=generator)
    return query.to(dtype=dtype, device=device)


def cu_lens(lens: list[int], device: str = "cpu") -> torch.Tensor:
    """Prefix sums [0, l0, l0+l1, ...] as int32."""
    sums = [0]
    for length in lens:
        sums.append(sums[-1] + length)
    return torch.tensor(sums, dtype=torch.int32, device=device)


def dense_causal_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Textbook attention in float64 for one sequence's chunk over contiguous keys/values.

    Query row i sits at position context_len - query_len + i and sees the keys up to its own
    position (its last sliding_window ones with a window); scaled scores s become
    cap * tanh(s / cap) with a soft cap; head h's sink is one more softmax column, without a
    value. Returns float64.
    """
    # query: [query_len, num_heads, head_dim]; keys, values: [context_len, num_kv_heads, head_dim]
    query_len, num_heads, _ = query.shape
    context_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    keys = keys.double().repeat_interleave(group, dim=1)
    values = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.double(), keys) * scale
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    query_positions = torch.arange(context_len - query_len, context_len, device=query.device)
    key_positions = torch.arange(context_len, device=query.device)
    is_hidden = key_positions[None, :] > query_positions[:, None]
    if sliding_window is not None:
        is_hidden |= key_positions[None, :] <= query_positions[:, None] - sliding_window
    scores[:, is_hidden] = float("-inf")
    if sinks is not None:  # [heads, query_len, context_len + 1], the sink's column last
        sink_column = sinks.double().view(num_heads, 1, 1).expand(num_heads, query_len, 1)
        probs = torch.cat([scores, sink_column], dim=-1).softmax(dim=-1)[..., :-1]
    else:
        probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def dense_batch_attention(
    batch: PagedBatch,
    query: torch.Tensor,
    query_lens: list[int],
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """dense_causal_attention for every sequence of a batch, rows concatenated (float64)."""
    # query: [sum(query_lens), num_heads, head_dim], sequence by sequence
    outputs, start = [], 0
    for seq, query_len in enumerate(query_lens):
        chunk = query[start : start + query_len]
        outputs.append(
            dense_causal_attention(
                chunk,
                batch.keys[seq],
                batch.values[seq],
                scale,
                sliding_window,
                logits_soft_cap,
                sinks,
            )
        )
        start += query_len
    return torch.cat(outputs)


def drop_blocks_outside_windows(
    batch: PagedBatch, query_lens: list[int], sliding_window: int
) -> PagedBatch:
    """The batch with every block table entry wholly before its chunk's first window pointed
    at one block of NaN (what a sequence's freed blocks may hold): a kernel that reads there
    shows it."""
    num_blocks, block_size = batch.key_cache.shape[:2]
    used = {
        block_id
        for seq, context_len in enumerate(batch.context_lens.tolist())
        for block_id in batch.block_tables[seq, : -(-context_len // block_size)].tolist()
    }
    # make_paged_batch leaves spare blocks: the first one stands for the freed blocks
    nan_block = min(set(range(num_blocks)) - used)
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    key_cache[nan_block] = float("nan")
    value_cache[nan_block] = float("nan")
    tables = batch.block_tables.clone()
    for seq, (context_len, query_len) in enumerate(
        zip(batch.context_lens.tolist(), query_lens, strict=True)
    ):
        first_key = max(0, context_len - query_len - sliding_window + 1)
        tables[seq, : first_key // block_size] = nan_block
    return PagedBatch(batch.keys, batch.values, key_cache, value_cache, tables, batch.context_lens)


def random_blocks(name: str, rows: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """Random block bytes whose float16 scales are finite and small (the rest is any bits)."""
    fmt = reference_quantized.FORMATS[name]
    rng = np.random.default_rng(seed)
    num = in_features // fmt.block_size
    blocks = rng.integers(0, 256, size=(rows, num, fmt.block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal((rows, num, 2)) * 0.01).astype(np.float16).view(np.uint8)
    if name in ("Q8_0", "Q4_0"):
        blocks[..., 0:2] = scales[..., 0:2]
    elif name in ("Q4_1", "Q4_K", "Q5_K"):  # d and m (or dmin)
        blocks[..., 0:4] = scales.reshape(rows, num, 4)
    elif name == "Q4_Z":  # d, a zero point 0..15, a zero byte
        blocks[..., 0:2] = scales[..., 0:2]
        blocks[..., 2] = rng.integers(0, 16, size=(rows, num), dtype=np.uint8)
        blocks[..., 3] = 0
    else:  # Q6_K: d last
        blocks[..., 208:210] = scales[..., 0:2]
    return torch.from_numpy(blocks.reshape(rows, -1))
