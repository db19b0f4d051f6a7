"""Request ids in and out, the request-duration histogram, and --log-prompts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from services.router import generation
from services.router.router_logging import request_id_from_header
from tests.services.router.conftest import MODEL_NAME, Cluster


class RecordingLog:
    """Stands in for a module's structlog logger."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


@pytest.mark.parametrize(
    ("header", "kept"),
    [("abc-123", True), ("trace/7:a@b.c+=~_", True), ("two words", False), ("a,b", False)],
)
def test_request_id_from_header(header: str, kept: bool) -> None:
    got = request_id_from_header(header)
    assert (got == header) is kept
    if not kept:
        assert re.fullmatch(r"[0-9a-f]{32}", got)
    assert re.fullmatch(r"[0-9a-f]{32}", request_id_from_header(None))
    assert request_id_from_header("x" * 129) != "x" * 129


def test_request_ids_and_durations(cluster: Cluster) -> None:
    router = cluster.router()
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
    with router.http() as http, router.admin() as admin:
        kept = http.post("/v1/completions", json=body, headers={"x-request-id": "rid-1"})
        replaced = http.post("/v1/completions", json=body, headers={"x-request-id": "r 1"})
        text = admin.get("/metrics").text
    assert kept.headers["x-request-id"] == "rid-1"
    assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])
    assert 'quire_router_request_duration_seconds_count{route="/v1/completions"} 2.0' in text
    assert 'quire_router_requests_total{route="/metrics"' not in text  # counted after it


@pytest.mark.parametrize("log_prompts", [False, True])
def test_prompts_and_outputs_logged_only_when_asked(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, log_prompts: bool
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(generation, "log", log)
    router = cluster.router(log_prompts=log_prompts)
    router.openai().completions.create(model=MODEL_NAME, prompt="secret words", max_tokens=3)
    events = dict(log.lines)
    if not log_prompts:
        assert events == {}
        return
    # The prompt as the model sees it (the template's special tokens included).
    [prompt] = events["prompts"]["prompts"]
    assert prompt.endswith("secret words")
    assert events["outputs"]["outputs"] == [" one two three"]
    assert events["outputs"]["finish_reasons"] == ["length"]
