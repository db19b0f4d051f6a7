"""Fixtures of the online benchmark's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from quire_tools.make_model import ensure_checkpoint

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "quire-tiny"


@pytest.fixture(scope="module")
def tiny() -> Path:
    """The tiny random-weight checkpoint, made if missing."""
    return ensure_checkpoint(TINY, "tiny")
