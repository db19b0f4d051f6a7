"""quire.kernels asks quire.kernels.backends, per call, for Triton, C++ or torch; importing it
never pulls in triton."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quire.kernels as kernels
from quire.kernels import (
    backends,
    cpp_attention,
    cpp_build,
    cpp_fused,
    packed_linear,
    reference,
    reference_fused,
    triton_attention,
    triton_cache,
)
from tests.hardware import can_run_packed_linear
from tests.kernels.helpers import cu_lens, make_paged_batch, random_queries


def test_import_does_not_import_triton() -> None:
    code = "import sys, quire.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("env_value", "device_type", "backend"),
    [
        (None, "cpu", "cpp"),
        ("auto", "cuda", "triton"),
        ("torch", "cuda", "torch"),
        ("torch", "cpu", "torch"),
        ("cpp", "cpu", "cpp"),
        ("triton", "cpu", "triton"),
        (" Triton ", "cpu", "triton"),
    ],
)
def test_backend_choice(
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    env_value: str | None,
    device_type: str,
    backend: str,
) -> None:
    if env_value is None and device_type == "cpu":
        request.getfixturevalue("cpp_kernels")  # "auto" takes them where they load
    if env_value is None:
        monkeypatch.delenv(backends.BACKEND_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, env_value)
    assert backends.kernel_backend(torch.device(device_type)) == backend


def test_unknown_backend_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="QUIRE_KERNEL_BACKEND"):
        backends.kernel_backend(torch.device("cpu"))


# What each family runs on under each backend: a family the backend lacks runs on torch.
FAMILY_MODULES = {
    "torch": (reference, reference, reference, reference_fused),
    "cpp": (cpp_attention, cpp_attention, reference, cpp_fused),
    "triton": (triton_attention, triton_cache, triton_cache, reference_fused),
}


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_each_family_runs_on_the_backend_or_the_torch_reference(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
    cpu = torch.device("cpu")
    chosen = (
        backends.paged_attention(cpu),
        backends.kv_cache_write(cpu),
        backends.block_copy(cpu),
        backends.fused_norm_rotary(cpu),
    )
    assert chosen == FAMILY_MODULES[backend]


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_public_functions_route_to_backend(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
    called: list[str] = []
    names = (
        "write_kv_cache",
        "paged_decode_attention",
        "paged_prefill_attention",
        "copy_blocks",
        "rms_norm",
        "add_rms_norm_",
        "rotary_embedding_",
    )
    for module in (*FAMILY_MODULES["torch"], *FAMILY_MODULES["cpp"], *FAMILY_MODULES["triton"]):
        for name in names:
            if hasattr(module, name):
                tag = f"{module.__name__.rpartition('.')[2]}.{name}"
                monkeypatch.setattr(module, name, lambda *args, tag=tag: called.append(tag))
    tensor = torch.zeros(1)

    kernels.write_kv_cache(tensor, tensor, tensor, tensor, tensor)
    kernels.paged_decode_attention(tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.paged_prefill_attention(tensor, tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.copy_blocks([tensor], [tensor], tensor)
    kernels.rms_norm(tensor, tensor, 1e-6)
    kernels.add_rms_norm_(tensor, tensor, tensor, 1e-6)
    kernels.rotary_embedding_(tensor, tensor, tensor, tensor, tensor)

    attention, cache, copy, fused = (m.__name__.rpartition(".")[2] for m in FAMILY_MODULES[backend])
    assert called == [
        f"{cache}.write_kv_cache",
        f"{attention}.paged_decode_attention",
        f"{attention}.paged_prefill_attention",
        f"{copy}.copy_blocks",
        f"{fused}.rms_norm",
        f"{fused}.add_rms_norm_",
        f"{fused}.rotary_embedding_",
    ]


def test_packed_linears_run_only_under_the_cpp_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    for backend in ("torch", "triton"):
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
        assert backends.packed_linear(torch.float32) is None
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "cpp")
    expected = packed_linear if can_run_packed_linear(torch.float32) else None
    assert backends.packed_linear(torch.float32) is expected
    assert backends.packed_linear(torch.float16) is None  # no such kernel


@pytest.mark.parametrize(("backend", "needs_plan"), [("torch", True), ("cpp", False)])
def test_only_the_torch_reference_plans_decode(
    monkeypatch: pytest.MonkeyPatch, backend: str, needs_plan: bool
) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
    batch = make_paged_batch([3, 17], 2, 64)
    plan = kernels.plan_decode(batch.block_tables, batch.context_lens, batch.key_cache)
    assert (plan is not None) == needs_plan


def test_auto_uses_torch_when_cpp_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backends.BACKEND_ENV_VAR, raising=False)
    monkeypatch.setattr(cpp_attention, "unavailable_reason", lambda: "not built")
    assert backends.kernel_backend(torch.device("cpu")) == "torch"
    assert backends.fused_norm_rotary(torch.device("cpu")) is reference_fused

    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "cpp")
    batch = make_paged_batch([3], 2, 64)
    query = random_queries(1, 4, 64)
    with pytest.raises(RuntimeError, match="not built"):
        kernels.paged_decode_attention(
            query, batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens, 0.1
        )


@pytest.mark.usefixtures("_fresh_cpp_loader")
def test_a_missing_library_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cpp_build, "BUILD_DIR", tmp_path / "missing")
    monkeypatch.delenv(cpp_attention.VARIANT_ENV_VAR, raising=False)
    with caplog.at_level(logging.WARNING, logger=cpp_attention.__name__):
        assert not cpp_attention.is_available()
        assert not cpp_attention.is_available()
    reason = cpp_attention.unavailable_reason()
    assert reason is not None and "make kernels-cpu" in reason
    assert [record.getMessage() for record in caplog.records] == [
        f"C++ CPU attention kernels unavailable: {reason}; using the torch reference"
    ]


@pytest.mark.usefixtures("_fresh_cpp_loader")
def test_a_stale_library_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpp_build.built_variants(), "tests/kernels/conftest.py builds this CPU's variant"
    monkeypatch.setattr(cpp_build, "source_sha256", lambda: "0" * 64)
    reason = cpp_attention.unavailable_reason()
    assert reason is not None and "older sources" in reason


def test_default_backend_matches_reference_on_device(device: str) -> None:
    # On CUDA this runs Triton through the public API; on CPU, the reference.
    context_lens = [3, 17, 40]
    batch = make_paged_batch(context_lens, 2, 64, device=device)
    query = random_queries(len(context_lens), 4, 64, device=device)
    args = (batch.key_cache, batch.value_cache, batch.block_tables)

    decode = kernels.paged_decode_attention(query, *args, batch.context_lens, 0.125)
    prefill = kernels.paged_prefill_attention(
        query, *args, cu_lens([1, 1, 1], device), batch.context_lens, 0.125
    )

    expected = reference.paged_decode_attention(query, *args, batch.context_lens, 0.125)
    torch.testing.assert_close(decode, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prefill, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("backend", "module"),
    [("torch", "reference_experts"), ("cpp", "reference_experts"), ("triton", "triton_experts")],
)
def test_expert_mlp_routes_to_its_backend(
    monkeypatch: pytest.MonkeyPatch, backend: str, module: str
) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
    chosen = backends.expert_mlp(torch.device("cpu"))
    assert chosen.__name__ == f"quire.kernels.{module}"
    called: list[str] = []
    monkeypatch.setattr(chosen, "expert_mlp", lambda *args: called.append(module))
    tensor = torch.zeros(1)
    kernels.expert_mlp(tensor, tensor, tensor, tensor, tensor)
    assert called == [module]
