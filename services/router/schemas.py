"""OpenAI-compatible request and response bodies (the subset Quire serves)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from quire.sampling_params import (
    FLOAT_FIELDS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_STRINGS,
    SamplingParams,
)
from services.router.structured import StructuredFields
from services.router.tool_calls import Tool, ToolChoice

MAX_STOP_CHARS = 1024  # longest stop string
MAX_STOP_TOKEN_IDS = 256  # most stop_token_ids
MAX_TOKEN_ID = 2**32 - 1  # token ids travel as uint32
MAX_TOP_K = 2**31 - 1

# Fields OpenAI (or vLLM) define that Quire does not implement and that change what the
# output means: ignoring them would silently return something else, so a request that
# sets one (to anything but an "off" value) is a 400 naming it. Other unknown fields are
# ignored, as OpenAI does.
UNSUPPORTED_FIELDS = (
    "logit_bias",
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

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams; ValueError names the field that is out of range."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        values: dict[str, Any] = {
            "n": self.n,
            "top_k": None if self.top_k in (None, -1) else self.top_k,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "logprobs": logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        for name in FLOAT_FIELDS:
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return SamplingParams(**values)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        # Only an assistant turn may omit its content (OpenAI: it carries tool calls then).
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: role and plain-text content."""
        if isinstance(self.content, list):
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
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


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


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


class ChatCompletionResponse(BaseModel):
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


class ClusterStatus(BaseModel):
    executors: list[ExecutorStatusOut]
    source: str  # where the list came from: redis, last_seen (Redis down) or static
