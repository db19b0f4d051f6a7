"""OpenAI-compatible request and response bodies (the subset Quire serves)."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from quire.sampling_params import (
    FLOAT_FIELDS,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_STRINGS,
    SamplingParams,
)
from services.router.structured_fields import StructuredFields
from services.router.tool_schemas import Tool, ToolChoice

MAX_STOP_CHARS = 1024  # longest stop string
MAX_STOP_TOKEN_IDS = 256  # most stop_token_ids
MAX_TOKEN_ID = 2**32 - 1  # token ids travel as uint32
MAX_TOP_K = 2**31 - 1

# Fields OpenAI (or vLLM) define that Quire does not implement and that change what the
# output means: ignoring them would silently return something else, so a request that
# sets one (to anything but an "off" value) is a 400 naming it. Other unknown fields are
# ignored, as OpenAI does.
UNSUPPORTED_FIELDS = (
    "functions",
    "function_call",
)
_OFF_VALUES: tuple[Any, ...] = (None, "none", "auto", "text", {"type": "text"}, [], {})

# --- requests ------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False  # one more chunk before [DONE] with the request's usage


class SamplingRequest(StructuredFields):
    """Fields shared by completions and chat completions (OpenAI's, plus vLLM's extras)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K)  # -1 or 0 disable it (vLLM / Quire)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: str | None = None
    # OpenAI's: token id (a string key in JSON) -> bias in [-100, 100] added to its logit.
    # Values are checked by the validator, so every error names logit_bias itself.
    logit_bias: dict[str, Any] | None = None
    # vLLM's extra: top-k logprobs of every prompt token (not with stream, as in vLLM).
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in UNSUPPORTED_FIELDS:
                value = data.get(name)
                if not any(value == off and type(value) is type(off) for off in _OFF_VALUES):
                    raise PydanticCustomError(
                        "unsupported_parameter",
                        "{param} is not supported",
                        {"param": name},
                    )
        return data

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        for stop in stops:
            if len(stop) > MAX_STOP_CHARS:
                raise ValueError(f"a stop string is at most {MAX_STOP_CHARS} characters")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, bias in (value or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"keys must be token ids (non-negative integers), got {key!r}")
            if int(key) > MAX_TOKEN_ID:
                raise ValueError(f"token id {key} is larger than {MAX_TOKEN_ID}")
            if isinstance(bias, bool) or not isinstance(bias, int | float):
                raise ValueError(f"the bias of token {key} must be a number, got {bias!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(
                    f"the bias of token {key} must be in [-{MAX_LOGIT_BIAS:g}, "
                    f"{MAX_LOGIT_BIAS:g}], got {bias:g}"
                )
        return value

    @model_validator(mode="after")
    def _check_prompt_logprobs_not_streamed(self) -> SamplingRequest:
        if self.stream and self.prompt_logprobs is not None:
            raise PydanticCustomError(
                "prompt_logprobs_stream",
                "prompt_logprobs are not available when stream is true",
                {"param": "prompt_logprobs"},
            )
        return self

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if len(value) > MAX_STOP_TOKEN_IDS:
                raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids")
            if any(not 0 <= t <= MAX_TOKEN_ID for t in value):
                raise ValueError(f"stop token ids must be integers in [0, {MAX_TOKEN_ID}]")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        n: int | None = None,
    ) -> SamplingParams:
        """The engine's SamplingParams; ValueError names the field that is out of range.

        `prompt_logprobs` and `n` replace the body's (echo with logprobs, best_of)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        values: dict[str, Any] = {
            "n": n or self.n,
            "top_k": None if self.top_k in (None, -1) else self.top_k,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "logprobs": logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "logit_bias": {int(k): float(v) for k, v in (self.logit_bias or {}).items()} or None,
            "prompt_logprobs": self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
        }
        for name in FLOAT_FIELDS:
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return SamplingParams(**values)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the returned text (and logprobs) start with the prompt
    # vLLM's extra: each choice also carries its prompt's and its tokens' ids
    return_token_ids: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # candidates; the best n by logprob

    @model_validator(mode="after")
    def _check_best_of(self) -> CompletionRequest:
        if self.best_of is not None:
            if self.best_of < self.n:
                raise PydanticCustomError(
                    "best_of",
                    "best_of must be greater than or equal to n, got n={n} and best_of={best_of}",
                    {"param": "best_of", "n": self.n, "best_of": self.best_of},
                )
            if self.stream and self.best_of != self.n:
                raise PydanticCustomError(
                    "best_of_stream",
                    "best_of different from n is not supported when stream is true",
                    {"param": "best_of"},
                )
        return self


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class MessageFunctionCall(BaseModel):
    """A past call's function in an assistant message: `arguments` is JSON text."""

    name: str = Field(min_length=1)
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, value: str) -> str:
        try:
            json.loads(value)
        except ValueError as exc:
            raise ValueError(f"arguments must be JSON text: {exc}") from exc
        return value


class MessageToolCall(BaseModel):
    """One call an earlier assistant turn made (OpenAI's shape)."""

    id: str
    type: Literal["function"] = "function"
    function: MessageFunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(None, max_length=128)  # assistant only
    tool_call_id: str | None = None  # tool messages: the call this is the result of

    @model_validator(mode="after")
    def _check_role_fields(self) -> ChatMessage:
        # Only an assistant turn may omit its content (OpenAI: it carries tool calls then).
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot carry tool_calls (assistant only)")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: role, plain-text content, and the tool
        fields, each past call's `arguments` parsed into the object HF templates expect."""
        if isinstance(self.content, list):
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": call.type,
                    "function": {
                        "name": call.function.name,
                        "arguments": json.loads(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None


# --- responses -----------------------------------------------------------------------------


def now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's shape of one alternative of a prompt token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One entry per prompt token: None for the first, then token id -> its logprob.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class _PromptLogprobsWhenAsked(BaseModel):
    """vLLM's extras appear on the wire only when asked for (OpenAI's objects lack them)."""

    prompt_logprobs: PromptLogprobs | None = None  # vLLM's extra, when asked for

    @model_serializer(mode="wrap")
    def _drop_unasked(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in _UNASKED_EXTRAS:
            if data.get(name, 0) is None:
                data.pop(name)
        return data


# vLLM's extras on a choice, left out of the object when not asked for.
_UNASKED_EXTRAS = ("prompt_logprobs", "prompt_token_ids", "token_ids")


class CompletionChoice(_PromptLogprobsWhenAsked):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # vLLM's `return_token_ids`: the prompt's ids (on a choice's first chunk) and the ids of
    # the tokens this object carries (all of them, or a chunk's new ones).
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    """A completion, or one streamed chunk of it (same object type, OpenAI's way)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="plain")
    def _only_set(self) -> dict[str, Any]:
        return {
            k: v for k, v in (("name", self.name), ("arguments", self.arguments)) if v is not None
        }


class DeltaToolCall(BaseModel):
    """One streamed piece of a tool call: id, type and name first, then argument text."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer(mode="wrap")
    def _only_set(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(_PromptLogprobsWhenAsked):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class DeltaMessage(BaseModel):
    """A chat chunk's delta: only the fields that are set appear on the wire."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="plain")
    def _only_set(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None
        }
        if self.tool_calls is not None:
            out["tool_calls"] = [t.model_dump() for t in self.tool_calls]
        return out


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: a `prompt`, or chat `messages` rendered by the template."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    # Default: True for a prompt, False for messages (the chat template writes them).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True  # messages only
    continue_final_message: bool = False  # messages only: leave the last turn open
    return_token_strs: bool = False  # also each token's string

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError(
                "tokenize_input", "give exactly one of prompt and messages", {"param": "prompt"}
            )
        if self.messages is not None and self.add_generation_prompt and self.continue_final_message:
            raise PydanticCustomError(
                "tokenize_input",
                "continue_final_message and add_generation_prompt cannot both be true",
                {"param": "continue_final_message"},
            )
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "quire"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ExecutorStatusOut(BaseModel):
    id: str
    address: str
    healthy: bool
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_cached: int = 0
    block_size: int | None = None  # as the executor announces it (None: not announced)
    hash_extra_key: str | None = None


class HashGroupOut(BaseModel):
    block_size: int
    extra_key: str
    executors: list[str]


class HashParamsOut(BaseModel):
    """How the router hashes prompts, and whether the executors agree on it."""

    block_size: int
    extra_key: str
    source: str  # "executors" (their records) or "fallback" (the router's --block-size/--model)
    mismatch: bool  # executors of the model announce more than one block size / extra key
    disagreeing: list[str]  # executors outside the majority: no prefix hits read from them
    groups: list[HashGroupOut]


class ClusterStatus(BaseModel):
    executors: list[ExecutorStatusOut]
    source: str  # where the list came from: redis, last_seen (Redis down) or static
    routing_policy: str
    hash_params: HashParamsOut
