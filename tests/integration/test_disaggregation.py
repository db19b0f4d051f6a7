"""Prefill and decode roles on a real stack: executor-0 `--role prefill`, executor-1
`--role decode`. Every output is prefilled on executor-0, handed on after its first token and
continued on executor-1, which pulls the prompt's full blocks from executor-0 instead of
computing them; the client gets exactly the tokens the offline engine makes for the same
request, greedy and seeded, n = 1 and 2, streamed and not."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest

from quire.entrypoints.llm import LLM
from quire.sampling_params import SamplingParams
from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig
from tests.integration.conftest import REPO, running_stack
from tests.integration.test_observability import scrape, total

MODEL = REPO / "models" / "quire-tiny"


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ports = stack_ports(2)
    config = StackConfig(
        model=str(MODEL),
        **ports,
        num_executors=2,
        num_kv_blocks=256,
        executor_dtype="float32",  # a continuation prefills what the original decoded
        executor_roles="prefill,decode",
        redis_prefix=f"quire-pd-{ports['executor_base_port']}",
    )
    with running_stack(config, tmp_path_factory.mktemp("pd")) as s:
        yield s


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(str(MODEL), dtype="float32")


def served(stack: Stack, body: dict[str, object]) -> list[list[int]]:
    """Each choice's token ids, in choice order."""
    body = {"model": "quire-tiny", "return_token_ids": True, **body}
    url = f"{stack.config.router_url}/v1/completions"
    if not body.get("stream"):
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == 200, response.text
        choices = sorted(response.json()["choices"], key=lambda c: c["index"])
        return [c["token_ids"] for c in choices]
    tokens: dict[int, list[int]] = {}
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                tokens.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return [tokens[i] for i in sorted(tokens)]


def metrics(stack: Stack, i: int) -> dict:
    c = stack.config
    return scrape(f"http://{c.host}:{c.executor_base_metrics_port + i}/metrics")[0]


CASES = {
    "greedy": {"temperature": 0, "max_tokens": 12},
    "greedy-stream": {"temperature": 0, "max_tokens": 12, "stream": True},
    "seeded-n2": {"temperature": 1.0, "top_p": 0.9, "seed": 7, "n": 2, "max_tokens": 10},
    "seeded-n2-stream": {"temperature": 0.8, "seed": 3, "n": 2, "max_tokens": 10, "stream": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_prefilled_and_handed_on_request_makes_the_offline_tokens(
    pd_stack: Stack, offline: LLM, case: str
) -> None:
    body = dict(CASES[case])
    rng = random.Random(case)
    # 100 tokens: six full blocks of 16 to pull, and a partial one the decode side computes.
    prompt = [rng.randrange(3, 1000) for _ in range(100)]
    before = [metrics(pd_stack, i) for i in range(2)]
    got = served(pd_stack, {**body, "prompt": prompt, "ignore_eos": True})
    params = SamplingParams(
        n=int(body.get("n", 1)),  # type: ignore[call-overload]
        temperature=float(body["temperature"]),  # type: ignore[arg-type]
        top_p=float(body.get("top_p", 1.0)),  # type: ignore[arg-type]
        seed=body.get("seed"),  # type: ignore[arg-type]
        max_tokens=int(body["max_tokens"]),  # type: ignore[call-overload]
        ignore_eos=True,
    )
    want = [
        o.token_ids for o in offline.generate([{"prompt_token_ids": prompt}], params)[0].outputs
    ]
    assert got == want
    after = [metrics(pd_stack, i) for i in range(2)]
    # Each output's first token came from the prefill executor, the rest from the decode one.
    name = "quire_executor_generation_tokens_total"
    n = params.n
    assert total(after[0], name) - total(before[0], name) == n
    assert total(after[1], name) - total(before[1], name) == n * (params.max_tokens - 1)
    pulled = "quire_executor_pulled_blocks_total"
    assert total(after[1], pulled) > total(before[1], pulled)


def test_the_router_counts_handoffs(pd_stack: Stack) -> None:
    c = pd_stack.config
    samples, _ = scrape(f"{c.router_admin_url}/metrics")
    assert total(samples, "quire_router_handoffs_total", outcome="continued") >= 6
    assert total(samples, "quire_router_handoffs_total", outcome="failed") == 0


def test_one_token_requests_are_not_handed_on(pd_stack: Stack) -> None:
    c = pd_stack.config
    before = total(scrape(f"{c.router_admin_url}/metrics")[0], "quire_router_handoffs_total")
    assert served(pd_stack, {"prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0}) != [[]]
    after = total(scrape(f"{c.router_admin_url}/metrics")[0], "quire_router_handoffs_total")
    assert after == before
