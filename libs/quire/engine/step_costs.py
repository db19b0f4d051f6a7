"""What an engine step costs here: a fixed part plus a part per token, fitted from its steps.

A step's wall time is close to linear in the tokens it runs: a fixed part (reading every
weight once, the Python around the forward pass, the allocator call) and a part per token
(the matmuls' arithmetic, attention). The engine reports each step's tokens and wall time;
the model fits the line by least squares over the latest steps. The scheduler's
shortest-first policy (quire.engine.scheduler) weighs what splitting a burst of prompts
saves against what one more step costs with it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 64  # latest steps the line is fitted over
MIN_STEPS = 8  # steps observed before the fit is used
# Tokens between the window's smallest and largest step for a new fit: a window of decodes
# alone (a few tokens each) says what one more decode row costs, not what a prompt's token
# does, which is what the fit is for; such a window keeps the last fit.
MIN_SPAN = 64


@dataclass
class StepCostModel:
    """seconds(step) ~= fixed_s + per_token_s * tokens, over the latest WINDOW steps."""

    steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    fixed_s: float | None = None
    per_token_s: float | None = None

    def observe(self, num_tokens: int, seconds: float) -> None:
        """One step that ran `num_tokens` tokens in `seconds` of wall time."""
        if num_tokens <= 0 or seconds <= 0:
            return
        self.steps.append((num_tokens, seconds))
        if len(self.steps) >= MIN_STEPS:
            self._fit()

    @property
    def fitted(self) -> bool:
        return self.per_token_s is not None

    def _fit(self) -> None:
        n = len(self.steps)
        tokens = [t for t, _ in self.steps]
        if max(tokens) - min(tokens) < MIN_SPAN:
            return  # decodes alone: the per-token cost of a prompt is not in it
        mean_t = sum(tokens) / n
        mean_s = sum(s for _, s in self.steps) / n
        var_t = sum((t - mean_t) ** 2 for t in tokens)
        if var_t == 0:
            return  # every step ran as many tokens: the line is not determined yet
        slope = sum((t - mean_t) * (s - mean_s) for t, s in self.steps) / var_t
        if slope <= 0:
            return  # noise swamps the per-token cost: keep the last sound fit
        self.per_token_s = slope
        self.fixed_s = max(0.0, mean_s - slope * mean_t)
