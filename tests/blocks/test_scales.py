"""The scale rules against exact rational arithmetic, and their decided edge cases."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from stochround import format as find_format
from stochround.blocks import scales
from stochround.formats import floor_log2

# amax values over fp32's whole range: subnormals, powers of two and their neighbours,
# values just below the element maxima's binades, the largest finite value
AMAX = sorted(
    {
        *(float(np.float32(2.0) ** e) for e in range(-149, 128, 7)),
        *(float(np.nextafter(np.float32(2.0) ** e, np.float32(np.inf))) for e in (-140, -3, 0, 5)),
        *(float(np.nextafter(np.float32(2.0) ** e, np.float32(0))) for e in (-126, 0, 3, 9)),
        1.75,
        1.874,
        1.875,
        1.9375,
        3.0,
        6.0,
        7.0,
        448.0,
        449.0,
        57344.0,
        1e-40,
        3.0e38,
        float(np.finfo(np.float32).max),
    }
)

ELEMENTS = ["e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2"]


def _expected_exponent(amax: float, rule: str, element: str) -> int:
    """The rule's exponent by exact rational arithmetic (the scales module docstring)."""
    fmt = find_format(element)
    value = Fraction(amax)
    if value == 0:
        return -127
    if rule == "rceil":
        # TE's amax * max_norm_rcp: the product with the fp32 reciprocal of the max
        quotient = float(np.float32(amax) * (np.float32(1.0) / np.float32(fmt.max)))
        if quotient == 0:
            return -127
        q = Fraction(quotient)
        e = floor_log2(q) + (q != Fraction(2) ** floor_log2(q))
        return max(-127, min(127, e))
    e = floor_log2(value)
    if rule == "ceil":
        e += value != Fraction(2) ** e
    if rule == "even":
        # amax rounded to mbits fraction bits, ties away from zero
        ulp = Fraction(2) ** (e - fmt.mbits)
        rounded = math.floor(value / ulp + Fraction(1, 2)) * ulp
        e = floor_log2(rounded)
    return max(-127, min(127, e - fmt.emax))


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil", "floor-3/4"])
def test_power_of_two_rules_equal_exact_rational_arithmetic(rule: str, element: str) -> None:
    fmt = find_format(element)
    amax = torch.tensor(AMAX, dtype=torch.float32)
    got = scales.power_of_two_exponent(
        amax, rule, emax=fmt.emax, mbits=fmt.mbits, max_value=float(fmt.max)
    )
    exact_rule = "floor" if rule == "floor-3/4" else rule
    expected = [_expected_exponent(a, exact_rule, element) for a in AMAX]
    assert got.tolist() == expected


def test_an_all_zero_block_takes_the_smallest_scale_and_a_nonfinite_one_the_nan_scale() -> None:
    amax = torch.tensor([0.0, float("nan"), float("inf"), 1.0])
    exponent = scales.power_of_two_exponent(amax, "floor", emax=2, mbits=1, max_value=6.0)
    codes = scales.e8m0_scales(exponent, amax).view(torch.uint8).tolist()
    assert codes == [0, 0xFF, 0xFF, 127 - 2]
    x = torch.tensor([[1.0, -1.0]] * 4)
    scaled = scales.power_of_two_multiply(x, exponent.unsqueeze(-1), amax.unsqueeze(-1), "floor")
    assert torch.isnan(scaled[1:3]).all()
    assert scaled[3].tolist() == [4.0, -4.0]


def test_the_multiplier_at_the_bottom_of_e8m0_is_exactly_two_to_the_127() -> None:
    # torchao divides by max(2**e, 2**-126), halving these values: we do not
    x = torch.tensor([2.0**-130, -(2.0**-127) * 1.5, 2.0**-149])
    exponent = torch.full((3,), -127, dtype=torch.int32)
    amax = torch.ones(3)
    scaled = scales.power_of_two_multiply(x, exponent, amax, "floor")
    assert scaled.tolist() == [2.0**-3, -1.5, 2.0**-22]


@pytest.mark.parametrize("element", ELEMENTS)
def test_floor_three_quarters_keeps_every_scaled_value_within_the_element_max(element: str) -> None:
    # amax * 2**-e < 2**(emax + 1), times 3/4 is below 1.5 * 2**emax <= max
    fmt = find_format(element)
    amax = torch.tensor(AMAX[1:-1], dtype=torch.float32)  # nonzero, below fp32's max
    amax = amax[amax > 2.0**-100]  # scales inside E8M0's range
    exponent = scales.power_of_two_exponent(
        amax, "floor-3/4", emax=fmt.emax, mbits=fmt.mbits, max_value=float(fmt.max)
    )
    scaled = scales.power_of_two_multiply(amax, exponent, amax, "floor-3/4")
    assert bool((scaled < 1.5 * 2**fmt.emax).all())
    assert 1.5 * 2**fmt.emax <= fmt.max


def test_te_tensor_scale_is_one_for_an_all_zero_or_infinite_tensor() -> None:
    for amax in (0.0, float("inf"), float("nan")):
        for flavour in ("te", "torchao", "pow2"):
            pair = scales.nvfp4_tensor_scales(torch.tensor(amax), flavour)
            assert (pair.decode.item(), pair.encode.item()) == (1.0, 1.0)
    assert scales.nvfp4_tensor_scales(torch.tensor(2688.0), "torchao").decode.item() == 1.0


def test_pow2_tensor_scales_are_the_least_power_of_two_at_or_above_amax_over_2688() -> None:
    """Known answers: a power of two at or above amax / 2688 (the quotient correctly
    rounded), the least one; 2**-118 at the bottom (an operand value then stays a bf16
    value), 1 for 0, infinities and NaN; S_enc its exact inverse."""
    tiny = float(torch.finfo(torch.float32).tiny)
    cases = {
        2688.0: 0, 2689.0: 1, 5376.0: 1, 5377.0: 2, 1.0: -11, 1344.0: -1, 1345.0: 0,
        3.0e38: 117, 2.0**-100: -111, 2.0**-107: -118, 2.0**-110: -118, tiny: -118,
        tiny * 2.0**-23: -118, 0.0: 0, float("inf"): 0, float("nan"): 0,
    }  # fmt: skip
    for amax, exponent in cases.items():
        pair = scales.nvfp4_tensor_scales(torch.tensor(amax), "pow2")
        assert pair.decode.item() == 2.0**exponent, amax
        assert pair.encode.item() == 2.0**-exponent, amax


def test_pow2_block_scales_take_te_order_under_their_tensor_scale() -> None:
    amax = torch.tensor([0.01, 1.0, 6.0, 2000.0])
    pair = scales.nvfp4_tensor_scales(amax.max(), "pow2")
    assert pair.decode.item() == 1.0  # 2000 / 2688 rounds up to 1
    assert torch.equal(
        scales.nvfp4_scales(amax, pair, "pow2")[0].view(torch.uint8),
        scales.nvfp4_scales(amax, pair, "te")[0].view(torch.uint8),
    )


def test_the_flavours_differ_where_torchao_clamps_small_block_scales() -> None:
    # single-level: amax / 6 below 2**-6 is an e4m3 subnormal for TE, 2**-6 for torchao
    amax = torch.tensor([0.01, 0.06, 6.0])
    te, _ = scales.nvfp4_scales(amax, None, "te")
    ao, _ = scales.nvfp4_scales(amax, None, "torchao")
    assert te.float().tolist() == [2.0**-9, 0.009765625, 1.0]
    assert ao.float().tolist() == [2.0**-6, 2.0**-6, 1.0]


def test_absmax_scales_divide_in_x_dtype_and_store_the_floor_they_divide_by() -> None:
    amax = torch.tensor([127.0, 1.0, 0.0, float("nan")], dtype=torch.bfloat16)
    scale, inverse = scales.absmax_scales(amax, 127.0)
    floor = scales.absmax_floor(torch.bfloat16)
    assert scale.dtype == torch.bfloat16
    one_127th = float(torch.tensor(1 / 127, dtype=torch.bfloat16))
    assert scale[:3].tolist() == [1.0, one_127th, floor]
    assert scale[3].isnan()
    assert inverse[2].item() == np.float32(1.0) / np.float32(floor)


def test_the_absmax_floor_is_eps_rounded_up_to_the_scales_dtype() -> None:
    eps = float(np.float32(1e-12))
    assert scales.absmax_floor(torch.float32) == eps
    bf16 = scales.absmax_floor(torch.bfloat16)
    below = torch.nextafter(torch.tensor(bf16, dtype=torch.bfloat16), torch.tensor(0.0).bfloat16())
    assert float(below) < eps <= bf16
    assert scales.absmax_floor(torch.float16) == 2.0**-24  # fp16's smallest subnormal


def test_quotients_are_correctly_rounded_divisions_whatever_the_operands() -> None:
    # a Python number divided by a tensor is reciprocal * number in PyTorch: two roundings
    t = torch.tensor([3.0, 7.0, 2688.0 / 37.25, 1.0e-3], dtype=torch.float32)
    want = [float(np.float32(2688.0) / np.float32(v)) for v in t.tolist()]
    assert scales.quotient(2688.0, t, t).tolist() == want
    assert scales.quotient(t, 6.0, t).tolist() == [
        float(np.float32(v) / np.float32(6.0)) for v in t.tolist()
    ]


def test_an_unknown_flavour_or_rule_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="nvfp4_flavour must be one of 'te', 'torchao'"):
        scales.check_flavour("cublas")
    with pytest.raises(ValueError, match="rule must be one of 'floor'"):
        scales.power_of_two_exponent(torch.ones(1), "nvfp4", emax=2, mbits=1, max_value=6.0)
