"""Monte Carlo arithmetic (`arith/montecarlo.py`): significant digits of well and ill
conditioned computations, the std == 0 convention, and its argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from stochround import arith


def _terms(rows: int, length: int, seed: int) -> torch.Tensor:
    """fp32 terms of both signs and spread magnitudes (cancellation, several binades)."""
    generator = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-3, 3, (rows, length), generator=generator)
    return torch.randn(rows, length, generator=generator) * scale


def test_monte_carlo_digits_well_vs_ill_conditioned():
    """(1 + 1e-3) rounded with SR to bf16 (ulp 2**-7 at 1) is 1 or 1 + 2**-7, away with
    probability p = 0.128, so std = 2**-7 sqrt(p (1 - p)) = 2.6e-3.  Times 2 (well
    conditioned): std / mean = 2.6e-3, digits = 2.58.  Minus 1 (cancellation): the mean is
    1e-3 < std, digits = -log10(2.6) < 0, clamped to 0.  Sample std of 200 Bernoulli
    samples (kurtosis 6): relative sd ~ sqrt((6 - 1) / 200) / 2 = 8%, so 4 sd is 32%, i.e.
    0.12 digits; the bounds below allow 0.3."""
    one = torch.tensor(1.001, dtype=torch.float32)
    well = arith.monte_carlo(lambda v, rounding: rounding(v) * 2, one, n=200, fmt="bf16")
    ill = arith.monte_carlo(lambda v, rounding: rounding(v) - 1, one, n=200, fmt="bf16")
    assert well.samples.shape == (200,)
    assert 2.28 < float(well.digits) < 2.88
    assert float(ill.digits) < 0.5
    again = arith.monte_carlo(lambda v, rounding: rounding(v) * 2, one, n=200, fmt="bf16")
    assert torch.equal(well.samples, again.samples)


def test_monte_carlo_std_zero_convention_and_tensor_results():
    x = _terms(1, 16, seed=13)[0]

    def reduce(values, rounding, scale):
        return rounding(values * scale)

    exact_in_format = arith.monte_carlo(reduce, x.to(torch.bfloat16).float(), fmt="bf16", scale=2)
    assert torch.all(exact_in_format.std == 0)
    assert torch.allclose(
        exact_in_format.digits, torch.tensor(8 * math.log10(2), dtype=torch.float64)
    )
    deterministic = arith.monte_carlo(reduce, x, n=4, fmt="bf16", mode="rne", scale=3)
    assert torch.all(deterministic.std == 0)
    sr_sum = arith.monte_carlo(
        lambda v, rounding: arith.sum(rounding(v), "fp16", "rne"), x, n=8, fmt="bf16"
    )
    assert sr_sum.samples.shape == (8,) and float(sr_sum.std) > 0


def test_gradients_pass_through_the_samples_and_their_statistics():
    """The samples of a computation built of `round` and `sr.ops` carry the exact
    computation's gradient (straight through every rounding): d mean / dv = 3 for
    sum(round(3 v)); the old `sum` gave 0.  The digits estimate requires none."""
    v = _terms(1, 16, seed=3)[0].requires_grad_()
    result = arith.monte_carlo(
        lambda x, rounding: arith.sum(rounding(3 * x), "fp16", "sr", seed=1), v, n=4, fmt="bf16"
    )
    (gradient,) = torch.autograd.grad(result.mean, (v,))
    assert torch.equal(gradient, torch.full((16,), 3.0))
    assert result.std.requires_grad and not result.digits.requires_grad


def test_bad_arguments_raise_value_error_naming_them():
    with pytest.raises(ValueError, match="n must"):
        arith.monte_carlo(lambda rounding: 0.0, n=1, fmt="bf16")
