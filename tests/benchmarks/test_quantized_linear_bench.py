"""The quantized-linear benchmark's plumbing on a tiny GGUF: every matmul at every M, both
activation modes, checked against the oracles, JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from quire_tools import gguf_write

from benchmarks import quantized_linear
from quire.kernels import cpp_quantized
from tests.checkpoints import tiny_checkpoint


@pytest.mark.skipif(
    not cpp_quantized.supports("Q4_1", torch.float32),
    reason="needs x86-64-v3 (AVX2, FMA, F16C): Quire's quantized linear",
)
def test_every_matmul_and_mode_is_timed(tmp_path: Path) -> None:
    path = gguf_write.write_gguf(tiny_checkpoint(), tmp_path / "tiny.gguf", "Q4_1")
    out = tmp_path / "q.json"
    report = quantized_linear.main(["--gguf", str(path), "--rows", "1", "48", "--out", str(out)])
    points = {(r["matmul"], r["rows"]) for r in report["rows"]}
    assert points == {(m, n) for m in ("qkv", "o", "gate_up", "down", "lm_head") for n in (1, 48)}
    assert {r["format"] for r in report["rows"] if r["matmul"] != "lm_head"} == {"Q4_1"}
    assert all(r["float32_us"] > 0 and r["int8_us"] > 0 for r in report["rows"])
    # the interleaved layout, timed where this CPU multiplies it (AVX512_VNNI)
    packed = [r for r in report["rows"] if "x16_us" in r]
    assert bool(packed) == cpp_quantized.supports("Q4_1x16", torch.float32)
    assert all(r["x16_us"] > 0 and r["x16_format"] in ("Q4_1x16", "Q8_0x16") for r in packed)
    assert json.loads(out.read_text()) == report
