"""The architectures Quire serves: each `architectures` name of a Hugging Face config.json,
with the module and class that build its forward pass.

The one list of supported names. Nothing here imports torch, so a service checks a checkpoint
against it before loading anything; `model_class` imports an architecture's module only when
that architecture is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

# architectures entry -> (module under quire.model, class in it)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def unsupported_message(found: str) -> str:
    """The clause every refusal ends with: what was found and what would have loaded."""
    return f"unsupported architecture ({found}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"


def model_class(architecture: str) -> Any:
    """The class (a quire.model.decoder.DecoderModel) that runs `architecture`."""
    if architecture not in ARCHITECTURES:
        raise ValueError(unsupported_message(architecture))
    module, name = ARCHITECTURES[architecture]
    return getattr(importlib.import_module(f"quire.model.{module}"), name)
