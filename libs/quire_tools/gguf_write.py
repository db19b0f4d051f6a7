"""Write a Hugging Face Llama checkpoint as a llama.cpp GGUF file, its weights quantized.

The inverse of quire_tools.gguf_convert, for models the project makes itself (the tests' tiny
random checkpoints, the benchmarks' larger ones): every file is written by the `gguf` package's
writer and quantizers, so the bytes are the ones llama.cpp's own tools would write for these
weights.

    python -m quire_tools.gguf_write --checkpoint models/quire-tiny --out tiny.Q4_1.gguf \\
        --quant Q4_1 [--embedding-quant Q8_0]

Linear weights take `--quant` (Q8_0, Q4_0, Q4_1, or F16/BF16/F32), the embedding table
`--embedding-quant` (Q8_0 by default, as llama.cpp's Q4_1 files have it), norms stay F32.
q_proj and k_proj rows get llama.cpp's rope permutation (gguf_checkpoint undoes it). The
tokenizer (byte-level BPE: tokens, merges, special ids, chat template) comes from the
checkpoint's tokenizer.json and tokenizer_config.json. The same inputs write the same bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quire.model.gguf_checkpoint import GLOBAL_TENSORS, LAYER_TENSORS
from quire.model.loader import load_state_dict

logger = logging.getLogger(__name__)

QUANTS = ("Q8_0", "Q4_0", "Q4_1", "F16", "BF16", "F32")
# Hugging Face name -> llama.cpp name
_HF_TO_GGUF = {hf: gguf for gguf, hf in GLOBAL_TENSORS.items()}
# tokenizer.ggml.token_type values
_NORMAL, _CONTROL = 1, 3


def permute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's rope permutation of q/k rows (the inverse of gguf_checkpoint's)."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def gguf_name(hf_name: str) -> str:
    if hf_name in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf_name]
    parts = hf_name.split(".")  # model.layers.N.<hf>.weight
    hf = ".".join(parts[3:-1])
    (short,) = [g for g, h in LAYER_TENSORS.items() if h == hf]
    return f"blk.{parts[2]}.{short}.weight"


def _add_tokenizer(writer: Any, checkpoint: Path) -> None:
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    special = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    tokens = [""] * (max([*vocab.values(), *special.values()]) + 1)
    for token, index in {**vocab, **special}.items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [_CONTROL if i in special.values() else _NORMAL for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        if config.get(key) in special:
            add(special[config[key]])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    template = config.get("chat_template")
    template_file = checkpoint / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = template_file.read_text()
    if template:
        writer.add_chat_template(template)


def _tensor_bytes(weight: torch.Tensor, quant: str) -> tuple[np.ndarray, Any]:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[quant]
    array = weight.float().numpy()
    if quant == "F32":
        return array, qtype
    return quantize(array, qtype), qtype


def write_gguf(checkpoint: Path, out: Path, quant: str, embedding_quant: str = "Q8_0") -> Path:
    """`checkpoint` (a Llama directory) as the GGUF file `out`; returns `out`."""
    from gguf import GGUFWriter

    if quant not in QUANTS or embedding_quant not in QUANTS:
        raise ValueError(f"quantization types are {', '.join(QUANTS)}")
    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("architectures") != ["LlamaForCausalLM"]:
        raise ValueError(f"{checkpoint} is not a LlamaForCausalLM checkpoint")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(out), "llama")
    writer.add_name(checkpoint.name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_tokenizer(writer, checkpoint)
    state = load_state_dict(checkpoint, torch.device("cpu"), torch.float32)
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    for name in sorted(state):
        weight = state[name]
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            num = heads if name.endswith("q_proj.weight") else kv_heads
            weight = torch.from_numpy(permute_rows(weight.numpy(), num))
        kind = quant if weight.dim() == 2 else "F32"
        if name == "model.embed_tokens.weight":
            kind = embedding_quant
        data, qtype = _tensor_bytes(weight, kind)
        writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    logger.info("wrote %s (%d bytes)", out, out.stat().st_size)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path, help="a Llama checkpoint dir")
    parser.add_argument("--out", required=True, type=Path, help="the .gguf file to write")
    parser.add_argument("--quant", default="Q4_1", choices=QUANTS, help="linear weights' type")
    parser.add_argument("--embedding-quant", default="Q8_0", choices=QUANTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_gguf(args.checkpoint, args.out, args.quant, args.embedding_quant)


if __name__ == "__main__":
    main()
