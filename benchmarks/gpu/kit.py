"""What a GPU machine needs for the end-to-end check and cannot get there: the model and requests.

    python -m benchmarks.gpu.kit --out .gpu-kit      # here: writes the kit (a few MB)

A GPU machine reaches no model hub and no package index, and what travels to it is small (tens
of MB), smaller than SmolLM2-135M's weights (270 MB in bfloat16, 93 MB as the packaged GGUF).
So the kit carries everything of the model but its weights (config.json, generation config,
tokenizer, chat template) plus the benchmark's ShareGPT requests as token ids, sampled by
vLLM's rule with the model's own tokenizer. There, `build_checkpoint` writes weights drawn at
random from a seed (transformers' own initialization of that config) beside them: the same
architecture and the same shapes, so the same work per token as the real model, as long as
each request runs to its ShareGPT output length (EOS ignored), which the benchmark does. What
random weights change is which tokens come out, not how long producing them takes.

Layout: kit.json (what it holds and where from), model/ (the checkpoint minus its weights),
requests.json ({"seed", "requests": [{"prompt_token_ids", "output_len"}, ...]}).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KIT = Path(".gpu-kit")
DEFAULT_MODEL = Path("models/smollm2-135m-instruct")
DEFAULT_NUM_REQUESTS = 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")  # left behind: the kit has no weights
BUILD_RECORD = "quire-build.json"  # the real weights' provenance: kept in kit.json, not model/


@dataclass(frozen=True)
class Kit:
    """A kit read back: its model files and its requests."""

    path: Path
    model_dir: Path  # config and tokenizer, no weights
    model_name: str
    seed: int
    prompts: list[list[int]]
    output_lens: list[int]


def write_kit(model_dir: Path, data_path: Path, out: Path, num_requests: int, seed: int) -> Path:
    """Copy the model's non-weight files and sample `num_requests` ShareGPT requests into `out`."""
    from transformers import AutoTokenizer

    from benchmarks.common.workload import sample_sharegpt

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {model_dir} (make model builds it)")
    if out.exists():
        shutil.rmtree(out)
    (out / "model").mkdir(parents=True)
    copied = {}
    for file in sorted(model_dir.iterdir()):
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and file.name != BUILD_RECORD:
            shutil.copy2(file, out / "model" / file.name)
            copied[file.name] = hashlib.sha256(file.read_bytes()).hexdigest()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampled = sample_sharegpt(data_path, tokenizer, num_requests, seed)
    requests = [
        {"prompt_token_ids": r.prompt_token_ids, "output_len": r.output_len} for r in sampled
    ]
    (out / "requests.json").write_text(json.dumps({"seed": seed, "requests": requests}) + "\n")
    manifest = {
        "model": model_dir.name,
        "model_files": copied,
        "model_build": _build_record(model_dir),
        "weights": "none: drawn at random on the machine that runs the check (build_checkpoint)",
        "requests": {
            "source": str(data_path),
            "rule": "vLLM's ShareGPT sampling (quire_tools.workloads.sharegpt.sample_requests)",
            "seed": seed,
            "num_requests": len(requests),
        },
    }
    (out / "kit.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


def _build_record(model_dir: Path) -> object:
    record = model_dir / BUILD_RECORD
    return json.loads(record.read_text()) if record.is_file() else None


def read_kit(path: Path) -> Kit:
    """The kit at `path`; FileNotFoundError saying how to make one if it is not there."""
    manifest_path = path / "kit.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"no GPU kit at {path}: run `make gpu-kit` where the model and the ShareGPT data are, "
            f"and carry {path} to the GPU machine"
        )
    manifest = json.loads(manifest_path.read_text())
    requests = json.loads((path / "requests.json").read_text())
    return Kit(
        path=path,
        model_dir=path / "model",
        model_name=manifest["model"],
        seed=requests["seed"],
        prompts=[r["prompt_token_ids"] for r in requests["requests"]],
        output_lens=[r["output_len"] for r in requests["requests"]],
    )


def build_checkpoint(kit: Kit, out: Path, dtype: str, seed: int = 0) -> Path:
    """The kit's model with seeded random weights in `dtype`, saved as a checkpoint in `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for file in kit.model_dir.iterdir():
        shutil.copy2(file, out / file.name)
    config = AutoConfig.from_pretrained(kit.model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    # save_pretrained rewrites config.json (with the dtype); the tokenizer files stay the kit's.
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="checkpoint directory")
    parser.add_argument("--data", type=Path, help="ShareGPT JSON (default: make data's file)")
    parser.add_argument("--out", type=Path, default=DEFAULT_KIT, help="kit directory")
    parser.add_argument("--num-requests", type=int, default=DEFAULT_NUM_REQUESTS)
    parser.add_argument("--seed", type=int, default=0, help="ShareGPT sampling seed")
    args = parser.parse_args(argv)
    from quire_tools.workloads import sharegpt

    out = write_kit(
        args.model, args.data or sharegpt.DEFAULT_PATH, args.out, args.num_requests, args.seed
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(
        f"wrote {out} ({size / 1e6:.1f} MB): {args.model.name} without weights, "
        f"{args.num_requests} ShareGPT requests (seed {args.seed})"
    )


if __name__ == "__main__":
    main()
