"""Quire: paged-KV-cache LLM serving.

    from quire import LLM, SamplingParams
    llm = LLM(model="models/quire-tiny")
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))

The offline API loads lazily, so `import quire.block` (the memory manager's only need)
does not pull in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quire.entrypoints.llm import LLM
    from quire.outputs import CompletionOutput, Logprob, RequestOutput
    from quire.sampling_params import SamplingParams
    from quire.structured_params import StructuredOutputParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputParams",
]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from quire.entrypoints.llm import LLM

        return LLM
    if name in ("CompletionOutput", "Logprob", "RequestOutput"):
        from quire import outputs

        return getattr(outputs, name)
    if name == "SamplingParams":
        from quire.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputParams":
        from quire.structured_params import StructuredOutputParams

        return StructuredOutputParams
    raise AttributeError(f"module 'quire' has no attribute {name!r}")
