"""The two-orientation quantizer's records (`stochround.kernels.two_orientation`): how each
orientation's blocks are quantized (`Orientation`, a constexpr, made by `orientation`) and
what a call returns (`PairOperands`; the tensor scales a transient pair keeps,
`PairScales`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..formats import Format
from .block_math import BlockScale, ElementFormat, ElementRounding, element_rounding
from .block_math import element_format as element_record

__all__ = ["Orientation", "PairOperands", "PairScales", "orientation", "pair_scales"]


class Orientation(NamedTuple):
    """How one orientation's blocks are quantized (constexpr): the scale (NVFP4's rule,
    its flavour and tensor scales), the element format and its rounding; FAST_E2M1: the
    elements are e2m1 rounded to nearest even or by SR variant a or c, which
    `e2m1_operand.e2m1_value` rounds (else `fast_round` or `general_round`); RECORD: its
    amax (after the rotation) raised into its ``record`` (`block_kernel.raise_record`)."""

    SCALE: BlockScale
    ELEMENT: ElementFormat
    ROUNDING: ElementRounding
    FAST_E2M1: bool = False
    RECORD: bool = False


def orientation(
    fmt: Format,
    mode: str,
    n: int,
    variant: str,
    tensor_scales: int,
    record: bool = False,
    flavour: str = "te",
) -> Orientation:
    """The `Orientation` record of NVFP4 blocks of ``fmt`` elements (e2m1) with
    ``tensor_scales`` fp32 tensor scales (0 or 2: S_dec and S_enc) of the ``flavour``
    ("te", or "pow2", whose operand values hold the tensor scale), its amax recorded where
    ``record`` (`Orientation.RECORD`; it needs the tensor scales).  ValueError for other
    elements (the kernel stores each product of an element and its E4M3 scale as the bf16
    that holds it exactly, which e2m1's do) and flavours, and for "pow2" with a record
    (delayed scales: a given tensor scale need not be a power of two)."""
    if fmt.name != "e2m1":
        raise ValueError(f"fmt must be e2m1 (NVFP4's elements); got {fmt.name!r}")
    if flavour not in ("te", "pow2"):
        raise ValueError(f"flavour must be 'te' or 'pow2'; got {flavour!r}")
    if flavour == "pow2" and record:
        raise ValueError("flavour 'pow2' computes its tensor scales: no record (delayed scales)")
    scale = BlockScale(RULE="nvfp4", FLAVOUR=flavour, TENSOR_SCALE=tensor_scales, AMAX_GIVEN=False)
    rounding = element_rounding(fmt, mode, n, variant)
    if record and tensor_scales == 0:
        raise ValueError("record applies to operands with tensor scales")
    fast = mode == "rne" or (mode == "sr" and variant in ("a", "c"))
    return Orientation(scale, element_record(fmt, mode), rounding, fast, record)


class PairOperands(NamedTuple):
    """The two operands' values (bf16) and tensor scales (S_dec, S_enc of the row-wise
    operand then of the column-wise one, a 4-element fp32 tensor; None where the operands
    have none), and each operand's S_dec (``decodes``: row-wise, column-wise; 0-d views of
    ``scales``, which the GEMMs take; None where the values hold them: "pow2")."""

    row: Tensor
    column: Tensor
    scales: Tensor | None
    decodes: tuple[Tensor, Tensor] | None = None


class PairScales(NamedTuple):
    """Both operands' tensor scales (4 fp32: S_dec, S_enc of the row-wise operand, then of
    the column-wise one) and each operand's S_dec (0-d views: row-wise, column-wise)."""

    scales: Tensor
    decodes: tuple[Tensor, Tensor]


def pair_scales(x: Tensor) -> PairScales:
    """New `PairScales` on x's device: an allocation, and the S_dec views by one op."""
    scales = x.new_empty(4, dtype=torch.float32)
    row_decode, _, column_decode, _ = scales.unbind(0)
    return PairScales(scales, (row_decode, column_decode))
