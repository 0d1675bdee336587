"""Mode names are case-insensitive, as format names are (`reference.check_mode`): every entry
point that takes a mode gives for "SR", "Rne" or " rd " the bits it gives for "sr", "rne" or
"rd", and an unknown mode is still a ValueError naming ``mode`` and every allowed value."""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround.emulate.mca import mca
from stochround.nn.recipes import QuantSpec
from stochround.reference import MODES, check_mode, round_value

# each spelling with the mode it names
SPELLINGS = [("SR", "sr"), ("Rne", "rne"), (" rd ", "rd"), ("RO", "ro"), ("rZ", "rz")]
X = torch.linspace(-3.0, 3.0, 64)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN matches NaN of the same bits)."""
    return a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def test_check_mode_returns_the_name_modes_spells():
    assert [check_mode(m) for m, _ in SPELLINGS] == [m for _, m in SPELLINGS]
    assert all(check_mode(m) is m for m in MODES)


@pytest.mark.parametrize("bad", ["up", "s r", "", 3, None])
def test_an_unknown_mode_names_the_argument_and_every_mode(bad):
    allowed = "'rne', 'rna', 'rz', 'ru', 'rd', 'ro', 'sr'"
    with pytest.raises(ValueError, match=f"^mode must be one of {allowed}; got {bad!r}$"):
        check_mode(bad)
    with pytest.raises(ValueError, match=f"mode must be one of {allowed}; got {bad!r}"):
        sr.round(X, "e4m3fn", bad)


@pytest.mark.parametrize(("spelled", "mode"), SPELLINGS)
def test_round_cast_and_encode_take_any_case(spelled, mode):
    assert same_bits(sr.round(X, "e4m3fn", spelled, seed=1), sr.round(X, "e4m3fn", mode, seed=1))
    assert same_bits(sr.encode(X, "e2m1", spelled, seed=1), sr.encode(X, "e2m1", mode, seed=1))
    assert same_bits(
        sr.cast(X, torch.bfloat16, spelled, seed=1), sr.cast(X, torch.bfloat16, mode, seed=1)
    )
    assert round_value(1.3, "e4m3fn", spelled, rand=2**31) == round_value(
        1.3, "e4m3fn", mode, rand=2**31
    )


@pytest.mark.parametrize(("spelled", "mode"), SPELLINGS)
def test_ops_take_any_case(spelled, mode):
    """The elementwise ops and the reductions compare the canonical name (an "RD" exact
    zero is -0 as an "rd" one is; "SR" draws the same words as "sr")."""
    y = -X.flip(0)
    assert same_bits(
        sr.ops.add(X, y, "e4m3fn", spelled, seed=2), sr.ops.add(X, y, "e4m3fn", mode, seed=2)
    )
    assert same_bits(
        sr.ops.fma(X, y, X, "e3m2", spelled, seed=2), sr.ops.fma(X, y, X, "e3m2", mode, seed=2)
    )
    small = X / 64
    assert same_bits(
        sr.ops.sum(small, "e4m3fn", spelled, seed=3), sr.ops.sum(small, "e4m3fn", mode, seed=3)
    )
    assert same_bits(
        sr.ops.dot(small, X, "e4m3fn", spelled, seed=3),
        sr.ops.dot(small, X, "e4m3fn", mode, seed=3),
    )


@pytest.mark.parametrize(("spelled", "mode"), SPELLINGS)
def test_blocks_emulate_and_mca_take_any_case(spelled, mode):
    rows = X.reshape(2, 32)
    assert same_bits(
        sr.blocks.fake_quantize(rows, "mxfp4", mode=spelled, seed=0),
        sr.blocks.fake_quantize(rows, "mxfp4", mode=mode, seed=0),
    )
    results = []
    for name in (spelled, mode):
        with sr.emulate("bfloat16", name, seed=4):
            results.append((X * 1.1).exp())
    assert same_bits(*results)
    first, second = (
        mca(lambda: (X * 1.1).sum(), n=3, precision=8, mode=m) for m in (spelled, mode)
    )
    assert same_bits(first.samples[0], second.samples[0])


def test_a_recipe_keeps_the_canonical_mode():
    """A QuantSpec given "SR" holds "sr": it prints, compares and serializes as one."""
    spec = QuantSpec(format="mxfp4", mode="SR")
    assert spec.mode == "sr" and spec == QuantSpec(format="mxfp4", mode="sr")
    assert QuantSpec(format="mxfp4", mode="SR", rbits=8).rbits == 8  # "SR" is sr for rbits
