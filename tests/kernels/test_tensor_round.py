"""The per-tensor operand kernel (`stochround.kernels.tensor_round`) equals the PyTorch path
it fuses bit for bit: ``cast(x * multiplier.reshape(1), dtype, mode, sat="finite", ...)``
as float8 codes or ``.to(torch.bfloat16)``, and its transposed copy ``.T.contiguous()``;
fp32, bf16 and fp16 inputs, e4m3fn and e5m2, RN and SR (exact and limited random bits,
several variants, seeds and offsets), zeros, subnormal tails, values at and past the
format's max, infinities and NaN, ragged tiles; and `tensor_scaled_operand` takes it on
the CUDA route with its operand and transpose equal to the PyTorch path's."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor

import stochround as sr
from stochround.formats import format_of_dtype
from stochround.kernels import tensor_round as tensor_round_module
from stochround.kernels.availability import INTERPRETED, cpu_as_cuda
from stochround.kernels.tensor_round import TensorRounding, nearest_float8_serves, tensor_round
from stochround.kernels.transpose import TILE
from stochround.nn import operands
from stochround.nn.recipes import TENSOR_FORMATS, QuantSpec
from stochround.random import seed_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# (mode, rbits, variant): RN, exact SR and the limited-bit SR a spec can ask for
ROUNDINGS = [("rne", None, "c"), ("sr", None, "c"), ("sr", 8, "a"), ("sr", 13, "b"),
             ("sr", 5, "odd")]  # fmt: skip
SPECIALS = [0.0, -0.0, 448.0, -448.0, 449.0, 464.0, 480.0, -1e4, 57344.0, -61440.0, 1e6,
            float("inf"), -float("inf"), float("nan"), 2.0**-9, -(2.0**-10), 3 * 2.0**-11,
            2.0**-16, 2.0**-17, -(2.0**-18), 1e-40, 2.0**-126, 1.5 * 2.0**-7]  # fmt: skip


def operand_values(shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """Random values over seven decades, the specials (zeros, the formats' max and beyond,
    infinities, NaN, subnormal tails of both formats and of fp32) at the front, in
    ``dtype`` on the test device."""
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    x = torch.randn(shape, generator=g) * torch.logspace(-4, 3, shape[1])
    flat = x.view(-1)
    count = min(len(SPECIALS), flat.numel())
    flat[:count] = torch.tensor(SPECIALS[:count])
    return x.to(dtype).to(DEVICE)


def reference(
    x: Tensor, multiplier: Tensor, dtype: torch.dtype, rounding: tuple, seed: int, offset: int,
    output: str,
) -> Tensor:  # fmt: skip
    """The PyTorch path: the fp32 product, the core's cast with finite saturation, and the
    GEMM's bf16 values."""
    mode, rbits, variant = rounding
    words = {"seed": seed, "offset": offset, "rbits": rbits} if mode == "sr" else {}
    codes = sr.cast(
        x * multiplier.reshape(1), dtype, mode, variant=variant, sat="finite", backend="torch",
        **words,
    )  # fmt: skip
    return codes if output == "codes" else codes.to(torch.bfloat16)


def assert_same_bits(got: Tensor, want: Tensor) -> None:
    """Equal dtype and shape, and bits: float8 codes byte for byte, bf16 values bit for bit
    where not NaN (a float8 NaN's bf16 payload is the device's conversion's) and NaN where
    NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    if got.dtype != torch.bfloat16:
        assert torch.equal(got.view(torch.uint8).cpu(), want.view(torch.uint8).cpu())
        return
    got, want = got.cpu(), want.cpu()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def kernel_call(
    x: Tensor, multiplier: Tensor, dtype: torch.dtype, rounding: tuple, seed: int, offset: int,
    output: str, transpose: bool = True,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    mode, rbits, variant = rounding
    choices = TensorRounding(format_of_dtype(dtype), mode, rbits or 32, variant, output)
    words = (None, None)
    if mode == "sr":
        words = (seed_tensor(seed, "seed", x.device), seed_tensor(offset, "offset", x.device))
    return tensor_round(x, multiplier, choices, *words, transpose)


@pytest.mark.parametrize("output", ["codes", "bfloat16"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_the_kernel_equals_the_pytorch_path_and_its_transpose(
    x_dtype: torch.dtype, dtype: torch.dtype, rounding: tuple, output: str
) -> None:
    x = operand_values((70, 132), x_dtype)
    # the specials as they are, and a multiplier that rounds the products and sends the
    # larger ones past the max
    streams = ((5, 11), (2**63 + 3, 2**40 + 1)) if rounding[0] == "sr" else ((0, 0),)
    for multiplier_value in (1.0, 0.7373046875 * 2**9):
        multiplier = torch.tensor(multiplier_value, device=DEVICE)
        for seed, offset in streams:
            want = reference(x, multiplier, dtype, rounding, seed, offset, output)
            got, got_t = kernel_call(x, multiplier, dtype, rounding, seed, offset, output)
            assert_same_bits(got, want)
            assert got_t is not None
            assert_same_bits(got_t, want.T.contiguous())


@pytest.mark.parametrize("shape", [(1, 1), (TILE, TILE), (67, 129), (3, 2 * TILE + 6)])
@pytest.mark.parametrize("rounding", [ROUNDINGS[0], ROUNDINGS[1], ROUNDINGS[2]])
def test_ragged_tiles_and_rows_of_any_length_draw_each_elements_word(
    shape: tuple[int, int], rounding: tuple
) -> None:
    """Shapes that fill no tile, rows whose length is no multiple of four (each element's
    word drawn alone, not by runs of four), a single element; without a transpose."""
    x = operand_values(shape, torch.float32)
    multiplier = torch.tensor(2.5, device=DEVICE)
    for dtype in FLOAT8:
        want = reference(x, multiplier, dtype, rounding, 9, 3, "codes")
        got, got_t = kernel_call(x, multiplier, dtype, rounding, 9, 3, "codes", transpose=False)
        assert got_t is None
        assert_same_bits(got, want)


@pytest.mark.parametrize("output", ["codes", "bfloat16"])
@pytest.mark.parametrize("dtype", FLOAT8)
def test_round_to_nearest_equals_the_pytorch_path_on_every_bf16_pattern(
    dtype: torch.dtype, output: str
) -> None:
    """The round-to-nearest arithmetic for float8 (`nearest_float8_serves`): every bf16 bit
    pattern (zeros, subnormals, both formats' subnormal and overflow ranges, infinities,
    NaNs), as it is and times a multiplier that rounds the products."""
    x = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x.reshape(256, 256).to(DEVICE)
    for multiplier_value in (1.0, 0.7373046875 * 2**9):
        multiplier = torch.tensor(multiplier_value, device=DEVICE)
        want = reference(x, multiplier, dtype, ROUNDINGS[0], 0, 0, output)
        got, got_t = kernel_call(x, multiplier, dtype, ROUNDINGS[0], 0, 0, output)
        assert_same_bits(got, want)
        assert got_t is not None
        assert_same_bits(got_t, want.T.contiguous())


def test_the_float8_round_to_nearest_arithmetic_serves_e4m3fn_and_e5m2_rne_only() -> None:
    for name in ("e4m3fn", "e5m2"):
        fmt = sr.format(name)
        assert nearest_float8_serves(TensorRounding(fmt, "rne", 32, "c", "codes"))
        assert not nearest_float8_serves(TensorRounding(fmt, "sr", 32, "c", "codes"))
    for name in ("e4m3fnuz", "e5m2fnuz"):  # no -0: the general arithmetic
        fmt = sr.format(name)
        assert not nearest_float8_serves(TensorRounding(fmt, "rne", 32, "c", "bfloat16"))


def test_products_below_fp32s_normals_are_kept_not_flushed() -> None:
    """fp32 products in fp32's subnormal range (x times a tiny multiplier) round as the
    PyTorch path's exact products do: here all to (signed) zero codes, and with a multiplier
    that lifts them, the format's subnormals."""
    x = (torch.tensor([[2.0**-20, -(2.0**-21), 3 * 2.0**-22, 1.0]]) * 2.0**-100).to(DEVICE)
    for multiplier_value in (2.0**-10, 2.0**120, 2.0**127):
        multiplier = torch.tensor(multiplier_value, device=DEVICE)
        for dtype in FLOAT8:
            want = reference(x, multiplier, dtype, ROUNDINGS[0], 0, 0, "codes")
            got, _ = kernel_call(x, multiplier, dtype, ROUNDINGS[0], 0, 0, "codes")
            assert_same_bits(got, want)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("name", list(TENSOR_FORMATS))
@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_the_cuda_route_takes_the_kernel_with_the_pytorch_paths_operand_and_transpose(
    name: str, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tensor_scaled_operand` on the CUDA route (one kernel pass, the transpose written
    with it) equals the CPU path's operand and `transposed_operand` of it, for a bf16
    operand and a step's one-element offset."""
    spec = QuantSpec(name, mode, rbits=10 if mode == "sr" else None)
    fmt = spec.block_format()
    x = operand_values((48, 72), torch.bfloat16)
    x = torch.where(torch.isfinite(x), x, 0.0)  # an amax to scale by
    offset = torch.tensor([17], dtype=torch.int64, device=DEVICE)
    want_t: list = []
    want = operands.tensor_scaled_operand(x.cpu(), fmt, spec, 7, offset.cpu(), native, want_t)
    calls = []
    original = tensor_round_module.tensor_round

    def spy(*args: object) -> object:
        calls.append(args[-1])
        return original(*args)  # type: ignore[arg-type]

    def no_cast(*args: object, **kwargs: object) -> None:
        raise AssertionError("the CUDA route rounds by the kernel, not by cast")

    monkeypatch.setattr(tensor_round_module, "tensor_round", spy)
    monkeypatch.setattr(operands, "cast", no_cast)
    got_t: list = []
    with cpu_as_cuda() if DEVICE == "cpu" else contextlib.nullcontext():
        got = operands.tensor_scaled_operand(x, fmt, spec, 7, offset, native, got_t)
    assert calls == [True]  # one pass, the transpose written with it
    assert torch.equal(got.tensor_scale.cpu(), want.tensor_scale)  # type: ignore[union-attr]
    assert_same_bits(got.values, want.values.to(got.values.device))
    assert_same_bits(got_t[0].values, want_t[0].values.to(got.values.device))
    assert got_t[0].tensor_scale is got.tensor_scale


def test_the_refusal_names_what_the_kernel_does_not_take() -> None:
    fmt = TENSOR_FORMATS["fp8_e4m3_tensor"]
    x = torch.ones(4, 8)
    assert operands.tensor_operand_refusal(x, fmt, False) is None
    assert "2-D contiguous" in str(operands.tensor_operand_refusal(x.T, fmt, False))
    assert "2-D contiguous" in str(operands.tensor_operand_refusal(x.view(-1), fmt, True))
    refusal = operands.tensor_operand_refusal(x.to(torch.float64), fmt, False)
    assert "fp32/bf16/fp16 operands, not torch.float64" in str(refusal)
