"""The Triton kernels compile for CUDA, checked on any machine (see compile_for_cuda.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_kernels_compile_for_sm90() -> None:
    # A fresh interpreter: this session's kernels may be interpreted (TRITON_INTERPRET=1).
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.compile_for_cuda"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
