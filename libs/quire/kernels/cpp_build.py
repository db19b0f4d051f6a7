"""Build the C++ CPU kernels (csrc/ beside this module) into build/quire_kernels_cpu/<variant>/.

    python -m quire.kernels.cpp_build [--all-levels] [--force]

One compiler call per variant (the system C++ compiler, $CXX or c++) against the installed
torch's headers and libraries; no ninja or setuptools. A variant is the library built for one
-march value, in a folder named after it: a torch op library (torch.ops.quire_cpu) plus a
manifest of what it was built from and which CPU flags it needs, which cpp_attention.py checks
before loading it: a library built from other sources, for another torch, or for instructions
this CPU lacks is not loaded.

Without arguments it builds the native variant (`make install`): the newest x86-64 level this
CPU supports (x86-64-v4: AVX-512, x86-64-v3: AVX2 + FMA), or the -march QUIRE_CPU_KERNELS_MARCH
gives ("" for the compiler's default, folder "default"). --all-levels builds every x86-64 level
instead, what the images ship and `make kernels-check` compiles, so that the loader can pick
the newest level a host runs. AVX-512 code is compiled only where the -march has it
(csrc/cpu_features.h). An up-to-date variant (same sources, torch and compiler call) is not
rebuilt. The loops are plain C++ with `omp simd` hints, vectorized by the compiler, plus AVX-512
intrinsics where __AVX512F__ is defined; threads come from at::parallel_for (torch's OpenMP
pool, sized by torch.set_num_threads).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_PACKAGE_DIR = Path(__file__).resolve().parent
_CSRC = _PACKAGE_DIR / "csrc"
SOURCES = tuple(
    _CSRC / name
    for name in (
        "paged_attention_cpu.cpp",
        "fused_ops_cpu.cpp",
        "cache_cpu.cpp",
        "linear_cpu.cpp",
        "quantized_linear_cpu.cpp",
        "decoder_layer_cpu.cpp",
    )
)
HEADERS = (
    _CSRC / "cpu_features.h",
    _CSRC / "kernel_ops.h",
    _CSRC / "packed_tile.h",
)  # included by the sources: part of what a build is from
# The checkout's build/ when the package runs from one (PYTHONPATH=libs, the editable install,
# the images' /app); beside the package when it is installed elsewhere.
_CHECKOUT = _PACKAGE_DIR.parents[2]
_BUILD_ROOT = _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else _PACKAGE_DIR
BUILD_DIR = _BUILD_ROOT / "build" / "quire_kernels_cpu"
LIBRARY_NAME = "libquire_kernels_cpu.so"
MANIFEST_NAME = "manifest.json"
MARCH_ENV_VAR = "QUIRE_CPU_KERNELS_MARCH"
DEFAULT_VARIANT = "default"  # the folder of a build with the compiler's default -march

# /proc/cpuinfo flags each x86-64 level needs (those the compiler may emit for these loops; abm
# is LZCNT), newest level first: the order the loader prefers the variants in.
_X86_V2 = ("popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = (*_X86_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")
_X86_LEVELS = {
    "x86-64-v4": (*_X86_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "x86-64-v3": _X86_V3,
}
_VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class Manifest:
    """What a built library was made from: it is loaded only if all of it still holds."""

    source_sha256: str  # of every source and header file, in order
    torch_version: str  # the torch whose headers and ABI it was compiled against
    march: str  # the -march value, "" for the compiler's default
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the code may use
    command: str  # the compiler call
    build_seconds: float


def source_sha256() -> str:
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
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


def native_march() -> str:
    """The -march of the native variant: QUIRE_CPU_KERNELS_MARCH when set, else the newest
    x86-64 level this CPU supports, else "" (the compiler's default)."""
    if MARCH_ENV_VAR in os.environ:
        return os.environ[MARCH_ENV_VAR].strip()
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_flags()
        for level, needed in _X86_LEVELS.items():
            if flags.issuperset(needed):
                return level
    return ""


def all_levels() -> tuple[str, ...]:
    """Every x86-64 level a variant is built for, newest first."""
    return tuple(_X86_LEVELS)


def required_cpu_flags(march: str) -> tuple[str, ...]:
    """The /proc/cpuinfo flags code built with this -march may use (none known for a -march
    other than an x86-64 level)."""
    return _X86_LEVELS.get(march, ())


def variant_name(march: str) -> str:
    """The folder name of the variant built with this -march."""
    name = march or DEFAULT_VARIANT
    if not _VARIANT_NAME.fullmatch(name):
        raise ValueError(f"{MARCH_ENV_VAR}={march!r} is not a -march value")
    return name


def variant_dir(name: str) -> Path:
    return BUILD_DIR / name


def library_path(name: str) -> Path:
    return variant_dir(name) / LIBRARY_NAME


def read_manifest(name: str) -> Manifest | None:
    try:
        fields = json.loads((variant_dir(name) / MANIFEST_NAME).read_text())
        return Manifest(**{**fields, "cpu_flags": tuple(fields["cpu_flags"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def built_variants() -> list[str]:
    """The variants with a manifest under BUILD_DIR, in the loader's order of preference: the
    x86-64 levels newest first, then any other -march builds by name."""
    try:
        names = {path.parent.name for path in BUILD_DIR.glob(f"*/{MANIFEST_NAME}")}
    except OSError:
        return []
    levels = [level for level in _X86_LEVELS if level in names]
    return levels + sorted(names - set(levels))


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


def is_up_to_date(march: str) -> bool:
    """Whether march's variant was built from these sources, for this torch, by this command."""
    import torch

    name = variant_name(march)
    manifest = read_manifest(name)
    return (
        manifest is not None
        and library_path(name).exists()
        and manifest.source_sha256 == source_sha256()
        and manifest.torch_version == torch.__version__
        and manifest.command == shlex.join(_compile_command(library_path(name), march))
    )


def build(march: str, force: bool = False) -> Manifest:
    """Compile march's variant unless an up-to-date one is there; raise CalledProcessError if
    the compiler fails (its output goes to stderr)."""
    import torch

    name = variant_name(march)
    output = library_path(name)
    if not force and is_up_to_date(march):
        manifest = read_manifest(name)
        assert manifest is not None, "is_up_to_date implies a manifest"
        logger.info("%s is up to date", output)
        return manifest
    output.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name, then rename: a process loading the library never sees a
    # half-written file, and a failed build leaves the last good one (and its manifest, which
    # no longer matches the sources, so the loader skips it).
    with tempfile.NamedTemporaryFile(dir=output.parent, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    command = _compile_command(tmp_path, march)
    logger.info("building %s: %s", output, shlex.join(command))
    start = time.perf_counter()
    try:
        subprocess.run(command, check=True)
        tmp_path.chmod(0o755)
        tmp_path.replace(output)
    finally:
        tmp_path.unlink(missing_ok=True)
    manifest = Manifest(
        source_sha256=source_sha256(),
        torch_version=torch.__version__,
        march=march,
        cpu_flags=required_cpu_flags(march),
        command=shlex.join(_compile_command(output, march)),
        build_seconds=round(time.perf_counter() - start, 1),
    )
    (output.parent / MANIFEST_NAME).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    logger.info("built %s in %.1f s (-march=%s)", output, manifest.build_seconds, march)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all-levels",
        action="store_true",
        help=f"build every x86-64 level ({', '.join(all_levels())}), not the native variant",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    marches = all_levels() if args.all_levels else (native_march(),)
    # One compiler process per level, side by side (each is single-threaded).
    workers = max(1, min(len(marches), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        futures = {march: pool.submit(build, march, args.force) for march in marches}
    for march, future in futures.items():
        error = future.exception()
        if isinstance(error, subprocess.CalledProcessError):
            sys.exit(
                f"building the C++ CPU kernels for -march={march or '(default)'} failed "
                f"(exit {error.returncode})"
            )
        if error is not None:
            raise error


if __name__ == "__main__":
    main()
