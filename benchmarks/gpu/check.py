"""The GPU check: one command that runs on a GPU machine's own Python, from the source tree.

    PYTHONPATH=libs python3 -m benchmarks.gpu.check [--kit .gpu-kit] [--out DIR]  # make gpu-check

Nothing is installed: the machine's python3 with its own torch (CUDA), Triton and transformers
runs Quire from this checkout, `quire` from libs/ on PYTHONPATH, which every step inherits. What
the machine cannot have, the model and the ShareGPT requests, comes in the kit (`make gpu-kit`,
benchmarks.gpu.kit). Steps, each a child process with its own time limit, so that one failing or
hanging step still leaves the others' results:

1. environment: Python, torch, Triton, transformers, the device; which needed module is missing.
2. kernel tests: tests/kernels compiled for the device, against the torch reference (the
   `gpu`-marked bfloat16 and float16 tests among them), as a JUnit XML.
3. decode bandwidth: benchmarks.decode_attention in bfloat16, each point's GB/s as a share of
   the device-to-device copy bandwidth measured in the same run.
4. moe experts: benchmarks.moe_experts in bfloat16, the Triton grouped GEMM and torch's
   grouped_mm against the per-expert loop at Mixtral- and Qwen3-MoE-like shapes, tokens/s.
5. end to end: benchmarks.gpu.end_to_end, Quire vs transformers on the kit's requests.

Writes DIR/gpu-check.json (every step's status, time and headline figures) beside each step's
log and results, prints a summary, and exits non-zero if a step failed. `--device cpu --quick`
runs the same plumbing on small shapes on a CPU (no figures worth quoting).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("bench/results/gpu")
DEFAULT_BUDGET_S = 450  # the whole check, under a lent machine's 8-minute slot
# Step limits (s) within the budget; the end-to-end step gets what is left.
KERNEL_TESTS_LIMIT_S = 200
DECODE_LIMIT_S = 120
MOE_LIMIT_S = 60
# Modules the steps import; each is on a GPU machine's image or the check says which is not.
NEEDED_MODULES = (
    "torch",
    "triton",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "tqdm",
    "jinja2",
    "pytest",
    "pytest_timeout",
    "quire",  # from libs/: PYTHONPATH=libs
)


@dataclass
class StepResult:
    """One step: how it ended, how long it took, and what it found."""

    name: str
    status: str  # "passed", "failed", "timed out" or "skipped"
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)
    log: str | None = None  # the step's output, beside gpu-check.json
    summary: dict[str, Any] = field(default_factory=dict)


def environment(device: str) -> StepResult:
    """Versions, the device, and the needed modules that are missing (then: failed)."""
    start = time.perf_counter()
    missing = [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]
    summary: dict[str, Any] = {"python": platform.python_version(), "missing_modules": missing}
    status = "failed" if missing else "passed"
    if importlib.util.find_spec("torch") is not None:
        import torch

        summary["torch"] = torch.__version__
        summary["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            summary["device_name"] = props.name
            summary["compute_capability"] = f"{props.major}.{props.minor}"
            summary["device_memory_gib"] = round(props.total_memory / 2**30, 1)
            summary["cuda"] = torch.version.cuda
        elif device == "cuda":
            status = "failed"
    for name in ("triton", "transformers"):
        if importlib.util.find_spec(name) is not None:
            summary[name] = __import__(name).__version__
    if "quire" not in missing:
        import quire.kernels

        summary["quire_kernels_from"] = str(Path(quire.kernels.__file__).parent)
    return StepResult("environment", status, time.perf_counter() - start, summary=summary)


def run_step(name: str, args: list[str], out: Path, limit_s: float) -> StepResult:
    """`python -m ARGS` as a child in the checkout, its output shown and logged."""
    command = [sys.executable, "-m", *args]
    log_path = out / f"{name.replace(' ', '-')}.log"
    print(f"\n== {name}: {' '.join(args)} (limit {limit_s:.0f} s)", flush=True)
    if limit_s <= 0:
        return StepResult(name, "skipped", command=command, summary={"reason": "no time left"})
    start = time.perf_counter()
    status = None
    with log_path.open("w") as log:
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own process group: a timeout stops its children too
        )
        pump = threading.Thread(target=_copy_lines, args=(child.stdout, log), daemon=True)
        pump.start()
        try:
            returncode = child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            returncode, status = child.wait(), "timed out"
        except BaseException:  # Ctrl-C: the child's group is not in the terminal's
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        pump.join(timeout=10)
    if status is None:
        status = "passed" if returncode == 0 else "failed"
    seconds = time.perf_counter() - start
    print(f"== {name}: {status} in {seconds:.0f} s", flush=True)
    return StepResult(name, status, seconds, command, log_path.name, {"returncode": returncode})


def _copy_lines(source: IO[str] | None, log: IO[str]) -> None:
    assert source is not None
    for line in source:
        sys.stdout.write(line)
        log.write(line)
    sys.stdout.flush()


def junit_counts(path: Path) -> dict[str, int]:
    """Tests, failures, errors and skips from pytest's JUnit XML (empty if it was not written)."""
    if not path.is_file():
        return {}
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {}
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def decode_summary(path: Path) -> dict[str, Any]:
    """The copy bandwidth and the fast backend's best and largest-point shares of it."""
    if not path.is_file():
        return {}
    report = json.loads(path.read_text())
    fast = [r for r in report["results"] if r["backend"] in ("triton", "cpp")]
    if not fast:
        return {"copy_gb_per_s": report["copy_gb_per_s"]}
    best = max(fast, key=lambda r: r["share_of_copy"])
    largest = max(fast, key=lambda r: (r["batch_size"] * r["context_len"], r["batch_size"]))
    return {
        "copy_gb_per_s": report["copy_gb_per_s"],
        "backend": best["backend"],
        "best": {k: best[k] for k in ("batch_size", "context_len", "gb_per_s", "share_of_copy")},
        "largest": {
            k: largest[k] for k in ("batch_size", "context_len", "gb_per_s", "share_of_copy")
        },
    }


def moe_summary(path: Path) -> dict[str, Any]:
    """Each fast path's tokens/s as a multiple of the per-expert loop's, per shape and token
    count."""
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text())["results"]
    summary: dict[str, Any] = {}
    for r in rows:
        if r["path"] != "loop":
            shape = r["shape"].split(" (")[0]
            key = f"{r['path']} {shape} {r['dtype']}"
            summary.setdefault(key, {})[r["num_tokens"]] = round(r["speedup_over_loop"], 2)
    return summary


def end_to_end_summary(path: Path) -> dict[str, Any]:
    """Quire's output tok/s and its ratio to each transformers path."""
    if not path.is_file():
        return {}
    report = json.loads(path.read_text())  # partial when the step was stopped
    quire = report["quire"] or {}
    return {
        "quire_output_tok_s": quire.get("output_tok_s"),
        "transformers": {
            name: {k: run[k] for k in ("output_tok_s", "quire_ratio", "error")}
            for name, run in report["transformers"].items()
        },
        "num_requests": report["workload"]["num_requests"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=Path(".gpu-kit"), help="make gpu-kit's output")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results and logs")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="whole check")
    parser.add_argument(
        "--quick", action="store_true", help="small shapes, for trying the plumbing on a CPU"
    )
    parser.add_argument(
        "--kernel-tests", nargs="+", default=["tests/kernels"], help="pytest paths of step 2"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    env = environment(args.device)
    print(json.dumps(env.summary, indent=2))
    steps = [env]
    if env.status == "passed":
        tests = run_step(
            "kernel tests",
            ["pytest", "-q", "-p", "no:cacheprovider", *args.kernel_tests]
            + ["--device", args.device, "--junitxml", str(out / "kernel-tests.xml")],
            out,
            KERNEL_TESTS_LIMIT_S,
        )
        tests.summary.update(junit_counts(out / "kernel-tests.xml"))
        steps.append(tests)

        decode_args = ["--device", args.device, "--dtype", "bfloat16"]
        if args.quick:
            decode_args += ["--batch-sizes", "4", "--context-lens", "64"]
        decode = run_step(
            "decode bandwidth",
            ["benchmarks.decode_attention", *decode_args]
            + ["--output", str(out / "decode_attention.json")],
            out,
            DECODE_LIMIT_S,
        )
        decode.summary.update(decode_summary(out / "decode_attention.json"))
        steps.append(decode)

        moe_args = ["--device", args.device, "--dtypes", "bfloat16"]
        if args.quick:
            moe_args += ["--quick", "--token-counts", "1", "16", "--repeats", "2"]
        moe = run_step(
            "moe experts",
            ["benchmarks.moe_experts", *moe_args, "--output", str(out / "moe_experts.json")],
            out,
            MOE_LIMIT_S,
        )
        moe.summary.update(moe_summary(out / "moe_experts.json"))
        steps.append(moe)

        e2e_args = ["--kit", str(args.kit.resolve()), "--device", args.device]
        if args.quick:
            e2e_args += ["--dtype", "float32", "--num-requests", "4", "--max-prompt-len", "32"]
            e2e_args += ["--max-output-len", "8", "--hf-batch-size", "2", "--max-num-seqs", "4"]
        left_s = args.budget_s - (time.perf_counter() - start)
        e2e_args += [
            "--time-limit-s",
            f"{left_s - 5:.0f}",
            "--output",
            str(out / "end_to_end.json"),
        ]
        e2e = run_step("end to end", ["benchmarks.gpu.end_to_end", *e2e_args], out, left_s)
        e2e.summary.update(end_to_end_summary(out / "end_to_end.json"))
        steps.append(e2e)

    report = {
        "benchmark": "gpu_check",
        "device": args.device,
        "quick": args.quick,
        "seconds": time.perf_counter() - start,
        "steps": [asdict(step) for step in steps],
    }
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'step':<18} {'status':<10} {'s':>5}  summary")
    for step in steps:
        headline = {k: v for k, v in step.summary.items() if k not in ("returncode",)}
        print(f"{step.name:<18} {step.status:<10} {step.seconds:>5.0f}  {json.dumps(headline)}")
    print(f"wrote {out / 'gpu-check.json'} ({report['seconds']:.0f} s)")
    return 0 if all(step.status == "passed" for step in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
