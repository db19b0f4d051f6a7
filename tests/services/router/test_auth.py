"""API keys: 401s in OpenAI's shape, open and protected routes, the key file, no key in logs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from services.router.auth import ApiKeys, bearer_token, is_protected, key_id
from tests.services.conftest import wait_for
from tests.services.router.conftest import MODEL_NAME, Cluster

KEY = "sk-quire-test-0123456789"
OTHER = "sk-quire-other-9876543210"


def test_api_keys_check_and_parse(tmp_path: Path) -> None:
    keys = ApiKeys(["a", " b ", ""])
    assert keys.is_enabled and keys.num_keys == 2
    assert keys.check("a") and keys.check("b")
    assert not keys.check("c") and not keys.check("") and not keys.check("a ")
    assert not ApiKeys().is_enabled
    with pytest.raises(ValueError, match="api-keys-file"):
        ApiKeys(path=str(tmp_path / "missing"))
    assert key_id("a") != "a" and len(key_id("a")) == 64
    assert bearer_token({"headers": [(b"authorization", b"Bearer  xyz ")]}) == "xyz"
    assert bearer_token({"headers": [(b"authorization", b"Basic xyz")]}) is None
    assert is_protected("/v1/models") and is_protected("/cluster/status")
    assert is_protected("/dashboard/state")
    assert not is_protected("/health") and not is_protected("/metrics")


def test_keys_required_on_protected_routes(cluster: Cluster) -> None:
    router = cluster.router(api_keys=[KEY, OTHER])
    with router.http() as http, router.admin() as admin:
        missing = http.get("/v1/models")
        wrong = http.get("/v1/models", headers={"Authorization": "Bearer sk-wrong-key"})
        posted = http.post("/v1/completions", json={"prompt": "hi"})
        headers = {"Authorization": f"Bearer {OTHER}"}
        ok = {
            "/v1/models": http.get("/v1/models", headers=headers).status_code,
            "/cluster/status": admin.get("/cluster/status", headers=headers).status_code,
        }
        open_routes = {
            "/health": http.get("/health").status_code,
            "/metrics": admin.get("/metrics").status_code,
        }
        closed = [admin.get(p).status_code for p in ("/cluster/status", "/dashboard/state")]
    for response in (missing, wrong, posted):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["x-request-id"]
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "invalid_api_key"
    assert "sk-wrong-key" not in wrong.text
    assert ok == {"/v1/models": 200, "/cluster/status": 200}
    assert open_routes == {"/health": 200, "/metrics": 200}
    assert closed == [401, 401]
    client = router.openai()
    client.api_key = KEY
    completion = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert completion.choices[0].text == " one two"


def test_auth_off_without_keys(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        assert http.get("/v1/models").status_code == 200


def test_key_file_is_reread_when_it_changes(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated monthly\n{KEY}\n\n")
    router = cluster.router(api_keys_file=str(path))
    with router.http() as http:
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success
        path.write_text(f"{OTHER}\n")
        os.utime(path, ns=(1, 1))  # a different mtime even within the clock's resolution
        old = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        new = http.get("/v1/models", headers={"Authorization": f"Bearer {OTHER}"})
        path.unlink()  # mid-rotation: the last keys stay in force
        kept = http.get("/v1/models", headers={"Authorization": f"Bearer {OTHER}"})
    assert (old.status_code, new.status_code, kept.status_code) == (401, 200, 200)


def test_keys_never_logged(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    router = cluster.router(api_keys=[KEY], log_prompts=True, log_level="debug")
    caplog.set_level(logging.DEBUG)
    with capture_logs() as events, router.http() as http:
        good = http.post(
            "/v1/completions",
            json={"prompt": "hello", "max_tokens": 2},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        bad = http.get("/v1/models", headers={"Authorization": "Bearer sk-presented-wrong"})
        # The access log line is written after the response has gone out.
        wait_for(
            lambda: any(e.get("event") == "request" and e.get("status") == 401 for e in events),
            what="the 401's access log line",
        )
    assert (good.status_code, bad.status_code) == (200, 401)
    logged = repr(events) + caplog.text
    for secret in (KEY, "sk-presented-wrong"):
        assert secret not in logged
    assert "authorization" not in logged.lower()


def test_tokenize_routes_need_a_key_too(cluster: Cluster) -> None:
    router = cluster.router(api_keys=[KEY])
    body = {"prompt": "hello there"}
    with router.http() as http:
        refused = [
            http.post(p, json=b) for p, b in (("/tokenize", body), ("/detokenize", {"tokens": [5]}))
        ]
        auth = {"Authorization": f"Bearer {KEY}"}
        tokens = http.post("/tokenize", json=body, headers=auth).json()["tokens"]
        text = http.post("/detokenize", json={"tokens": tokens[1:]}, headers=auth).json()
    assert [r.status_code for r in refused] == [401, 401]
    assert text == {"prompt": "hello there"}
