"""The routing benchmark's workloads: shapes, schedule and seeds, on a small synthetic trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.routing import workloads
from benchmarks.routing.summary import targets

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"


def record(i: int, *turns: int) -> dict[str, Any]:
    roles = ["human", "gpt"]
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": roles[k % 2], "value": " ".join([f"w{i}"] * n)} for k, n in enumerate(turns)
        ],
    }


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY)


def test_multi_turn_interleaves_conversations_and_chains_turns(tokenizer: Any) -> None:
    data = [record(i, 12, 9, 7, 11, 5, 6) for i in range(6)]
    config = workloads.WorkloadConfig(num_conversations=3, max_turns=3, max_output_len=5)
    reqs = workloads.multi_turn(data, tokenizer, config)
    assert len(reqs) == 9
    assert [r.at for r in reqs] == sorted(r.at for r in reqs)
    for i, r in enumerate(reqs):
        assert r.output_len <= 5
        if r.turn == 0:
            assert r.after is None
            continue
        prev = reqs[r.after]  # type: ignore[index]
        assert r.after < i and prev.group == r.group and prev.turn == r.turn - 1
        assert r.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
    # Conversations overlap in time: some turn 0 comes after another conversation's turn 1.
    first_turn_one = min(i for i, r in enumerate(reqs) if r.turn == 1)
    assert any(r.turn == 0 for r in reqs[first_turn_one:])
    assert workloads.multi_turn(data, tokenizer, config) == reqs  # seeded


def test_tenants_share_one_of_a_few_system_prompts(tokenizer: Any) -> None:
    data = [record(i, 30, 400) for i in range(40)]
    config = workloads.WorkloadConfig(num_tenants=2, tenant_requests=8, system_prompt_len=64)
    reqs = workloads.tenants(data, tokenizer, config)
    assert len(reqs) == 8 and {r.group for r in reqs} <= {"tenant-0", "tenant-1"}
    by_tenant: dict[str, list[list[int]]] = {}
    for r in reqs:
        by_tenant.setdefault(r.group, []).append(r.prompt_token_ids)
    heads = {g: p[0][:64] for g, p in by_tenant.items()}
    for g, prompts in by_tenant.items():
        assert all(p[:64] == heads[g] for p in prompts)  # the tenant's system prompt first
    if len(heads) == 2:
        assert heads["tenant-0"] != heads["tenant-1"]


def test_targets_compare_prefix_with_the_baselines() -> None:
    def row(ttft: float, tok_s: float, hit: float) -> dict[str, float]:
        return {"ttft_p50_ms": ttft, "output_tok_s": tok_s, "hit_rate": hit}

    t = targets(
        {
            "prefix": row(40, 96, 0.5),
            "round-robin": row(100, 90, 0.1),
            "least-loaded": row(90, 100, 0.2),
        },
        oracle=0.6,
    )
    assert t["ttft_p50_vs_round_robin"]["value"] == 0.4 and t["ttft_p50_vs_round_robin"]["met"]
    assert t["hit_rate_vs_oracle"]["value"] == pytest.approx(0.5 / 0.6)
    assert not t["hit_rate_vs_oracle"]["met"]
    assert (
        t["throughput_vs_least_loaded"]["value"] == 0.96 and t["throughput_vs_least_loaded"]["met"]
    )
