"""The engine loop runs every step on the torch threads it is given, on its own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from services.executor.engine_loop import EngineLoop, EngineThread

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    threads = torch.get_num_threads()
    yield LLMEngine(EngineConfig(model=str(TINY), num_kv_blocks=64))
    torch.set_num_threads(threads)


def each_step(engine: LLMEngine, loop: EngineLoop, record: Callable[[], int]) -> list[int]:
    """Run one short request on the started `loop`, then stop it; `record()` taken as each
    step begins."""
    seen: list[int] = []
    step = engine.step

    def recording_step():  # type: ignore[no-untyped-def]
        seen.append(record())
        return step()

    engine.step = recording_step  # type: ignore[method-assign]
    done = threading.Event()
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        loop.add("r", [5, 6, 7], params, lambda d: d is not None and d.finished and done.set())
        assert done.wait(30)
    finally:
        loop.stop(10)
        del engine.step
    return seen


def threads_of_each_step(engine: LLMEngine, threads: int | None) -> list[int]:
    """Run one short request on a loop given `threads`, after something on the loop's thread
    set torch's count to 1; the count each step ran with."""
    loop = EngineLoop(engine, threads=threads)
    loop.start()
    loop.submit(lambda: torch.set_num_threads(1)).result(10)
    return each_step(engine, loop, torch.get_num_threads)


def test_every_step_runs_on_the_threads_given(engine: LLMEngine) -> None:
    assert threads_of_each_step(engine, 2) == [2, 2, 2]


def test_without_a_count_the_steps_keep_the_thread_s_own(engine: LLMEngine) -> None:
    assert threads_of_each_step(engine, None) == [1, 1, 1]


def test_an_idle_loop_takes_its_load_again(engine: LLMEngine) -> None:
    """A pool changes while its executor is idle (a peer releases the pins on its blocks): the
    load the liveness record carries follows without a request arriving."""
    used = [0]
    stats = engine.stats

    def changing_stats():  # type: ignore[no-untyped-def]
        taken = stats()
        return replace(taken, allocator=replace(taken.allocator, num_blocks_used=used[0]))

    engine.stats = changing_stats  # type: ignore[method-assign]
    loop = EngineLoop(engine, idle_load_interval_s=0.05)
    loop.start()
    try:
        assert loop.load.kv_blocks_used == 0
        used[0] = 3
        deadline = time.monotonic() + 5.0
        while loop.load.kv_blocks_used != 3:
            assert time.monotonic() < deadline, "the idle loop kept its old load"
            time.sleep(0.02)
    finally:
        loop.stop(10)
        del engine.stats


def test_the_engine_is_built_and_stepped_on_one_thread() -> None:
    """An engine built on an EngineThread steps on that very thread (and the loop's commands
    run there too), so one thread of the process runs torch's parallel work."""
    thread = EngineThread()
    built = thread.submit(
        lambda: (threading.get_ident(), LLMEngine(EngineConfig(model=str(TINY), num_kv_blocks=64)))
    )
    builder, engine = built.result(60)
    loop = EngineLoop(engine, thread=thread)
    loop.start()
    assert loop.submit(threading.get_ident).result(10) == builder
    # a peer's block read, queued while the loop idles, runs there too
    assert loop.reads.submit(threading.get_ident).result(10) == builder
    stepped = each_step(engine, loop, threading.get_ident)
    assert stepped and set(stepped) == {builder} and builder != threading.get_ident()
    # a stopped loop takes no more commands
    with pytest.raises(RuntimeError, match="stopped"):
        loop.submit(lambda: None)
    with pytest.raises(RuntimeError, match="stopped"):
        loop.reads.submit(lambda: None)
    # nor does its thread, which has ended
    with pytest.raises(RuntimeError, match="closed"):
        thread.submit(lambda: None)
