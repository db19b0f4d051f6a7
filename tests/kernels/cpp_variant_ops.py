"""Seeded calls of every op in torch.ops.quire_cpu and their torch references, for comparing
the builds of the C++ library (one per x86-64 level) with each other.

A process loads one variant only (they register the same op names), so test_cpp_variants.py
runs this module once per variant, which writes the C++ results to a safetensors file:

    QUIRE_CPU_KERNELS_VARIANT=x86-64-v3 python -m tests.kernels.cpp_variant_ops OUT
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quire.kernels import (
    cpp_attention,
    cpp_quantized,
    packed_linear,
    reference,
    reference_fused,
    reference_quantized,
)
from tests.kernels.helpers import (
    PagedBatch,
    cu_lens,
    make_paged_batch,
    random_blocks,
    random_queries,
)

DTYPES = (torch.float32, torch.bfloat16)
# (num_heads, num_kv_heads): SmolLM2-135M's GQA 3 and MHA.
HEAD_SHAPES = ((9, 3), (4, 4))
# 16-slot blocks take the AVX-512 paths of an x86-64-v4 build, 8-slot ones the generic loops.
BLOCK_SIZES = (16, 8)
DECODE_CONTEXT_LENS = (1, 15, 16, 17, 65, 300)
PREFILL_CHUNKS = ((0, 17), (15, 18), (5, 70), (40, 1), (100, 80))  # (cached prefix, chunk)
NORM_EPS = 1e-5
LINEAR_SHAPE = (5, 100, 128)  # rows, out_features (no multiple of 64), in_features


@dataclass(frozen=True)
class OpCase:
    """One seeded call: `cpp` runs it in the loaded C++ library, `reference` in torch."""

    name: str
    op: str  # the torch.ops.quire_cpu op it exercises
    dtype: torch.dtype
    cpp: Callable[[], torch.Tensor]
    reference: Callable[[], torch.Tensor]


def _decode_case(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> OpCase:
    lens = list(DECODE_CONTEXT_LENS)
    batch = make_paged_batch(lens, num_kv_heads, head_dim, block_size, dtype)
    query = random_queries(len(lens), num_heads, head_dim, dtype)
    args = (query, batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens)
    scale = 1 / math.sqrt(head_dim)
    return OpCase(
        f"decode-{num_heads}x{num_kv_heads}-d{head_dim}-b{block_size}-{dtype}",
        "paged_decode_attention",
        dtype,
        lambda: cpp_attention.paged_decode_attention(*args, scale),
        lambda: reference.paged_decode_attention(*args, scale),
    )


def _prefill_case(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> OpCase:
    lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    chunks = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(lens, num_kv_heads, head_dim, block_size, dtype)
    query = random_queries(sum(chunks), num_heads, head_dim, dtype)
    args = (query, batch.key_cache, batch.value_cache, batch.block_tables, cu_lens(chunks))
    rest = (batch.context_lens, 1 / math.sqrt(head_dim))
    return OpCase(
        f"prefill-{num_heads}x{num_kv_heads}-d{head_dim}-b{block_size}-{dtype}",
        "paged_prefill_attention",
        dtype,
        lambda: cpp_attention.paged_prefill_attention(*args, *rest),
        lambda: reference.paged_prefill_attention(*args, *rest),
    )


def _write_kv_cache_case(dtype: torch.dtype) -> OpCase:
    g = torch.Generator().manual_seed(3)
    num_tokens, num_kv_heads, head_dim = 9, 3, 64
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype)
    cache = torch.randn(6, 16, num_kv_heads, head_dim, generator=g).to(dtype)
    slots = torch.randperm(6 * 16, generator=g)[:num_tokens]

    def run(write: Callable[..., None]) -> torch.Tensor:
        key_cache, value_cache = cache.clone(), cache.clone()
        write(key, value, key_cache, value_cache, slots)
        return torch.stack((key_cache, value_cache))

    return OpCase(
        f"write_kv_cache-{dtype}",
        "write_kv_cache_",
        dtype,
        lambda: run(cpp_attention.write_kv_cache),
        lambda: run(reference.write_kv_cache),
    )


def _fused_cases(dtype: torch.dtype) -> list[OpCase]:
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(7, 576, generator=g) * 3).to(dtype)
    residual = torch.randn(7, 576, generator=g).to(dtype)
    weight = torch.rand(576, generator=g).to(dtype)

    def add_norm(add: Callable[..., None]) -> torch.Tensor:
        xi, ri = x.clone(), residual.clone()
        add(xi, ri, weight, NORM_EPS)
        return torch.stack((xi, ri))

    positions = torch.randint(0, 512, (7,), generator=g)
    query = torch.randn(7, 9, 64, generator=g).to(dtype)
    key = torch.randn(7, 3, 64, generator=g).to(dtype)
    angles = torch.arange(512.0)[:, None] * torch.rand(32, generator=g)[None, :]
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # [512, 64] float32

    def rotate(rotate_: Callable[..., None]) -> torch.Tensor:
        qi, ki = query.clone(), key.clone()
        rotate_(positions, qi, ki, cos, sin)
        return torch.cat((qi.flatten(), ki.flatten()))

    ops = torch.ops.quire_cpu
    return [
        OpCase(
            f"rms_norm-{dtype}",
            "rms_norm",
            dtype,
            lambda: ops.rms_norm(x, weight, NORM_EPS),
            lambda: reference_fused.rms_norm(x, weight, NORM_EPS),
        ),
        OpCase(
            f"add_rms_norm-{dtype}",
            "add_rms_norm_",
            dtype,
            lambda: add_norm(ops.add_rms_norm_),
            lambda: add_norm(reference_fused.add_rms_norm_),
        ),
        OpCase(
            f"rotary_embedding-{dtype}",
            "rotary_embedding_",
            dtype,
            lambda: rotate(ops.rotary_embedding_),
            lambda: rotate(reference_fused.rotary_embedding_),
        ),
    ]


def _linear_case(dtype: torch.dtype) -> OpCase:
    g = torch.Generator().manual_seed(5)
    rows, out_features, in_features = LINEAR_SHAPE
    x = torch.randn(rows, in_features, generator=g).to(dtype)
    weight = torch.randn(out_features, in_features, generator=g).to(dtype)
    bias = torch.randn(out_features, generator=g).to(dtype)
    return OpCase(
        f"packed_linear-{dtype}",
        "packed_linear",
        dtype,
        lambda: packed_linear.packed_linear(
            x, packed_linear.pack_weight(weight), bias, out_features
        ),
        lambda: F.linear(x.float(), weight.float(), bias.float()).to(dtype),
    )


def _quantized_cases() -> list[OpCase]:
    """One linear over each block format's random blocks (float32 activations; bfloat16 ones
    are converted to float32 before the same kernel), and one per format int8 activations
    multiply."""
    g = torch.Generator().manual_seed(6)
    runs = [(name, False) for name in reference_quantized.FORMATS]
    runs += [(name, True) for name in reference_quantized.INT8_FORMATS]
    cases = []
    for name, int8 in runs:
        x = torch.randn(3 if int8 else 5, 256, generator=g)
        blocks = random_blocks(name, 67, 256, seed=8 if int8 else 7)
        oracle = reference_quantized.quantized_linear_int8 if int8 else _float_oracle
        cases.append(
            OpCase(
                f"quantized_linear-{name}" + ("-int8" if int8 else ""),
                "quantized_linear",
                torch.float32,
                lambda x=x, blocks=blocks, name=name, int8=int8: cpp_quantized.quantized_linear(
                    x, blocks, name, int8_activations=int8
                ),
                lambda x=x, blocks=blocks, name=name, oracle=oracle: oracle(
                    x, blocks, name
                ).float(),
            )
        )
    return cases


def _float_oracle(x: torch.Tensor, blocks: torch.Tensor, name: str) -> torch.Tensor:
    return reference_quantized.quantized_linear(x, blocks, name)


# A small Llama layer for decoder_layer: hidden 256, 4 query heads over 2 KV heads of 64.
LAYER_HEADS, LAYER_KV_HEADS, LAYER_HEAD_DIM, LAYER_HIDDEN = 4, 2, 64, 256
LAYER_MATMULS = ("qkv", "o", "gate_up", "down")  # in decoder_layer's argument order
LAYER_STEPS = {  # step -> (cached prefix, new tokens) per sequence
    "decode": ((0, 1), (15, 1), (16, 1), (40, 1)),
    "prefill": ((0, 17), (15, 18), (40, 1)),
}


@dataclass(frozen=True)
class _LayerStep:
    """One step of a small quantized layer: its inputs, and each way of running it. float32
    activations only: int8 ones round each activation to a step of amax / 127, so a float32
    rounding apart upstream can move a value by a step (test_fused_layer.py holds int8 layers
    to the layer-by-layer path's bits)."""

    quant: str
    blocks: dict[str, torch.Tensor]
    norms: tuple[torch.Tensor, torch.Tensor]
    cos: torch.Tensor
    sin: torch.Tensor
    x: torch.Tensor
    residual: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    batch: PagedBatch
    cu_query_lens: torch.Tensor | None  # None: a decode step

    def _run(self, layer: Callable[..., torch.Tensor]) -> torch.Tensor:
        """`layer(x, residual, key_cache, value_cache)` on copies; its output, x and residual
        after, and the cache rows it wrote."""
        x, residual = self.x.clone(), self.residual.clone()
        caches = (self.batch.key_cache.clone(), self.batch.value_cache.clone())
        out = layer(x, residual, *caches)
        written = [c.flatten(0, 1)[self.slots] for c in caches]
        return torch.cat([t.flatten() for t in (out, x, residual, *written)])

    def cpp(self) -> torch.Tensor:
        ggml = reference_quantized.block_format(self.quant).ggml_type
        matmuls = [a for m in LAYER_MATMULS for a in (self.blocks[m], ggml)]
        b = self.batch
        return self._run(
            lambda x, residual, kc, vc: torch.ops.quire_cpu.decoder_layer(
                x,
                residual,
                True,
                *self.norms,
                NORM_EPS,
                *matmuls,
                False,
                LAYER_HIDDEN,  # the intermediate size: gate_up is [2 * hidden, hidden]
                LAYER_HEADS,
                LAYER_KV_HEADS,
                LAYER_HEAD_DIM,
                self.positions,
                self.cos,
                self.sin,
                kc,
                vc,
                self.slots,
                b.block_tables,
                b.context_lens,
                self.cu_query_lens,
                1 / math.sqrt(LAYER_HEAD_DIM),
                None,
            )
        )

    def reference(self) -> torch.Tensor:
        return self._run(self._reference_layer)

    def _reference_layer(
        self, x: torch.Tensor, residual: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor
    ) -> torch.Tensor:
        d, b = LAYER_HEAD_DIM, self.batch
        q_size, kv_size = LAYER_HEADS * d, LAYER_KV_HEADS * d

        def linear(a: torch.Tensor, matmul: str) -> torch.Tensor:
            return _float_oracle(a, self.blocks[matmul], self.quant).float()

        reference_fused.add_rms_norm_(x, residual, self.norms[0], NORM_EPS)
        q, k, v = linear(x, "qkv").split([q_size, kv_size, kv_size], dim=-1)
        q, k = q.reshape(-1, LAYER_HEADS, d), k.reshape(-1, LAYER_KV_HEADS, d)
        reference_fused.rotary_embedding_(self.positions, q, k, self.cos, self.sin)
        reference.write_kv_cache(k, v.reshape(-1, LAYER_KV_HEADS, d), kc, vc, self.slots)
        scale, tables, lens = 1 / math.sqrt(d), b.block_tables, b.context_lens
        cu = self.cu_query_lens
        attn = (
            reference.paged_decode_attention(q, kc, vc, tables, lens, scale)
            if cu is None
            else reference.paged_prefill_attention(q, kc, vc, tables, cu, lens, scale)
        )
        h = linear(attn.reshape(-1, q_size), "o")
        reference_fused.add_rms_norm_(h, residual, self.norms[1], NORM_EPS)
        gate, up = linear(h, "gate_up").chunk(2, dim=-1)
        return linear(F.silu(gate) * up, "down")


def _decoder_layer_cases() -> list[OpCase]:
    """decoder_layer on a decode step and a prefill step, Q4_1 and Q8_0 weights; its
    reference is the layer composed of the torch references."""
    g = torch.Generator().manual_seed(9)
    hidden, d = LAYER_HIDDEN, LAYER_HEAD_DIM
    shapes = {
        "qkv": ((LAYER_HEADS + 2 * LAYER_KV_HEADS) * d, hidden),
        "o": (hidden, LAYER_HEADS * d),
        "gate_up": (2 * hidden, hidden),
        "down": (hidden, hidden),
    }
    norms = (torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5)
    angles = torch.arange(512.0)[:, None] * torch.rand(d // 2, generator=g)[None, :]
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    cases = []
    for quant in ("Q4_1", "Q8_0"):
        blocks = {
            m: random_blocks(quant, *shapes[m], seed=10 + i) for i, m in enumerate(LAYER_MATMULS)
        }
        for step, seqs in LAYER_STEPS.items():
            batch = make_paged_batch([p + n for p, n in seqs], LAYER_KV_HEADS, d, 16)
            tokens = [(i, pos) for i, (p, n) in enumerate(seqs) for pos in range(p, p + n)]
            tables = batch.block_tables
            layer = _LayerStep(
                quant=quant,
                blocks=blocks,
                norms=norms,
                cos=cos,
                sin=sin,
                x=torch.randn(len(tokens), hidden, generator=g),
                residual=torch.randn(len(tokens), hidden, generator=g),
                positions=torch.tensor([pos for _, pos in tokens]),
                slots=torch.tensor(
                    [int(tables[i, pos // 16]) * 16 + pos % 16 for i, pos in tokens]
                ),
                batch=batch,
                cu_query_lens=None if step == "decode" else cu_lens([n for _, n in seqs]),
            )
            name = f"decoder_layer-{quant}-{step}"
            cases.append(OpCase(name, "decoder_layer", torch.float32, layer.cpp, layer.reference))
    return cases


def op_cases() -> list[OpCase]:
    """Every case, in a fixed order, on inputs that depend only on fixed seeds."""
    cases = []
    for dtype in DTYPES:
        for num_heads, num_kv_heads in HEAD_SHAPES:
            for head_dim in (64, 128):
                for block_size in BLOCK_SIZES:
                    shape = (num_heads, num_kv_heads, head_dim, block_size)
                    cases += [_decode_case(dtype, *shape), _prefill_case(dtype, *shape)]
        cases += [_write_kv_cache_case(dtype), *_fused_cases(dtype), _linear_case(dtype)]
    return cases + _quantized_cases() + _decoder_layer_cases()


def registered_ops() -> list[str]:
    """The ops the loaded library registers under torch.ops.quire_cpu."""
    prefix = "quire_cpu::"
    names = torch._C._dispatch_get_all_op_names()
    return sorted(name.removeprefix(prefix) for name in names if name.startswith(prefix))


def main(out_path: str) -> None:
    from safetensors.torch import save_file

    reason = cpp_attention.unavailable_reason()
    if reason is not None:
        sys.exit(f"the C++ CPU kernels did not load: {reason}")
    variant = cpp_attention.loaded_variant()
    assert variant is not None, "a loaded library has a variant"
    outputs = {}
    for case in op_cases():
        # packed linears: float32 and bfloat16 with AVX2, AVX-512 (packed_linear_supported says)
        if case.op == "packed_linear" and not packed_linear.cpu_supports(case.dtype):
            continue
        # quantized ones in builds with AVX2 or AVX-512 (quantized_linear_supported, per format)
        if case.op in ("quantized_linear", "decoder_layer") and not cpp_quantized.supports(
            case.name.split("-")[1], case.dtype
        ):
            continue
        outputs[case.name] = case.cpp().contiguous()
    supported = [
        str(dtype) for dtype in DTYPES if torch.ops.quire_cpu.packed_linear_supported(dtype)
    ]
    metadata = {
        "variant": variant,
        "ops": ",".join(registered_ops()),
        "packed_linear_dtypes": ",".join(supported),
    }
    save_file(outputs, out_path, metadata=metadata)


if __name__ == "__main__":
    main(sys.argv[1])
