"""Latent attention over the paged MLA cache (quire.kernels.reference_mla) against dense
multi-query attention over each sequence's latents, in shuffled blocks; and the latent write."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import reference_mla

BLOCK_SIZE = 4
LORA, ROPE = 24, 8  # the latent and the rotary key: 32 values per cached token
HEADS = 3


def dense(query: torch.Tensor, latents: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal MQA of the last len(query) positions: keys the whole latents, values their
    first LORA values; query [q, heads, D], latents [context, D] -> [q, heads, LORA]."""
    q_len, context = query.shape[0], latents.shape[0]
    scores = torch.einsum("qhd,kd->hqk", query.double(), latents.double()) * scale
    positions = torch.arange(context - q_len, context)
    hidden = torch.arange(context)[None, :] > positions[:, None]
    probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("hqk,kv->qhv", probs, latents[:, :LORA].double()).float()


def paged(
    context_lens: list[int], seed: int
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Each sequence's latents, a cache holding them in shuffled blocks (the rest NaN) and the
    block tables (padded with a real block id)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    cache = torch.full((num_blocks, BLOCK_SIZE, 1, LORA + ROPE), float("nan"))
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, latents = [], []
    for n, used in zip(context_lens, blocks_per_seq, strict=True):
        table = [order.pop() for _ in range(used)]
        seq = torch.randn(n, LORA + ROPE, generator=generator)
        for p in range(n):
            cache[table[p // BLOCK_SIZE], p % BLOCK_SIZE, 0] = seq[p]
        tables.append(table + [table[0]] * (max(blocks_per_seq) - used))
        latents.append(seq)
    return latents, cache, torch.tensor(tables, dtype=torch.int32)


@pytest.mark.parametrize(
    ("context_lens", "query_lens"),
    [
        ([1, 5, 9, 16], [1, 1, 1, 1]),  # decode only
        ([7, 12, 33], [7, 4, 33]),  # whole prompts and a chunk after a cached prefix
        ([13, 3, 20, 8], [1, 3, 5, 1]),  # chunks and decodes in one batch
        ([6, 9], [0, 2]),  # a sequence with no new tokens this step
    ],
)
def test_paged_matches_dense(context_lens: list[int], query_lens: list[int]) -> None:
    latents, cache, tables = paged(context_lens, seed=len(context_lens))
    query = torch.randn(
        sum(query_lens), HEADS, LORA + ROPE, generator=torch.Generator().manual_seed(1)
    )
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    scale = 0.2
    got = reference_mla.paged_mla_attention(
        query, cache, tables, cu, torch.tensor(context_lens, dtype=torch.int32), LORA, scale
    )
    assert got.shape == (sum(query_lens), HEADS, LORA)
    for s, (seq, q) in enumerate(zip(latents, query_lens, strict=True)):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        if q:
            torch.testing.assert_close(got[rows], dense(query[rows], seq, scale))


def test_half_precision_computes_in_float32_and_returns_the_query_dtype() -> None:
    latents, cache, tables = paged([10, 3], seed=5)
    query = torch.randn(4, HEADS, LORA + ROPE, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 1, 4], dtype=torch.int32)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    half = reference_mla.paged_mla_attention(
        query.bfloat16(), cache.bfloat16(), tables, cu, lens, LORA, 0.3
    )
    assert half.dtype == torch.bfloat16
    want = torch.cat([dense(query[:1], latents[0], 0.3), dense(query[1:], latents[1], 0.3)])
    torch.testing.assert_close(half.float(), want, atol=0.05, rtol=0.05)


def test_write_scatters_each_token_to_its_slot() -> None:
    cache = torch.zeros(3, BLOCK_SIZE, 1, LORA + ROPE)
    latent = torch.randn(3, LORA + ROPE)
    slots = torch.tensor([9, 0, 7])
    reference_mla.write_latent_cache(latent, cache, slots)
    flat = cache.view(-1, LORA + ROPE)
    assert torch.equal(flat[slots], latent)
    assert int((flat.abs().sum(-1) > 0).sum()) == 3
    with pytest.raises(ValueError, match="outside"):
        reference_mla.write_latent_cache(latent, cache, torch.tensor([1, 2, 12]))
    with pytest.raises(ValueError, match="latent must be"):
        reference_mla.write_latent_cache(latent[:, :LORA], cache, slots)


def test_misuse_is_refused() -> None:
    _, cache, tables = paged([5], seed=3)
    query = torch.randn(1, HEADS, LORA + ROPE)
    cu, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="latent_cache must be"):
        reference_mla.paged_mla_attention(query, cache[:, :, 0], tables, cu, lens, LORA, 1.0)
    with pytest.raises(ValueError, match="value_dim"):
        reference_mla.paged_mla_attention(query, cache, tables, cu, lens, LORA + ROPE + 1, 1.0)
    with pytest.raises(ValueError, match="capacity"):
        reference_mla.paged_mla_attention(query, cache, tables, cu, lens + 8, LORA, 1.0)
    with pytest.raises(ValueError, match="block ids"):
        reference_mla.paged_mla_attention(query, cache, tables + 100, cu, lens, LORA, 1.0)
