"""The 128 x 4 tiled scale layout (`stochround.blocks.layout`): equal to torchao's
``to_blocked`` bit for bit (padding included), the offset formula of the cuBLAS
documentation element by element, and the inverse."""

from __future__ import annotations

import pytest
import torch
from torchao.prototype.mx_formats.utils import to_blocked

from stochround.blocks.layout import swizzle_scales, swizzled_shape, unswizzle_scales

SHAPES = [(1, 1), (3, 5), (128, 4), (128, 8), (129, 4), (256, 12), (200, 7), (64, 130), (0, 4)]


def scale_bytes(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random e8m0 scales (every byte but 0xFF, the NaN code) of shape [rows, cols]."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 255, (rows, cols), generator=generator, dtype=torch.uint8)
    return codes.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_swizzled_scales_equal_torchaos_to_blocked(shape: tuple[int, int]) -> None:
    scales = scale_bytes(*shape, seed=shape[0] * 1000 + shape[1])
    swizzled = swizzle_scales(scales)
    assert swizzled.shape == swizzled_shape(*shape) and swizzled.dtype == scales.dtype
    assert swizzled.is_contiguous()
    expected = to_blocked(scales.view(torch.uint8))
    assert torch.equal(swizzled.view(torch.uint8).flatten(), expected)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.float32])
def test_other_scale_dtypes_swizzle_alike(dtype: torch.dtype) -> None:
    """The layout moves scales, whatever their dtype (NVFP4's e4m3, raw bytes, fp32)."""
    scales = torch.arange(200 * 7, dtype=torch.float32).reshape(200, 7).remainder(200).to(dtype)
    swizzled = swizzle_scales(scales)
    assert swizzled.dtype == dtype
    assert torch.equal(swizzled.flatten().float(), to_blocked(scales.float()))


@pytest.mark.parametrize("shape", [(3, 5), (129, 9), (256, 8)], ids=str)
def test_every_scale_sits_at_the_documented_offset(shape: tuple[int, int]) -> None:
    """Scale (row, col) at tile ((row // 128) * ceil(cols / 4) + col // 4) * 512 + (r % 32) *
    16 + (r // 32) * 4 + c, with r = row % 128, c = col % 4; every other byte is padding 0."""
    rows, cols = shape
    ids = torch.arange(1, rows * cols + 1, dtype=torch.int64).reshape(rows, cols)
    flat = swizzle_scales(ids).flatten()
    col_tiles = -(-cols // 4)
    row, col = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = row % 128, col % 4
    offset = ((row // 128) * col_tiles + col // 4) * 512 + (r % 32) * 16 + (r // 32) * 4 + c
    assert torch.equal(flat[offset], ids)
    padding = torch.ones_like(flat, dtype=torch.bool)
    padding[offset.flatten()] = False
    assert int(flat[padding].abs().sum()) == 0


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unswizzle_inverts_swizzle(shape: tuple[int, int]) -> None:
    scales = scale_bytes(*shape, seed=7)
    swizzled = swizzle_scales(scales)
    back = unswizzle_scales(swizzled, *shape)
    assert back.shape == shape and back.dtype == scales.dtype
    assert torch.equal(back.view(torch.uint8), scales.view(torch.uint8))
    # torchao's flat buffer is accepted too
    flat = to_blocked(scales.view(torch.uint8))
    assert torch.equal(unswizzle_scales(flat, *shape), scales.view(torch.uint8))


def test_swizzle_traces_under_torch_compile() -> None:
    scales = scale_bytes(130, 6, seed=3).view(torch.uint8)
    compiled = torch.compile(swizzle_scales, fullgraph=True)(scales)
    assert torch.equal(compiled, swizzle_scales(scales))


def test_bad_arguments_raise_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="scales must be a 2-D"):
        swizzle_scales(torch.ones(3, 4, 5))
    with pytest.raises(TypeError, match="scales must be a torch"):
        swizzle_scales([[1.0]])  # type: ignore[arg-type]
    swizzled = swizzle_scales(torch.ones(3, 5))
    with pytest.raises(ValueError, match=r"swizzled must have shape \(32, 48\).*got \(32, 32\)"):
        unswizzle_scales(swizzled, 3, 9)
    with pytest.raises(ValueError, match="rows must be a non-negative int"):
        unswizzle_scales(swizzled, -1, 5)
    with pytest.raises(TypeError, match="cols must be an int"):
        unswizzle_scales(swizzled, 3, 5.0)  # type: ignore[arg-type]
