"""Decided edge cases of the block formats (issue 40): float64 beyond fp32's range, MXINT8's
symmetric range, given tensor scales, int8 row-wise rows below torchao's eps, empty rows
and the emulated GEMM's operands."""

from __future__ import annotations

import math

import pytest
import torch

import stochround as sr
from stochround import blocks
from stochround.kernels.availability import INTERPRETED

ALL = list(blocks.BLOCK_FORMATS)
MX = [name for name in ALL if name.startswith("mx")]
KERNEL_BACKENDS = ["torch"] + (["triton"] if INTERPRETED or torch.cuda.is_available() else [])
# the device of a backend's tensors: the kernels take CPU tensors only in the interpreter
DEVICE = {"torch": "cpu", "triton": "cpu" if INTERPRETED else "cuda"}

pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """Bit patterns of a float tensor (others as they are), for exact comparison."""
    sizes = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.view(sizes[tensor.element_size()]) if tensor.is_floating_point() else tensor


# --- B: float64 beyond fp32's range -------------------------------------------------------


def _beyond_fp32() -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 x with 1e300 and -1e39 (beyond fp32's range, finite in float64), and the
    fp32 x those values round to: +inf and -inf."""
    x64 = torch.ones(2, 32, dtype=torch.float64)
    x64[0, 0], x64[1, 5] = 1e300, -1e39
    x32 = x64.to(torch.float32)
    assert x32[0, 0].item() == math.inf and x32[1, 5].item() == -math.inf
    return x64, x32


@pytest.mark.parametrize("name", ALL)
def test_float64_beyond_fp32s_range_quantizes_as_the_fp32_infinity_it_rounds_to(name: str) -> None:
    """float64 values are rounded to fp32 before the amax: 1e300 is an fp32 inf, whose
    block is the documented one (MX: the NaN scale, the block NaN; NVFP4: saturated, as
    TE and torchao saturate an inf; int8 row-wise: the row NaN), never a finite block
    scaled by 2**-127 (2.6e-36 for every value)."""
    x64, x32 = _beyond_fp32()
    q64, q32 = blocks.quantize(x64, name), blocks.quantize(x32, name)
    assert torch.equal(_bits(q64.codes), _bits(q32.codes))
    assert q64.scales.dtype == (torch.float64 if name == "int8_rowwise" else q32.scales.dtype)
    assert torch.equal(_bits(q64.scales.to(q32.scales.dtype)), _bits(q32.scales))
    values = q64.dequantize()
    assert values.dtype == torch.float64
    assert torch.equal(_bits(values), _bits(q32.dequantize(torch.float64)))
    faked = blocks.fake_quantize(x64, name)
    assert torch.equal(_bits(faked), _bits(values))
    if name == "nvfp4":  # 6 * 448 * S_dec (1: the tensor amax is infinite)
        assert values[0, 0].item() == 2688.0 and values[1, 5].item() == -2688.0
        assert bool((values[0, 1:16] == 0).all())
    else:  # the block (int8 row-wise: the row) that holds the value is NaN
        assert bool(values[0].isnan().all()) and bool(values[1].isnan().all())


# --- C: MXINT8's symmetric range ----------------------------------------------------------


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_mxint8_clamps_to_its_symmetric_range_and_never_stores_minus_128(backend: str) -> None:
    """At the scale 2**127, code -128 (-2) would dequantize a finite block to -inf: codes
    are clamped to -127..127 (the OCP spec's +-1 63/64, microxcaling's int8 clamp), in
    every mode, on the PyTorch path and the kernel alike."""
    x = torch.full((3, 32), 1.0)
    x[0] = -1.999 * 2.0**127  # floor scale 2**127, scaled -1.999
    x[0, 1] = 1.999 * 2.0**127
    x[1, 0] = -1.999  # scale 1: -1.999 rounds to -2 without the clamp
    x[2, 0] = -2.0  # amax 2: scale 2, scaled -1: exact
    x = x.to(DEVICE[backend])
    for mode, options in (("rne", {}), ("rd", {}), ("sr", {"seed": 3})):
        q = blocks.quantize(x, "mxint8", mode, backend=backend, **options)
        assert q.scales.float()[:, 0].tolist() == [2.0**127, 1.0, 2.0]
        assert q.codes[0, 0].item() == -127 and q.codes[0, 1].item() == 127
        assert q.codes[1, 0].item() == -127 and q.codes[2, 0].item() == -64
        assert int(q.codes.min()) >= -127
        values = q.dequantize()
        assert bool(values.isfinite().all()), mode
        assert values[0, 0].item() == -127 / 64 * 2.0**127
        faked = blocks.fake_quantize(x, "mxint8", mode, backend=backend, **options)
        assert torch.equal(faked, values)


def test_mxint8_marks_the_clamped_values_for_the_clip_mask() -> None:
    x = torch.ones(1, 32, requires_grad=True)
    with torch.no_grad():
        x[0, 0] = -1.999
    out = blocks.fake_quantize(x, "mxint8", clip_mask=True)
    out.sum().backward()
    assert x.grad is not None and x.grad[0, 0].item() == 0.0 and x.grad[0, 1].item() == 1.0
    assert out[0, 0].item() == -127 / 64


# --- D: given tensor scales, int8 row-wise rows below torchao's eps ------------------------


BAD_SCALES = [-1.0, 0.0, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("as_tensor", [False, True], ids=["float", "tensor"])
def test_a_tensor_scale_that_is_not_positive_and_finite_is_refused(
    value: float, as_tensor: bool
) -> None:
    x = torch.randn(4, 32)
    given = torch.tensor(value) if as_tensor else value
    stream = sr.Stream(seed=1)
    message = "tensor_scale must be a positive finite decoding scale"
    with pytest.raises(ValueError, match=message):
        blocks.quantize(x, "nvfp4", "sr", tensor_scale=given, stream=stream)
    assert stream.offset == 0  # refused before drawing
    with pytest.raises(ValueError, match=message):
        blocks.fake_quantize(x, "nvfp4", tensor_scale=given)
    with pytest.raises(ValueError, match=message):
        blocks.gemm_operand(x, "nvfp4", tensor_scale=given)
    with pytest.raises(ValueError, match="tensor_scale must be a floating tensor"):
        blocks.quantize(x, "nvfp4", tensor_scale=torch.tensor(1))


def test_a_positive_tensor_scale_is_its_decoding_scale() -> None:
    x = torch.randn(4, 32)
    for given in (0.25, torch.tensor(0.25), torch.tensor([0.25], dtype=torch.float64)):
        q = blocks.quantize(x, "nvfp4", tensor_scale=given)
        assert q.tensor_scale is not None and q.tensor_scale.item() == 0.25


EPS = 1e-12  # torchao's quantize_int8_rowwise eps


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_rowwise_rows_below_torchaos_eps_store_the_scale_they_are_divided_by(
    backend: str, dtype: torch.dtype
) -> None:
    """A row whose amax / 127 lies below eps = 1e-12 (amax below 1.27e-10) is divided by the
    floor (eps rounded up to x's dtype) and stores that floor as its scale, so it
    dequantizes to x on average under SR. torchao's quantize_int8_rowwise divides by eps
    too but stores amax / 127, which shrinks such a row by (amax / 127) / eps."""
    floor = blocks.scales.absmax_floor(dtype)
    assert floor >= float(torch.tensor(EPS, dtype=torch.float32))
    amax = 64 * floor  # codes up to +-64: a row below the floor's reach of 127 * floor
    x = torch.linspace(-amax, amax, 64, dtype=torch.float64).to(dtype).reshape(1, 64).repeat(2, 1)
    x[1] = x[1] * 2.0**20  # far above the floor: torchao's scale amax / 127, unchanged
    x = x.to(DEVICE[backend])
    q = blocks.quantize(x, "int8_rowwise", backend=backend)
    assert q.scales[0].tolist() == [floor]
    torchao_scale = (x[1].abs().amax() / 127).to(torch.float32)
    assert q.scales[1].to(torch.float32).tolist() == [torchao_scale.item()]
    multiplier = 1.0 / torch.tensor(floor, dtype=torch.float32)
    assert torch.equal(q.codes[0], torch.round(x[0].float() * multiplier).to(torch.int8))
    assert int(q.codes[0].abs().max()) == 64
    draws = 400  # copies of both rows, each drawing its own words (their global indices)
    sr_q = blocks.quantize(x.repeat(draws, 1), "int8_rowwise", "sr", seed=0, backend=backend)
    values = sr_q.codes.double() * sr_q.scales.double()  # exact: what dequantizing rounds
    mean = values.reshape(draws, 2, 64).mean(0)
    # each element's SR error has variance <= scale**2 / 4: the mean of 400 draws is within
    # six standard deviations of x
    for row in range(2):
        scale = float(q.scales[row, 0])
        bound = 6 * 0.5 * scale / math.sqrt(draws)
        assert float((mean[row] - x[row].double()).abs().max()) < bound
    small = torch.full((1, 8), 1e-13, dtype=dtype, device=DEVICE[backend])
    tiny = blocks.quantize(small, "int8_rowwise", backend=backend)
    want = round(float(torch.tensor(1e-13, dtype=dtype)) / floor)
    assert tiny.codes.tolist() == [[want] * 8] and tiny.scales.item() == floor


# --- E: errors ------------------------------------------------------------------------------


def test_whole_row_blocks_of_an_empty_axis_are_refused() -> None:
    message = r"whole-row blocks \(block=None: one scale per row along axis 1\) need a nonempty"
    with pytest.raises(ValueError, match=message):
        blocks.quantize(torch.randn(3, 0), "int8_rowwise")
    with pytest.raises(ValueError, match=message):
        blocks.fake_quantize(torch.randn(3, 0), "int8_rowwise")
    with pytest.raises(ValueError, match="along axis 0"):
        blocks.quantize(torch.randn(0, 3), "int8_rowwise", axis=0)
    assert blocks.quantize(torch.randn(0, 3), "int8_rowwise").codes.shape == (0, 3)


def test_scaled_mm_names_the_operand_that_is_not_a_gemm_operand() -> None:
    a = blocks.gemm_operand(torch.randn(4, 32), "mxfp4")
    with pytest.raises(TypeError, match=r"a must be a GemmOperand: .* got Tensor"):
        blocks.scaled_mm(torch.randn(4, 32), a)  # type: ignore[arg-type]
    q = blocks.quantize(torch.randn(4, 32), "mxfp4")
    message = r"b must be a GemmOperand: .*gemm_operand_of.* BlockTensor"
    with pytest.raises(TypeError, match=message):
        blocks.scaled_mm(a, q)  # type: ignore[arg-type]
