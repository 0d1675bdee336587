"""Tests for stochround.outcomes: the exact outcome distribution of rounding one value, its
mean and bias, and each result's class and code.

Probabilities are compared as fractions, and the SR distribution is checked against the
reference evaluated at every random integer r in [0, 2**n).
"""

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest

from stochround import outcomes, reference


def same_outcomes(actual: outcomes.Outcomes, expected: outcomes.Outcomes) -> bool:
    """Equal distributions: the same values (NaN equals NaN, zeros by sign) in the same
    order, with equal probabilities."""
    if len(actual) != len(expected):
        return False
    pairs = zip(actual, expected, strict=True)
    return all(outcomes.same_value(v, w) and p == q for (v, p), (w, q) in pairs)


def test_same_value_tells_signed_zeros_apart_and_matches_nan():
    assert outcomes.same_value(1.5, 1.5)
    assert outcomes.same_value(math.nan, math.nan)
    assert outcomes.same_value(-0.0, -0.0)
    assert not outcomes.same_value(0.0, -0.0)
    assert not outcomes.same_value(math.nan, 1.0)
    assert not outcomes.same_value(1.0, math.nan)
    assert not outcomes.same_value(math.inf, -math.inf)


def test_a_deterministic_mode_has_one_outcome_of_probability_one():
    assert same_outcomes(outcomes.outcomes(1.1, "bf16", "rne"), [(1.1015625, Fraction(1))])
    assert same_outcomes(outcomes.outcomes(1.1, "bf16", "rz"), [(1.09375, Fraction(1))])
    assert same_outcomes(
        outcomes.outcomes(1000.0, "e4m3fn", "rne", sat="finite"), [(448.0, Fraction(1))]
    )


def test_sr_splits_between_the_two_neighbours():
    # 1.0625 is halfway between 1.0 and 1.125 in e4m3fn: nu = 1/2, 8 bits represent it exactly
    assert same_outcomes(
        outcomes.outcomes(1.0625, "e4m3fn", "sr", rbits=8),
        [(1.0, Fraction(1, 2)), (1.125, Fraction(1, 2))],
    )
    # 1 + 3/8 ulp: exact SR rounds away with probability nu = 3/8 exactly
    assert same_outcomes(
        outcomes.outcomes(1.046875, "e4m3fn", "sr"),
        [(1.0, Fraction(5, 8)), (1.125, Fraction(3, 8))],
    )


def test_sr_of_a_negative_value_lists_toward_zero_first():
    # nu = 0.6 ulp of 0.5; variant a with 2 bits: P(away) = floor(0.6 * 4) / 4 = 1/2
    assert same_outcomes(
        outcomes.outcomes(-0.3, "e2m1", "sr", rbits=2, variant="a"),
        [(-0.0, Fraction(1, 2)), (-0.5, Fraction(1, 2))],
    )


def test_sr_probability_is_the_variant_closed_form():
    nu = reference.discarded_fraction(1.3, "e4m3fn")  # 2/5 of an ulp, up to the double's error
    assert abs(nu - Fraction(2, 5)) < Fraction(1, 2**40)
    # a: floor(nu 4) / 4 = 1/4; c: round_half_even(nu 4) / 4 = 2/4
    for variant, away in (("a", Fraction(1, 4)), ("c", Fraction(1, 2))):
        assert same_outcomes(
            outcomes.outcomes(1.3, "e4m3fn", "sr", rbits=2, variant=variant),
            [(1.25, 1 - away), (1.375, away)],
        )
    exact = outcomes.outcomes(1.3, "e4m3fn", "sr")
    assert exact[1][1] == reference.away_probability(nu, 32, "c")


def test_sr_with_a_certain_result_has_one_outcome():
    assert same_outcomes(outcomes.outcomes(1.5, "e4m3fn", "sr"), [(1.5, Fraction(1))])
    # nu is about 0.8: one bit, variant c: round_half_even(1.6) / 2 = 1, always away
    assert same_outcomes(
        outcomes.outcomes(1.1, "e4m3fn", "sr", rbits=1, variant="c"), [(1.125, Fraction(1))]
    )


def test_outcomes_equal_after_overflow_are_merged():
    # 460 = 448 + 0.375 * 32: away (480) is beyond max; 4 bits, variant c: P(away) = 6/16
    assert same_outcomes(
        outcomes.outcomes(460.0, "e4m3fn", "sr", rbits=4),
        [(448.0, Fraction(5, 8)), (math.nan, Fraction(3, 8))],
    )
    assert same_outcomes(
        outcomes.outcomes(460.0, "e4m3fn", "sr", rbits=4, sat="finite"), [(448.0, Fraction(1))]
    )


def test_sr_of_nan_and_infinities_has_one_outcome():
    assert same_outcomes(outcomes.outcomes(math.nan, "e4m3fn", "sr"), [(math.nan, Fraction(1))])
    assert same_outcomes(
        outcomes.outcomes(-math.inf, "e4m3fn", "sr", sat="finite"), [(-448.0, Fraction(1))]
    )
    assert same_outcomes(outcomes.outcomes(math.inf, "e5m2", "sr"), [(math.inf, Fraction(1))])


@pytest.mark.parametrize("name", ["e2m1", "e4m3fn", "e5m2fnuz", "p3109_k8p3ue", "int8"])
def test_sr_outcomes_are_the_reference_over_every_random_integer(name):
    """For n random bits, P(v) = #{r in [0, 2**n) : round_value(x, rand=r) = v} / 2**n."""
    values = [0.3, -0.3, 1.3, -2.7, 1e-3, 7.0, 300.0, -1e5, 0.0, -0.0]
    for x, rbits, variant, sat in itertools.product(
        values, (1, 2, 3), reference.VARIANTS, reference.SATURATIONS
    ):
        counts: Counter[tuple[str, float]] = Counter()
        for r in range(2**rbits):
            v = reference.round_value(x, name, "sr", rbits=rbits, variant=variant, sat=sat, rand=r)
            counts[("nan", 0.0) if math.isnan(v) else (repr(v), v)] += 1
        expected = {key: Fraction(count, 2**rbits) for key, count in counts.items()}
        got = outcomes.outcomes(x, name, "sr", rbits=rbits, variant=variant, sat=sat)
        assert sum(p for _, p in got) == 1
        assert {("nan", 0.0) if math.isnan(v) else (repr(v), v): p for v, p in got} == expected


def test_probability_of_a_value_not_among_the_outcomes_is_zero():
    distribution = outcomes.outcomes(-0.3, "e2m1", "sr", rbits=2, variant="a")
    assert outcomes.probability_of(-0.5, distribution) == Fraction(1, 2)
    assert outcomes.probability_of(-0.0, distribution) == Fraction(1, 2)
    assert outcomes.probability_of(0.0, distribution) == 0
    assert outcomes.probability_of(math.nan, [(math.nan, Fraction(1))]) == 1


def test_flushed_keeps_the_sign_where_the_format_has_a_negative_zero():
    assert same_outcomes(outcomes.flushed(-1e-9, "bf16"), [(-0.0, Fraction(1))])
    assert same_outcomes(outcomes.flushed(1e-9, "bf16"), [(0.0, Fraction(1))])
    assert same_outcomes(outcomes.flushed(-1e-9, "e5m2fnuz"), [(0.0, Fraction(1))])


def test_mean_and_bias_are_exact():
    x = 1.3
    rne = outcomes.outcomes(x, "e4m3fn", "rne")
    assert outcomes.mean(rne) == Fraction(5, 4)
    assert outcomes.bias(x, rne) == Fraction(5, 4) - Fraction(x)
    few = outcomes.outcomes(x, "e4m3fn", "sr", rbits=2, variant="a")  # P(away) = 1/4
    assert outcomes.mean(few) == Fraction(5, 4) + Fraction(1, 8) / 4
    assert outcomes.bias(x, few) < 0  # variant a truncates nu 2**n: biased toward zero
    # exact SR of x with nu = 3/8 (a 32-bit fraction): unbiased
    assert outcomes.bias(1.046875, outcomes.outcomes(1.046875, "e4m3fn", "sr")) == 0


def test_value_class_names_each_kind_of_value():
    assert outcomes.value_class(0.0, "e2m1") == "zero"
    assert outcomes.value_class(-0.0, "e2m1") == "zero"
    assert outcomes.value_class(0.5, "e2m1") == "subnormal"
    assert outcomes.value_class(-1.0, "e2m1") == "normal"
    assert outcomes.value_class(math.inf, "e5m2") == "inf"
    assert outcomes.value_class(math.nan, "e4m3fn") == "nan"
    assert outcomes.value_class(-3.0, "int8") == "integer"
    assert outcomes.value_class(0.0, "int8") == "zero"


def test_code_of_encodes_values_and_refuses_missing_specials():
    assert outcomes.code_of(1.5, "e4m3fn") == 0x3C
    assert outcomes.code_of(-1.125, "e4m3fn") == 0xB9
    assert outcomes.code_of(math.nan, "e4m3fn") == 0x7F
    assert outcomes.code_of(-math.inf, "e5m2") == 0xFC
    assert outcomes.code_of(math.inf, "e4m3fn") is None  # no infinities
    assert outcomes.code_of(math.nan, "e2m1") is None  # no NaN code
    assert outcomes.code_of(math.inf, "p3109_k8p3ue") is not None
    assert outcomes.code_of(-math.inf, "p3109_k8p3ue") is None  # unsigned: no -inf
