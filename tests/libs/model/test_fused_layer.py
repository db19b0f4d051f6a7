"""Decoder layers as one C++ call each (quire.model.fused_layer): the same tokens and
logprobs, bit for bit, as the layer-by-layer Python path, on GGUF weights in each 32-weight
format, with int8 and float32 activations, and on float32 and bfloat16 weights in packed
linears, through whole and chunked prefills, steps that mix prefill and decode, and decode; and
the models it leaves alone."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from quire_tools import gguf_write

from quire import LLM, SamplingParams
from quire.model import fused_layer
from tests.checkpoints import tiny_checkpoint
from tests.hardware import needs_packed_linear

FORMATS = ("Q4_1", "Q8_0", "Q4_0")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fused-layer")
    return {
        q: gguf_write.write_gguf(tiny_checkpoint(), root / f"tiny.{q}.gguf", q) for q in FORMATS
    }


def generate(
    path: Path,
    activations: str,
    fused: bool,
    monkeypatch: pytest.MonkeyPatch,
    dtype: str = "float32",
) -> tuple:
    """Greedy tokens with their logprobs and the prompts' logprobs, and the fused calls made."""
    llm = LLM(
        model=str(path),
        dtype=dtype,
        quantized_activations=activations,
        max_num_batched_tokens=24,  # the 40-token prompt is prefilled in chunks beside decodes
    )
    model: Any = llm.engine.model
    assert model.fused_layers is not None, "every layer qualifies"
    if not fused:
        model.fused_layers = None
    calls = []
    original = fused_layer.FusedLayer.__call__

    def counted(self: fused_layer.FusedLayer, *args: Any) -> torch.Tensor:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(fused_layer.FusedLayer, "__call__", counted)
    rng = random.Random(11)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 5, 16, 17, 40)]
    params = SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = []
    for out in outputs:
        choice = out.outputs[0]
        assert choice.logprobs is not None and out.prompt_logprobs is not None
        result.append(
            (
                list(choice.token_ids),
                [{t: lp.logprob for t, lp in step.items()} for step in choice.logprobs],
                [
                    None if s is None else {t: lp.logprob for t, lp in s.items()}
                    for s in out.prompt_logprobs
                ],
            )
        )
    monkeypatch.undo()
    return result, len(calls)


@pytest.mark.parametrize("activations", ["int8", "float32"])
@pytest.mark.parametrize("quant", FORMATS)
def test_fused_layers_give_the_python_path_s_bits(
    ggufs: dict[str, Path], quant: str, activations: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fused, fused_calls = generate(ggufs[quant], activations, True, monkeypatch)
    python, python_calls = generate(ggufs[quant], activations, False, monkeypatch)
    assert fused_calls > 0 and python_calls == 0
    assert fused == python


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(d, marks=needs_packed_linear(getattr(torch, d)))
        for d in ("float32", "bfloat16")
    ],
)
def test_packed_layers_give_the_python_path_s_bits(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", "packed")
    path = tiny_checkpoint()
    fused, fused_calls = generate(path, "float32", True, monkeypatch, dtype)
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", "packed")  # generate undoes the patches
    python, python_calls = generate(path, "float32", False, monkeypatch, dtype)
    assert fused_calls > 0 and python_calls == 0
    assert fused == python


@pytest.mark.parametrize("backend", ["torch", "onednn"])
def test_models_that_do_not_qualify_keep_the_python_path(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", backend)
    float_model: Any = LLM(model=str(tiny_checkpoint()), dtype="float32").engine.model
    assert float_model.fused_layers is None  # float weights off the packed kernel: not fused


def test_the_torch_backend_takes_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fused_layer.runs_fused(torch.device("cpu"))
    monkeypatch.setenv("QUIRE_KERNEL_BACKEND", "torch")
    assert not fused_layer.runs_fused(torch.device("cpu"))
