"""`quantize`, `BlockTensor.dequantize`, `fake_quantize` and `to_nvfp4`: layouts, options,
stochastic rounding (exact decisions and statistics), errors and torch.compile."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
import torch

import stochround as sr
from stochround import blocks, reference
from stochround.blocks.request import RHT_SEED
from stochround.kernels.availability import INTERPRETED
from stochround.random import random_words

ALL = list(blocks.BLOCK_FORMATS)


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


# --- layouts and options ----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_codes_and_scales_have_the_documented_dtypes_and_shapes(name: str) -> None:
    x = _x(4, 64)
    q = blocks.quantize(x, name)
    fmt = blocks.block_format(name)
    codes_dtype = {
        "mxfp8_e4m3": torch.float8_e4m3fn,
        "mxfp8_e5m2": torch.float8_e5m2,
        "mxint8": torch.int8,
        "int8_rowwise": torch.int8,
    }.get(name, torch.uint8)
    assert q.codes.dtype == codes_dtype
    assert q.codes.shape == (4, 32 if fmt.element.bits == 4 else 64)
    scale_dtype = {"nvfp4": torch.float8_e4m3fn, "int8_rowwise": torch.float32}
    assert q.scales.dtype == scale_dtype.get(name, torch.float8_e8m0fnu)
    assert q.scales.shape == (4, 1 if fmt.block is None else 64 // fmt.block)
    assert q.dequantize().dtype == x.dtype and q.dequantize().shape == x.shape
    assert (q.tensor_scale is not None) == (name == "nvfp4")


def test_codes_of_e2m1_are_packed_two_a_byte_low_nibble_first() -> None:
    x = torch.tensor([[0.5, 6.0, -1.0, 0.0] * 8])  # amax 6: scale 2**(2 - 2) = 1
    q = blocks.quantize(x, "mxfp4")
    assert q.codes[0, :2].tolist() == [0x7 << 4 | 0x1, 0x0 << 4 | 0xA]


def test_a_moved_axis_quantizes_the_transpose_and_dequantizes_to_x_layout() -> None:
    x = _x(64, 3, 5)
    q = blocks.quantize(x, "mxfp8_e4m3", axis=0)
    moved = blocks.quantize(x.movedim(0, -1).contiguous(), "mxfp8_e4m3")
    assert q.axis == 0
    assert torch.equal(q.codes.view(torch.uint8), moved.codes.view(torch.uint8))
    assert torch.equal(q.scales.view(torch.uint8), moved.scales.view(torch.uint8))
    assert torch.equal(q.dequantize(), moved.dequantize().movedim(-1, 0))


def test_int8_rowwise_along_axis_zero_takes_one_scale_per_column() -> None:
    x = _x(48, 5).to(torch.float16)
    q = blocks.quantize(x, "int8_rowwise", axis=0)
    assert q.codes.shape == (5, 48) and q.scales.shape == (5, 1)
    assert q.scales.dtype == torch.float16
    assert torch.equal(q.scales.squeeze(-1), x.abs().amax(0) / 127)
    assert q.codes.abs().amax(-1).tolist() == [127] * 5


def test_a_custom_block_format_quantizes_with_its_own_element_and_rule() -> None:
    fmt = blocks.BlockFormat("e3m4_rceil", sr.format("e3m4"), 8, sr.format("e8m0"), "rceil")
    x = _x(4, 64)
    q = blocks.quantize(x, fmt)
    assert q.codes.dtype == torch.uint8 and q.scales.shape == (4, 8)
    # rceil: amax / max(e3m4) <= scale, so that no element saturates
    assert bool((x.abs().reshape(4, 8, 8).amax(-1) <= q.scales.float() * 15.5).all())
    assert torch.equal(q.dequantize(), blocks.quantize(q.dequantize(), fmt).dequantize())


@pytest.mark.parametrize("mode", ["rne", "rz", "ru", "rd", "rna", "ro"])
def test_two_dimensional_tiles_commute_with_transposition(mode: str) -> None:
    w = _x(48, 32) * torch.exp2(torch.randint(-8, 8, (48, 1)).float())
    q = blocks.quantize(w, "nvfp4", mode, block=(16, 16))
    qt = blocks.quantize(w.T.contiguous(), "nvfp4", mode, block=(16, 16))
    assert q.scales.shape == (3, 2)
    assert torch.equal(q.scales.view(torch.uint8).T, qt.scales.view(torch.uint8))
    assert torch.equal(q.dequantize().T, qt.dequantize())


def test_a_tile_shares_one_scale_over_its_sixteen_rows() -> None:
    w = torch.zeros(16, 16)
    w[15, 0] = 6.0
    w[0, 15] = 3.0
    q = blocks.quantize(w, "mxfp4", block=(16, 16))
    assert q.scales.float().tolist() == [[1.0]]
    assert q.dequantize()[0, 15].item() == 3.0


@pytest.mark.parametrize("tensor_scale", [None, 0.25, False])
def test_nvfp4_te_flavour_elements_are_the_scaled_values_rounded_to_nearest_even(
    tensor_scale: float | bool | None,
) -> None:
    x = _x(8, 64) * 10
    q = blocks.quantize(x, "nvfp4", tensor_scale=tensor_scale)
    if tensor_scale is None:
        assert q.tensor_scale is not None
        encode = 448 * 6 / x.abs().amax()
        assert q.tensor_scale.item() == (1 / encode).item()
    elif tensor_scale is False:
        assert q.tensor_scale is None
    else:
        assert q.tensor_scale is not None and q.tensor_scale.item() == 0.25
    decode = 1.0 if q.tensor_scale is None else q.tensor_scale
    inverse = torch.clamp(1.0 / (q.scales.float() * decode), max=torch.finfo(torch.float32).max)
    scaled = x.reshape(8, 4, 16) * inverse.unsqueeze(-1)
    want = sr.encode(scaled.reshape(8, 64), "e2m1", sat="finite", packed=True)
    assert torch.equal(q.codes, want)


def test_dequantize_multiplies_element_block_scale_and_tensor_scale() -> None:
    x = _x(2, 32)
    q = blocks.quantize(x, "nvfp4")
    elements = sr.decode(sr.packing.unpack(q.codes, 4), "e2m1").reshape(2, 2, 16)
    assert q.tensor_scale is not None
    scale = q.scales.float() * q.tensor_scale
    assert torch.equal(q.dequantize(), (elements * scale.unsqueeze(-1)).reshape(2, 32))


def test_values_rounding_past_the_element_max_saturate() -> None:
    # floor: amax 7.9 -> scale 2**(2 - 2) = 1, elements up to 7.9 > 6 saturate at 6
    x = torch.tensor([[7.9, -7.0, 6.5, 1.0] * 8])
    for mode in ("rne", "ru", "sr"):
        q = blocks.quantize(x, "mxfp4", mode, seed=0)
        assert q.dequantize()[0, :3].tolist() == [6.0, -6.0, 6.0]


def test_nan_and_inf_blocks_take_the_nan_scale_and_dequantize_to_nan() -> None:
    x = _x(3, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    for name in ("mxfp4", "mxfp8_e4m3", "mxfp6_e2m3"):
        q = blocks.quantize(x, name)
        nan_scales = q.scales.view(torch.uint8) == 0xFF
        assert nan_scales.tolist() == [[True, False], [False, True], [False, False]]
        values = q.dequantize()
        assert torch.isnan(values[0, :32]).all() and torch.isnan(values[1, 32:]).all()
        assert not torch.isnan(values[0, 32:]).any() and not torch.isnan(values[2]).any()


def test_an_all_zero_block_stores_zero_elements_under_the_smallest_scale() -> None:
    q = blocks.quantize(torch.zeros(2, 32), "mxfp4")
    assert q.scales.view(torch.uint8).tolist() == [[0], [0]]
    assert q.codes.tolist() == [[0] * 16] * 2
    assert blocks.quantize(torch.zeros(1, 32), "nvfp4").dequantize().tolist() == [[0.0] * 32]


def test_floor_three_quarters_dequantizes_four_thirds_of_its_elements() -> None:
    x = torch.tensor([[4.5, 3.0, 0.75] + [0.0] * 29])  # scale 1; elements x * 3/4
    q = blocks.quantize(x, "mxfp4", scale_rule="floor-3/4")
    assert q.scales.float().item() == 1.0
    elements = sr.decode(sr.packing.unpack(q.codes, 4), "e2m1")[0, :3].tolist()
    assert elements == [3.0, 2.0, 0.5]
    expected = torch.tensor([3.0, 2.0, 0.5]) * (4.0 / 3.0)  # in fp32
    assert q.dequantize()[0, :3].tolist() == expected.tolist()


def test_swizzled_scales_unswizzle_to_the_plain_scales() -> None:
    x = _x(256, 64)
    plain = blocks.quantize(x, "nvfp4")
    swizzled = blocks.quantize(x, "nvfp4", swizzle=True)
    assert torch.equal(
        blocks.unswizzle_scales(swizzled.scales, 256, 4).view(torch.uint8),
        plain.scales.view(torch.uint8),
    )
    assert torch.equal(swizzled.dequantize(), plain.dequantize())


def test_rht_quantizes_the_rotated_values_and_unrotates_on_request() -> None:
    x = _x(4, 64)
    signs = blocks.random_signs(16, seed=3)
    q = blocks.quantize(x, "nvfp4", rht=16, rht_signs=signs)
    rotated = blocks.hadamard(x, 16, signs=signs)
    plain = blocks.quantize(rotated, "nvfp4")
    assert torch.equal(q.codes, plain.codes)
    assert torch.equal(q.dequantize(), plain.dequantize())
    back = blocks.inverse_hadamard(plain.dequantize(), 16, signs=signs)
    assert torch.equal(q.dequantize(unrotate=True), back)


def test_rht_without_signs_uses_the_fixed_signs_and_bf16_rounds_the_rotation() -> None:
    x = _x(4, 64)
    q = blocks.quantize(x, "mxfp4", rht=32)
    assert q.rht_signs is not None
    assert torch.equal(q.rht_signs, blocks.random_signs(32, seed=RHT_SEED))
    q16 = blocks.quantize(x, "mxfp4", rht=32, rht_bf16=True)
    rotated = blocks.hadamard(x, 32, signs=q.rht_signs).to(torch.bfloat16)
    assert torch.equal(q16.codes, blocks.quantize(rotated, "mxfp4").codes)


def test_to_nvfp4_names_the_modes_as_torchaos_rfc() -> None:
    x = _x(4, 32)
    assert torch.equal(blocks.to_nvfp4(x).codes, blocks.quantize(x, "nvfp4").codes)
    rs = blocks.to_nvfp4(x, rounding_mode="rs", seed=4)
    assert torch.equal(rs.codes, blocks.quantize(x, "nvfp4", "sr", seed=4).codes)
    with pytest.raises(ValueError, match="rounding_mode must be one of 'rn', 'rs'"):
        blocks.to_nvfp4(x, rounding_mode="sr")


@pytest.mark.parametrize("preset", ["nvidia-cvt-rs-e2m1", "transformer-engine-sr-e2m1"])
def test_a_hardware_preset_rounds_the_scaled_elements_as_the_core_does(preset: str) -> None:
    x = _x(4, 32)
    q = blocks.quantize(x, "nvfp4", "sr", hardware=preset, seed=2, tensor_scale=False)
    plain = blocks.quantize(x, "nvfp4", tensor_scale=False)
    inverse = 1.0 / plain.scales.float()
    scaled = (x.reshape(4, 2, 16) * inverse.unsqueeze(-1)).reshape(4, 32)
    want = sr.encode(scaled, None, "sr", hardware=preset, seed=2, packed=True, nan="zero")
    assert torch.equal(q.codes, want)


# --- stochastic rounding ----------------------------------------------------------------


def _scaled_values(x: torch.Tensor, name: str) -> list[Fraction]:
    """The exact scaled elements x / scale of a power-of-two format (from its RN scales)."""
    q = blocks.quantize(x, name)
    scale = q.scales.float().repeat_interleave(32, dim=-1)
    return [
        Fraction(v) / Fraction(s)
        for v, s in zip(x.flatten().tolist(), scale.flatten().tolist(), strict=True)
    ]


@pytest.mark.parametrize("moved", [False, True], ids=["last-axis", "moved-axis"])
@pytest.mark.parametrize("variant", ["a", "b", "c", "odd"])
def test_limited_bit_sr_decides_each_element_by_its_random_integer_exactly(
    variant: str, moved: bool
) -> None:
    # rbits = 3: element i rounds away from zero iff count(nu 2**3) + r_i >= 8, r_i the top
    # 3 bits of the word of its row-major index in the tensor passed (with a moved axis:
    # in the transposed tensor, not in the quantized layout); checked for every element
    x = (torch.arange(-64, 64) / 21.0 + 1 / 64).reshape(2, 64)
    x[:, ::32] = 5.5  # amax in [4, 8): scale 1, and every element within +-6
    if moved:
        q = blocks.quantize(
            x.T.contiguous(), "mxfp4", "sr", rbits=3, variant=variant, seed=11, offset=2, axis=0
        )
        got = q.dequantize().T.flatten().tolist()
        index = torch.arange(x.numel()).reshape(64, 2).T.flatten()
    else:
        q = blocks.quantize(x, "mxfp4", "sr", rbits=3, variant=variant, seed=11, offset=2)
        got = q.dequantize().flatten().tolist()
        index = torch.arange(x.numel())
    words = random_words(index, 11, 2) >> 29
    seen: set[tuple[Fraction, int]] = set()
    for value, result, r in zip(_scaled_values(x, "mxfp4"), got, words.tolist(), strict=True):
        low, high = reference.neighbours(value, "e2m1")
        toward, away = (low, high) if value >= 0 else (high, low)
        nu = reference.discarded_fraction(value, "e2m1")
        count = reference.away_probability(nu, 3, variant) * 8
        expected = away if count + r >= 8 else toward
        assert result == expected, (value, r)
        seen.add((nu, r))
    assert len({r for _, r in seen}) == 8


def test_exact_sr_picks_one_of_the_two_neighbours_on_the_block_grid() -> None:
    x = _x(16, 64)
    for name in ("mxfp4", "mxfp6_e3m2", "mxfp8_e5m2", "nvfp4"):
        q = blocks.quantize(x, name, "sr", seed=1)
        rn = blocks.quantize(x, name, "rd")
        ru = blocks.quantize(x, name, "ru")
        got = q.dequantize()
        assert bool(((got == rn.dequantize()) | (got == ru.dequantize())).all()), name


# SR is unbiased where no element saturates: the floor-3/4 rule guarantees it
UNCLIPPED = {"scale_rule": "floor-3/4"}


def _sr_variance(x: torch.Tensor, name: str, axis: int = -1) -> torch.Tensor:
    """Per-element variance of SR's result: (high - v)(v - low) for v between the grid
    neighbours low and high of the block (the same scales for every seed)."""
    low = blocks.quantize(x, name, "rd", axis=axis, **UNCLIPPED).dequantize(torch.float64)
    high = blocks.quantize(x, name, "ru", axis=axis, **UNCLIPPED).dequantize(torch.float64)
    v = x.to(torch.float64)
    return (high - v) * (v - low)


def test_sr_dequantizes_to_x_on_average_within_a_variance_band() -> None:
    """Mean of K = 400 seeds vs x (floor-3/4: no element saturates, which would bias it):
    each mean has standard deviation sqrt(var / K); a 6-sigma band per element makes a
    false failure among 1024 elements less likely than 1024 * 2e-9."""
    x = _x(8, 128) * 3
    seeds = 400
    total = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(seeds):
        q = blocks.quantize(x, "mxfp4", "sr", seed=seed, **UNCLIPPED)
        total += q.dequantize(torch.float64)
    band = 6 * (_sr_variance(x, "mxfp4") / seeds).sqrt()
    assert bool(((total / seeds - x.double()).abs() <= band + 1e-12).all())


def test_sr_gemm_is_unbiased_over_seeds() -> None:
    """E[Q(A) Q(B)] = A B with A quantized along K (rows) and B along K (columns), by
    independent seeds: Var(sum_k qa qb) = sum_k (a^2 + va)(b^2 + vb) - a^2 b^2; 6 sigma of
    the mean over 300 seeds (MXFP4 with the floor-3/4 rule)."""
    a = _x(4, 64, seed=1)
    b = _x(64, 4, seed=2)
    seeds = 300
    total = torch.zeros(4, 4, dtype=torch.float64)
    for seed in range(seeds):
        qa = blocks.quantize(a, "mxfp4", "sr", seed=seed, **UNCLIPPED)
        qb = blocks.quantize(b, "mxfp4", "sr", seed=seed + 10_000, axis=0, **UNCLIPPED)
        total += qa.dequantize(torch.float64) @ qb.dequantize(torch.float64)
    va, vb = _sr_variance(a, "mxfp4"), _sr_variance(b, "mxfp4", axis=0)
    a2, b2 = a.double() ** 2, b.double() ** 2
    variance = (a2 + va) @ (b2 + vb) - a2 @ b2
    band = 6 * (variance / seeds).sqrt()
    assert bool(((total / seeds - a.double() @ b.double()).abs() <= band).all())


def test_sr_is_deterministic_for_a_seed_and_a_stream_advances_per_call() -> None:
    x = _x(4, 64)
    first = blocks.quantize(x, "mxfp4", "sr", seed=5)
    assert torch.equal(first.codes, blocks.quantize(x, "mxfp4", "sr", seed=5).codes)
    assert not torch.equal(first.codes, blocks.quantize(x, "mxfp4", "sr", seed=6).codes)
    stream = sr.Stream(seed=5)
    assert torch.equal(blocks.quantize(x, "mxfp4", "sr", stream=stream).codes, first.codes)
    second = blocks.quantize(x, "mxfp4", "sr", stream=stream)
    assert torch.equal(second.codes, blocks.quantize(x, "mxfp4", "sr", seed=5, offset=1).codes)
    assert stream.offset == 2
    blocks.quantize(x, "mxfp4", stream=stream)  # round to nearest draws nothing
    assert stream.offset == 2


def test_seed_none_draws_from_torchs_default_generator() -> None:
    x = _x(4, 64)
    torch.manual_seed(123)
    first = blocks.quantize(x, "mxfp4", "sr").codes
    torch.manual_seed(123)
    assert torch.equal(first, blocks.quantize(x, "mxfp4", "sr").codes)


# --- fake_quantize ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_is_quantize_dequantize_in_x_dtype(dtype: torch.dtype) -> None:
    x = _x(4, 64).to(dtype)
    got = blocks.fake_quantize(x, "mxfp8_e4m3", "sr", seed=0)
    assert got.dtype == dtype
    assert torch.equal(got, blocks.quantize(x, "mxfp8_e4m3", "sr", seed=0).dequantize())
    rotated = blocks.fake_quantize(x, "nvfp4", rht=16)
    assert torch.equal(rotated, blocks.quantize(x, "nvfp4", rht=16).dequantize(unrotate=True))


def test_fake_quantize_passes_gradients_straight_through_or_masked_where_clipped() -> None:
    x = torch.tensor([[7.9, -7.0, 5.0, 1.0] * 8], requires_grad=True)
    blocks.fake_quantize(x, "mxfp4").backward(torch.full((1, 32), 2.0))
    assert x.grad is not None and x.grad.tolist() == [[2.0] * 32]
    x.grad = None
    blocks.fake_quantize(x, "mxfp4", clip_mask=True).backward(torch.full((1, 32), 2.0))
    assert x.grad is not None and x.grad.tolist() == [[0.0, 0.0, 2.0, 2.0] * 8]


# --- errors -----------------------------------------------------------------------------


def test_errors_name_the_argument_and_the_allowed_values() -> None:
    x = _x(4, 64)
    with pytest.raises(ValueError, match="unknown block format 'mxfp3'"):
        blocks.quantize(x, "mxfp3")
    with pytest.raises(ValueError, match="scale_rule must be one of 'floor'"):
        blocks.quantize(x, "mxfp4", scale_rule="nearest")
    with pytest.raises(ValueError, match="scale rule 'nvfp4' needs a scale of format e4m3fn"):
        blocks.quantize(x, "mxfp4", scale_rule="nvfp4")
    with pytest.raises(ValueError, match="nvfp4_flavour must be one of 'te', 'torchao'"):
        blocks.quantize(x, "nvfp4", nvfp4_flavour="cutlass")
    with pytest.raises(ValueError, match="block 24 must divide the length 64 of axis 1"):
        blocks.quantize(x, "mxfp4", block=24)
    with pytest.raises(ValueError, match="block 32 must divide the length 4 of axis 0"):
        blocks.quantize(x, "mxfp4", axis=0)
    with pytest.raises(ValueError, match=r"axis must be an int in \[-2, 2\)"):
        blocks.quantize(x, "mxfp4", axis=2)
    with pytest.raises(ValueError, match="axis must be an int"):
        blocks.quantize(x, "mxfp4", axis=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        blocks.quantize(torch.ones(4, 32, dtype=torch.int32), "mxfp4")
    with pytest.raises(ValueError, match="mode must be one of"):
        blocks.quantize(x, "mxfp4", "stochastic")
    with pytest.raises(ValueError, match="rbits applies to mode='sr' only"):
        blocks.quantize(x, "mxfp4", rbits=8)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'torch', 'triton'"):
        blocks.quantize(x, "mxfp4", backend="cuda")
    with pytest.raises(ValueError, match="tensor_scale applies to formats with a per-tensor"):
        blocks.quantize(x, "mxfp4", tensor_scale=1.0)
    with pytest.raises(ValueError, match=r"2-D blocks \(16, 16\) cover the last two axes"):
        blocks.quantize(x, "nvfp4", block=(16, 16), axis=0)
    with pytest.raises(ValueError, match="rht_signs applies with rht="):
        blocks.quantize(x, "nvfp4", rht_signs=torch.ones(16))
    with pytest.raises(ValueError, match="hardware='nvidia-cvt-rs-e2m1' is an SR unit"):
        blocks.quantize(x, "nvfp4", hardware="nvidia-cvt-rs-e2m1")
    with pytest.raises(ValueError, match="rht must be None or a Hadamard size in 16, 32"):
        blocks.quantize(x, "nvfp4", rht=8)
    with pytest.raises(ValueError, match="rht=128 must divide the length 64 of axis 1"):
        blocks.quantize(x, "nvfp4", rht=128)
    stream = sr.Stream(seed=1)
    with pytest.raises(ValueError, match="tensor_scale must be None, False, a float"):
        blocks.quantize(x, "nvfp4", "sr", tensor_scale=True, stream=stream)
    assert stream.offset == 0  # a refused call draws nothing
    with pytest.raises(ValueError, match="stream= gives the seed and offset"):
        blocks.quantize(x, "nvfp4", "sr", seed=1, stream=sr.Stream(seed=1))


# --- torch.compile ----------------------------------------------------------------------


def _codes_of(q: blocks.BlockTensor) -> tuple[torch.Tensor, torch.Tensor]:
    return q.codes.view(torch.uint8), q.scales.view(torch.uint8)


KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on CPU

COMPILED_CALLS = {
    "nvfp4-sr": lambda x: _codes_of(blocks.quantize(x, "nvfp4", "sr", seed=3)),
    "mxfp4-moved-axis-rbits": lambda x: _codes_of(
        blocks.quantize(x, "mxfp4", "sr", axis=0, rbits=8, seed=1)
    ),
    "nvfp4-tiles-rht": lambda x: _codes_of(blocks.quantize(x, "nvfp4", rht=16, block=(8, 16))),
    "fake-mxfp8-sr": lambda x: blocks.fake_quantize(x, "mxfp8_e4m3", "sr", seed=3),
    "fake-nvfp4-rht": lambda x: blocks.fake_quantize(x, "nvfp4", "sr", seed=3, rht=16),
}


@pytest.mark.parametrize("name", list(COMPILED_CALLS))
def test_torch_compile_traces_quantize_and_fake_quantize_in_one_graph(name: str) -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    call = COMPILED_CALLS[name]
    x = _x(32, 64)
    counter = CompileCounter()
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    eager, traced = call(x), compiled(x)
    if isinstance(eager, tuple):
        assert all(torch.equal(a, b) for a, b in zip(eager, traced, strict=True))
    else:
        assert torch.equal(eager, traced)
    assert counter.frame_count == 1


COMPILED_KERNEL_CALLS = {
    "nvfp4-sr": lambda x, seed: _codes_of(
        blocks.quantize(x, "nvfp4", "sr", seed=seed, backend="triton")
    ),
    "mxfp4-sr-rht": lambda x, seed: _codes_of(
        blocks.quantize(x, "mxfp4", "sr", seed=seed, rht=32, backend="triton")
    ),
    "int8-rowwise-sr": lambda x, seed: _codes_of(
        blocks.quantize(x, "int8_rowwise", "sr", seed=seed, backend="triton")
    ),
    "fake-nvfp4-sr": lambda x, seed: blocks.fake_quantize(
        x, "nvfp4", "sr", seed=seed, backend="triton"
    ),
}


@pytest.mark.skipif(not (INTERPRETED or torch.cuda.is_available()), reason="needs Triton")
@pytest.mark.parametrize("name", list(COMPILED_KERNEL_CALLS))
def test_kernel_calls_compile_once_as_ops_with_the_eager_bits(name: str) -> None:
    """The Triton kernel's launches (and NVFP4's tensor scale) are custom ops: a compiled
    call is one graph for every seed (an int argument), and equals the eager call."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    call = COMPILED_KERNEL_CALLS[name]
    x = _x(16, 64).to(KERNEL_DEVICE)
    counter = CompileCounter()
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    for seed in (3, 4, 5):
        eager, traced = call(x, seed), compiled(x, seed)
        if isinstance(eager, tuple):
            assert all(torch.equal(a, b) for a, b in zip(eager, traced, strict=True))
        else:
            assert torch.equal(eager, traced)
    assert counter.frame_count <= 2


def test_a_compiled_call_advances_its_stream_once_per_call() -> None:
    stream = sr.Stream(seed=4)
    x = _x(4, 64)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x: blocks.fake_quantize(x, "nvfp4", "sr", stream=stream),
        fullgraph=True,
        backend="aot_eager",
    )
    first, second = compiled(x), compiled(x)
    assert stream.offset == 2
    assert torch.equal(first, blocks.fake_quantize(x, "nvfp4", "sr", seed=4, offset=0))
    assert torch.equal(second, blocks.fake_quantize(x, "nvfp4", "sr", seed=4, offset=1))


# --- dispatch ---------------------------------------------------------------------------


def test_backend_triton_says_why_it_cannot_serve_a_call() -> None:
    """The one routing message (`use_kernel`) with `block_kernel_refusal`'s reason."""
    x = _x(4, 64)
    refused = "backend='triton' cannot serve this call: "
    with pytest.raises(ValueError, match=re.escape(refused + "it takes 2-D tiles without rht=")):
        blocks.quantize(_x(16, 64), "nvfp4", block=(16, 16), rht=16, backend="triton")
    with pytest.raises(ValueError, match=re.escape(refused + "swizzled scales are laid out")):
        blocks.quantize(x, "nvfp4", swizzle=True, backend="triton")
    with pytest.raises(ValueError, match="rht= needs a power-of-two block of at least 4 and a"):
        blocks.quantize(x, "int8_rowwise", rht=16, backend="triton")
    with pytest.raises(ValueError, match="whole-row blocks hold at most 16384 elements; x's hold"):
        blocks.quantize(_x(1, 2**14 + 16), "int8_rowwise", backend="triton")
    last_axis = "along x's last axis, contiguous; use backend='torch' or 'auto'"
    with pytest.raises(ValueError, match=re.escape(last_axis)):
        blocks.quantize(_x(64, 4), "mxfp8_e4m3", axis=0, backend="triton")
    with pytest.raises(ValueError, match=re.escape(refused + "hardware presets round on the Py")):
        blocks.quantize(x, "nvfp4", "sr", seed=1, hardware="nvidia-cvt-rs-e2m1", backend="triton")
    if not INTERPRETED:
        with pytest.raises(ValueError, match=re.escape(refused + "x is not a CUDA tensor")):
            blocks.quantize(x, "nvfp4", backend="triton")
    with pytest.raises(ValueError, match="clip_mask=True runs on the PyTorch path"):
        blocks.fake_quantize(x, "nvfp4", clip_mask=True, backend="triton")


def test_block_kernel_refusal_is_none_where_the_kernel_serves() -> None:
    from stochround.blocks.dispatch import block_kernel_refusal
    from stochround.blocks.request import BlockArguments, check_call

    args = BlockArguments(
        "nvfp4", "sr", -1, None, None, None, "te", 16, None, False, None, "c", 1, None, None,
        None, 0, "triton",
    )  # fmt: skip
    x, request = check_call(_x(4, 64), args)
    assert block_kernel_refusal(x, request, 16, False) is None
    assert block_kernel_refusal(x.double(), request, 16, False) == (
        "x must be float32, bfloat16 or float16; got torch.float64"
    )
    assert block_kernel_refusal(x, request, 16, True) == (
        "swizzled scales are laid out by the PyTorch path"
    )


KERNEL_CALLS = {
    "mxfp4-sr": ("mxfp4", {"mode": "sr", "seed": 2}),
    "mxfp8-rceil-sr8": ("mxfp8_e4m3", {"mode": "sr", "seed": 2, "rbits": 8, "scale_rule": "rceil"}),
    "mxfp4-floor34-rht": ("mxfp4", {"mode": "sr", "seed": 2, "scale_rule": "floor-3/4", "rht": 32}),
    "nvfp4-te-sr": ("nvfp4", {"mode": "sr", "seed": 2}),
    "nvfp4-torchao-rht-bf16": ("nvfp4", {"nvfp4_flavour": "torchao", "rht": 16, "rht_bf16": True}),
    "nvfp4-single-level": ("nvfp4", {"tensor_scale": False, "mode": "rz"}),
    "int8-rowwise-sr": ("int8_rowwise", {"mode": "sr", "seed": 2}),
    "nvfp4-2d-tiles": ("nvfp4", {"block": (16, 16)}),
    "nvfp4-2d-tiles-sr": ("nvfp4", {"block": (16, 16), "mode": "sr", "seed": 2}),
    "mxfp4-2d-tiles-rect": ("mxfp4", {"block": (8, 32), "mode": "sr", "seed": 3}),
}


@pytest.mark.skipif(not INTERPRETED, reason="the kernel on the CPU needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("case", list(KERNEL_CALLS))
def test_the_kernel_seam_returns_the_pytorch_paths_block_tensor(case: str) -> None:
    name, options = KERNEL_CALLS[case]
    x = _x(32, 64)
    x[16:, 32:] *= 1e-3  # tiles of unlike amax
    kernel = blocks.quantize(x, name, backend="triton", **options)
    torch_path = blocks.quantize(x, name, backend="torch", **options)
    assert torch.equal(kernel.codes.view(torch.uint8), torch_path.codes.view(torch.uint8))
    assert torch.equal(kernel.scales.view(torch.uint8), torch_path.scales.view(torch.uint8))
    assert torch.equal(kernel.dequantize(), torch_path.dequantize())
    fake = blocks.fake_quantize(x, name, backend="triton", **options)
    assert torch.equal(fake, blocks.fake_quantize(x, name, backend="torch", **options))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("name", ALL)
def test_cuda_results_equal_the_cpus_bit_for_bit(name: str, backend: str) -> None:
    x = _x(64, 256) * torch.exp2(torch.linspace(-20, 20, 256))
    x[0, :32] = 0
    for mode, options in (("rne", {}), ("sr", {"seed": 7}), ("sr", {"seed": 7, "rbits": 8})):
        cpu = blocks.quantize(x, name, mode, **options)
        cuda = blocks.quantize(x.cuda(), name, mode, backend=backend, **options)
        assert torch.equal(cuda.codes.view(torch.uint8).cpu(), cpu.codes.view(torch.uint8))
        assert torch.equal(cuda.scales.cpu().view(torch.uint8), cpu.scales.view(torch.uint8))
        assert torch.equal(cuda.dequantize().cpu(), cpu.dequantize())
        fake = blocks.fake_quantize(x.cuda(), name, mode, backend=backend, **options)
        assert torch.equal(fake.cpu(), cpu.dequantize())


# --- shards: index_offset ---------------------------------------------------------------


@pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param(
            "triton",
            marks=pytest.mark.skipif(
                not (INTERPRETED or torch.cuda.is_available()), reason="needs Triton"
            ),
        ),
    ],
)
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "int8_rowwise"])
def test_a_row_shard_with_its_index_offset_gets_the_whole_tensors_bits(
    name: str, backend: str
) -> None:
    """Rows 8..15 of a 16 x 64 tensor quantized alone with index_offset = 8 * 64 give the
    codes and scales of those rows in the whole tensor's quantization, with SR (NVFP4
    single-level: a tensor scale would be the shard's own); without it they differ."""
    device = KERNEL_DEVICE if backend == "triton" else "cpu"
    x = _x(16, 64, seed=9).to(device)
    options = {"seed": 12, "backend": backend}
    if name == "nvfp4":
        options["tensor_scale"] = False
    whole = blocks.quantize(x, name, "sr", **options)
    shard = blocks.quantize(x[8:], name, "sr", index_offset=8 * 64, **options)
    unshifted = blocks.quantize(x[8:], name, "sr", **options)
    assert torch.equal(shard.codes.view(torch.uint8), whole.codes[8:].view(torch.uint8))
    assert torch.equal(shard.scales.view(torch.uint8), whole.scales[8:].view(torch.uint8))
    assert not torch.equal(unshifted.codes.view(torch.uint8), whole.codes[8:].view(torch.uint8))
    fake = blocks.fake_quantize(x[8:], name, "sr", index_offset=8 * 64, **options)
    assert torch.equal(fake, blocks.fake_quantize(x, name, "sr", **options)[8:])


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "rht_bf16"), [(torch.float32, True), (torch.bfloat16, False)], ids=["fp32", "bf16"]
)
def test_inductor_keeps_the_kernels_bits_on_cuda(dtype: torch.dtype, rht_bf16: bool) -> None:
    """On CUDA the default route is the kernel's op, opaque to inductor: a compiled call
    with the rotation narrowed to bf16 gives the eager bits.  (The PyTorch path compiled
    by inductor for CUDA is not bit-exact: its generated code may contract and divide in
    its own ways; on the CPU it is, the narrowing being done by the core's op.)"""
    x = (_x(64, 128, seed=5) * 3).to("cuda", dtype)

    def call(x: torch.Tensor) -> torch.Tensor:
        q = blocks.quantize(x, "nvfp4", "sr", seed=2, rht=16, rht_bf16=rht_bf16)
        return q.codes.view(torch.uint8)

    torch._dynamo.reset()
    assert torch.equal(torch.compile(call, fullgraph=True)(x), call(x))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp6_e3m2", "mxfp8_e4m3", "int8_rowwise"])
def test_a_tensor_without_rows_quantizes_and_dequantizes(fmt):
    """A shard of no rows (more ranks than rows) quantizes to empty codes and scales; NVFP4's
    tensor scale from an amax of nothing (0) is the scale of an all-zero tensor."""
    x = torch.zeros(0, 32)
    q = sr.blocks.quantize(x, fmt, "sr", seed=1)
    assert q.codes.shape[0] == 0 and q.scales.shape[0] == 0
    assert q.dequantize().shape == x.shape
    assert sr.blocks.fake_quantize(x, fmt, "sr", seed=1).shape == x.shape
    if fmt == "nvfp4":
        zeros = sr.blocks.quantize(torch.zeros(1, 32), fmt, "sr", seed=1)
        assert torch.equal(q.tensor_scale, zeros.tensor_scale)
