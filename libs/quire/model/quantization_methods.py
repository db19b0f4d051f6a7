"""The weight quantizations a Hugging Face config.json may name that Quire loads (AWQ, GPTQ,
compressed-tensors; quire.model.quantized_checkpoint converts them), and the reason one it
does not load is refused. Imports nothing but the standard library, so both the config
parser and the checkpoint check use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUANTIZATION_METHODS = ("awq", "gptq", "compressed-tensors")
COMPRESSED_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")


def quantization_problem(quantization: Mapping[str, Any]) -> str | None:
    """What keeps a config.json `quantization_config` from loading, or None: completes
    "the checkpoint's quantization ..."."""
    method = quantization.get("quant_method")
    if method not in QUANTIZATION_METHODS:
        methods = ", ".join(QUANTIZATION_METHODS)
        return f"method {method!r} is not supported ({methods} are, and GGUF files)"
    if method == "awq":
        version = str(quantization.get("version", "gemm")).lower()
        if version != "gemm":
            return f"AWQ version {version!r} is not supported (gemm is)"
        if quantization.get("bits", quantization.get("w_bit", 4)) != 4:
            return "AWQ with other than 4 bits is not supported"
    if method == "gptq":
        if quantization.get("bits") not in (4, 8):
            return f"GPTQ with {quantization.get('bits')} bits is not supported (4 and 8 are)"
        fmt = quantization.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            return f"GPTQ checkpoint_format {fmt!r} is not supported (gptq and gptq_v2 are)"
    if method == "compressed-tensors":
        formats = {quantization.get("format")}
        for group in (quantization.get("config_groups") or {}).values():
            if isinstance(group, Mapping) and group.get("format"):
                formats.add(group["format"])
        unknown = sorted(str(f) for f in formats - {None, *COMPRESSED_FORMATS})
        if unknown:
            return (
                f"compressed-tensors format {', '.join(unknown)} is not supported "
                f"({', '.join(COMPRESSED_FORMATS)} are)"
            )
    return None
