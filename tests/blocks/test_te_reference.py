"""NVFP4's "te" flavour against Transformer Engine's own reference quantizer
(``NVFP4QuantizerRef._quantize_blockwise_reference``, loaded from its file by
`te_reference`), bit for bit: the E4M3 block scales and the e2m1 codes, round to nearest,
1x16 blocks and 16x16 tiles, on the PyTorch path and the Triton kernel (the interpreter
without a GPU).  The one difference is on purpose: a scaled value of -0.0 keeps its sign
(e2m1 code 8, as the element format and an IEEE conversion hold it), where TE's reference
gives code 0 (its test ``x < -0.0`` is false for -0.0); both decode to zero.
"""

from __future__ import annotations

import math

import pytest
import torch
from blocks.te_reference import te_global_amax, te_quantize

from stochround import blocks
from stochround.kernels.availability import INTERPRETED

pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)

# the report's case: the tensor's amax and a block's, where fp32(1 / fp32(1 / S_enc)) is
# not S_enc and the block scale rounds to 1.0 instead of TE's 1.125
ISSUE_TENSOR_AMAX = 91.52039337158203
ISSUE_BLOCK_AMAX = 0.21705451607704163
# below 2688 / FLT_MAX, S_enc saturates at FLT_MAX and fp32(1 / S_dec) is infinite
TINY = 1e-40
E2M1_NEGATIVE_ZERO = 8
TILES = [(1, 16), (16, 16)]


def nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 codes (two a byte, low nibble first) as one code a byte."""
    codes = codes.view(torch.uint8)
    return torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(codes.shape[0], -1)


def issue_tensor() -> torch.Tensor:
    """32 x 64: the report's tensor amax in one block, a block of the report's block amax
    (values spread over it, both signs), the rest Gaussian."""
    generator = torch.Generator().manual_seed(40)
    x = torch.randn(32, 64, generator=generator)
    x[0, 0] = ISSUE_TENSOR_AMAX
    x[1, 16:32] = torch.linspace(-ISSUE_BLOCK_AMAX, ISSUE_BLOCK_AMAX, 16)
    return x


def named_tensors() -> dict[str, torch.Tensor]:
    """The cases: the report's amax, rows across decades, heavy tails, fp32-tiny and
    fp32-subnormal tensors, zero blocks and an all-zero tensor, -0.0 values, and e2m1
    ties (a tensor amax of 2688 makes S_enc 1 and a block amax of 6 its scale 1)."""
    generator = torch.Generator().manual_seed(41)
    decades = torch.randn(32, 64, generator=generator)
    decades = decades * torch.logspace(-6, 3, 32).unsqueeze(1)
    heavy = torch.randn(32, 64, generator=generator)
    heavy = heavy * torch.exp(3 * torch.randn(32, 64, generator=generator))
    zero_blocks = torch.randn(32, 64, generator=generator)
    zero_blocks[:, 16:32] = 0.0
    zero_blocks[16:] = 0.0
    signed_zeros = torch.randn(16, 32, generator=generator)
    signed_zeros[0, 1::3] = -0.0
    signed_zeros[1] = -0.0  # a block of -0.0 alone
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    tie_block = torch.cat((ties, -ties)).repeat(16, 2)
    tie_block[0, -1] = 2688.0
    return {
        "issue": issue_tensor(),
        "decades": decades,
        "heavy": heavy,
        "tiny": torch.randn(16, 32, generator=generator) * TINY,
        "subnormal": torch.full((16, 32), 2.0**-149),
        "zero-blocks": zero_blocks,
        "all-zero": torch.zeros(16, 32),
        "signed-zeros": signed_zeros,
        "ties": tie_block,
    }


def amax_sweep(count: int) -> list[torch.Tensor]:
    """``count`` tensors of one shape whose amax runs over 2**-30 .. 2**40 (log-uniform),
    the report's amax first: S_enc differs from fp32(1 / fp32(1 / S_enc)) for a fraction
    of them."""
    generator = torch.Generator().manual_seed(42)
    base = torch.randn(16, 32, generator=generator)
    base = base / base.abs().amax()
    amaxes = torch.exp2(torch.rand(count - 1, generator=generator, dtype=torch.float64) * 70 - 30)
    tensors = [issue_tensor()[:16, :32].clone()]
    tensors[0][0, 0] = ISSUE_TENSOR_AMAX
    return tensors + [(base * float(amax)).to(torch.float32) for amax in amaxes]


def assert_equal_to_te(x: torch.Tensor, tile: tuple[int, int], backend: str) -> None:
    """stochround's nvfp4 (RN, "te") of x equals TE's reference: the block scales bit for
    bit, and the codes, except that a -0.0 scaled value keeps its sign (code 8 against
    TE's 0) where x is -0.0 or a negative value scaled to -0.0."""
    want_codes, want_scales = te_quantize(x, tile)
    block = 16 if tile == (1, 16) else tile
    device = "cuda" if backend == "triton" and not INTERPRETED else "cpu"
    q = blocks.quantize(x.to(device), "nvfp4", block=block, backend=backend).to("cpu")
    scales = q.scales.view(torch.uint8)
    if tile == (16, 16):  # TE repeats a tile's scale for each of its 16 rows
        scales = scales.repeat_interleave(16, dim=0)
    assert torch.equal(scales, want_scales), (tile, backend, float(te_global_amax(x)))
    ours, theirs = nibbles(q.codes), nibbles(want_codes)
    differ = ours != theirs
    assert bool((ours[differ] == E2M1_NEGATIVE_ZERO).all()), (tile, backend)
    assert bool((theirs[differ] == 0).all()), (tile, backend)
    assert bool(torch.signbit(x[differ]).all()), (tile, backend)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("name", list(named_tensors()))
def test_the_te_flavour_equals_transformer_engines_reference(
    name: str, tile: tuple[int, int]
) -> None:
    assert_equal_to_te(named_tensors()[name], tile, "torch")


@pytest.mark.parametrize("tile", TILES)
def test_the_te_flavour_equals_te_over_a_sweep_of_tensor_amax(tile: tuple[int, int]) -> None:
    for x in amax_sweep(200):
        assert_equal_to_te(x, tile, "torch")


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("name", ["issue", "tiny", "zero-blocks", "signed-zeros", "ties"])
def test_the_kernel_equals_transformer_engines_reference(name: str, tile: tuple[int, int]) -> None:
    assert_equal_to_te(named_tensors()[name], tile, "triton")


def test_the_kernel_equals_te_over_a_sweep_of_tensor_amax() -> None:
    for x in amax_sweep(12):
        assert_equal_to_te(x, (1, 16), "triton")


def test_the_reported_block_takes_tes_scale_and_a_tiny_tensor_no_nan() -> None:
    """The report's values, exactly: the block scale 1.125 (E4M3 code 0x39) where the
    old ``S_enc = 1 / S_dec`` gave 1.0; an fp32-tiny tensor's scales finite, zero blocks
    scaled 0 (not 448 and NaN)."""
    q = blocks.quantize(issue_tensor(), "nvfp4")
    assert q.scales[1, 1].float().item() == 1.125
    _, want = te_quantize(issue_tensor())
    assert want[1, 1].item() == 0x39
    x = torch.zeros(16, 32)
    x[0, :16] = TINY
    tiny = blocks.quantize(x, "nvfp4")
    assert tiny.scales.view(torch.uint8).tolist() == [[3, 0]] + [[0, 0]] * 15
    assert tiny.tensor_scale is not None
    flt_max = torch.tensor(torch.finfo(torch.float32).max)
    assert torch.equal(tiny.tensor_scale, 1.0 / flt_max)  # S_dec = fp32(1 / FLT_MAX)
    assert not tiny.dequantize().isnan().any()


def test_negative_zero_keeps_its_sign_where_te_gives_code_0() -> None:
    """The spec's side, value by value: e2m1 holds -0 (code 8) and an IEEE conversion
    keeps a zero's sign; TE's reference maps -0.0 to code 0 (+0).  Both dequantize to a
    zero, equal as values."""
    x = torch.tensor([[-0.0, 0.0, -1.0, 1.0] * 4])
    theirs = nibbles(te_quantize(x)[0])
    ours = nibbles(blocks.quantize(x, "nvfp4").codes)
    assert theirs[0, :4].tolist() == [0, 0, 15, 7]
    assert ours[0, :4].tolist() == [8, 0, 15, 7]
    values = blocks.quantize(x, "nvfp4").dequantize()
    assert torch.signbit(values[0, 0]) and values[0, 0].item() == 0.0
    assert torch.equal(values, x)


def test_an_infinity_in_the_tensor_as_te_does_it() -> None:
    """An inf makes the tensor amax infinite: S_enc = 2688 / inf = 0, so TE takes 1 (as
    we do); its block saturates to scale 448 and code 7 (6 * 448 = 2688), and every block
    whose amax / 6 lies below E4M3's smallest subnormal half (2**-10) takes scale 0: its
    values are zeroed.  Ours equals TE's bit for bit."""
    x = torch.ones(16, 48)
    x[0, 0] = math.inf
    x[1, 16:32] = 1e-3  # amax / 6 below 2**-10: zeroed
    want_codes, want_scales = te_quantize(x)
    q = blocks.quantize(x, "nvfp4")
    assert q.tensor_scale is not None and q.tensor_scale.item() == 1.0
    assert want_scales[0, 0].item() == 0x7E and want_scales[1, 1].item() == 0
    assert torch.equal(q.scales.view(torch.uint8), want_scales)
    assert torch.equal(nibbles(q.codes), nibbles(want_codes))
    values = q.dequantize()
    assert values[0, 0].item() == 2688.0 and values[0, 1].item() == 0.0
    assert bool((values[1, 16:32] == 0).all())


def test_a_nan_in_the_tensor_differs_from_te_on_purpose() -> None:
    """A NaN makes TE's reference NaN everywhere: S_enc = 2688 / NaN, so every block scale
    is NaN (E4M3 0xFF, a NaN with its sign bit) and every code 0.  Ours takes S_enc = 1
    (as for an infinite amax, which TE's reference also takes to 1): the NaN block's scale
    is NaN, the other blocks are quantized single-level (the small ones zeroed, as with
    an inf)."""
    x = torch.ones(16, 48)
    x[0, 0] = math.nan
    x[1, 16:32] = 1e-3
    _, want_scales = te_quantize(x)
    assert bool((want_scales & 0x7F == 0x7F).all())  # NaN (its sign bit set: 0xFF)
    q = blocks.quantize(x, "nvfp4")
    assert q.tensor_scale is not None and q.tensor_scale.item() == 1.0
    scales = q.scales.view(torch.uint8)
    assert scales[0, 0].item() == 0x7F and scales[1, 1].item() == 0
    assert scales[2, 0].item() == 0x23  # e4m3(1 / 6) = 0.171875
    values = q.dequantize()
    assert bool(values[0, :16].isnan().all()) and bool((values[1, 16:32] == 0).all())
