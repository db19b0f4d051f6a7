"""Which layers attend through a sliding window, and the attention variants that come with
layer types, read from a Hugging Face config: Mistral's window over every layer, Qwen2's
`layer_types`, Gemma 2's alternating sliding and global layers with attention logit soft
capping, Gemma 3's sliding_window_pattern; Gemma's query_pre_attn_scalar.

A sliding layer's token at position p attends to positions p - window + 1 .. p (transformers'
`kv_idx > q_idx - sliding_window`); the kernels apply it per layer (quire.kernels.signatures).
When every layer slides, blocks wholly before every window of a sequence are never read again
and the block manager gives them back (`freeable_window`); a global layer still reads all of
a sequence's blocks, so a hybrid model (Gemma) keeps them.
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
