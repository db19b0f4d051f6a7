"""Per-key rate limits in a real Redis: requests and tokens per minute, shared, fail-open."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.router.admission.rate_limits import requested_tokens
from services.router.auth import key_id
from services.stack.ports import free_port
from tests.services.router.conftest import MODEL_NAME, Cluster

KEY_A = "sk-rate-a-0123456789"
KEY_B = "sk-rate-b-0123456789"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _assert_429(response: httpx.Response, limit: str) -> None:
    assert response.status_code == 429
    assert 1 <= int(response.headers["retry-after"]) <= 60
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert limit in error["message"]


def test_requests_per_minute_per_key_shared_by_replicas(cluster: Cluster) -> None:
    first = cluster.router(api_keys=[KEY_A, KEY_B], rate_limit_rpm=2)
    second = cluster.router(api_keys=[KEY_A, KEY_B], rate_limit_rpm=2)
    with first.http() as one, second.http() as two:
        allowed = [one.get("/v1/models", headers=_bearer(KEY_A)).status_code]
        allowed.append(two.get("/v1/models", headers=_bearer(KEY_A)).status_code)
        refused = one.get("/v1/models", headers=_bearer(KEY_A))
        other_key = two.get("/v1/models", headers=_bearer(KEY_B))
        unmetered = one.get("/health")
    assert allowed == [200, 200]
    _assert_429(refused, "requests")
    assert other_key.status_code == 200 and unmetered.status_code == 200
    keys = {k.decode() for k in cluster.redis.keys(f"{cluster.prefix}:ratelimit:*")}
    assert keys == {
        f"{cluster.prefix}:ratelimit:{key_id(KEY_A)}:requests",
        f"{cluster.prefix}:ratelimit:{key_id(KEY_B)}:requests",
    }
    assert not any(KEY_A in k or KEY_B in k for k in keys)
    assert int(cluster.redis.get(f"{cluster.prefix}:ratelimit:{key_id(KEY_A)}:requests")) == 2


def test_tokens_per_minute_charge_prompt_plus_max_tokens(cluster: Cluster, tokenizer: Any) -> None:
    router = cluster.router(rate_limit_tpm=40)  # auth off: one anonymous bucket
    prompt_len = len(router.state.prompts.completion_prompts("hello there")[0])
    body = {"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 8, "n": 2}
    cost = prompt_len + 2 * 8
    with router.http() as http:
        statuses = [http.post("/v1/completions", json=body).status_code for _ in range(40 // cost)]
        refused = http.post("/v1/completions", json=body)
    assert statuses == [200] * (40 // cost)
    _assert_429(refused, "tokens")
    spent = cluster.redis.get(f"{cluster.prefix}:ratelimit:anonymous:tokens")
    assert int(spent) == cost * (40 // cost)  # the refused request cost nothing


class _CountingTokenizer:
    """The router's tokenizer, counting the prompts it encodes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.num_encoded = 0

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.num_encoded += 1
        return list(self.tokenizer.encode(text, **kwargs))

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, **kwargs)


def test_token_limit_charges_the_routes_own_tokens(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = cluster.router(rate_limit_tpm=10_000)
    counting = _CountingTokenizer(router.state.prompts.tokenizer)
    monkeypatch.setattr(router.state.prompts, "tokenizer", counting)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with router.http() as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    # Tokenized once, by the route: the rate limit counts the same ids.
    assert counting.num_encoded == 1
    (request,) = [r for fake in cluster.fakes.values() for r in fake.executor.requests]
    spent = cluster.redis.get(f"{cluster.prefix}:ratelimit:anonymous:tokens")
    assert int(spent) == len(request.prompt_token_ids) + 4


def test_requested_tokens_without_max_tokens_is_the_rest_of_the_context() -> None:
    assert requested_tokens([[1, 2, 3]], n=2, max_tokens=5, max_model_len=100) == 3 + 2 * 5
    assert (
        requested_tokens([[1, 2, 3], [4]], n=1, max_tokens=None, max_model_len=10) == 3 + 7 + 1 + 9
    )


def test_redis_down_fails_open(cluster: Cluster) -> None:
    router = cluster.router(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", rate_limit_rpm=1, rate_limit_tpm=1
    )
    with router.http() as http:
        statuses = [http.get("/v1/models").status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
