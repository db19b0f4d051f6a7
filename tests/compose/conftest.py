"""Checks against a running compose stack (`make compose-test` brings it up first).

They need Docker and minutes of image builds, so they run only with QUIRE_COMPOSE_TEST=1, which
`make compose-test` sets; anywhere else (`make test`) each shows as an expected skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
ROUTER_URL = os.environ.get("QUIRE_COMPOSE_URL", "http://127.0.0.1:8000")
ADMIN_URL = os.environ.get("QUIRE_COMPOSE_ADMIN_URL", "http://127.0.0.1:8001")  # /cluster/status

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("QUIRE_COMPOSE_TEST") == "1":
        return
    skip = pytest.mark.skip(reason="needs the compose stack: `make compose-test` runs these")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


def compose(*args: str, timeout: float = 120) -> str:
    """Run docker-compose on the stack `make compose-up` started (its files); its stdout."""
    command = ["deploy/docker/compose.sh", "compose", *args]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def container_id(service: str) -> str:
    """The container of one compose service ('' when it has none)."""
    return compose("ps", "-q", service).strip()


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def router_url() -> str:
    try:
        httpx.get(f"{ROUTER_URL}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        pytest.fail(
            f"the compose stack's router is not healthy at {ROUTER_URL} ({exc!r}): "
            "run `make compose-up` (or `make compose-test`, which does)"
        )
    return ROUTER_URL
