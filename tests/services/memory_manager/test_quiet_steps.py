"""Quiet steps: an executor makes no memory-manager call for a step that needs nothing from it.

Its held-back tokens and commits go with the next call (`deferred_appends`), so after every
sent step the manager holds exactly the executor's tables; the tokens are those of the
in-process allocator, across forks (copy-on-write) and a manager restart while tokens are
held back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    BlockTables,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    TableLayout,
)
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.engine.ngram_drafts import NgramIndex
from quire.sampling_params import SamplingParams
from services.executor.remote_allocator import RemoteBlockAllocator
from services.stack.ports import free_port
from tests.services.memory_manager.conftest import (
    ManagerThread,
    MirroredAllocator,
    engine_tokens,
)

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"
BLOCK_SIZE = 4
PROMPTS = {
    "r0": "The paged cache keeps blocks",
    "r1": "The paged cache keeps blocks of keys and values",  # shares r0's prefix
    "r2": "Another prompt entirely",
}
PARAMS = {
    "r0": SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
    "r1": SamplingParams(temperature=0, max_tokens=14, n=3, seed=1, ignore_eos=True),
    "r2": SamplingParams(temperature=0.8, max_tokens=14, seed=7, ignore_eos=True),
}


def outputs(
    engine: LLMEngine, after_step: Callable[[int], None] | None = None
) -> dict[str, list[int]]:
    requests = {request_id: (prompt, PARAMS[request_id]) for request_id, prompt in PROMPTS.items()}
    return engine_tokens(engine, requests, after_step)


def manager_view(manager: ManagerThread, executor_id: str) -> BlockManager:
    pool = manager.server.pools.find(executor_id)
    assert pool is not None, f"{executor_id} is not registered"
    return pool.manager


def check_in_step(manager: ManagerThread, allocator: RemoteBlockAllocator) -> None:
    """The manager's tables are the executor's; its tokens are the executor's but for the
    held-back ones."""
    tables, held = allocator.tables, allocator._deferred_tokens
    view = manager_view(manager, allocator.executor_id)
    assert sorted(view.seq_ids()) == sorted(s.seq_id for s in tables.live_sequences())
    for seq_id in view.seq_ids():
        assert view.block_table(seq_id) == tables.get(seq_id), seq_id
        num_held = len(held.get(seq_id, ()))
        assert view.num_tokens(seq_id) + num_held == tables.num_tokens(seq_id), seq_id


@pytest.fixture(scope="module")
def expected() -> dict[str, list[int]]:
    assert (TINY / "config.json").is_file(), f"{TINY} is missing: `make model` builds it"
    return outputs(LLMEngine(_config()))


def _config(num_speculative_tokens: int = 0) -> EngineConfig:
    return EngineConfig(
        model=str(TINY),
        block_size=BLOCK_SIZE,
        num_kv_blocks=64,
        device="cpu",
        num_speculative_tokens=num_speculative_tokens,
    )


def _remote(
    managers: list[ManagerThread], num_speculative_tokens: int = 0, **kwargs: object
) -> LLMEngine:
    def factory(num_blocks: int, tables: BlockTables, layout: TableLayout) -> RemoteBlockAllocator:
        return RemoteBlockAllocator(
            managers[-1].target,
            "e1",
            1,
            num_blocks,
            BLOCK_SIZE,
            True,
            "",
            tables,
            retry_total_s=20,
            layout=layout,
            **kwargs,  # type: ignore[arg-type]
        )

    engine = LLMEngine(_config(num_speculative_tokens), allocator_factory=factory)
    assert isinstance(engine.allocator, RemoteBlockAllocator)
    engine.allocator.register()
    return engine


def test_quiet_steps_make_no_call_and_change_no_tokens(expected: dict[str, list[int]]) -> None:
    managers = [ManagerThread().start()]
    try:
        engine = _remote(managers, verify_every=1)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        got = outputs(engine, lambda _: check_in_step(managers[0], allocator))
        assert got == expected
        # Block size 4: most decode steps of a sequence need no new block.
        assert allocator.num_quiet_steps > allocator.num_steps / 2, (
            allocator.num_quiet_steps,
            allocator.num_steps,
        )
        assert allocator.num_resyncs == 0  # every sent step's tables checked out
        assert allocator.stats().num_blocks_used == 0
        allocator.close()
    finally:
        for manager in managers:
            manager.stop()


def test_drafts_kept_and_rejected_keep_the_manager_in_step(
    expected: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """N-gram drafts (here the known outputs, every other proposal with a wrong token) write
    into the last block's free slots, which the manager does not hear of; the kept drafts'
    tokens reach it with the next append and their commit once it has them: after every step
    the manager holds the executor's tables, and the tokens are the in-process allocator's."""
    managers = [ManagerThread().start()]
    try:
        engine = _remote(managers, num_speculative_tokens=4, verify_every=1)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        full = [
            [*engine.tokenize(PROMPTS[request_id])[1], *expected[f"{request_id}/0"]]
            for request_id in ("r0", "r2")  # r1 forks (n=3): it never drafts
        ]
        calls = [0]

        def propose(self: NgramIndex, token_ids: list[int], k: int) -> list[int]:
            for tokens in full:
                if tokens[: len(token_ids)] == token_ids:
                    drafts = tokens[len(token_ids) : len(token_ids) + k]
                    calls[0] += 1
                    if drafts and calls[0] % 2:
                        drafts[-1] += 1
                    return drafts
            return []

        monkeypatch.setattr(NgramIndex, "propose", propose)
        got = outputs(engine, lambda _: check_in_step(managers[0], allocator))
        assert got == expected
        stats = engine.stats()
        assert 0 < stats.num_kept_drafts < stats.num_draft_tokens
        assert allocator.num_quiet_steps > 0 and allocator.num_resyncs == 0
        assert allocator.stats().num_blocks_used == 0
        allocator.close()
    finally:
        for manager in managers:
            manager.stop()


def test_without_quiet_steps_every_step_calls() -> None:
    managers = [ManagerThread().start()]
    try:
        engine = _remote(managers, defer_quiet_steps=False)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        outputs(engine)
        assert allocator.num_quiet_steps == 0 and allocator.num_steps > 0
        allocator.close()
    finally:
        for manager in managers:
            manager.stop()


@pytest.mark.parametrize("restart_after", [3, 8])
def test_a_manager_restart_while_tokens_are_held_back(
    expected: dict[str, list[int]], restart_after: int
) -> None:
    """The manager restarts at the first step after `restart_after` that ends with tokens
    held back. The new one is rebuilt from the executor's tables, which hold those tokens:
    nothing is sent twice and the tokens are the in-process allocator's."""
    port = free_port()
    managers = [ManagerThread(port=port).start()]
    held_at_restart: list[int] = []
    try:
        engine = _remote(managers)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)

        def after_step(num_steps: int) -> None:
            held = sum(map(len, allocator._deferred_tokens.values()))
            if num_steps > restart_after and held and not held_at_restart:
                held_at_restart.append(held)
                managers[0].stop()
                managers.append(ManagerThread(port=port).start())
            elif held_at_restart and allocator.num_registrations == 2:
                check_in_step(managers[-1], allocator)

        assert outputs(engine, after_step) == expected
        assert held_at_restart, "no step after the restart point held tokens back"
        assert allocator.num_registrations == 2, "the restart was not noticed"
        assert allocator.stats().num_blocks_used == 0
        allocator.close()
    finally:
        for manager in managers:
            manager.stop()


def test_which_steps_are_quiet(manager: ManagerThread) -> None:
    mirror = MirroredAllocator(manager.target, num_blocks=16)
    allocator = mirror.allocator
    allocator.register()
    mirror.step(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),))  # two blocks, 3 slots free
    sent = allocator.num_steps
    # Committing 5 completes block 0 (its hash is registered): sent.
    mirror.step(commits=(CommitRequest("a", 5),), appends=(AppendRequest("a", (6,)),))
    assert allocator.num_steps == sent + 1
    mirror.step(commits=(CommitRequest("a", 6),), appends=(AppendRequest("a", (7,)),))
    mirror.step(commits=(CommitRequest("a", 7),), appends=(AppendRequest("a", (8,)),))
    assert allocator.num_steps == sent + 1, "steps within the last block made a call"
    assert manager_view(manager, "e1").num_tokens("a") == 6
    # The last block is full: the next token needs a new block.
    mirror.step(commits=(CommitRequest("a", 8),), appends=(AppendRequest("a", (9,)),))
    assert allocator.num_steps == sent + 2
    view = manager_view(manager, "e1")
    assert view.num_tokens("a") == 9 and view.block_table("a") == mirror.tables("a")["a"]
    # A fork shares the partial last block: neither side's next append is quiet, and the
    # first one copies it.
    mirror.step(forks=(ForkRequest("a", "b"),))
    result = mirror.step(
        commits=(CommitRequest("a", 9), CommitRequest("b", 9)),
        appends=(AppendRequest("a", (10,)), AppendRequest("b", (20,))),
    )
    assert allocator.num_steps == sent + 4 and len(result.copies) == 1
    mirror.step(commits=(CommitRequest("a", 10),), appends=(AppendRequest("a", (11,)),))
    mirror.step(commits=(CommitRequest("a", 11),), appends=(AppendRequest("a", (12,)),))
    assert allocator.num_steps == sent + 4, "a private last block again: quiet"
    # A commit that completes a block registers its hash: never quiet.
    mirror.step(commits=(CommitRequest("a", 12),))
    assert allocator.num_steps == sent + 5
    view = manager_view(manager, "e1")
    assert view.num_tokens("a") == 12 and view.block_table("a") == mirror.tables("a")["a"]
    assert view.num_tokens("b") == 10
    mirror.step(frees=("a", "b"))
    assert allocator.stats().num_blocks_used == 0
    allocator.close()


def test_the_manager_refuses_a_deferred_append_that_would_need_a_block() -> None:
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.step(StepAllocation(admits=(AdmitRequest("a", (1, 2, 3)),)))
    manager.step(StepAllocation(forks=(ForkRequest("a", "b"),)))
    with pytest.raises(ValueError, match="shared"):
        manager.step(StepAllocation(deferred_appends=(AppendRequest("a", (4,)),)))
    manager.step(StepAllocation(frees=("b",)))
    with pytest.raises(ValueError, match="do not fit"):
        manager.step(StepAllocation(deferred_appends=(AppendRequest("a", (4, 5)),)))
    with pytest.raises(ValueError, match="deferred_appends: unknown seq_id 'x'"):
        manager.step(StepAllocation(deferred_appends=(AppendRequest("x", (4,)),)))
    assert manager.num_tokens("a") == 3  # refused steps changed nothing
    # A deferred token counts for the step's own commits and appends.
    result = manager.step(
        StepAllocation(
            deferred_appends=(AppendRequest("a", (4,)),),
            commits=(CommitRequest("a", 4),),
            appends=(AppendRequest("a", (5,)),),
        )
    )
    assert manager.num_tokens("a") == 5 and result.table_updates["a"].start == 1
