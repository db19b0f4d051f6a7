"""The expert MLP paths against the per-expert loop (reference_experts): the grouped GEMM
(grouped_experts) and the Triton kernel (triton_experts, in the interpreter on --device cpu),
with routing as Qwen3-MoE (norm_topk_prob on or off) and Mixtral (always renormalized) do it."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import grouped_experts, reference_experts
from quire.kernels.signatures import ClampedSwiGLU
from quire.model.moe import route

HIDDEN, INTER = 64, 48
# (num_experts, top_k): experts 4 and 8, top-k 1 and 2, and every expert at once
ROUTINGS = [(4, 1), (4, 2), (8, 1), (8, 2), (8, 8)]
NUM_TOKENS = [1, 5, 37]


def inputs(
    num_tokens: int, num_experts: int, top_k: int, normalize: bool, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(num_tokens * 100 + num_experts * 10 + top_k)
    x = torch.randn(num_tokens, HIDDEN, generator=gen)
    gate_up_t = torch.randn(num_experts, HIDDEN, 2 * INTER, generator=gen) * HIDDEN**-0.5
    down_t = torch.randn(num_experts, INTER, HIDDEN, generator=gen) * INTER**-0.5
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    experts, weights = route(logits, top_k, normalize)
    tensors = (x.to(dtype), gate_up_t.to(dtype), down_t.to(dtype))
    return tuple(t.to(device) for t in (*tensors, experts, weights))


# bfloat16: the paths round the expert outputs at different points (a few bfloat16 ulps).
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 6e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(("num_experts", "top_k"), ROUTINGS)
@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
def test_grouped_gemm_equals_the_loop(
    num_tokens: int, num_experts: int, top_k: int, normalize: bool, dtype: torch.dtype
) -> None:
    args = inputs(num_tokens, num_experts, top_k, normalize, dtype, "cpu")
    got = grouped_experts.expert_mlp(*args)
    want = reference_experts.expert_mlp(*args)
    assert got.dtype == dtype and got.shape == (num_tokens, HIDDEN)
    # The same GEMMs in the same order: equal, not just close.
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(("num_experts", "top_k"), ROUTINGS)
@pytest.mark.parametrize("num_tokens", [1, 37])
def test_triton_equals_the_loop(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    normalize: bool,
    dtype: torch.dtype,
    device: str,
) -> None:
    from quire.kernels import triton_experts

    args = inputs(num_tokens, num_experts, top_k, normalize, dtype, device)
    got = triton_experts.expert_mlp(*args)
    want = reference_experts.expert_mlp(*args)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize(("num_experts", "top_k"), [(8, 2), (64, 8)])
@pytest.mark.parametrize("num_tokens", [1, 64, 1000])
def test_triton_equals_the_loop_on_layer_shapes(
    num_tokens: int, num_experts: int, top_k: int, device: str
) -> None:
    from quire.kernels import triton_experts

    gen = torch.Generator().manual_seed(num_tokens)
    hidden, inter = 1024, 512
    x = torch.randn(num_tokens, hidden, generator=gen)
    gate_up_t = torch.randn(num_experts, hidden, 2 * inter, generator=gen) * hidden**-0.5
    down_t = torch.randn(num_experts, inter, hidden, generator=gen) * inter**-0.5
    experts, weights = route(torch.randn(num_tokens, num_experts, generator=gen), top_k, True)
    args = [t.to(device) for t in (x, gate_up_t, down_t, experts, weights)]
    want = reference_experts.expert_mlp(*args)
    torch.testing.assert_close(triton_experts.expert_mlp(*args), want, rtol=1e-4, atol=1e-4)
    half = [t.bfloat16() if t.is_floating_point() and t is not args[4] else t for t in args]
    got = triton_experts.expert_mlp(*half).float()
    torch.testing.assert_close(got, want, rtol=6e-2, atol=6e-2)


def test_blocks_hold_one_expert_each_and_every_pair_once() -> None:
    from quire.kernels import triton_experts

    experts = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 3], [1, 2]])
    sorted_pairs, block_experts = triton_experts.align_to_blocks(experts, 5, block_m=2)
    num_pairs = experts.numel()
    blocks = sorted_pairs.view(-1, 2)
    flat = experts.flatten()
    for block, expert in zip(blocks.tolist(), block_experts.tolist(), strict=True):
        pairs = [p for p in block if p < num_pairs]
        if expert < 0:
            assert not pairs
        else:
            assert pairs and all(flat[p] == expert for p in pairs)
    assert sorted(p for p in sorted_pairs.tolist() if p < num_pairs) == list(range(num_pairs))
    # experts 0, 1 and 3 take one block each, expert 2 (five pairs) three, expert 4 none
    assert block_experts.tolist()[:6] == [0, 1, 2, 2, 2, 3]
    assert set(block_experts.tolist()[6:]) <= {-1}


def test_no_tokens_and_misuse() -> None:
    args = inputs(1, 4, 2, True, torch.float32, "cpu")
    empty = [args[0][:0], args[1], args[2], args[3][:0], args[4][:0]]
    assert grouped_experts.expert_mlp(*empty).shape == (0, HIDDEN)
    assert reference_experts.expert_mlp(*empty).shape == (0, HIDDEN)
    with pytest.raises(ValueError, match="share a dtype"):
        grouped_experts.expert_mlp(args[0].bfloat16(), *args[1:])
    with pytest.raises(ValueError, match="weights must be float32"):
        reference_experts.expert_mlp(*args[:4], args[4].double())
    with pytest.raises(ValueError, match="down_t must be"):
        grouped_experts.expert_mlp(args[0], args[1], args[2][:, :5], *args[3:])


def biased_inputs(
    num_tokens: int, num_experts: int, top_k: int, dtype: torch.dtype, device: str
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """inputs() plus gpt-oss's per-expert biases on gate/up and down."""
    args = inputs(num_tokens, num_experts, top_k, True, dtype, device)
    gen = torch.Generator().manual_seed(num_experts * 7 + top_k)
    gate_up_bias = torch.randn(num_experts, 2 * INTER, generator=gen) * 0.5
    down_bias = torch.randn(num_experts, HIDDEN, generator=gen) * 0.5
    return args, gate_up_bias.to(dtype).to(device), down_bias.to(dtype).to(device)


def clamped_loop(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down_bias: torch.Tensor,
    clamp: ClampedSwiGLU,
) -> torch.Tensor:
    """gpt-oss's expert layer as transformers writes it, token by token (float32)."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(experts.shape[1]):
            e = int(experts[t, j])
            gate_up = x[t].float() @ gate_up_t[e].float() + gate_up_bias[e].float()
            gate, up = gate_up.chunk(2)
            gate, up = gate.clamp(max=clamp.limit), up.clamp(-clamp.limit, clamp.limit)
            glu = gate * torch.sigmoid(gate * clamp.alpha)
            expert_out = ((up + 1) * glu) @ down_t[e].float() + down_bias[e].float()
            out[t] += weights[t, j] * expert_out
    return out


@pytest.mark.parametrize("clamp", [None, ClampedSwiGLU(alpha=1.702, limit=0.5)])
@pytest.mark.parametrize(("num_experts", "top_k"), [(4, 2), (8, 1)])
def test_biases_and_the_clamped_swiglu_on_every_path(
    num_experts: int, top_k: int, clamp: ClampedSwiGLU | None, device: str
) -> None:
    from quire.kernels import triton_experts

    args, gate_up_bias, down_bias = biased_inputs(37, num_experts, top_k, torch.float32, "cpu")
    want = reference_experts.expert_mlp(*args, gate_up_bias, down_bias, clamp)
    if clamp is not None:
        # the loop against gpt-oss's own formula, and the clamp reached by these inputs
        oracle = clamped_loop(*args, gate_up_bias, down_bias, clamp)
        torch.testing.assert_close(want, oracle, rtol=1e-5, atol=1e-5)
        assert (
            want - reference_experts.expert_mlp(*args, gate_up_bias, down_bias)
        ).abs().max() > 0.1
    without_bias = reference_experts.expert_mlp(*args, clamp=clamp)
    assert (want - without_bias).abs().max() > 0.1
    # (elementwise ops on rows of other lengths may round in other lanes: close, not equal)
    grouped = grouped_experts.expert_mlp(*args, gate_up_bias, down_bias, clamp)
    torch.testing.assert_close(grouped, want, rtol=1e-6, atol=1e-6)
    on_device = [t.to(device) for t in (*args, gate_up_bias, down_bias)]
    got = triton_experts.expert_mlp(*on_device, clamp).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bad_expert_biases_raise() -> None:
    args, gate_up_bias, down_bias = biased_inputs(3, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="gate_up_bias must be"):
        reference_experts.expert_mlp(*args, gate_up_bias[:, :5], down_bias)
    with pytest.raises(ValueError, match="down_bias must be"):
        grouped_experts.expert_mlp(*args, gate_up_bias, down_bias.bfloat16())
