"""Router settings: QUIRE_* environment variables, overridden by command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from quire.config import engine_default


class RouterSettings(BaseSettings):
    """Everything the router can be told; each field is also a `--kebab-case` flag."""

    model_config = SettingsConfigDict(env_prefix="QUIRE_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="interface the HTTP server binds")
    port: int = Field(
        default=8000, ge=0, le=65535, description="public HTTP port: /v1/*, /health, /tokenize"
    )
    admin_host: str = Field(
        default="", description="interface the admin listener binds ('' = the same as host)"
    )
    admin_port: int = Field(
        default=8001,
        ge=0,
        le=65535,
        description="admin HTTP port: /metrics, /dashboard, /cluster/status, /docs, "
        "/openapi.json, /health (0 = no admin listener)",
    )
    model: str = Field(
        default="models/smollm2-135m-instruct", description="checkpoint dir (tokenizer, context)"
    )
    served_model_name: str | None = Field(
        default=None, description="model name clients use (default: the model directory's name)"
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", description="Redis with executor records ('' = none)"
    )
    redis_prefix: str = Field(default="quire", description="prefix of every Redis key")
    redis_timeout_s: float = Field(default=0.25, gt=0, description="Redis socket timeout per call")
    block_size: int = Field(
        default=engine_default("block_size"),
        ge=1,
        description="KV block size to hash prompts with when no executor record announces its "
        "own (records from older executors, static --executors, Redis down)",
    )
    routing_policy: Literal["prefix", "round-robin", "least-loaded", "hash"] = Field(
        default="prefix",
        description="how an executor is picked: prefix (longest cached prefix weighed against "
        "load), round-robin, least-loaded (fewest in-flight requests) or hash (consistent hash "
        "ring of the first block)",
    )
    executors: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="static executor addresses host:port, comma separated (no-Redis runs)",
    )
    max_pending_per_executor: int = Field(
        default=256, ge=1, description="most in-flight requests per executor, then 429"
    )
    max_pending_total: int = Field(
        default=1024, ge=1, description="most in-flight requests, then 429"
    )
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After seconds sent with a 429")
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="deadline of one executor call"
    )
    max_retries: int = Field(default=2, ge=0, description="other executors tried after UNAVAILABLE")
    max_migrations: int = Field(
        default=2,
        ge=0,
        description="executors a request may lose mid-stream and continue elsewhere; "
        "past that its stream ends with an error event (0 = never migrate)",
    )
    executor_stall_s: float = Field(
        default=10.0,
        gt=0,
        description="an executor a read has waited on this long, whose liveness record shows no "
        "engine step nor decoder layer (or is gone) for as long, is hung: marked down and its "
        "streams migrated; keep it above the longest layer of a step and the executors' "
        "--pull-timeout-s",
    )
    executor_down_s: float = Field(
        default=5.0, ge=0, description="how long an UNAVAILABLE one is skipped"
    )
    registry_cache_s: float = Field(
        default=0.25, ge=0, description="how long executor records are reused"
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="context length (default: the model's own)"
    )
    routing_max_load_gap: int = Field(
        default=4,
        ge=0,
        description="requests above the least loaded before a prefix bonus is capped",
    )
    routing_max_load_ratio: float = Field(
        default=2.0,
        ge=1,
        description="load ratio to the least loaded before a prefix bonus is capped",
    )
    routing_max_hash_load_gap: int = Field(
        default=0,
        ge=0,
        description="an uncached prompt goes to the least loaded executor; executors this many "
        "requests above it still count as tied, and ties go by consistent hash",
    )
    routing_pulls: bool = Field(
        default=True,
        description="prefix policy: executors pull prompt blocks a peer holds (their "
        "--enable-pulls), so such blocks count for every executor at a pull's cost",
    )
    routing_pull_cost_fraction: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="prefix policy: what a pulled token costs as a fraction of a computed one, "
        "for executors that have not published their own measured fraction yet",
    )
    routing_recent_s: float = Field(
        default=0.0,
        ge=0,
        description="prefix policy: how long this router counts a prompt's blocks as held by "
        "the executor it sent them to, before that executor's prefix set shows them (0 = off; "
        "docs/benchmarks.md shows when it helps)",
    )
    routing_placement_window_s: float = Field(
        default=60.0,
        ge=0,
        description="prefix policy: how long a prompt's blocks count in the working set of the "
        "executor this router sent them to; an uncached prompt goes, among the least loaded, "
        "to the executor whose working set fills the least of its KV cache (0 = off: by hash)",
    )
    memory_manager: str = Field(
        default="127.0.0.1:50051",
        description="memory manager host:port that /dashboard reads block states from ('' = none)",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="largest request body accepted, checked before parsing (then 413)",
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="on SIGTERM: stop accepting connections, let open requests and streams "
        "finish for at most this long, then end them and exit",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error")
    log_prompts: bool = Field(
        default=False, description="log every request's prompt and output text"
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="API keys clients send as 'Authorization: Bearer', comma separated "
        "(none and no --api-keys-file = auth off)",
    )
    api_keys_file: str = Field(
        default="", description="file of API keys, one a line, re-read when it changes"
    )
    rate_limit_rpm: int = Field(
        default=0, ge=0, description="requests per minute per API key, shared in Redis (0 = off)"
    )
    rate_limit_tpm: int = Field(
        default=0,
        ge=0,
        description="prompt + max_tokens per minute per API key, shared in Redis (0 = off)",
    )
    tool_chat_template: str = Field(
        default="auto",
        min_length=1,
        description="chat template for requests with tools or tool-call history: auto (the "
        "model's own if it renders tools, else the router's ChatML tool template for a ChatML "
        "model, else none), a Jinja file's path, or none (tool_choice auto is then refused)",
    )
    tool_call_parser: str = Field(
        default="hermes",
        description="the tool-call format tool_choice auto decodes and parses: hermes "
        '(<tool_call>{"name", "arguments"}</tool_call>)',
    )
    tls_ca: str = Field(
        default="",
        description="PEM CA bundle: dial executors and the memory manager over TLS "
        "('' = plaintext)",
    )

    @field_validator("executors", "api_keys", mode="before")
    @classmethod
    def _split_lists(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("executors")
    @classmethod
    def _check_executors(cls, value: list[str]) -> list[str]:
        for address in value:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"executor address {address!r} is not host:port")
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _check_tool_call_parser(cls, value: str) -> str:
        from services.router.tool_parsers.registry import tool_parser_class

        tool_parser_class(value)  # a ValueError naming the registered ones if unknown
        return value

    @model_validator(mode="after")
    def _check_rate_limits(self) -> RouterSettings:
        if (self.rate_limit_rpm or self.rate_limit_tpm) and not self.redis_url:
            raise ValueError("rate limits are kept in Redis: set --redis-url")
        return self

    @property
    def model_name(self) -> str:
        """The name clients must send: --served-model-name or the checkpoint dir's name."""
        return self.served_model_name or self.extra_key

    @property
    def extra_key(self) -> str:
        """Fallback block-hash extra key (the executor scheduler's: the model dir's name),
        for records that announce none."""
        return Path(self.model).name
