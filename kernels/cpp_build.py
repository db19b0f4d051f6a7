"""Build the C++ CPU kernels (kernels/csrc/) into build/quire_kernels_cpu/.

    python -m quire.kernels.cpp_build [--force]

One compiler call (the system C++ compiler, $CXX or c++) against the installed torch's headers
and libraries; no ninja or setuptools. The result is a torch op library (torch.ops.quire_cpu)
plus a manifest of what it was built from, which cpp_attention.py checks before loading it:
a library built from other sources, for another torch, or for instructions this CPU lacks is
not loaded. The instruction set is the newest x86-64 level this CPU supports (v4: AVX-512,
v3: AVX2 + FMA) unless QUIRE_CPU_KERNELS_MARCH gives the -march value ("" for the compiler's
default); the loops are plain C++ with `omp simd` hints, vectorized by the compiler, and
threads come from at::parallel_for (torch's OpenMP pool, sized by torch.set_num_threads).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = tuple(
    _CSRC / name
    for name in ("paged_attention_cpu.cpp", "fused_ops_cpu.cpp", "cache_cpu.cpp", "linear_cpu.cpp")
)
BUILD_DIR = Path(__file__).resolve().parents[1] / "build" / "quire_kernels_cpu"
LIBRARY_PATH = BUILD_DIR / "libquire_kernels_cpu.so"
MANIFEST_PATH = BUILD_DIR / "manifest.json"
MARCH_ENV_VAR = "QUIRE_CPU_KERNELS_MARCH"

# /proc/cpuinfo flags each x86-64 level needs (the subset the compiler may use for these loops).
_X86_LEVELS = {
    "x86-64-v4": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "f16c", "bmi2"),
    "x86-64-v3": ("avx2", "fma", "f16c", "bmi2", "movbe"),
}


@dataclass(frozen=True)
class Manifest:
    """What a built library was made from: it is loaded only if all of it still holds."""

    source_sha256: str  # of every source file, in order
    torch_version: str  # the torch whose headers and ABI it was compiled against
    march: str  # the -march value, "" for the compiler's default
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the code may use
    command: str  # the compiler call
    build_seconds: float


def source_sha256() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (empty where /proc/cpuinfo has none, e.g. not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _choose_march() -> tuple[str, tuple[str, ...]]:
    if MARCH_ENV_VAR in os.environ:
        march = os.environ[MARCH_ENV_VAR].strip()
        return march, _X86_LEVELS.get(march, ())
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_flags()
        for level, needed in _X86_LEVELS.items():
            if flags.issuperset(needed):
                return level, needed
    return "", ()


def _compile_command(output: Path, march: str) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    torch_lib = cpp_extension.library_paths()[0]
    command = [os.environ.get("CXX", "c++"), *(str(source) for source in SOURCES)]
    # -fopenmp: at::parallel_for is inline OpenMP, so without it the kernels run on one
    # thread. libgomp resolves to the copy torch already loaded (same soname).
    command += ["-o", str(output), "-shared", "-fPIC", "-std=c++17", "-O3", "-fopenmp"]
    command += [f"-march={march}"] if march else []
    command += ["-Wall", "-Wno-unknown-pragmas"]
    command += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    for include in cpp_extension.include_paths():
        command += ["-isystem", include]
    command += [f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch_cpu"]
    return command


def is_up_to_date() -> bool:
    """Whether the library was built from these sources, for this torch, by this command."""
    import torch

    manifest = read_manifest()
    return (
        manifest is not None
        and LIBRARY_PATH.exists()
        and manifest.source_sha256 == source_sha256()
        and manifest.torch_version == torch.__version__
        and manifest.command == shlex.join(_compile_command(LIBRARY_PATH, _choose_march()[0]))
    )


def read_manifest() -> Manifest | None:
    try:
        fields = json.loads(MANIFEST_PATH.read_text())
        return Manifest(**{**fields, "cpu_flags": tuple(fields["cpu_flags"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def build(force: bool = False) -> Manifest:
    """Compile the library unless an up-to-date one is there; raise CalledProcessError if the
    compiler fails (its output goes to stderr)."""
    import torch

    if not force and is_up_to_date():
        manifest = read_manifest()
        assert manifest is not None, "is_up_to_date implies a manifest"
        logger.info("%s is up to date", LIBRARY_PATH)
        return manifest
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    march, needed_flags = _choose_march()
    # Compile to a temporary name, then rename: a process loading the library never sees a
    # half-written file, and a failed build leaves the last good one (and no new manifest).
    with tempfile.NamedTemporaryFile(dir=BUILD_DIR, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    command = _compile_command(tmp_path, march)
    logger.info("building %s: %s", LIBRARY_PATH, shlex.join(command))
    start = time.perf_counter()
    try:
        subprocess.run(command, check=True)
        tmp_path.chmod(0o755)
        tmp_path.replace(LIBRARY_PATH)
    finally:
        tmp_path.unlink(missing_ok=True)
    manifest = Manifest(
        source_sha256=source_sha256(),
        torch_version=torch.__version__,
        march=march,
        cpu_flags=needed_flags,
        command=shlex.join(_compile_command(LIBRARY_PATH, march)),
        build_seconds=round(time.perf_counter() - start, 1),
    )
    MANIFEST_PATH.write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    logger.info("built %s in %.1f s (-march=%s)", LIBRARY_PATH, manifest.build_seconds, march)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build(force=args.force)
    except subprocess.CalledProcessError as error:
        sys.exit(f"building the C++ CPU kernels failed (exit {error.returncode})")


if __name__ == "__main__":
    main()
