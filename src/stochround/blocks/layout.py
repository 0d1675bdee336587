"""The tiled ("swizzled") layout of block scales that cuBLAS and Blackwell block-scaled GEMMs
read, and its inverse.

A ``[rows, cols]`` scale matrix (one scale per block: ``rows`` of the operand, ``cols``
blocks along its reduction axis) is padded with zero bytes to ``R = 128 * ceil(rows / 128)``
rows and ``C = 4 * ceil(cols / 4)`` columns and cut into 128 x 4 tiles, stored one after
another in row-major tile order (tile ``(row // 128, col // 4)``: index
``(row // 128) * (C / 4) + col // 4``), 512 scales each. Inside a tile, the scale at
``(r, c)`` (``r = row % 128``, ``c = col % 4``) lies at::

    (r % 32) * 16 + (r // 32) * 4 + c

so the 16 bytes at ``16 * (r % 32)`` hold rows ``r % 32, r % 32 + 32, + 64, + 96`` of the
tile, four scales each. This is the "1D block scaling factors layout" of the cuBLAS
documentation (cuBLASLt block-scaled matmuls, MXFP8/MXFP4 with E8M0 and NVFP4 with E4M3
scales), and what torchao's ``to_blocked`` (``torchao.prototype.mx_formats.utils``) writes.

The swizzled tensor is returned with shape ``(R / 4, 4 C)`` = ``(32 * row tiles, 16 * col
tiles)``, the shape torchao stores swizzled scales with; its row-major order is the tiled
order above, so ``flatten()`` is the buffer cuBLAS reads (and equals ``to_blocked``).
"""

from __future__ import annotations

import numbers

from torch import Tensor

__all__ = ["SCALE_TILE", "swizzle_scales", "swizzled_shape", "unswizzle_scales"]

# the tile: 128 rows (4 groups of 32 interleaved) by 4 scale columns
SCALE_TILE = (128, 4)
TILE_ROW_GROUPS = 4  # rows r, r + 32, r + 64, r + 96 of a tile share 16 consecutive bytes
TILE_ROW_GROUP = 32


def _tiles(length: int, tile: int) -> int:
    return -(-length // tile)


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """The shape `swizzle_scales` returns for a ``[rows, cols]`` scale matrix:
    ``(32 * ceil(rows / 128), 16 * ceil(cols / 4))``."""
    return (
        TILE_ROW_GROUP * _tiles(rows, SCALE_TILE[0]),
        TILE_ROW_GROUPS * SCALE_TILE[1] * _tiles(cols, SCALE_TILE[1]),
    )


def swizzle_scales(scales: Tensor) -> Tensor:
    """The scales of a ``[rows, cols]`` matrix in the 128 x 4 tiled layout of the module
    docstring, padded with zero bytes.

    Args:
        scales: a 2-D tensor of any dtype (``torch.float8_e8m0fnu``, ``torch.float8_e4m3fn``,
            their ``uint8`` bytes, float32 ...): one scale per block, ``rows`` by ``cols``.

    Returns a contiguous tensor of scales' dtype and device, of shape `swizzled_shape`
    ``(rows, cols)``; its ``flatten()`` is the buffer a cuBLAS block-scaled GEMM reads.
    """
    if not isinstance(scales, Tensor):
        raise TypeError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dim() != 2:
        raise ValueError(
            f"scales must be a 2-D [rows, cols] tensor; got shape {tuple(scales.shape)}"
        )
    rows, cols = scales.shape
    row_tiles, col_tiles = _tiles(rows, SCALE_TILE[0]), _tiles(cols, SCALE_TILE[1])
    padded = scales.new_zeros(row_tiles * SCALE_TILE[0], col_tiles * SCALE_TILE[1])
    padded[:rows, :cols] = scales
    # [row tile, row group (r // 32), r % 32, col tile, c] -> [row tile, col tile, r % 32,
    # row group, c]: the offset formula of the module docstring
    tiled = padded.view(row_tiles, TILE_ROW_GROUPS, TILE_ROW_GROUP, col_tiles, SCALE_TILE[1])
    return tiled.permute(0, 3, 2, 1, 4).reshape(swizzled_shape(rows, cols))


def unswizzle_scales(swizzled: Tensor, rows: int, cols: int) -> Tensor:
    """The ``[rows, cols]`` scale matrix back from its tiled layout (the padding dropped):
    ``unswizzle_scales(swizzle_scales(s), *s.shape)`` equals ``s``.

    Args:
        swizzled: the tiled scales, of shape `swizzled_shape` ``(rows, cols)`` or flat (1-D)
            with as many elements (torchao's ``to_blocked`` output).
        rows: the number of rows of the scale matrix, a non-negative int.
        cols: the number of scale columns (blocks per row), a non-negative int.

    Returns a contiguous ``[rows, cols]`` tensor of swizzled's dtype and device.
    """
    if not isinstance(swizzled, Tensor):
        raise TypeError(f"swizzled must be a torch.Tensor, got {type(swizzled).__name__}")
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value}")
    shape = swizzled_shape(rows, cols)
    if tuple(swizzled.shape) not in (shape, (shape[0] * shape[1],)):
        raise ValueError(
            f"swizzled must have shape {shape} (or ({shape[0] * shape[1]},) flat) for "
            f"rows={rows}, cols={cols}; got {tuple(swizzled.shape)}"
        )
    row_tiles, col_tiles = _tiles(rows, SCALE_TILE[0]), _tiles(cols, SCALE_TILE[1])
    tiled = swizzled.reshape(
        row_tiles, col_tiles, TILE_ROW_GROUP, TILE_ROW_GROUPS, SCALE_TILE[1]
    ).permute(0, 3, 2, 1, 4)
    padded = tiled.reshape(row_tiles * SCALE_TILE[0], col_tiles * SCALE_TILE[1])
    return padded[:rows, :cols].contiguous()
