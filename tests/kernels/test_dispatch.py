"""quire.kernels picks Triton, C++ or torch per call, and importing it never pulls in triton."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import quire.kernels as kernels
from quire.kernels import cpp_attention, cpp_build, reference, triton_attention, triton_cache
from tests.kernels.helpers import cu_lens, make_paged_batch, random_queries

# What "auto" picks on CPU tensors here: the C++ kernels once `make kernels-cpu` built them.
CPU_DEFAULT = "cpp" if cpp_attention.is_available() else "torch"


def test_import_does_not_import_triton() -> None:
    code = "import sys, quire.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("env_value", "device_type", "backend"),
    [
        (None, "cpu", CPU_DEFAULT),
        ("auto", "cuda", "triton"),
        ("torch", "cuda", "torch"),
        ("torch", "cpu", "torch"),
        ("cpp", "cpu", "cpp"),
        ("triton", "cpu", "triton"),
        (" Triton ", "cpu", "triton"),
    ],
)
def test_backend_choice(
    monkeypatch: pytest.MonkeyPatch, env_value: str | None, device_type: str, backend: str
) -> None:
    if env_value is None:
        monkeypatch.delenv(kernels.BACKEND_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(kernels.BACKEND_ENV_VAR, env_value)
    assert kernels.kernel_backend(torch.device(device_type)) == backend


def test_unknown_backend_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="QUIRE_KERNEL_BACKEND"):
        kernels.kernel_backend(torch.device("cpu"))


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_public_functions_route_to_backend(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, backend)
    called: list[str] = []
    modules = {
        reference: "torch",
        cpp_attention: "cpp",
        triton_attention: "triton",
        triton_cache: "triton",
    }
    names = ("write_kv_cache", "paged_decode_attention", "paged_prefill_attention", "copy_blocks")
    for module, module_backend in modules.items():
        for name in names:
            if hasattr(module, name):
                tag = f"{module_backend}.{name}"
                monkeypatch.setattr(module, name, lambda *args, tag=tag: called.append(tag))
    tensor = torch.zeros(1)

    kernels.write_kv_cache(tensor, tensor, tensor, tensor, tensor)
    kernels.paged_decode_attention(tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.paged_prefill_attention(tensor, tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.copy_blocks([tensor], [tensor], tensor)

    # The C++ backend covers attention and cache writes; block copies stay in torch.
    copy_backend = "torch" if backend == "cpp" else backend
    assert called == [
        f"{backend}.write_kv_cache",
        f"{backend}.paged_decode_attention",
        f"{backend}.paged_prefill_attention",
        f"{copy_backend}.copy_blocks",
    ]


@pytest.mark.parametrize(("backend", "needs_plan"), [("torch", True), ("cpp", False)])
def test_only_the_torch_reference_plans_decode(
    monkeypatch: pytest.MonkeyPatch, backend: str, needs_plan: bool
) -> None:
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, backend)
    batch = make_paged_batch([3, 17], 2, 64)
    plan = kernels.plan_decode(batch.block_tables, batch.context_lens, batch.key_cache)
    assert (plan is not None) == needs_plan


def test_auto_uses_torch_when_cpp_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.BACKEND_ENV_VAR, raising=False)
    monkeypatch.setattr(cpp_attention, "unavailable_reason", lambda: "not built")
    assert kernels.kernel_backend(torch.device("cpu")) == "torch"

    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, "cpp")
    batch = make_paged_batch([3], 2, 64)
    query = random_queries(1, 4, 64)
    with pytest.raises(RuntimeError, match="not built"):
        kernels.paged_decode_attention(
            query, batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens, 0.1
        )


@pytest.fixture
def _fresh_cpp_loader() -> Iterator[None]:
    # Forget the loaded-or-not verdict before and after, so that other tests load for real.
    cpp_attention._load.cache_clear()
    yield
    cpp_attention._load.cache_clear()


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
    if not cpp_build.built_variants():
        pytest.skip("C++ CPU kernels not built")
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
