"""The block formats' descriptions: the registry, validation and the words `info` shows."""

from __future__ import annotations

import dataclasses

import pytest

from stochround import blocks
from stochround import format as find_format
from stochround.blocks.formats import OCP_INT8, element_table


@pytest.mark.parametrize(
    ("name", "element", "block", "scale", "rule"),
    [
        ("mxfp8_e4m3", "e4m3fn", 32, "e8m0", "floor"),
        ("mxfp8_e5m2", "e5m2", 32, "e8m0", "floor"),
        ("mxfp6_e2m3", "e2m3", 32, "e8m0", "floor"),
        ("mxfp6_e3m2", "e3m2", 32, "e8m0", "floor"),
        ("mxfp4", "e2m1", 32, "e8m0", "floor"),
        ("nvfp4", "e2m1", 16, "e4m3fn", "nvfp4"),
        ("int8_rowwise", "int8", None, "binary32", "absmax"),
    ],
)
def test_named_formats_have_the_published_elements_blocks_and_scales(
    name: str, element: str, block: int | None, scale: str, rule: str
) -> None:
    fmt = blocks.block_format(name)
    assert fmt.element == find_format(element)
    assert fmt.block == block
    assert fmt.scale == find_format(scale)
    assert fmt.scale_rule == rule
    assert fmt.tensor_scale == (name == "nvfp4")


def test_mxint8_elements_are_sixty_fourths_with_emax_zero_as_ocp_states() -> None:
    fmt = blocks.block_format("mxint8")
    assert fmt.element is OCP_INT8
    assert OCP_INT8.emax == 0
    assert OCP_INT8.max == 127 / 64
    assert OCP_INT8.lowest == -2.0  # code -128 kept, as gfloat's ocp_int8
    assert OCP_INT8.min_subnormal == 1 / 64


def test_the_registry_holds_exactly_the_issue_formats() -> None:
    assert set(blocks.BLOCK_FORMATS) == {
        "mxfp8_e4m3",
        "mxfp8_e5m2",
        "mxfp6_e2m3",
        "mxfp6_e3m2",
        "mxfp4",
        "mxint8",
        "nvfp4",
        "int8_rowwise",
    }
    assert blocks.SCALE_RULES == ("floor", "rceil", "ceil", "even", "floor-3/4", "absmax", "nvfp4")


def test_lookup_is_case_insensitive_and_a_block_format_passes_through() -> None:
    fmt = blocks.block_format("MXFP4")
    assert fmt is blocks.BLOCK_FORMATS["mxfp4"]
    assert blocks.block_format(fmt) is fmt


def test_an_unknown_name_names_the_closest_and_the_known_formats() -> None:
    with pytest.raises(
        ValueError, match=r"unknown block format 'mxfp5'.*closest.*known: mxfp8_e4m3"
    ):
        blocks.block_format("mxfp5")
    with pytest.raises(TypeError, match="fmt must be a block format name"):
        blocks.block_format(4)  # type: ignore[arg-type]


def test_a_scale_rule_outside_the_list_is_refused_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="scale_rule must be one of 'floor', 'rceil'"):
        dataclasses.replace(blocks.BLOCK_FORMATS["mxfp4"], scale_rule="round")


def test_a_rule_needs_its_scale_format() -> None:
    with pytest.raises(
        ValueError, match="scale rule 'nvfp4' needs a scale of format e4m3fn; got e8m0"
    ):
        dataclasses.replace(blocks.BLOCK_FORMATS["mxfp4"], scale_rule="nvfp4")
    with pytest.raises(ValueError, match="needs scale_rule 'nvfp4'"):
        dataclasses.replace(blocks.BLOCK_FORMATS["mxfp4"], tensor_scale=True)


@pytest.mark.parametrize("block", [0, -16, 1.5, (16,), (16, 0), True, "16"])
def test_a_block_must_be_a_positive_int_a_pair_or_none(block: object) -> None:
    with pytest.raises(ValueError, match="block must be a positive int, a pair"):
        dataclasses.replace(blocks.BLOCK_FORMATS["mxfp4"], block=block)


def test_a_custom_format_takes_any_element_and_a_two_dimensional_tile() -> None:
    fmt = blocks.BlockFormat(
        "e3m4_tiles", find_format("e3m4"), (8, 16), find_format("e8m0"), "rceil"
    )
    assert fmt.block == (8, 16)
    assert fmt.block_size == 128
    assert fmt.bits_per_element == 8 + 8 / 128


def test_describe_states_elements_block_scale_and_rule_in_words() -> None:
    text = blocks.block_format("mxfp4").describe()
    assert text.splitlines() == [
        "mxfp4: block-scaled format",
        "  elements: e2m1 (4 bits, largest 6)",
        "  block:    32 consecutive elements along the quantized axis",
        "  scale:    e8m0, rule 'floor': 2**(floor(log2 amax) - emax_elem) (OCP MX v1.0)",
        "  storage:  4.25 bits per element (elements and block scales)",
    ]
    nvfp4 = blocks.block_format("nvfp4").describe()
    assert "an FP32 per-tensor scale above the block scales" in nvfp4
    assert "4.5 bits per element" in nvfp4
    assert "one scale per row" in blocks.block_format("int8_rowwise").describe()
    assert str(blocks.block_format("mxfp4")) == text


def test_the_element_table_holds_every_code_value_in_code_order() -> None:
    table = element_table(find_format("e2m1"))
    assert table is not None
    assert table[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert table[8:] == (-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
    assert element_table(find_format("binary32")) is None
