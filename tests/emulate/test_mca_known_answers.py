"""Monte Carlo arithmetic against answers known from numerical analysis (issue 43): at the
dtype's own precision (Verificarlo's defaults, t = 24 for float32 and 53 for float64)
`mca` perturbs each op's exact result, so the digits it reports are those the program
really keeps."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from helpers import kahan_sum, muller_values

from stochround.emulate import Emulation
from stochround.emulate.exact import sr_pair, two_prod, two_sum
from stochround.emulate.mca import mca, virtual_precision
from stochround.emulate.mca_digits import (
    bernoulli_samples,
    chi2_quantile,
    cnh_correction,
    estimated_digits,
)
from stochround.rounding import round as sr_round

FLOAT32_DIGITS = 24 * math.log10(2)


def naive_var(v: torch.Tensor) -> torch.Tensor:
    return (v * v).mean() - v.mean() ** 2


def two_pass_var(v: torch.Tensor) -> torch.Tensor:
    d = v - v.mean()
    return (d * d).mean()


@pytest.fixture
def shifted() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1000, generator=g) + 1e4


def test_naive_variance_in_float32_keeps_no_digits_at_t24(shifted):
    # the case: mean(v*v) ~ 1e8 and the variance ~ 1: the float32 result (-8.0
    # with round to nearest) has no correct digit; before, t = 24 perturbed nothing
    # (std 0, 7.22 digits)
    result = mca(naive_var, shifted, n=16, seed=1)
    assert result.formats[torch.float32].precision == 24
    assert float(result.digits[0]) < 3
    assert float(result.std[0]) > 0.5


def test_two_pass_variance_in_float32_keeps_more_than_5_digits(shifted):
    result = mca(two_pass_var, shifted, n=16, seed=1)
    assert float(result.digits[0]) > 5
    assert abs(float(result.mean[0]) - float(shifted.double().var(correction=0))) < 1e-4


def test_naive_variance_in_float64_loses_the_cancelled_digits(shifted):
    # 16 digits, less log10(1e8 / 1) = 8 cancelled: about 8 left; the float64 ops' residuals
    # (TwoSum, TwoProd, the sums' pairwise TwoSum) are all seen: no op left unperturbed
    result = mca(naive_var, shifted.double(), n=16, seed=1)
    assert result.formats[torch.float64].precision == 53
    assert result.no_residual == ()
    assert 6.5 < float(result.digits[0]) < 9


def _naive_sum(x: torch.Tensor) -> torch.Tensor:
    s = torch.zeros((), dtype=x.dtype)
    for term in x:
        s = s + term
    return s


def test_kahan_summation_keeps_more_digits_than_naive_summation():
    # 1e4 then 99 terms in [0, 0.1): each naive addition rounds at ulp(1e4) = 2**-10, a
    # random walk of ~1e-2 on ~1e4 (about 6 digits); Kahan's compensation keeps float32's
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor([1e4]), torch.rand(99, generator=g) * 0.1])
    naive = float(mca(_naive_sum, x, n=16, seed=2).digits[0])
    kahan = float(mca(kahan_sum, x, n=16, seed=2).digits[0])
    assert naive < 6.8
    assert kahan > FLOAT32_DIGITS - 0.5
    assert kahan - naive > 0.5


def test_muller_recurrence_in_float64_collapses_at_the_predicted_step():
    """u_{k+1} = 111 - 1130/u_k + 3000/(u_k u_{k-1}), u0 = 2, u1 = -4 converges to 6 in
    exact arithmetic, but its general solution is (a 100^{k+1} + b 6^{k+1} + c 5^{k+1}) /
    (a 100^k + b 6^k + c 5^k) and u0, u1 give a = 0: any rounding error brings in the
    100^k term, which grows relative to the 6^k term by 100/6 a step, 1.22 digits.  From
    float64's ~16 digits at u2, the digits fall below 1 after about 16 / 1.22 ~ 13 steps:
    at u_14 .. u_17.  (Later the samples all converge to the attractive fixed point 100,
    and agree again: MCA measures spread, not distance to the exact 6.)"""
    result = mca(muller_values, 30, n=16, seed=3)
    assert result.no_residual == ()
    digits = result.digits[0].tolist()
    assert digits[0] > 15  # u_2 = 18.5 up to the last bits
    first_below_1 = next(k for k, d in enumerate(digits) if d < 1) + 2  # digits[0] is u_2
    assert 14 <= first_below_1 <= 17
    assert float(result.mean[0][-1]) == pytest.approx(100, abs=1e-6)


def _lu_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lu, pivots = torch.linalg.lu_factor(a)
    return torch.linalg.lu_solve(lu, pivots, b.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("seed", [4, 5])
def test_linear_solve_loses_log10_of_the_condition_number(seed):
    # Hilbert matrix of order 6, kappa ~ 1.5e7: the LU factors rounded at t = 24 (a
    # backward error of ~2**-24) give a forward error of up to kappa 2**-24
    k = 6
    indices = torch.arange(k, dtype=torch.float64)
    hilbert = 1 / (indices[:, None] + indices[None, :] + 1)
    kappa = float(torch.linalg.cond(hilbert))
    b = (hilbert @ torch.ones(k, dtype=torch.float64)).float()
    result = mca(_lu_solve, hilbert.float(), b, n=16, seed=seed)
    lost = FLOAT32_DIGITS - float(result.digits[0].min())
    assert abs(lost - math.log10(kappa)) <= 1.5


def test_sr_pair_rounds_to_the_neighbour_with_the_residuals_probability():
    # 1 + 2**-54 is a quarter of float64's ulp above 1: it rounds up in a quarter of the
    # draws, which round-to-nearest (the float64 op) never does
    count = 1 << 14
    hi = torch.ones(count, dtype=torch.float64)
    lo = torch.full((count,), 2.0**-54, dtype=torch.float64)
    rounded = sr_pair(hi, lo, virtual_precision(53)[torch.float64], key=7, offset=0)
    assert set(rounded.tolist()) == {1.0, 1.0 + 2.0**-52}
    assert abs(float((rounded > 1).double().mean()) - 0.25) < 0.02
    # below a power of two the gap is 2**-53: 1 - 2**-54 is half a gap below 1
    down = sr_pair(hi, -lo, virtual_precision(53)[torch.float64], key=7, offset=1)
    assert set(down.tolist()) == {1.0, 1.0 - 2.0**-53}
    assert abs(float((down < 1).double().mean()) - 0.5) < 0.02


def test_error_free_transformations_are_exact():
    a = torch.tensor([1.0, 0.1, 3.0], dtype=torch.float64)
    b = torch.tensor([2.0**-60, 0.2, 1 / 3], dtype=torch.float64)
    s, e = two_sum(a, b)
    p, f = two_prod(a, b)
    for i in range(3):
        x, y = a[i].item(), b[i].item()
        assert Fraction(s[i].item()) + Fraction(e[i].item()) == Fraction(x) + Fraction(y)
        assert Fraction(p[i].item()) + Fraction(f[i].item()) == Fraction(x) * Fraction(y)


def test_estimators_follow_sohier_et_al():
    # chi-square quantiles (tables: chi2_{0.025}(15) = 6.262, median of chi2(1) = 0.4549)
    assert chi2_quantile(0.025, 15) == pytest.approx(6.2621, abs=1e-4)
    assert chi2_quantile(0.5, 1) == pytest.approx(0.45494, abs=1e-5)
    # CNH, n = 16, p = 0.99, 1 - alpha = 0.95: log10(sqrt(15 / 6.2621)) + log10(2.5758)
    assert cnh_correction(16, 0.99, 0.95) == pytest.approx(
        0.5 * math.log10(15 / 6.2621) + math.log10(2.5758), abs=1e-4
    )
    # Bernoulli: p**n <= alpha, n = ceil(ln 0.05 / ln 0.9) = 29
    assert bernoulli_samples(0.9, 0.95) == 29
    samples = torch.tensor([[1.0], [1.001], [0.999]], dtype=torch.float64).repeat(10, 1)
    plain = float(estimated_digits(samples, 53))
    cnh = float(estimated_digits(samples, 53, "cnh"))
    assert cnh == pytest.approx(plain - cnh_correction(30, 0.99, 0.95))
    bernoulli = float(estimated_digits(samples, 53, "bernoulli", probability=0.9))
    assert bernoulli == pytest.approx(3.0, abs=1e-6)  # every sample within 1e-3 of 1


def test_mca_reports_the_estimator_and_modes(shifted):
    result = mca(naive_var, shifted, n=16, seed=1, estimator="cnh", mca_mode="mca")
    assert (result.estimator, result.mca_mode) == ("cnh", "mca")
    plain = mca(naive_var, shifted, n=16, seed=1, mca_mode="mca")
    assert torch.equal(plain.samples[0], result.samples[0])
    # precision bounding at float32's own 24 bits rounds float32 inputs to themselves:
    # nothing is perturbed, as in Verificarlo's pb mode at t = 24
    bounded = mca(naive_var, shifted, n=4, seed=1, mca_mode="pb")
    assert float(bounded.std[0]) == 0
    assert float(mca(naive_var, shifted, n=8, seed=1, mca_mode="pb", precision=20).std[0]) > 1


def test_float64_ops_without_an_exact_result_are_reported_at_53_bits():
    ones = torch.ones(2, dtype=torch.float64)
    assert mca(torch.exp, ones, n=2).no_residual == ("aten.exp.default",)
    # alpha != 1 is two roundings natively: not covered, reported
    assert mca(lambda x: torch.add(x, x, alpha=3), ones, n=2).no_residual == ("aten.add.Tensor",)
    # below 53 bits the float64 result's own rounding is a small part of the perturbation
    assert mca(torch.exp, ones, n=2, precision=40).no_residual == ()
    # negation is exact
    assert mca(torch.neg, ones, n=2).no_residual == ()


def test_residuals_need_float64_compute_and_sr():
    with pytest.raises(
        ValueError, match=r"residuals=True .* needs compute='float64' and mode='sr'"
    ):
        Emulation("float32", "sr", residuals=True)
    with pytest.raises(ValueError, match="got compute='float64', mode='rne'"):
        Emulation("float32", "rne", compute="float64", residuals=True)
    with pytest.raises(TypeError, match="round_outputs must be a bool; got 1"):
        Emulation("float32", "sr", round_outputs=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", [24, 11, 53])
def test_sr_pair_of_a_single_value_is_the_cores_sr_bit_for_bit(precision):
    # lo = 0: the pair's rounding is the rounding contract's exact SR (same words, same
    # count), subnormals and overflow included
    g = torch.Generator().manual_seed(precision)
    magnitudes = torch.exp2(torch.randint(-160, 140, (4096,), generator=g).double())
    x = torch.randn(4096, generator=g, dtype=torch.float64) * magnitudes
    x = torch.cat([x, torch.tensor([0.0, -0.0, 2.0**-149, 3.5e38, -1e39, math.inf])])
    target = virtual_precision(precision)[torch.float32 if precision <= 24 else torch.float64]
    expected = sr_round(x, target, "sr", seed=11, offset=3)
    assert torch.equal(sr_pair(x, torch.zeros_like(x), target, key=11, offset=3), expected)


def test_in_place_float64_ops_see_their_residual():
    # s += 0.1 ten times and y *= 3; y /= 7: the in-place ops are rounded from their exact
    # result (the arguments read before the op overwrites one), so at 53 bits the runs
    # spread, and no op is left unperturbed
    def accumulate(x: torch.Tensor) -> torch.Tensor:
        s = torch.zeros((), dtype=x.dtype)
        for term in x:
            s += term
        y = x.clone()
        y.mul_(3.0)
        y.div_(7.0)
        return torch.cat([s.reshape(1), y])

    result = mca(accumulate, torch.full((10,), 0.1, dtype=torch.float64), n=8, seed=0)
    assert result.no_residual == ()
    assert bool((result.std[0] > 0).all())
