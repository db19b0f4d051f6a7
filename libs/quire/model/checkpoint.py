"""What makes a path a checkpoint Quire can serve: a directory with config.json naming a
supported architecture and safetensors weights (sharded or not), or a GGUF file
(quire.model.gguf_checkpoint); and where a checkpoint's config and tokenizer come from.

Nothing here imports torch at module level, so services check their model setting with
`checkpoint_problem` before they load anything, and fail in a second with the reason.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quire.model.architectures import SUPPORTED_ARCHITECTURES, unsupported_message
from quire.model.gguf_checkpoint import file_version, gguf_problem, is_gguf
from quire.model.quantization_methods import quantization_problem

if TYPE_CHECKING:
    from quire.model.model_config import ModelConfig


def checkpoint_problem(model: str | Path, *, need_weights: bool = True) -> str | None:
    """What keeps `model` from loading as a checkpoint, or None when nothing does.

    A `.gguf` path is checked as a GGUF file (gguf_checkpoint.gguf_problem). A directory is
    checked, in order: the path exists and is a directory, its config.json parses and names a
    supported architecture, its quantization (if any) is one Quire loads
    (quantized_checkpoint), and (with `need_weights`) its *.safetensors files are there. The
    answer completes a sentence about the path: "does not exist (...)", "has no config.json".
    """
    path = Path(model).expanduser()
    if not path.exists():
        return "does not exist (Quire loads local checkpoint directories, never downloads)"
    if is_gguf(path):
        return gguf_problem(path)
    if not path.is_dir():
        return "is not a directory (a checkpoint is a directory with config.json)"
    config_file = path / "config.json"
    if not config_file.is_file():
        return "has no config.json (not a Hugging Face checkpoint directory)"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"has a config.json that cannot be read: {exc}"
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(architectures, list) or not architectures:
        architectures = []
    if not any(arch in SUPPORTED_ARCHITECTURES for arch in architectures):
        found = ", ".join(map(str, architectures)) or "none named in config.json"
        return f"has an {unsupported_message(found)}"
    quantization = config.get("quantization_config")
    if isinstance(quantization, dict) and quantization:
        problem = quantization_problem(quantization)
        if problem is not None:
            return f"has a quantization Quire does not load: {problem}"
    if need_weights:
        try:
            safetensors_files(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError: ValueError
            return f"has unusable weights: {exc}"
    return None


def resolve_model_path(model: str | Path) -> Path:
    """Return the checkpoint (directory or GGUF file) or raise ValueError naming what is wrong
    with it."""
    problem = checkpoint_problem(model, need_weights=False)
    if problem is not None:
        raise ValueError(f"model path {str(model)!r} {problem}")
    return Path(model).expanduser()


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


def load_model_config(model: str | Path) -> ModelConfig:
    """The ModelConfig of a checkpoint directory or GGUF file."""
    from quire.model.model_config import ModelConfig

    path = resolve_model_path(model)
    if is_gguf(path):
        from quire.model.gguf_checkpoint import model_config, read_gguf

        return model_config(read_gguf(path))
    return ModelConfig.from_pretrained(path)


def load_tokenizer(model: str | Path) -> Any:
    """transformers' tokenizer of a checkpoint directory, or of a GGUF file (converted from
    its `tokenizer.ggml.*` metadata, with its chat template); ValueError if it cannot load."""
    from transformers import AutoTokenizer

    path = Path(model).expanduser()
    try:
        if is_gguf(path):
            return copy.deepcopy(_gguf_tokenizer(*file_version(path)))
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the tokenizer from {str(model)!r}: {exc}") from exc


@functools.lru_cache(maxsize=1)
def _gguf_tokenizer(path: str, mtime_ns: int, size: int) -> Any:
    """The tokenizer converted from a GGUF file's metadata. Converting re-reads the whole file's
    metadata (seconds for a real vocabulary), and a process that loads a GGUF model asks for its
    tokenizer more than once: the last file's conversion is kept (`file_version`), and each
    caller gets its own copy, as a fresh load would give it."""
    from transformers import AutoTokenizer

    file = Path(path)
    return AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
