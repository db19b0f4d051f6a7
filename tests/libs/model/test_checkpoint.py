"""checkpoint_problem: why a directory cannot be served, before anything heavy is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quire.model.checkpoint import checkpoint_problem, resolve_model_path
from quire.model.model_config import SUPPORTED_ARCHITECTURES

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"


def _config_only(tmp_path: Path, config: object, name: str = "model") -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_real_checkpoint_has_no_problem() -> None:
    assert checkpoint_problem(TINY) is None
    assert resolve_model_path(str(TINY)) == TINY


def test_paths_that_are_not_checkpoint_directories(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert "does not exist" in (checkpoint_problem(tmp_path / "missing") or "")
    assert "is not a directory" in (checkpoint_problem(tmp_path / "file") or "")
    assert "has no config.json" in (checkpoint_problem(tmp_path) or "")


def test_unreadable_config(tmp_path: Path) -> None:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{not json")
    assert (checkpoint_problem(path) or "").startswith("has a config.json that cannot be read")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    path = _config_only(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    problem = checkpoint_problem(path) or ""
    assert "unsupported architecture (GPT2LMHeadModel)" in problem
    assert all(arch in problem for arch in SUPPORTED_ARCHITECTURES)
    assert "none named" in (checkpoint_problem(_config_only(tmp_path, {}, "bare")) or "")
    with pytest.raises(ValueError, match="unsupported architecture"):
        resolve_model_path(path)


def test_weights_are_checked_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "model"
    path.mkdir()
    shutil.copy(TINY / "config.json", path / "config.json")
    assert checkpoint_problem(path, need_weights=False) is None
    assert "no *.safetensors weight files" in (checkpoint_problem(path) or "")
