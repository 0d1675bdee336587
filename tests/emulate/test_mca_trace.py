"""The trace of `stochround.emulate.mca` (`emulate/mca_trace.py`): its report is the per-op
formula's (each call's moments and digits computed when it ran, as before the buffer, also
where the program writes into an output the trace holds), the batched observer adds no
ATen op an op and reads nothing back until the report, and `call_site` names the
program's line."""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from helpers import OpCounter, kahan_sum, muller_values

from stochround.emulate import mca_trace
from stochround.emulate.mca import mca, significant_digits
from stochround.emulate.mca_digits import fewest_digits
from stochround.emulate.mca_trace import SiteDigits, SiteStatistics, call_site, precision_of

# the module (the package's `mca` is the function)
mca_module = importlib.import_module("stochround.emulate.mca")


def naive_variance(x: torch.Tensor) -> torch.Tensor:
    mean_of_squares = (x * x).mean()
    square_of_mean = x.mean() ** 2
    return mean_of_squares - square_of_mean


def damped(x: torch.Tensor, steps: int = 6) -> torch.Tensor:
    """The benchmark's recurrence (benchmarks/bench_mca.py): four ops a step on a vector."""
    y = x.flip(0)
    for _ in range(steps):
        x = x * 0.999 + y
        y = y - 0.001 * x
    return x.sum()


def overwritten(x: torch.Tensor) -> torch.Tensor:
    """In-place ops writing into outputs the batched trace holds (`SiteStatistics.settle`)."""
    y = x * 1.1 + 0.25
    y.zero_()
    y.add_(x * 0.3)
    z = y * 3.0
    z.mul_(x)
    return z + y


def kahan_data() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.cat([torch.tensor([1e4]), torch.rand(30, generator=generator) * 0.1])


def shifted() -> torch.Tensor:
    return torch.randn(200, generator=torch.Generator().manual_seed(0)) + 1e4


def filed_as_library(function: Callable[..., None]) -> Callable[..., None]:
    """``function`` with its code filed under stochround's folder, so that `call_site`
    skips its frames as it skips the library's (the reference observer is not the program
    whose lines are reported)."""
    function.__code__ = function.__code__.replace(co_filename=mca_trace.__file__)
    return function


class PerOpStatistics(SiteStatistics):
    """The trace as it was before the buffer: each batched call's moments computed when it
    ran (its samples' mean and squared deviations, float64), its digits (`significant_digits`
    clamped to its precision, their minimum) read back one call at a time in `sites`."""

    @filed_as_library
    def observe_samples(self, func: torch._ops.OpOverload, outputs: object) -> None:
        site, index = self._call()
        tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)  # type: ignore[call-overload]
        self.moments[(site, index)] = [
            [t.shape[0], mean, ((wide - mean) ** 2).sum(dim=0), precision_of(self.formats, t.dtype)]
            for t in tensors
            if t.is_floating_point() and t.numel() > 0
            for wide in [t.detach().to(torch.float64)]
            for mean in [wide.mean(dim=0)]
        ]

    def sites(self) -> tuple[SiteDigits, ...]:
        per_site: dict[str, list[float]] = {}
        for (site, _), entries in self.moments.items():
            for count, mean, squares, p in entries:
                std = (squares / (count - 1)).sqrt() if count > 1 else mean * math.nan
                per_site.setdefault(site, []).append(float(significant_digits(mean, std, p).min()))
        found = [
            SiteDigits(site, self.calls[site], math.nan if math.isnan(sum(d)) else min(d))
            for site, d in per_site.items()
        ]
        return tuple(sorted(found, key=lambda s: -math.inf if math.isnan(s.digits) else s.digits))


PROGRAMS: dict[str, tuple[Callable[..., torch.Tensor], tuple[object, ...], dict[str, object]]] = {
    "kahan": (kahan_sum, (kahan_data(),), {}),
    "muller_float64": (muller_values, (20,), {}),
    "naive_variance": (naive_variance, (shifted(),), {}),
    "naive_variance_t24_float64": (naive_variance, (shifted().double(),), {"precision": 24}),
    "overwritten": (overwritten, (torch.rand(6, generator=torch.Generator().manual_seed(3)),), {}),
    "damped_t12": (
        damped,
        (torch.rand(40, generator=torch.Generator().manual_seed(1)),),
        {"precision": 12},
    ),
}


def same_report(ours: tuple[SiteDigits, ...], theirs: tuple[SiteDigits, ...]) -> bool:
    """The same sites in the same order with the same calls and digits (NaN equal to NaN)."""
    return [(s.site, s.calls) for s in ours] == [(s.site, s.calls) for s in theirs] and all(
        a.digits == b.digits or (math.isnan(a.digits) and math.isnan(b.digits))
        for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.parametrize("buffer_bytes", [None, 8 * 4 * 7], ids=["one_buffer", "7_columns"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "serial"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_the_report_is_the_per_op_formulas(program, batched, buffer_bytes, monkeypatch):
    """Sites, calls and digits equal the per-op computation's, bit for bit on the CPU (the
    moments of a buffer's columns are each column's, the minimum of clamped digits the
    clamped minimum).  With a buffer of 7 columns (n = 4): reduced many times, a call
    wider than it (the damped vector, 40) reduced on its own."""
    fn, args, options = PROGRAMS[program]
    if buffer_bytes is not None:
        monkeypatch.setattr(mca_trace, "TRACE_BUFFER_BYTES", buffer_bytes)
    ours = mca(fn, *args, n=4, seed=5, trace=True, batched=batched, **options)
    monkeypatch.setattr(mca_module, "SiteStatistics", PerOpStatistics)
    theirs = mca(fn, *args, n=4, seed=5, trace=True, batched=batched, **options)
    assert theirs.sites and same_report(ours.sites, theirs.sites)


def ops_of(steps: int, trace: bool) -> Counter[str]:
    x = torch.rand(8, generator=torch.Generator().manual_seed(2))
    with OpCounter() as counting:
        mca(damped, x, steps, n=4, seed=0, trace=trace)
    return counting.ops


def test_the_batched_trace_adds_no_op_an_op():
    """Ten more steps (40 more rounded ops, none in place) cost the traced run no ATen op
    more than the untraced run: each output is held, and the held outputs are copied into
    the buffer together (before: a view of the buffer and a copy into it an op; before
    that, 19 ops an op, a read back among them)."""
    added = (ops_of(12, True) - ops_of(12, False)) - (ops_of(2, True) - ops_of(2, False))
    assert added == Counter()


def test_the_report_reads_back_once_a_device(monkeypatch):
    """The digits come back to the host in one ``tolist`` for the whole run, however many
    calls and buffers (no ``item`` or ``float`` per call)."""
    reads: Counter[str] = Counter()
    for name in ("tolist", "item", "__float__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original):  # type: ignore[no-untyped-def]
            reads[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    statistics = SiteStatistics({})
    monkeypatch.setattr(mca_trace, "TRACE_BUFFER_BYTES", 8 * 4 * 5)  # 5 columns: many buffers
    samples = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(9):
        statistics.observe_samples(torch.ops.aten.mul.Tensor, samples)
    assert len(statistics._reduced) == 8 and reads == Counter()  # 3 columns a call: one a buffer
    (site,) = statistics.sites()
    assert reads == Counter({"tolist": 1}) and site.calls == 9


def test_fewest_digits_is_the_minimum_of_each_run_nan_first():
    """Per run of consecutive elements: the fewest unclamped digits, inf where every std is
    0, NaN where any element is NaN (whatever the others)."""
    mean = torch.tensor([1.0, 1.0, 0.0, 2.0, 5.0, math.nan, 1.0], dtype=torch.float64)
    std = torch.tensor([1e-3, 1e-6, 0.0, 0.0, 1.0, math.nan, 0.1], dtype=torch.float64)
    found = fewest_digits(mean, std, [2, 2, 2, 1]).tolist()
    assert found[0] == pytest.approx(3.0, abs=1e-12)
    assert found[1] == math.inf
    assert math.isnan(found[2])
    assert found[3] == pytest.approx(1.0, abs=1e-12)


def test_call_site_names_the_calling_line():
    site = call_site()
    code = test_call_site_names_the_calling_line.__code__
    assert site == f"{__file__}:{code.co_firstlineno + 1} {code.co_name}"


@pytest.mark.gpu
def test_the_batched_observer_never_waits_for_the_gpu(monkeypatch):
    """On CUDA, observing 20 calls of 21 columns (buffers of 50 filled and reduced, each
    buffer's run indices sent from pinned memory) raises nothing under PyTorch's sync
    debug mode "error"; the digits then equal the CPU's for the same samples."""
    monkeypatch.setattr(mca_trace, "TRACE_BUFFER_BYTES", 8 * 4 * 50)  # 50 columns
    generator = torch.Generator().manual_seed(0)
    calls = [torch.rand(4, 3, 7, generator=generator) * 2**k for k in range(20)]
    on_device = [samples.cuda() for samples in calls]
    on_gpu, on_cpu = SiteStatistics({}), SiteStatistics({})
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for samples in on_device:
            on_gpu.observe_samples(torch.ops.aten.mul.Tensor, samples)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for samples in calls:
        on_cpu.observe_samples(torch.ops.aten.mul.Tensor, samples)
    (ours,), (theirs,) = on_gpu.sites(), on_cpu.sites()  # a site each (two lines here)
    assert ours.calls == theirs.calls == 20 and len(on_gpu._reduced) == 10
    assert ours.digits == pytest.approx(theirs.digits, abs=1e-12)
