"""The GPU check's plumbing, tried on the CPU: its steps, their limits, its report and its kit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from quire_tools.workloads import sharegpt

from benchmarks.gpu import check
from benchmarks.gpu.kit import build_checkpoint, read_kit, write_kit

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "quire-tiny"


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kit") / "kit"
    return write_kit(TINY, REPO / sharegpt.DEFAULT_PATH, out, num_requests=6, seed=3)


def test_kit_holds_the_model_without_weights_and_the_sampled_requests(kit: Path) -> None:
    manifest = json.loads((kit / "kit.json").read_text())
    assert manifest["requests"] == {
        "source": str(REPO / sharegpt.DEFAULT_PATH),
        "rule": "vLLM's ShareGPT sampling (quire_tools.workloads.sharegpt.sample_requests)",
        "seed": 3,
        "num_requests": 6,
    }
    names = sorted(p.name for p in (kit / "model").iterdir())
    assert "config.json" in names and "tokenizer.json" in names
    assert not [n for n in names if n.endswith(".safetensors")]
    loaded = read_kit(kit)
    from transformers import AutoTokenizer

    expected = sharegpt.sample_requests(
        sharegpt.read_conversations(REPO / sharegpt.DEFAULT_PATH),
        AutoTokenizer.from_pretrained(TINY),
        6,
        3,
    )
    assert loaded.prompts == [r.prompt_token_ids for r in expected]
    assert loaded.output_lens == [r.output_len for r in expected]


def test_missing_kit_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make gpu-kit"):
        read_kit(tmp_path / "nowhere")


def test_random_checkpoint_is_seeded_and_has_the_kit_shapes(kit: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    first = load_file(
        build_checkpoint(read_kit(kit), tmp_path / "a", "float32", 5) / "model.safetensors"
    )
    again = load_file(
        build_checkpoint(read_kit(kit), tmp_path / "b", "float32", 5) / "model.safetensors"
    )
    other = load_file(
        build_checkpoint(read_kit(kit), tmp_path / "c", "float32", 6) / "model.safetensors"
    )
    real = load_file(TINY / "model.safetensors")
    assert {k: v.shape for k, v in first.items()} == {k: v.shape for k, v in real.items()}
    assert all((first[k] == again[k]).all() for k in first)
    assert any((first[k] != other[k]).any() for k in first)


def test_a_step_that_fails_or_hangs_is_reported_as_such(tmp_path: Path) -> None:
    failed = check.run_step("bad args", ["benchmarks.gpu.kit", "--no-such-flag"], tmp_path, 60)
    assert failed.status == "failed" and failed.summary["returncode"] == 2
    assert "--no-such-flag" in (tmp_path / "bad-args.log").read_text()
    hung = check.run_step(
        "hangs", ["timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"], tmp_path, 2
    )
    assert hung.status == "timed out" and hung.seconds < 30
    skipped = check.run_step("late", ["timeit", "pass"], tmp_path, 0)
    assert skipped.status == "skipped"


def test_junit_counts(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="5" failures="1" errors="0" skipped="2">'
        "</testsuite></testsuites>"
    )
    assert check.junit_counts(xml) == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2}
    assert check.junit_counts(tmp_path / "missing.xml") == {}


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(kit: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--device", "cpu", "--quick"]
        + ["--kit", str(kit), "--out", str(tmp_path)]
        + ["--kernel-tests", "tests/kernels/test_reference.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    steps = {step["name"]: step for step in report["steps"]}
    assert list(steps) == [
        "environment",
        "kernel tests",
        "decode bandwidth",
        "moe experts",
        "end to end",
    ]
    assert all(step["status"] == "passed" for step in steps.values())
    assert steps["environment"]["summary"]["missing_modules"] == []
    tests = steps["kernel tests"]["summary"]
    assert tests["tests"] > 0 and tests["failures"] == tests["errors"] == 0
    decode = steps["decode bandwidth"]["summary"]
    assert decode["copy_gb_per_s"] > 0
    assert steps["moe experts"]["summary"]["grouped tiny bfloat16"].keys() == {"1", "16"}
    e2e = json.loads((tmp_path / "end_to_end.json").read_text())
    kit_lens = read_kit(kit).output_lens[:4]
    assert e2e["workload"]["num_requests"] == 4
    assert e2e["workload"]["num_output_tokens"] == sum(min(n, 8) for n in kit_lens)
    assert e2e["quire"]["output_tok_s"] > 0
    static = e2e["transformers"]["transformers static"]
    assert static["error"] is None and static["quire_ratio"] > 0
    for name in ("kernel-tests.log", "decode-bandwidth.log", "moe-experts.log", "end-to-end.log"):
        assert (tmp_path / name).stat().st_size > 0
