"""Executors sharing a machine's cores by who has work: threads per step follow the busy
siblings in one shared file, stale slots count as idle, bad slots are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.executor.core_share import FILE_BYTES, NUM_SLOTS, CoreShare


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_lone_executor_takes_every_core_and_busy_siblings_split_them(tmp_path: Path) -> None:
    path = tmp_path / "cores"
    a, b, c = (CoreShare(path, slot, cores=4) for slot in (0, 1, 5))
    assert path.stat().st_size == FILE_BYTES
    assert a.before_step() == 4 and torch.get_num_threads() == 4
    assert b.before_step() == 2  # a is still busy
    assert a.before_step() == 2 and torch.get_num_threads() == 2
    assert c.before_step() == 1  # 4 // 3
    c.idle()
    b.idle()
    assert a.before_step() == 4  # alone again
    for share in (a, b, c):
        share.close()


def test_the_floor_holds_and_stale_slots_are_idle(tmp_path: Path) -> None:
    path = tmp_path / "cores"
    a = CoreShare(path, 0, cores=2, floor=2)
    b = CoreShare(path, 1, cores=2, stale_s=0.0)  # its view: every other slot is stale
    assert b.before_step() == 2  # a never stepped: idle
    assert a.before_step() == 2  # b busy, but a's floor is 2
    assert b.busy_executors(now=float("inf")) == 0
    a.close()
    b.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share_cores_slot"):
        CoreShare(tmp_path / "cores", NUM_SLOTS)
    with pytest.raises(ValueError, match="floor"):
        CoreShare(tmp_path / "cores", 0, cores=2, floor=3)
