"""The builds of the C++ CPU kernels, one per x86-64 level: the portable one (x86-64-v3, what an
image runs on a host without AVX-512) computes what the native build and the torch reference
compute, and the loader picks the newest level the CPU runs.

Each build is loaded in a subprocess of its own (QUIRE_CPU_KERNELS_VARIANT; a process can load
only one), running tests/kernels/cpp_variant_ops.py. `make test` builds every level first
(`make kernels-check`); a missing build fails here rather than skipping (the comparisons skip
only with --device cuda, where `make gpu-check` runs tests/kernels with nothing built).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from quire.kernels import cpp_attention, cpp_build
from tests.kernels.cpp_variant_ops import op_cases

REPO = Path(__file__).resolve().parents[2]
PORTABLE = "x86-64-v3"
CASES = {case.name: case for case in op_cases()}
# Against the reference and between builds: float32 sums in other orders (and vdpbf16ps against
# widened products); 16-bit outputs may land one rounding step apart.
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
}
# A 128-term dot product of values ~1 in float32; bfloat16 outputs up to ~40, two steps apart.
LINEAR_TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
}
# A 256-term float32 dot product of dequantized blocks (values up to a few units).
QUANTIZED_TOLERANCE = {"atol": 1e-3, "rtol": 1e-4}
# Copies, and rotations rounded exactly as torch rounds them (reference_fused.py).
EXACT_OPS = {"write_kv_cache_", "rotary_embedding_"}

VariantOutputs = tuple[dict[str, torch.Tensor], dict[str, str]]


def _native_variant() -> str:
    return cpp_build.variant_name(cpp_build.native_march())


def _start(variant: str, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, cpp_attention.VARIANT_ENV_VAR: variant}
    command = [sys.executable, "-m", "tests.kernels.cpp_variant_ops", str(out)]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def variant_outputs(
    tmp_path_factory: pytest.TempPathFactory, device: str
) -> dict[str, VariantOutputs]:
    """Each variant's results (the portable and the native build, side by side)."""
    from safetensors import safe_open

    if device != "cpu":
        # `make gpu-check` runs tests/kernels from a source tree with nothing built
        pytest.skip("needs --device cpu: the C++ CPU builds are compared there (make test)")
    folder = tmp_path_factory.mktemp("cpp_variants")
    runs = {
        name: _start(name, folder / f"{name}.safetensors") for name in {PORTABLE, _native_variant()}
    }
    outputs = {}
    for name, run in runs.items():
        stdout, stderr = run.communicate(timeout=600)
        if run.returncode != 0:
            pytest.fail(
                f"the {name} build of the C++ CPU kernels did not run the ops (exit "
                f"{run.returncode}):\n{stdout}{stderr[-3000:]}\n`make kernels-check` builds "
                f"every x86-64 level ({', '.join(cpp_build.all_levels())})",
                pytrace=False,
            )
        with safe_open(str(folder / f"{name}.safetensors"), framework="pt") as results:
            tensors = {key: results.get_tensor(key) for key in results.keys()}  # noqa: SIM118
            outputs[name] = (tensors, results.metadata())
    return outputs


def test_each_subprocess_loaded_the_variant_it_was_told(
    variant_outputs: dict[str, VariantOutputs],
) -> None:
    for name, (_, metadata) in variant_outputs.items():
        assert metadata["variant"] == name


def test_every_registered_op_is_compared(variant_outputs: dict[str, VariantOutputs]) -> None:
    compared = {case.op for case in CASES.values()}
    compared |= {
        "packed_linear_supported",
        "quantized_linear_supported",
        "quantized_linear_int8_rows",
    }
    for name, (_, metadata) in variant_outputs.items():
        assert set(metadata["ops"].split(",")) == compared, (
            f"{name} registers ops that cpp_variant_ops.py does not call"
        )


def test_packed_linears_in_each_build(variant_outputs: dict[str, VariantOutputs]) -> None:
    # x86-64-v3 multiplies float32 and bfloat16 with AVX2 FMAs; x86-64-v4 float32 with AVX-512,
    # bfloat16 only where the CPU has AVX512_BF16.
    assert variant_outputs[PORTABLE][1]["packed_linear_dtypes"] == "torch.float32,torch.bfloat16"
    native = _native_variant()
    if native == "x86-64-v4":
        supported = variant_outputs[native][1]["packed_linear_dtypes"].split(",")
        assert "torch.float32" in supported
        assert ("torch.bfloat16" in supported) == ("avx512_bf16" in cpp_build.cpu_flags())


@pytest.mark.parametrize("name", list(CASES))
def test_portable_build_matches_native_build_and_reference(
    name: str, variant_outputs: dict[str, VariantOutputs]
) -> None:
    case = CASES[name]
    expected = case.reference()
    portable, _ = variant_outputs[PORTABLE]
    native, _ = variant_outputs[_native_variant()]
    if case.op == "packed_linear":  # AVX2 FMAs, AVX-512 FMAs or vdpbf16ps: other sum orders
        torch.testing.assert_close(portable[name], expected, **LINEAR_TOLERANCES[case.dtype])
        if name in native:
            torch.testing.assert_close(native[name], expected, **LINEAR_TOLERANCES[case.dtype])
        return
    if case.op == "decoder_layer":  # four quantized linears and attention: to their scale
        tolerance = {"atol": 1e-4 * float(expected.abs().max()), "rtol": 0.0}
        torch.testing.assert_close(portable[name], expected, **tolerance)
        torch.testing.assert_close(native[name], expected, **tolerance)
        return
    if case.op == "quantized_linear":  # AVX2 (8 lanes, 2 rows a pass) and AVX-512 (16, 4)
        torch.testing.assert_close(portable[name], expected, **QUANTIZED_TOLERANCE)
        torch.testing.assert_close(native[name], expected, **QUANTIZED_TOLERANCE)
        return
    tolerance = {"atol": 0, "rtol": 0} if case.op in EXACT_OPS else TOLERANCES[case.dtype]
    got = portable[name]
    assert got.dtype == case.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, **tolerance)
    torch.testing.assert_close(got, native[name], **tolerance)


# The loader's choice among built variants, on manifests written here for a CPU described here.

AVX512_HOST = frozenset(cpp_build.required_cpu_flags("x86-64-v4")) | {"avx512_bf16"}
AVX2_HOST = frozenset(cpp_build.required_cpu_flags("x86-64-v3"))


@pytest.fixture
def fake_build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Points the loader at an empty build folder; the returned function adds a variant."""
    monkeypatch.setattr(cpp_build, "BUILD_DIR", tmp_path)
    monkeypatch.delenv(cpp_attention.VARIANT_ENV_VAR, raising=False)

    def add(march: str, source_sha256: str | None = None) -> None:
        folder = tmp_path / cpp_build.variant_name(march)
        folder.mkdir()
        (folder / cpp_build.LIBRARY_NAME).touch()
        manifest = cpp_build.Manifest(
            source_sha256=source_sha256 or cpp_build.source_sha256(),
            torch_version=torch.__version__,
            march=march,
            cpu_flags=cpp_build.required_cpu_flags(march),
            command="c++",
            build_seconds=0.0,
        )
        fields = {**manifest.__dict__, "cpu_flags": list(manifest.cpu_flags)}
        (folder / cpp_build.MANIFEST_NAME).write_text(json.dumps(fields))

    return add


def _on_cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(cpp_build, "cpu_flags", lambda: flags)


def test_the_newest_level_the_cpu_runs_is_chosen(
    fake_build_dir: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    for march in ("x86-64-v3", "x86-64-v4", ""):
        fake_build_dir(march)
    assert cpp_build.built_variants() == ["x86-64-v4", "x86-64-v3", "default"]

    _on_cpu(monkeypatch, AVX512_HOST)
    assert cpp_attention.choose_variant() == ("x86-64-v4", [])

    _on_cpu(monkeypatch, AVX2_HOST)
    name, passed_over = cpp_attention.choose_variant()
    assert name == "x86-64-v3"
    assert len(passed_over) == 1 and passed_over[0].startswith("x86-64-v4: built with")
    assert "this CPU lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl" in passed_over[0]

    # no AVX2: only the compiler-default build, which needs no flags, runs
    _on_cpu(monkeypatch, frozenset({"sse4_2"}))
    assert cpp_attention.choose_variant()[0] == "default"


def test_a_stale_level_gives_way_to_an_older_one(
    fake_build_dir: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_build_dir("x86-64-v4", source_sha256="0" * 64)
    fake_build_dir("x86-64-v3")
    _on_cpu(monkeypatch, AVX512_HOST)
    name, passed_over = cpp_attention.choose_variant()
    assert name == "x86-64-v3"
    assert passed_over == ["x86-64-v4: built from older sources than quire/kernels/csrc/"]


def test_the_variant_setting_forces_one_or_none(
    fake_build_dir: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_build_dir("x86-64-v4")
    fake_build_dir("x86-64-v3")
    _on_cpu(monkeypatch, AVX512_HOST)
    monkeypatch.setenv(cpp_attention.VARIANT_ENV_VAR, "x86-64-v3")
    assert cpp_attention.choose_variant() == ("x86-64-v3", [])

    _on_cpu(monkeypatch, AVX2_HOST)
    monkeypatch.setenv(cpp_attention.VARIANT_ENV_VAR, "x86-64-v4")
    name, passed_over = cpp_attention.choose_variant()
    assert name is None
    assert passed_over[0].startswith("QUIRE_CPU_KERNELS_VARIANT=x86-64-v4: built with")


@pytest.mark.usefixtures("_fresh_cpp_loader")
def test_a_missing_forced_variant_says_which_target_builds_it(
    fake_build_dir: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_build_dir("x86-64-v4")
    monkeypatch.setenv(cpp_attention.VARIANT_ENV_VAR, PORTABLE)
    reason = cpp_attention.unavailable_reason()
    assert reason is not None
    assert reason.startswith(f"QUIRE_CPU_KERNELS_VARIANT={PORTABLE}: not built")
    assert reason.endswith("run `make kernels-check`")
    assert cpp_attention.loaded_variant() is None
