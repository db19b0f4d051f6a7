"""Mid-stream migration against fake executors: what the router sends as a continuation, and
what the client sees when an executor is lost after the first token."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from tests.services.conftest import wait_for
from tests.services.router.conftest import MODEL_NAME, Cluster, RouterHandle
from tests.services.router.fake_executor import EOS, Script

TOKENS = [400 + i for i in range(10)]  # ten tokens, then EOS: finish "stop"
OTHER = [600 + i for i in range(10)]


def stream_completion(router: RouterHandle, **body: Any) -> list[dict[str, Any]]:
    """Every event of a streamed completion ([DONE] checked and left out)."""
    request = {"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 20, "stream": True}
    with router.http() as http:
        response = http.post("/v1/completions", json={**request, **body})
    assert response.status_code == 200, response.text
    events = [e[len("data: ") :] for e in response.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]", events
    return [json.loads(e) for e in events[:-1]]


def choices_of(events: list[dict[str, Any]]) -> dict[int, tuple[str, list[str], str | None]]:
    """Per choice: its text, its tokens' logprob entries, its finish reason."""
    out: dict[int, tuple[str, list[str], str | None]] = {}
    for event in events:
        for choice in event.get("choices", []):
            text, tokens, finish = out.get(choice["index"], ("", [], None))
            logprobs = choice.get("logprobs") or {}
            out[choice["index"]] = (
                text + choice["text"],
                tokens + list(logprobs.get("tokens") or []),
                choice["finish_reason"] or finish,
            )
    return out


def continuations(cluster: Cluster) -> list[Any]:
    return [
        r for f in cluster.fakes.values() for r in f.executor.requests if r.HasField("continuation")
    ]


def metric(router: RouterHandle, outcome: str) -> float:
    with router.admin() as admin:
        for line in admin.get("/metrics").text.splitlines():
            if line.startswith(f'quire_router_migrations_total{{outcome="{outcome}"}}'):
                return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("fail_code", [grpc.StatusCode.UNAVAILABLE, None])
def test_a_lost_stream_goes_on_elsewhere(
    cluster: Cluster, fail_code: grpc.StatusCode | None
) -> None:
    """UNAVAILABLE, or a stream that just ends, after 3 tokens: the client's stream goes on
    from another executor, token for token as if nothing happened, usage included."""
    router = cluster.router()
    cluster.script(Script(tokens=[*TOKENS, EOS]))
    whole = stream_completion(router, logprobs=1, stream_options={"include_usage": True})
    cluster.script(Script(tokens=[*TOKENS, EOS], fail_after=3, fail_code=fail_code))
    moved = stream_completion(router, logprobs=1, stream_options={"include_usage": True})
    assert choices_of(moved) == choices_of(whole)
    assert choices_of(moved)[0][2] == "stop"
    assert moved[-1]["usage"] == whole[-1]["usage"]
    assert moved[-1]["usage"]["completion_tokens"] == len(TOKENS) + 1
    [lost] = [f for f in cluster.fakes.values() if f.executor.failed]
    [continued] = continuations(cluster)
    assert continued.continuation.output_index == 0
    assert list(continued.continuation.token_ids) == TOKENS[:3]
    assert list(continued.prompt_token_ids) == [5, 6, 7]
    assert continued.params.max_tokens == 20 and continued.params.logprobs == 1
    assert continued not in lost.executor.requests  # never back to the lost executor
    assert metric(router, "continued") == 1


def test_n2_outputs_migrate_independently(cluster: Cluster) -> None:
    """Each unfinished output continues as its own call, under its own index, with its own
    tokens; an output that had finished before the loss is not continued."""
    router = cluster.router()
    short = [700, 701, EOS]  # output 1 finishes with the 3rd message, before the loss
    script = Script(tokens_by_index={0: [*TOKENS, EOS], 1: short, 2: [*OTHER, EOS]})
    cluster.script(script)
    whole = stream_completion(router, n=3)
    script.fail_after = 4
    cluster.script(script)
    moved = stream_completion(router, n=3)
    assert choices_of(moved) == choices_of(whole)
    continued = {r.continuation.output_index: r for r in continuations(cluster)}
    assert sorted(continued) == [0, 2]
    assert list(continued[0].continuation.token_ids) == TOKENS[:4]
    assert list(continued[2].continuation.token_ids) == OTHER[:4]
    assert all(r.params.n == 3 for r in continued.values())  # the seeds follow n
    assert metric(router, "continued") == 1  # one lost stream, two continuations


def test_past_max_migrations_the_stream_ends_with_an_error(cluster: Cluster) -> None:
    router = cluster.router(max_migrations=1)
    cluster.script(Script(tokens=[*TOKENS, EOS]))
    first_four = choices_of(stream_completion(router, max_tokens=4))[0][0]
    cluster.script(Script(tokens=[*TOKENS, EOS], fail_after=2, fail_continuations=True))
    events = stream_completion(router)
    assert events[-1]["error"]["code"] == "executor_unavailable"
    # Two tokens from the first executor, two from the continuation, nothing twice.
    assert choices_of(events[:-1])[0][0] == first_four
    assert len(continuations(cluster)) == 1
    assert metric(router, "continued") == 1 and metric(router, "exhausted") == 1


def test_non_streamed_requests_migrate_too(cluster: Cluster) -> None:
    router = cluster.router()
    cluster.script(Script(tokens=[*TOKENS, EOS], fail_after=5))
    with router.http() as http:
        body = {"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 20}
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == len(TOKENS) + 1
    [continued] = continuations(cluster)
    assert list(continued.continuation.token_ids) == TOKENS[:5]


def test_without_migrations_the_loss_is_an_error_event(cluster: Cluster) -> None:
    router = cluster.router(max_migrations=0)
    cluster.script(Script(tokens=[*TOKENS, EOS], fail_after=3))
    events = stream_completion(router)
    assert events[-1]["error"]["code"] == "executor_unavailable"
    assert not continuations(cluster)
    assert metric(router, "exhausted") == 1


def test_a_lost_executor_s_streams_are_migrated(cluster: Cluster) -> None:
    """`Dispatcher.lose_executor` (the liveness watch, a hang detector) moves the streams of
    an executor that is still connected but declared lost."""
    router = cluster.router()
    cluster.script(Script(tokens=[*TOKENS, EOS], delay_s=0.2))
    state = router.state
    with router.http() as http:
        body = {"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 20, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            [executor_id] = state.dispatcher.executors_with_streams()
            cluster.bg.run(_lose(state, executor_id))
            rest = [line for line in lines if line.startswith("data: ")]
    events = [json.loads(e[len("data: ") :]) for e in [first, *rest[:-1]]]
    assert rest[-1] == "data: [DONE]"
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == choices_of(stream_completion(router))[0][0]
    [continued] = continuations(cluster)
    assert continued.continuation.token_ids  # it had tokens: a continuation, not a retry
    wait_for(lambda: cluster.fakes[executor_id].executor.cancelled != [], 5)
    assert executor_id in state.directory.down_executors()


async def _lose(state: Any, executor_id: str) -> None:
    assert state.dispatcher.lose_executor(executor_id, "liveness record gone") == 1
