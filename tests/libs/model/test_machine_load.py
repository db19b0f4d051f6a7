"""OtherLoad: other processes' busy cores count, this process's own work does not."""

from __future__ import annotations

import subprocess
import sys
import time

from quire.model.machine_load import OtherLoad

_SPIN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass"


def _spin_here(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_busy_neighbour_counts_as_about_one_core() -> None:
    neighbour = subprocess.Popen([sys.executable, "-c", _SPIN, "3"])
    try:
        time.sleep(0.3)  # past its interpreter's start
        with OtherLoad() as load:
            time.sleep(0.6)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert 0.6 <= load.cores <= 1.5, load.cores
    assert not load.left_free(threads=load.num_cpus, slack_cores=0.25)


def test_this_processs_own_work_is_not_counted() -> None:
    with OtherLoad() as load:
        _spin_here(0.6)
    assert load.cores < 0.5, load.cores
    assert load.left_free(threads=1, slack_cores=0.5)


def test_left_free_leaves_room_for_the_threads_the_others_did_not_take() -> None:
    load = OtherLoad()
    load.num_cpus, load.cores = 4, 1.2
    assert load.left_free(threads=2, slack_cores=0.25)  # 4 - 2 = 2 cores to spare
    assert not load.left_free(threads=4, slack_cores=0.25)
    assert load.left_free(threads=3, slack_cores=0.25)  # 1 core to spare, 0.2 over: slack
    load.cores = 0.2
    assert load.left_free(threads=8, slack_cores=0.25)  # more threads than cores: slack only
