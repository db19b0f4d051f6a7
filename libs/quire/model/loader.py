"""Find and read a local Hugging Face checkpoint: config, safetensors (sharded or not)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from quire.model.config import ModelConfig


def resolve_model_path(model: str | Path) -> Path:
    """Return the checkpoint directory or raise ValueError naming what is missing."""
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(
            f"model path {str(model)!r} does not exist (Quire loads local checkpoints only)"
        )
    if not path.is_dir():
        raise ValueError(f"model path {str(model)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"model path {str(model)!r} has no config.json")
    return path


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint's weight files: from the shard index if there is one."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"checkpoint {str(path)!r} is missing shard files: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"checkpoint {str(path)!r} has no *.safetensors weight files")
    return files


def load_state_dict(
    path: Path, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint, cast to `dtype` on `device`."""
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return tensors


def load_checkpoint(
    model: str | Path, device: torch.device, dtype: torch.dtype
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and weights of a local checkpoint directory."""
    path = resolve_model_path(model)
    config = ModelConfig.from_pretrained(path)
    return config, load_state_dict(path, device, dtype)
