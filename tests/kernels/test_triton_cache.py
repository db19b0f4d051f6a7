"""Triton cache writes and block copies against the torch reference."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import reference, triton_cache
from tests.kernels.helpers import random_queries


def _random_cache(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)


def _random_slots(num_tokens: int, num_slots: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randperm(num_slots, generator=generator)[:num_tokens].to(device)


def _check_write(key, value, cache_shape, dtype: torch.dtype, device: str) -> None:
    num_slots = cache_shape[0] * cache_shape[1]
    slot_mapping = _random_slots(key.shape[0], num_slots, device)
    key_cache = _random_cache(cache_shape, dtype, device, seed=5)
    value_cache = _random_cache(cache_shape, dtype, device, seed=6)
    expected_keys, expected_values = key_cache.clone(), value_cache.clone()

    triton_cache.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    reference.write_kv_cache(key, value, expected_keys, expected_values, slot_mapping)

    assert torch.equal(key_cache, expected_keys)
    assert torch.equal(value_cache, expected_values)


def _check_copy(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    expected_keys = [cache.clone() for cache in key_caches]
    expected_values = [cache.clone() for cache in value_caches]

    triton_cache.copy_blocks(key_caches, value_caches, block_mapping)
    reference.copy_blocks(expected_keys, expected_values, block_mapping)

    for cache, expected in zip(
        key_caches + value_caches, expected_keys + expected_values, strict=True
    ):
        assert torch.equal(cache, expected)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("num_kv_heads", [1, 3])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_write_kv_cache_matches_reference(
    device: str, head_dim: int, num_kv_heads: int, block_size: int
) -> None:
    key = random_queries(21, num_kv_heads, head_dim, device=device, seed=3)
    value = random_queries(21, num_kv_heads, head_dim, device=device, seed=4)
    _check_write(key, value, (6, block_size, num_kv_heads, head_dim), torch.float32, device)


def test_write_kv_cache_reads_strided_key_and_value(device: str) -> None:
    # Keys and values as views into a fused qkv projection: [tokens, q + k + v heads, dim].
    qkv = random_queries(9, 4 + 2 + 2, 32, device=device)
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    _check_write(key, value, (4, 16, 2, 32), torch.float32, device)


@pytest.mark.parametrize("block_size", [8, 16])
def test_copy_blocks_matches_reference(device: str, block_size: int) -> None:
    num_layers, shape = 3, (7, block_size, 2, 32)
    key_caches = [_random_cache(shape, torch.float32, device, seed=i) for i in range(num_layers)]
    value_caches = [_random_cache(shape, torch.float32, device, seed=10 + i) for i in range(3)]
    block_mapping = torch.tensor([[1, 4], [1, 0], [6, 5]], device=device)
    _check_copy(key_caches, value_caches, block_mapping)


def test_copy_blocks_rejects_non_contiguous_caches(device: str) -> None:
    cache = _random_cache((4, 32, 1, 32), torch.float32, device, seed=0)[:, ::2]
    block_mapping = torch.tensor([[0, 1]], device=device)
    with pytest.raises(ValueError, match="contiguous"):
        triton_cache.copy_blocks([cache], [cache.clone()], block_mapping)


def test_write_kv_cache_rejects_int32_slots(device: str) -> None:
    key = random_queries(2, 1, 32, device=device)
    cache = torch.zeros(2, 16, 1, 32, device=device)
    slot_mapping = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="slot_mapping must be torch.int64"):
        triton_cache.write_kv_cache(key, key, cache, cache.clone(), slot_mapping)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_gpu(device: str, dtype: torch.dtype) -> None:
    key = random_queries(300, 8, 128, dtype=dtype, device=device, seed=3)
    value = random_queries(300, 8, 128, dtype=dtype, device=device, seed=4)
    _check_write(key, value, (64, 16, 8, 128), dtype, device)

    shape = (64, 16, 8, 128)
    key_caches = [_random_cache(shape, dtype, device, seed=i) for i in range(4)]
    value_caches = [_random_cache(shape, dtype, device, seed=10 + i) for i in range(4)]
    block_mapping = torch.tensor([[3, 40], [3, 41], [17, 2]], device=device)
    _check_copy(key_caches, value_caches, block_mapping)
