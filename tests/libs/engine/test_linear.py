"""Linear layers on reordered oneDNN weights against F.linear, and the backend choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quire.model.linear import Linear, use_onednn

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(
    not use_onednn(torch.bfloat16, CPU, "auto"), reason="this torch has no oneDNN linear"
)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 64, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_bfloat16_linear_equals_f_linear_bit_for_bit(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen).to(torch.bfloat16) if with_bias else None
    x = torch.randn(rows, 80, generator=gen).to(torch.bfloat16)
    packed = Linear(weight, bias, onednn=True)
    assert (packed.out_features, packed.in_features, packed.num_params) == (96, 80, 96 * 80)
    assert torch.equal(packed(x), F.linear(x, weight, bias))
    # A strided view (the attention output's reshape is one) gives the same rows.
    wide = torch.randn(rows, 160, generator=gen).to(torch.bfloat16)
    assert torch.equal(packed(wide[:, :80]), F.linear(wide[:, :80], weight, bias))


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not use_onednn(torch.float32, CPU, "auto")  # float32 stays on F.linear
    assert not use_onednn(torch.bfloat16, CPU, "torch")
    assert not use_onednn(torch.bfloat16, torch.device("cuda"), "onednn")
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", "fastest")
    with pytest.raises(ValueError, match="QUIRE_LINEAR_BACKEND"):
        use_onednn(torch.bfloat16, CPU)


@needs_onednn
def test_engine_tokens_do_not_depend_on_the_linear_backend(
    tiny_model: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quire import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 40)]
    outputs = {}
    for backend in ("onednn", "torch"):
        monkeypatch.setenv("QUIRE_LINEAR_BACKEND", backend)
        llm = LLM(model=str(tiny_model), dtype="bfloat16", num_kv_blocks=32)
        assert llm.engine.model.onednn is (backend == "onednn")
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, False)]
    assert outputs["onednn"] == outputs["torch"]


@pytest.mark.parametrize("rows", [1, 4, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_torch_linear_on_transposed_weights_matches_f_linear(
    rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    layer = Linear(weight, bias, onednn=False)
    assert layer.weight_t is not None and layer.weight_t.shape == (80, 96)
    assert layer.weight_t.is_contiguous()
    wide = torch.randn(rows, 160, generator=gen)
    for x in (wide[:, :80].contiguous(), wide[:, :80]):  # and a strided view
        # another GEMM kernel, so the last bits may differ from F.linear's
        torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
