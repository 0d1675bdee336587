"""Significant decimal digits of Monte Carlo samples: the plain estimate
``-log10(std / |mean|)`` (Parker 1997) and the two estimators of Sohier et al.,
'Confidence intervals for stochastic arithmetic' (ACM TOMS 47(2), 2021), that hold with a
probability and a confidence: Centered Normal (CNH) and Bernoulli.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

ESTIMATORS = ("plain", "cnh", "bernoulli")


def significant_digits(mean: Tensor, std: Tensor, precision: int | None) -> Tensor:
    """Significant decimal digits of samples with this mean and std, elementwise (Parker
    1997): ``-log10(std / |mean|)``, clamped to ``[0, p log10 2]`` with ``p = precision``;
    std == 0 (every sample agrees) gives ``p log10 2``, mean == 0 with std > 0 gives 0, NaN
    gives NaN.

    The definition `stochround.arith.montecarlo.monte_carlo` computes inline (it has no
    function of its own to import); the tests check the two agree.

    Args:
        mean: the samples' mean (a float tensor).
        std: their sample standard deviation, the shape of ``mean``.
        precision: the significant bits p of the format the samples were rounded to, or
            None for samples no rounding touched (integer and bool outputs): no upper
            clamp, and std == 0 gives inf (every run gave the same exact value).
    """
    max_digits = math.inf if precision is None else precision * math.log10(2)
    with torch.no_grad():
        ratio = std / mean.abs()
        digits = (-torch.log10(ratio)).clamp(min=0)
        if precision is not None:
            digits = digits.clamp(max=max_digits)
        return torch.where(std == 0, max_digits, digits)


def fewest_digits(mean: Tensor, std: Tensor, lengths: Sequence[int]) -> Tensor:
    """Per run of ``lengths[k]`` consecutive elements of ``mean`` and ``std`` (1-d, float,
    ``sum(lengths)`` long), the fewest of their unclamped `significant_digits` (precision
    None: inf where std == 0), NaN where any of them is NaN.  Returns ``len(lengths)``
    values on their device, nothing read back to the host.

    The run index of each element goes to the device once (from pinned memory on CUDA:
    no wait for the device); the minimum is a scatter ``amin``, exact in any order."""
    count = len(lengths)
    with torch.no_grad():
        digits = significant_digits(mean, std, None)
        # NaN as -inf, which no digit is otherwise (they are clamped at 0): amin then
        # keeps it whatever its NaN convention
        digits = digits.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        runs = torch.repeat_interleave(
            torch.arange(count, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int64)
        )
        if digits.device.type == "cuda":
            runs = runs.pin_memory().to(digits.device, non_blocking=True)
        else:
            runs = runs.to(digits.device)
        fewest = torch.full((count,), math.inf, dtype=digits.dtype, device=digits.device)
        fewest.scatter_reduce_(0, runs, digits, "amin")
        return fewest.masked_fill(fewest == -math.inf, math.nan)


def chi2_quantile(q: float, dof: int) -> float:
    """The q-quantile of the chi-square law with ``dof`` degrees of freedom: the x with
    ``P(dof/2, x/2) = q`` (P the regularized lower incomplete gamma function,
    `torch.special.gammainc`), found by bisection in float64 to the last bit."""
    k = torch.tensor(dof / 2, dtype=torch.float64)
    low, high = 0.0, float(dof)
    while float(torch.special.gammainc(k, torch.tensor(high / 2, dtype=torch.float64))) < q:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        below = float(torch.special.gammainc(k, torch.tensor(middle / 2, dtype=torch.float64)))
        low, high = (middle, high) if below < q else (low, middle)
    return high


def cnh_correction(n: int, probability: float, confidence: float) -> float:
    """Digits the CNH estimator takes off the plain estimate for n samples:
    ``log10(sqrt((n - 1) / chi2_{alpha/2}(n - 1))) + log10(Phi^{-1}((1 + p) / 2))``,
    alpha = 1 - confidence: with that confidence the true std is at most
    ``sqrt((n - 1) / chi2_{alpha/2}) std_hat``, and a normal sample lies within
    ``Phi^{-1}((1 + p) / 2)`` stds of its mean with probability p."""
    alpha = 1 - confidence
    bound = math.sqrt((n - 1) / chi2_quantile(alpha / 2, n - 1))
    quantile = float(torch.special.ndtri(torch.tensor((1 + probability) / 2, dtype=torch.float64)))
    return math.log10(bound) + math.log10(quantile)


def bernoulli_samples(probability: float, confidence: float) -> int:
    """The fewest samples for the Bernoulli estimator's statement, ``ceil(ln(alpha) /
    ln(p))``: if every one of n samples has s digits, then with confidence 1 - alpha a
    sample has them with probability at least p (p**n <= alpha)."""
    return math.ceil(math.log(1 - confidence) / math.log(probability))


def check_estimator(estimator: object, probability: object, confidence: object) -> str:
    """The estimator's name and its probability and confidence checked (ValueError or
    TypeError naming the argument and the allowed values)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {estimator!r}")
    for name, value in (("probability", probability), ("confidence", confidence)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a float in (0, 1); got {value!r}")
        if not 0 < value < 1:
            raise ValueError(f"{name} must be a float in (0, 1); got {value!r}")
    assert isinstance(estimator, str)
    return estimator


def estimated_digits(
    samples: Tensor,
    precision: int | None,
    estimator: str = "plain",
    probability: float = 0.99,
    confidence: float = 0.95,
) -> Tensor:
    """Significant digits of ``samples`` (shape ``(n, ...)``), elementwise, clamped to
    ``[0, p log10 2]`` as `significant_digits`:

    - "plain": ``-log10(std / |mean|)`` (`significant_digits`);
    - "cnh" (Centered Normal Hypothesis): plain minus `cnh_correction`: with confidence
      ``confidence``, a sample's relative error is below ``10**-s`` with probability
      ``probability``, if the samples are normal around the exact value;
    - "bernoulli": ``-log10(max_i |x_i - mean| / |mean|)``, the digits every sample shares
      with the mean (the reference); the statement with probability p and confidence
      1 - alpha holds for n >= `bernoulli_samples` (ValueError naming n otherwise).  No
      assumption on the samples' law.
    """
    estimator = check_estimator(estimator, probability, confidence)
    n = samples.shape[0]
    with torch.no_grad():
        mean = samples.mean(dim=0)
        std = samples.std(dim=0, correction=1)
        if estimator == "plain":
            return significant_digits(mean, std, precision)
        if estimator == "cnh":
            plain = significant_digits(mean, std, precision)
            corrected = (plain - cnh_correction(n, probability, confidence)).clamp(min=0)
            return torch.where(std == 0, plain, corrected)
        needed = bernoulli_samples(probability, confidence)
        if n < needed:
            raise ValueError(
                f"estimator='bernoulli' with probability={probability} and "
                f"confidence={confidence} needs n >= {needed} samples; got n={n}"
            )
        spread = (samples - mean).abs().amax(dim=0)
        return significant_digits(mean, spread, precision)


__all__ = [
    "ESTIMATORS",
    "bernoulli_samples",
    "chi2_quantile",
    "cnh_correction",
    "estimated_digits",
    "fewest_digits",
    "significant_digits",
]
