"""Multi-head latent attention over the paged latent cache, in plain torch: the oracle and, for
now, the only backend.

An MLA layer caches one vector per token, `[kv_lora_rank | k_rope]` (`latent_dim` values), in
blocks `[num_blocks, block_size, 1, latent_dim]`: one plane where a Llama layer has two. With
the key and value up-projections absorbed into the query and the output (quire.model.mla),
attention over that cache is multi-query attention whose every head reads the same single
"head": keys are the whole cached vector, values its first `value_dim` (kv_lora_rank) values.

Block tables, slot mappings and lengths mean what they mean for the paged kernels
(quire.kernels.signatures): a sequence's token at position p sits in block
block_tables[s][p // block_size] at offset p % block_size. Math runs in float32; outputs have
the query's dtype. Index values are checked, as in the torch reference of the other kernels.
"""

from __future__ import annotations

import torch


def _check_cache(latent_cache: torch.Tensor) -> None:
    if latent_cache.dim() != 4 or latent_cache.shape[2] != 1:
        raise ValueError(
            "latent_cache must be [num_blocks, block_size, 1, latent_dim], "
            f"got {list(latent_cache.shape)}"
        )


def write_latent_cache(
    latent: torch.Tensor,  # [num_tokens, latent_dim]: normalized latent, then rotated k_rope
    latent_cache: torch.Tensor,  # [num_blocks, block_size, 1, latent_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, distinct slots
) -> None:
    """Scatter this step's latents into the cache at slot_mapping, in place."""
    _check_cache(latent_cache)
    num_blocks, block_size, _, latent_dim = latent_cache.shape
    if latent.dim() != 2 or latent.shape != (slot_mapping.shape[0], latent_dim):
        raise ValueError(
            f"latent must be [{slot_mapping.shape[0]}, {latent_dim}], got {list(latent.shape)}"
        )
    num_slots = num_blocks * block_size
    if slot_mapping.numel() and bool(((slot_mapping < 0) | (slot_mapping >= num_slots)).any()):
        raise ValueError(f"slot_mapping holds slots outside [0, {num_slots})")
    latent_cache[slot_mapping // block_size, slot_mapping % block_size, 0] = latent


def paged_mla_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, latent_dim]: the chunks back to back
    latent_cache: torch.Tensor,  # [num_blocks, block_size, 1, latent_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32: prefix sums of the chunk lengths
    context_lens: torch.Tensor,  # [num_seqs] int32: cached prefix + chunk
    value_dim: int,  # the leading values of each cached vector that are its value
    scale: float,  # applied to q . k before the softmax
) -> torch.Tensor:  # [num_tokens, num_heads, value_dim]
    """Causal attention of each sequence's chunk of new tokens over its paged latents, already
    written: chunk token i of sequence s sits at position context_lens[s] - q_s + i and attends
    to every position up to its own. Decode rows (q_s = 1) run as one padded batch; longer
    chunks one sequence at a time."""
    _check_cache(latent_cache)
    num_blocks, block_size = latent_cache.shape[:2]
    num_tokens, num_heads, latent_dim = query.shape
    if latent_dim != latent_cache.shape[3] or not 0 < value_dim <= latent_dim:
        raise ValueError(
            f"query's latent_dim {latent_dim} and value_dim {value_dim} do not fit a cache of "
            f"{latent_cache.shape[3]}"
        )
    q_lens = (cu_query_lens[1:] - cu_query_lens[:-1]).tolist()
    starts, lens = cu_query_lens[:-1].tolist(), context_lens.tolist()
    if sum(q_lens) != num_tokens or any(not 0 <= q <= n for q, n in zip(q_lens, lens, strict=True)):
        raise ValueError("cu_query_lens must sum to num_tokens, each chunk within its context")
    max_len = max(lens, default=0)
    if max_len > block_tables.shape[1] * block_size:
        raise ValueError("context_lens exceed the block table's capacity")
    if block_tables.numel() and bool(((block_tables < 0) | (block_tables >= num_blocks)).any()):
        raise ValueError(f"block_tables holds block ids outside [0, {num_blocks})")
    out = query.new_empty((num_tokens, num_heads, value_dim))
    decode = [s for s, q in enumerate(q_lens) if q == 1]
    if decode:
        rows = torch.tensor([starts[s] for s in decode], device=query.device)
        out[rows] = _decode(
            query[rows], latent_cache, block_tables[decode], context_lens[decode], value_dim, scale
        )
    for s, q in enumerate(q_lens):
        if q > 1:
            chunk = slice(starts[s], starts[s] + q)
            out[chunk] = _chunk(
                query[chunk], latent_cache, block_tables[s], lens[s], value_dim, scale
            )
    return out


def _gather(latent_cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Whole blocks, `[..., num_blocks_used * block_size, latent_dim]` float32."""
    rows = latent_cache.index_select(0, blocks.reshape(-1).long())
    return rows.view(*blocks.shape[:-1], -1, latent_cache.shape[3]).float()


def _decode(
    query: torch.Tensor,  # [num_seqs, num_heads, latent_dim]
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    context_lens: torch.Tensor,  # [num_seqs]
    value_dim: int,
    scale: float,
) -> torch.Tensor:
    block_size = latent_cache.shape[1]
    num_used = -(-int(context_lens.max()) // block_size)
    keys = _gather(latent_cache, block_tables[:, :num_used])  # [num_seqs, max_len, latent_dim]
    is_valid = torch.arange(keys.shape[1], device=keys.device)[None, :] < context_lens[:, None]
    # slots past a context may hold anything (a stale block); zeroed, never NaN * 0
    keys = keys.masked_fill(~is_valid[..., None], 0.0)
    scores = torch.einsum("shd,sld->shl", query.float(), keys) * scale
    probs = scores.masked_fill(~is_valid[:, None, :], float("-inf")).softmax(dim=-1)
    return torch.einsum("shl,slv->shv", probs, keys[..., :value_dim]).to(query.dtype)


def _chunk(
    query: torch.Tensor,  # [q_len, num_heads, latent_dim]
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks]
    context_len: int,
    value_dim: int,
    scale: float,
) -> torch.Tensor:
    block_size = latent_cache.shape[1]
    num_used = -(-context_len // block_size)
    keys = _gather(latent_cache, block_table[None, :num_used])[0, :context_len]  # [len, D]
    q_len = query.shape[0]
    positions = torch.arange(context_len - q_len, context_len, device=query.device)
    is_visible = torch.arange(context_len, device=query.device)[None, :] <= positions[:, None]
    scores = torch.einsum("qhd,ld->qhl", query.float(), keys) * scale
    probs = scores.masked_fill(~is_visible[:, None, :], float("-inf")).softmax(dim=-1)
    return torch.einsum("qhl,lv->qhv", probs, keys[:, :value_dim]).to(query.dtype)
