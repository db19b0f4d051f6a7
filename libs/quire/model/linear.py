"""The decoder's linear layers, each weight kept in the layout its backend runs fastest on.

Backends (`QUIRE_LINEAR_BACKEND`, chosen once at load):

- `torch`: on the CPU the weight is stored transposed, `[in_features, out_features]`, and the
  product is a plain `x @ W_t` (an NN GEMM): `F.linear`'s NT GEMM repacks the weight on every
  call, which for decode's few rows costs more than the multiply (1.1-1.8x slower per layer at
  4-64 rows, one thread). Elsewhere, `F.linear`. Float32 runs here: it is the equivalence
  oracle.
- `onednn`: the weight reordered once into oneDNN's blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`, what vLLM's CPU backend does) and multiplied by
  `torch.ops.mkldnn._linear_pointwise`; bit for bit the kernel `F.linear` reaches for
  bfloat16, without the per-call reorder.
- `widened`: a bfloat16 or float16 weight widened once to float32 (exactly: every 16-bit
  float is a float32) and multiplied in float32 on oneDNN's float32 linear where it runs (else
  torch's), the output rounded back to the activation dtype. That is what a 16-bit GEMM
  computes (exact products, float32 accumulation, one rounding), in another summation order.
  On CPUs without AMX tiles the 16-bit dot-product instructions (AVX512_BF16's `vdpbf16ps`)
  multiply no faster than float32 FMAs, so once a product is bound by multiplying rather than
  by reading its weight, float32 wins (`OMP_NUM_THREADS=1 python -m benchmarks.linear_layouts
  --dtypes bfloat16` measures where). Below `MIN_WIDENED_ROWS` rows the products are bound by
  reading the weight, which float32 doubles, so the narrow weight is kept too (reordered for
  oneDNN) and used there; the float32 copy costs twice those weights' size in memory. On a
  CPU where oneDNN has no 16-bit linear (no AVX-512 BW/VL/DQ or AVX-NE-CONVERT), torch's own
  16-bit NN GEMM is far slower than float32 at every row count, and its NT product
  (`F.linear`, a GEMV per row) beats the float32 copy only for a single row: the narrow
  weight is kept in its `[out, in]` layout for `F.linear` below `MIN_GEMV_ROWS` rows. The LM
  head has its own rule (`head_backend`).

`auto` (the default) on the CPU is measured, not assumed: given the model's linear shapes
(`LayerShapes`), `tuned_backend` times each candidate backend of the dtype on those shapes
at `TUNE_ROWS` rows once per process, interleaved and best of `TUNE_REPEATS`, and takes the
fastest. Which one wins is the CPU's business: on an Intel Xeon without AMX, widened bfloat16
beat oneDNN's by 1.07-1.48x from 32 rows; on an AMD EPYC (Zen 4), whose AVX512_BF16 dot
products run at twice its float32 FMA rate, oneDNN's bfloat16 was 3-5x faster than widened
there, and oneDNN's float32 1.4-3.2x faster than torch's (`python -m
benchmarks.linear_layouts`). Without shapes the rule is fixed: float32 -> torch; bfloat16 on
a CPU with AMX -> onednn, else widened; float16 -> widened. Anything on CUDA -> torch
(`F.linear`). The LM head runs on oneDNN on the CPU in float32 and bfloat16 (`head_backend`).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quire.kernels import backends as kernel_backends
from quire.kernels import packed_linear
from quire.model.machine_load import OtherLoad

BACKENDS = ("auto", "onednn", "packed", "torch", "widened")
MIN_WIDENED_ROWS = 32  # fewer rows than this: a widened layer multiplies its narrow weight
# Without oneDNN's 16-bit linear, fewer rows than this take F.linear on the narrow weight.
MIN_GEMV_ROWS = 2
# `tuned_backend`: batch sizes timed (a lone decoding sequence, small and large decode batches
# and a prefill-sized one; below MIN_WIDENED_ROWS a widened layer is timed on its narrow weight,
# as it runs) and repeats. The lone row counts: on a 2-core machine a backend's lead at one row
# is most of what sets interactive latency.
TUNE_ROWS = (1, 4, 32, 128)
TUNE_REPEATS = 5
TUNE_HOPELESS = 4.0  # slower than this multiple of the fastest everywhere: timed only once
TUNE_MIN_WINDOW_S = 0.25  # timed passes go on until this long (the load's accounting tick: 10 ms)
TUNE_MAX_REPEATS = 200
# A timing taken while other processes held more than this many cores beyond those our
# threads left them is taken again, after a pause, until TUNE_WAIT_S has passed.
TUNE_SLACK_CORES = 0.25
TUNE_RETRY_PAUSE_S = 0.5
TUNE_WAIT_S = 15.0
# (out_features, in_features) of one decoder layer's linears, e.g. qkv, o, gate_up, down.
LayerShapes = tuple[tuple[int, int], ...]
# What `tuned_backend` measured: (dtype, shapes) -> backend -> its mean, over TUNE_ROWS, of
# (its best of TUNE_REPEATS seconds for one pass of the shapes) / (the fastest backend's).
TUNINGS: dict[tuple[torch.dtype, LayerShapes], dict[str, float]] = {}


@dataclass(frozen=True)
class TuneConditions:
    """How a tuning's kept timing was taken."""

    threads: int  # torch threads of the tuning thread
    attempts: int  # timings taken (more than one: the machine was busy)
    other_cores: float  # cores other processes kept busy during the kept timing
    quiet: bool  # whether they left our threads' cores free (else TUNE_WAIT_S ran out)


TUNE_CONDITIONS: dict[tuple[torch.dtype, LayerShapes], TuneConditions] = {}


def _onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN's linear runs `dtype` (float32 or bfloat16) here: its bfloat16 path needs
    AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, and refuses to reorder a weight on a CPU without."""
    if not (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    ):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def has_amx() -> bool:
    is_amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(is_amx and is_amx())


def linear_backend(
    dtype: torch.dtype,
    device: torch.device,
    backend: str | None = None,
    shapes: LayerShapes | None = None,
) -> str:
    """The backend (`onednn`, `torch` or `widened`) linears of this dtype and device run on;
    `auto` with the model's `shapes` on the CPU: the fastest measured (`tuned_backend`)."""
    backend = backend or os.environ.get("QUIRE_LINEAR_BACKEND", "auto")
    if backend not in BACKENDS:
        raise ValueError(
            f"QUIRE_LINEAR_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}"
        )
    if device.type != "cpu":
        return "torch"
    narrow = dtype in (torch.bfloat16, torch.float16)
    if backend == "onednn":
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"QUIRE_LINEAR_BACKEND=onednn supports float32 and bfloat16, not {dtype}"
            )
        if not _onednn_available(dtype):
            raise ValueError(
                f"QUIRE_LINEAR_BACKEND=onednn but oneDNN's linear does not run {dtype} here "
                "(bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"
            )
        return "onednn"
    if backend == "widened":
        return "widened" if narrow else "torch"
    if backend == "packed":
        if kernel_backends.packed_linear(dtype) is None:
            raise ValueError(
                f"QUIRE_LINEAR_BACKEND=packed needs the C++ kernels (make kernels-cpu) as the "
                f"CPU's kernel backend and, for {dtype}, a CPU that runs them (AVX2 and FMA; on "
                "a CPU with AVX-512, bfloat16 needs AVX512_BF16)"
            )
        return "packed"
    if backend == "torch":
        return "torch"
    if shapes and dtype in _CANDIDATES:
        return tuned_backend(dtype, shapes)
    if not narrow:
        return "torch"
    if dtype == torch.bfloat16 and has_amx() and _onednn_available(dtype):
        return "onednn"
    return "widened"


_CANDIDATES: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("torch", "onednn", "packed"),
    torch.bfloat16: ("onednn", "widened", "torch", "packed"),
    torch.float16: ("widened", "torch"),
}


def can_run(backend: str, dtype: torch.dtype) -> bool:
    """Whether `backend` runs linears of `dtype` on this CPU and build."""
    if backend == "onednn":
        return _onednn_available(dtype)
    if backend == "packed":
        return kernel_backends.packed_linear(dtype) is not None
    return True


def _time_backends(
    layers: dict[str, list[Linear]], inputs: dict[int, list[torch.Tensor]]
) -> dict[tuple[str, int], float]:
    """(backend, rows) -> its best seconds for one pass of the layers: all candidates
    interleaved, TUNE_REPEATS timed passes at least and more until TUNE_MIN_WINDOW_S has
    passed (up to TUNE_MAX_REPEATS), so that the machine's load can be read over the window. A
    candidate TUNE_HOPELESS times slower than the fastest at every row count on the first
    timed pass is not timed again."""
    best = {(b, m): float("inf") for b in layers for m in TUNE_ROWS}
    timed = list(layers)
    window_started = time.perf_counter()
    repeat = 0
    with torch.inference_mode():
        while repeat <= TUNE_REPEATS or (
            repeat <= TUNE_MAX_REPEATS and time.perf_counter() - window_started < TUNE_MIN_WINDOW_S
        ):
            for b in timed:
                for m in TUNE_ROWS:
                    started = time.perf_counter()
                    for layer, x in zip(layers[b], inputs[m], strict=True):
                        layer(x)
                    if repeat:  # the first pass warms up, untimed
                        best[b, m] = min(best[b, m], time.perf_counter() - started)
            if repeat == 1:
                first = {m: min(best[b, m] for b in timed) for m in TUNE_ROWS}
                timed = [
                    b
                    for b in timed
                    if any(best[b, m] < TUNE_HOPELESS * first[m] for m in TUNE_ROWS)
                ]
            repeat += 1
    return best


@functools.cache
def tuned_backend(dtype: torch.dtype, shapes: LayerShapes) -> str:
    """The CPU backend that runs linears of these shapes fastest in this dtype, measured once
    per process on random weights (`_time_backends`), on the thread and with the torch
    threads of the caller: each candidate's best at each of TUNE_ROWS as a multiple of the
    fastest there, averaged over TUNE_ROWS (each batch size counts the same, not the largest
    most); the figures go to TUNINGS.

    A timing is only kept if other processes left the cores its threads needed free
    (machine_load.OtherLoad): a neighbour's busy core makes OpenMP kernels look several times
    slower than they are and hands the choice to whichever candidate happened to run on one
    thread (an executor tuning while the router beside it started up chose torch's GEMM). A
    disturbed timing is taken again after TUNE_RETRY_PAUSE_S, for up to TUNE_WAIT_S; then the
    least disturbed one is kept. TUNE_CONDITIONS says how the kept one was taken."""
    candidates = [b for b in _CANDIDATES[dtype] if can_run(b, dtype)]
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(o, i, generator=gen) * 0.02).to(dtype) for o, i in shapes]
    inputs = {m: [torch.randn(m, i, generator=gen).to(dtype) for _, i in shapes] for m in TUNE_ROWS}
    layers = {b: [Linear(w, None, b) for w in weights] for b in candidates}
    threads = torch.get_num_threads()
    deadline = time.monotonic() + TUNE_WAIT_S
    kept: tuple[OtherLoad, dict[tuple[str, int], float]] | None = None
    attempts = 0
    while True:
        attempts += 1
        with OtherLoad() as load:
            best = _time_backends(layers, inputs)
        if kept is None or load.cores < kept[0].cores:
            kept = (load, best)
        if load.left_free(threads, TUNE_SLACK_CORES) or time.monotonic() >= deadline:
            break
        time.sleep(TUNE_RETRY_PAUSE_S)
    kept_load, best = kept
    fastest = {m: min(best[b, m] for b in candidates) for m in TUNE_ROWS}
    slowdown = {
        b: sum(best[b, m] / fastest[m] for m in TUNE_ROWS) / len(TUNE_ROWS) for b in candidates
    }
    TUNINGS[dtype, shapes] = slowdown
    TUNE_CONDITIONS[dtype, shapes] = TuneConditions(
        threads=threads,
        attempts=attempts,
        other_cores=round(kept_load.cores, 2),
        quiet=kept_load.left_free(threads, TUNE_SLACK_CORES),
    )
    return min(candidates, key=slowdown.__getitem__)


def head_backend(dtype: torch.dtype, device: torch.device, backend: str | None = None) -> str:
    """The LM head's backend.

    `auto`: on the CPU the packed kernel where it runs (AVX2 and FMA; bfloat16 on a CPU with
    AVX-512 needs AVX512_BF16), else oneDNN for float32 and bfloat16. The head's weight (vocab x
    hidden) is the model's largest, and at decode's few sampled rows reading it is most of the
    cost: on an AMD EPYC (Zen 4), 2 threads, the packed head was 1.51x faster than oneDNN's at 1 row
    in bfloat16, 1.22x at 16 and even at 256; 1.68x in float32 at 1 row, even at 64 and 0.95x
    at 256 (`python -m benchmarks.linear_layouts`; decode computes the head for the sampled
    rows only), and oneDNN's 1.0-1.8x faster than the NN GEMM in float32. A widened model keeps its head
    narrow for the same reason. A 16-bit head with neither (no C++ kernels, or no AVX2) is widened:
    torch's own 16-bit GEMM is no narrow path worth keeping there (`Linear`). An explicit
    `torch`, `onednn` or `packed` applies to the head too.
    """
    backend = backend or os.environ.get("QUIRE_LINEAR_BACKEND", "auto")
    chosen = linear_backend(dtype, device, backend)
    if backend in ("torch", "onednn", "packed"):
        return chosen
    if device.type != "cpu":
        return "torch"
    if kernel_backends.packed_linear(dtype) is not None:
        return "packed"
    if _onednn_available(dtype):
        return "onednn"
    return "widened" if dtype in (torch.bfloat16, torch.float16) else "torch"


class Linear:
    """y = x W^T + b, with W kept in whichever layout its backend runs fastest on."""

    def __init__(
        self,
        weight: torch.Tensor,  # [out_features, in_features]
        bias: torch.Tensor | None,
        backend: str,
        batch_size_hint: int = 64,  # rows oneDNN tunes the blocked layout for
        keep_layout: bool = False,  # torch on the CPU: keep [out, in] for F.linear's NT product
    ) -> None:
        assert backend in BACKENDS[1:], f"unknown linear backend {backend!r}"
        self.out_features, self.in_features = weight.shape
        self.backend = backend
        self.bias = bias
        # weight_t: [in_features, out_features] for the CPU's NN product, else None
        self.weight_t: torch.Tensor | None = None
        # A widened layer's float32 product (its own backend) and, for batches of fewer than
        # narrow_rows rows, its 16-bit one (oneDNN-reordered, or the plain [out, in] weight
        # for F.linear); else None.
        self.wide: Linear | None = None
        self.narrow: Linear | None = None
        self.narrow_rows = 0
        if backend == "onednn":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size_hint)
        elif backend == "packed":
            self.weight = packed_linear.pack_weight(weight)
        elif backend == "widened" and weight.device.type == "cpu":
            wide = "onednn" if _onednn_available(torch.float32) else "torch"
            self.wide = Linear(weight.float(), None if bias is None else bias.float(), wide)
            if _onednn_available(weight.dtype):
                self.narrow = Linear(weight, bias, "onednn", MIN_WIDENED_ROWS)
                self.narrow_rows = MIN_WIDENED_ROWS
            else:
                # torch's own 16-bit products: F.linear's (NT) is a row-by-row GEMV that beats
                # reading the float32 copy only for a single row; its NN GEMM never does.
                self.narrow = Linear(weight, bias, "torch", keep_layout=True)
                self.narrow_rows = MIN_GEMV_ROWS
            self.weight = self.wide.weight
        elif weight.device.type == "cpu" and not keep_layout:
            self.weight_t = weight.t().contiguous()
            self.weight = self.weight_t.t()
        else:
            self.weight = weight

    @property
    def num_params(self) -> int:
        return self.out_features * self.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.backend == "packed":
            return packed_linear.packed_linear(x, self.weight, self.bias, self.out_features)
        if self.wide is not None:
            if self.narrow is not None and x.shape[0] < self.narrow_rows:
                return self.narrow(x)
            return self.wide(x.float()).to(x.dtype)
        if self.weight_t is not None:
            return self._matmul(x)
        return F.linear(x, self.weight, self.bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        assert self.weight_t is not None
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)
