"""PagedKVCache: the physical KV blocks of every layer, and the one way blocks move as bytes.

The model reads and writes these tensors through slot mappings and block tables; everything
else that moves a block's KV goes through two methods here:

- `read_blocks(block_ids)` gathers whole blocks into one contiguous buffer on the host,
  `[num_blocks, num_slots, num_planes, block_size, num_kv_heads, head_dim]` in the cache's
  dtype, so each block is one contiguous span (every slot's keys, then its values; an MLA
  layer's one latent plane);
- `write_blocks(block_ids, buffer)` scatters such a buffer into the given blocks.

The interface is about block ids and bytes, not about why they move: swapping preempted
sequences to host memory (quire.engine.swap) uses it today; pulling blocks from a peer
executor can send the same buffers. `copy_blocks` (copy-on-write) stays on the device.

A block holds `num_slots` layers' KV: every layer with the plain layout; a hybrid model's KV
groups (quire.model.attention_layout.KVGroups) share the slots, each layer reading and
writing its slot of its own group's blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import quire.kernels as kernels
from quire.model.attention import KVCache
from quire.model.attention_layout import KVGroups
from quire.model.huge_pages import zeros as huge_page_zeros
from quire.model.model_config import ModelConfig


@dataclass(frozen=True)
class LayerCacheShape:
    """What one layer caches per token: `num_planes` tensors of `[num_heads, head_dim]`."""

    num_planes: int  # 2: a key and a value; 1: MLA's latent (its keys and values are maps of it)
    num_heads: int
    head_dim: int

    @property
    def elements_per_token(self) -> int:
        return self.num_planes * self.num_heads * self.head_dim


def layer_cache_shape(config: ModelConfig) -> LayerCacheShape:
    """A Llama-style layer caches K and V per KV head; an MLA layer one latent, the rotary key
    after it (kv_lora_rank + qk_rope_head_dim values: 576 in DeepSeek-V2-Lite)."""
    if config.mla is not None:
        return LayerCacheShape(1, 1, config.mla.latent_dim)
    return LayerCacheShape(2, config.num_kv_heads, config.head_dim)


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes one token's KV takes across all layers: what the pool's capacity is counted in."""
    elem = torch.empty(0, dtype=dtype).element_size()
    return config.num_layers * layer_cache_shape(config).elements_per_token * elem


def kv_bytes_per_block(
    config: ModelConfig, block_size: int, dtype: torch.dtype, groups: KVGroups | None = None
) -> int:
    """Bytes one block takes: every layer's keys and values, or `groups.num_slots` layers'."""
    if groups is None or not groups.is_grouped:
        return block_size * kv_bytes_per_token(config, dtype)
    elem = torch.empty(0, dtype=dtype).element_size()
    return block_size * groups.num_slots * layer_cache_shape(config).elements_per_token * elem


class PagedKVCache:
    """Every slot's blocks, per plane (key and value; MLA: the latent):
    `[num_blocks, block_size, num_kv_heads, head_dim]` each."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        groups: KVGroups | None = None,
        huge_pages: bool = False,
    ) -> None:
        """`huge_pages`: the planes in transparent huge pages where the CPU's kernel offers
        them (quire.model.huge_pages)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.groups = groups if groups is not None else KVGroups.single(config.num_layers)
        layer = layer_cache_shape(config)
        shape = (num_blocks, block_size, layer.num_heads, layer.head_dim)
        # Zeroed, not empty: never-written slots must not hold NaNs a masked kernel could touch.
        zeros = functools.partial(huge_page_zeros if huge_pages else torch.zeros, shape)
        self.slots: list[KVCache] = [
            tuple(zeros(dtype=dtype, device=device) for _ in range(layer.num_planes))
            for _ in range(self.groups.num_slots)
        ]
        # Per layer, the slot it reads and writes (through its group's block tables).
        self.layers: list[KVCache] = [self.slots[slot] for slot in self.groups.layer_slots]
        # One block in a host buffer: [num_slots, num_planes, block_size, heads, head_dim].
        self.block_shape = (self.groups.num_slots, layer.num_planes, *shape[1:])
        self.bytes_per_block = kv_bytes_per_block(config, block_size, dtype, self.groups)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy whole blocks on the device, `(src, dst)` pairs (copy-on-write)."""
        if not copies:
            return
        mapping = torch.tensor(copies, dtype=torch.int64, device=self.device)
        # An MLA layer's one plane goes as its key and its value: copied twice, and copies
        # are rare (the partial block of an n > 1 fork).
        keys, values = [planes[0] for planes in self.slots], [p[-1] for p in self.slots]
        kernels.copy_blocks(keys, values, mapping)

    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """The KV of `block_ids`, in that order, as one contiguous host buffer.

        Returns `[len(block_ids), num_slots, num_planes, block_size, heads, head_dim]` on the
        CPU (pinned when the cache is on CUDA); row i is block_ids[i]'s bytes, bit for bit.
        """
        self._check_ids(block_ids)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        # gathered: [n, num_slots, num_planes, block_size, heads, head_dim] on the device,
        # each slot's rows selected straight into it (no per-slot temporaries to stack)
        gathered = torch.empty(
            (len(block_ids), *self.block_shape), dtype=self.dtype, device=self.device
        )
        for layer, planes in enumerate(self.slots):
            for plane, cache in enumerate(planes):
                torch.index_select(cache, 0, ids, out=gathered[:, layer, plane])
        if self.device.type == "cpu":
            return gathered
        host = torch.empty(gathered.shape, dtype=self.dtype, pin_memory=True)
        host.copy_(gathered)
        return host

    def write_blocks(self, block_ids: Sequence[int], buffer: torch.Tensor) -> None:
        """Write `buffer` (as `read_blocks` returns it, on any device) into `block_ids`."""
        self._check_ids(block_ids)
        expected = (len(block_ids), *self.block_shape)
        if tuple(buffer.shape) != expected or buffer.dtype != self.dtype:
            raise ValueError(
                f"buffer: expected {list(expected)} {self.dtype}, "
                f"got {list(buffer.shape)} {buffer.dtype}"
            )
        if not block_ids:
            return
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        data = buffer.to(self.device, non_blocking=buffer.is_pinned())
        for layer, planes in enumerate(self.slots):
            for plane, cache in enumerate(planes):
                cache.index_copy_(0, ids, data[:, layer, plane])

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise ValueError(f"block_ids: {bad[:8]} outside the pool's {self.num_blocks} blocks")
