"""Round-to-nearest block quantization bit-exact against independent oracles: torchao's
`to_mx` (every scale rule and element dtype it takes), `nvfp4_quantize` (the "torchao"
flavour), `quantize_int8_rowwise`, and gfloat's `quantize_block` for MX.  Where we differ
on purpose (the bottom of E8M0's range), a test shows with exact arithmetic that ours is
right."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from gfloat import block as gblock
from gfloat import formats as gf

from stochround import blocks

with warnings.catch_warnings():  # torchao warns about its optional CUDA extensions
    warnings.simplefilter("ignore")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import (
        nvfp4_quantize,
        per_tensor_amax_to_scale,
    )
    from torchao.prototype.quantized_training.int8 import quantize_int8_rowwise

TORCHAO_ELEMENTS = {
    "mxfp8_e4m3": torch.float8_e4m3fn,
    "mxfp8_e5m2": torch.float8_e5m2,
    "mxfp6_e2m3": DTYPE_FP6_E2M3,
    "mxfp6_e3m2": DTYPE_FP6_E3M2,
    "mxfp4": torch.float4_e2m1fn_x2,
}
TORCHAO_RULES = {
    "floor": ScaleCalculationMode.FLOOR,
    "ceil": ScaleCalculationMode.CEIL,
    "even": ScaleCalculationMode.EVEN,
    "rceil": ScaleCalculationMode.RCEIL,
}


def _data(dtype: torch.dtype, rows: int = 32, cols: int = 256) -> torch.Tensor:
    """Gaussian values whose blocks span 2**-30 .. 2**30, one all-zero block, and ties of
    the element grids (multiples of small powers of two)."""
    torch.manual_seed(0)
    x = torch.randn(rows, cols) * torch.exp2(torch.linspace(-30, 30, cols))
    x[1, :32] = 0
    x[2] = torch.randint(-64, 64, (cols,)) * 0.125
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rule", list(TORCHAO_RULES))
@pytest.mark.parametrize("name", list(TORCHAO_ELEMENTS))
def test_mx_round_to_nearest_equals_torchao_to_mx(name: str, rule: str, dtype: torch.dtype) -> None:
    x = _data(dtype)
    scale, data = to_mx(x, TORCHAO_ELEMENTS[name], 32, TORCHAO_RULES[rule])
    q = blocks.quantize(x, name, scale_rule=rule)
    assert torch.equal(q.scales.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(q.codes.view(torch.uint8), data.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_torchao_flavour_equals_nvfp4_quantize(two_level: bool, dtype: torch.dtype) -> None:
    x = _data(dtype, cols=128) * 1e-4  # blocks under and above the 2**-6 clamp
    per_tensor = per_tensor_amax_to_scale(x.abs().amax()) if two_level else None
    scale, data = nvfp4_quantize(x, 16, per_tensor)
    q = blocks.quantize(
        x, "nvfp4", nvfp4_flavour="torchao", tensor_scale=None if two_level else False
    )
    assert torch.equal(q.scales.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(q.codes, data)
    if two_level:
        assert per_tensor is not None and q.tensor_scale is not None
        assert torch.equal(q.tensor_scale, per_tensor.reshape(()))


def test_nvfp4_torchao_flavour_takes_a_given_tensor_scale_as_nvfp4_quantize() -> None:
    x = _data(torch.float32, cols=64)
    given = torch.tensor(0.03125)
    scale, data = nvfp4_quantize(x, 16, given)
    q = blocks.quantize(x, "nvfp4", nvfp4_flavour="torchao", tensor_scale=given)
    assert torch.equal(q.scales.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(q.codes, data)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_rowwise_equals_quantize_int8_rowwise(dtype: torch.dtype) -> None:
    x = _data(dtype)
    codes, scale = quantize_int8_rowwise(x)
    q = blocks.quantize(x, "int8_rowwise")
    assert torch.equal(q.codes, codes)
    assert q.scales.dtype == dtype
    assert torch.equal(q.scales.squeeze(-1), scale)


GFLOAT_FORMATS = {
    "mxfp8_e4m3": gf.format_info_mxfp8_e4m3,
    "mxfp8_e5m2": gf.format_info_mxfp8_e5m2,
    "mxfp6_e2m3": gf.format_info_mxfp6_e2m3,
    "mxfp6_e3m2": gf.format_info_mxfp6_e3m2,
    "mxfp4": gf.format_info_mxfp4_e2m1,
    "mxint8": gf.format_info_mxint8,
}


@pytest.mark.parametrize("name", list(GFLOAT_FORMATS))
def test_mx_dequantized_values_equal_gfloat_quantize_block(name: str) -> None:
    x = _data(torch.float32, rows=4, cols=256)
    q = blocks.quantize(x, name)
    ours = q.dequantize(torch.float64).numpy().reshape(-1, 32)
    values = x.double().numpy().reshape(-1, 32)
    for block, got in zip(values, ours, strict=True):
        want = gblock.quantize_block(GFLOAT_FORMATS[name], block, gblock.compute_scale_amax)
        assert np.array_equal(got, want), name


@pytest.mark.parametrize("name", list(GFLOAT_FORMATS))
def test_mx_codes_equal_gfloat_encode_block(name: str) -> None:
    x = _data(torch.float32, rows=3, cols=128)
    q = blocks.quantize(x, name)
    fi = GFLOAT_FORMATS[name]
    codes = q.codes.view(torch.uint8)
    if name == "mxfp4":
        from stochround.packing import unpack

        codes = unpack(codes, 4)
    codes = codes.reshape(-1, 32).tolist()
    scale_codes = q.scales.view(torch.uint8).reshape(-1).tolist()
    for block, got, scale_code in zip(
        x.double().numpy().reshape(-1, 32), codes, scale_codes, strict=True
    ):
        scale = gblock.compute_scale_amax(fi.etype.emax, block)
        want = list(gblock.encode_block(fi, scale, block / scale))
        assert [scale_code, *got] == want


def test_the_bottom_of_e8m0_keeps_the_values_where_torchao_halves_them() -> None:
    # amax 2**-120 in e4m3 (emax 8): floor(log2 amax) - 8 = -128 clamps to -127.  The
    # elements are x / 2**-127; torchao divides by max(2**-127, 2**-126) and halves them.
    x = torch.tensor([[2.0**-120, 2.0**-121, -(2.0**-122) * 1.5] + [0.0] * 29])
    q = blocks.quantize(x, "mxfp8_e4m3")
    assert q.scales.view(torch.uint8).item() == 0  # 2**-127
    exact = [Fraction(v) for v in x[0].tolist()]
    got = [Fraction(v) for v in q.dequantize(torch.float64)[0].tolist()]
    assert got == exact  # every value is representable: quantization is exact
    scale, data = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)
    assert scale.view(torch.uint8).item() == 0
    theirs = data.float()[0] * 2.0**-127
    assert theirs.tolist()[:3] == [v / 2 for v in x[0].tolist()[:3]]


def test_the_bottom_of_e8m0_under_rceil_keeps_the_values_where_torchao_flushes_them() -> None:
    # amax / 448 below 2**-127: the scale is 2**-127, torchao multiplies by 1 (not 2**127)
    x = torch.tensor([[2.0**-130, -(2.0**-131)] + [0.0] * 30])
    q = blocks.quantize(x, "mxfp8_e4m3", scale_rule="rceil")
    assert q.scales.view(torch.uint8).item() == 0
    assert q.dequantize()[0, :2].tolist() == [2.0**-130, -(2.0**-131)]
    _, data = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    assert data.float()[0, :2].tolist() == [0.0, -0.0]
