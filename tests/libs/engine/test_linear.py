"""Linear layers on each backend (oneDNN, transposed, widened) against F.linear; the choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quire.kernels import backends as kernel_backends
from quire.kernels import cpp_build
from quire.model import linear as linear_module
from quire.model.linear import (
    BACKENDS,
    MIN_GEMV_ROWS,
    MIN_WIDENED_ROWS,
    TUNE_CONDITIONS,
    TUNINGS,
    Linear,
    TuneConditions,
    head_backend,
    linear_backend,
)
from tests.hardware import (
    can_run_onednn_bfloat16,
    can_run_packed_linear,
    needs_onednn_bfloat16,
    needs_packed_linear,
)

CPU = torch.device("cpu")


@needs_onednn_bfloat16
@pytest.mark.parametrize("rows", [1, 3, 64, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_bfloat16_linear_equals_f_linear_bit_for_bit(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen).to(torch.bfloat16) if with_bias else None
    x = torch.randn(rows, 80, generator=gen).to(torch.bfloat16)
    packed = Linear(weight, bias, "onednn")
    assert (packed.out_features, packed.in_features, packed.num_params) == (96, 80, 96 * 80)
    assert torch.equal(packed(x), F.linear(x, weight, bias))
    # A strided view (the attention output's reshape is one) gives the same rows.
    wide = torch.randn(rows, 160, generator=gen).to(torch.bfloat16)
    assert torch.equal(packed(wide[:, :80]), F.linear(wide[:, :80], weight, bias))


class _ChargedClock:
    """A clock that a layer advances by its backend's cost per row, instead of real time."""

    def __init__(self, cost_per_row: dict[str, float]) -> None:
        self.now = 0.0
        self.cost_per_row = cost_per_row

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _FakeLoad:
    """machine_load.OtherLoad with the other processes' cores of each timing set in advance
    (on a two-CPU machine); `on_enter` runs as each timing starts."""

    sequence: list[float] = []
    on_enter: list[object] = []

    def __init__(self) -> None:
        self.num_cpus = 2
        self.cores = 0.0

    def __enter__(self) -> _FakeLoad:
        for hook in _FakeLoad.on_enter:
            hook()  # type: ignore[operator]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cores = _FakeLoad.sequence.pop(0)

    def left_free(self, threads: int, slack_cores: float) -> bool:
        return self.cores <= max(0, self.num_cpus - threads) + slack_cores


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_auto_takes_the_backend_its_clock_says_is_fastest(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given timings known in advance (each backend charging the clock a set cost per row),
    the tuning picks the cheapest and reports each one's cost relative to it."""
    candidates = [b for b in linear_module._CANDIDATES[dtype] if linear_module.can_run(b, dtype)]
    assert len(candidates) >= 2, candidates
    # The last candidate is made the cheapest (the rule's fixed order would not pick it).
    costs = {b: 3.0 + i for i, b in enumerate(candidates)} | {candidates[-1]: 1.0}
    clock = _ChargedClock(costs)

    class ChargedLinear(Linear):
        depth = 0  # a widened layer calls its own narrow layer: only the outer call charges

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            if ChargedLinear.depth == 0:
                clock.now += clock.cost_per_row[self.backend] * x.shape[0]
            ChargedLinear.depth += 1
            try:
                return super().__call__(x)
            finally:
                ChargedLinear.depth -= 1

    monkeypatch.setattr(linear_module, "time", clock)
    monkeypatch.setattr(linear_module, "Linear", ChargedLinear)
    monkeypatch.setattr(linear_module, "OtherLoad", _FakeLoad)
    monkeypatch.setattr(_FakeLoad, "sequence", [0.0])
    shapes = ((40, 24), (24, 40))
    linear_module.tuned_backend.cache_clear()
    try:
        assert linear_backend(dtype, CPU, "auto", shapes=shapes) == candidates[-1]
    finally:
        linear_module.tuned_backend.cache_clear()
    # per batch size, two layers of cost c x rows: each slowdown is c / the cheapest's c
    assert TUNINGS[dtype, shapes] == pytest.approx({b: c / 1.0 for b, c in costs.items()})


def _tune_with_loads(
    monkeypatch: pytest.MonkeyPatch, loads: list[float]
) -> tuple[str, list[str], dict[str, float], TuneConditions]:
    """Tune float32 on two shapes where each timing's other load is the next of `loads`, the
    candidate that is cheapest rotates from timing to timing (the first candidate in the first
    timing, the next in the second, ...), and the last timing starts past TUNE_WAIT_S:
    (chosen, candidates, TUNINGS, conditions)."""
    dtype = torch.float32
    candidates = [b for b in linear_module._CANDIDATES[dtype] if linear_module.can_run(b, dtype)]
    assert len(candidates) >= 2, candidates
    clock = _ChargedClock({})
    timing = [-1]
    wait_s = 1e12  # far beyond what the timings charge the clock

    def next_timing() -> None:  # this timing's cheapest candidate costs 1 a row, the others 5
        timing[0] += 1
        cheapest = candidates[timing[0] % len(candidates)]
        clock.cost_per_row = {b: 1.0 if b == cheapest else 5.0 for b in candidates}
        if timing[0] == len(loads) - 1:
            clock.now += wait_s

    class ChargedLinear(Linear):
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            clock.now += clock.cost_per_row[self.backend] * x.shape[0]
            return super().__call__(x)

    monkeypatch.setattr(linear_module, "time", clock)
    monkeypatch.setattr(linear_module, "Linear", ChargedLinear)
    monkeypatch.setattr(linear_module, "OtherLoad", _FakeLoad)
    monkeypatch.setattr(linear_module, "TUNE_WAIT_S", wait_s)
    monkeypatch.setattr(_FakeLoad, "sequence", list(loads))
    monkeypatch.setattr(_FakeLoad, "on_enter", [next_timing])
    shapes = ((40, 24), (24, 40))
    threads = torch.get_num_threads()
    linear_module.tuned_backend.cache_clear()
    try:
        torch.set_num_threads(2)
        chosen = linear_module.tuned_backend(dtype, shapes)
    finally:
        linear_module.tuned_backend.cache_clear()
        torch.set_num_threads(threads)
    return chosen, candidates, TUNINGS[dtype, shapes], TUNE_CONDITIONS[dtype, shapes]


def test_a_timing_taken_while_others_held_our_cores_is_taken_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two threads on two CPUs: timings with others on 1.5 and 0.5 cores are not kept, the
    third (0.1 cores, within the slack) is, and its cheapest candidate is chosen."""
    chosen, candidates, tuning, conditions = _tune_with_loads(monkeypatch, [1.5, 0.5, 0.1])
    assert chosen == candidates[2 % len(candidates)]
    assert tuning[chosen] == pytest.approx(1.0)
    assert conditions == TuneConditions(threads=2, attempts=3, other_cores=0.1, quiet=True)


def test_a_machine_that_never_quiets_keeps_the_least_disturbed_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every timing disturbed: they go on until TUNE_WAIT_S has passed, then the one taken
    with the fewest other cores decides."""
    chosen, candidates, _, conditions = _tune_with_loads(monkeypatch, [1.5, 0.75, 1.25])
    assert chosen == candidates[1]
    assert conditions == TuneConditions(threads=2, attempts=3, other_cores=0.75, quiet=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_auto_with_shapes_measures_every_backend_once(dtype: torch.dtype) -> None:
    shapes = ((96, 64), (64, 48), (128, 64))
    chosen = linear_backend(dtype, CPU, "auto", shapes=shapes)
    timings = TUNINGS[dtype, shapes]
    assert chosen in timings and min(timings.values()) == pytest.approx(timings[chosen])
    assert len(timings) >= 2 and set(timings) <= set(BACKENDS[1:])
    assert all(seconds >= 1.0 for seconds in timings.values())  # relative to the fastest
    # measured once per process; a backend named outright is never measured
    assert linear_backend(dtype, CPU, "auto", shapes=shapes) == chosen
    assert linear_backend(dtype, CPU, "torch", shapes=shapes) == "torch"
    assert linear_backend(dtype, torch.device("cuda"), "auto", shapes=shapes) == "torch"


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # without the model's shapes, the fixed rule
    assert linear_backend(torch.float32, CPU, "auto") == "torch"
    assert linear_backend(torch.float32, CPU, "widened") == "torch"  # nothing to widen
    assert linear_backend(torch.bfloat16, CPU, "torch") == "torch"
    assert linear_backend(torch.float16, CPU, "auto") == "widened"
    has_amx_tiles = "amx_tile" in cpp_build.cpu_flags()  # from /proc/cpuinfo, not the code's probe
    assert linear_backend(torch.bfloat16, CPU, "auto") == ("onednn" if has_amx_tiles else "widened")
    assert linear_backend(torch.bfloat16, torch.device("cuda"), "onednn") == "torch"
    with pytest.raises(ValueError, match="float16"):
        linear_backend(torch.float16, CPU, "onednn")
    # The LM head: packed where it runs, else oneDNN where it runs the dtype, on the CPU unless
    # a backend is named.
    # A 16-bit head with neither is widened (torch's own 16-bit GEMM is no narrow path).
    for dtype in (torch.float32, torch.bfloat16):
        onednn = dtype == torch.float32 or can_run_onednn_bfloat16()
        expected = "packed" if can_run_packed_linear(dtype) else "onednn" if onednn else "widened"
        assert head_backend(dtype, CPU, "auto") == expected
        assert head_backend(dtype, CPU, "widened") == expected
        assert head_backend(dtype, CPU, "torch") == "torch"
        if onednn:
            assert head_backend(dtype, CPU, "onednn") == "onednn"
    assert head_backend(torch.float16, CPU, "auto") == "widened"
    assert head_backend(torch.float32, torch.device("cuda"), "auto") == "torch"
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", "fastest")
    with pytest.raises(ValueError, match="QUIRE_LINEAR_BACKEND"):
        linear_backend(torch.bfloat16, CPU)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, MIN_WIDENED_ROWS - 1, MIN_WIDENED_ROWS, 64, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_widened_linear_is_the_rounded_float32_product(
    dtype: torch.dtype, rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype) if with_bias else None
    layer = Linear(weight, bias, "widened")
    assert layer.wide is not None and layer.wide.out_features == 96
    # the float32 copy, read back through its product with the identity: widening is exact
    read_back = layer.wide(torch.eye(80))  # [in, out] (+ bias)
    expected = weight.float().t() + (0.0 if bias is None else bias.float())
    assert read_back.dtype == torch.float32 and torch.equal(read_back, expected)
    wide = torch.randn(rows, 160, generator=gen).to(dtype)
    for x in (wide[:, :80].contiguous(), wide[:, :80]):  # and a strided view
        out = layer(x)
        assert out.dtype == dtype and out.shape == (rows, 96)
        exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        # Exact products, float32 sums, one rounding: within one 16-bit ulp of the exact value,
        # plus float32's summation error (relative to the sum of the products' magnitudes).
        mantissa_bits = 7 if dtype == torch.bfloat16 else 10
        ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - mantissa_bits)
        magnitude = F.linear(x.double().abs(), weight.double().abs())
        if bias is not None:
            magnitude = magnitude + bias.double().abs()
        assert bool(((out.double() - exact).abs() <= ulp + magnitude * 2.0**-20).all())
        # Few rows: the narrow weight (the 16-bit kernel's bits) where oneDNN runs the
        # dtype; elsewhere no narrow weight is kept and every batch is widened.
        # oneDNN's 16-bit product where it runs, else F.linear's on the [out, in] weight.
        assert layer.narrow is not None
        if linear_module.can_run("onednn", dtype):
            assert layer.narrow.backend == "onednn" and layer.narrow_rows == MIN_WIDENED_ROWS
        else:
            assert layer.narrow.weight is weight and layer.narrow_rows == MIN_GEMV_ROWS
        if rows < layer.narrow_rows:
            assert torch.equal(out, layer.narrow(x))


def test_onednn_bfloat16_is_never_chosen_where_the_cpu_lacks_it() -> None:
    # oneDNN refuses to reorder a bfloat16 weight on such a CPU: named, a clear error; by
    # default, another backend (every candidate the tuning measures must run here).
    if can_run_onednn_bfloat16():
        assert linear_backend(torch.bfloat16, CPU, "onednn") == "onednn"
        return
    with pytest.raises(ValueError, match="does not run torch.bfloat16 here"):
        linear_backend(torch.bfloat16, CPU, "onednn")
    assert not linear_module.can_run("onednn", torch.bfloat16)
    assert head_backend(torch.bfloat16, CPU, "auto") in ("packed", "widened")
    weight = torch.randn(8, 16).to(torch.bfloat16)
    widened = Linear(weight, None, "widened")
    assert widened.narrow is not None and widened.narrow.backend == "torch"
    assert widened.narrow.weight is weight and widened.narrow.weight_t is None  # F.linear's NT


@needs_onednn_bfloat16
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
        assert llm.engine.model.linear_backend == backend
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, False)]
    assert outputs["onednn"] == outputs["torch"]


@needs_packed_linear(torch.float32)
def test_packed_float32_engine_gives_the_torch_backends_greedy_tokens(
    tiny_model: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quire import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 40, 70)]
    outputs = {}
    for backend in ("packed", "torch"):
        monkeypatch.setenv("QUIRE_LINEAR_BACKEND", backend)
        llm = LLM(model=str(tiny_model), dtype="float32", num_kv_blocks=32)
        assert llm.engine.model.linear_backend == backend
        assert llm.engine.model.lm_head.backend == backend
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, False)]
    assert outputs["packed"] == outputs["torch"]


def test_packed_backend_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for by name, the packed backend runs where its kernels run and is a clear error
    where they do not (never a silent fallback), whichever this machine is."""
    if kernel_backends.packed_linear(torch.bfloat16) is not None:
        layer = Linear(torch.randn(70, 8).to(torch.bfloat16), None, "packed")
        assert layer(torch.randn(3, 8).to(torch.bfloat16)).shape == (3, 70)
        assert linear_backend(torch.bfloat16, CPU, "packed") == "packed"
    else:
        with pytest.raises(ValueError, match="packed needs the C\\+\\+ kernels"):
            linear_backend(torch.bfloat16, CPU, "packed")
    with pytest.raises(ValueError, match="packed"):
        linear_backend(torch.float16, CPU, "packed")


@pytest.mark.parametrize("rows", [1, 4, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_torch_linear_on_transposed_weights_matches_f_linear(
    rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    layer = Linear(weight, bias, "torch")
    assert layer.weight_t is not None and layer.weight_t.shape == (80, 96)
    assert layer.weight_t.is_contiguous()
    wide = torch.randn(rows, 160, generator=gen)
    for x in (wide[:, :80].contiguous(), wide[:, :80]):  # and a strided view
        # another GEMM kernel, so the last bits may differ from F.linear's
        torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
