"""Memory manager settings: environment (QUIRE_*) first, command-line flags override."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.tls import check_server_paths


class Settings(BaseSettings):
    """Every knob of the memory manager, each with a default."""

    model_config = SettingsConfigDict(env_prefix="QUIRE_", extra="ignore")

    host: str = Field("127.0.0.1", description="address the gRPC and metrics servers bind")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis for prefix metadata ('' disables it)"
    )
    redis_prefix: str = Field("quire", description="prefix of every Redis key")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 disables it)"
    )
    manager_id: str = Field(
        "", description="this manager's id in Register replies ('' = host:port)"
    )
    prefix_refresh_s: float = Field(
        5.0, gt=0, description="seconds between TTL refreshes of the Redis prefix sets"
    )
    shutdown_grace_s: float = Field(
        2.0, ge=0, description="seconds in-flight RPCs get to finish on SIGTERM"
    )
    pull_lease_s: float = Field(
        10.0,
        gt=0,
        description="seconds a pin on a peer's blocks lasts when the puller never releases it",
    )
    log_level: str = Field("info", description="structlog level: debug, info, warning, error")
    log_prompts: bool = Field(False, description="log the token ids of admitted prompts")
    tls_cert: str = Field("", description="PEM certificate: serve gRPC over TLS ('' = plaintext)")
    tls_key: str = Field("", description="PEM private key of --tls-cert")

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        check_server_paths(self.tls_cert, self.tls_key)
        return self
