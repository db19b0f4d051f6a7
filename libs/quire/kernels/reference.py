"""Paged attention, the KV cache write and block copies in plain torch (signatures'
PagedAttention, KVCacheWrite and BlockCopy): the oracle of the C++ and Triton kernels and the
fallback where they do not run.

Unlike the C++ and Triton wrappers these functions also check index values (slots, block ids,
lengths), which costs a device sync on CUDA; on the CPU it is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quire.kernels import checks


def _check_block_ids(block_tables: torch.Tensor, num_blocks: int) -> None:
    if block_tables.numel() and bool(((block_tables < 0) | (block_tables >= num_blocks)).any()):
        raise ValueError(f"block_tables holds block ids outside [0, {num_blocks})")


def _check_context_lens(
    context_lens: torch.Tensor,
    min_lens: torch.Tensor | int,
    min_lens_name: str,
    max_blocks_per_seq: int,
    block_size: int,
) -> None:
    capacity = max_blocks_per_seq * block_size
    if bool((context_lens < min_lens).any()):
        raise ValueError(f"context_lens must be >= {min_lens_name}")
    if bool((context_lens > capacity).any()):
        raise ValueError(
            f"context_lens exceed the block table's capacity of {max_blocks_per_seq} "
            f"blocks x {block_size} slots = {capacity} tokens"
        )


def _gather_positions(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    # block_tables: [num_seqs, max_blocks_per_seq]; positions: [num_seqs, num_positions]
    # Returns keys, values: [num_seqs, num_positions, num_kv_heads, head_dim] float32.
    block_size = key_cache.shape[1]
    block_ids = block_tables.long().gather(1, positions // block_size)
    offsets = positions % block_size
    return key_cache[block_ids, offsets].float(), value_cache[block_ids, offsets].float()


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Also checks that every slot is inside the cache."""
    cache = checks.check_write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    num_slots = cache.num_blocks * cache.block_size
    if slot_mapping.numel() and bool(((slot_mapping < 0) | (slot_mapping >= num_slots)).any()):
        raise ValueError(f"slot_mapping holds slots outside [0, {num_slots})")
    block_ids = slot_mapping // cache.block_size
    offsets = slot_mapping % cache.block_size
    # Advanced-index assignment is an in-place index_put_, whatever the cache strides.
    key_cache[block_ids, offsets] = key
    value_cache[block_ids, offsets] = value


@dataclass(frozen=True)
class _DecodeGroup:
    """Sequences of similar length, padded to the group's longest: what to gather and zero."""

    rows: torch.Tensor | None  # row indices into the batch (None: the whole batch)
    block_ids: torch.Tensor  # [num_seqs * num_blocks_used] int64: the blocks to gather
    past_end: torch.Tensor  # gathered block rows past their sequence's last block
    # gathered slot rows outside their sequence's keys in its first and last block (before
    # its window, past its context)
    stale: torch.Tensor
    is_valid: torch.Tensor  # [num_seqs, max_len] bool
    max_len: int


@dataclass(frozen=True)
class DecodePlan:
    """A decode batch's gathers, worked out once for every layer of a step with one window.

    It depends only on the block tables, the context lengths and the window, which every
    layer of a kind shares, so the model builds it once per step and window
    (`AttentionMetadata.decode_plan`); the inputs are checked when it is built.
    """

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    block_size: int
    sliding_window: int | None
    groups: tuple[_DecodeGroup, ...]


def plan_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_blocks: int,
    block_size: int,
    sliding_window: int | None = None,
) -> DecodePlan:
    """Check a decode batch's block ids and lengths, then plan its gathers: each sequence's
    blocks from the one holding its window's first position (its first block without a
    window) to its last."""
    # block_tables: [num_seqs, max_blocks_per_seq] int32; context_lens: [num_seqs] int32
    checks.check_window_and_cap(sliding_window, None)
    _check_block_ids(block_tables, num_blocks)
    _check_context_lens(context_lens, 1, "1", block_tables.shape[1], block_size)
    groups: tuple[_DecodeGroup, ...] = ()
    if context_lens.numel():
        lens = context_lens.long()
        starts = (lens - sliding_window).clamp(min=0) if sliding_window else torch.zeros_like(lens)
        first_blocks = starts // block_size
        num_seq_blocks = (lens + block_size - 1) // block_size - first_blocks
        # Sequences are padded to the longest one in their group, so very different lengths
        # are split into groups of similar length (a few calls, longest first).
        rows = _length_groups(num_seq_blocks)
        if len(rows) == 1:
            groups = (_plan_group(None, block_tables, lens, starts, block_size),)
        else:
            groups = tuple(
                _plan_group(r, block_tables[r], lens[r], starts[r], block_size) for r in rows
            )
    return DecodePlan(block_tables, context_lens, block_size, sliding_window, groups)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """Sequences are padded to the longest of their group (`plan_decode`) and attend in
    batched SDPA calls (masked matmuls with a soft cap or sinks). A `plan` from `plan_decode`
    for these very block tables, lengths and window spares every layer the same index work."""
    shape = checks.check_decode(query, key_cache, value_cache, block_tables, context_lens)
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    if plan is None:
        plan = plan_decode(
            block_tables,
            context_lens,
            shape.cache.num_blocks,
            shape.cache.block_size,
            sliding_window,
        )
    elif not (
        plan.block_tables is block_tables
        and plan.context_lens is context_lens
        and plan.block_size == shape.cache.block_size
        and plan.sliding_window == sliding_window
    ):
        raise ValueError(
            "the decode plan was made for other block tables, context lengths or window"
        )
    if query.shape[0] == 0:
        return query.new_empty(query.shape)
    group_size = shape.query_group_size

    def attend(q: torch.Tensor, group: _DecodeGroup) -> torch.Tensor:
        return _decode_padded(
            q, key_cache, value_cache, group, scale, group_size, logits_soft_cap, sinks
        )

    if len(plan.groups) == 1:
        return attend(query, plan.groups[0])
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    for group in plan.groups:
        assert group.rows is not None
        out[group.rows] = attend(query[group.rows], group)
    return out


# A group's padded work (members x its longest context) may be at most this many times the
# blocks it really attends to before the next shorter sequence starts a group of its own.
_MAX_PADDING_RATIO = 1.5
_MAX_GROUPS = 4  # each group is a call of its own: past this, the last one takes the rest


def _length_groups(num_blocks: torch.Tensor) -> list[torch.Tensor]:
    """Row indices of sequences with similar block counts (`num_blocks`: [num_seqs], the
    blocks each one reads), longest first."""
    order = torch.argsort(num_blocks, descending=True)
    counts = num_blocks[order].tolist()
    groups: list[torch.Tensor] = []
    start, total = 0, 0
    for i, n in enumerate(counts):
        # counts[start] is the group's longest: would taking this one pad too much?
        padded = counts[start] * (i - start + 1)
        if (
            i > start
            and len(groups) < _MAX_GROUPS - 1
            and padded > _MAX_PADDING_RATIO * (total + n)
        ):
            groups.append(order[start:i])
            start, total = i, 0
        total += n
    groups.append(order[start:])
    return groups


def _plan_group(
    rows: torch.Tensor | None,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    block_size: int,
) -> _DecodeGroup:
    # Whole blocks are gathered, from each sequence's first block to read (the one holding
    # position starts[s]) on, as many as the group's longest reads: index_select copies one
    # contiguous block per row, far cheaper than a per-position gather. Unused slots may hold
    # anything, NaN included, and 0 * NaN is NaN even under a -inf mask, so the slots outside
    # each sequence's keys are zeroed in the copy: whole blocks past its last block (index_fill_
    # by block), the head of its first block and the tail of its last block (under
    # block_size slots each).
    # lens, starts: [num_seqs] int64: keys at positions starts[s] .. lens[s] - 1
    device = lens.device
    first_blocks = starts // block_size
    seq_blocks = (lens + block_size - 1) // block_size - first_blocks  # blocks read
    num_blocks_used = int(seq_blocks.max())
    max_len = num_blocks_used * block_size
    block_idx = torch.arange(num_blocks_used, device=device)
    # Columns past a sequence's last block are clamped into the table; they are past_end.
    columns = (first_blocks[:, None] + block_idx[None, :]).clamp(max=block_tables.shape[1] - 1)
    slot = torch.arange(block_size, device=device)[None, :]
    last_block_pos = (seq_blocks - 1)[:, None] * block_size + slot
    seq_start = torch.arange(lens.shape[0], device=device)[:, None] * max_len
    # gathered slot j of sequence s holds position first_blocks[s] * block_size + j
    rel_lens = lens - first_blocks * block_size
    rel_starts = starts - first_blocks * block_size
    tail = (seq_start + last_block_pos)[last_block_pos >= rel_lens[:, None]]
    head = (seq_start + slot)[slot < rel_starts[:, None]]
    gathered = torch.arange(max_len, device=device)[None, :]
    return _DecodeGroup(
        rows=rows,
        block_ids=block_tables.long().gather(1, columns).reshape(-1),
        past_end=(block_idx[None, :] >= seq_blocks[:, None]).reshape(-1).nonzero().squeeze(1),
        stale=torch.cat([head, tail]),
        is_valid=(gathered < rel_lens[:, None]) & (gathered >= rel_starts[:, None]),
        max_len=max_len,
    )


def _softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim of `scores` `[..., keys]`, with each row's sink logit (`sinks`
    broadcasts to `scores.shape[:-1]`: a row's head's) in its denominator and no value: the
    sink's own weight is dropped."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink_column = sinks.unsqueeze(-1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]


def _explicit_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    is_visible: torch.Tensor,
    scale: float,
    logits_soft_cap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """softmax(cap * tanh(q k^T * scale / cap), masked, with sinks) v, as transformers' eager
    attention."""
    # q: [..., heads, rows, head_dim]; keys, values: [..., heads or 1, keys, head_dim];
    # is_visible broadcasts to [..., heads, rows, keys]; sinks to [..., heads, rows]
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    scores = scores.masked_fill(~is_visible, float("-inf"))
    return torch.matmul(_softmax_with_sinks(scores, sinks), values)


def _decode_padded(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: _DecodeGroup,
    scale: float,
    query_group_size: int,
    logits_soft_cap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Decode attention of one planned group, every sequence padded to its longest."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]

    def gather(cache: torch.Tensor) -> torch.Tensor:
        # returns [num_seqs, num_kv_heads, max_len, head_dim] float32 (a strided view)
        rows = cache.index_select(0, group.block_ids)
        rows = rows.view(rows.shape[0], -1)
        rows = rows.float() if rows.dtype != torch.float32 else rows
        if group.past_end.numel():
            rows.index_fill_(0, group.past_end, 0.0)
        slots = rows.view(num_seqs * group.max_len, num_kv_heads * head_dim)
        if group.stale.numel():
            slots.index_fill_(0, group.stale, 0.0)
        return slots.view(num_seqs, group.max_len, num_kv_heads, head_dim).transpose(1, 2)

    keys, values = gather(key_cache), gather(value_cache)
    # q: [num_seqs, num_kv_heads, group, head_dim]: the query heads that share a kv head
    # attend to the same keys, so each kv head is one batched SDPA call over its group.
    q = query.float().reshape(num_seqs, num_kv_heads, query_group_size, head_dim)
    mask = group.is_valid[:, None, None, :]
    if logits_soft_cap is not None or sinks is not None:
        # keys, values: [num_seqs, num_kv_heads, 1, max_len, head_dim] against q's groups
        # [num_seqs, num_kv_heads, group, 1, head_dim], so the sinks line up per query head
        out = _explicit_attention(
            q.unsqueeze(3),
            keys.unsqueeze(2),
            values.unsqueeze(2),
            mask.unsqueeze(3),
            scale,
            logits_soft_cap,
            None if sinks is None else sinks.view(num_kv_heads, query_group_size, 1),
        ).squeeze(3)
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-token chunks take the batched decode path together; longer chunks loop per
    sequence, one masked matmul per kv head over the keys from the chunk's first window on."""
    shape = checks.check_prefill(
        query, key_cache, value_cache, block_tables, cu_query_lens, context_lens
    )
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    num_tokens, num_heads, head_dim = query.shape
    query_lens = cu_query_lens.diff()
    if int(cu_query_lens[0]) != 0 or int(cu_query_lens[-1]) != num_tokens:
        raise ValueError(f"cu_query_lens must run from 0 to num_tokens ({num_tokens})")
    if bool((query_lens < 0).any()):
        raise ValueError("cu_query_lens must be non-decreasing")
    _check_block_ids(block_tables, shape.cache.num_blocks)
    _check_context_lens(
        context_lens,
        query_lens,
        "the chunk lengths in cu_query_lens",
        shape.max_blocks_per_seq,
        shape.cache.block_size,
    )
    num_kv_heads = shape.cache.num_kv_heads
    group = shape.query_group_size

    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    # Single-token queries (decodes riding along with prefill chunks) take the batched
    # decode path in one call; only real chunks loop per sequence.
    is_single = query_lens == 1
    if bool(is_single.any()):
        single = is_single.nonzero().squeeze(1)
        rows = cu_query_lens[:-1][single].long()
        out[rows] = paged_decode_attention(
            query[rows],
            key_cache,
            value_cache,
            block_tables[single],
            context_lens[single],
            scale,
            sliding_window,
            logits_soft_cap,
            sinks,
        )
    bounds = cu_query_lens.tolist()
    for seq, context_len in enumerate(context_lens.tolist()):
        start, end = bounds[seq], bounds[seq + 1]
        query_len = end - start
        if query_len <= 1:
            continue
        first_query_pos = context_len - query_len
        # Keys before the chunk's first window are nobody's: they are not gathered.
        first_key = max(0, first_query_pos - sliding_window + 1) if sliding_window else 0
        positions = torch.arange(first_key, context_len, device=query.device)
        num_keys = context_len - first_key
        keys, values = _gather_positions(
            key_cache, value_cache, block_tables[seq : seq + 1], positions[None, :]
        )
        # keys, values: [num_keys, num_kv_heads, head_dim]
        keys, values = keys[0], values[0]
        # q: [num_kv_heads, group * query_len, head_dim]: a group's heads share keys, so
        # they stack as rows of one matmul per kv head.
        q = query[start:end].float().reshape(query_len, num_kv_heads, group, head_dim)
        q = q.permute(1, 2, 0, 3).reshape(num_kv_heads, group * query_len, head_dim)
        scores = torch.matmul(q, keys.permute(1, 2, 0)) * scale
        if logits_soft_cap is not None:
            scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
        # scores: [num_kv_heads, group, query_len, num_keys]
        scores = scores.view(num_kv_heads, group, query_len, num_keys)
        query_positions = torch.arange(first_query_pos, context_len, device=query.device)
        is_hidden = positions[None, :] > query_positions[:, None]
        if sliding_window:
            is_hidden |= positions[None, :] <= query_positions[:, None] - sliding_window
        scores.masked_fill_(is_hidden, float("-inf"))
        # head kv_head * group + g's sink for its rows
        head_sinks = None if sinks is None else sinks.view(num_kv_heads, group, 1)
        probs = _softmax_with_sinks(scores, head_sinks)
        probs = probs.reshape(num_kv_heads, group * query_len, num_keys)
        # seq_out: [num_kv_heads, group * query_len, head_dim]
        seq_out = torch.matmul(probs, values.transpose(0, 1))
        seq_out = seq_out.view(num_kv_heads, group, query_len, head_dim).permute(2, 0, 1, 3)
        out[start:end] = seq_out.reshape(query_len, num_heads, head_dim)
    return out


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Also checks that destinations are distinct and never sources."""
    cache = checks.check_copy_blocks(key_caches, value_caches, block_mapping)
    if cache is None or block_mapping.shape[0] == 0:
        return
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    if bool(((block_mapping < 0) | (block_mapping >= cache.num_blocks)).any()):
        raise ValueError(f"block_mapping holds block ids outside [0, {cache.num_blocks})")
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError("block_mapping destinations must be distinct")
    if bool(torch.isin(dst, src).any()):
        raise ValueError("a block_mapping destination is also a source")
    for layer_cache in (*key_caches, *value_caches):
        layer_cache[dst] = layer_cache[src]
