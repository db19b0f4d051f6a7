"""Options and fixtures shared by the whole test suite."""

from __future__ import annotations

import pytest

# Only hardware and environment skips are allowed; the rest fail the run.
pytest_plugins = ["tests.skip_policy"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device for kernel tests: cpu (default) runs Triton under TRITON_INTERPRET=1, "
        "cuda compiles it for the GPU",
    )


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device tests run on: "cpu" or "cuda" (--device)."""
    return request.config.getoption("--device")
