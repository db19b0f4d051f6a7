"""Logits processors applied before sampling: today, OpenAI's `logit_bias`.

The bias is added to the processed logits (after penalties, before temperature and the
top-k/top-p/min-p masks, and before greedy's argmax), as vLLM applies it. Reported logprobs
stay those of the raw distribution (`docs/architecture.md`, Decisions).
"""

from __future__ import annotations

import torch


def apply_logit_bias(logits: torch.Tensor, biases: list[dict[int, float] | None]) -> torch.Tensor:
    """`logits` `[num_rows, vocab]` plus each row's bias, in one scatter for all biased rows.

    Rows without a bias cost nothing; when no row has one the tensor is returned as it is.
    Token ids must be inside the vocab (checked when the request was accepted).
    """
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for i, bias in enumerate(biases):
        if bias:
            rows.extend([i] * len(bias))
            cols.extend(bias.keys())
            values.extend(bias.values())
    if not rows:
        return logits
    device = logits.device
    index = (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(cols, dtype=torch.long, device=device),
    )
    # Out of place: the caller's logits also feed the raw logprobs.
    return logits.index_put(
        index, torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True
    )
