"""The routing benchmark's workloads: shapes, schedule and seeds, on a small synthetic trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.routing import workloads
from benchmarks.routing.summary import long_context_targets, targets, variant

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
            "prefix/pulls": row(40, 96, 0.5),
            "round-robin/pulls": row(100, 90, 0.1),
            "least-loaded/pulls": row(90, 100, 0.2),
        },
        oracle=0.6,
    )
    assert t["ttft_p50_vs_round_robin"]["value"] == 0.4 and t["ttft_p50_vs_round_robin"]["met"]
    assert t["hit_rate_vs_oracle"]["value"] == pytest.approx(0.5 / 0.6)
    assert not t["hit_rate_vs_oracle"]["met"]
    assert (
        t["throughput_vs_least_loaded"]["value"] == 0.96 and t["throughput_vs_least_loaded"]["met"]
    )


LONG = workloads.WorkloadConfig(
    context_tenants=3,
    context_len=64,
    context_users=6,
    context_turns=2,
    context_turn_len=8,
    context_kv_blocks=8,
)


def test_long_context_users_share_their_tenants_context(tokenizer: Any) -> None:
    data = [record(i, 10, 50, 12, 30) for i in range(30)]
    reqs = workloads.long_context(data, tokenizer, LONG)
    assert len(reqs) == 12 and [r.at for r in reqs] == sorted(r.at for r in reqs)
    heads: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        tenant, _ = r.group.split("/")
        head = heads.setdefault(tenant, r.prompt_token_ids[:64])
        assert r.prompt_token_ids[:64] == head  # the tenant's context first
        if r.turn:
            prev = reqs[r.after]  # type: ignore[index]
            assert r.after < i and prev.group == r.group and prev.turn == r.turn - 1
    assert len(heads) == 3 and len({tuple(h) for h in heads.values()}) == 3
    # Users spread evenly over the tenants.
    users = {r.group for r in reqs}
    assert sorted(sum(u.startswith(t + "/") for u in users) for t in heads) == [2, 2, 2]
    assert workloads.long_context(data, tokenizer, LONG) == reqs  # seeded
    other = workloads.long_context(
        data, tokenizer, workloads.WorkloadConfig(**{**LONG.__dict__, "seed": 1})
    )
    assert [r.at for r in other] != [r.at for r in reqs]


def test_the_shared_contexts_exceed_one_executors_cache() -> None:
    for c in (LONG, workloads.WorkloadConfig()):
        shared = workloads.shared_context_blocks("long-context", c, 16)
        kv = workloads.kv_blocks("long-context", c)
        assert shared is not None and kv is not None and shared > kv
        # ... and the executors' two caches hold them (llm-d's shape: the cluster holds them).
        assert shared < 2 * kv
    assert workloads.kv_blocks("multi-turn", LONG) is None
    assert workloads.shared_context_blocks("tenants", LONG, 16) is None


def test_long_context_targets_compare_pulls_on_with_off() -> None:
    def row(ttft: float, tok_s: float, hit: float) -> dict[str, float]:
        return {"ttft_p50_ms": ttft, "output_tok_s": tok_s, "hit_rate": hit}

    runs = {
        variant("prefix", "on"): row(200, 10.0, 0.78),
        variant("round-robin", "off"): row(1000, 9.0, 0.1),
        variant("round-robin", "on"): row(710, 9.5, 0.7),
        variant("least-loaded", "on"): row(800, 9.9, 0.7),
        variant("least-loaded", "off"): row(900, 10.01, 0.1),
    }
    t = long_context_targets(runs, oracle=0.8)
    assert t["ttft_p50_prefix_pulls_vs_round_robin_no_pulls"]["value"] == 0.2
    assert t["ttft_p50_prefix_pulls_vs_round_robin_no_pulls"]["met"]
    assert t["ttft_p50_round_robin_pulls_vs_no_pulls"]["value"] == 0.71
    assert not t["ttft_p50_round_robin_pulls_vs_no_pulls"]["met"]  # never rounded to 0.7
    assert t["hit_rate_vs_oracle"]["value"] == pytest.approx(0.975)
    # Against the better of least-loaded's two runs: 10.0 / 10.01 is below.
    assert t["throughput_vs_least_loaded"]["of"] == "prefix/pulls / least-loaded/no-pulls"
    assert not t["throughput_vs_least_loaded"]["met"]
    assert set(long_context_targets({}, 0.8)) == set()
