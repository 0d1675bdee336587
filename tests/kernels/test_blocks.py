"""The fused block-quantize kernel against the PyTorch path of `stochround.blocks`, bit for
bit: codes, scales and dequantized values, for every named format, rounding mode and scale
rule, on special values and with the stream's seeds, offsets and index offsets.

Without a GPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1); on
the GPU machine the same tests run compiled on CUDA tensors (a representative subset of the
sweeps: each choice compiles a kernel), plus the GPU-only test at the end (CPU == CUDA).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from stochround import blocks
from stochround.block_constants import HADAMARD_SIZES
from stochround.blocks.formats import block_format
from stochround.blocks.hadamard import NORMALIZATION
from stochround.blocks.scales import nvfp4_tensor_scales
from stochround.formats import format as sr_format
from stochround.kernels import block_amax
from stochround.kernels import blocks as kernel_blocks
from stochround.kernels.blocks import fake_quantize_blocks, quantize_blocks
from stochround.presets import preset

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# the interpreter evaluates NaN and infinite blocks with numpy, which warns of them
pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
)

MX_FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8"]
POWER_OF_TWO_RULES = ["floor", "rceil", "ceil", "even", "floor-3/4"]
# every element mode: the deterministic ones, exact SR, and 8-bit SR in variants a and c
MODES: list[tuple[str, dict]] = [
    ("rne", {}),
    ("rz", {}),
    ("ru", {}),
    ("rd", {}),
    ("rna", {}),
    ("sr", {"seed": 5}),
    ("sr", {"seed": 2**40 + 3, "offset": 7, "rbits": 8, "variant": "a"}),
    ("sr", {"seed": 11, "offset": 2**33, "rbits": 8, "variant": "c"}),
]


def _on_gpu_only(everything: list, representative: list) -> list:
    """Compiling a kernel per choice takes a second on a GPU, where the interpreter takes
    none: there the tests sweep a representative subset."""
    return representative if ON_GPU else everything


SWEEP_MX = _on_gpu_only(MX_FORMATS, ["mxfp8_e4m3", "mxfp4"])
SWEEP_RULES = _on_gpu_only(POWER_OF_TWO_RULES, ["floor", "rceil"])
SWEEP_MODES = _on_gpu_only(MODES, [MODES[0], MODES[5], MODES[6]])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtypes, shapes and bit patterns (NaN payloads included)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, any NaN matching any NaN (torch's casts disagree on NaN bits)."""
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    return _same_bits(torch.where(nan, 0, a), torch.where(nan, 0, b))


def _special_blocks(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Values over many binades, with blocks of the edge cases the scale rules decide:
    all zeros, NaN, +-infinity, fp32-subnormal amax, huge values, a power-of-two amax and
    values that round past the element max."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator) * torch.logspace(-4, 4, cols)
    x[0, :32] = 0.0
    x[1, 3] = math.nan
    x[2, 40] = math.inf
    x[2, 20] = -math.inf
    x[3, :16] = 1e-40
    x[3, 16:32] = torch.linspace(-3e-39, 3e-39, 16)
    x[4, 0] = 3e38
    x[4, 33] = -(2.0**100)
    x[5, :32] = torch.linspace(-1.0, 1.0, 32)  # amax 1: a power of two
    x[5, 32:48] = 6.0 * 0.999  # just below e2m1's max
    return x


def _both(x: torch.Tensor, fmt: str, mode: str, **options) -> tuple:
    """(PyTorch path, kernel) BlockTensors of the same call."""
    expected = blocks.quantize(x, fmt, mode, backend="torch", **options)
    got = blocks.quantize(x, fmt, mode, backend="triton", **options)
    return expected, got


def _assert_same_block_tensor(expected, got, context) -> None:
    assert _same_bits(got.codes, expected.codes), context
    assert _same_bits(got.scales, expected.scales), context
    if expected.tensor_scale is None:
        assert got.tensor_scale is None, context
    else:
        assert _same_bits(got.tensor_scale, expected.tensor_scale), context


@pytest.mark.parametrize("fmt", SWEEP_MX)
@pytest.mark.parametrize("rule", SWEEP_RULES)
def test_mx_formats_every_mode_and_scale_rule_match_the_pytorch_path(fmt: str, rule: str) -> None:
    x = _special_blocks(6, 96, seed=1).to(DEVICE)
    for dtype, (mode, options) in itertools.product((torch.float32, torch.bfloat16), SWEEP_MODES):
        expected, got = _both(x.to(dtype), fmt, mode, scale_rule=rule, **options)
        _assert_same_block_tensor(expected, got, (fmt, rule, dtype, mode, options))


@pytest.mark.parametrize("flavour", ["te", "torchao", "pow2"])
@pytest.mark.parametrize("tensor_scale", ["amax", "given", "single-level"])
def test_nvfp4_every_flavour_and_tensor_scale_match_the_pytorch_path(
    flavour: str, tensor_scale: str
) -> None:
    x = _special_blocks(6, 64, seed=2).to(DEVICE)
    x[1, 3] = 0.5  # a NaN in x makes the amax tensor scale NaN: tested apart
    x[2, 40] = x[2, 20] = 1.0
    given = {"amax": None, "given": 0.0123, "single-level": False}[tensor_scale]
    if flavour == "pow2" and tensor_scale == "given":  # pow2 computes its tensor scale
        with pytest.raises(ValueError, match="computes a power-of-two tensor scale"):
            blocks.quantize(x, "nvfp4", tensor_scale=given, nvfp4_flavour=flavour)
        return
    for dtype, (mode, options) in itertools.product(
        (torch.float32, torch.bfloat16, torch.float16), SWEEP_MODES
    ):
        expected, got = _both(
            x.to(dtype), "nvfp4", mode, tensor_scale=given, nvfp4_flavour=flavour, **options
        )
        _assert_same_block_tensor(expected, got, (flavour, tensor_scale, dtype, mode, options))


@pytest.mark.parametrize("flavour", ["te", "torchao", "pow2"])
def test_nvfp4_blocks_with_nan_and_infinities_match_the_pytorch_path(flavour: str) -> None:
    x = _special_blocks(6, 64, seed=3).to(DEVICE)
    # pow2 takes no given scale: its own, from an amax that is not finite (1)
    for tensor_scale in (False, None if flavour == "pow2" else 2.0**-10):
        expected, got = _both(
            x, "nvfp4", "sr", tensor_scale=tensor_scale, nvfp4_flavour=flavour, seed=1
        )
        _assert_same_block_tensor(expected, got, (flavour, tensor_scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_rowwise_absmax_scales_match_the_pytorch_path(dtype: torch.dtype) -> None:
    """Block None (the whole row) is the kernel's block of the row's length; the scale is
    held in x's dtype (the kernel returns its fp32 value)."""
    x = _special_blocks(6, 96, seed=4).to(DEVICE).to(dtype)
    element = block_format("int8_rowwise").element
    for mode, options in SWEEP_MODES:
        expected = blocks.quantize(x, "int8_rowwise", mode, backend="torch", **options)
        n = options.get("rbits") or 32
        codes, scales = quantize_blocks(
            x,
            element,
            x.shape[-1],
            "absmax",
            mode=mode,
            n=n,
            variant=options.get("variant", "c"),
            seed=options.get("seed", 0),
            offset=options.get("offset", 0),
        )
        assert _same_bits(codes.view(torch.int8), expected.codes), (dtype, mode, options)
        assert _same_values(scales.to(dtype), expected.scales), (dtype, mode, options)


@pytest.mark.parametrize(
    ("fmt", "rule"),
    [("mxfp8_e4m3", "floor"), ("mxfp4", "floor-3/4"), ("mxint8", "even"), ("nvfp4", None)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_dequantized_output_equals_fake_quantize(
    fmt: str, rule: str | None, dtype: torch.dtype
) -> None:
    x = _special_blocks(6, 64, seed=5).to(DEVICE).to(dtype)
    if fmt == "nvfp4":
        x = torch.nan_to_num(x, nan=0.25, posinf=2.0, neginf=-3.0)
    bf = block_format(fmt)
    for mode, options in SWEEP_MODES:
        expected = blocks.fake_quantize(x, fmt, mode, scale_rule=rule, **options)
        q = blocks.quantize(x, fmt, mode, backend="torch", scale_rule=rule, **options)
        assert isinstance(bf.block, int)
        got = fake_quantize_blocks(
            x,
            bf.element,
            bf.block,
            rule or bf.scale_rule,
            tensor_scale=q.tensor_scale,
            mode=mode,
            n=options.get("rbits") or 32,
            variant=options.get("variant", "c"),
            seed=options.get("seed", 0),
            offset=options.get("offset", 0),
        )
        assert _same_values(got, expected), (fmt, rule, dtype, mode, options)


def test_seeds_and_offsets_as_device_tensors_give_the_same_bits_as_ints() -> None:
    x = _special_blocks(6, 64, seed=6).to(DEVICE)
    element = block_format("mxfp4").element
    ints = quantize_blocks(
        x, element, 32, "floor", mode="sr", seed=2**63 + 5, offset=9, output="fp4x2"
    )
    seed = torch.tensor([2**63 + 5 - 2**64], device=DEVICE)
    offset = torch.tensor([9], device=DEVICE)
    tensors = quantize_blocks(
        x, element, 32, "floor", mode="sr", seed=seed, offset=offset, output="fp4x2"
    )
    assert all(_same_bits(a, b) for a, b in zip(ints, tensors, strict=True))


@pytest.mark.parametrize(("block", "start"), [(32, 1), (6, 1), (6, 2)])
def test_a_slice_quantized_with_its_index_offset_equals_that_slice_of_the_whole(
    block: int, start: int
) -> None:
    """Sharding invariance: the rows from ``start`` on, quantized alone with the global
    index of their first element, give the whole tensor's codes for those rows, also where
    the slice begins off the stream's four-word groups (block 6: the unaligned path)."""
    x = _special_blocks(6, 96, seed=7).to(DEVICE)
    element = block_format("mxfp8_e4m3").element
    options = {"mode": "sr", "seed": 3, "offset": 1, "n": 32, "variant": "c"}
    whole_codes, whole_scales = quantize_blocks(x, element, block, "floor", **options)
    first = start * x.shape[1]
    codes, scales = quantize_blocks(
        x[start:], element, block, "floor", index_offset=first, **options
    )
    assert _same_bits(codes, whole_codes[start:])
    assert _same_bits(scales, whole_scales[start:])
    if block % 4:  # the whole one against the PyTorch path, blocks of 6
        expected = blocks.quantize(
            x, "mxfp8_e4m3", "sr", block=block, backend="torch", seed=3, offset=1
        )
        assert _same_bits(whole_codes.view(torch.float8_e4m3fn), expected.codes)
        assert _same_bits(whole_scales.view(torch.float8_e8m0fnu), expected.scales)


def test_tiles_cut_mid_tensor_and_a_partial_last_tile_are_exact() -> None:
    """More blocks than one program's tile, and a last tile only partly filled."""
    tile_blocks = kernel_blocks.quantize_tiling(0, True).ELEMENTS // 32
    rows = 2 * tile_blocks // 4 + 3
    generator = torch.Generator().manual_seed(8)
    x = (torch.randn(rows, 128, generator=generator) * 3).to(DEVICE)
    expected, got = _both(x, "mxfp8_e4m3", "sr", seed=4)
    _assert_same_block_tensor(expected, got, rows)


def test_bad_arguments_raise_errors_naming_them() -> None:
    x = torch.ones(2, 32, device=DEVICE)
    element = block_format("mxfp4").element
    with pytest.raises(ValueError, match="block must be a positive int dividing"):
        quantize_blocks(x, element, 5, "floor")
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        quantize_blocks(x, element, 32, "round")
    with pytest.raises(ValueError, match="output must be 'codes' or 'fp4x2'"):
        quantize_blocks(x, element, 32, "floor", output="dequantized")
    with pytest.raises(ValueError, match="contiguous 2-D"):
        quantize_blocks(x.t(), element, 2, "floor")
    with pytest.raises(TypeError, match="x must be float32"):
        quantize_blocks(x.double(), element, 32, "floor")
    with pytest.raises(ValueError, match="fp4x2 packs 4-bit codes"):
        quantize_blocks(x, element, 2, "floor", output="fp4x2")
    with pytest.raises(ValueError, match="mode must be one of"):
        fake_quantize_blocks(x, element, 32, "floor", mode="sto")
    with pytest.raises(ValueError, match="nvfp4_flavour must be one of"):
        fake_quantize_blocks(x, element, 16, "nvfp4", nvfp4_flavour="cutlass")
    with pytest.raises(ValueError, match="tensor_scale must be a contiguous float32 tensor of one"):
        fake_quantize_blocks(x, element, 16, "nvfp4", tensor_scale=torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match="at most 8 bits"):
        quantize_blocks(x, "bfloat16", 32, "floor")


@pytest.mark.gpu
def test_cuda_kernel_equals_the_pytorch_path_on_the_cpu() -> None:
    x = _special_blocks(64, 256, seed=9)
    for fmt, mode, options in [
        ("mxfp8_e4m3", "sr", {"seed": 1}),
        ("mxfp4", "sr", {"seed": 2, "rbits": 8}),
        ("nvfp4", "sr", {"seed": 3, "tensor_scale": False}),
        ("mxfp6_e2m3", "rne", {}),
    ]:
        expected = blocks.quantize(x, fmt, mode, backend="torch", **options)
        got = blocks.quantize(x.cuda(), fmt, mode, backend="triton", **options)
        assert _same_bits(got.codes.cpu(), expected.codes), (fmt, mode)
        assert _same_bits(got.scales.cpu(), expected.scales), (fmt, mode)


def test_the_tensor_amax_equals_the_amax_of_the_magnitudes() -> None:
    """One read of x, NaN-aware, any input dtype, across several programs."""
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(3 * block_amax.AMAX_BLOCK + 5, generator=generator).to(DEVICE)
    x[77] = -1000.0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        expected = x.to(dtype).abs().amax().to(torch.float32)
        assert _same_bits(kernel_blocks.tensor_amax(x.to(dtype)), expected), dtype
    x[-1] = math.nan
    assert torch.isnan(kernel_blocks.tensor_amax(x))
    assert _same_bits(kernel_blocks.tensor_amax(x[:0]), torch.tensor(0.0, device=DEVICE))


@pytest.mark.parametrize(
    "tiling",
    [block_amax.AmaxTiling(64, 3, 4), block_amax.AmaxTiling(256, 1, 8), block_amax.AMAX_TILING],
)
def test_the_tensor_amax_is_the_same_for_every_tiling(tiling: block_amax.AmaxTiling) -> None:
    """Chunks read one after another (a masked tail chunk, several programs), NaN-aware."""
    generator = torch.Generator().manual_seed(13)
    x = torch.randn(5 * 64 * 3 + 17, generator=generator).to(DEVICE)
    x[100] = -300.0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        expected = x.to(dtype).abs().amax().to(torch.float32)
        got = kernel_blocks.tensor_amax(x.to(dtype), tiling=tiling)
        assert _same_bits(got, expected), (tiling, dtype)
        scale, _ = kernel_blocks.nvfp4_tensor_scale(x.to(dtype), "te", tiling=tiling)
        assert _same_bits(scale, kernel_blocks.nvfp4_tensor_scale(x.to(dtype), "te")[0])
    x[-1] = math.nan
    assert torch.isnan(kernel_blocks.tensor_amax(x, tiling=tiling))


def test_an_amax_tiling_is_checked() -> None:
    x = torch.ones(64, device=DEVICE)
    for tiling in [block_amax.AmaxTiling(48, 1, 4), block_amax.AmaxTiling(64, 0, 4)]:
        with pytest.raises(ValueError, match="tiling must be an AmaxTiling of a power-of-two"):
            kernel_blocks.tensor_amax(x, tiling=tiling)


def _tiles_amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """The PyTorch path's 2-D tile amax (each tile's ``abs().amax()`` in fp32), repeated
    for each of the tile's rows, as the kernel reads it."""
    rows, cols = tile
    tiles = x.reshape(-1, rows, x.shape[-1] // cols, cols).abs().amax(dim=(1, 3), keepdim=True)
    return tiles.to(torch.float32).expand(-1, rows, -1, -1).reshape(-1, x.shape[-1] // cols)


TILE_CASES = [
    ((64, 64), (16, 16)),
    ((2, 48, 96), (16, 32)),
    ((12, 40), (3, 5)),
    ((16, 16), (16, 16)),
]


@pytest.mark.parametrize(("shape", "tile"), TILE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_tile_amax_equals_the_pytorch_paths_in_one_read(
    shape: tuple[int, ...], tile: tuple[int, int], dtype: torch.dtype
) -> None:
    """Each tile's amax, repeated for its rows, on tiles of zeros (and -0), NaN, infinity
    and fp32-subnormal values; with a flavour, NVFP4's tensor scales from the same read equal
    `nvfp4_tensor_scale`'s."""
    generator = torch.Generator().manual_seed(14)
    x = (torch.randn(shape, generator=generator) * 8).to(DEVICE)
    flat = x.view(-1, shape[-1])
    flat[: tile[0], : tile[1]] = 0.0
    flat[0, 1] = -0.0
    if flat.shape[-1] >= 2 * tile[1]:
        flat[: tile[0], tile[1] : 2 * tile[1]] *= 1e-40
    cases = [x, x.clone(), x.clone()]
    cases[1].view(-1, shape[-1])[-1, -1] = math.nan
    cases[2].view(-1, shape[-1])[-1, 0] = -math.inf
    for case in cases:
        case = case.to(dtype)
        expected = _tiles_amax(case, tile)
        for flavour in (None, "te", "torchao", "pow2"):
            got = kernel_blocks.tile_amax(case, tile, flavour)
            assert _same_values(got.amax, expected), (shape, tile, dtype, flavour)
            if flavour is None:
                assert got.scales is None
            else:
                scales, _ = kernel_blocks.nvfp4_tensor_scale(case, flavour)
                assert _same_bits(got.scales, scales), (shape, tile, dtype, flavour)


def test_the_tile_amax_of_an_empty_tensor_has_no_tiles_and_scales_of_amax_zero() -> None:
    x = torch.ones(0, 32, device=DEVICE)
    got = kernel_blocks.tile_amax(x, (16, 16), "te")
    assert got.amax.shape == (0, 2)
    assert _same_bits(got.scales, kernel_blocks.nvfp4_tensor_scale(x, "te")[0])


def test_the_tile_amax_refuses_tiles_that_do_not_divide_x_and_other_inputs() -> None:
    x = torch.ones(32, 48, device=DEVICE)
    with pytest.raises(ValueError, match=r"tile \(16, 32\) must divide x's last two axes"):
        kernel_blocks.tile_amax(x, (16, 32))
    with pytest.raises(ValueError, match=r"tile \(16, 16\) must divide x's last two axes"):
        kernel_blocks.tile_amax(torch.ones(32, device=DEVICE), (16, 16))
    with pytest.raises(ValueError, match="tile must be a pair of positive ints"):
        kernel_blocks.tile_amax(x, (16, 0))
    with pytest.raises(ValueError, match="x must be a contiguous float32, bfloat16 or float16"):
        kernel_blocks.tile_amax(x.t(), (16, 16))
    with pytest.raises(ValueError, match="flavour must be one of"):
        kernel_blocks.tile_amax(x, (16, 16), "nvidia")
    prepared = kernel_blocks.PreparedTileAmax(x, (16, 16), None)
    with pytest.raises(ValueError, match=r"x must be a contiguous torch\.float32 tensor of shape"):
        prepared(torch.ones(16, 48, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_2d_tiles_on_the_kernel_route_equal_the_pytorch_path_with_special_tiles(
    dtype: torch.dtype,
) -> None:
    """Codes, scales and tensor scale of NVFP4 and MXFP8 in 16 x 16 tiles (the tiles' amax
    from the tile-amax kernel) with a zero tile, a NaN tile and an infinite tile."""
    generator = torch.Generator().manual_seed(15)
    x = (torch.randn(32, 64, generator=generator) * 3).to(DEVICE)
    x[:16, :16] = 0.0
    x[16:, 16:32] *= 1e-3
    for special in (None, math.nan, math.inf):
        case = x.clone()
        if special is not None:
            case[20, 40] = special
        case = case.to(dtype)
        for name in ("nvfp4", "mxfp8_e4m3"):
            for options in ({}, {"mode": "sr", "seed": 4}, {"tensor_scale": False}):
                if name != "nvfp4" and "tensor_scale" in options:
                    continue
                got = blocks.quantize(case, name, block=(16, 16), backend="triton", **options)
                want = blocks.quantize(case, name, block=(16, 16), backend="torch", **options)
                context = (dtype, special, name, options)
                assert _same_bits(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
                assert _same_bits(got.scales.view(torch.uint8), want.scales.view(torch.uint8))
                if want.tensor_scale is not None:
                    assert _same_bits(got.tensor_scale, want.tensor_scale), context


def test_the_rotation_normalizations_are_the_hadamard_modules() -> None:
    assert all(
        kernel_blocks.rht_normalization(size) == NORMALIZATION[size] for size in HADAMARD_SIZES
    )


@pytest.mark.parametrize(
    ("fmt", "rht"),
    _on_gpu_only([("nvfp4", 16), ("mxfp4", 32), ("mxfp8_e4m3", 64)], [("nvfp4", 16)]),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_hadamard_rotation_matches_the_pytorch_path(
    fmt: str, rht: int, dtype: torch.dtype
) -> None:
    """Codes, scales, the rotated amax (NVFP4's tensor scale) and the dequantized values
    rotated back, with and without TE's rounding of the rotation to bf16."""
    generator = torch.Generator().manual_seed(11)
    x = (torch.randn(8, 256, generator=generator) * 4).to(DEVICE)
    x[0, 5] = 1000.0
    x[1, :64] = 0.0
    x[2, 7] = -1e-40
    x = x.to(dtype)
    bf = block_format(fmt)
    assert isinstance(bf.block, int)
    signs = blocks.random_signs(rht, 3, device=DEVICE)
    modes = _on_gpu_only([MODES[4], MODES[5], MODES[7]], [MODES[5]])
    for rht_bf16, (mode, options) in itertools.product((False, True), modes):
        rotation = {"rht": rht, "rht_signs": signs, "rht_bf16": rht_bf16}
        context = (fmt, rht, dtype, rht_bf16, mode, options)
        expected = blocks.quantize(x, fmt, mode, backend="torch", **rotation, **options)
        tensor_scale = None
        if fmt == "nvfp4":
            amax = kernel_blocks.tensor_amax(x, **rotation)
            tensor_scale = torch.stack(tuple(nvfp4_tensor_scales(amax, "te")))
            assert _same_bits(tensor_scale[0], expected.tensor_scale), context
        kernel_options = {
            "tensor_scale": tensor_scale,
            "mode": mode,
            "n": options.get("rbits") or 32,
            "variant": options.get("variant", "c"),
            "seed": options.get("seed", 0),
            "offset": options.get("offset", 0),
            **rotation,
        }
        output = "fp4x2" if bf.element.bits == 4 else "codes"
        codes, scales = quantize_blocks(
            x, bf.element, bf.block, bf.scale_rule, output=output, **kernel_options
        )
        assert _same_bits(codes, expected.codes.view(torch.uint8)), context
        assert _same_bits(scales, expected.scales.view(torch.uint8)), context
        faked = blocks.fake_quantize(x, fmt, mode, **rotation, **options)
        got = fake_quantize_blocks(x, bf.element, bf.block, bf.scale_rule, **kernel_options)
        assert _same_values(got, faked), context


def test_rotation_arguments_are_checked() -> None:
    x = torch.ones(2, 64, device=DEVICE)
    element = block_format("mxfp4").element
    signs = torch.ones(16, device=DEVICE)
    with pytest.raises(ValueError, match="rht must be one of"):
        quantize_blocks(x, element, 32, "floor", rht=8, rht_signs=signs)
    with pytest.raises(ValueError, match="rht_signs must be a float32 tensor of 32"):
        quantize_blocks(x, element, 32, "floor", rht=32, rht_signs=signs)
    with pytest.raises(ValueError, match="rht_signs and rht_bf16 apply with rht="):
        quantize_blocks(x, element, 32, "floor", rht_signs=signs)
    with pytest.raises(ValueError, match="scale rule other than 'absmax'"):
        quantize_blocks(x, "int8", 64, "absmax", rht=16, rht_signs=signs)


@pytest.mark.parametrize("flavour", ["te", "torchao", "pow2"])
def test_the_nvfp4_tensor_scale_in_two_launches_equals_the_scale_rules(flavour: str) -> None:
    """Ordinary, all-zero, NaN, infinite, fp32-subnormal (TE's S_enc saturates) and huge
    amax, over several partial maxima."""
    generator = torch.Generator().manual_seed(12)
    base = torch.randn(2 * block_amax.AMAX_BLOCK + 3, generator=generator)
    cases = [base, base * 0, base * 1e-42, base * 1e37, base.clone(), base.clone()]
    cases[4][5] = math.nan
    cases[5][-1] = -math.inf
    for x in cases:
        for dtype in (torch.float32, torch.bfloat16):
            x_dtype = x.to(DEVICE).to(dtype)
            expected_amax = x_dtype.abs().amax().to(torch.float32)
            expected = torch.stack(tuple(nvfp4_tensor_scales(expected_amax, flavour)))
            scale, amax = kernel_blocks.nvfp4_tensor_scale(x_dtype, flavour)
            assert _same_values(amax, expected_amax), (flavour, dtype)
            # S_dec and S_enc
            assert _same_bits(scale, expected), (flavour, dtype, float(expected_amax))


@pytest.mark.parametrize("hardware", ["transformer-engine-sr-e2m1", "nvidia-cvt-rs-e2m1"])
def test_the_e2m1_sr_presets_are_the_kernels_sr_with_their_bits_and_variant(
    hardware: str,
) -> None:
    """Their operand is binary32 (the scaled values already are) and they flush nothing,
    so the kernel's SR with the preset's random bits and variant is the preset."""
    unit = preset(hardware)
    assert unit.operand == sr_format("binary32") and unit.flush_below is None
    assert unit.sat == "finite"
    x = _special_blocks(6, 64, seed=13).to(DEVICE)
    for fmt, tensor_scale in (("nvfp4", False), ("nvfp4", 0.01), ("mxfp4", None)):
        options = {} if tensor_scale is None else {"tensor_scale": tensor_scale}
        expected = blocks.quantize(
            x, fmt, "sr", hardware=hardware, seed=9, backend="torch", **options
        )
        bf = block_format(fmt)
        assert isinstance(bf.block, int)
        codes, scales = quantize_blocks(
            x,
            bf.element,
            bf.block,
            bf.scale_rule,
            tensor_scale=expected.tensor_scale,
            mode="sr",
            n=unit.rbits,
            variant=unit.variant,
            seed=9,
            output="fp4x2",
        )
        assert _same_bits(codes, expected.codes), (fmt, tensor_scale)
        assert _same_bits(scales, expected.scales.view(torch.uint8)), (fmt, tensor_scale)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_and_their_neighbours_round_to_nearest_even_as_the_pytorch_path(
    fmt: str, dtype: torch.dtype
) -> None:
    # every midpoint between the element's magnitudes (ties: to even), the fp32 values on
    # either side of it, values below half the smallest subnormal and the max, each
    # block led by the element's max so that the floor rule's scale is 1: round-to-nearest-
    # even's addition of 2**(q + 23) (block_math.fast_round) decides each of them
    element = block_format(fmt).element
    magnitudes = sorted(
        {float(element.magnitude_value(code)) for code in range(element.max_magnitude_code + 1)}
    )
    midpoints = torch.tensor([(a + b) / 2 for a, b in itertools.pairwise(magnitudes)])
    values = torch.cat(
        [
            midpoints,
            torch.nextafter(midpoints, torch.tensor(math.inf)),
            torch.nextafter(midpoints, torch.tensor(0.0)),
            torch.tensor([magnitudes[1] / 4, 1e-30, 0.0, element.max]),
        ]
    ).to(torch.float32)
    values = torch.cat([values, -values])
    block = 32
    rows = -(-values.numel() // (block - 1))
    x = torch.zeros(rows, block - 1)
    x.view(-1)[: values.numel()] = values
    x = torch.cat([torch.full((rows, 1), element.max), x], dim=1).to(DEVICE, dtype)
    expected, got = _both(x, fmt, "rne", scale_rule="floor")
    _assert_same_block_tensor(expected, got, (fmt, dtype))
    assert torch.equal(got.scales.float(), torch.ones(rows, 1, device=DEVICE))  # scales of 1
    want = blocks.quantize(x, fmt, "rne", scale_rule="floor", backend="torch").dequantize()
    assert _same_bits(fake_quantize_blocks(x, element, block, "floor"), want.to(dtype))


TILINGS = [
    kernel_blocks.QuantizeTiling(ELEMENTS=64, WARPS=1),
    kernel_blocks.QuantizeTiling(ELEMENTS=256, WARPS=2),
    kernel_blocks.QuantizeTiling(ELEMENTS=1024, WARPS=8),
]


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize(
    ("element", "block", "rule", "mode", "rht"),
    [
        ("e2m1", 16, "nvfp4", "rne", None),
        ("e2m1", 16, "nvfp4", "sr", 16),
        ("e4m3fn", 32, "rceil", "rne", None),
        ("e2m1", 32, "floor-3/4", "sr", 64),
    ],
)
def test_every_tiling_gives_the_default_tilings_bits(
    tiling: kernel_blocks.QuantizeTiling, element: str, block: int, rule: str, mode: str, rht
) -> None:
    # the recipes' configurations (nvfp4: x, dy with the RHT; mxfp8; mxfp4_tseng), with a
    # partial last tile: the tiling moves work between programs, never a bit
    generator = torch.Generator().manual_seed(21)
    x = (torch.randn(37, 128, generator=generator) * 5).to(DEVICE, torch.bfloat16)
    signs = None
    if rht is not None:
        signs = torch.where(torch.rand(rht, generator=generator) < 0.5, -1.0, 1.0).to(DEVICE)
    options = {
        "out_dtype": torch.bfloat16 if element == "e2m1" else torch.float32,
        "mode": mode,
        "seed": 3,
        "offset": 8,
        "tensor_scale": (torch.tensor([0.01, 100.0], device=DEVICE) if rule == "nvfp4" else None),
        "rht": rht,
        "rht_signs": signs,
        "rht_bf16": rht is not None,
    }
    expected = kernel_blocks.gemm_blocks(x, element, block, rule, **options)
    got = kernel_blocks.gemm_blocks(x, element, block, rule, tiling=tiling, **options)
    assert _same_bits(got, expected)


def test_a_tiling_is_checked() -> None:
    x = torch.ones(4, 64, device=DEVICE)
    bad = [
        (32, 4),
        ("64", 4),
        kernel_blocks.QuantizeTiling(ELEMENTS=48, WARPS=4),
        kernel_blocks.QuantizeTiling(ELEMENTS=16, WARPS=4),
        kernel_blocks.QuantizeTiling(ELEMENTS=64, WARPS=3),
    ]
    for tiling in bad:
        with pytest.raises(ValueError, match="tiling must be a QuantizeTiling"):
            kernel_blocks.gemm_blocks(
                x, "e2m1", 32, "floor", out_dtype=torch.float32, tiling=tiling
            )
    signs = torch.ones(64, device=DEVICE)
    with pytest.raises(ValueError, match="ELEMENTS >= 64"):
        kernel_blocks.gemm_blocks(
            x,
            "e2m1",
            16,
            "floor",
            out_dtype=torch.float32,
            rht=64,
            rht_signs=signs,
            tiling=kernel_blocks.QuantizeTiling(ELEMENTS=32, WARPS=4),
        )


@pytest.mark.parametrize("rht", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_recording_launch_raises_its_record_to_the_amax_and_keeps_the_bits(
    rht: int | None, dtype: torch.dtype
) -> None:
    """gemm_blocks given tensor scales and a record (a delayed tensor scale's launch): the
    values of the launch without one, and the record raised to the amax `nvfp4_tensor_scale`
    takes (after the RHT and its bf16 rounding), bit for bit; a NaN makes it NaN; a record
    holding the same amax keeps it (a recomputation's launch)."""
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(48, 64, generator=generator) * 3).to(dtype).to(DEVICE)
    signs = torch.where(torch.rand(16, generator=generator) < 0.5, -1.0, 1.0).to(DEVICE)
    rotation = {"rht": rht, "rht_signs": signs if rht else None, "rht_bf16": rht is not None}
    _, amax = kernel_blocks.nvfp4_tensor_scale(x, **rotation)
    given = torch.tensor([0.5, 2.0], device=DEVICE)
    stream = {"seed": torch.tensor([7], device=DEVICE), "offset": torch.tensor([3], device=DEVICE)}
    options = {"out_dtype": torch.bfloat16, "tensor_scale": given, "mode": "sr", **stream}
    record = torch.zeros(1, device=DEVICE)
    values = kernel_blocks.gemm_blocks(x, "e2m1", 16, "nvfp4", record=record, **options, **rotation)
    plain = kernel_blocks.gemm_blocks(x, "e2m1", 16, "nvfp4", **options, **rotation)
    assert torch.equal(values, plain)
    assert record.view(torch.int32).item() == amax.reshape(1).view(torch.int32).item()
    kernel_blocks.gemm_blocks(x, "e2m1", 16, "nvfp4", record=record, **options, **rotation)
    assert record.view(torch.int32).item() == amax.reshape(1).view(torch.int32).item()
    x[5, 7] = float("nan")
    record.zero_()
    kernel_blocks.gemm_blocks(x, "e2m1", 16, "nvfp4", record=record, **options, **rotation)
    assert record.isnan().all()


def test_a_recording_launch_of_2d_tiles_records_the_tensors_amax() -> None:
    """Given its tiles' amaxes (2-D tiles), the launch records x's amax, not theirs."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    tiles = kernel_blocks.tile_amax(x, (16, 16)).amax
    record = torch.zeros(1, device=DEVICE)
    given = torch.tensor([0.5, 2.0], device=DEVICE)
    kernel_blocks.gemm_blocks(
        x, "e2m1", 16, "nvfp4", out_dtype=torch.bfloat16, tensor_scale=given, amax=tiles,
        record=record,
    )  # fmt: skip
    assert torch.equal(record, x.abs().amax().reshape(1))
