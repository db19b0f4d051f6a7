"""How many bytes a loaded model holds in tensors (weights in any layout, quantized blocks,
rotary tables): what `--model` costs in memory before the KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def reachable_tensors(root: Any) -> Iterator[torch.Tensor]:
    """Every tensor reachable from `root` through attributes, lists, tuples and dicts, each
    object once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
        elif hasattr(obj, "__slots__"):
            stack.extend(getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s))


def resident_bytes(root: Any) -> int:
    """Bytes of every tensor storage reachable from `root`, each storage counted once (a tied
    embedding and LM head share one)."""
    storages: dict[int, int] = {}
    for tensor in reachable_tensors(root):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
