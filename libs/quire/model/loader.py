"""Read a local checkpoint (a Hugging Face directory: config and safetensors weights, sharded
or not, float or quantized by AWQ, GPTQ or compressed-tensors; or a GGUF file, its quantized
weights kept in their blocks) and build its architecture's model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from quire.model.architectures import model_class
from quire.model.checkpoint import resolve_model_path, safetensors_files
from quire.model.decoder import DecoderModel
from quire.model.gguf_checkpoint import is_gguf, load_gguf
from quire.model.model_config import ModelConfig
from quire.model.quantized_checkpoint import load_quantized_weights, quantization_config
from quire.model.quantized_linear import Weight


def load_state_dict(
    path: Path, device: torch.device, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint, cast to `dtype` on `device` (None: as stored, on the
    CPU)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensor = f.get_tensor(name)
                tensors[name] = tensor if dtype is None else tensor.to(device=device, dtype=dtype)
    return tensors


def load_checkpoint(
    model: str | Path, device: torch.device, dtype: torch.dtype, int8_activations: bool = False
) -> tuple[ModelConfig, dict[str, Weight]]:
    """Config and weights of a local checkpoint directory or GGUF file (whose weights in
    blocks multiply int8 activations where the kernel can, with `int8_activations`)."""
    path = resolve_model_path(model)
    if is_gguf(path):
        return load_gguf(path, device, dtype, int8_activations)
    config = ModelConfig.from_pretrained(path)
    quantization = quantization_config(path)
    if quantization is not None:
        stored = load_state_dict(path, device, None)
        return config, load_quantized_weights(stored, quantization, device, dtype, int8_activations)
    return config, dict(load_state_dict(path, device, dtype))


def build_model(
    config: ModelConfig, state: dict[str, Weight], device: torch.device
) -> DecoderModel:
    """The model of `config.architecture` over the checkpoint tensors `state`."""
    model = model_class(config.architecture)(config, state, device)
    assert isinstance(model, DecoderModel), f"{type(model).__name__} is not a DecoderModel"
    return model
