"""A llama.cpp GGUF file as a model: its config, its weights and where its tokenizer is.

`--model path/to/model.gguf` loads the file as it is: the weights llama.cpp keeps in quantized
blocks (quire.kernels.reference_quantized.FORMATS) stay in them, as `QuantizedTensor`s that the
model's linear layers and embedding table compute on; float tensors (F32, F16, BF16: norms, and
any weight stored unquantized) become torch tensors in the model's dtype. The same file converts
into a float32 Hugging Face checkpoint with quire_tools.gguf_convert; the rules both follow are
written here once:

- **Names** map from llama.cpp's (`blk.N.attn_q`) to Hugging Face Llama's
  (`model.layers.N.self_attn.q_proj`); a tensor with no mapping is an error, never dropped.
  Without `output.weight` the embeddings are tied.
- **llama.cpp's Q/K row permutation is undone.** Its converter reorders the rows of every head
  of `q_proj` and `k_proj` from the rotate-half layout (pairs `i`, `i + d/2`) to the
  interleaved one its rope kernel expects; the inverse restores the Hugging Face layout. A row
  is whole blocks, so this moves quantized rows without touching them.
- **The config comes from the metadata** (`llama.*` keys); the float32 rms epsilon and rope
  base are read as their shortest float32 decimal (`1e-05`), the value the source had.
- **End of generation**: the file's eos, plus `<|endoftext|>` and the other end-of-turn tokens
  its vocabulary has (llama.cpp's end-of-generation set).
- **The tokenizer** is transformers' conversion of `tokenizer.ggml.*`, with the file's chat
  template (`tokenizer_files`).

Nothing here imports torch at module level, so `gguf_problem` checks a path before any load.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from quire.model.model_config import ModelConfig
    from quire.model.quantized_linear import Weight

# llama.cpp name (after "blk.N.") -> Hugging Face Llama name (after "model.layers.N.").
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
# Tokens that end generation besides the GGUF's eos, as llama.cpp's vocab treats them.
_END_OF_GENERATION_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")
# Float tensor types, by ggml type id: F32, F16, BF16.
_FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}


def is_gguf(model: str | Path) -> bool:
    """Whether `model` names a GGUF file (by its suffix; the file is not read)."""
    return Path(model).suffix.lower() == ".gguf"


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face Llama name of a llama.cpp tensor, or ValueError if it has none."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in LAYER_TENSORS:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face Llama equivalent")
    return f"model.layers.{match.group(1)}.{LAYER_TENSORS[match.group(2)]}.weight"


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's rope permutation of q/k rows: [num_heads * head_dim, ...]."""
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
    # llama.cpp: w.reshape(heads, 2, half, ...).swapaxes(1, 2); this is its inverse.
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def field(reader: Any, key: str, default: Any = None) -> Any:
    """Metadata value `key` of a GGUFReader, `default` where the file has none."""
    value = reader.fields.get(key)
    return default if value is None else value.contents()


def _token_id(reader: Any, name: str) -> int | None:
    value = field(reader, f"tokenizer.ggml.{name}")
    return None if value is None else int(value)


def _float32_decimal(value: float) -> float:
    # GGUF stores these as float32; the shortest decimal that round-trips is the source value.
    return float(str(np.float32(value)))


def build_config(reader: Any) -> dict[str, Any]:
    """config.json for the GGUF's model; ValueError for what Quire does not cover."""
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only llama)")
    unsupported = [
        k for k in reader.fields if k.startswith(("llama.rope.scaling.", "llama.expert"))
    ]
    if unsupported:
        raise ValueError(f"GGUF keys {unsupported} (rope scaling, experts) are not supported")
    names = {t.name for t in reader.tensors}
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    hidden = int(field(reader, "llama.embedding_length"))
    num_heads = int(field(reader, "llama.attention.head_count"))
    head_dim = int(field(reader, "llama.attention.key_length", hidden // num_heads))
    rope_dim = int(field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary ({rope_dim} of {head_dim} dims) is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(field(reader, "llama.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": _float32_decimal(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _float32_decimal(field(reader, "llama.rope.freq_base", 10000.0)),
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _token_id(reader, "bos_token_id"),
        "eos_token_id": _token_id(reader, "eos_token_id"),
        "pad_token_id": _token_id(reader, "padding_token_id"),
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": "float32",
        "torch_dtype": "float32",  # the pre-5 spelling, for loaders that still read it
    }


def end_of_generation_ids(reader: Any) -> list[int]:
    """The GGUF's eos first, then the other end-of-generation tokens its vocab has."""
    tokens = list(field(reader, "tokenizer.ggml.tokens") or [])
    eos = _token_id(reader, "eos_token_id")
    ids = [] if eos is None else [eos]
    for token in _END_OF_GENERATION_TOKENS:
        if token in tokens and tokens.index(token) not in ids:
            ids.append(tokens.index(token))
    return ids


def expected_names(config: dict[str, Any]) -> set[str]:
    """The Hugging Face names a Llama checkpoint of `config` holds."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for i in range(config["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{hf}.weight" for hf in LAYER_TENSORS.values()}
    return names


def read_gguf(path: Path) -> Any:
    """A GGUFReader of `path`. Parsing the metadata (a tokenizer's vocabulary and merges are
    hundreds of thousands of fields) takes seconds, and a load checks, configures and reads
    the same file: the last file read is kept, until it changes on disk."""
    return _read_gguf(*file_version(path))


def file_version(path: Path) -> tuple[str, int, int]:
    """(resolved path, mtime in ns, size): the key a per-process cache of what a file holds is
    kept under, so that a file changed on disk is read again."""
    stat = Path(path).stat()
    return str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=1)
def _read_gguf(path: str, mtime_ns: int, size: int) -> Any:
    from gguf import GGUFReader

    return GGUFReader(path)


def gguf_problem(path: Path) -> str | None:
    """What keeps the GGUF file `path` from loading, or None: completes "model path X ..."."""
    if not path.is_file():
        return "is not a file (a .gguf model path names a GGUF file)"
    from quire.kernels.reference_quantized import FORMATS_BY_TYPE

    try:
        reader = read_gguf(path)
        build_config(reader)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"is not a GGUF file Quire can load: {exc}"
    unknown = sorted(
        {
            t.tensor_type.name
            for t in reader.tensors
            if int(t.tensor_type) not in FORMATS_BY_TYPE and int(t.tensor_type) not in _FLOAT_TYPES
        }
    )
    if unknown:
        return f"holds tensor types Quire does not compute on: {', '.join(unknown)}"
    return None


def model_config(reader: Any) -> ModelConfig:
    """The ModelConfig of a GGUFReader's model, ending generation at end_of_generation_ids."""
    from transformers import LlamaConfig

    from quire.model.model_config import ModelConfig

    config = ModelConfig.from_hf(LlamaConfig(**build_config(reader)))
    return replace(config, eos_token_ids=tuple(end_of_generation_ids(reader)))


def load_gguf(
    path: Path, device: torch.device, dtype: torch.dtype, int8_activations: bool = False
) -> tuple[ModelConfig, dict[str, Weight]]:
    """Config and weights of a GGUF file: blocks kept as they are (QuantizedTensor, with
    `int8_activations`), float tensors cast to `dtype`, all on `device`."""
    import torch
    from gguf.quants import dequantize

    from quire.kernels.reference_quantized import FORMATS_BY_TYPE
    from quire.model.quantized_linear import QuantizedTensor

    reader = read_gguf(path)
    hf_config = build_config(reader)
    config = model_config(reader)
    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
    weights: dict[str, Weight] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        # GGUF lists dims innermost first; torch outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        fmt = FORMATS_BY_TYPE.get(int(tensor.tensor_type))
        # blocks: [rows, row_bytes] uint8; a float tensor: its values
        data = np.asarray(tensor.data) if fmt else dequantize(tensor.data, tensor.tensor_type)
        data = data.reshape(shape[0], -1) if fmt else data.reshape(shape)
        proj = name.rsplit(".", 2)[-2]
        if proj in heads:
            data = unpermute_rows(data, heads[proj])
        # np.array copies: the tensor owns its memory, never the reader's map of the file
        array = torch.from_numpy(np.array(data)).to(device)
        if fmt is None:
            weights[name] = array.to(dtype)
        else:
            weights[name] = QuantizedTensor(fmt.name, array, shape[1], dtype, int8_activations)
    missing = expected_names(hf_config) - weights.keys()
    if missing:
        raise ValueError(f"GGUF {str(path)!r} lacks tensors for {sorted(missing)}")
    return config, weights
