"""Safetensors checkpoints quantized for GPUs (AWQ, GPTQ, compressed-tensors): their weights
converted into blocks exactly (every weight the float the file's integers, scales and zero points
make), greedy tokens against transformers on a float checkpoint of the same weights, and the
weights that stay in floats or are refused, with the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from quire_tools.quantize_checkpoint import SCHEMES, write_quantized
from safetensors.torch import load_file

from quire import LLM, SamplingParams
from quire.config import EngineConfig
from quire.engine.loading import load_engine_model
from quire.kernels import cpp_quantized
from quire.model.checkpoint import checkpoint_problem
from quire.model.loader import load_checkpoint
from quire.model.quantized_checkpoint import Integers, to_weight, unpack_words
from quire.model.quantized_linear import QuantizedLinear, QuantizedTensor
from tests.checkpoints import tiny_checkpoint
from tests.libs.engine.conftest import assert_matches_reference
from tests.libs.model.test_gguf_model import reference

# the block format each scheme's linears take
EXPECTED = {
    "awq": "Q4_Z",
    "gptq-4bit": "Q4_0",
    "gptq-4bit-asym": "Q4_Z",
    "gptq-4bit-act-order": "Q4_0",
    "gptq-8bit": "Q8_0",
    "w4a16": "Q4_0",
    "w4a16-asym": "Q4_Z",
    "w4a16-act-order": "Q4_0",
    "w8a16": "Q8_0",
    "w8a8": "Q8_0",
}
PROMPTS = [[1, 417, 2304, 11, 98, 3120], [1, 5, 77, 1024, 3000, 12, 12, 4000, 9]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """quire-tiny in every scheme, beside the float32 checkpoint of the weights it holds."""
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for name in SCHEMES:
        quantized, floats = root / name, root / f"{name}-float"
        write_quantized(tiny_checkpoint(), quantized, name, floats)
        out[name] = (quantized, floats)
    return out


def test_every_scheme_is_listed() -> None:
    assert set(EXPECTED) == set(SCHEMES)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_weights_convert_exactly(checkpoints: dict[str, tuple[Path, Path]], name: str) -> None:
    quantized, floats = checkpoints[name]
    assert checkpoint_problem(quantized) is None
    _, state = load_checkpoint(quantized, torch.device("cpu"), torch.float32)
    expected = load_file(floats / "model.safetensors")
    assert state.keys() == expected.keys()
    formats = set()
    for key, want in expected.items():
        got = state[key]
        if key.endswith("_proj.weight"):
            assert isinstance(got, QuantizedTensor), key
            formats.add(got.quant)
            assert (got.input_order is not None) == ("act-order" in name)
            got = got.dequantize()
        assert isinstance(got, torch.Tensor)
        assert torch.equal(got, want), key  # bit for bit
    assert formats == {EXPECTED[name]}


@pytest.mark.parametrize(
    "name", ["awq", "gptq-4bit", "gptq-4bit-act-order", "gptq-8bit", "w4a16-asym", "w8a8"]
)
def test_greedy_tokens_equal_transformers_on_the_same_weights(
    checkpoints: dict[str, tuple[Path, Path]], name: str
) -> None:
    quantized, floats = checkpoints[name]
    llm = LLM(model=str(quantized), dtype="float32", quantized_activations="float32")
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], params)
    for ids, output in zip(PROMPTS, outputs, strict=True):
        got = list(output.outputs[0].token_ids)
        assert_matches_reference(got, reference(floats, ids, 16), f"{name} {ids[:4]}")


def test_linears_stay_in_blocks_and_act_order_groups_apart(
    checkpoints: dict[str, tuple[Path, Path]],
) -> None:
    loaded = load_engine_model(
        EngineConfig(model=str(checkpoints["gptq-4bit"][0]), dtype="float32")
    )
    qkv = loaded.model.layers[0].attention.qkv
    assert isinstance(qkv, QuantizedLinear)
    # q, k, v rows end to end; interleaved for the int8 kernel where the CPU has AVX512_VNNI
    interleaved = cpp_quantized.supports("Q4_1x16", torch.float32)
    assert [p.quant for p in qkv.parts] == ["Q4_1x16" if interleaved else "Q4_0"]
    # act order: each of q, k, v has its own permutation of the inputs here, so three parts
    loaded = load_engine_model(
        EngineConfig(model=str(checkpoints["gptq-4bit-act-order"][0]), dtype="float32")
    )
    qkv = loaded.model.layers[0].attention.qkv
    assert isinstance(qkv, QuantizedLinear) and len(qkv.parts) == 3


def _integers(in_features: int, s: torch.Tensor, bits: int = 4, zero: int = 8) -> Integers:
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 1 << bits, (3, in_features), generator=g, dtype=torch.int32)
    return Integers(q, torch.full_like(q, zero), s.expand(3, in_features).contiguous(), bits)


def test_what_blocks_cannot_hold_exactly_loads_in_floats() -> None:
    exact = torch.tensor([[0.01]], dtype=torch.float16)
    cases = {
        "no whole number of 32-input blocks": _integers(48, exact),
        "float32 scales that float16 does not hold": _integers(
            64, torch.tensor([[0.1]], dtype=torch.float32)
        ),
        "groups that cut 32-input blocks": _integers(
            64, torch.arange(1, 65, dtype=torch.float16).reshape(1, 64) / 64
        ),
        "q - z outside int8": _integers(64, exact, bits=8, zero=3),
    }
    for reason, unpacked in cases.items():
        weight, why = to_weight(unpacked, torch.float32)
        assert isinstance(weight, torch.Tensor) and why is not None and reason in why
        expected = (unpacked.q - unpacked.z).float() * unpacked.s.float()
        assert torch.equal(weight, expected)
    weight, why = to_weight(_integers(64, torch.tensor([[0.25]])), torch.float32)
    assert why is None and isinstance(weight, QuantizedTensor) and weight.quant == "Q4_0"


def test_a_checkpoint_with_weights_in_floats_says_so(
    checkpoints: dict[str, tuple[Path, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # compressed-tensors with float32 scales that are no float16 values: served, in floats
    source, _ = checkpoints["w8a16"]
    target = tmp_path / "w8a16-float32-scales"
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    tensors = load_file(source / "model.safetensors")
    for key in [k for k in tensors if k.endswith("weight_scale")]:
        tensors[key] = tensors[key].float() * (1 + 2.0**-20)
    from safetensors.torch import save_file

    save_file(tensors, target / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="quire.model.quantized_checkpoint"):
        _, state = load_checkpoint(target, torch.device("cpu"), torch.float32)
    assert "28 of 28 quantized linears load in floats" in caplog.text
    assert "float32 scales that float16 does not hold" in caplog.text
    assert isinstance(state["model.layers.0.mlp.down_proj.weight"], torch.Tensor)


def test_unsupported_quantizations_are_refused_by_name(tmp_path: Path) -> None:
    import json

    config = json.loads((tiny_checkpoint() / "config.json").read_text())
    for quantization, message in (
        ({"quant_method": "bitsandbytes"}, "method 'bitsandbytes' is not supported (awq"),
        ({"quant_method": "awq", "version": "gemv"}, "AWQ version 'gemv' is not supported"),
        ({"quant_method": "gptq", "bits": 3}, "GPTQ with 3 bits is not supported"),
        (
            {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
            "compressed-tensors format nvfp4-pack-quantized is not supported",
        ),
    ):
        (tmp_path / "config.json").write_text(
            json.dumps({**config, "quantization_config": quantization})
        )
        problem = checkpoint_problem(tmp_path, need_weights=False)
        assert problem is not None and message in problem


def test_unpack_words_reads_values_low_bits_first() -> None:
    words = torch.tensor([[0x76543210, 0x87654321 - (1 << 32)]], dtype=torch.int32)
    assert unpack_words(words, 4, dim=1).tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8]
    ]
    assert unpack_words(words, 8, dim=0).tolist() == [
        [0x10, 0x21],
        [0x32, 0x43],
        [0x54, 0x65],
        [0x76, 0x87],
    ]


def test_fp8_weights_load_in_floats(
    checkpoints: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """compressed-tensors' float-quantized (FP8 E4M3 with a scale per row): no block format
    holds it, so each weight is its float8 value times its scale, in the model's dtype."""
    import json

    from safetensors.torch import save_file

    source, floats = checkpoints["w8a16"]
    tensors = load_file(floats / "model.safetensors")
    expected = {}
    for key in [k for k in tensors if k.endswith("_proj.weight")]:
        weight = tensors.pop(key)
        scale = (weight.abs().amax(1, keepdim=True) / 448).to(torch.bfloat16)
        fp8 = (weight / scale.float()).to(torch.float8_e4m3fn)
        tensors[key], tensors[f"{key}_scale"] = fp8, scale
        expected[key] = fp8.float() * scale.float()
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"]["format"] = "float-quantized"
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp_path / "model.safetensors")
    _, state = load_checkpoint(tmp_path, torch.device("cpu"), torch.float32)
    for key, want in expected.items():
        got = state[key]
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), key
    assert not any(k.endswith("_scale") for k in state)
