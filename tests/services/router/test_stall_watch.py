"""Hung-executor detection: the rule on a fake clock, and the watch over a router's calls."""

from __future__ import annotations

import time
from typing import Any

import pytest

from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
from services.router.directory import ClusterView
from services.router.stall_watch import StallDetector
from tests.services.router.conftest import Cluster
from tests.services.router.fake_executor import Script

STALL_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(executor_id: str, num_steps: int, **fields: Any) -> ExecutorRecord:
    return ExecutorRecord(
        executor_id, "h:1", 1, "m", load=ExecutorLoad(num_steps=num_steps), **fields
    )


def redis_view(*records: ExecutorRecord) -> ClusterView:
    return ClusterView(list(records), "redis")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def detector(clock: Clock) -> StallDetector:
    return StallDetector(STALL_S, clock)


def test_silent_and_no_step_for_the_bound_is_stalled(detector: StallDetector, clock: Clock) -> None:
    since = clock.now
    view = redis_view(record("a", 40), record("b", 9))
    assert detector.stalled({"a": since}, view) == {}
    clock.now += STALL_S - 0.1
    assert detector.stalled({"a": since}, view) == {}
    clock.now += 0.1
    stalled = detector.stalled({"a": since}, view)
    assert list(stalled) == ["a"]
    assert "no engine step for 5.0 s (step counter at 40)" in stalled["a"]
    # Judged once: what waits on it afterwards is timed afresh.
    assert detector.stalled({"a": since}, view) == {}


def test_a_step_counter_that_moves_is_progress(detector: StallDetector, clock: Clock) -> None:
    # A stream queued behind other requests is silent while its executor steps.
    since = clock.now
    for steps in range(10, 30):
        clock.now += 1.0
        assert detector.stalled({"a": since}, redis_view(record("a", steps))) == {}
    # The counter stops: stalled once it has stood still for the bound.
    frozen = redis_view(record("a", 29))
    clock.now += STALL_S - 1.0
    assert detector.stalled({"a": since}, frozen) == {}
    clock.now += 1.0
    assert list(detector.stalled({"a": since}, frozen)) == ["a"]


def test_layers_that_run_inside_a_long_step_are_progress(
    detector: StallDetector, clock: Clock
) -> None:
    # A big model's prefill chunk: one step far longer than the bound, its layers running.
    since = clock.now
    for layers in range(0, 22 * 3, 2):
        clock.now += 1.0
        view = redis_view(record("a", 7, layers_run=layers))
        assert detector.stalled({"a": since}, view) == {}
    # A step stuck inside a layer: stalled once neither counter has moved for the bound.
    stuck = redis_view(record("a", 7, layers_run=64))
    clock.now += STALL_S
    assert list(detector.stalled({"a": since}, stuck)) == ["a"]


def test_a_recent_response_is_progress(detector: StallDetector, clock: Clock) -> None:
    view = redis_view(record("a", 3))
    detector.stalled({"a": clock.now}, view)
    clock.now += 2 * STALL_S
    # The counter stood still, but the oldest read began waiting only a second ago.
    assert detector.stalled({"a": clock.now - 1.0}, view) == {}


def test_a_gone_record_is_no_progress(detector: StallDetector, clock: Clock) -> None:
    since = clock.now
    gone = ClusterView([record("b", 1)], "redis", expired=("a",))
    assert detector.stalled({"a": since}, gone) == {}
    clock.now += STALL_S
    stalled = detector.stalled({"a": since}, gone)
    assert "no liveness record (heartbeat stopped)" in stalled["a"]


def test_a_record_that_vanishes_is_no_step(detector: StallDetector, clock: Clock) -> None:
    # Frozen: the heartbeat stops too, and the record expires a moment later.
    since = clock.now
    assert detector.stalled({"a": since}, redis_view(record("a", 12))) == {}
    clock.now += 2.0
    gone = ClusterView([], "redis", expired=("a",))
    assert detector.stalled({"a": since}, gone) == {}
    clock.now += STALL_S - 2.0
    assert list(detector.stalled({"a": since}, gone)) == ["a"]


def test_waiting_for_the_memory_manager_is_not_hung(detector: StallDetector, clock: Clock) -> None:
    since = clock.now
    waiting = redis_view(record("a", 7, waiting_for_memory_manager=True))
    for _ in range(4):
        clock.now += STALL_S
        assert detector.stalled({"a": since}, waiting) == {}
    # Back, and stuck for real: the bound counts from its last sign of life.
    stuck = redis_view(record("a", 7))
    clock.now += STALL_S - 0.5
    assert detector.stalled({"a": since}, stuck) == {}
    clock.now += 0.5
    assert list(detector.stalled({"a": since}, stuck)) == ["a"]


def test_without_redis_nothing_is_judged(detector: StallDetector, clock: Clock) -> None:
    since = clock.now
    for source in ("last_seen", "static"):
        clock.now += 2 * STALL_S
        assert detector.stalled({"a": since}, ClusterView([record("a", 1)], source)) == {}
    # Redis back: the bound starts over from the first record seen.
    assert detector.stalled({"a": since}, redis_view(record("a", 1))) == {}
    clock.now += STALL_S
    assert list(detector.stalled({"a": since}, redis_view(record("a", 1)))) == ["a"]


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stall_s"):
        StallDetector(0)


def test_a_hung_executor_loses_its_waiting_call_to_another(cluster: Cluster) -> None:
    """The chosen executor takes the call and never answers, and its record shows no step:
    the router gives up on it within the bound and the request is served elsewhere."""
    ids = sorted(cluster.fakes)
    hung, healthy = ids[0], ids[1]
    cluster.redis.delete(f"{cluster.prefix}:executor:{ids[2]}")
    cluster.script(Script(tokens=[11, 12, 2], first_delay_s=60.0), hung)
    cluster.publish(hung, num_steps=500, num_running=3)  # its counter stands still
    router = cluster.router(executor_stall_s=0.4, routing_policy="round-robin")
    start = time.monotonic()
    with router.http(timeout=30) as http:
        # Round robin over the two: one of these goes to the hung executor first.
        for prompt in ([5, 6, 7], [8, 9, 10]):
            response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3})
            assert response.status_code == 200, response.text
            assert response.headers["x-quire-executor"] == healthy
    assert time.monotonic() - start < 10
    hung_fake = cluster.fakes[hung].executor
    assert len(hung_fake.requests) == 1 and len(hung_fake.cancelled) == 1
    assert hung in router.state.directory.down_executors()
    with router.admin() as admin:
        status = {e["id"]: e["healthy"] for e in admin.get("/cluster/status").json()["executors"]}
        metrics = admin.get("/metrics").text
    assert status[hung] is False
    assert "quire_router_stalled_executors_total 1.0" in metrics
