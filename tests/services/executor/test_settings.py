"""Settings: defaults, QUIRE_* environment, flags on top."""

from __future__ import annotations

import os
import socket

import pytest

from services.executor.executor_settings import ExecutorSettings, parse_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("QUIRE_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = parse_settings([])
    assert (s.host, s.port, s.memory_manager) == ("127.0.0.1", 50061, "127.0.0.1:50051")
    assert (s.model, s.num_kv_blocks, s.block_size, s.enable_prefix_caching) == (
        "models/smollm2-135m-instruct",
        None,
        16,
        True,
    )
    assert s.resolved_model_name() == "smollm2-135m-instruct"
    assert s.resolved_advertise_address(50061) == "127.0.0.1:50061"
    assert s.resolved_executor_id(50061) == f"{socket.gethostname()}:50061"


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_PORT", "7000")
    monkeypatch.setenv("QUIRE_REDIS_URL", "")
    monkeypatch.setenv("QUIRE_MAX_MODEL_LEN", "512")
    monkeypatch.setenv("QUIRE_SOMETHING_FOR_ANOTHER_SERVICE", "x")
    s = parse_settings(["--port", "7001", "--no-enable-prefix-caching", "--num-kv-blocks", "99"])
    assert (s.port, s.redis_url, s.max_model_len) == (7001, "", 512)
    assert (s.enable_prefix_caching, s.num_kv_blocks) == (False, 99)


def test_wildcard_host_advertises_the_hostname() -> None:
    s = ExecutorSettings(host="0.0.0.0", served_model_name="tiny")
    assert s.resolved_advertise_address(9) == f"{socket.gethostname()}:9"
    assert s.resolved_model_name() == "tiny"


def test_settings_carry_every_engine_config_field_with_its_default() -> None:
    """The executor builds its EngineConfig from the settings' fields of the same names."""
    from dataclasses import MISSING, fields

    from quire.config import EngineConfig

    settings_fields = ExecutorSettings.model_fields
    # where a served engine's default is not offline LLM's (docs/architecture.md, Decisions)
    served = {"scheduling_policy": ("shortest", "fcfs"), "num_speculative_tokens": (4, 0)}
    for field in fields(EngineConfig):
        assert field.name in settings_fields, f"ExecutorSettings lacks {field.name}"
        if field.name in served:
            executor_default, offline_default = served[field.name]
            assert settings_fields[field.name].default == executor_default, field.name
            assert field.default == offline_default, field.name
        elif field.name != "model" and field.default is not MISSING:
            assert settings_fields[field.name].default == field.default, field.name
