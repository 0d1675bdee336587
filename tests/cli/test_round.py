"""Tests for stochround.cli.round: `stochround round VALUE`, under a mode or a hardware unit.

Assertions read the printed neighbours, codes and exact probabilities back and compare them
with the scalar reference, so a table that prints but says the wrong thing fails.
"""

import itertools
import re
from fractions import Fraction

import pytest
import torch
from helpers import invoke, ok, row

from stochround import hardware, reference


def test_round_sr_8_bits_gives_each_neighbour_probability_one_half():
    output = ok("round", "1.0625", "--format", "e4m3fn", "--mode", "sr", "--rbits", "8")
    lower, upper = row(output, "lower (round down)"), row(output, "upper (round up)")
    assert lower[1:] == ["1.0", "0x38", "toward zero", "1/2", "0.5"]
    assert upper[1:] == ["1.125", "0x39", "away from zero", "1/2", "0.5"]
    assert "nu = 1/2" in output
    drawn = re.search(r"drawn with stochround.round \(seed=0\): (\S+)", output)
    assert drawn and float(drawn.group(1)) in (1.0, 1.125)


def test_round_rne_chooses_the_nearest_neighbour():
    output = ok("round", "1.1", "--format", "bf16", "--mode", "rne")
    assert row(output, "lower (round down)")[1:] == ["1.09375", "0x3f8c", "toward zero", "0", "0"]
    assert row(output, "upper (round up)")[1:] == [
        "1.1015625",
        "0x3f8d",
        "away from zero",
        "1",
        "1",
    ]
    assert "drawn with stochround.round (seed=0): 1.1015625" in output


def test_round_negative_value_rounds_away_toward_the_larger_magnitude():
    output = ok("round", "-1.0625", "--format", "e4m3fn", "--rbits", "8")
    assert row(output, "lower (round down)")[1:4] == ["-1.125", "0xb9", "away from zero"]
    assert row(output, "upper (round up)")[1:4] == ["-1.0", "0xb8", "toward zero"]
    output = ok(
        "round", "-0.3", "--format", "e2m1", "--mode", "sr", "--rbits", "2", "--variant", "a"
    )
    # nu = 0.6 ulp of 0.5; variant a with 2 bits: P(away) = floor(0.6 * 4) / 4 = 1/2
    assert row(output, "lower (round down)")[1:5] == ["-0.5", "0x9", "away from zero", "1/2"]
    assert row(output, "upper (round up)")[1:5] == ["-0.0", "0x8", "toward zero", "1/2"]


def test_round_exact_sr_probability_is_the_exact_fraction():
    output = ok("round", "0.3", "--format", "e5m2")
    nu = reference.discarded_fraction(0.3, "e5m2")
    away = reference.away_probability(nu, 32, "c")
    assert row(output, "upper (round up)")[4] == str(away)
    assert row(output, "lower (round down)")[4] == str(1 - away)


def test_round_representable_value_has_probability_one_to_itself():
    output = ok("round", "1.5", "--format", "e4m3fn")
    assert row(output, "x itself (representable)")[1:] == ["1.5", "0x3c", "1", "1"]
    assert "lower (round down)" not in output


def test_round_overflow_explains_what_sat_does():
    output = ok("round", "1000", "--format", "e4m3fn", "--mode", "rne")
    assert "beyond the format's max 448.0" in output
    assert "sat=finite -> 448.0" in output
    assert "sat=none (chosen) -> nan" in output
    assert "drawn with stochround.round (seed=0): nan" in output
    output = ok(
        "round", "460", "--format", "e4m3fn", "--mode", "sr", "--rbits", "4", "--sat", "finite"
    )
    # 460 = 448 + 0.375 * 32: away (to 480, beyond max) saturates back to 448
    assert row(output, "lower (round down)")[1:] == ["448.0", "0x7e", "toward zero", "1", "1"]


def test_round_infinity_and_nan():
    output = ok("round", "-inf", "--format", "e4m3fn", "--sat", "finite")
    assert row(output, "finite (chosen)")[1:] == ["-448.0", "0xfe"]
    assert row(output, "none")[1] == "nan"
    output = ok("round", "inf", "--format", "e5m2")
    assert row(output, "none (chosen)")[1:] == ["inf", "0x7c"]
    output = ok("round", "nan", "--format", "e2m1")
    assert "NaN stays NaN" in output and "no NaN code" in output
    assert "code 0 with nan='zero'" in output


def test_round_accepts_float_syntax_and_negative_values():
    assert "x = 0.001" in ok("round", "1e-3", "--format", "e4m3fn")
    assert "x = 0.1875" in ok("round", "0x1.8p-3", "--format", "e2m1")
    assert "x = -2.5" in ok("round", "-2.5", "--format", "int8", "--mode", "rne")


EDGE_VALUES = ["0.0", "-0.0", "1e-300", "-460", "1e9", "inf", "-inf", "nan", "0.3", "-3"]
EDGE_FORMATS = ["e4m3fn", "e5m2fnuz", "e2m1", "e8m0", "uint8", "p3109_k8p4se", "p3109_k8p3uf"]


@pytest.mark.parametrize("name", EDGE_FORMATS)
def test_round_edge_cases_print_a_distribution_the_drawn_result_belongs_to(name):
    """The command exits 1 if stochround.round draws a value the reference gives
    probability 0; every edge case must exit 0 and print probabilities summing to 1."""
    for value, mode, sat in itertools.product(EDGE_VALUES, ("sr", "rne", "rd"), ("none", "finite")):
        result = invoke("round", value, "--format", name, "--mode", mode, "--sat", sat)
        assert result.exit_code == 0, (value, mode, sat, result.output)
        if value in ("inf", "-inf", "nan"):
            continue
        probabilities = [
            Fraction(cells[-2])
            for line in result.stdout.splitlines()
            if (cells := re.split(r"\s{2,}", line.strip()))[0].startswith(
                ("lower", "upper", "x itself", "overflow (sat", "smallest (underflow)")
            )
        ]
        assert sum(probabilities) == 1, result.stdout


def test_round_under_a_hardware_unit_truncates_the_bits_it_drops():
    """1 + 2^-4 + 2^-23 to e4m3fn: nu = 1/2 + 2^-20 ulp, which exact SR rounds up with that
    probability and cvt.rs's 16 random bits (variant a) with floor(nu 2^16) / 2^16 = 1/2."""
    output = ok("round", "0x1.100002p+0", "--hardware", "nvidia-cvt-rs", "--format", "e4m3fn")
    assert "nvidia-cvt-rs-e4m3: operand 1.0625001192092896 (binary32, rne)" in output
    assert "nu = 524289/1048576" in output
    assert row(output, "upper (round up)")[1:5] == ["1.125", "0x39", "away from zero", "1/2"]
    exact = ok("round", "0x1.100002p+0", "--format", "e4m3fn")
    assert row(exact, "upper (round up)")[4] == "524289/1048576"


def test_round_under_a_hardware_unit_matches_its_expected_value():
    """The printed distribution's mean is the preset's exact expected value."""
    for value, name, fmt in (
        ("0.3", "amd-mi300", "e5m2fnuz"),
        ("-1e-9", "graphcore-ipu", None),  # rounded to fp32 first, then flushed
        ("3.0001", "intel-fp16", None),
        ("7", "nvidia-cvt-rs-e2m1", None),  # overflow: .satfinite saturates to 6
    ):
        args = ["round", value, "--hardware", name] + ([] if fmt is None else ["--format", fmt])
        output = ok(*args)
        cells = [
            re.split(r"\s{2,}", line.strip())
            for line in output.splitlines()
            if line.strip().startswith(("lower", "upper", "x itself", "overflow (sat"))
        ]
        mean = sum(Fraction(float(c[1])) * Fraction(c[-2]) for c in cells if Fraction(c[-2]))
        unit = hardware.preset(name, fmt)
        x = torch.tensor([float(value)], dtype=torch.float64)
        assert mean == Fraction(hardware.expected_value(x, unit).item()), (value, output)
    assert "flushes operands below" in ok("round", "-1e-9", "--hardware", "graphcore-ipu")


E8M0_SMALLEST = 2.0**-127


@pytest.mark.parametrize("value", ["1e-40", "0x1.fffffp-128", "0.0", "-0.0", "1e-300"])
@pytest.mark.parametrize("mode", ["sr", "rne", "rd"])
def test_round_below_e8m0s_smallest_value_is_labelled_an_underflow(value, mode):
    """e8m0 has no zero: 0 and every x below 2^-127 round up to 2^-127 in every mode and
    sat.  That is neither x itself (x is not on the grid) nor an overflow."""
    output = ok("round", value, "--format", "e8m0", "--mode", mode)
    smallest = repr(E8M0_SMALLEST)
    cells = row(output, "smallest (underflow)")
    assert cells[1:] == [smallest, "0x00", "away from zero", "1", "1"]
    x = repr(float.fromhex(value) if "0x" in value else float(value))
    assert (
        f"underflow: {x} lies below e8m0's smallest magnitude {smallest} (2^-127) and e8m0 "
        f"has no zero: every mode and every sat rounds it to {smallest}"
    ) in output
    for wrong in ("x itself", "overflow", "discarded fraction", "P(away from zero)"):
        assert wrong not in output
    assert f"drawn with stochround.round (seed=0): {smallest}  code 0x00" in output


def test_round_e8m0s_smallest_value_itself_and_negative_values_are_no_underflow():
    """2^-127 is on the grid; a negative x is beyond an unsigned format's range (with
    sat=none rd overflows to NaN), an overflow as before."""
    output = ok("round", "0x1p-127", "--format", "e8m0")
    assert row(output, "x itself (representable)")[1:3] == [repr(E8M0_SMALLEST), "0x00"]
    assert "underflow" not in output
    output = ok("round", "-1e-40", "--format", "e8m0", "--mode", "rd")
    assert row(output, "lower (round down)")[1:3] == ["nan", "0xff"]
    assert "overflow: -1e-40 is beyond the format's lowest" in output
    assert "underflow" not in output


@pytest.mark.parametrize("spelled", ["RNE", "Rne", " rne "])
def test_round_takes_a_mode_in_any_case(spelled):
    """--mode RNE is rne (as the library's mode= is): the same table, the name printed as
    MODES spells it."""
    assert ok("round", "1.3", "--format", "e4m3fn", "--mode", spelled) == ok(
        "round", "1.3", "--format", "e4m3fn", "--mode", "rne"
    )
