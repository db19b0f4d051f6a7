"""An all-sliding model (tiny-mistral-window: every layer attends through 24 tokens) releases
each running sequence's blocks outside the window, and still gives transformers' tokens; so
do hybrid models (Gemma 2 and 3, gpt-oss) for their sliding layers' KV groups, while their
global layers' groups keep every block."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from quire.block import RELEASED_BLOCK, BlockManager
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from tests.libs.engine.conftest import HFOracle, assert_matches_reference

NAME = "tiny-mistral-window"
WINDOW = 24
LENGTHS = [5, 30, 70, 120, 9, 50, 200, 33]
MAX_TOKENS = [60, 45, 70, 40, 80, 64, 30, 50]


def prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in LENGTHS]


def run(model: Path, check_step: Any = None, **engine: Any) -> tuple[list[list[int]], LLMEngine]:
    """Greedy tokens of every prompt; `check_step(engine)` after each step."""
    llm = LLMEngine(EngineConfig(model=str(model), dtype="float32", **engine))
    token_prompts = prompts(llm.model.config.vocab_size)
    for i, (prompt, n) in enumerate(zip(token_prompts, MAX_TOKENS, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        llm.add_request(str(i), {"prompt_token_ids": prompt}, params)
    tokens: list[list[int]] = [[] for _ in token_prompts]
    while llm.has_unfinished_requests():
        for delta in llm.step().outputs:
            tokens[int(delta.request_id)].extend(delta.outputs[0].new_token_ids)
        if check_step is not None:
            check_step(llm)
    assert llm.allocator.stats().num_blocks_used == 0, "blocks leaked"
    return tokens, llm


def check_reference(tokens: list[list[int]], oracle: HFOracle, label: str) -> None:
    vocab = oracle.model.config.vocab_size
    for i, (prompt, n) in enumerate(zip(prompts(vocab), MAX_TOKENS, strict=True)):
        assert_matches_reference(tokens[i], oracle.generate(prompt, n), f"{label} prompt {i}")


class HeldBlocks:
    """After each step: the allocator's tables are the runner's, the pool's used blocks are
    exactly the tables' present ones, and the most any decoding sequence held (in all, and
    per KV group)."""

    def __init__(self) -> None:
        self.most_decoding = 0
        self.most_per_group: list[int] = []

    def __call__(self, engine: LLMEngine) -> None:
        manager = engine.allocator
        assert isinstance(manager, BlockManager)
        manager.check_integrity()
        present: set[int] = set()
        for live in engine.runner.tables.live_sequences():  # finished ones are freed next step
            assert list(live.block_table) == manager.block_table(live.seq_id)
            present.update(b for b in live.block_table if b != RELEASED_BLOCK)
        assert manager.stats().num_blocks_used == len(present)
        groups = engine.runner.groups.num_groups
        self.most_per_group = self.most_per_group or [0] * groups
        for seq in engine.scheduler.running:
            table = engine.runner.tables.get(seq.seq_id)
            held = [b for b in table if b != RELEASED_BLOCK]
            if seq.num_computed_tokens > seq.num_prompt_tokens:
                self.most_decoding = max(self.most_decoding, len(held))
                for g in range(groups):
                    count = sum(b != RELEASED_BLOCK for b in table[g::groups])
                    self.most_per_group[g] = max(self.most_per_group[g], count)


def test_decoding_sequences_hold_the_window_plus_one_block(
    model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    held = HeldBlocks()
    tokens, engine = run(model_zoo[NAME], held, block_size=8)
    assert engine.allocator.stats().num_blocks_cached > 0, "released blocks were meant to stay"
    assert held.most_decoding == WINDOW // 8 + 1
    check_reference(tokens, oracles[NAME], "freeing")
    kept = HeldBlocks()
    assert run(model_zoo[NAME], kept, block_size=8, free_outside_window=False)[0] == tokens
    assert kept.most_decoding == (200 + 30) // 8 + 1  # off: the longest keeps every block


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_with_released_blocks(
    mode: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    held = HeldBlocks()
    tokens, engine = run(
        model_zoo[NAME], held, num_kv_blocks=16, max_num_seqs=8, preemption_mode=mode
    )
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    check_reference(tokens, oracles[NAME], mode)


# Gemma 2 has gpt-oss's alternating layout (its grouped tables run in the equivalence tests).
@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma3-uneven", "tiny-gpt-oss"])
def test_hybrid_models_sliding_groups_hold_the_window_plus_one_block(
    name: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    held = HeldBlocks()
    tokens, engine = run(model_zoo[name], held, block_size=8)
    groups = engine.runner.groups
    assert groups.is_grouped
    if name == "tiny-gemma3-uneven":  # 2 global layers, 5 sliding: groups of 2, one slot idle
        assert groups.windows == (None, 16, 16, 16) and groups.num_padded_slots == 1
    window = engine.model.config.attention.sliding_window
    assert window is not None
    longest = (200 + 30) // 8 + 1  # the longest sequence's blocks: what a global group holds
    expected = [longest if w is None else window // 8 + 1 for w in groups.windows]
    assert held.most_per_group == expected
    check_reference(tokens, oracles[name], f"{name} freeing")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_hybrid_preemption_with_released_blocks(
    mode: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    name = "tiny-gemma3"  # one global group, three sliding ones
    held = HeldBlocks()
    tokens, engine = run(
        model_zoo[name], held, num_kv_blocks=64, max_num_seqs=8, preemption_mode=mode
    )
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    if mode == "swap":
        assert engine.swapper is not None and engine.swapper.total_stats().num_blocks_in > 0
    check_reference(tokens, oracles[name], f"{name} {mode}")
