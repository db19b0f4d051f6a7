"""EngineConfig's auto dtype: bfloat16 where the hardware multiplies it, float32 elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import quire.config as config_module
from quire.config import EngineConfig, cpu_has_native_bf16


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse2 avx2 avx512f avx512_bf16 avx512vl", True),
        ("fpu sse2 avx2 amx_bf16 amx_tile", True),
        ("fpu sse2 avx2 avx512f avx512vl", False),
    ],
)
def test_native_bf16_from_cpu_flags(tmp_path: Path, flags: str, native: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16.__wrapped__(cpuinfo) is native
    assert cpu_has_native_bf16.__wrapped__(tmp_path / "missing") is False


def test_auto_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(config_module, "cpu_has_native_bf16", lambda: True)
    assert EngineConfig(model="m").resolve_dtype(cpu) == torch.bfloat16
    monkeypatch.setattr(config_module, "cpu_has_native_bf16", lambda: False)
    assert EngineConfig(model="m").resolve_dtype(cpu) == torch.float32
    assert EngineConfig(model="m", dtype="float32").resolve_dtype(cpu) == torch.float32
    assert EngineConfig(model="m").resolve_dtype(torch.device("cuda")) == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantized_activations": "int4"}, "quantized_activations must be int8 or float32"),
        ({"pull_policy": "never"}, "pull_policy must be one of measured, always"),
        ({"preemption_mode": "drop"}, "preemption_mode must be recompute or swap"),
    ],
)
def test_bad_choices_are_refused_by_name(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kwargs)
