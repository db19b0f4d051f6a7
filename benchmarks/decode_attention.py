"""Paged decode attention: time and achieved memory bandwidth, Quire's kernels beside the torch
reference.

    python -m benchmarks.decode_attention [--device cuda|cpu] [--dtype DTYPE] [--output PATH]

Backends: the kernel quire.kernels.backends picks for the device, "triton" (CUDA) or "cpp" (the
C++ CPU kernels, once built by `make kernels-cpu`), and "torch" (the reference, gathering copies
of K/V) read the paged cache;
"sdpa_dense" is the baseline: torch's scaled_dot_product_attention over the same keys and
values laid out contiguously, i.e. what paging has to compete with.

Bytes counted per call: every context token's key and value once (the query heads of a GQA
group share them), plus the queries read and the outputs written. Block tables are shuffled,
as they are after the allocator has churned. Small batches are not served from cache, as they
are not in a model's forward pass: on CUDA the L2 is flushed before each timed call; on the
CPU the timed calls cycle through copies of the caches that together exceed the L3. The torch reference also checks its index
values, which costs it a device sync per call on CUDA; that is part of what it costs to use.
The ceiling each point is held against ("of copy") is the device's copy bandwidth measured in
the same run, bytes read plus bytes written (copy_gb_per_s). Writes
bench/results/decode_attention.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from quire.kernels import backends as kernel_backends
from quire.kernels import reference

RESULTS_PATH = Path("bench/results/decode_attention.json")
# On the CPU the inputs are copied until the copies hold this many bytes of K/V, more than a
# server CPU's L3, and the timed calls cycle through them.
COLD_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class BenchConfig:
    """Model shape and sweep for one device."""

    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads
    head_dim: int  # channels per head
    block_size: int  # token slots per cache block
    dtype: str  # cache and query dtype, a torch attribute name
    batch_sizes: tuple[int, ...]  # sequences decoding together
    context_lens: tuple[int, ...]  # tokens in cache per sequence


# A Llama-3-8B-like layer on the GPU; a SmolLM2-135M layer on the CPU, to finish in ~1 min.
CUDA_CONFIG = BenchConfig(32, 8, 128, 16, "bfloat16", (1, 8, 32, 128), (512, 2048, 8192))
CPU_CONFIG = BenchConfig(9, 3, 64, 16, "float32", (1, 8, 64), (300, 1500))


@dataclass(frozen=True)
class Result:
    """One timed (backend, batch size, context length) point."""

    backend: str  # "triton", "cpp", "torch" or "sdpa_dense"
    batch_size: int
    context_len: int
    time_ms: float  # median per call
    gb_per_s: float  # bytes moved / time
    share_of_copy: float  # gb_per_s / the device's measured copy bandwidth (copy_gb_per_s)
    max_abs_diff: float | None  # against the torch reference; None for the reference itself


def _make_inputs(
    config: BenchConfig, batch_size: int, context_len: int, device: str
) -> tuple[torch.Tensor, ...]:
    dtype = getattr(torch, config.dtype)
    blocks_per_seq = -(-context_len // config.block_size)
    num_blocks = batch_size * blocks_per_seq
    cache_shape = (num_blocks, config.block_size, config.num_kv_heads, config.head_dim)
    key_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    value_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    # block_tables: [batch_size, blocks_per_seq], a random permutation of all blocks
    block_tables = torch.randperm(num_blocks, device=device).view(batch_size, blocks_per_seq)
    context_lens = torch.full((batch_size,), context_len, dtype=torch.int32, device=device)
    query = torch.randn(batch_size, config.num_heads, config.head_dim, dtype=dtype, device=device)
    return query, key_cache, value_cache, block_tables.to(torch.int32), context_lens


def _bytes_moved(config: BenchConfig, batch_size: int, context_len: int) -> int:
    element_size = getattr(torch, config.dtype).itemsize
    kv_bytes = 2 * batch_size * context_len * config.num_kv_heads * config.head_dim
    query_and_out_bytes = 2 * batch_size * config.num_heads * config.head_dim
    return (kv_bytes + query_and_out_bytes) * element_size


def _time_cuda_ms(
    fns: list[Callable[[], object]], num_iters: int = 20, flush_l2: bool = True
) -> float:
    fn = fns[0]  # the L2 is flushed instead
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda") if flush_l2 else None
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(num_iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(num_iters)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(
        start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)
    )


def copy_gb_per_s(device: str) -> float:
    """The device's memory bandwidth as a plain copy moves it: bytes read plus bytes written per
    second (median), buffers far larger than its caches: 1 GiB each way on CUDA, 256 MiB on the CPU.
    """
    num_bytes = (1 << 30) if device == "cuda" else (256 << 20)
    source = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = lambda: target.copy_(source)
    elapsed_ms = _time_cuda_ms([copy], flush_l2=False) if device == "cuda" else _time_cpu_ms([copy])
    return 2 * num_bytes / (elapsed_ms * 1e-3) / 1e9


def _time_cpu_ms(fns: list[Callable[[], object]], budget_s: float = 1.0) -> float:
    # In a forward pass a layer's K/V were last read a whole step ago, with every other
    # layer's weights and caches read since: they come from memory, not from cache. So the
    # timed calls cycle through copies of the inputs, together larger than the L3.
    for fn in fns:
        fn()
    times_ms: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times_ms) < 3 * len(fns) or time.perf_counter() < deadline:
        fn = fns[len(times_ms) % len(fns)]
        start = time.perf_counter()
        fn()
        times_ms.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times_ms)


def _num_cpu_copies(config: BenchConfig, batch_size: int, context_len: int) -> int:
    # Copies of one point's caches that together exceed COLD_BYTES (at least 2).
    kv_bytes = _bytes_moved(config, batch_size, context_len)
    return max(2, -(-COLD_BYTES // kv_bytes))


def _backends(
    inputs: tuple[torch.Tensor, ...], scale: float
) -> dict[str, Callable[[], torch.Tensor]]:
    # Each backend as a no-argument call on this point's inputs, returning [batch, heads, dim].
    query, key_cache, value_cache, block_tables, context_lens = inputs
    backends: dict[str, Callable[[], torch.Tensor]] = {}
    fast = kernel_backends.family_backend(kernel_backends.PAGED_ATTENTION, query.device)
    if fast != "torch":
        kernel = kernel_backends.paged_attention(query.device)
        backends[fast] = lambda: kernel.paged_decode_attention(*inputs, scale)
    backends["torch"] = lambda: reference.paged_decode_attention(*inputs, scale)

    # Baseline: the same attention over contiguous K/V, [batch, kv_heads, context, dim], which
    # is what paging has to compete with. All sequences share one length, so no mask.
    block_ids = block_tables.long()
    dense_keys = key_cache[block_ids].flatten(1, 2).transpose(1, 2).contiguous()
    dense_values = value_cache[block_ids].flatten(1, 2).transpose(1, 2).contiguous()
    backends["sdpa_dense"] = lambda: F.scaled_dot_product_attention(
        query[:, :, None], dense_keys, dense_values, scale=scale, enable_gqa=True
    )[:, :, 0]
    return backends


def run(config: BenchConfig, device: str, copy_bandwidth: float | None = None) -> list[Result]:
    """Time every (batch size, context length) point of the sweep; `copy_bandwidth` (GB/s,
    default: measured by copy_gb_per_s) is what each point's bandwidth is a share of."""
    scale = config.head_dim**-0.5
    time_ms = _time_cuda_ms if device == "cuda" else _time_cpu_ms
    copy_bandwidth = copy_bandwidth or copy_gb_per_s(device)

    results = []
    for context_len in config.context_lens:
        for batch_size in config.batch_sizes:
            inputs = _make_inputs(config, batch_size, context_len, device)
            expected = reference.paged_decode_attention(*inputs, scale).float()
            num_bytes = _bytes_moved(config, batch_size, context_len)
            copies = [inputs]
            if device == "cpu":
                query, key_cache, value_cache, *tables = inputs
                for _ in range(_num_cpu_copies(config, batch_size, context_len) - 1):
                    copies.append((query, key_cache.clone(), value_cache.clone(), *tables))
            backends = [_backends(copy, scale) for copy in copies]
            for backend, fn in backends[0].items():
                diff = (fn().float() - expected).abs().max().item()
                elapsed_ms = time_ms([each[backend] for each in backends])
                gb_per_s = num_bytes / (elapsed_ms * 1e-3) / 1e9
                results.append(
                    Result(
                        backend=backend,
                        batch_size=batch_size,
                        context_len=context_len,
                        time_ms=elapsed_ms,
                        gb_per_s=gb_per_s,
                        share_of_copy=gb_per_s / copy_bandwidth,
                        max_abs_diff=None if backend == "torch" else diff,
                    )
                )
            del inputs, expected, copies, backends
    return results


def _print_table(results: list[Result]) -> None:
    points = sorted({(r.batch_size, r.context_len) for r in results}, key=lambda p: (p[1], p[0]))
    backends = list(dict.fromkeys(r.backend for r in results))
    by_key = {(r.backend, r.batch_size, r.context_len): r for r in results}
    widths = {backend: max(len(backend) + 5, 10) for backend in backends}
    fast_backend = next((b for b in ("triton", "cpp") if b in backends), None)
    header = f"{'batch':>6} {'context':>8}"
    for backend in backends:
        width = widths[backend]
        header += f" {backend + ' ms':>{width}} {backend + ' GB/s':>{width}}"
    if fast_backend is not None:
        header += f" {'vs torch':>9} {'of copy':>8} {'max diff':>9}"
    print(header)
    for batch_size, context_len in points:
        line = f"{batch_size:>6} {context_len:>8}"
        for backend in backends:
            result = by_key[(backend, batch_size, context_len)]
            width = widths[backend]
            line += f" {result.time_ms:>{width}.3f} {result.gb_per_s:>{width}.1f}"
        if fast_backend is not None:
            fast = by_key[(fast_backend, batch_size, context_len)]
            slow = by_key[("torch", batch_size, context_len)]
            line += f" {slow.time_ms / fast.time_ms:>8.1f}x {fast.share_of_copy:>8.0%}"
            line += f" {fast.max_abs_diff:>9.2e}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda: Triton, the torch reference and dense SDPA; cpu: C++, the last two",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="cache and query dtype (default: the device's config)",
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="default: the device's sweep")
    parser.add_argument("--context-lens", type=int, nargs="+", help="default: the device's sweep")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH, help="JSON results path")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")

    torch.manual_seed(0)
    config = CUDA_CONFIG if args.device == "cuda" else CPU_CONFIG
    overrides = {
        "dtype": args.dtype,
        "batch_sizes": tuple(args.batch_sizes) if args.batch_sizes else None,
        "context_lens": tuple(args.context_lens) if args.context_lens else None,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    copy_bandwidth = copy_gb_per_s(args.device)
    results = run(config, args.device, copy_bandwidth)
    print(f"paged decode attention on {args.device}: {config}")
    print(f"copy bandwidth (read + written): {copy_bandwidth:.1f} GB/s; 'of copy' is the share")
    _print_table(results)

    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    )
    report = {
        "benchmark": "decode_attention",
        "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "config": asdict(config),
        "copy_gb_per_s": copy_bandwidth,
        "results": [asdict(result) for result in results],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
