"""The C++ fused RMSNorm and rotary kernels against their torch references (reference_fused.py).

Rotary embeddings must agree bit for bit in every dtype (the kernel rounds each product and
sum as torch does); RMSNorm may differ only by the order of its float32 sum of squares.
"""

from __future__ import annotations

import pytest
import torch

from quire.kernels import cpp_attention, reference_fused
from quire.model.model_config import RopeConfig
from quire.model.rope import RotaryEmbedding

# The library is built by tests/kernels/conftest.py: if it does not load, these fail.
pytestmark = pytest.mark.usefixtures("cpp_kernels")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# RMSNorm: float32 sums in another order; 16-bit outputs may land one rounding step apart.
NORM_TOLERANCES = {
    torch.float32: {"atol": 1e-6, "rtol": 1e-6},
    torch.bfloat16: {"atol": 1e-2, "rtol": 8e-3},
    torch.float16: {"atol": 1e-3, "rtol": 1e-3},
}


def _inputs(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(num_tokens, hidden, generator=g) * scale).to(dtype)
        for scale in (3.0, 1.0, 0.5)
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_tokens", "hidden"), [(1, 64), (7, 576), (300, 576), (3, 80)])
def test_rms_norm_matches_reference(dtype: torch.dtype, num_tokens: int, hidden: int) -> None:
    x, _, w = _inputs(num_tokens, hidden, dtype, seed=0)
    weight = w[0].contiguous()
    got = torch.ops.quire_cpu.rms_norm(x, weight, 1e-5)
    want = reference_fused.rms_norm(x, weight, 1e-5)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **NORM_TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 64, 2048])
def test_add_rms_norm_updates_both_in_place(dtype: torch.dtype, num_tokens: int) -> None:
    x, residual, w = _inputs(num_tokens, 576, dtype, seed=1)
    weight = w[0].contiguous()
    want_x, want_residual = x.clone(), residual.clone()
    reference_fused.add_rms_norm_(want_x, want_residual, weight, 1e-6)
    torch.ops.quire_cpu.add_rms_norm_(x, residual, weight, 1e-6)
    # the residual add is one rounding in the dtype, exactly torch's
    assert torch.equal(residual, want_residual)
    torch.testing.assert_close(x, want_x, **NORM_TOLERANCES[dtype])


def test_bfloat16_rounds_ties_to_even_and_keeps_inf_and_nan_as_torch_does() -> None:
    # The kernels convert bfloat16 by its bits; these rows make the residual add land exactly
    # halfway between two bfloat16 values (rounding down to even, then up to even) and carry
    # an infinity and a NaN through the norm.
    hidden = 64
    residual = torch.ones(4, hidden, dtype=torch.bfloat16)
    residual[1] = 1.0078125  # one bfloat16 step above 1: odd last mantissa bit
    residual[2, 5] = float("inf")
    residual[3, 9] = float("nan")
    x = torch.full((4, hidden), 2.0**-8, dtype=torch.bfloat16)  # half a step at 1.0
    weight = torch.linspace(0.5, 1.5, hidden).to(torch.bfloat16)
    want_x, want_residual = x.clone(), residual.clone()
    reference_fused.add_rms_norm_(want_x, want_residual, weight, 1e-5)
    assert want_residual[0, 0].item() == 1.0 and want_residual[1, 0].item() == 1.015625
    torch.ops.quire_cpu.add_rms_norm_(x, residual, weight, 1e-5)
    torch.testing.assert_close(residual, want_residual, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x, want_x, rtol=0, atol=0, equal_nan=True)
    # an infinite sum of squares: inf * 0 is NaN where the inf was, 0 elsewhere; NaN spreads
    assert x[2].isnan().nonzero().flatten().tolist() == [5] and (x[2, :5] == 0).all()
    assert x[3].isnan().all()


def test_norms_read_strided_rows() -> None:
    base = torch.randn(5, 2 * 64)
    x = base[:, :64]  # row stride 128
    weight = torch.rand(64)
    torch.testing.assert_close(
        torch.ops.quire_cpu.rms_norm(x, weight, 1e-5), reference_fused.rms_norm(x, weight, 1e-5)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 128)])
def test_rotary_is_bit_identical_on_views_of_fused_qkv(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    rope = RotaryEmbedding(RopeConfig(theta=100000.0), head_dim, 4096, torch.device("cpu"))
    g = torch.Generator().manual_seed(2)
    num_tokens = 37
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g)
    qkv = qkv.to(dtype)
    positions = torch.randint(0, 4096, (num_tokens,), generator=g)

    def views(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        q, k, _ = t.split(sizes, dim=-1)
        return q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim)

    want = qkv.clone()
    reference_fused.rotary_embedding_(positions, *views(want), rope.cos, rope.sin)
    got = qkv.clone()
    torch.ops.quire_cpu.rotary_embedding_(positions, *views(got), rope.cos, rope.sin)
    assert torch.equal(got, want)  # values included: rotary leaves them alone
    assert not torch.equal(got, qkv)


def test_results_do_not_depend_on_the_thread_count() -> None:
    x, residual, w = _inputs(4096, 576, torch.float32, seed=3)
    outs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            xi, ri = x.clone(), residual.clone()
            torch.ops.quire_cpu.add_rms_norm_(xi, ri, w[0].contiguous(), 1e-5)
            outs.append(xi)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


def test_rotary_position_out_of_range_raises() -> None:
    rope = RotaryEmbedding(RopeConfig(), 64, 16, torch.device("cpu"))
    q, k = torch.randn(2, 2, 64), torch.randn(2, 1, 64)
    with pytest.raises(ValueError, match="positions must lie in"):
        torch.ops.quire_cpu.rotary_embedding_(torch.tensor([3, 16]), q, k, rope.cos, rope.sin)


def test_norm_misuse_raises() -> None:
    with pytest.raises(ValueError, match="weight must be"):
        torch.ops.quire_cpu.rms_norm(torch.randn(2, 8), torch.randn(4), 1e-5)
    with pytest.raises(ValueError, match="share a dtype"):
        torch.ops.quire_cpu.rms_norm(torch.randn(2, 8), torch.randn(8).half(), 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_write_matches_reference_from_views_of_fused_qkv(dtype: torch.dtype) -> None:
    from quire.kernels import reference

    g = torch.Generator().manual_seed(4)
    num_tokens, num_kv_heads, head_dim = 21, 3, 64
    qkv = torch.randn(num_tokens, (9 + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    _, k, v = qkv.split([9 * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    k, v = k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)
    shape = (8, 16, num_kv_heads, head_dim)
    caches = [torch.full(shape, float("nan"), dtype=dtype) for _ in range(4)]
    slots = torch.randperm(8 * 16, generator=g)[:num_tokens]
    reference.write_kv_cache(k, v, caches[0], caches[1], slots)
    cpp_attention.write_kv_cache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0].nan_to_num(7.0), caches[2].nan_to_num(7.0))
    assert torch.equal(caches[1].nan_to_num(7.0), caches[3].nan_to_num(7.0))


def test_cache_write_refuses_a_slot_out_of_range_before_writing() -> None:
    cache = torch.zeros(2, 4, 1, 8)
    values = torch.ones(2, 1, 8)
    with pytest.raises(ValueError, match=r"slots outside \[0, 8\)"):
        cpp_attention.write_kv_cache(values, values, cache, cache.clone(), torch.tensor([1, 8]))
    assert not cache.any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rotary_rotates_only_the_leading_dims(dtype: torch.dtype) -> None:
    # Phi-4-mini's shape: rotary over the first 3/4 of each head, through views of the heads.
    rope = RotaryEmbedding(RopeConfig(partial_rotary_factor=0.75), 128, 512, torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(9, 4, 128, generator=g).to(dtype)
    k = torch.randn(9, 2, 128, generator=g).to(dtype)
    positions = torch.randint(0, 512, (9,), generator=g)
    want_q, want_k = q.clone(), k.clone()
    reference_fused.rotary_embedding_(
        positions, want_q[..., :96], want_k[..., :96], rope.cos, rope.sin
    )
    got_q, got_k = q.clone(), k.clone()
    torch.ops.quire_cpu.rotary_embedding_(
        positions, got_q[..., :96], got_k[..., :96], rope.cos, rope.sin
    )
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(got_q[..., 96:], q[..., 96:]) and not torch.equal(got_q, q)
