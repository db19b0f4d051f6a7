"""logit_bias, echo, best_of, prompt_logprobs and /tokenize through the real stack, with the
official openai client (and httpx for the routes it has no method for)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from quire import LLM, SamplingParams
from services.stack.runner import Stack
from tests.integration.conftest import REPO, STACK_DTYPE

MODEL = "quire-tiny"
PROMPT = "The paged cache keeps"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.config.router_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.config.router_url, timeout=30)


def _ids(http: httpx.Client, text: str, add_special_tokens: bool = False) -> list[int]:
    body = {"model": MODEL, "prompt": text, "add_special_tokens": add_special_tokens}
    tokens: list[int] = http.post("/tokenize", json=body).json()["tokens"]
    return tokens


def _text(http: httpx.Client, tokens: list[int]) -> str:
    prompt: str = http.post("/detokenize", json={"model": MODEL, "tokens": tokens}).json()["prompt"]
    return prompt


def test_logit_bias_bans_and_forces(client: openai.OpenAI, http: httpx.Client) -> None:
    def first_token(**kwargs: object) -> int:
        out = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, **kwargs
        )
        return _ids(http, out.choices[0].text)[0]

    plain = first_token()
    assert first_token(logit_bias={str(plain): -100}) != plain
    forced = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logit_bias={"7": 100}
    )
    assert forced.choices[0].text == _text(http, [7, 7, 7])
    # Streamed and chat: the same bias, the same effect.
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=3, temperature=0, logit_bias={"7": 100}, stream=True
    )
    content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert content == _text(http, [7, 7, 7])


def test_echo_with_logprobs_covers_the_prompt(client: openai.OpenAI, http: httpx.Client) -> None:
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    choice, usage = out.choices[0], out.usage
    assert choice.text == PROMPT + plain.choices[0].text
    lp = choice.logprobs
    assert lp is not None and usage is not None
    assert len(lp.tokens) == usage.prompt_tokens + usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(top) >= 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    # The generated part's offsets point into the text past the echoed prompt.
    first_out = usage.prompt_tokens
    assert choice.text[lp.text_offset[first_out] :].startswith(lp.tokens[first_out])
    # Streamed: the prompt comes first, then the same completion.
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text


def test_prompt_logprobs_match_the_offline_engine(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    prompt_ids = _ids(http, PROMPT, add_special_tokens=True)
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    got = out.choices[0].prompt_logprobs  # type: ignore[attr-defined]
    assert len(got) == len(prompt_ids) and got[0] is None
    offline = LLM(model=str(REPO / "models" / "quire-tiny"), dtype=STACK_DTYPE)  # as the stack
    ref = offline.generate(
        [{"prompt_token_ids": prompt_ids}],
        SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1),
        use_tqdm=False,
    )[0].prompt_logprobs
    assert ref is not None
    for token_id, entry, expected in zip(prompt_ids[1:], got[1:], ref[1:], strict=True):
        mine = entry[str(token_id)]
        assert mine["logprob"] == pytest.approx(expected[token_id].logprob, abs=0.05)
        assert mine["decoded_token"] == _text(http, [token_id])
        assert 1 <= len(entry) <= 2 and any(v["rank"] == 1 for v in entry.values())
    # Chat carries them at the top level of the response.
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    assert chat.usage is not None
    chat_lp = chat.prompt_logprobs  # type: ignore[attr-defined]
    assert len(chat_lp) == chat.usage.prompt_tokens and chat_lp[0] is None
    assert all(len(e) == 1 for e in chat_lp[1:])  # k = 0: only the prompt token itself


def test_best_of_returns_the_best_n_by_cumulative_logprob(client: openai.OpenAI) -> None:
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "seed": 11, "logprobs": 0}
    every = client.completions.create(n=4, **args)  # type: ignore[call-overload]
    best = client.completions.create(n=2, best_of=4, **args)  # type: ignore[call-overload]

    def score(choice: object) -> float:
        return math.fsum(choice.logprobs.token_logprobs)  # type: ignore[attr-defined]

    ranked = sorted(every.choices, key=score, reverse=True)
    assert [c.index for c in best.choices] == [0, 1]
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert score(best.choices[0]) >= score(best.choices[1])
    # Usage counts the returned choices' tokens, as vLLM does.
    assert best.usage is not None
    assert best.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in best.choices)  # type: ignore[union-attr]


def test_tokenize_detokenize_round_trip(client: openai.OpenAI, http: httpx.Client) -> None:
    text = "Ünïcödé 漢字 and the paged cache"
    tokenized = http.post(
        "/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True}
    ).json()
    completion = client.completions.create(model=MODEL, prompt=text, max_tokens=1)
    assert completion.usage is not None
    assert tokenized["count"] == len(tokenized["tokens"]) == completion.usage.prompt_tokens
    assert tokenized["max_model_len"] == 2048 and len(tokenized["token_strs"]) == tokenized["count"]
    assert _text(http, _ids(http, text)) == text
    chat = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    assert reply.usage is not None and chat["count"] == reply.usage.prompt_tokens
    assert http.post("/tokenize", json={"model": "nope", "prompt": "x"}).status_code == 404
    bad = http.post("/detokenize", json={"model": MODEL, "tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = http.post("/tokenize", json={"prompt": "x", "messages": CHAT})
    assert both.status_code == 400


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"logit_bias": {"4096": 5}}, "logit_bias"),
        ({"logit_bias": {"3": 250}}, "logit_bias"),
        ({"best_of": 3, "stream": True}, "best_of"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"extra_body": {"prompt_logprobs": 2}, "stream": True}, "prompt_logprobs"),
    ],
)
def test_bad_parameters_are_400s_naming_the_field(
    client: openai.OpenAI, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, **kwargs)
    body = caught.value.body
    assert isinstance(body, dict) and body.get("param") == param


def test_echo_and_best_of_number_choices_per_prompt(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    ids = _ids(http, "Token ids in")
    out = client.completions.create(
        model=MODEL, prompt=[ids, [*ids, 11]], max_tokens=2, n=2, best_of=3, echo=True, seed=1
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.text.startswith(_text(http, ids)) for c in out.choices[:2])
    assert all(c.text.startswith(_text(http, [*ids, 11])) for c in out.choices[2:])
