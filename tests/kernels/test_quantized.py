"""Linear layers over GGUF's quantized blocks: the torch oracle against the gguf package's
dequantization (bit for bit) and the C++ kernel against the oracle, per format."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from quire.kernels import cpp_build, cpp_quantized, quantized, reference_quantized
from tests.kernels.helpers import random_blocks

FORMATS = list(reference_quantized.FORMATS)
GGUF_FORMATS = [name for name in FORMATS if name != "Q4_Z"]  # Q4_Z is Quire's own
# The kernel is compiled for x86-64-v3 (AVX2, FMA, F16C) and x86-64-v4 (AVX-512).
needs_vectors = pytest.mark.skipif(
    not set(cpp_build.required_cpu_flags("x86-64-v3")) <= set(cpp_build.cpu_flags()),
    reason="needs x86-64-v3 (AVX2, FMA, F16C): Quire's quantized linear",
)


@pytest.mark.parametrize("name", GGUF_FORMATS)
def test_dequantize_is_the_gguf_reference_bit_for_bit(name: str) -> None:
    blocks = random_blocks(name, 7, 512)
    expected = gguf_dequantize(blocks.numpy(), gguf.GGMLQuantizationType[name])
    got = reference_quantized.dequantize(blocks, name).numpy()
    assert got.shape == expected.shape == (7, 512)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_round_trips_the_gguf_quantizer(name: str) -> None:
    weight = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType[name])
    got = reference_quantized.dequantize(torch.from_numpy(blocks), name)
    bound = {"Q8_0": 0.02, "Q4_0": 0.35, "Q4_1": 0.25}[name]
    assert (got - torch.from_numpy(weight)).abs().max().item() < bound


def test_q4_z_is_its_integers_times_the_scale_exactly() -> None:
    """Q4_Z (no GGUF holds it): each weight is d * (q - z), computed here from the bytes
    one weight at a time, independently of the oracle's vector code."""
    blocks = random_blocks("Q4_Z", 3, 64, seed=5)
    got = reference_quantized.dequantize(blocks, "Q4_Z")
    for r in range(3):
        for b in range(2):
            block = blocks[r, 20 * b : 20 * (b + 1)].tolist()
            d = float(np.frombuffer(bytes(block[0:2]), dtype=np.float16)[0])
            for j in range(32):
                q = block[4 + j % 16] >> (4 * (j // 16)) & 0xF
                assert got[r, 32 * b + j].item() == d * (q - block[2])


@pytest.mark.parametrize("name", reference_quantized.PACKED_FORMATS)
def test_pack_blocks_holds_exactly_its_integers(name: str) -> None:
    g = torch.Generator().manual_seed(3)
    low, high = (-128, 128) if name == "Q8_0" else (0, 16)
    q = torch.randint(low, high, (5, 96), generator=g)
    d = (torch.rand(5, 3, generator=g) * 0.02 + 1e-4).half()
    z = torch.randint(0, 16, (5, 3), generator=g) if name == "Q4_Z" else None
    blocks = reference_quantized.pack_blocks(name, q, d, z)
    offset = {"Q8_0": 0, "Q4_0": 8}.get(name)
    zero = z.repeat_interleave(32, 1) if z is not None else offset
    expected = (q - zero).double() * d.double().repeat_interleave(32, 1)
    assert torch.equal(reference_quantized.dequantize(blocks, name).double(), expected)
    with pytest.raises(ValueError, match="integers lie in"):
        reference_quantized.pack_blocks(name, q + 300, d, z)
    with pytest.raises(ValueError, match="float16"):
        reference_quantized.pack_blocks(name, q, d.float(), z)


def test_misshapen_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="Q4_1 rows hold multiples of 32"):
        reference_quantized.row_bytes("Q4_1", 48)
    with pytest.raises(ValueError, match="not supported"):
        reference_quantized.block_format("IQ2_XS")
    with pytest.raises(ValueError, match="uint8"):
        reference_quantized.dequantize(torch.zeros(2, 34, dtype=torch.int8), "Q8_0")


@needs_vectors
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 17, 64, 70])  # direct 1-2 (AVX2) / 1-4, GEMM 48+
@pytest.mark.parametrize("out_features", [1, 6, 67])
def test_cpp_matches_the_oracle(name: str, rows: int, out_features: int) -> None:
    in_features = 512  # two K-quant super-blocks, sixteen 32-blocks
    blocks = random_blocks(name, out_features, in_features, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(out_features))
    expected = reference_quantized.quantized_linear(x.double(), blocks, name)
    got = cpp_quantized.quantized_linear(x, blocks, name)
    # float32 sums in another order: within float32's summation error over K terms
    magnitude = x.double().abs() @ reference_quantized.dequantize(blocks, name).double().abs().t()
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert ((got.double() - expected).abs() <= magnitude * in_features * 2.0**-23).all()


def test_int8_activations_round_to_within_half_a_step() -> None:
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(2)) * 5
    x[1, 32:64] = 0  # an all-zero run: d = 0, q = 0
    q, d = reference_quantized.quantize_activations(x)
    assert q.shape == (3, 3, 32) and d.shape == (3, 3)
    assert q.abs().max() == 127 and torch.equal(q, q.round())
    assert (q[1, 1] == 0).all() and d[1, 1] == 0
    error = (q * d.unsqueeze(-1)).reshape(3, 96) - x
    assert (error.abs() <= d.repeat_interleave(32, dim=1) / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize("name", reference_quantized.INT8_FORMATS)
def test_int8_oracle_is_near_the_float_oracle(name: str) -> None:
    blocks = random_blocks(name, 9, 256, seed=3)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    exact = reference_quantized.quantized_linear(x.double(), blocks, name)
    int8 = reference_quantized.quantized_linear_int8(x, blocks, name)
    # each x off by at most d / 2 = amax / 254: well under 1% of |x| |W| in all
    magnitude = x.double().abs() @ reference_quantized.dequantize(blocks, name).double().abs().t()
    assert ((int8 - exact).abs() <= magnitude / 100).all()
    assert not torch.allclose(int8, exact, rtol=1e-9, atol=0)


def test_int8_oracle_refuses_formats_it_does_not_multiply() -> None:
    with pytest.raises(
        ValueError, match="int8 activations multiply Q8_0, Q4_0, Q4_1, Q4_Z, not Q4_K"
    ):
        reference_quantized.quantized_linear_int8(
            torch.randn(1, 256), random_blocks("Q4_K", 2, 256), "Q4_K"
        )


@needs_vectors
@pytest.mark.parametrize("name", reference_quantized.INT8_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 17, 47, 48, 95, 96])  # int8 below 96
@pytest.mark.parametrize("out_features", [1, 6, 67])
def test_cpp_int8_activations_match_their_oracle(name: str, rows: int, out_features: int) -> None:
    in_features = 512
    blocks = random_blocks(name, out_features, in_features, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(out_features))
    got = cpp_quantized.quantized_linear(x, blocks, name, int8_activations=True).double()
    float_path = reference_quantized.quantized_linear(x.double(), blocks, name)
    int8_path = reference_quantized.quantized_linear_int8(x, blocks, name)
    int8_rows = rows < cpp_quantized.int8_row_limit()
    assert cpp_quantized.int8_row_limit() == 96  # the rows above straddle it
    expected = int8_path if int8_rows else float_path
    magnitude = x.double().abs() @ reference_quantized.dequantize(blocks, name).double().abs().t()
    # float32 scales, products and sums in another order than the float64 oracle's
    assert ((got - expected).abs() <= magnitude * in_features * 2.0**-22).all()
    # and the path taken is the one asked for (the two oracles are far apart)
    nearer_int8 = (got - int8_path).abs().sum() < (got - float_path).abs().sum()
    assert nearer_int8 == int8_rows


@needs_vectors
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpp_returns_the_activations_dtype(dtype: torch.dtype) -> None:
    blocks = random_blocks("Q4_1", 8, 64)
    x = torch.randn(3, 64).to(dtype)
    got = quantized.quantized_linear(x, blocks, "Q4_1")
    expected = reference_quantized.quantized_linear(x, blocks, "Q4_1")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


@needs_vectors
def test_cpp_refuses_what_it_cannot_multiply() -> None:
    blocks = random_blocks("Q8_0", 4, 64)
    with pytest.raises(ValueError, match="blocks must be a contiguous uint8"):
        cpp_quantized.quantized_linear(torch.randn(2, 96), blocks, "Q8_0")
    with pytest.raises(ValueError, match="no multiple of the block size 256"):
        cpp_quantized.quantized_linear(torch.randn(2, 64), blocks, "Q4_K")


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_interleaved_blocks_hold_the_same_weights(name: str) -> None:
    blocks = random_blocks(name, 48, 256, seed=7)
    packed, packed_name = reference_quantized.interleave(blocks, name)
    assert packed_name == reference_quantized.INTERLEAVED_OF[name]
    fmt = reference_quantized.block_format(packed_name)
    assert packed.shape == (48, 256 // 32 * fmt.block_bytes)
    assert torch.equal(
        reference_quantized.dequantize(packed, packed_name),
        reference_quantized.dequantize(blocks, name),
    )
    back, back_name = reference_quantized.deinterleave(packed, packed_name)
    if name != "Q4_0":  # Q4_0 comes back as Q4_1 (m = -8 d): compared by value above
        assert back_name == name and torch.equal(back, blocks)
    ids = torch.tensor([47, 0, 16, 16, 31, 5])
    rows, rows_name = reference_quantized.select_rows(packed, packed_name, ids)
    assert torch.equal(
        reference_quantized.dequantize(rows, rows_name),
        reference_quantized.dequantize(blocks, name)[ids],
    )


def test_interleaved_layout_byte_by_byte() -> None:
    """Q4_1x16's and Q8_0x16's bytes read one weight at a time (independently of the oracle's
    reshapes): block b of a 16-row group, row r, input k."""
    q41 = random_blocks("Q4_1", 16, 64, seed=8)
    q80 = random_blocks("Q8_0", 16, 64, seed=9)
    p41, _ = reference_quantized.interleave(q41, "Q4_1")
    p80, _ = reference_quantized.interleave(q80, "Q8_0")
    w41 = reference_quantized.dequantize(q41, "Q4_1")
    w80 = reference_quantized.dequantize(q80, "Q8_0")
    g41, g80 = p41.reshape(-1).tolist(), p80.reshape(-1).tolist()

    def f16(data: list[int], at: int) -> float:
        return float(np.frombuffer(bytes(data[at : at + 2]), dtype=np.float16)[0])

    assert len(g80) == 16 * 2 * 34  # 544 bytes a block of 16 rows: Q8_0's own size
    for b in range(2):
        for r in range(16):
            base41, base80 = 320 * b, 544 * b
            d41, m41 = f16(g41, base41 + 2 * r), f16(g41, base41 + 32 + 2 * r)
            d80 = f16(g80, base80 + 2 * r)
            for k in range(32):
                byte = g41[base41 + 64 + 64 * (k % 16 // 4) + 4 * r + k % 4]
                q = byte >> 4 if k >= 16 else byte & 0x0F
                assert w41[r, 32 * b + k].item() == np.float32(d41) * q + np.float32(m41)
                q8 = g80[base80 + 32 + 64 * (k // 4) + 4 * r + k % 4] - 128  # stored q + 128
                assert w80[r, 32 * b + k].item() == np.float32(d80) * np.float32(q8)


def test_interleaving_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="rows in 16s, not 24"):
        reference_quantized.interleave(random_blocks("Q4_1", 24, 64), "Q4_1")
    with pytest.raises(ValueError, match="Q4_K has no interleaved layout"):
        reference_quantized.interleave(random_blocks("Q4_K", 16, 256), "Q4_K")


needs_vnni = pytest.mark.skipif(
    not cpp_quantized.supports("Q4_1x16", torch.float32),
    reason="needs AVX512_VNNI: the interleaved layouts' kernel",
)


@needs_vnni
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 17, 95, 96, 130])  # int8 below 96
@pytest.mark.parametrize("out_features", [16, 80])
def test_cpp_interleaved_matches_its_oracles(name: str, rows: int, out_features: int) -> None:
    in_features = 512
    blocks = random_blocks(name, out_features, in_features, seed=rows)
    packed, packed_name = reference_quantized.interleave(blocks, name)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(out_features))
    magnitude = x.double().abs() @ reference_quantized.dequantize(blocks, name).double().abs().t()
    float_path = reference_quantized.quantized_linear(x.double(), blocks, name)
    int8_path = reference_quantized.quantized_linear_int8(x, blocks, name)
    got = cpp_quantized.quantized_linear(x, packed, packed_name, int8_activations=True).double()
    expected = int8_path if rows < cpp_quantized.int8_row_limit() else float_path
    assert ((got - expected).abs() <= magnitude * in_features * 2.0**-22).all()
    # float32 activations: the dequantized panels times x, at any number of rows
    got = cpp_quantized.quantized_linear(x, packed, packed_name).double()
    assert ((got - float_path).abs() <= magnitude * in_features * 2.0**-23).all()


@needs_vnni
def test_cpp_interleaved_refuses_rows_not_in_16s() -> None:
    packed, packed_name = reference_quantized.interleave(random_blocks("Q8_0", 32, 64), "Q8_0")
    with pytest.raises(ValueError, match="interleaved blocks hold rows in 16s, not 8"):
        cpp_quantized.quantized_linear(torch.randn(2, 64), packed[:8].contiguous(), packed_name)
