"""services.common.cli: one flag per settings field, flags over env, absent flags leave env."""

from __future__ import annotations

import importlib
from typing import Annotated

import pytest
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from services.common.cli import parse_settings, settings_parser


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUIRE_TEST_", extra="forbid")

    port: int = Field(default=1, description="a port")
    max_len: int | None = Field(default=None, description="optional cap")
    ratio: float = Field(default=0.5, description="a ratio")
    enabled: bool = Field(default=True, description="a switch")
    names: Annotated[list[str], NoDecode] = Field(default_factory=list, description="a list")

    @field_validator("names", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return value.split(",") if isinstance(value, str) else value


def _parse(argv: list[str]) -> _Settings:
    return parse_settings(_Settings, argv, prog="test", description="test")


def test_flags_convert_to_the_field_types() -> None:
    s = _parse(["--port", "7", "--max-len", "9", "--ratio", "2.5", "--no-enabled"])
    assert (s.port, s.max_len, s.ratio, s.enabled) == (7, 9, 2.5, False)
    assert _parse(["--names", "a,b"]).names == ["a", "b"]


def test_absent_flags_leave_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_TEST_PORT", "5")
    monkeypatch.setenv("QUIRE_TEST_ENABLED", "false")
    assert (_parse([]).port, _parse([]).enabled) == (5, False)
    assert _parse(["--port", "6", "--enabled"]).port == 6
    assert _parse(["--enabled"]).enabled is True


def test_help_names_env_and_default() -> None:
    text = " ".join(settings_parser(_Settings, "test", "test").format_help().split())
    assert "a port [env QUIRE_TEST_PORT; default 1]" in text
    assert "[env QUIRE_TEST_NAMES; default []]" in text


def test_help_shows_a_percent_sign_as_written() -> None:
    class Percent(BaseSettings):
        share: float = Field(default=0.9, description="90% of the free memory")

    text = settings_parser(Percent, "test", "test").format_help()
    assert "90% of the free memory" in " ".join(text.split())


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("services.executor.executor_settings", "ExecutorSettings"),
        ("services.router.router_settings", "RouterSettings"),
        ("services.memory_manager.manager_settings", "Settings"),
    ],
)
def test_every_service_prints_its_help(module: str, name: str) -> None:
    settings = getattr(importlib.import_module(module), name)
    assert "--help" in settings_parser(settings, "service", "service").format_help()


def test_bad_values_are_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        _parse(["--port", "x"])
