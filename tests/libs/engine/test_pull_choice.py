"""Pull or compute, from the two measured costs."""

from __future__ import annotations

import pytest

from quire.engine.pull_choice import PullCostModel


def test_pulls_until_both_costs_are_measured_then_takes_the_cheaper() -> None:
    costs = PullCostModel()
    assert costs.should_pull()
    costs.observe_pull(num_tokens=64, seconds=0.0064)  # 0.1 ms per token
    assert costs.should_pull()
    costs.observe_compute(num_tokens=100, seconds=0.2)  # 2 ms per token
    assert costs.should_pull()
    for _ in range(20):  # pulls got slow: 10 ms per token
        costs.observe_pull(num_tokens=10, seconds=0.1)
    assert costs.seconds_per_pulled_token == pytest.approx(0.01, rel=0.05)
    assert not costs.should_pull()


def test_averages_weigh_the_newest_observation() -> None:
    costs = PullCostModel(weight=0.5)
    costs.observe_compute(10, 1.0)
    costs.observe_compute(10, 3.0)
    assert costs.seconds_per_computed_token == pytest.approx(0.2)  # (0.1 + 0.3) / 2
    costs.observe_compute(0, 5.0)  # nothing ran: ignored
    assert costs.seconds_per_computed_token == pytest.approx(0.2)


def test_always_pulls_whatever_the_costs() -> None:
    costs = PullCostModel(always=True)
    costs.observe_pull(10, 1.0)
    costs.observe_compute(10, 0.001)
    assert costs.should_pull()
    assert not PullCostModel(
        seconds_per_pulled_token=1.0, seconds_per_computed_token=0.001
    ).should_pull()


def test_cost_fraction_is_pulled_over_computed_once_both_are_measured() -> None:
    model = PullCostModel(weight=1.0)
    assert model.cost_fraction is None
    model.observe_pull(100, 0.01)  # 0.1 ms per pulled token
    assert model.cost_fraction is None
    model.observe_compute(50, 0.1)  # 2 ms per computed token
    assert model.cost_fraction == pytest.approx(0.05)
    assert model.should_pull()
