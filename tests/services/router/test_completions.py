"""/v1/completions and /v1/chat/completions against fake executors: OpenAI's shapes."""

from __future__ import annotations

import json
import time
from typing import Any

from openai.types.chat import ChatCompletionMessageParam

from tests.services.router.conftest import MODEL_NAME, Cluster
from tests.services.router.fake_executor import Script

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def sse_events(text: str) -> list[str]:
    """Raw `data:` payloads of an SSE body, in order."""
    events = [block for block in text.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def test_completion_non_streaming(cluster: Cluster) -> None:
    router = cluster.router()
    raw = router.openai().completions.with_raw_response.create(
        model=MODEL_NAME, prompt="Hello there", max_tokens=5
    )
    assert raw.headers["x-quire-executor"] in cluster.fakes
    assert raw.headers["x-request-id"]
    body = raw.http_response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL_NAME
    assert body["choices"] == [
        {
            "index": 0,
            "text": " one two three four five",
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ]
    prompt_tokens = len(
        cluster.fakes[raw.headers["x-quire-executor"]].executor.requests[0].prompt_token_ids
    )
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    request = cluster.fakes[raw.headers["x-quire-executor"]].executor.requests[0]
    assert request.params.max_tokens == 5
    assert request.prompt_token_ids[0] == 1  # bos from the tokenizer


def test_completion_streaming_with_usage(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        response = http.post(
            "/v1/completions",
            json={
                "model": MODEL_NAME,
                "prompt": "Hello",
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-quire-executor"] in cluster.fakes
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    *deltas, usage_chunk = chunks
    assert all(c["usage"] is None for c in deltas)
    assert "".join(c["choices"][0]["text"] for c in deltas) == " one two three four"
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas[:-1])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4


def test_streaming_without_usage_has_no_usage_field(cluster: Cluster) -> None:
    router = cluster.router()
    stream = router.openai().completions.create(
        model=MODEL_NAME, prompt="Hello", max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == " one two three"
    assert all(c.usage is None for c in chunks)
    with router.http() as http:
        body = http.post(
            "/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "stream": True}
        ).text
    assert "usage" not in json.loads(sse_events(body)[0])


def test_chat_non_streaming(cluster: Cluster, tokenizer: Any) -> None:
    router = cluster.router()
    raw = router.openai().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=CHAT, max_completion_tokens=3, temperature=0, seed=5
    )
    executor_id = raw.headers["x-quire-executor"]
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == " one two three"
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    request = cluster.fakes[executor_id].executor.requests[0]
    expected = tokenizer.encode(
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    assert list(request.prompt_token_ids) == expected
    assert expected.count(1) == 1  # one bos, written by the template
    assert request.params.temperature == 0 and request.params.seed == 5
    assert request.params.max_tokens == 3


def test_chat_streaming_shape(cluster: Cluster) -> None:
    router = cluster.router()
    raw = router.openai().chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=CHAT,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-quire-executor"] in cluster.fakes
    chunks = list(raw.parse())
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[1:-1])
    assert text == " one two three four five six seven eight"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10  # 9 text tokens + EOS


def test_chat_stream_raw_ends_with_done(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        text = http.post(
            "/v1/chat/completions", json={"messages": CHAT, "stream": True, "max_tokens": 2}
        ).text
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    first = json.loads(events[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = json.loads(events[-2])
    assert last["choices"][0]["delta"] == {} or "content" in last["choices"][0]["delta"]
    assert last["choices"][0]["finish_reason"] == "length"


def test_multibyte_utf8_split_across_tokens(cluster: Cluster, tokenizer: Any) -> None:
    tokens = tokenizer.encode("héllo 日本", add_special_tokens=False)
    assert len(tokens) >= 6  # 日 and 本 straddle three byte-level tokens
    cluster.script(Script(tokens=tokens + [2]))
    router = cluster.router()
    stream = router.openai().completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=20, stream=True
    )
    pieces = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    assert "".join(pieces) == "héllo 日本"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[-1] == "日本"  # held until the character completes, never half-sent
    non_stream = router.openai().completions.create(model=MODEL_NAME, prompt="x", max_tokens=20)
    assert non_stream.choices[0].text == "héllo 日本"


def test_stop_string_truncates_streaming_and_not(cluster: Cluster, tokenizer: Any) -> None:
    tokens = tokenizer.encode("hello world and more", add_special_tokens=False)
    cluster.script(Script(tokens=tokens, delay_s=0.05))
    router = cluster.router()
    client = router.openai()
    # "o w" spans two tokens: nothing past "hell" may ever be streamed.
    full = client.completions.create(model=MODEL_NAME, prompt="x", stop="o w", max_tokens=20)
    assert full.choices[0].text == "hell"
    assert full.choices[0].finish_reason == "stop"
    assert full.choices[0].model_extra["stop_reason"] == "o w"  # type: ignore[index]
    stream = client.completions.create(
        model=MODEL_NAME, prompt="x", stop=["zzz", "o w"], max_tokens=20, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == "hell"
    assert chunks[-1].choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, stop=["world"], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat) == "hello "
    # The executor is not told the stop strings; the router ends each call at its stop.
    executors = [fake.executor for fake in cluster.fakes.values()]
    assert sum(len(e.requests) for e in executors) == 3
    deadline = time.monotonic() + 5.0  # the last cancel may land after the response
    while sum(len(e.cancelled) for e in executors) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(len(e.cancelled) for e in executors) == 3
    assert not any(e.completed for e in executors)


def test_stop_string_in_one_of_n_outputs_ends_only_that_one(
    cluster: Cluster, tokenizer: Any
) -> None:
    stops = tokenizer.encode("alpha beta STOP gamma delta", add_special_tokens=False)
    runs_on = tokenizer.encode("alpha beta gamma delta epsilon", add_special_tokens=False)
    cluster.script(Script(tokens_by_index={0: stops, 1: runs_on}, delay_s=0.05))
    client = cluster.router().openai()
    out = client.completions.create(model=MODEL_NAME, prompt="x", n=2, stop="STOP", max_tokens=20)
    texts = sorted((c.index, c.text, c.finish_reason) for c in out.choices)
    assert texts == [(0, "alpha beta ", "stop"), (1, "alpha beta gamma delta epsilon", "length")]
    aborts = [a for fake in cluster.fakes.values() for a in fake.executor.aborts]
    assert [indices for _, indices in aborts] == [[0]]


def test_n_and_batch_of_prompts(cluster: Cluster) -> None:
    router = cluster.router()
    client = router.openai()
    out = client.completions.create(model=MODEL_NAME, prompt=["a b", "c d"], n=2, max_tokens=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.text == " one two" for c in out.choices)
    assert out.usage is not None and out.usage.completion_tokens == 8
    out = client.completions.create(model=MODEL_NAME, prompt=[[1, 50, 60], [1, 70]], max_tokens=1)
    assert [c.index for c in out.choices] == [0, 1]
    stream = client.completions.create(
        model=MODEL_NAME, prompt=["a", "b"], max_tokens=3, stream=True
    )
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: " one two three", 1: " one two three"}


def test_logprobs_shapes(cluster: Cluster) -> None:
    router = cluster.router()
    client = router.openai()
    out = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2, logprobs=1)
    lp = out.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == [" one", " two"]
    assert lp.token_logprobs == [-0.25, -0.25]
    assert lp.text_offset == [0, 4]
    assert lp.top_logprobs == [{" one": -0.25}, {" two": -0.25}]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=2, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and [c.token for c in content] == [" one", " two"]
    assert content[0].bytes == list(b" one")
    assert len(content[0].top_logprobs) == 2 and content[0].top_logprobs[0].token == " one"
    sent = [r for f in cluster.fakes.values() for r in f.executor.requests]
    assert [r.params.logprobs for r in sent] == [1, 2]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=1)
    assert plain.choices[0].logprobs is None


def test_sampling_params_reach_the_executor(cluster: Cluster) -> None:
    router = cluster.router()
    router.openai().completions.create(
        model=MODEL_NAME,
        prompt="x",
        max_tokens=3,
        temperature=0.5,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        extra_body={
            "top_k": 7,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "ignore_eos": True,
            "stop_token_ids": [9],
        },
    )
    (request,) = [r for f in cluster.fakes.values() for r in f.executor.requests]
    p = request.params
    assert (p.n, p.max_tokens, p.top_k, p.ignore_eos) == (1, 3, 7, True)
    assert abs(p.temperature - 0.5) < 1e-6 and abs(p.top_p - 0.9) < 1e-6
    assert abs(p.min_p - 0.1) < 1e-6 and abs(p.repetition_penalty - 1.2) < 1e-6
    assert abs(p.presence_penalty - 0.5) < 1e-6 and abs(p.frequency_penalty + 0.5) < 1e-6
    assert list(p.stop_token_ids) == [9] and not p.HasField("logprobs")


def test_return_token_ids_whole_and_streamed(cluster: Cluster, tokenizer: Any) -> None:
    """vLLM's `return_token_ids`: the prompt's ids once per choice, each object's token ids;
    absent from the objects when not asked for."""
    generated = tokenizer.encode(" one two three", add_special_tokens=False)
    router = cluster.router()
    body = {"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 3}
    with router.http() as http:
        plain = http.post("/v1/completions", json=body).json()
        whole = http.post("/v1/completions", json=body | {"return_token_ids": True})
        streamed = http.post(
            "/v1/completions", json=body | {"return_token_ids": True, "stream": True}
        )
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]
    fake = cluster.fakes[whole.headers["x-quire-executor"]].executor
    prompt_ids = list(fake.requests[-1].prompt_token_ids)
    choice = whole.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    assert choice["token_ids"] == generated
    chunks = [json.loads(e)["choices"][0] for e in sse_events(streamed.text)[:-1]]
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == generated
