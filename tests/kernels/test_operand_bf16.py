"""MXFP8 GEMM operands as exact bf16 values: the kernel equals its PyTorch spec
(`stochround.blocks.gemm.bf16_row_shifts`) bit for bit, and the bf16 values times their
row scale give the fp32 values back exactly wherever a row spans at most bf16's range."""

from __future__ import annotations

import pytest
import torch

from stochround.blocks.gemm import (
    bf16_row_shifts,
    exact_bf16_operand,
    power_of_two_fp32,
)
from stochround.blocks.quantize import GemmOperand, gemm_operand
from stochround.blocks.scales import exact_floor_log2
from stochround.kernels.availability import INTERPRETED

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)
E4M3_MBITS = 3


def mxfp8_values() -> torch.Tensor:
    """fp32 MXFP8 operand values (e4m3 elements times E8M0 scales) whose rows reach every
    case: ordinary rows, a row of blocks at the smallest scale 2**-127 (elements down to
    2**-136, below bf16's subnormals), a zero row, a row of bf16-subnormal inputs, a row
    with a NaN and an infinity, a row from 2**-120 to 2**100."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g)
    x[1] *= 2.0**-124  # blocks at scale 2**-127 (amax ~2**-122 .. 2**-119: k = -127)
    x[2] = 0.0
    x[3] = torch.randn(256, generator=g) * 2.0**-131
    x[5, ::2] *= 2.0**-120
    x[5, 1::2] *= 2.0**100
    values = gemm_operand(x, "mxfp8_e4m3", "sr", seed=1, backend="torch").values
    assert values.dtype == torch.float32
    values[4, 7] = float("nan")
    values[4, 9] = float("inf")
    return values


def test_the_shift_makes_every_value_exact_in_bf16() -> None:
    values = mxfp8_values()
    shifts = bf16_row_shifts(values, E4M3_MBITS)
    shifted = (values * power_of_two_fp32(shifts)).to(torch.bfloat16)
    back = shifted.float() * power_of_two_fp32(-shifts)
    assert torch.equal(back.nan_to_num(), values.nan_to_num())
    # rows below bf16's subnormals take a shift, the others none
    assert shifts[1].item() > 0 and shifts[3].item() > 0
    assert shifts[[0, 2, 4, 6, 7]].eq(0).all()
    # without the shift, those rows would lose bits in bf16
    assert not torch.equal(values[1].to(torch.bfloat16).float(), values[1])


def test_the_shift_is_the_smallest_that_keeps_the_lowest_bit() -> None:
    """s = -133 + 3 - floor(log2 min|v|): the smallest nonzero value's lowest bit lands on
    bf16's smallest subnormal 2**-133, or higher."""
    values = torch.tensor([[2.0**-136, 1.0], [2.0**-130, 0.0], [0.0, 0.0], [2.0**-140, 2.0**120]])
    shifts = bf16_row_shifts(values, E4M3_MBITS).flatten().tolist()
    # the last row cannot take its 10: 2**120 leaves room for 7 (127 - 120)
    assert shifts == [6, 0, 0, 7]


def test_floor_log2_reads_subnormals_exactly() -> None:
    values = torch.tensor([2.0**-149, 2.0**-127, 3 * 2.0**-140, 2.0**-126, 1.5, 2.0**127])
    assert exact_floor_log2(values).tolist() == [-149, -127, -139, -126, 0, 127]


@needs_triton
def test_the_kernel_is_the_spec_bit_for_bit() -> None:
    from stochround.kernels.operand_bf16 import exact_bf16_rows

    values = mxfp8_values()
    shifts = bf16_row_shifts(values, E4M3_MBITS)
    expected = (values * power_of_two_fp32(shifts)).to(torch.bfloat16)
    got, unshift = exact_bf16_rows(values.to(DEVICE), E4M3_MBITS)
    got = got.cpu()
    # a NaN stays a NaN (its payload is no part of the contract)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    assert torch.equal(unshift.cpu(), power_of_two_fp32(-shifts))


def test_an_operand_keeps_its_value_and_takes_the_shift_into_its_row_scale() -> None:
    values = mxfp8_values()[:4]
    operand = GemmOperand(values, None, None, 1.0)
    got = exact_bf16_operand(operand, E4M3_MBITS)
    assert got.values.dtype == torch.bfloat16 and got.row_scale is not None
    assert torch.equal(got.values.float() * got.row_scale, values)
    with pytest.raises(ValueError, match=r"operand\.values must be 2-D fp32"):
        exact_bf16_operand(GemmOperand(values.double(), None, None, 1.0), E4M3_MBITS)
