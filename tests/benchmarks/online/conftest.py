"""Fixtures of the online benchmark's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints import tiny_checkpoint


@pytest.fixture(scope="module")
def tiny() -> Path:
    """The tiny random-weight checkpoint, made if missing."""
    return tiny_checkpoint()
