"""PagedKVCache: the physical KV blocks of every layer, and the one way blocks move as bytes.

The model reads and writes these tensors through slot mappings and block tables; everything
else that moves a block's KV goes through two methods here:

- `read_blocks(block_ids)` gathers whole blocks into one contiguous buffer on the host,
  `[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]` in the cache's dtype,
  so each block is one contiguous span (every layer's keys, then its values);
- `write_blocks(block_ids, buffer)` scatters such a buffer into the given blocks.

The interface is about block ids and bytes, not about why they move: swapping preempted
sequences to host memory (quire.engine.swap) uses it today; pulling blocks from a peer
executor can send the same buffers. `copy_blocks` (copy-on-write) stays on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import quire.kernels as kernels
from quire.model.attention import KVCache
from quire.model.model_config import ModelConfig


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values."""
    elem = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * elem


class PagedKVCache:
    """Every layer's key and value blocks: `[num_blocks, block_size, num_kv_heads, head_dim]`."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # Zeroed, not empty: never-written slots must not hold NaNs a masked kernel could touch.
        self.layers: list[KVCache] = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(config.num_layers)
        ]
        # One block in a host buffer: [num_layers, 2, block_size, num_kv_heads, head_dim].
        self.block_shape = (config.num_layers, 2, *shape[1:])
        self.bytes_per_block = kv_bytes_per_block(config, block_size, dtype)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy whole blocks on the device, `(src, dst)` pairs (copy-on-write)."""
        if not copies:
            return
        mapping = torch.tensor(copies, dtype=torch.int64, device=self.device)
        kernels.copy_blocks([k for k, _ in self.layers], [v for _, v in self.layers], mapping)

    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """The KV of `block_ids`, in that order, as one contiguous host buffer.

        Returns `[len(block_ids), num_layers, 2, block_size, num_kv_heads, head_dim]` on the
        CPU (pinned when the cache is on CUDA); row i is block_ids[i]'s bytes, bit for bit.
        """
        self._check_ids(block_ids)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        # gathered: [n, num_layers, 2, block_size, num_kv_heads, head_dim] on the device,
        # each layer's rows selected straight into it (no per-layer temporaries to stack)
        gathered = torch.empty(
            (len(block_ids), *self.block_shape), dtype=self.dtype, device=self.device
        )
        for layer, (k, v) in enumerate(self.layers):
            torch.index_select(k, 0, ids, out=gathered[:, layer, 0])
            torch.index_select(v, 0, ids, out=gathered[:, layer, 1])
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
        for layer, (k, v) in enumerate(self.layers):
            k.index_copy_(0, ids, data[:, layer, 0])
            v.index_copy_(0, ids, data[:, layer, 1])

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise ValueError(f"block_ids: {bad[:8]} outside the pool's {self.num_blocks} blocks")
