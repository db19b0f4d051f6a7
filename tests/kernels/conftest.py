"""Kernel tests run the Triton kernels under the interpreter on CPU (--device cpu, the default)
or compiled on the GPU (--device cuda), always against the torch reference."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

_KERNEL_MODULES = (
    "quire.kernels.triton_attention",
    "quire.kernels.triton_cache",
    "quire.kernels.triton_experts",
    "quire.kernels.triton_quantized",
)


def pytest_configure(config: pytest.Config) -> None:
    # @triton.jit reads TRITON_INTERPRET when it decorates a kernel, i.e. when
    # quire.kernels.triton_* is first imported. pytest calls this hook as soon as this conftest
    # is registered, which is before the test modules of this directory are imported.
    if config.getoption("--device") != "cpu":
        return
    os.environ["TRITON_INTERPRET"] = "1"
    _build_cpp_kernels()
    imported_early = [name for name in _KERNEL_MODULES if name in sys.modules]
    if imported_early and not all(sys.modules[name].IS_INTERPRETED for name in imported_early):
        raise pytest.UsageError(
            f"{imported_early} were imported before TRITON_INTERPRET=1 was set, so their "
            "kernels are compiled for CUDA; import them lazily in the code that ran first"
        )


@pytest.fixture(autouse=True)
def _gpu_tests_need_cuda(request: pytest.FixtureRequest, device: str) -> None:
    if request.node.get_closest_marker("gpu") is not None and device != "cuda":
        pytest.skip("needs CUDA (--device cuda)")


@pytest.fixture
def _fresh_cpp_loader() -> Iterator[None]:
    """Forget the C++ library's loaded-or-not verdict before and after the test, so that the
    test and the ones after it load for real."""
    from quire.kernels import cpp_attention

    cpp_attention._load.cache_clear()
    yield
    cpp_attention._load.cache_clear()


@pytest.fixture(scope="session")
def cpp_kernels(device: str) -> None:
    """The C++ CPU kernels, loaded: a test that uses them fails (never skips) where they do not
    load, since `make test` and pytest_configure above build them for this CPU."""
    if device != "cpu":
        pytest.skip(
            "needs --device cpu: the C++ kernels are CPU kernels (not built for --device cuda)"
        )
    from quire.kernels import cpp_attention

    reason = cpp_attention.unavailable_reason()
    if reason is not None:
        pytest.fail(f"the C++ CPU kernels do not load: {reason}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _cuda_is_available(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.fail("--device cuda but torch.cuda.is_available() is False", pytrace=False)


def _build_cpp_kernels() -> None:
    """Compile this CPU's C++ kernels if they are missing or older than their sources, before
    the test modules ask whether they load: an edited .cpp is tested, never skipped. A build
    that fails stops the run with the compiler's error (on stderr above)."""
    import subprocess

    from quire.kernels import cpp_build

    march = cpp_build.native_march()
    if cpp_build.is_up_to_date(march):
        return
    try:
        cpp_build.build(march)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise pytest.UsageError(
            f"the C++ CPU kernels do not build for -march={march or 'default'}: {exc}"
        ) from exc
