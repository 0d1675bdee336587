"""Monte Carlo arithmetic on unmodified code (`emulate/mca.py`): the digits of a
well-conditioned sum and of a catastrophic cancellation (against the exact answer in
Fractions), the trace that points at the cancelling line, seeds, the outputs' flattening,
the virtual precision's formats, and the argument checks."""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import pytest
import torch

from stochround import arith
from stochround.emulate import Emulation
from stochround.emulate.mca import (
    MAX_PRECISION,
    SAMPLE_STRIDE,
    mca,
    significant_digits,
    virtual_precision,
)
from stochround.formats import Format, floor_log2

LOG10_2 = math.log10(2)


def looped_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum as a loop of additions: one rounding per addition under an emulation."""
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def naive_variance(x: torch.Tensor) -> torch.Tensor:
    """The textbook one-pass variance E[x^2] - E[x]^2, which cancels for a large mean."""
    mean_of_squares = (x * x).mean()
    square_of_mean = x.mean() ** 2
    return mean_of_squares - square_of_mean


def line_of(function, text: str) -> int:
    """The line number of the first line of ``function`` holding ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def large_mean_data() -> torch.Tensor:
    """64 float64 values 1000 + k/4, k integer in [-16, 16]: x^2 (< 2**20, on a 2**-4 grid)
    has 24 bits and sum(x^2) 30, so at a virtual precision of 24 bits x * x is exact and the
    float64 sums, the division by 64 and mean ** 2 are exact before their rounding."""
    generator = torch.Generator().manual_seed(3)
    k = torch.randint(-16, 17, (64,), generator=generator)
    return 1000 + k.to(torch.float64) / 4


def test_a_well_conditioned_sum_keeps_about_p_log10_2_digits():
    """16 fp32 values in [1, 2) with 12 significant bits, summed by a loop at a virtual
    precision of t = 11 bits.  Each fp32 addition is exact (17 bits at most), then SR adds
    an error of mean 0 given the past and variance <= ulp^2 / 4; the errors are uncorrelated,
    so Var(S) <= 15 ulp(S)^2 / 4 with ulp(S) <= 2^(1-t) S (partial sums <= S): the relative
    std is <= sqrt(15) 2^-t, digits >= t log10 2 - log10 sqrt(15).  The sample std of
    n = 32 samples exceeds twice the std with negligible probability (for Gaussian
    samples P(chi2_31 > 124) < 1e-12): digits >= t log10 2 - log10(2 sqrt(15)), and at most
    t log10 2 (the clamp).  The mean is unbiased: within 4 std / sqrt(n) of the exact sum."""
    generator = torch.Generator().manual_seed(0)
    values = 1 + torch.randint(0, 2**11, (16,), generator=generator).float() / 2**11
    result = mca(looped_sum, values, n=32, precision=11, seed=0)
    max_digits = 11 * LOG10_2
    digits = float(result.digits[0])
    assert max_digits - math.log10(2 * math.sqrt(15)) <= digits <= max_digits
    exact = math.fsum(values.tolist())
    std_bound = math.sqrt(15) * 2.0**-11 * exact
    assert abs(float(result.mean[0]) - exact) <= 4 * std_bound / math.sqrt(32)
    assert result.samples[0].shape == (32,)
    assert result.formats[torch.float32] == Format(ebits=8, mbits=10)


def test_the_naive_variance_reports_the_digits_actually_lost():
    """At t = 24 bits (7.2 digits) E[x^2] and E[x]^2 (about 1e6) are rounded once each, the
    difference (about 5.9) is exact (Sterbenz): the result's error is the two roundings',
    about 1e6 * 2^-24 / 5.9, so about 5 digits are lost.  Two checks against Fractions:

    - the error actually made: rms = sqrt(mean((sample - exact)^2)), whose digits
      -log10(rms / exact) MCA's -log10(std / |mean|) estimates: rms^2 = (n-1)/n std^2 +
      (mean - exact)^2, and the unbiased mean's error is within 4 sd (std^2 16 / n, with the
      sample std above half the true one) so log10(rms / std) is in [-0.01, 0.24]; |mean|
      and exact differ by far less than 1%;
    - the error predicted: the two rounded values are exact rationals v, SR's variance is
      ulp(v)^2 nu (1 - nu) with nu the fraction of an ulp rounded away, so the true std and
      digits are exact; the sample std of 32 samples of a sum of two independent two-valued
      variables (kurtosis <= 3) is within 4 sd (relative sd <= sqrt(2 / (4 * 32)) = 0.125) of
      it, i.e. within 0.3 digits."""
    x = large_mean_data()
    result = mca(naive_variance, x, n=32, precision=24, seed=0)
    values = [Fraction(v) for v in x.tolist()]
    mean_of_squares = sum(v * v for v in values) / len(values)
    square_of_mean = (sum(values) / len(values)) ** 2
    exact = mean_of_squares - square_of_mean
    digits = float(result.digits[0])
    assert 24 * LOG10_2 - digits > 4  # catastrophic: more than 4 of 7.2 digits lost

    errors = [Fraction(s) - exact for s in result.samples[0].tolist()]
    rms = math.sqrt(float(sum(e * e for e in errors) / len(errors)))
    actual_digits = -math.log10(rms / float(exact))
    assert -0.01 <= digits - actual_digits <= 0.25

    variance = 0.0
    for rounded in (mean_of_squares, square_of_mean):
        ulp = Fraction(2) ** (floor_log2(rounded) - 23)
        nu = rounded / ulp - math.floor(rounded / ulp)
        variance += float(ulp**2 * nu * (1 - nu))
    predicted_digits = -math.log10(math.sqrt(variance) / float(exact))
    assert abs(digits - predicted_digits) <= 0.3


def test_the_trace_points_at_the_cancelling_line():
    """The subtraction's line keeps the fewest digits; the lines before it keep (nearly) all
    7.2: each of their outputs is exact or one rounding of a value much larger than its
    error."""
    result = mca(naive_variance, large_mean_data(), n=32, precision=24, seed=0, trace=True)
    here = __file__
    cancelling = line_of(naive_variance, "mean_of_squares - square_of_mean")
    assert result.sites[0].site == f"{here}:{cancelling} naive_variance"
    assert result.sites[0].calls == 1
    # the trace's running (Welford) moments vs the outputs' two-pass ones: rounding apart
    assert result.sites[0].digits == pytest.approx(float(result.digits[0]), rel=1e-12)
    others = {site.site: site for site in result.sites[1:]}
    squares = line_of(naive_variance, "(x * x).mean()")
    mean = line_of(naive_variance, "x.mean() ** 2")
    assert set(others) == {f"{here}:{squares} naive_variance", f"{here}:{mean} naive_variance"}
    # x * x and mean(): two calls on each line
    assert [others[f"{here}:{line} naive_variance"].calls for line in (squares, mean)] == [2, 2]
    assert all(site.digits > 6 for site in others.values())


def test_mca_is_reproducible_from_its_seed_and_run_0_is_one_emulated_run():
    """One stream for the n runs: the same seed gives the same samples bit for bit, another
    seed others; run 0 draws offsets 0, 1, ... of the seed, as the emulation alone does
    (each op from its exact result: compute="float64" and the float64 ops' residuals), and
    run j's counter starts at j SAMPLE_STRIDE (batched and serial alike)."""
    x = large_mean_data()
    first = mca(naive_variance, x, n=8, precision=24, seed=5)
    again = mca(naive_variance, x, n=8, precision=24, seed=5)
    other = mca(naive_variance, x, n=8, precision=24, seed=6)
    assert torch.equal(first.samples[0], again.samples[0])
    assert not torch.equal(first.samples[0], other.samples[0])
    emulation = Emulation(virtual_precision(24), "sr", seed=5, compute="float64", residuals=True)
    serial = mca(naive_variance, x, n=8, precision=24, seed=5, batched=False)
    assert torch.equal(first.samples[0], serial.samples[0])
    for run in range(2):
        emulation.calls = run * SAMPLE_STRIDE
        with emulation:
            sample = naive_variance(x)
        assert sample.item() == first.samples[0][run].item()


def test_outputs_are_flattened_in_order_with_their_labels():
    """A dict of a tensor, a tuple and a Python number; an output tensor reused by every run
    (written in place) is copied after each run, not read at the end (the serial runs: a
    batched run cannot write into a tensor made outside it, tests/emulate/
    test_mca_batched.py)."""
    x = torch.tensor([1.0, 2.0**-12, 3.0])
    buffer = torch.zeros(3)

    def program(x: torch.Tensor) -> dict[str, object]:
        buffer.copy_(x * 1.1)
        return {"sum": x.sum(), "parts": (buffer, None, 2.5), "n": 3}

    result = mca(program, x, n=4, precision=8, seed=0, batched=False)
    assert result.labels == ("['sum']", "['parts'][0]", "['parts'][2]", "['n']")
    assert [s.shape for s in result.samples] == [(4,), (4, 3), (4,), (4,)]
    assert [s.dtype for s in result.samples] == [torch.float64] * 4
    runs = result.samples[1]
    assert any(not torch.equal(runs[0], run) for run in runs[1:])  # SR at 8 bits
    # numbers agree in every run (std 0): a float is a float64 value (8 bits at t = 8), an
    # int no rounding touches: exact, inf digits
    assert float(result.digits[2]) == 8 * LOG10_2
    assert float(result.digits[3]) == math.inf
    single = mca(lambda v: v * 3, x, n=2, fmt="bfloat16", mode="rne")
    assert single.labels == ("result",)


@pytest.mark.parametrize(
    ("options", "precision"),
    [({"precision": 11}, 11), ({"fmt": "bfloat16"}, 8), ({"fmt": {torch.float32: "e4m3fn"}}, 4)],
)
def test_a_deterministic_mode_keeps_the_formats_full_digits(options, precision):
    """Under rne every run gives the same bits: std 0, digits p log10 2 of the format the
    output's dtype was rounded to."""
    x = torch.linspace(0.1, 2.0, 5)
    result = mca(lambda v: (v * 1.3).exp(), x, n=3, mode="rne", **options)
    assert torch.equal(result.std[0], torch.zeros(5, dtype=torch.float64))
    expected = torch.full((5,), precision * LOG10_2, dtype=torch.float64)
    assert torch.equal(result.digits[0], expected)


def test_significant_digits_is_the_definition_monte_carlo_uses():
    x = torch.tensor([1.001, -3.0001, 0.0, 1e-3])
    result = arith.monte_carlo(lambda v, rounding: rounding(v) * 2 - 2, x, n=16, fmt="bf16")
    assert torch.equal(significant_digits(result.mean, result.std, 8), result.digits)
    special = significant_digits(
        torch.tensor([0.0, 1.0, math.nan], dtype=torch.float64),
        torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64),
        11,
    )
    assert special[0].item() == 0.0 and special[1].item() == 11 * LOG10_2
    assert math.isnan(special[2].item())


def test_virtual_precision_keeps_each_dtypes_exponent_range():
    formats = virtual_precision(11)
    assert formats == {
        torch.float64: Format(ebits=11, mbits=10),
        torch.float32: Format(ebits=8, mbits=10),
        torch.float16: Format(ebits=5, mbits=10),
    }
    assert formats[torch.float32].emin == -126 and formats[torch.float64].emin == -1022
    assert list(virtual_precision(MAX_PRECISION)) == [torch.float64]
    assert virtual_precision(1)[torch.bfloat16] == Format(ebits=8, mbits=0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: virtual_precision(0), ValueError, "precision must be an int in 1..53"),
        (lambda: virtual_precision(54), ValueError, "precision must be an int in 1..53"),
        (lambda: virtual_precision(True), TypeError, "precision must be an int"),
        (
            lambda: mca(torch.neg, torch.ones(1), precision=8, fmt="bf16"),
            ValueError,
            "at most one of precision",
        ),
        (
            lambda: mca(torch.neg, torch.ones(1), mca_mode="full"),
            ValueError,
            "mca_mode must be one of 'rr', 'pb', 'mca'; got 'full'",
        ),
        (
            lambda: mca(torch.neg, torch.ones(1), estimator="t"),
            ValueError,
            r"estimator must be one of \('plain', 'cnh', 'bernoulli'\); got 't'",
        ),
        (
            lambda: mca(torch.neg, torch.ones(1), estimator="cnh", probability=1.0),
            ValueError,
            r"probability must be a float in \(0, 1\)",
        ),
        (
            lambda: mca(torch.neg, torch.ones(1), n=8, estimator="bernoulli"),
            ValueError,
            r"needs n >= 299 samples; got n=8",
        ),
        (lambda: mca(torch.neg, torch.ones(1), n=1, precision=8), ValueError, "n must be"),
        (lambda: mca(torch.neg, torch.ones(1), n=True, precision=8), ValueError, "n must be"),
        (lambda: mca(torch.neg, torch.ones(1), precision=8, seed=-1), ValueError, "seed"),
        (lambda: mca(torch.neg, torch.ones(1), precision=8, seed=1.5), TypeError, "seed"),
        (lambda: mca(torch.neg, torch.ones(1), precision=8, mode="up"), ValueError, "mode"),
        (lambda: mca(torch.neg, torch.ones(1), precision=8, trace=1), TypeError, "trace"),
        (lambda: mca(3, precision=8), TypeError, "fn must be callable"),
        (
            lambda: mca(lambda: "text", precision=8),
            TypeError,
            r"^fn returned str; mca needs a tensor, a Python number \(bool, int, float\), "
            "None, or tuples, lists and dicts of them$",
        ),
        (
            lambda: mca(lambda: {"a": [torch.ones(1), b"x"]}, precision=8),
            TypeError,
            r"^fn returned bytes at \['a'\]\[1\]; mca needs a tensor",
        ),
        (
            lambda: mca(sorted, [object()], precision=8),
            TypeError,
            r"^sorted\(\) returned object at \[0\]; ",
        ),
        (lambda: mca(torch.neg, torch.ones(1), fmt="e9m9"), ValueError, "unknown format"),
    ],
)
def test_bad_arguments_raise_errors_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_samples_carry_the_exact_gradient_straight_through_the_roundings():
    """As `arith.monte_carlo`'s: d mean / dv of sum(3 v) is 3 for every element, whatever
    the roundings did to the values (the serial runs: the batched samples carry none)."""
    v = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    with pytest.raises(ValueError, match=r"^batched=True gives samples without a gradient"):
        mca(lambda t: (t * 3).sum(), v, n=4, precision=8, seed=0)
    result = mca(lambda t: (t * 3).sum(), v, n=4, precision=8, seed=0, batched=False)
    result.mean[0].backward()
    assert torch.equal(v.grad, torch.full((3,), 3.0))


def test_a_module_call_is_attributed_to_the_line_that_calls_it():
    """The frames inside torch.nn are skipped: Linear's addmm and the sum share the line
    (the transpose of the weight is a view: not rounded, not a call)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)

    def program(x: torch.Tensor) -> torch.Tensor:
        return model(x).sum()

    result = mca(program, torch.randn(3, 4), n=2, precision=8, trace=True)
    line = line_of(program, "model(x).sum()")
    assert [(site.site, site.calls) for site in result.sites] == [(f"{__file__}:{line} program", 2)]


def test_integer_and_bool_outputs_are_exact_where_every_run_agrees():
    """No rounding touches an integer or bool output: where every run gives the same value
    its digits are inf (not float64's 15.95); one computed from rounded floats can still
    vary (a count of values above a threshold), and then has -log10(std / |mean|) digits,
    not clamped to a float format's p log10 2."""
    x = torch.linspace(0, 1, 100)

    def program() -> tuple[object, ...]:
        y = x * 3.3
        return (y > 1.65).sum(), (y >= 0).sum(), torch.ones(3) > 0, 7, False

    result = mca(program, n=8, precision=4, seed=0)
    count, total, flags, seven, false = result.digits
    assert math.isfinite(float(count))  # at 4 bits, values near 1.65 cross it at random
    std, mean = result.std[0], result.mean[0]
    assert float(count) == float(-torch.log10(std / mean.abs()))  # torch's log10, as computed
    assert float(total) == math.inf  # every value stays >= 0 in every run
    assert torch.equal(flags, torch.full((3,), math.inf, dtype=torch.float64))
    assert float(seven) == math.inf and float(false) == math.inf  # std 0, whatever the mean
    assert significant_digits(
        torch.tensor([5.0, 0.0, 10.0]), torch.tensor([0.0, 1.0, 1e-20]), None
    ).tolist() == [math.inf, 0.0, 21.0]


def test_results_that_change_shape_between_runs_are_a_runtime_error():
    """A list that grows, or a tensor whose shape changes (not torch.stack's error): the
    serial runs (a batched run is one run)."""
    sizes = iter(range(1, 10))

    def grows() -> list[float]:
        return [0.5] * next(sizes)

    def reshapes() -> torch.Tensor:
        return torch.ones(next(sizes))

    for fn in (grows, reshapes):
        with pytest.raises(RuntimeError, match=rf"^{fn.__name__}\(\) returned results of "):
            mca(fn, n=3, precision=8, batched=False)
