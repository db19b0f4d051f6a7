"""llama.cpp's block formats (GGUF's Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), Quire's own Q4_Z, and
the plain torch oracle of a linear layer over them: dequantize the whole weight, then multiply.

A quantized weight `[out_features, in_features]` is kept as its file holds it: a uint8 tensor
`[out_features, in_features / block_size * block_bytes]`, each row its blocks end to end, every
block one run of `block_size` consecutive inputs. `dequantize` computes exactly what the `gguf`
package's numpy reference (`gguf.quants.dequantize`) computes, operation for operation in
float32, so the two agree bit for bit; the C++ kernel (cpp_quantized.py) is tested against it.

Layouts (ggml's `block_*` structs; d, dmin and m are float16):
  Q8_0  34 B / 32:  d, qs int8[32]                        w = d * q
  Q4_0  18 B / 32:  d, qs[16]                             w = d * (q - 8)
  Q4_1  20 B / 32:  d, m, qs[16]                          w = d * q + m
        (qs[j] holds input j in its low nibble and input j + 16 in its high one)
  Q4_K 144 B / 256: d, dmin, scales[12], qs[128]          w = d * sc * q - dmin * mn
        (8 sub-blocks of 32, 6-bit sc and mn; each 32 bytes of qs hold 64 inputs: low nibbles
        then high nibbles)
  Q5_K 176 B / 256: d, dmin, scales[12], qh[32], qs[128]  as Q4_K, q + 16 * (bit i of qh)
  Q6_K 210 B / 256: ql[128], qh[64], scales int8[16], d   w = d * sc * (q - 32), 16 sub-blocks
  Q4_Z  20 B / 32:  d, z uint8, 0, qs[16] (as Q4_1)        w = d * (q - z) (exact)
        (no GGUF holds it: AWQ's and asymmetric GPTQ's 4-bit weights with their integer zero
        points, quire.model.quantized_checkpoint; its type id is Quire's, from 1000)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class BlockFormat:
    """One block format: its name, its type id (ggml's, or Quire's own from 1000), inputs and
    bytes per block."""

    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value, or Quire's own (from 1000)
    block_size: int  # inputs per block
    block_bytes: int


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("Q4_0", 2, 32, 18),
        BlockFormat("Q4_1", 3, 32, 20),
        BlockFormat("Q8_0", 8, 32, 34),
        BlockFormat("Q4_K", 12, 256, 144),
        BlockFormat("Q5_K", 13, 256, 176),
        BlockFormat("Q6_K", 14, 256, 210),
        BlockFormat("Q4_Z", 1000, 32, 20),
    )
}

# Row-interleaved layouts of the 32-weight formats, for CPU kernels that multiply 16 rows of W
# at once with one vector instruction (interleave(); the C++ kernel's int8 path on a CPU with
# AVX512_VNNI). No file holds them: a model's weights are interleaved when it loads. Rows go in
# groups of 16 (out_features a multiple of 16), and a group's bytes are its 16 rows' blocks
# block by block: for block b, 16 float16 scales d, then
#   Q4_1x16 (320 B / 16 x 32):  16 float16 mins m, then the 16 rows' nibbles in 4 chunks of
#            64 B: chunk t holds, row after row, bytes 4t..4t+3 of each row's qs (inputs
#            4t..4t+3 in the low nibbles, 16+4t..16+4t+3 in the high ones). A Q4_0 block is
#            written with m = -8 d (w = d * q + m, the same float32 values as d * (q - 8)).
#   Q8_0x16 (544 B / 16 x 32):  the 16 rows' integers plus 128 (unsigned bytes: q ^ 0x80) in
#            8 chunks of 64 B: chunk t holds bytes 4t..4t+3 of each row. The kernel multiplies
#            them by x's signed int8 and takes 128 sum(q_x) off each block's integer dot.
# Their `block_bytes` are per row (the group's divided by 16), so a [out_features, row_bytes]
# tensor holds them as it holds the row-major formats; its rows are not the weight's rows.
INTERLEAVED_ROWS = 16
INTERLEAVED: dict[str, BlockFormat] = {
    f.name: f for f in (BlockFormat("Q8_0x16", 1001, 32, 34), BlockFormat("Q4_1x16", 1002, 32, 20))
}
INTERLEAVED_BASE = {"Q8_0x16": "Q8_0", "Q4_1x16": "Q4_1"}  # what deinterleave() gives back
INTERLEAVED_OF = {"Q8_0": "Q8_0x16", "Q4_0": "Q4_1x16", "Q4_1": "Q4_1x16"}  # interleave()'s

FORMATS_BY_TYPE = {f.ggml_type: f for f in (*FORMATS.values(), *INTERLEAVED.values())}


def block_format(name: str) -> BlockFormat:
    """The format called `name` (row-major or interleaved); ValueError naming the ones
    supported."""
    fmt = FORMATS.get(name) or INTERLEAVED.get(name)
    if fmt is None:
        names = ", ".join([*FORMATS, *INTERLEAVED])
        raise ValueError(f"block format {name!r} is not supported ({names})")
    return fmt


def interleave(blocks: torch.Tensor, name: str) -> tuple[torch.Tensor, str]:
    """`blocks` (`[out_features, row_bytes]` of Q8_0, Q4_0 or Q4_1) in their interleaved
    format (INTERLEAVED), and its name; ValueError where out_features is no multiple of 16 or
    a Q4_0 scale times -8 overflows float16."""
    if name not in INTERLEAVED_OF:
        raise ValueError(f"{name} has no interleaved layout ({', '.join(INTERLEAVED_OF)} do)")
    rows = blocks.shape[0]
    if rows % INTERLEAVED_ROWS:
        raise ValueError(f"interleaving takes rows in 16s, not {rows}")
    fmt = block_format(name)
    nb = blocks.shape[1] // fmt.block_bytes
    # [groups, 16 rows, blocks, bytes] -> [groups, blocks, 16 rows, bytes]
    grouped = blocks.reshape(-1, INTERLEAVED_ROWS, nb, fmt.block_bytes).transpose(1, 2)
    d = grouped[..., 0:2]
    if name == "Q8_0":
        q = grouped[..., 2:] ^ 0x80
        head = d
    else:
        q = grouped[..., 4:] if name == "Q4_1" else grouped[..., 2:]
        if name == "Q4_1":
            m = grouped[..., 2:4]
        else:
            m16 = d.contiguous().view(torch.float16) * -8
            if not torch.isfinite(m16).all():
                raise ValueError("a Q4_0 scale times -8 overflows float16")
            m = m16.view(torch.uint8)
        head = torch.cat([d, m], dim=-1)
    # head: [.., 16 rows, 2 or 4] -> runs of 16 values; q: [.., 16 rows, chunks, 4] -> chunk-major
    g, b = grouped.shape[0], nb
    runs = _head_runs(name)
    head = head.reshape(g, b, INTERLEAVED_ROWS, runs, 2).permute(0, 1, 3, 2, 4)
    body = q.reshape(g, b, INTERLEAVED_ROWS, -1, 4).permute(0, 1, 3, 2, 4)
    out = torch.cat([head.reshape(g, b, -1), body.reshape(g, b, -1)], dim=-1)
    new = INTERLEAVED_OF[name]
    return out.reshape(rows, -1).contiguous(), new


def deinterleave(blocks: torch.Tensor, name: str) -> tuple[torch.Tensor, str]:
    """An interleaved tensor's blocks row-major again (`[out_features, row_bytes]`), and their
    format (a Q4_0 weight comes back as Q4_1 with m = -8 d: the same values)."""
    base = INTERLEAVED_BASE[name]
    rows, fmt = blocks.shape[0], block_format(name)
    nb = blocks.shape[1] // fmt.block_bytes
    g = rows // INTERLEAVED_ROWS
    flat = blocks.reshape(g, nb, INTERLEAVED_ROWS * fmt.block_bytes)
    runs = _head_runs(base)
    head = flat[..., : 2 * runs * INTERLEAVED_ROWS].reshape(g, nb, runs, INTERLEAVED_ROWS, 2)
    head = head.permute(0, 1, 3, 2, 4).reshape(g, nb, INTERLEAVED_ROWS, 2 * runs)
    body = flat[..., 2 * runs * INTERLEAVED_ROWS :].reshape(g, nb, -1, INTERLEAVED_ROWS, 4)
    body = body.permute(0, 1, 3, 2, 4).reshape(g, nb, INTERLEAVED_ROWS, -1)
    if base == "Q8_0":
        body = body ^ 0x80  # back to signed integers' bytes
    row = torch.cat([head, body], dim=-1)  # [groups, blocks, 16 rows, base bytes]
    return row.transpose(1, 2).reshape(rows, -1).contiguous(), base


def _head_runs(base: str) -> int:
    """Runs of 16 float16 values that open an interleaved block: d (Q8_0), d then m (Q4_0,
    Q4_1)."""
    return 1 if base == "Q8_0" else 2


@functools.cache
def _row_gather(name: str, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where row 0 of a 16-row group of `name` keeps each byte of its row-major row (offsets
    in the group), how far row r's byte lies from row 0's per r, and what each byte is XORed
    with back to row-major: a row's row-major bytes are group[at + r * step] ^ flip."""
    fmt, base = block_format(name), INTERLEAVED_BASE[name]
    group_block = INTERLEAVED_ROWS * fmt.block_bytes
    runs = _head_runs(base)
    head = [o for k in range(runs) for o in (32 * k, 32 * k + 1)]  # d (and m): 2 bytes a row
    width = 32 if base == "Q8_0" else 16  # bytes of integers a row
    start = 32 * runs
    body = [start + 64 * (j // 4) + j % 4 for j in range(width)]  # 4 bytes a row a chunk
    at = [b * group_block + o for b in range(num_blocks) for o in head + body]
    step = [2] * len(head) + [4] * width
    flip = [0] * len(head) + [0x80 if base == "Q8_0" else 0] * width
    return (
        torch.tensor(at),
        torch.tensor(step * num_blocks),
        torch.tensor(flip * num_blocks, dtype=torch.uint8),
    )


def select_rows(blocks: torch.Tensor, name: str, ids: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Rows `ids` of a weight in blocks, row-major, and their format (an interleaved weight's
    rows gathered byte by byte from their groups)."""
    if name not in INTERLEAVED:
        return blocks.index_select(0, ids), name
    group_bytes = INTERLEAVED_ROWS * blocks.shape[1]
    at, step, flip = _row_gather(name, blocks.shape[1] // block_format(name).block_bytes)
    lane = (ids % INTERLEAVED_ROWS).unsqueeze(1)
    index = (ids // INTERLEAVED_ROWS * group_bytes).unsqueeze(1) + at + lane * step
    rows = blocks.reshape(-1).take(index.to(blocks.device)) ^ flip.to(blocks.device)
    return rows, INTERLEAVED_BASE[name]


def row_bytes(name: str, in_features: int) -> int:
    """Bytes of one row of `in_features` inputs; ValueError if it is no whole number of blocks."""
    fmt = block_format(name)
    if in_features % fmt.block_size:
        raise ValueError(
            f"{name} rows hold multiples of {fmt.block_size} inputs, not {in_features}"
        )
    return in_features // fmt.block_size * fmt.block_bytes


def _f16(column: torch.Tensor) -> torch.Tensor:
    # [n, 2] uint8 -> [n, 1] float32
    return column.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, run: int) -> torch.Tensor:
    # qs: [n, k * run] uint8 -> [n, k * 2 * run]: each run of bytes' low nibbles, then its high
    n = qs.shape[0]
    qs = qs.reshape(n, -1, 1, run)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, -1)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 mins, float32 [n, 8]
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _dequantize_blocks(blocks: torch.Tensor, name: str) -> torch.Tensor:
    # blocks: [n, block_bytes] uint8 -> [n, block_size] float32
    n = blocks.shape[0]
    if name == "Q8_0":
        return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks[:, 0:2])
    if name == "Q4_0":
        q = _nibbles(blocks[:, 2:], 16).to(torch.int8) - 8
        return _f16(blocks[:, 0:2]) * q.float()
    if name == "Q4_1":
        q = _nibbles(blocks[:, 4:], 16).float()
        return _f16(blocks[:, 0:2]) * q + _f16(blocks[:, 2:4])
    if name == "Q4_Z":  # (q - z) * d: exact in float32
        q = _nibbles(blocks[:, 4:], 16).float() - blocks[:, 2:3].float()
        return _f16(blocks[:, 0:2]) * q
    if name in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales(blocks[:, 4:16])
        d = (_f16(blocks[:, 0:2]) * sc).reshape(n, 8, 1)
        dm = (_f16(blocks[:, 2:4]) * mn).reshape(n, 8, 1)
        q = _nibbles(blocks[:, -128:], 32).reshape(n, 8, 32)
        if name == "Q5_K":
            qh = blocks[:, 16:48].reshape(n, 1, 32)
            shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
            q = q | (((qh >> shifts) & 1) << 4)
        return (d * q.float() - dm).reshape(n, 256)
    if name == "Q6_K":
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
        d = (_f16(blocks[:, 208:210]) * scales).reshape(n, 16, 1)
        ql = _nibbles(blocks[:, 0:128], 64).reshape(n, 8, 32)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
        qh = ((qh >> shifts) & 3).reshape(n, 8, 32)
        q = (ql | (qh << 4)).to(torch.int8) - 32
        return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)
    raise ValueError(f"block format {name!r} is not supported ({', '.join(FORMATS)})")


def dequantize(blocks: torch.Tensor, name: str) -> torch.Tensor:
    """The float32 weight `[rows, in_features]` of `blocks` (`[rows, row_bytes]` uint8)."""
    fmt = block_format(name)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] % fmt.block_bytes:
        raise ValueError(
            f"{name} blocks must be a [rows, k * {fmt.block_bytes}] uint8 tensor, got "
            f"{tuple(blocks.shape)} {blocks.dtype}"
        )
    if name in INTERLEAVED:
        return dequantize(*deinterleave(blocks, name))
    rows = blocks.shape[0]
    flat = blocks.reshape(-1, fmt.block_bytes)
    return _dequantize_blocks(flat, name).reshape(rows, -1)


def quantized_linear(
    x: torch.Tensor,  # [num_tokens, in_features]
    blocks: torch.Tensor,  # [out_features, row_bytes] uint8
    name: str,
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [num_tokens, out_features], x's dtype
    """x W^T (+ bias) with W dequantized to float32 and the product in float32."""
    out = F.linear(x.float(), dequantize(blocks, name), None if bias is None else bias.float())
    return out.to(x.dtype)


INT8_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q4_Z")  # the formats int8 activations multiply


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[num_tokens, in_features]` in runs of 32 inputs as int8 activations: q = round(x *
    (127 / amax)) (half to even; integers in [-127, 127], as float32) `[num_tokens, k, 32]` and
    d = amax / 127 `[num_tokens, k]`, each a float32 operation, so that x ~ d * q."""
    runs = x.float().reshape(x.shape[0], -1, 32)
    amax = runs.abs().amax(dim=-1)
    # a true division (a Python number over a tensor multiplies by the tensor's reciprocal)
    inv = torch.where(amax > 0, torch.full_like(amax, 127) / amax, torch.zeros_like(amax))
    return torch.round(runs * inv.unsqueeze(-1)), amax / 127


def _integer_blocks(blocks: torch.Tensor, name: str) -> tuple[torch.Tensor, ...]:
    # [n, row_bytes] uint8 -> the integers q [n, k, 32], d [n, k] and m [n, k] of w = d * q + m
    n = blocks.shape[0]
    flat = blocks.reshape(-1, block_format(name).block_bytes)
    d = _f16(flat[:, 0:2]).reshape(n, -1)
    if name == "Q8_0":
        q = flat[:, 2:].contiguous().view(torch.int8).float()
        return q.reshape(n, -1, 32), d, torch.zeros_like(d)
    offset = 2 if name == "Q4_0" else 4
    q = _nibbles(flat[:, offset:], 16).float().reshape(n, -1, 32)
    if name == "Q4_0":
        m = -8 * d
    elif name == "Q4_Z":
        m = -d * flat[:, 2].float().reshape(n, -1)
    else:
        m = _f16(flat[:, 2:4]).reshape(n, -1)
    return q, d, m


def quantized_linear_int8(
    x: torch.Tensor,  # [num_tokens, in_features]
    blocks: torch.Tensor,  # [out_features, row_bytes] uint8, a format of INT8_FORMATS
    name: str,
) -> torch.Tensor:  # [num_tokens, out_features] float64
    """x W^T with x as int8 activations (quantize_activations): per 32-block d_w d_x sum(q_w q_x)
    + m_w d_x sum(q_x), the integer sums exact and the rest in float64 (the C++ kernel's
    int8_activations computes the same in float32)."""
    if name in INTERLEAVED:
        return quantized_linear_int8(x, *deinterleave(blocks, name))
    if name not in INT8_FORMATS:
        raise ValueError(f"int8 activations multiply {', '.join(INT8_FORMATS)}, not {name}")
    qx, dx = quantize_activations(x)
    qw, dw, mw = _integer_blocks(blocks, name)
    dots = torch.einsum("rbk,nbk->rnb", qx.double(), qw.double())  # exact integers
    sx = dx.double() * qx.double().sum(-1)  # [num_tokens, k]
    scaled = dots * (dw.double().unsqueeze(0) * dx.double().unsqueeze(1))
    return scaled.sum(-1) + sx @ mw.double().t()


PACKED_FORMATS = ("Q8_0", "Q4_0", "Q4_Z")  # the formats pack_blocks writes


def pack_blocks(
    name: str,
    q: torch.Tensor,  # [rows, in_features] integers: Q8_0 -128..127, Q4_0 and Q4_Z 0..15
    d: torch.Tensor,  # [rows, in_features / 32] float16 scales
    z: torch.Tensor | None = None,  # Q4_Z: [rows, in_features / 32] zero points 0..255
) -> torch.Tensor:  # [rows, row_bytes] uint8
    """Blocks of `name` holding exactly w = d * q (Q8_0), d * (q - 8) (Q4_0) or d * (q - z)
    (Q4_Z), one scale (and zero point) per 32 inputs; ValueError for integers out of range."""
    if name not in PACKED_FORMATS:
        raise ValueError(f"pack_blocks writes {', '.join(PACKED_FORMATS)}, not {name}")
    rows, in_features = q.shape
    low, high = (-128, 127) if name == "Q8_0" else (0, 15)
    if in_features % 32 or d.shape != (rows, in_features // 32) or d.dtype != torch.float16:
        raise ValueError(
            f"{name}: d must be float16 [{rows}, {in_features} / 32], got "
            f"{tuple(d.shape)} {d.dtype}"
        )
    if q.numel() and (int(q.min()) < low or int(q.max()) > high):
        raise ValueError(f"{name} integers lie in [{low}, {high}]")
    runs = q.reshape(rows, -1, 32)
    scales = d.contiguous().reshape(rows, -1, 1).view(torch.uint8).reshape(rows, -1, 2)
    if name == "Q8_0":
        body = runs.to(torch.int8).view(torch.uint8)
    else:
        nibbles = runs.to(torch.uint8)
        body = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    if name == "Q4_Z":
        if z is None or z.shape != d.shape or int(z.min()) < 0 or int(z.max()) > 255:
            raise ValueError("Q4_Z needs zero points z in [0, 255] (a byte), shaped as d")
        zero = torch.stack([z.to(torch.uint8), torch.zeros_like(z, dtype=torch.uint8)], -1)
        scales = torch.cat([scales, zero], dim=-1)
    return torch.cat([scales, body], dim=-1).reshape(rows, -1).contiguous()


def quantized_embedding(
    ids: torch.Tensor,  # [num_tokens] int64
    blocks: torch.Tensor,  # [vocab, row_bytes] uint8
    name: str,
    dtype: torch.dtype,
) -> torch.Tensor:  # [num_tokens, hidden]
    """The rows `ids` of the table, dequantized (only those rows) and cast to `dtype`."""
    return dequantize(*select_rows(blocks, name, ids)).to(dtype)
