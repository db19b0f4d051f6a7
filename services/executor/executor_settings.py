"""Executor settings: defaults, then QUIRE_* environment variables, then command-line flags."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from quire.config import engine_default, engine_field
from services.common import cli
from services.common.tls import check_server_paths

LOCAL_MEMORY_MANAGER = "local"  # --memory-manager value for an in-process BlockManager
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def _engine(name: str, **constraints: Any) -> Any:
    """The executor's setting for EngineConfig's field `name`: its default and help."""
    return Field(
        default=engine_default(name),
        description=engine_field(name).metadata["help"],
        **constraints,
    )


class ExecutorSettings(BaseSettings):
    """Every knob of one executor process. Env: QUIRE_<FIELD>; flag: --<field-with-dashes>."""

    model_config = SettingsConfigDict(env_prefix="QUIRE_", extra="forbid")

    host: str = Field(default="127.0.0.1", description="interface the gRPC server binds")
    port: int = Field(default=50061, description="gRPC port (0 picks a free one)")
    advertise_address: str = Field(
        default="",
        description="host:port routers dial (default: host:port, hostname if host is a wildcard)",
    )
    executor_id: str = Field(
        default="", description="stable id of this executor (default: hostname:port)"
    )
    model: str = Field(
        default="models/smollm2-135m-instruct",
        description=engine_field("model").metadata["help"],
    )
    served_model_name: str = Field(
        default="", description="model name reported (default: model dir name)"
    )
    memory_manager: str = Field(
        default="127.0.0.1:50051",
        description="memory manager host:port, or 'local' for in-process blocks",
    )
    memory_manager_timeout_s: float = Field(
        default=5.0, description="deadline of one memory-manager call"
    )
    memory_manager_verify_every: int = Field(
        default=64,
        ge=0,
        description="check block-table checksums with the memory manager every N steps (0: never)",
    )
    defer_quiet_steps: bool = Field(
        default=True,
        description="make no memory-manager call for a step that needs nothing from it (its "
        "appends fit in blocks the sequences hold alone, its commits fill no block); its "
        "tokens go with the next call",
    )
    role: Literal["both", "prefill", "decode"] = Field(
        default="both",
        description="which phase of a request this executor takes: prefill runs a new "
        "request's prompt and first token, then hands each output to a decode executor "
        "(which pulls the prompt's blocks); both takes every phase",
    )
    enable_pulls: bool = Field(
        default=True,
        description="copy an admitted prompt's blocks from the peer the memory manager "
        "offers instead of computing them",
    )
    pull_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="longest deadline of one pull from a peer (a measured pull gets ten times "
        "what its blocks took lately, at least 0.5 s); past it, the rest is computed. A "
        "router's --executor-stall-s must exceed it: a pull holds the executor's step",
    )
    pull_source_cooldown_s: float = Field(
        default=10.0,
        ge=0,
        description="after a pull from a peer timed out or found it unreachable, compute "
        "instead of pulling from that peer for this long",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", description="Redis for liveness records ('' disables)"
    )
    redis_prefix: str = Field(default="quire", description="prefix of every Redis key")
    # The engine's settings (quire.config.EngineConfig defines their defaults and help).
    num_kv_blocks: int | None = _engine("num_kv_blocks", ge=1)
    block_size: int = _engine("block_size", ge=1)
    max_num_seqs: int = _engine("max_num_seqs", ge=1)
    max_num_batched_tokens: int = _engine("max_num_batched_tokens", ge=1)
    max_model_len: int | None = _engine("max_model_len", ge=2)
    # A served engine puts first tokens first; offline `LLM` keeps arrival order (its
    # callers wait for every output at once).
    scheduling_policy: Literal["fcfs", "shortest"] = Field(
        default="shortest",
        description=engine_field("scheduling_policy").metadata["help"]
        + ". An executor's default is shortest; offline LLM's is fcfs",
    )
    max_decode_stall: float = _engine("max_decode_stall")
    # A served stream gets its tokens sooner with drafts where they pay; offline `LLM` keeps
    # them off (its batches are compute-bound, where drafts would not be taken anyway).
    num_speculative_tokens: int = Field(
        default=4,
        ge=0,
        description=engine_field("num_speculative_tokens").metadata["help"]
        + ". An executor's default is 4; offline LLM's is 0",
    )
    speculative_ngram_min: int = _engine("speculative_ngram_min", ge=1)
    speculative_ngram_max: int = _engine("speculative_ngram_max", ge=1)
    enable_prefix_caching: bool = _engine("enable_prefix_caching")
    free_outside_window: bool = _engine("free_outside_window")
    device: str = _engine("device")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _engine("dtype")
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = _engine("kv_cache_dtype")
    seed: int = _engine("seed")
    preemption_mode: Literal["recompute", "swap"] = _engine("preemption_mode")
    swap_space: float = _engine("swap_space", ge=0)
    pull_policy: Literal["measured", "always"] = _engine("pull_policy")
    quantized_activations: Literal["int8", "float32"] = _engine("quantized_activations")
    huge_pages: bool = _engine("huge_pages")
    torch_threads: int = Field(
        default=0,
        ge=0,
        description="torch intra-op CPU threads (0: torch's default, one per core); several "
        "executors on one machine should split its cores between them",
    )
    share_cores_file: str = Field(
        default="",
        description="a file in shared memory (e.g. /dev/shm/quire-cores) the executors of one "
        "machine share: each step then runs on share_cores_total // (executors with work) "
        "torch threads, at least torch_threads, so a lone request's executor takes every core "
        "and busy siblings split them; empty: torch_threads always",
    )
    share_cores_slot: int = Field(
        default=0,
        ge=0,
        le=63,
        description="this executor's slot in share_cores_file, distinct per executor",
    )
    share_cores_total: int = Field(
        default=0,
        ge=0,
        description="the cores the share_cores_file executors split (0: this machine's)",
    )
    metrics_port: int = Field(default=0, description="Prometheus /metrics port (0 disables)")
    drain_timeout_s: float = Field(
        default=300.0,
        description="on SIGTERM, how long running requests get to finish; then their streams "
        "end with UNAVAILABLE and the routers continue them on other executors",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error")
    log_prompts: bool = Field(
        default=False, description="log prompt and output token ids and output text"
    )
    tls_cert: str = Field(
        default="", description="PEM certificate: serve gRPC over TLS ('' = plaintext)"
    )
    tls_key: str = Field(default="", description="PEM private key of --tls-cert")
    tls_ca: str = Field(
        default="", description="PEM CA bundle: dial the memory manager over TLS ('' = plaintext)"
    )

    @field_validator("num_kv_blocks", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # compose passes ${QUIRE_NUM_KV_BLOCKS:-}: an empty value means "size from memory"
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check_tls(self) -> ExecutorSettings:
        check_server_paths(self.tls_cert, self.tls_key)
        return self

    def resolved_executor_id(self, port: int) -> str:
        """The executor id, defaulting to hostname:port (the bound port when --port is 0)."""
        return self.executor_id or f"{socket.gethostname()}:{port}"

    def resolved_advertise_address(self, port: int) -> str:
        """Where routers reach this executor."""
        if self.advertise_address:
            return self.advertise_address
        host = socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host
        return f"{host}:{port}"

    def resolved_model_name(self) -> str:
        return self.served_model_name or Path(self.model).expanduser().name


def parse_settings(argv: Sequence[str] | None = None) -> ExecutorSettings:
    """Settings from the environment, overridden by the flags in `argv`."""
    return cli.parse_settings(
        ExecutorSettings,
        argv,
        prog="python -m services.executor",
        description="Quire executor: model weights, paged KV cache and the engine step loop.",
    )
