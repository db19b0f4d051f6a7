"""Attention sinks (gpt-oss) in every paged-attention backend: per query head, one more logit in
the softmax's denominator with no value. The torch reference against textbook dense attention,
the C++ and Triton kernels against both, with and without windows, and the bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from tests.kernels.helpers import dense_batch_attention, make_paged_batch, random_queries
from tests.kernels.test_windowed_attention import _backend, _tolerance

DECODE_CONTEXT_LENS = [1, 5, 16, 17, 33, 130]
# (cached prefix, chunk)
PREFILL_CHUNKS = [(0, 1), (0, 17), (16, 17), (15, 18), (40, 1), (0, 70)]
BACKENDS = ["torch", "cpp", "triton"]


def _sinks(num_heads: int, spread: float, seed: int = 3) -> torch.Tensor:
    """Random sinks around 0, `spread` wide: at 30, some heads' sinks outweigh every key."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_heads, generator=generator) * spread


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spread", [1.0, 30.0])
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize(("head_dim", "num_heads", "num_kv_heads"), [(64, 4, 2), (128, 8, 1)])
def test_decode_with_sinks_matches_dense_attention(
    backend: str,
    spread: float,
    window: int | None,
    head_dim: int,
    num_heads: int,
    num_kv_heads: int,
) -> None:
    lens = DECODE_CONTEXT_LENS
    batch = make_paged_batch(lens, num_kv_heads, head_dim)
    query = random_queries(len(lens), num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    sinks = _sinks(num_heads, spread)

    out = batch.decode(_backend(backend), query, scale, window, None, sinks)

    expected = dense_batch_attention(batch, query, [1] * len(lens), scale, window, None, sinks)
    torch.testing.assert_close(out.double(), expected, **_tolerance(backend))
    # the sinks take weight: leaving them out would be caught
    without = dense_batch_attention(batch, query, [1] * len(lens), scale, window)
    assert (without - expected).abs().max() > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("soft_cap", [None, 5.0])
@pytest.mark.parametrize("window", [None, 5, 33])
def test_prefill_with_sinks_matches_dense_attention(
    backend: str, soft_cap: float | None, window: int | None
) -> None:
    head_dim, num_heads, num_kv_heads = 64, 4, 2
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, num_kv_heads, head_dim)
    query = random_queries(sum(query_lens), num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    sinks = _sinks(num_heads, 2.0)

    out = batch.prefill(_backend(backend), query, query_lens, scale, window, soft_cap, sinks)

    expected = dense_batch_attention(batch, query, query_lens, scale, window, soft_cap, sinks)
    torch.testing.assert_close(out.double(), expected, **_tolerance(backend))


@pytest.mark.parametrize("head_dim", [48, 128])
def test_cpp_sinks_in_other_head_dims_and_bfloat16(head_dim: int) -> None:
    """The C++ kernels' generic (non-16-multiple-specialized) and bfloat16 paths."""
    from quire.kernels import reference

    lens = [3, 40, 130]
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        batch = make_paged_batch(lens, 2, head_dim, dtype=dtype)
        query = random_queries(len(lens), 8, head_dim, dtype=dtype)
        sinks = _sinks(8, 2.0)
        for window in (None, 24):
            args = (query, 1 / math.sqrt(head_dim), window, None, sinks)
            torch.testing.assert_close(
                batch.decode(_backend("cpp"), *args).float(),
                batch.decode(reference, *args).float(),
                atol=tolerance,
                rtol=tolerance,
            )
            chunk = random_queries(sum(lens), 8, head_dim, dtype=dtype)
            prefill_args = (chunk, lens, 1 / math.sqrt(head_dim), window, None, sinks)
            torch.testing.assert_close(
                batch.prefill(_backend("cpp"), *prefill_args).float(),
                batch.prefill(reference, *prefill_args).float(),
                atol=tolerance,
                rtol=tolerance,
            )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        (torch.zeros(3), r"sinks must be \[4\] float32"),
        (torch.zeros(4, dtype=torch.float64), r"sinks must be \[4\] float32"),
        (torch.zeros(2, 2), r"sinks must be \[4\] float32"),
    ],
)
def test_bad_sinks_raise(backend: str, sinks: torch.Tensor, message: str) -> None:
    batch = make_paged_batch([4], 2, 64)
    with pytest.raises(ValueError, match=message):
        batch.decode(_backend(backend), random_queries(1, 4, 64), 0.1, None, None, sinks)
