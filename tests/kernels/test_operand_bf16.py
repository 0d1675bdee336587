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


def block_inputs(dtype: torch.dtype) -> torch.Tensor:
    """Inputs whose MXFP8 operand reaches every case of the quantizer's flags: ordinary
    rows, a row of blocks at scale 2**-127 (values below bf16's subnormals: flagged), a
    zero row, a row of subnormal inputs, a row with a NaN and an infinity, a row of
    ordinary blocks and one at scale 2**-127, a row whose blocks from 2**-127 to 2**125
    leave no room for the shift (its smallest values round), a row of one tiny block."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 256, generator=g)
    x[1] *= 2.0**-124
    x[2] = 0.0
    x[3] = torch.randn(256, generator=g) * 2.0**-131
    x[4, 7] = float("nan")
    x[4, 40] = float("inf")
    x[5, 64:96] *= 2.0**-130
    x[6, :128] *= 2.0**-130
    x[6, 128:] *= 2.0**125
    x[6, 200] = 1.5 * 2.0**127
    x[7] *= 2.0**-100
    x[7, 224:] *= 2.0**-30
    return x.to(dtype)


def prepared_blocks(x: torch.Tensor, element: str, mode: str, exact: bool) -> object:
    from stochround.blocks.formats import block_format
    from stochround.kernels.blocks import PreparedGemmBlocks

    fmt = block_format(f"mxfp8_{element}")
    return PreparedGemmBlocks(
        x,
        fmt.element.name,
        32,
        fmt.scale_rule,
        out_dtype=torch.bfloat16 if exact else torch.float32,
        tensor_scales=0,
        amax_given=False,
        rht_signs=None,
        mode=mode,
        exact_bf16=exact,
    )


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["rne", "sr"])
@pytest.mark.parametrize(("element", "mbits"), [("e4m3", 3), ("e5m2", 2)])
def test_the_quantizers_bf16_operand_is_the_two_passes_bit_for_bit(
    element: str, mbits: int, mode: str, dtype: torch.dtype
) -> None:
    """The quantizer's bf16 values and flags, then the flagged rows' pass, equal the fp32
    operand then `exact_bf16_rows` (and the PyTorch spec), rows at scale 2**-127 too."""
    from stochround.kernels.operand_bf16 import exact_bf16_rows

    x = block_inputs(dtype).to(DEVICE)
    stream = (torch.tensor([7]).to(DEVICE), torch.tensor([3]).to(DEVICE))
    fp32 = prepared_blocks(x, element, mode, exact=False).launch(x, None, None, None, *stream)
    expected, expected_unshift = exact_bf16_rows(fp32, mbits)
    fused = prepared_blocks(x, element, mode, exact=True)
    got, unshift = fused.launch_exact(x, None, None, None, *stream)
    assert got.dtype == torch.bfloat16 and unshift.shape == (8, 1)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(unshift, expected_unshift)
    # the spec: each row times 2**s in bf16 (rows 1, 3, 5, 7 shifted, row 6 capped at 0)
    shifts = bf16_row_shifts(fp32.cpu(), mbits)
    spec = (fp32.cpu() * power_of_two_fp32(shifts)).to(torch.bfloat16)
    nan = spec.isnan()
    assert torch.equal(got.cpu().isnan(), nan)
    assert torch.equal(got.cpu()[~nan].view(torch.int16), spec[~nan].view(torch.int16))
    assert shifts[[1, 3, 5, 7]].gt(0).all() and shifts[[0, 2, 4, 6]].eq(0).all()
    # the flags: the blocks holding a value below 2**(mbits - 133)
    flags = torch.empty(8, 8, dtype=torch.uint8).to(DEVICE)
    values = fused.launch(x, None, None, None, *stream, flags)
    magnitude = fp32.abs().view(8, 8, 32)
    below = ((magnitude > 0) & (magnitude < 2.0 ** (mbits - 133))).any(dim=2)
    assert torch.equal(flags.bool(), below) and below[[1, 3, 5, 6, 7]].any(dim=1).all()
    # an unflagged block is stored as its bf16 values, a flagged one times 2**16
    factor = torch.where(below, 2.0**16, 1.0).repeat_interleave(32, dim=1)
    stored = (fp32 * factor).to(torch.bfloat16)
    assert torch.equal(values.isnan(), stored.isnan())
    assert torch.equal(values[~stored.isnan()], stored[~stored.isnan()])


@needs_triton
def test_the_flagged_rows_pass_leaves_a_row_without_flags_and_checks_its_arguments() -> None:
    from stochround.kernels.operand_bf16 import flag_bits, shift_flagged_rows

    # an unflagged row is left as it is, even a value that its shift would move
    values = torch.tensor([[2.0**-133, 1.0], [2.0**-120, 3.0]], dtype=torch.bfloat16)
    flags = torch.tensor([[0], [0]], dtype=torch.uint8)
    got, unshift = shift_flagged_rows(values.clone().to(DEVICE), flags.to(DEVICE), 2, 3)
    assert torch.equal(got.cpu().view(torch.int16), values.view(torch.int16))
    assert unshift.cpu().flatten().tolist() == [1.0, 1.0]
    assert flag_bits(3) == torch.tensor(2.0**-130).view(torch.int32).item()
    assert flag_bits(7) == torch.tensor(2.0**-126).view(torch.int32).item()
    with pytest.raises(ValueError, match=r"mbits must be an int in 0\.\.7"):
        flag_bits(8)
    with pytest.raises(ValueError, match=r"flags contiguous uint8, one a block of 2"):
        shift_flagged_rows(values, flags.to(torch.int32), 2, 3)


@needs_triton
def test_an_exact_launch_needs_a_bf16_operand_of_power_of_two_scales() -> None:
    from stochround.kernels.blocks import PreparedGemmBlocks

    x = torch.randn(4, 64).to(DEVICE)
    options = {"tensor_scales": 0, "amax_given": False, "rht_signs": None, "exact_bf16": True}
    with pytest.raises(ValueError, match=r"exact_bf16 takes out_dtype torch\.bfloat16"):
        PreparedGemmBlocks(x, "e4m3fn", 32, "floor", out_dtype=torch.float32, **options)
    with pytest.raises(ValueError, match=r"exact_bf16 takes .* power-of-two scale rule"):
        PreparedGemmBlocks(x, "e4m3fn", 32, "absmax", out_dtype=torch.bfloat16, **options)
    plain = prepared_blocks(x, "e4m3", "rne", exact=False)
    with pytest.raises(ValueError, match=r"launch_exact needs a PreparedGemmBlocks made with"):
        plain.launch_exact(
            x,
            None,
            None,
            None,
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
        )  # type: ignore[attr-defined]
