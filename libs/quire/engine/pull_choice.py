"""Pull or compute: an offered prefix is copied from a peer only where that is measured cheaper.

The memory manager offers a peer's blocks; whether taking them beats computing their tokens
depends on the machines (a CPU computes a token in milliseconds and copies its KV in
microseconds; a GPU's prefill is far faster and its network may be slower). The engine keeps
two moving averages, seconds per pulled token (its own pulls, transfer and write) and seconds
per computed token (its forward passes over prompt tokens), and pulls when the first is the
smaller. Until both are measured it pulls: a pull measures itself, and a failing or slow one
falls back to computing within its timeout.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PullCostModel:
    """Moving averages of what a pulled and a computed prompt token cost here."""

    weight: float = 0.2  # of the newest observation in each average
    always: bool = False  # pull whatever the costs (EngineConfig.pull_policy "always")
    seconds_per_pulled_token: float | None = None
    seconds_per_computed_token: float | None = None

    def observe_pull(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0:
            self.seconds_per_pulled_token = self._average(
                self.seconds_per_pulled_token, seconds / num_tokens
            )

    def observe_compute(self, num_tokens: int, seconds: float) -> None:
        """A forward pass that ran `num_tokens` tokens, prompt tokens among them."""
        if num_tokens > 0:
            self.seconds_per_computed_token = self._average(
                self.seconds_per_computed_token, seconds / num_tokens
            )

    @property
    def cost_fraction(self) -> float | None:
        """A pulled token's cost as a fraction of a computed one's, once both are measured
        (what this executor publishes for routers to weigh pullable blocks with)."""
        pulled, computed = self.seconds_per_pulled_token, self.seconds_per_computed_token
        if pulled is None or not computed:
            return None
        return pulled / computed

    def should_pull(self) -> bool:
        pulled, computed = self.seconds_per_pulled_token, self.seconds_per_computed_token
        return self.always or pulled is None or computed is None or pulled < computed

    def _average(self, current: float | None, value: float) -> float:
        return value if current is None else (1 - self.weight) * current + self.weight * value
