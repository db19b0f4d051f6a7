"""The load's shape, without Locust: ShareGPT requests, tenants, prompt text, request bodies.

By default (QUIRE_LOAD_DATASET=sharegpt) every user prompt is a real ShareGPT first turn and
its max_tokens the token count of the answer, sampled by vLLM's rule (quire_tools.workloads.sharegpt,
the same requests as the benchmarks'; `make data` prepares the file), a random one per request
from a seeded pool; prompt and output are cut to the caps below and to the model's context.
QUIRE_LOAD_DATASET=synthetic draws text instead: lengths are lognormal with ShareGPT's means (prompt ~161 tokens, output ~338 tokens; the
sigmas give its long tails), capped so smoke runs stay short. Each tenant has a fixed long
system prompt that all its users send first, which is what prefix caching and
prefix-aware routing are for. Text is built from common English words that are
one token each in the quire-tiny tokenizer, as they are in Llama-family tokenizers, so
lengths are close to, not exactly, the sampled token counts.

Every knob is a QUIRE_LOAD_* environment variable (see `LoadConfig.from_env`).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, fields
from typing import Any

from quire_tools.workloads.lengths import lognormal_length

TOKENS_PER_WORD = 1.0
# Chat template and special tokens around the text, and slack for the word estimate.
TEMPLATE_TOKENS = 16
ESTIMATE_SLACK = 1.15

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by this are or from at an which not "
    "have but has they can one more all were when also been its other some into time there "
    "first new so than only most after any these such many where between over about system "
    "memory block cache request token model server data page window garden letter morning "
    "harbor batch layer weight number value quick early small large green blue open you "
    "return each key total water out then make name will light because much need your list "
    "let active days before back count day average word text test three said should made "
    "minutes away short same every long path capacity head next node town already until "
    "again last set ten would sun always body single person line second called what end "
    "true response run like against down times words weather needed here years kept now"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class LoadConfig:
    """What one simulated user sends. Field `x` is read from QUIRE_LOAD_X."""

    prompt_mean: float = 161.0  # mean user-prompt length, tokens (ShareGPT)
    prompt_sigma: float = 0.9  # lognormal sigma of the prompt length
    max_prompt_tokens: int = 1024  # cap on the user prompt
    output_mean: float = 338.0  # mean max_tokens (ShareGPT)
    output_sigma: float = 0.8  # lognormal sigma of max_tokens
    max_tokens: int = 1024  # cap on max_tokens
    num_tenants: int = 4  # distinct system prompts; each user picks one
    system_tokens: int = 400  # length of each tenant's system prompt
    chat_weight: int = 3  # streaming chat requests per `completion_weight` completions
    completion_weight: int = 1
    temperature: float = 0.7
    ignore_eos: bool = True  # generate exactly max_tokens (the sampled output length)
    think_s: float = 1.0  # a user waits up to this long between requests
    timeout_s: float = 600.0  # per request
    model: str = ""  # '' = the first model of GET /v1/models
    dataset: str = "sharegpt"  # sharegpt (real prompts and answer lengths) or synthetic
    data: str = "data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json"  # make data
    tokenizer: str = "models/smollm2-135m-instruct"  # counts ShareGPT tokens (served model's)
    pool_size: int = 1000  # ShareGPT requests sampled once per process, drawn at random
    seed: int = 0  # ShareGPT sampling seed (vLLM's rule)

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens", "num_tenants", "system_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.prompt_mean <= 0 or self.output_mean <= 0:
            raise ValueError("prompt_mean and output_mean must be > 0")
        if self.dataset not in ("sharegpt", "synthetic"):
            raise ValueError(f"dataset: sharegpt or synthetic, got {self.dataset!r}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> LoadConfig:
        """Defaults, overridden by QUIRE_LOAD_<FIELD> variables."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"QUIRE_LOAD_{f.name.upper()}")
            if raw is None:
                continue
            if f.type == "bool":
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif f.type == "int":
                values[f.name] = int(raw)
            elif f.type == "float":
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        return cls(**values)


def words_for(num_tokens: int, rng: random.Random) -> str:
    """Roughly `num_tokens` tokens of text."""
    num_words = max(1, round(num_tokens / TOKENS_PER_WORD))
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def tenant_system_prompts(config: LoadConfig) -> list[str]:
    """One fixed system prompt per tenant: the same text in every process and run."""
    prompts = []
    for tenant in range(config.num_tenants):
        rng = random.Random(f"tenant-{tenant}")
        header = f"You are the assistant of tenant {tenant}. Follow these house rules. "
        prompts.append(header + words_for(config.system_tokens, rng))
    return prompts


@dataclass(frozen=True)
class RequestPlan:
    """One request: the tenant's system prompt, a fresh user prompt, an output length."""

    system: str
    user: str
    max_tokens: int

    def chat_body(self, config: LoadConfig, model: str) -> dict[str, Any]:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user},
        ]
        return self._body(config, model, messages=messages)

    def completion_body(self, config: LoadConfig, model: str) -> dict[str, Any]:
        return self._body(config, model, prompt=f"{self.system}\n\n{self.user}")

    def _body(self, config: LoadConfig, model: str, **content: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            **content,
            "max_tokens": self.max_tokens,
            "temperature": config.temperature,
            "ignore_eos": config.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model:
            body["model"] = model
        return body


@dataclass(frozen=True)
class ShareGPTPrompt:
    """A ShareGPT first turn, its token ids, and the answer's length in tokens."""

    text: str
    token_ids: tuple[int, ...]
    output_len: int


def sharegpt_pool(config: LoadConfig) -> list[ShareGPTPrompt]:
    """config.pool_size ShareGPT requests of config.seed (vLLM's rule), tokenized once."""
    from transformers import AutoTokenizer

    from benchmarks.common.workload import sample_sharegpt

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    sampled = sample_sharegpt(config.data, tokenizer, config.pool_size, config.seed)
    return [ShareGPTPrompt(str(r.prompt), tuple(r.prompt_token_ids), r.output_len) for r in sampled]


def plan_sharegpt_request(
    config: LoadConfig,
    system: str,
    prompt: ShareGPTPrompt,
    max_model_len: int,
    decode: Any,
) -> RequestPlan:
    """One ShareGPT request after the tenant's system prompt, cut to the caps and context."""
    system_tokens = config.system_tokens * ESTIMATE_SLACK + TEMPLATE_TOKENS
    room = max(8, int(max_model_len - system_tokens))
    prompt_cap = max(4, min(config.max_prompt_tokens, room // 2))
    text = prompt.text
    if len(prompt.token_ids) > prompt_cap:
        text = decode(list(prompt.token_ids[:prompt_cap]))
    num_prompt = min(len(prompt.token_ids), prompt_cap)
    output_cap = max(1, min(config.max_tokens, int(room - num_prompt * ESTIMATE_SLACK)))
    return RequestPlan(system, text, max(1, min(prompt.output_len, output_cap)))


def plan_request(
    config: LoadConfig, system: str, rng: random.Random, max_model_len: int
) -> RequestPlan:
    """Sample one synthetic request's lengths, kept inside the model's context."""
    system_tokens = config.system_tokens * ESTIMATE_SLACK + TEMPLATE_TOKENS
    room = max(8, int(max_model_len - system_tokens))
    prompt_cap = max(4, min(config.max_prompt_tokens, room // 2))
    num_prompt = lognormal_length(rng, config.prompt_mean, config.prompt_sigma, 4, prompt_cap)
    output_cap = max(1, min(config.max_tokens, int(room - num_prompt * ESTIMATE_SLACK)))
    max_tokens = lognormal_length(rng, config.output_mean, config.output_sigma, 1, output_cap)
    return RequestPlan(system, words_for(num_prompt, rng), max_tokens)
