"""Tests for stochround.cli.formats: `stochround formats` and `stochround info FORMAT`.

Assertions read the printed tables back (values, codes, classes) and compare them with the
scalar reference, so a table that prints but says the wrong thing fails.
"""

import math
import re

import pytest
from helpers import ok, row

from stochround import reference
from stochround.formats import FORMATS


def test_formats_lists_every_format_and_e4m3fn_max_448():
    output = ok("formats")
    for name in FORMATS:
        assert row(output, name)
    cells = row(output, "e4m3fn")
    # format bits ebits mbits bias p emin emax max min-normal min-subnormal eps inf NaN dtype
    assert cells[1:9] == ["8", "4", "3", "7", "4", "-6", "8", "448"]
    assert cells[9:14] == ["2^-6", "2^-9", "2^-3", "no", "fn"]
    assert cells[14] == "float8_e4m3fn"
    assert "fp8_e4m3fn" in cells[15]
    assert row(output, "bfloat16")[8] == "3.39e+38"


def test_formats_splits_into_two_tables_on_a_narrow_terminal():
    output = ok("formats", columns=80)
    assert "(1/2)" in output and "(2/2)" in output
    table_lines = [line for line in output.splitlines() if not line.startswith(("p =", "NaN:"))]
    assert max(map(len, table_lines)) <= 80
    first, second = output.split("(2/2)")
    assert row(first, "e4m3fn")[1] == "8"
    assert row(second, "e4m3fn")[1] == "448"


def _value_rows(output: str) -> dict[int, tuple[str, float, str]]:
    """code -> (bits, value, class) from an info value table."""
    rows = {}
    pattern = re.compile(r"^0x([0-9a-f]+)\s{2,}([01 ]+?)\s{2,}(\S+)\s{2,}(\w+)$")
    for line in output.splitlines():
        if match := pattern.match(line.strip()):
            code, bits, value, kind = match.groups()
            rows[int(code, 16)] = (bits, float(value), kind)
    return rows


def test_info_e2m1_lists_all_16_codes_with_values_and_classes():
    output = ok("info", "e2m1")
    rows = _value_rows(output)
    assert sorted(rows) == list(range(16))
    for code, value in reference.all_values("e2m1"):
        assert rows[code][1] == value and math.copysign(1, rows[code][1]) == math.copysign(1, value)
    assert rows[0x7] == ("0 11 1", 6.0, "normal")
    assert rows[0xF] == ("1 11 1", -6.0, "normal")
    assert rows[0x1] == ("0 00 1", 0.5, "subnormal")
    assert rows[0x8][2] == "zero"
    assert row(output, "max")[1] == "6.0"
    assert row(output, "aliases")[1].startswith("fp4")


@pytest.mark.parametrize(
    ("name", "classes"),
    [
        ("e4m3fn", {"zero": 2, "subnormal": 14, "normal": 238, "nan": 2}),
        ("e5m2", {"zero": 2, "subnormal": 6, "normal": 240, "inf": 2, "nan": 6}),
        ("p3109_k8p4se", {"zero": 1, "subnormal": 14, "normal": 238, "inf": 2, "nan": 1}),
        ("cfloat8_e4m3_b20", {"zero": 2, "subnormal": 14, "normal": 240}),
        ("int4", {"zero": 1, "integer": 15}),
    ],
)
def test_info_value_table_matches_the_reference(name, classes):
    output = ok("info", name)
    rows = _value_rows(output)
    expected = reference.all_values(name)
    assert len(rows) == len(expected)
    for code, value in expected:
        shown = rows[code][1]
        assert (math.isnan(shown) and math.isnan(value)) or shown == value
    counts = {}
    for _, _, kind in rows.values():
        counts[kind] = counts.get(kind, 0) + 1
    assert counts == classes


def test_info_parsed_format_names_show_their_properties():
    output = ok("info", "p3109_k8p4se", "--no-values")
    assert row(output, "bias")[1] == "8"
    assert row(output, "max")[1] == "224.0"
    assert row(output, "NaN encoding")[1] == "fnuz"
    assert not _value_rows(output)
    output = ok("info", "cfloat8_e4m3_b20", "--no-values")
    assert row(output, "bias")[1] == "20"
    assert row(output, "inf")[1] == "no"


def test_info_of_a_wide_format_skips_the_value_table():
    output = ok("info", "bf16")
    assert row(output, "name")[1] == "bfloat16"
    assert row(output, "max")[1] == repr(FORMATS["bfloat16"].max)
    assert "at most 8 bits" in output
    assert not _value_rows(output)


def test_info_says_whether_the_format_has_a_zero():
    """e8m0 has none: 0 and |x| < 2^-127 round to its smallest value, an underflow."""
    assert row(ok("info", "e8m0", "--no-values"), "zero")[1:] == [
        "no",
        "no zero code: 0 and |x| < 2^-127 round to the smallest value (underflow)",
    ]
    assert row(ok("info", "e4m3fn", "--no-values"), "zero")[1:] == ["yes", "has a zero code"]


def test_formats_lists_the_block_formats_in_a_second_table():
    """One row per named block format: element, block, scale, rule, tensor scale and the
    bits an element costs with its share of the block scale (element bits + 8 / 32 for
    MX, 4 + 8 / 16 for NVFP4)."""
    from stochround.blocks.formats import BLOCK_FORMATS

    output = ok("formats")
    assert "Block formats" in output
    for name in BLOCK_FORMATS:
        assert row(output, name)
    assert row(output, "mxfp4")[1:] == ["e2m1", "32", "e8m0", "floor", "no", "4.25"]
    assert row(output, "mxfp8_e4m3")[1:] == ["e4m3fn", "32", "e8m0", "floor", "no", "8.25"]
    assert row(output, "mxfp6_e3m2")[-1] == "6.25"
    assert row(output, "nvfp4")[1:] == ["e2m1", "16", "e4m3fn", "nvfp4", "fp32", "4.5"]
    rowwise = ["int8", "row", "binary32", "absmax", "no", "8 + 32/row"]
    assert row(output, "int8_rowwise")[1:] == rowwise


def test_the_block_formats_table_fits_a_narrow_terminal_unsplit():
    output = ok("formats", columns=80)
    block_part = output[output.index("Block formats") :]
    assert "(1/2)" not in block_part
    assert max(map(len, block_part.splitlines())) <= 80
    assert row(block_part, "mxfp4")[-1] == "4.25"


@pytest.mark.parametrize(
    ("name", "element", "block", "scale", "rule", "tensor", "bits"),
    [
        ("mxfp4", "e2m1", "32", "e8m0", "floor", "no", "4.25"),
        ("mxfp6_e2m3", "e2m3", "32", "e8m0", "floor", "no", "6.25"),
        ("mxint8", "ocp_int8", "32", "e8m0", "floor", "no", "8.25"),
        ("nvfp4", "e2m1", "16", "e4m3fn", "nvfp4", "fp32", "4.5"),
        ("int8_rowwise", "int8", "row", "binary32", "absmax", "no", "8 + 32/row"),
    ],
)
def test_info_describes_a_block_format(name, element, block, scale, rule, tensor, bits):
    output = ok("info", name, "--no-values")
    assert f"Block format {name}" in output
    assert row(output, "element")[1] == element
    assert row(output, "block")[1] == block
    assert row(output, "scale")[1] == scale
    assert row(output, "scale rule")[1] == rule
    assert row(output, "tensor scale")[1] == tensor
    assert row(output, "bits per element")[1] == bits
    # then the element format's own properties
    assert f"Format {element}" in output


def test_info_of_a_block_format_lists_its_element_codes():
    """mxfp4's elements are e2m1: the value table of its 16 codes follows the block
    format's properties; mxint8's grid (k / 64) is not a registered format, and is listed
    all the same."""
    rows = _value_rows(ok("info", "mxfp4"))
    assert sorted(rows) == list(range(16))
    assert rows[0x7] == ("0 11 1", 6.0, "normal")
    output = ok("info", "MXINT8")
    assert row(output, "element")[1:] == ["ocp_int8", "8 bits, max 1.984375"]
    int_rows = _value_rows(output)
    assert len(int_rows) == 256
    assert int_rows[0x01][1] == 2**-6
    assert int_rows[0x80][1] == -2.0


def test_info_of_an_unknown_name_lists_the_block_formats():
    from helpers import invoke

    result = invoke("info", "mxfp3")
    assert result.exit_code == 2
    assert "unknown format 'mxfp3'" in result.output
    assert "block formats: mxfp8_e4m3, mxfp8_e5m2" in result.output
