"""quire.kernels picks Triton or torch per call, and importing it never pulls in triton."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import quire.kernels as kernels
from quire.kernels import reference, triton_attention, triton_cache
from tests.kernels.helpers import cu_lens, make_paged_batch, random_queries


def test_import_does_not_import_triton() -> None:
    code = "import sys, quire.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("env_value", "device_type", "backend"),
    [
        (None, "cpu", "torch"),
        ("auto", "cuda", "triton"),
        ("torch", "cuda", "torch"),
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


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_public_functions_route_to_backend(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, backend)
    called: list[str] = []
    modules = (reference, triton_attention, triton_cache)
    names = ("write_kv_cache", "paged_decode_attention", "paged_prefill_attention", "copy_blocks")
    for module in modules:
        for name in names:
            if hasattr(module, name):
                tag = f"{'torch' if module is reference else 'triton'}.{name}"
                monkeypatch.setattr(module, name, lambda *args, tag=tag: called.append(tag))
    tensor = torch.zeros(1)

    kernels.write_kv_cache(tensor, tensor, tensor, tensor, tensor)
    kernels.paged_decode_attention(tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.paged_prefill_attention(tensor, tensor, tensor, tensor, tensor, tensor, 1.0)
    kernels.copy_blocks([tensor], [tensor], tensor)

    assert called == [f"{backend}.{name}" for name in names]


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
