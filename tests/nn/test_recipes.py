"""Recipes: the named recipes against their published tables, validation, printing,
comparison and the JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import stochround as sr
import stochround.nn as srnn
from stochround.nn.recipes import ROLES, QuantSpec, Recipe

# The published tables, one row per role: (format, mode, block, scale_rule, rht, rht_signs).
# None for the block or the rule means the format's own (nvfp4: 1x16, mxfp*: 32, int8
# row-wise: a whole row).  Sources: Transformer Engine's NVFP4BlockScaling,
# MXFP8BlockScaling and Float8CurrentScaling(Format.HYBRID); Tseng et al. (2025)
# Algorithm 1; Qwix's QtRule(int8, bwd_stochastic_rounding="uniform").
NVFP4 = {
    "fprop_input": ("nvfp4", "rne", None, None, None, "fixed"),
    "fprop_weight": ("nvfp4", "rne", (16, 16), None, None, "fixed"),
    "dgrad_grad_output": ("nvfp4", "sr", None, None, None, "fixed"),
    "dgrad_weight": ("nvfp4", "rne", (16, 16), None, None, "fixed"),
    "wgrad_grad_output": ("nvfp4", "sr", None, None, 16, "fixed"),
    "wgrad_input": ("nvfp4", "rne", None, None, 16, "fixed"),
}
TSENG_BACKWARD = ("mxfp4", "sr", None, "floor-3/4", 64, "per_step")
PASS = (None, "rne", None, None, None, "fixed")
TABLES: dict[str, tuple[Recipe, dict[str, Any]]] = {
    "nvfp4()": (srnn.nvfp4(), NVFP4),
    "nvfp4(stochastic_rounding=False)": (
        srnn.nvfp4(stochastic_rounding=False),
        {
            **NVFP4,
            "dgrad_grad_output": ("nvfp4", "rne", None, None, None, "fixed"),
            "wgrad_grad_output": ("nvfp4", "rne", None, None, 16, "fixed"),
        },
    ),
    "nvfp4(rht=False)": (
        srnn.nvfp4(rht=False),
        {
            **NVFP4,
            "wgrad_grad_output": ("nvfp4", "sr", None, None, None, "fixed"),
            "wgrad_input": ("nvfp4", "rne", None, None, None, "fixed"),
        },
    ),
    "nvfp4(weight_2d=False)": (
        srnn.nvfp4(weight_2d=False),
        {
            **NVFP4,
            "fprop_weight": ("nvfp4", "rne", None, None, None, "fixed"),
            "dgrad_weight": ("nvfp4", "rne", None, None, None, "fixed"),
        },
    ),
    "mxfp4_tseng()": (
        srnn.mxfp4_tseng(),
        {
            "fprop_input": PASS,
            "fprop_weight": PASS,
            **dict.fromkeys(ROLES[2:], TSENG_BACKWARD),
        },
    ),
    "mxfp8()": (
        srnn.mxfp8(),
        dict.fromkeys(ROLES, ("mxfp8_e4m3", "rne", None, "rceil", None, "fixed")),
    ),
    "fp8()": (
        srnn.fp8(),
        {
            "fprop_input": ("fp8_e4m3_tensor", "rne", None, None, None, "fixed"),
            "fprop_weight": ("fp8_e4m3_tensor", "rne", None, None, None, "fixed"),
            "dgrad_grad_output": ("fp8_e5m2_tensor", "rne", None, None, None, "fixed"),
            "dgrad_weight": ("fp8_e4m3_tensor", "rne", None, None, None, "fixed"),
            "wgrad_grad_output": ("fp8_e5m2_tensor", "rne", None, None, None, "fixed"),
            "wgrad_input": ("fp8_e4m3_tensor", "rne", None, None, None, "fixed"),
        },
    ),
    "int8()": (
        srnn.int8(),
        {
            **dict.fromkeys(ROLES, ("int8_rowwise", "rne", None, None, None, "fixed")),
            "dgrad_grad_output": ("int8_rowwise", "sr", None, None, None, "fixed"),
            "wgrad_grad_output": ("int8_rowwise", "sr", None, None, None, "fixed"),
        },
    ),
    "int8(None)": (
        srnn.int8(None),
        dict.fromkeys(ROLES, ("int8_rowwise", "rne", None, None, None, "fixed")),
    ),
    "bf16()": (srnn.bf16(), dict.fromkeys(ROLES, PASS)),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_each_named_recipe_reproduces_its_published_table(name: str) -> None:
    recipe, table = TABLES[name]
    for role in ROLES:
        spec = recipe.spec(role)
        got = (spec.format, spec.mode, spec.block, spec.scale_rule, spec.rht, spec.rht_signs)
        assert got == table[role], f"{name} {role}"
        assert spec.rbits is None and spec.variant == "c"


def test_nvfp4_rotates_in_bf16_with_its_own_tensor_scales_as_transformer_engine() -> None:
    recipe = srnn.nvfp4()
    for role in ("wgrad_grad_output", "wgrad_input"):
        assert recipe.spec(role).rht_bf16 and recipe.spec(role).tensor_scale == "amax"
    assert not srnn.nvfp4(rht=False).wgrad_input.rht_bf16
    assert recipe.fprop_weight.block_format().block == (16, 16)
    assert recipe.fprop_input.block_format().block == 16


def test_int8_row_noise_is_qwixs_one_word_per_row_on_the_gradients_only() -> None:
    recipe = srnn.int8(noise="row")
    assert recipe.dgrad_grad_output.noise == "row" and recipe.wgrad_grad_output.noise == "row"
    assert recipe.fprop_input.noise == "element"


def test_every_named_recipe_cites_its_source_and_is_registered() -> None:
    for name, make in srnn.RECIPES.items():
        recipe = make()
        assert recipe.name == name and recipe.source


@pytest.mark.parametrize("name", list(TABLES))
def test_recipes_round_trip_through_json(name: str) -> None:
    recipe = TABLES[name][0].replace(seed=2**64 - 1, keep=("lm_head", r"^blocks\.0\."))
    data = json.loads(json.dumps(recipe.to_dict()))
    assert Recipe.from_dict(data) == recipe


def test_recipes_print_and_compare_by_value() -> None:
    assert srnn.nvfp4() == srnn.nvfp4()
    assert srnn.nvfp4() != srnn.nvfp4(rht=False)
    assert srnn.nvfp4(seed=1) != srnn.nvfp4(seed=2)
    assert hash(srnn.mxfp8()) == hash(srnn.mxfp8())
    text = repr(srnn.nvfp4())
    assert "Recipe(name='nvfp4'" in text and "block=(16, 16)" in text


def test_str_prints_the_recipes_table() -> None:
    assert str(srnn.nvfp4(keep=("lm_head",))).splitlines() == [
        "nvfp4: seed 0 (Transformer Engine NVFP4BlockScaling; NVIDIA, Pretraining LLMs with "
        "NVFP4 (2025))",
        "  fprop_input        nvfp4 16 rne",
        "  fprop_weight       nvfp4 16x16 rne",
        "  dgrad_grad_output  nvfp4 16 sr",
        "  dgrad_weight       nvfp4 16x16 rne",
        "  wgrad_grad_output  nvfp4 16 sr rht16/fixed/bf16",
        "  wgrad_input        nvfp4 16 rne rht16/fixed/bf16",
        "  kept in high precision: lm_head",
    ]
    assert "fp8_e5m2_tensor tensor rne" in str(srnn.fp8())
    assert "mxfp4 32 sr floor-3/4 rht64/per_step" in str(srnn.mxfp4_tseng())
    assert "int8_rowwise row sr row-noise" in str(srnn.int8(noise="row"))


def test_a_custom_recipe_is_just_a_recipe() -> None:
    spec = QuantSpec("mxfp6_e3m2", "sr", rbits=8, variant="b", scale_rule="rceil", block=64)
    recipe = Recipe(name="mine", wgrad_grad_output=spec, seed=5)
    assert recipe.spec("wgrad_grad_output").block_format().block == 64
    assert recipe.spec("fprop_input") == QuantSpec() and not recipe.fprop_input.quantized
    assert spec.stochastic and not QuantSpec("mxfp4").stochastic


def test_keep_patterns_are_searched_in_the_module_path() -> None:
    recipe = srnn.nvfp4(keep=("lm_head", r"^blocks\.0\."))
    assert recipe.keeps("lm_head") and recipe.keeps("blocks.0.mlp.fc")
    assert not recipe.keeps("blocks.10.mlp.fc")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "nvfp5"}, "format must be one of"),
        ({"format": "nvfp4", "mode": "up"}, "mode must be one of"),
        ({"format": "nvfp4", "rbits": 8}, "rbits applies to mode='sr'"),
        ({"format": "nvfp4", "mode": "sr", "rbits": 33}, "rbits"),
        ({"format": "nvfp4", "block": 0}, "block must be"),
        ({"format": "nvfp4", "rht": 8}, "rht must be None or a Hadamard size"),
        ({"format": "nvfp4", "rht_signs": "fresh"}, "rht_signs must be one of"),
        ({"format": "nvfp4", "rht_bf16": True}, "rht_bf16=True applies with rht="),
        ({"format": "nvfp4", "tensor_scale": "previous"}, "tensor_scale must be one of"),
        ({"format": "nvfp4", "noise": "row", "mode": "sr"}, "noise='row'"),
        ({"format": "mxfp4", "scale_rule": "absmax"}, "needs a scale of format"),
        ({"format": "nvfp4", "block": (16, 16), "rht": 16}, "rht applies to 1-D blocks"),
        ({"format": "fp8_e4m3_tensor", "block": 32}, "one scale per tensor"),
    ],
)
def test_bad_specs_raise_naming_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        QuantSpec(**kwargs)  # type: ignore[arg-type]


def test_nvfp4_takes_a_hadamard_size_for_rht_and_names_rht_and_the_sizes_otherwise() -> None:
    """rht=True is TE's 16 (the default), False none, and a Hadamard size a larger
    rotation; anything else raises naming rht and the allowed values (not rht_bf16)."""
    assert srnn.nvfp4(rht=True) == srnn.nvfp4()
    wider = srnn.nvfp4(rht=32)
    for role in ("wgrad_grad_output", "wgrad_input"):
        assert (wider.spec(role).rht, wider.spec(role).rht_bf16) == (32, True)
    with pytest.raises(
        ValueError,
        match=r"rht must be True \(16\), False or a Hadamard size in 16, 32, 64, 128, 256; got 24",
    ):
        srnn.nvfp4(rht=24)
    with pytest.raises(TypeError, match=r"rht must be a bool or a Hadamard size \(16, 32"):
        srnn.nvfp4(rht="16")  # type: ignore[arg-type]


def test_bad_recipes_raise_naming_the_argument() -> None:
    with pytest.raises(TypeError, match="fprop_input must be a QuantSpec"):
        Recipe(fprop_input="nvfp4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be in"):
        Recipe(seed=-1)
    with pytest.raises(ValueError, match="not a regular expression"):
        Recipe(keep=("(",))
    with pytest.raises(ValueError, match="unknown Recipe keys"):
        Recipe.from_dict({"nme": "x"})
    with pytest.raises(ValueError, match="unknown QuantSpec keys"):
        QuantSpec.from_dict({"fmt": "nvfp4"})
    with pytest.raises(ValueError, match="role must be one of"):
        srnn.nvfp4().spec("input")
    with pytest.raises(ValueError, match="bwd_stochastic_rounding must be one of"):
        srnn.int8("gaussian")


def test_a_hardware_preset_rounds_the_operand_as_blocks_quantize_does() -> None:
    """QuantSpec(hardware=...) quantizes its operand with the preset (Transformer Engine's
    8-bit software SR for e2m1), the bits of ``sr.blocks.quantize(..., hardware=...)``,
    which differ from the core's exact SR (8 of the word's 32 bits decide: about one
    element in 256 rounds the other way, dozens of 16384); it prints, round-trips through
    JSON, and refuses what the preset cannot do."""
    from stochround.nn.operands import Operand, quantize_operand

    spec = QuantSpec("nvfp4", "sr", hardware="transformer-engine-sr-e2m1")
    assert "hardware=transformer-engine-sr-e2m1" in str(Recipe(dgrad_grad_output=spec))
    assert QuantSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    operand = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    entry = Operand("dgrad_grad_output", spec, spec.block_format())
    got = quantize_operand(operand, entry, 5, 7, None)
    preset = sr.blocks.quantize(operand, "nvfp4", "sr", seed=5, offset=7, hardware=spec.hardware)
    exact = sr.blocks.quantize(operand, "nvfp4", "sr", seed=5, offset=7)
    assert torch.equal(got.values, sr.blocks.gemm_operand_of(preset).values)
    assert torch.equal(got.tensor_scale, preset.tensor_scale)  # type: ignore[arg-type]
    assert not torch.equal(got.values, sr.blocks.gemm_operand_of(exact).values)
    with pytest.raises(ValueError, match="rounds to e2m1"):
        QuantSpec("mxfp8_e4m3", "sr", hardware="transformer-engine-sr-e2m1")
    with pytest.raises(ValueError, match="sets rbits and variant"):
        QuantSpec("nvfp4", "sr", rbits=8, hardware="transformer-engine-sr-e2m1")


def test_native_gemms_are_a_choice_of_per_tensor_fp8_recipes() -> None:
    recipe = srnn.fp8(native=True)
    assert recipe.gemm == "native" and srnn.fp8().gemm == "emulated"
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    saved_before = {k: v for k, v in srnn.fp8().to_dict().items() if k != "gemm"}
    assert Recipe.from_dict(saved_before) == srnn.fp8()  # a dict saved before the field
    assert "GEMMs: native" in recipe.describe()
    with pytest.raises(ValueError, match="gemm must be one of"):
        srnn.fp8().replace(gemm="fast")
    with pytest.raises(ValueError, match="these roles are not: fprop_input"):
        srnn.nvfp4().replace(gemm="native")
    with pytest.raises(TypeError, match="native must be a bool"):
        srnn.fp8(native=1)  # type: ignore[arg-type]
