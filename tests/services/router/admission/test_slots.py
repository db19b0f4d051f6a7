"""Admission slots and tickets: on their own, and as the 429s the router answers."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from services.router.admission.slots import Admission
from tests.services.conftest import wait_for
from tests.services.router.conftest import Cluster
from tests.services.router.fake_executor import Script
from tests.services.router.test_errors import assert_error


def test_admission_bounds() -> None:
    admission = Admission(max_pending_per_executor=2, max_pending_total=3)
    assert admission.try_acquire("a") and admission.try_acquire("a")
    assert not admission.try_acquire("a")
    assert admission.full_executors() == {"a"}
    assert admission.try_acquire("b")
    assert not admission.can_admit() and not admission.try_acquire("c")
    admission.release("a")
    assert admission.full_executors() == set() and admission.can_admit()
    assert admission.pending("a") == 1 and admission.num_pending == 2
    with pytest.raises(ValueError):
        Admission(0, 1)


def test_admission_tickets_hold_a_place_until_they_become_slots() -> None:
    admission = Admission(max_pending_per_executor=2, max_pending_total=2)
    first, second = admission.enter(), admission.enter()
    assert first is not None and second is not None
    assert admission.enter() is None  # two tickets fill the overall bound
    assert not admission.try_acquire("a")  # no ticket: no place left for it
    # A ticket turns into its slot without counting twice ...
    assert admission.try_acquire("a", first) and not first.held
    assert (admission.num_pending, admission.num_entering) == (1, 1)
    assert admission.can_admit(1, second) and not admission.can_admit(2, second)
    # ... and a used ticket is no longer a pass past the overall bound.
    assert not admission.try_acquire("b", first)
    admission.leave(first)  # leaving after conversion gives nothing back twice
    assert (admission.num_pending, admission.num_entering) == (1, 1)
    admission.leave(second)  # a request refused after the door gives its place back
    assert admission.num_taken == 1 and admission.enter() is not None
    # The per-executor bound holds for ticket holders too.
    one = Admission(max_pending_per_executor=1, max_pending_total=4)
    ticket = one.enter()
    assert one.try_acquire("a") and not one.try_acquire("a", ticket)
    assert ticket is not None and ticket.held


def test_admission_429_and_disconnect_aborts(cluster: Cluster, tokenizer: Any) -> None:
    slow = Script(tokens=tokenizer.encode(" tick" * 40, add_special_tokens=False), delay_s=0.1)
    cluster.script(slow)
    router = cluster.router(max_pending_total=1, retry_after_s=2)
    with router.http() as http, router.admin() as admin:
        with http.stream(
            "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 40, "stream": True}
        ) as held:
            executor_id = held.headers["x-quire-executor"]
            lines = held.iter_lines()  # keep the iterator: dropping it closes the response
            next(lines)  # the stream is live: its slot is taken
            refused = http.post("/v1/completions", json={"prompt": "y"})
            error = assert_error(refused, 429)
            assert refused.headers["retry-after"] == "2"
            assert error["code"] == "rate_limit_exceeded"
            assert next(line for line in lines if line).startswith("data: ")  # still streaming
        # Leaving the stream early cancels the executor call (its blocks are freed).
        fake = cluster.fakes[executor_id].executor
        wait_for(lambda: len(fake.cancelled) == 1, 5, "the executor call to be cancelled")
        assert fake.completed == []
        metrics = admin.get("/metrics").text
        assert 'quire_router_admission_rejections_total{code="429"} 1.0' in metrics
        wait_for(lambda: "quire_router_in_flight_requests 0.0" in admin.get("/metrics").text, 5)
        cluster.script(Script(tokens=[50, 2]))
        assert http.post("/v1/completions", json={"prompt": "z"}).status_code == 200


def test_per_executor_bound(cluster: Cluster) -> None:
    cluster.script(Script(tokens=[50] * 30, delay_s=0.1))
    router = cluster.router(max_pending_per_executor=1)
    with router.http() as http, contextlib.ExitStack() as held:
        streams = [
            held.enter_context(
                http.stream(
                    "POST",
                    "/v1/completions",
                    json={"prompt": prompt, "max_tokens": 30, "stream": True},
                )
            )
            for prompt in ("a", "b", "c")
        ]
        # Each executor at its bound of one: the consistent-hash choice gives way.
        assert {s.headers["x-quire-executor"] for s in streams} == set(cluster.fakes)
        assert_error(http.post("/v1/completions", json={"prompt": "d"}), 429)
