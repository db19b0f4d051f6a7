"""Which layers attend through a sliding window, and the attention variants that come with
layer types, read from a Hugging Face config: Mistral's window over every layer, Qwen2's
`layer_types`, Gemma 2's alternating sliding and global layers with attention logit soft
capping, Gemma 3's sliding_window_pattern; Gemma's query_pre_attn_scalar.

A sliding layer's token at position p attends to positions p - window + 1 .. p (transformers'
`kv_idx > q_idx - sliding_window`); the kernels apply it per layer (quire.kernels.signatures).
When every layer slides, blocks wholly before every window of a sequence are never read again
and the block manager gives them back (`freeable_window`). A hybrid model (Gemma 2/3, gpt-oss)
has global layers that read every block too: its layers are split into KV groups (`KVGroups`),
each with a block table of its own, so the sliding groups' tables give back what the global
groups' keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SLIDING = "sliding_attention"  # the transformers layer type of a windowed layer


@dataclass(frozen=True)
class AttentionLayout:
    """Per-layer attention variants of one model (the defaults: plain global attention)."""

    sliding_window: int | None = None  # the sliding layers' window in tokens; None: none slide
    sliding_layers: tuple[int, ...] = ()  # indices of the layers that attend through it
    logits_soft_cap: float | None = None  # scores -> cap * tanh(score / cap) (Gemma 2)
    query_pre_attn_scalar: float | None = None  # softmax scale scalar**-0.5, not head_dim's

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if bool(self.sliding_layers) != (self.sliding_window is not None):
            raise ValueError("sliding layers need a sliding_window, and a window sliding layers")
        if self.logits_soft_cap is not None and not self.logits_soft_cap > 0:
            raise ValueError(f"attn_logit_softcapping must be > 0, got {self.logits_soft_cap}")
        if self.query_pre_attn_scalar is not None and not self.query_pre_attn_scalar > 0:
            raise ValueError(f"query_pre_attn_scalar must be > 0, got {self.query_pre_attn_scalar}")

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s window, None for a global layer."""
        return self.sliding_window if layer in self.sliding_layers else None

    def freeable_window(self, num_layers: int) -> int | None:
        """The window when every one of the `num_layers` layers slides (a sequence's blocks
        before it are read by no layer again), else None."""
        if self.sliding_window is None or len(set(self.sliding_layers)) < num_layers:
            return None
        return self.sliding_window


def attention_layout_from_hf(hf: Any, *, attention_soft_cap: bool) -> AttentionLayout:
    """The layout a transformers config describes. `attention_soft_cap`: whether the
    architecture applies attn_logit_softcapping (Gemma 2 does; Gemma 3's configs carry the
    field but its attention ignores it)."""
    window = getattr(hf, "sliding_window", None)
    if not window or getattr(hf, "use_sliding_window", True) is False:
        window = None
    num_layers = int(hf.num_hidden_layers)
    layer_types = getattr(hf, "layer_types", None)
    if window is None:
        sliding: tuple[int, ...] = ()
    elif layer_types:
        sliding = tuple(i for i, kind in enumerate(layer_types) if kind == SLIDING)
    else:  # Mistral, Mixtral, Phi-3: a window names every layer's
        sliding = tuple(range(num_layers))
    cap = getattr(hf, "attn_logit_softcapping", None) if attention_soft_cap else None
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    return AttentionLayout(
        sliding_window=int(window) if window is not None and sliding else None,
        sliding_layers=sliding,
        logits_soft_cap=float(cap) if cap else None,
        query_pre_attn_scalar=float(scalar) if scalar else None,
    )


@dataclass(frozen=True)
class KVGroups:
    """How a model's layers share the KV pool's blocks.

    One physical block holds `num_slots` layers' worth of KV for `block_size` tokens (one
    cache tensor per slot). Layers are split into groups of at most `num_slots` layers of one
    kind (global, or sliding through one window); every group has a block table of its own,
    and a group's layers each read and write their own slot of the group's blocks. A
    sequence's flat table interleaves them: entry `j * num_groups + g` is group g's block
    for the sequence's logical block j (`quire.block.window`).

    One group (every layer in one slot each) is the plain layout. A hybrid model gets global
    groups and sliding groups of equal size (vLLM's hybrid KV-cache manager's grouping): the
    sliding groups' entries outside the window are released while the global ones stay.
    When the two kinds' layer counts do not divide evenly, the last group of a kind leaves
    slots unused (`num_padded_slots`).
    """

    windows: tuple[int | None, ...]  # per group: its layers' window; None: global layers
    layer_groups: tuple[int, ...]  # per layer: its group
    layer_slots: tuple[int, ...]  # per layer: its slot in a block of its group
    num_slots: int  # layers' worth of KV one block holds

    def __post_init__(self) -> None:
        if not self.windows or self.num_slots < 1:
            raise ValueError("KVGroups: at least one group and one slot")
        if len(self.layer_groups) != len(self.layer_slots):
            raise ValueError("KVGroups: a group and a slot per layer")
        seen = set(zip(self.layer_groups, self.layer_slots, strict=True))
        if len(seen) != len(self.layer_groups):
            raise ValueError("KVGroups: two layers share a group's slot")
        for group, slot in seen:
            if not (0 <= group < len(self.windows) and 0 <= slot < self.num_slots):
                raise ValueError(f"KVGroups: group {group} slot {slot} out of range")

    @classmethod
    def single(cls, num_layers: int, window: int | None = None) -> KVGroups:
        """The plain layout: one table, every layer a slot of every block."""
        return cls((window,), (0,) * num_layers, tuple(range(num_layers)), num_layers)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_layers(self) -> int:
        return len(self.layer_groups)

    @property
    def num_padded_slots(self) -> int:
        """Slots no layer uses, over one block of every group."""
        return self.num_groups * self.num_slots - self.num_layers

    @property
    def is_grouped(self) -> bool:
        return self.num_groups > 1


def kv_groups(layout: AttentionLayout, num_layers: int, free_outside_window: bool) -> KVGroups:
    """The grouping a model's layers get: one group unless freeing is on and the model mixes
    sliding and global layers; then groups of min(#global, #sliding) layers each, global
    groups first, layers in their model order."""
    window = layout.freeable_window(num_layers)
    sliding = [i for i in range(num_layers) if layout.window(i) is not None]
    if not free_outside_window or window is not None or not sliding:
        return KVGroups.single(num_layers, window if free_outside_window else None)
    assert layout.sliding_window is not None
    kinds: list[tuple[int | None, list[int]]] = [
        (None, [i for i in range(num_layers) if layout.window(i) is None]),
        (layout.sliding_window, sliding),
    ]
    size = min(len(layers) for _, layers in kinds)
    windows: list[int | None] = []
    layer_groups = [0] * num_layers
    layer_slots = [0] * num_layers
    for window_of_kind, layers in kinds:
        for start in range(0, len(layers), size):
            for slot, layer in enumerate(layers[start : start + size]):
                layer_groups[layer] = len(windows)
                layer_slots[layer] = slot
            windows.append(window_of_kind)
    return KVGroups(tuple(windows), tuple(layer_groups), tuple(layer_slots), size)
