"""The ops a batched MCA run computes directly on the stacked samples, without vmap
(`stochround.emulate.mca_direct`): pointwise ops and the covered sums and means give,
sample for sample, the serial runs' results bit for bit, in every MCA mode; vmap is not
called for them; an op whose dtypes stacking would change takes vmap's path."""

from __future__ import annotations

import contextlib

import pytest
import torch

from stochround.emulate.mca import mca
from stochround.emulate.mca_direct import Direct, direct_kind
from stochround.emulate.ops import op_kind
from stochround.random import seed_tensor

# where the kernel tests run: a GPU's CUDA tensors, else the CPU under Triton's interpreter
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

aten = torch.ops.aten


def scalars_and_tensors(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Tensor and Python-number operands, a sample tensor against a shared one of more
    dims (w: (4, 3) against x's (3,)) and of fewer, division, sqrt, a square."""
    y = x * 0.999 + 1.5
    z = w * y  # (4, 3): a sample tensor broadcast against a shared one of more dims
    z = 2.0 - z / 3.0
    u = (z**2).sqrt() + y  # y (3,) against z (4, 3)
    return torch.where(u > 1.0, u, -u) - x


def in_place(x: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(3, device=x.device)
    for _ in range(3):
        acc += x * 1.1
        acc.mul_(0.7)
    acc.sub_(x, alpha=2)
    return acc


def reductions(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = w * x  # (4, 3)
    return (
        m.sum(),
        m.sum(dim=-1),
        m.mean(dim=0, keepdim=True),
        m.mean(),
        (m * 1.0001).sum(dim=[0, 1]),
        m.sum(dtype=torch.float64),
    )


def zero_dim_promotion(x: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 sample tensor against a float32 vector: float32 in one sample (a 0-d
    tensor's dtype ranks below a tensor of dims), float64 if stacked; vmap's path."""
    s = x.double().sum() * 1.5  # 0-d float64
    return x * s


def muller(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    for _ in range(12):
        a, b = b, 111 - 1130 / b + 3000 / (a * b)
    return b


def two_dtypes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same overloads on float32 samples, then on float64 ones: each dtype's results
    rounded to its own format (by default its own precision, 24 and 53 bits)."""
    a = x * 1.1 + x
    wide = x.double()
    return a, wide * 1.1 + wide


X = torch.rand(3, generator=torch.Generator().manual_seed(1)) + 0.5
W = torch.rand(4, 3, generator=torch.Generator().manual_seed(2)) + 0.5

PROGRAMS = {
    "scalars_and_tensors": (scalars_and_tensors, (X, W)),
    "in_place": (in_place, (X,)),
    "reductions": (reductions, (X, W)),
    "zero_dim_promotion": (zero_dim_promotion, (X,)),
    "muller": (muller, (torch.tensor(2.0), torch.tensor(-4.0))),
}
# the programs of the kernels' route
KERNEL_PROGRAMS = {**PROGRAMS, "two_dtypes": (two_dtypes, (X,))}
OPTIONS = {
    "rr": {},
    "pb": {"mca_mode": "pb", "precision": 12},
    "mca": {"mca_mode": "mca", "precision": 14},
    "rr_float64": {"fmt": "float64"},
    "rne_bfloat16": {"fmt": "bfloat16", "mode": "rne"},
}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_direct_samples_are_the_serial_runs_bit_for_bit(program, options):
    fn, args = PROGRAMS[program]
    serial = mca(fn, *args, n=4, seed=3, trace=True, batched=False, **OPTIONS[options])
    batched = mca(fn, *args, n=4, seed=3, trace=True, **OPTIONS[options])
    assert batched.labels == serial.labels
    for ours, theirs in zip(batched.samples, serial.samples, strict=True):
        assert ours.shape == theirs.shape and torch.equal(ours, theirs)
    assert batched.no_residual == serial.no_residual
    assert [(s.site, s.calls) for s in batched.sites] == [(s.site, s.calls) for s in serial.sites]


def refuse_vmap(*args, **kwargs):
    raise AssertionError("vmap called")


@pytest.mark.parametrize("program", ["scalars_and_tensors", "in_place", "reductions", "muller"])
# the conversions of reductions' dtype=float64 and of muller's Python numbers included
def test_pointwise_ops_and_sums_do_not_call_vmap(program, monkeypatch):
    fn, args = PROGRAMS[program]
    expected = mca(fn, *args, n=3, seed=5, batched=False)
    monkeypatch.setattr(torch.func, "vmap", refuse_vmap)
    found = mca(fn, *args, n=3, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(found.samples, expected.samples, strict=True))


def test_a_call_whose_dtype_stacking_would_change_takes_vmaps_path(monkeypatch):
    """Of zero_dim_promotion's ops (a conversion, a sum, two products) only ``x * s``
    (float32 in one sample, float64 stacked) runs under vmap."""
    vmapped = []
    vmap = torch.func.vmap

    def counted(function, *args, **kwargs):
        vmapped.append(function)
        return vmap(function, *args, **kwargs)

    monkeypatch.setattr(torch.func, "vmap", counted)
    found = mca(zero_dim_promotion, X, n=3, seed=5, trace=True)
    assert len(vmapped) == 1 and found.samples[0].shape == (3, 3)
    assert sorted(s.calls for s in found.sites) == [1, 3]


def test_each_overloads_direct_form():
    def form(func):
        return direct_kind(func, op_kind(func))

    assert form(aten.mul.Tensor) is Direct.POINTWISE
    assert form(aten.add_.Tensor) is Direct.POINTWISE
    assert form(aten.where.self) is Direct.POINTWISE
    assert form(aten.sum.dim_IntList) is Direct.REDUCTION
    assert form(aten.mean.default) is Direct.REDUCTION
    assert form(aten._to_copy.default) is Direct.POINTWISE
    # out= writes an argument other than the first; clone lays values out; mm is no
    # pointwise op; amax is a reduction the exact pairs do not cover
    for func in (aten.add.out, aten.clone.default, aten.mm.default, aten.amax.default):
        assert form(func) is Direct.NONE, func


def pair_values(fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) float64 pairs: ordinary values, values on the grid with a residual either
    way, ties of the SR count, the format's subnormals, values at and beyond its max,
    zeros, infinities and NaN."""
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(200, generator=g, dtype=torch.float64) - 0.5) * 2.0 ** torch.randint(
        -30, 30, (200,), generator=g
    ).double()
    b = a * 2.0**-60 * torch.randn(200, generator=g, dtype=torch.float64)
    grid = torch.tensor([1.0, 0.75, -3.0, 1.5 * 2.0**-3]).double()
    tiny = 2.0 ** (fmt.emin - fmt.mbits)
    top = fmt.max
    hi = torch.cat(
        [
            a,
            grid,
            grid,
            torch.tensor([tiny, 3.3 * tiny, -0.4 * tiny, top, -top, top * (1 + 2.0**-50)]),
            torch.tensor([0.0, -0.0, 0.0, float("inf"), -float("inf"), float("nan"), 1.0]),
        ]
    ).double()
    lo = torch.cat(
        [
            b,
            grid * 2.0**-70,
            -grid * 2.0**-70,
            torch.tensor([0.0, 0.0, 0.0, top * 2.0**-60, -top * 2.0**-60, 0.0]),
            torch.tensor([0.0, 0.0, 2.0**-1074, 0.0, 0.0, 0.0, 2.0**-60]),
        ]
    ).double()
    return hi, lo


@pytest.mark.parametrize("fmt_name", ["t10", "t24", "t53", "bfloat16", "float16", "e4m3", "e5m2"])
def test_the_pair_kernel_is_sr_pair_words_with_each_samples_words(fmt_name):
    """The kernel (Triton's interpreter here) against `sr_pair_words` with `sample_words`,
    bit for bit; n = 3 samples of the same pairs, each its own words."""
    from stochround.emulate.exact import sr_pair_words
    from stochround.emulate.mca import SAMPLE_STRIDE, virtual_precision
    from stochround.emulate.mca_samples import sample_pair_refusal, sample_words
    from stochround.formats import format as find_format
    from stochround.kernels.sample_pair import sample_pair_triton

    if fmt_name.startswith("t"):
        fmt = virtual_precision(int(fmt_name[1:]))[torch.float64]
    else:
        fmt = find_format(fmt_name)
    assert sample_pair_refusal(fmt) is None
    hi, lo = (each.to(KERNEL_DEVICE) for each in pair_values(fmt))
    hi, lo = hi.expand(3, -1), lo.expand(3, -1)
    key = 2**64 - 99
    bases = torch.arange(3, dtype=torch.int64, device=KERNEL_DEVICE) * SAMPLE_STRIDE
    expected = sr_pair_words(hi, lo, fmt, sample_words(hi.shape[1:], key, bases, 12))
    found = sample_pair_triton(hi, lo, fmt, seed_tensor(key, "seed", hi.device), bases, 12)
    assert torch.equal(found.view(torch.int64), expected.view(torch.int64))


def test_the_pair_kernel_refuses_formats_off_its_grid():
    from stochround.emulate.mca_samples import sample_pair_refusal
    from stochround.formats import format as find_format

    assert sample_pair_refusal(find_format("e4m3fn")) == (
        "e4m3fn: the kernel takes IEEE-like formats only"
    )


def bits(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns, every NaN as one (a NaN's sign and payload are the platform's:
    x86 and CUDA make different ones, and torch.equal sees no NaN equal)."""
    return torch.where(x.isnan(), torch.nan, x).view(torch.uint8)


@pytest.mark.parametrize("op", ["add", "sub", "rsub", "mul", "div"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scalar", [False, True], ids=["tensor", "number"])
def test_the_binary_kernel_is_the_emulations_exact_pair_rounded(op, dtype, scalar):
    """One launch (Triton's interpreter here) against the emulation's PyTorch path: the
    op's exact pair from float64 operands (`exact_pair`), `sr_pair_words` with each
    sample's words, stored in the dtype; special values, zeros, a zero divisor."""
    from stochround.emulate.exact import exact_pair, sr_pair_words
    from stochround.emulate.mca import SAMPLE_STRIDE, virtual_precision
    from stochround.emulate.mca_samples import sample_words
    from stochround.kernels.sample_pair import sample_binary_triton

    fmt = virtual_precision(12 if dtype == torch.float32 else 30)[dtype]
    g = torch.Generator().manual_seed(4)
    special = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-40, 3e38, 1.0])
    a = torch.cat([torch.randn(60, generator=g), special]).to(dtype)
    b = torch.cat([torch.randn(60, generator=g), special.flip(0)]).to(dtype)
    a, b = (each.to(KERNEL_DEVICE).expand(3, -1).contiguous() for each in (a, b))
    # the number 0.1 as the emulation's float64 arithmetic takes it (float32 operands:
    # rounded to float32 first)
    wide_other = float(torch.tensor(0.1, dtype=dtype)) if scalar else b.double()
    func = getattr(torch.ops.aten, op).Scalar if scalar else getattr(torch.ops.aten, op).Tensor
    hi, lo = exact_pair(func, (a.double(), wide_other), {})
    key, bases = 77, torch.arange(3, dtype=torch.int64, device=KERNEL_DEVICE) * SAMPLE_STRIDE
    expected = sr_pair_words(hi, lo, fmt, sample_words(hi.shape[1:], key, bases, 5)).to(dtype)
    seed = seed_tensor(key, "seed", a.device)
    found = sample_binary_triton(op, a, wide_other if scalar else b, dtype, fmt, seed, bases, 5)
    assert found.dtype == dtype
    assert torch.equal(bits(found), bits(expected))


@pytest.mark.parametrize(
    "program", ["scalars_and_tensors", "in_place", "reductions", "muller", "two_dtypes"]
)
def test_binary_ops_on_the_kernels_route_are_one_launch_and_the_serial_runs(program, monkeypatch):
    """On the route a CUDA tensor takes (a GPU's, else `cpu_as_cuda` under the interpreter),
    the binary ops go to the binary kernel, and the samples are still the serial runs'
    (two_dtypes: each dtype's format read for it, not the first dtype's reused)."""
    from stochround.kernels import sample_pair
    from stochround.kernels.availability import cpu_as_cuda

    fn, args = KERNEL_PROGRAMS[program]
    args = tuple(a.to(KERNEL_DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    route = contextlib.nullcontext() if KERNEL_DEVICE == "cuda" else cpu_as_cuda()
    expected = mca(fn, *args, n=3, seed=5, batched=False)
    launched = []
    binary = sample_pair.sample_binary_triton

    def counted(op, *rest):
        launched.append(op)
        return binary(op, *rest)

    monkeypatch.setattr(sample_pair, "sample_binary_triton", counted)
    with route:
        found = mca(fn, *args, n=3, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(found.samples, expected.samples, strict=True))
    assert launched
