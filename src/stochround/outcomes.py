"""What rounding one value can give, exactly: every possible result with its probability,
their mean and bias, and each result's class and code in the format.

Built on the scalar reference, so every probability is an exact fraction.  A deterministic
mode has one outcome, of probability 1.  Stochastic rounding of a finite x with n random bits
rounds away from zero with probability

    P = away_probability(nu, n, variant) = count(nu 2**n) / 2**n

(nu: the discarded fraction of |x| in ulps; count: floor for variant a, half-up for b,
half-even for c, half-odd for odd), and toward zero with probability 1 - P.  It rounds away
exactly when count + r >= 2**n for its random integer r in [0, 2**n), so r = 0 gives the
toward-zero result whenever P < 1 and r = 2**n - 1 the away result whenever P > 0: the
reference evaluated at these two integers yields both outcomes.  Exact SR is n = 32.

An outcome is a format value after overflow handling, so two outcomes can be one value (both
saturate to max, say); such outcomes are merged and their probabilities added.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from . import reference
from .formats import Format
from .formats import format as find_format

Outcomes = list[tuple[float, Fraction]]
"""(result, probability) pairs: distinct format values whose probabilities sum to 1."""


def same_value(a: float, b: float) -> bool:
    """Equal as format values: NaN matches NaN, and -0.0 differs from 0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def outcomes(
    x: float,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
) -> Outcomes:
    """Every possible result of ``reference.round_value(x, fmt, mode, rbits=rbits,
    variant=variant, sat=sat, rand=r)`` over uniform r, with its exact probability.

    A deterministic mode, and SR of NaN or an infinity, has one outcome of probability 1.
    SR of a finite x has the toward-zero result with probability 1 - P and the away result
    with probability P = away_probability(nu, n, variant) (the module docstring says why
    r = 0 and r = 2**n - 1 give them); outcomes equal after overflow handling are merged.
    """
    fmt = find_format(fmt)
    if mode != "sr":
        return [(reference.round_value(x, fmt, mode, sat=sat), Fraction(1))]
    n = reference.check_rbits(rbits)
    if math.isnan(x) or math.isinf(x):
        return [(reference.round_value(x, fmt, "sr", rbits=rbits, sat=sat, rand=0), Fraction(1))]
    p_away = reference.away_probability(reference.discarded_fraction(x, fmt), n, variant)
    options: dict[str, Any] = {"rbits": rbits, "variant": variant, "sat": sat}
    drawn: Outcomes = []
    if p_away < 1:
        drawn.append((reference.round_value(x, fmt, "sr", rand=0, **options), 1 - p_away))
    if p_away > 0:
        drawn.append((reference.round_value(x, fmt, "sr", rand=2**n - 1, **options), p_away))
    merged: Outcomes = []
    for value, probability in drawn:
        for index, (seen, seen_probability) in enumerate(merged):
            if same_value(seen, value):
                merged[index] = (seen, seen_probability + probability)
                break
        else:
            merged.append((value, probability))
    return merged


def flushed(x: float, fmt: Format | str) -> Outcomes:
    """The one outcome of a unit that flushes x to zero: zero with x's sign where the format
    has a negative zero, +0 otherwise, with probability 1."""
    fmt = find_format(fmt)
    zero = math.copysign(0.0, x) if fmt.has_negative_zero else 0.0
    return [(zero, Fraction(1))]


def probability_of(value: float, distribution: Outcomes) -> Fraction:
    """P(result = value): the probability of the outcome equal to value (see `same_value`),
    0 where no outcome is."""
    return sum((p for v, p in distribution if same_value(v, value)), Fraction(0))


def mean(distribution: Outcomes) -> Fraction:
    """E[result] = sum of value * probability over the outcomes, exactly (finite values
    only: an infinite or NaN outcome has no exact mean and raises ValueError or
    OverflowError)."""
    return sum((Fraction(v) * p for v, p in distribution), Fraction(0))


def bias(x: float, distribution: Outcomes) -> Fraction:
    """E[result] - x, exactly: 0 for exact SR of an in-range x, which is unbiased."""
    return mean(distribution) - Fraction(x)


def value_class(value: float, fmt: Format | str) -> str:
    """The class of a format value: zero, subnormal (magnitude below the smallest normal),
    normal, inf or nan; every nonzero finite value of an integer grid (no exponent bits) is
    integer."""
    fmt = find_format(fmt)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "zero"
    if fmt.ebits == 0:
        return "integer"
    return "subnormal" if abs(value) < fmt.min_normal else "normal"


def code_of(value: float, fmt: Format | str) -> int | None:
    """The bit pattern of a format value (NaN: the canonical NaN code), or None for a NaN
    the format cannot encode (no NaN code) or an infinity it cannot encode (no infinities,
    or no sign bit for -inf)."""
    fmt = find_format(fmt)
    if math.isnan(value) and not fmt.has_nan:
        return None
    if math.isinf(value) and not (fmt.inf and (fmt.signed or value > 0)):
        return None
    return reference.encode_value(value, fmt)
