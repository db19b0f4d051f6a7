"""Errors in OpenAI's shape: 400, 404, 503; disconnects abort."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.services.conftest import wait_for
from tests.services.router.conftest import MODEL_NAME, Cluster
from tests.services.router.fake_executor import Script

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "top_p": 5}, "top_p"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "logprobs": 99}, "logprobs"),
        ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, 99999]}, "prompt"),
        ({"prompt": "x", "best_of": 2, "n": 3}, "best_of"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({}, "prompt"),
    ],
)
def test_completion_400(cluster: Cluster, body: dict[str, Any], param: str) -> None:
    router = cluster.router()
    with router.http() as http:
        assert_error(http.post("/v1/completions", json=body), 400, param)


def test_chat_400(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        assert_error(http.post("/v1/chat/completions", json={"messages": []}), 400, "messages")
        bad_role = {"messages": [{"role": "wizard", "content": "x"}]}
        assert_error(http.post("/v1/chat/completions", json=bad_role), 400)
        top_only = {"messages": CHAT, "top_logprobs": 2}
        assert_error(http.post("/v1/chat/completions", json=top_only), 400, "top_logprobs")
        # Invalid JSON is a 400 too, not FastAPI's 422.
        error = assert_error(
            http.post(
                "/v1/chat/completions",
                content=b"{not json",
                headers={"content-type": "application/json"},
            ),
            400,
        )
        assert "JSON" in error["message"]
    # The openai client maps it to BadRequestError.
    with pytest.raises(openai.BadRequestError):
        router.openai().chat.completions.create(model=MODEL_NAME, messages=CHAT, n=0)


def test_prompt_longer_than_context(cluster: Cluster) -> None:
    router = cluster.router(max_model_len=64)
    with router.http() as http:
        error = assert_error(
            http.post("/v1/completions", json={"prompt": list(range(5, 70))}), 400, "prompt"
        )
        assert error["code"] == "context_length_exceeded"
        error = assert_error(
            http.post("/v1/completions", json={"prompt": list(range(5, 55)), "max_tokens": 20}),
            400,
        )
        assert "64" in error["message"]
        # Chat without max_tokens gets the rest of the context.
        ok = http.post("/v1/chat/completions", json={"messages": CHAT})
        assert ok.status_code == 200
    (request,) = [r for f in cluster.fakes.values() for r in f.executor.requests]
    assert request.params.max_tokens == 64 - len(request.prompt_token_ids)


def test_unknown_model_404(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        error = assert_error(
            http.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, "model"
        )
        assert error["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        router.openai().chat.completions.create(model="gpt-9", messages=CHAT)
    served = cluster.router(served_model_name="tiny-chat")
    ok = served.openai().chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=1)
    assert ok.model == "tiny-chat"


def test_executor_invalid_argument_is_400(cluster: Cluster) -> None:
    cluster.script(Script(error=grpc.StatusCode.INVALID_ARGUMENT, error_message="top_k is weird"))
    router = cluster.router()
    with router.http() as http:
        error = assert_error(http.post("/v1/completions", json={"prompt": "x"}), 400)
        assert "top_k is weird" in error["message"]
        stream = http.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert_error(stream, 400)


def test_no_executor_503(cluster: Cluster) -> None:
    router = cluster.router(redis_prefix="empty-prefix")
    with router.http() as http, router.admin() as admin:
        error = assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503)
        assert error["type"] == "service_unavailable_error"
        assert_error(http.get("/health"), 503)
        metrics = admin.get("/metrics").text
    assert 'quire_router_admission_rejections_total{code="503"} 1.0' in metrics


def test_draining_executors_are_not_used(cluster: Cluster) -> None:
    for executor_id in cluster.fakes:
        cluster.publish(executor_id, draining=True)
    router = cluster.router()
    with router.http() as http:
        assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503)
        cluster.publish("ex-b")
        ok = http.post("/v1/completions", json={"prompt": "x"})
    assert ok.status_code == 200 and ok.headers["x-quire-executor"] == "ex-b"


def test_non_streaming_disconnect_aborts(cluster: Cluster) -> None:
    cluster.script(Script(tokens=[50] * 40, delay_s=0.1))
    router = cluster.router()
    with router.http(timeout=0.8) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": 40})
    fakes = [f.executor for f in cluster.fakes.values()]
    wait_for(lambda: sum(len(f.cancelled) for f in fakes) == 1, 5, "the call to be cancelled")
    assert all(f.completed == [] for f in fakes)


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_before_first_token_aborts(cluster: Cluster, stream: bool) -> None:
    cluster.script(Script(tokens=[50, 2], first_delay_s=30.0))
    router = cluster.router()
    with router.http(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json={"prompt": "x", "stream": stream})
    fakes = [f.executor for f in cluster.fakes.values()]
    # The fake holds its first token 30 s: the cancel, not the end of the stream, ends the call
    # (a loaded machine noticed the disconnect 1.7 s late once; 3 s of slack was too little).
    wait_for(lambda: sum(len(f.cancelled) for f in fakes) == 1, 10, "the call to be cancelled")
    wait_for(lambda: router.state.admission.num_pending == 0, 10, "the admission slot to be freed")


def test_concurrent_requests_all_succeed(cluster: Cluster) -> None:
    cluster.script(Script(tokens=[50, 51, 2], delay_s=0.01))
    router = cluster.router()
    client = router.openai()
    failures: list[BaseException] = []

    def one(i: int) -> None:
        try:
            client.completions.create(model=MODEL_NAME, prompt=f"p{i}", max_tokens=3)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
