"""Locust users for a running Quire router: streaming chat and completions, tenants, TTFT/ITL.

    locust -f loadtests/locustfile.py --headless -u 16 -r 4 -t 60s --host http://127.0.0.1:8000

(`make loadtest` runs that and writes bench/results/loadtest*). Run it from the repository
root: the workload comes from loadtests/workload.py, configured by QUIRE_LOAD_* variables.

Besides the requests themselves (response time = the whole stream, first byte to [DONE]),
every stream reports two latency series as Locust entries of type "SSE":
"TTFT chat" / "TTFT completion" (request sent -> first text) and "ITL chat" /
"ITL completion" (the gap between consecutive text chunks). A request fails on a non-200
status, an SSE error event, a missing [DONE], a broken stream, or, with ignore_eos,
fewer tokens than max_tokens.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any, ClassVar

import requests
from locust import HttpUser, between, events, task
from locust.clients import ResponseContextManager

from benchmarks.common.sse import StreamRecord
from loadtests.workload import (
    LoadConfig,
    RequestPlan,
    plan_request,
    plan_sharegpt_request,
    sharegpt_pool,
    tenant_system_prompts,
)

CONFIG = LoadConfig.from_env()
SYSTEM_PROMPTS = tenant_system_prompts(CONFIG)
# Sampled and tokenized once per Locust process, before any user starts.
POOL = sharegpt_pool(CONFIG) if CONFIG.dataset == "sharegpt" else []
if POOL:
    from transformers import AutoTokenizer

    _TOKENIZER = AutoTokenizer.from_pretrained(CONFIG.tokenizer)
_user_numbers = itertools.count()


def read_stream(resp: ResponseContextManager, sent: float) -> tuple[StreamRecord, int]:
    """Consume the SSE body into a record (benchmarks.common.sse); also its size in bytes."""
    record = StreamRecord(start=sent, status=resp.status_code)
    num_bytes = 0
    try:
        for raw in resp.iter_lines():
            num_bytes += len(raw) + 1
            if not record.feed_line(raw.decode("utf-8", errors="replace"), time.perf_counter()):
                break
    except requests.RequestException as exc:
        record.exception = exc
        record.fail(f"broken stream: {exc!r}")
    record.finish(time.perf_counter())
    return record, num_bytes


def report(name: str, response_time_ms: float, length: int = 0) -> None:
    """One sample of a latency series, as a Locust entry of type SSE."""
    events.request.fire(
        request_type="SSE",
        name=name,
        response_time=response_time_ms,
        response_length=length,
        exception=None,
        context={},
    )


class StreamingUser(HttpUser):
    """A client of one tenant, sending streaming chat and completion requests."""

    wait_time = between(0, CONFIG.think_s)
    # Learned from GET /v1/models by the first user that needs them.
    model: ClassVar[str | None] = CONFIG.model or None
    max_model_len: ClassVar[int] = 0

    def on_start(self) -> None:
        number = next(_user_numbers)
        self.rng = random.Random(f"{time.time_ns()}-{number}")
        self.system = SYSTEM_PROMPTS[self.rng.randrange(len(SYSTEM_PROMPTS))]
        if StreamingUser.model is None or not StreamingUser.max_model_len:
            self._learn_model()

    def _learn_model(self) -> None:
        resp = self.client.get("/v1/models", name="/v1/models")
        if resp.status_code != 200:
            return  # the requests below fail and say why
        card = resp.json()["data"][0]
        StreamingUser.model = StreamingUser.model or card["id"]
        StreamingUser.max_model_len = int(card.get("max_model_len") or 2048)

    @task(CONFIG.chat_weight)
    def chat(self) -> None:
        plan = self._plan()
        self._stream("/v1/chat/completions", plan.chat_body(CONFIG, self.model or ""), plan, "chat")

    @task(CONFIG.completion_weight)
    def completion(self) -> None:
        plan = self._plan()
        body = plan.completion_body(CONFIG, self.model or "")
        self._stream("/v1/completions", body, plan, "completion")

    def _plan(self) -> RequestPlan:
        max_model_len = self.max_model_len or 2048
        if POOL:
            prompt = POOL[self.rng.randrange(len(POOL))]
            return plan_sharegpt_request(
                CONFIG, self.system, prompt, max_model_len, _TOKENIZER.decode
            )
        return plan_request(CONFIG, self.system, self.rng, max_model_len)

    def _stream(self, path: str, body: dict[str, Any], plan: RequestPlan, kind: str) -> None:
        sent = time.perf_counter()
        with self.client.post(
            path, json=body, stream=True, catch_response=True, timeout=CONFIG.timeout_s
        ) as resp:
            if resp.status_code != 200:
                detail = repr(resp.error) if resp.status_code == 0 else resp.text[:300]
                resp.failure(f"HTTP {resp.status_code}: {detail}")
                return
            record, num_bytes = read_stream(resp, sent)
            # The entry's response time is the whole stream, not just the headers.
            resp.request_meta["response_time"] = (time.perf_counter() - sent) * 1000
            resp.request_meta["response_length"] = num_bytes
            completion_tokens = record.usage.completion_tokens if record.usage else None
            if CONFIG.ignore_eos and completion_tokens != plan.max_tokens:
                record.fail(
                    f"{completion_tokens} tokens generated, asked {plan.max_tokens} with ignore_eos"
                )
            if record.error:
                resp.failure(record.error)
                return
            resp.success()
        if record.ttft is not None:
            report(f"TTFT {kind}", record.ttft * 1000)
        for gap in record.itl:
            report(f"ITL {kind}", gap * 1000)
