"""The grouped expert path against the dense oracle and against transformers' own MoE blocks."""

from __future__ import annotations

import pytest
import torch

from quire.model.layers import CheckpointTensors
from quire.model.model_config import MoeConfig
from quire.model.moe import SparseMoE, reference_sparse_moe, route

HIDDEN, INTER = 32, 24


def random_moe(
    config: MoeConfig, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[SparseMoE, dict[str, torch.Tensor]]:
    """A SparseMoE loaded from Qwen3-MoE-named tensors (float32, cast to `dtype` for the
    layer), and the float32 tensors."""
    gen = torch.Generator().manual_seed(seed)
    state = {"mlp.gate.weight": torch.randn(config.num_experts, HIDDEN, generator=gen)}
    for e in range(config.num_experts):
        for name, shape in (("gate", (INTER, HIDDEN)), ("up", (INTER, HIDDEN))):
            state[f"mlp.experts.{e}.{name}_proj.weight"] = torch.randn(shape, generator=gen) * 0.2
        state[f"mlp.experts.{e}.down_proj.weight"] = torch.randn(HIDDEN, INTER, generator=gen) * 0.2
    take = CheckpointTensors({name: t.to(dtype) for name, t in state.items()})
    moe = SparseMoE.load(take, "mlp.", config, ("gate_proj", "up_proj", "down_proj"))
    take.finish()
    return moe, state


def moe_config(num_experts: int, top_k: int, normalize: bool) -> MoeConfig:
    return MoeConfig(num_experts, top_k, INTER, normalize, sparse_layers=(0,))


@pytest.mark.parametrize("num_tokens", [1, 5, 64])
@pytest.mark.parametrize(("num_experts", "top_k"), [(4, 1), (4, 2), (8, 2), (8, 8)])
@pytest.mark.parametrize("normalize", [True, False])
def test_grouped_experts_match_the_dense_reference(
    num_tokens: int, num_experts: int, top_k: int, normalize: bool
) -> None:
    moe, _ = random_moe(moe_config(num_experts, top_k, normalize), seed=num_experts + top_k)
    x = torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(num_tokens))
    torch.testing.assert_close(moe(x), reference_sparse_moe(moe, x), rtol=1e-5, atol=1e-5)


def test_route_takes_the_top_k_probabilities() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 5.0 - 1e-3]])
    experts, weights = route(logits, top_k=2, normalize=False)
    assert experts.tolist() == [[1, 3], [0, 3]]
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(weights, probs.gather(1, experts))
    experts, weights = route(logits, top_k=2, normalize=True)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2))
    assert weights.dtype == torch.float32


def test_unused_experts_and_repeated_tokens() -> None:
    # Every token routed to the same two experts: the others get no rows at all.
    moe, _ = random_moe(moe_config(8, 2, True), seed=3)
    x = torch.randn(1, HIDDEN).repeat(7, 1)
    experts, _ = route(x @ moe.router.t(), moe.top_k, moe.normalize)
    assert len(set(experts.flatten().tolist())) == 2
    out = moe(x)
    torch.testing.assert_close(out, out[:1].expand_as(out))
    torch.testing.assert_close(out, reference_sparse_moe(moe, x))


def transformers_block(
    architecture: str, normalize: bool, state: dict[str, torch.Tensor]
) -> torch.nn.Module:
    """transformers' own MoE block of `architecture` (8 experts, top-2) holding `state`."""
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    block: torch.nn.Module
    if architecture == "mixtral":  # always renormalizes
        mixtral = MixtralConfig(
            hidden_size=HIDDEN, num_experts_per_tok=2, intermediate_size=INTER, num_local_experts=8
        )
        block = MixtralSparseMoeBlock(mixtral)
    else:
        qwen = Qwen3MoeConfig(
            hidden_size=HIDDEN,
            num_experts_per_tok=2,
            moe_intermediate_size=INTER,
            num_experts=8,
            norm_topk_prob=normalize,
        )
        block = Qwen3MoeSparseMoeBlock(qwen)
    with torch.no_grad():
        block.gate.weight.copy_(state["mlp.gate.weight"])
        for e in range(8):
            gate_up = [state[f"mlp.experts.{e}.{n}_proj.weight"] for n in ("gate", "up")]
            block.experts.gate_up_proj[e].copy_(torch.cat(gate_up))
            block.experts.down_proj[e].copy_(state[f"mlp.experts.{e}.down_proj.weight"])
    return block.eval()


@pytest.mark.parametrize(
    ("architecture", "normalize"), [("qwen3_moe", True), ("qwen3_moe", False), ("mixtral", True)]
)
def test_matches_the_transformers_block(architecture: str, normalize: bool) -> None:
    moe, state = random_moe(moe_config(8, 2, normalize), seed=11)
    block = transformers_block(architecture, normalize, state)
    x = torch.randn(2, 9, HIDDEN, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = block(x).reshape(-1, HIDDEN)
    torch.testing.assert_close(moe(x.reshape(-1, HIDDEN)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
def test_bfloat16_errs_no_more_than_transformers(architecture: str) -> None:
    # Routing is a discrete choice: where router logits nearly tie, rounding picks either
    # expert, so bfloat16 cannot match float32 row for row. Over many tokens, Quire's
    # bfloat16 layer (float32 router and sum) must lie no farther from the float32 layer than
    # transformers' bfloat16 block does.
    config = moe_config(8, 2, True)
    exact_moe, state = random_moe(config, seed=11)
    moe, _ = random_moe(config, seed=11, dtype=torch.bfloat16)
    block = transformers_block(architecture, True, state).to(torch.bfloat16)
    x = torch.randn(4096, HIDDEN, generator=torch.Generator().manual_seed(1)).bfloat16()
    exact = exact_moe(x.float())
    with torch.no_grad():
        theirs = (block(x.unsqueeze(0))[0].float() - exact).abs().mean()
    ours = (moe(x).float() - exact).abs().mean()
    assert ours <= 1.1 * theirs, f"mean error {ours:.2e} vs transformers' {theirs:.2e}"
