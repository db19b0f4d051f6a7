"""Admission slots and tickets on their own."""

from __future__ import annotations

import pytest

from services.router.admission.slots import Admission


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
