"""Bad input: every malformed body is a 4xx naming the problem, and the router keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.services.router.conftest import Cluster, RouterHandle
from tests.services.router.fake_executor import Script
from tests.services.router.test_errors import assert_error

CHAT = [{"role": "user", "content": "hi"}]
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def router(module_cluster: Cluster, tokenizer: Any) -> RouterHandle:
    module_cluster.script(
        Script(tokens=tokenizer.encode(" one two three", add_special_tokens=False))
    )
    return module_cluster.router(max_body_bytes=MAX_BODY)


@pytest.fixture(scope="module")
def http(router: RouterHandle) -> Iterator[httpx.Client]:
    with router.http() as client:
        yield client


def still_serving(http: httpx.Client) -> None:
    """A normal request right after the bad one succeeds."""
    response = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 129}, "n"),
        ({"prompt": "x", "n": "many"}, "n"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 10**9}, "prompt"),
        ({"prompt": "x", "max_tokens": 2**80}, "prompt"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "top_k": 2**40}, "top_k"),
        ({"prompt": "x", "seed": 2**70}, "seed"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop"),
        ({"prompt": "x", "stop": "s" * 1025}, "stop"),
        ({"prompt": "x", "stop": 5}, "stop"),
        ({"prompt": "x", "stop_token_ids": [2**32]}, "stop_token_ids"),
        ({"prompt": "x", "stop_token_ids": [1] * 257}, "stop_token_ids"),
        ({"prompt": "x", "stream": "yes please"}, "stream"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"-5": 1}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"4096": 1}}, "logit_bias"),  # quire-tiny's vocab: 4096
        ({"prompt": "x", "logit_bias": {"5": "up"}}, "logit_bias"),
        ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt": "x", "best_of": 1, "n": 2}, "best_of"),
        ({"prompt": "x", "best_of": 3, "stream": True}, "best_of"),
        ({"prompt": "x", "best_of": 10**6}, "best_of"),
        (
            {"prompt": "x", "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
        ),
        ({"prompt": "x", "guided_regex": "(("}, "guided_regex"),
    ],
)
def test_completion_bad_fields(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    error = assert_error(http.post("/v1/completions", json=body), 400, param)
    assert error["type"] == "invalid_request_error"
    still_serving(http)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
        ({"messages": CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": CHAT, "max_completion_tokens": 10**6}, "max_completion_tokens"),
        ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools.0.function"),
        ({"messages": CHAT, "n": 10**6}, "n"),
        ({"messages": CHAT, "logit_bias": {"1": -101}}, "logit_bias"),
        ({"messages": CHAT, "logit_bias": {"99999": 1}}, "logit_bias"),
        ({"messages": CHAT, "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
    ],
)
def test_chat_bad_fields(http: httpx.Client, body: dict[str, Any], param: str | None) -> None:
    assert_error(http.post("/v1/chat/completions", json=body), 400, param)
    still_serving(http)


def test_unknown_harmless_fields_are_ignored(http: httpx.Client) -> None:
    body = {"messages": CHAT, "max_tokens": 3, "metadata": {"a": 1}, "tool_choice": "none"}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    body = {"prompt": "x", "max_tokens": 3, "frobnicate": True, "logit_bias": {}}
    assert http.post("/v1/completions", json=body).status_code == 200


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"prompt": "x",', "not valid JSON"),
        (b"", None),
        (b"[1, 2]", None),
        (b'{"prompt": "x", "temperature": NaN}', "temperature"),
        (b'{"prompt": "x", "temperature": Infinity}', "temperature"),
        (b'{"prompt": "x", "top_p": 1e999}', "top_p"),
        (b'{"prompt": "\xff\xfe"}', "UTF-8"),
    ],
)
def test_malformed_bodies(http: httpx.Client, content: bytes, fragment: str | None) -> None:
    response = http.post(
        "/v1/completions", content=content, headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400)
    if fragment is not None:
        assert fragment in error["message"]
    still_serving(http)


def test_wrong_content_type_is_415(http: httpx.Client) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = http.post(
            "/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": content_type}
        )
        assert content_type in assert_error(response, 415)["message"]
    # A body without any Content-Type (curl without -H) is refused the same way.
    assert_error(http.post("/v1/completions", content=b'{"prompt": "x"}'), 415)
    # JSON with a charset, or a +json type, is parsed as JSON.
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        response = http.post(
            "/v1/completions",
            content=b'{"prompt": "x", "max_tokens": 2}',
            headers={"content-type": content_type},
        )
        assert response.status_code == 200, response.text


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    big = {"prompt": "x" * (MAX_BODY + 1)}
    error = assert_error(http.post("/v1/completions", json=big), 413)
    assert str(MAX_BODY) in error["message"]
    still_serving(http)


def test_chunked_body_over_the_limit_is_413(router: RouterHandle) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(2 * MAX_BODY // 4096):
            yield b"x" * 4096
        yield b'"}'

    with router.http() as http:
        response = http.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert "content-length" not in response.request.headers
        assert_error(response, 413)
    with router.http() as http:
        still_serving(http)


def test_prompt_longer_than_context_is_400(http: httpx.Client) -> None:
    body = {"prompt": [5] * 5000, "max_tokens": 1}
    error = assert_error(http.post("/v1/completions", json=body), 400, "prompt")
    assert error["code"] == "context_length_exceeded"
    still_serving(http)
