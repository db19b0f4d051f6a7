"""Engines sharing one memory manager's pools in this process: a prompt whose blocks a peer
computed is pulled, not recomputed, and its greedy output is token for token the same (a
hybrid model's too: every KV group's block of each logical block is pulled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire import LLM, SamplingParams
from quire.block import AllocatorStats, StepAllocation, StepAllocationResult, TableLayout
from quire.cache.block_transfer import InProcessPuller
from quire.cache.paged_kv import PagedKVCache
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.engine.pull_choice import PullCostModel
from services.memory_manager.pools import ExecutorPools
from services.memory_manager.pull_broker import PullBroker
from tests.libs.engine.conftest import model_zoo, tiny_model  # noqa: F401 (fixtures)

BLOCK_SIZE = 16


class BrokeredAllocator:
    """An engine's allocator in a one-process cluster: its pool among `pools`, with pulls."""

    def __init__(
        self,
        pools: ExecutorPools,
        broker: PullBroker,
        executor_id: str,
        n: int,
        layout: TableLayout,
    ) -> None:
        grouped = layout.num_groups > 1
        self.pool, _ = pools.register(
            executor_id,
            1,
            n,
            BLOCK_SIZE,
            True,
            f"{executor_id}:0",
            [],
            accepts_pulls=True,
            sliding_window=None if grouped else layout.sliding_window,
            group_windows=layout.windows if grouped else (),
        )
        self.broker = broker
        self.block_size, self.num_blocks = BLOCK_SIZE, n

    def step(self, request: StepAllocation) -> StepAllocationResult:
        return self.broker.step(self.pool, request)

    def resync(self, request: StepAllocation, reason: str) -> StepAllocationResult:
        raise RuntimeError(f"in-process pools do not drift: {reason}")

    def stats(self) -> AllocatorStats:
        return self.pool.manager.stats()


class Cluster:
    """Engines on one model, one set of pools and a broker; each pulls from the others."""

    def __init__(self, model: Path, **engine_args: object) -> None:
        self.model, self.engine_args = model, engine_args
        self.pools = ExecutorPools()
        self.broker = PullBroker(self.pools, "in-process")
        self.caches: dict[str, PagedKVCache] = {}
        self.pullers: dict[str, InProcessPuller] = {}

    def engine(self, executor_id: str) -> LLM:
        def puller(kv: PagedKVCache) -> InProcessPuller:
            self.pullers[executor_id] = InProcessPuller(self.caches, kv)
            return self.pullers[executor_id]

        config = EngineConfig(
            model=str(self.model), dtype="float32", block_size=BLOCK_SIZE, **self.engine_args
        )
        engine = LLMEngine(
            config,
            allocator_factory=lambda n, _tables, layout: BrokeredAllocator(
                self.pools, self.broker, executor_id, n, layout
            ),
            puller_factory=puller,
        )
        self.caches[executor_id] = engine.runner.kv
        return LLM.from_engine(engine)


def greedy(llm: LLM, prompts: list[list[int]], n: int = 1) -> list[list[list[int]]]:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=n)
    if n > 1:
        params = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, n=n)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[list(c.token_ids) for c in out.outputs] for out in outputs]


def prompts(vocab_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Shared contexts at and around block boundaries, and follow-ups that extend them."""
    contexts = [
        [(i * 7 + 3 * n) % (vocab_size - 3) + 3 for i in range(n)] for n in (33, 48, 64, 90)
    ]
    follow_ups = [c + [5 + j, 9 + j, 11] for j, c in enumerate(contexts)]
    return contexts, follow_ups


@pytest.mark.parametrize(
    ("name", "engine_args"),
    [
        ("tiny", {}),
        ("tiny", {"max_num_batched_tokens": 24}),
        ("tiny-mqa", {}),
        ("tiny-deepseek-v2", {}),  # MLA: blocks of one latent plane per layer
        ("tiny-gemma3", {}),  # a hybrid: 4 KV groups, a block per group per logical block
    ],
    ids=["whole", "chunked", "gqa", "mla", "hybrid"],
)
def test_pulled_prefixes_give_the_computed_tokens(
    name: str,
    engine_args: dict[str, object],
    model_zoo: dict[str, Path],  # noqa: F811
) -> None:
    cluster = Cluster(model_zoo[name], **engine_args)
    first, second = cluster.engine("a"), cluster.engine("b")
    alone = LLM(model=str(model_zoo[name]), dtype="float32", block_size=BLOCK_SIZE, **engine_args)
    contexts, follow_ups = prompts(alone.engine.model.config.vocab_size)
    assert greedy(first, contexts) == greedy(alone, contexts)
    pulled = greedy(second, follow_ups)  # "b" has nothing cached: it pulls from "a"
    assert pulled == greedy(alone, follow_ups)
    # Every full block of a context that the follow-up reuses (never its last token's block),
    # every KV group's.
    groups = first.engine.runner.groups.num_groups
    expected_blocks = groups * sum(
        min(len(c) // BLOCK_SIZE, (len(f) - 1) // BLOCK_SIZE)
        for c, f in zip(contexts, follow_ups, strict=True)
    )
    assert cluster.pullers["b"].stats.num_blocks == expected_blocks
    pulled_stats = second.stats().pull  # the engine's totals, as the executor's metrics read
    assert (pulled_stats.num_pulls, pulled_stats.num_blocks) == (len(contexts), expected_blocks)
    assert pulled_stats.num_fallbacks == 0
    assert cluster.pools.find("a").manager.num_pinned_blocks == 0  # every pin released
    assert cluster.broker.pins == {} and cluster.broker.counters.num_released == len(contexts)
    # The pulled blocks count as cached prompt tokens, like local hits.
    stats = second.stats()
    assert stats.allocator.num_blocks_used == 0
    for pools_manager in (cluster.pools.find("a").manager, cluster.pools.find("b").manager):
        pools_manager.check_integrity()


def test_n_greater_than_one_forks_after_a_pull(model_zoo: dict[str, Path]) -> None:  # noqa: F811
    cluster = Cluster(model_zoo["tiny"])
    first, second = cluster.engine("a"), cluster.engine("b")
    alone = LLM(model=str(model_zoo["tiny"]), dtype="float32", block_size=BLOCK_SIZE)
    contexts, follow_ups = prompts(alone.engine.model.config.vocab_size)
    greedy(first, contexts)
    assert greedy(second, follow_ups, n=3) == greedy(alone, follow_ups, n=3)
    assert cluster.pullers["b"].stats.num_blocks > 0


def test_offers_are_declined_where_computing_is_measured_cheaper(
    model_zoo: dict[str, Path],  # noqa: F811
) -> None:
    cluster = Cluster(model_zoo["tiny"])
    first, second = cluster.engine("a"), cluster.engine("b")
    alone = LLM(model=str(model_zoo["tiny"]), dtype="float32", block_size=BLOCK_SIZE)
    contexts, follow_ups = prompts(alone.engine.model.config.vocab_size)
    greedy(first, contexts)
    # As if pulls here had cost 1 s per token and prefill 1 ms.
    second.engine.scheduler.pull_costs = PullCostModel(
        weight=0.0, seconds_per_pulled_token=1.0, seconds_per_computed_token=0.001
    )
    assert greedy(second, follow_ups) == greedy(alone, follow_ups)
    pulled = second.stats().pull
    assert (pulled.num_declined, pulled.num_blocks) == (len(contexts), 0)
    assert cluster.broker.pins == {} and cluster.pools.find("a").manager.num_pinned_blocks == 0
