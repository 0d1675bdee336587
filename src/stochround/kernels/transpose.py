"""A tiled Triton transpose: the contiguous transpose of a 2-D tensor in one pass.

The wgrad GEMM's operands are x and dy transposed (the tokens become the contraction axis,
which the block quantizer wants last and contiguous).  PyTorch's strided copy of a
transposed view reads or writes across rows element by element; this kernel loads a square
tile of rows, transposes it in registers and stores it as rows of the result, so both the
loads and the stores are contiguous runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import INTERPRETED, current_device, on_kernel_device
from .grid import cdiv
from .runtime import bound_launch

# the tile's side: a power of two, large enough for full memory transactions on both sides
TILE = 64
_NUM_WARPS = 4


@triton.jit
def tile_places(program, rows, cols, col_tiles, WIDE: tl.constexpr, TILE: tl.constexpr):
    """Program ``program``'s TILE x TILE tile (p // col_tiles, p % col_tiles) of a rows x
    cols row-major tensor: its elements' rows, columns and mask there, then the same of
    their places in the cols x rows transpose (the tile transposed: `tl.trans`)."""
    if WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    tile_row = program // col_tiles
    tile_col = program % col_tiles
    row = tile_row * TILE + tl.arange(0, TILE)[:, None]
    col = tile_col * TILE + tl.arange(0, TILE)[None, :]
    row_t = tile_col * TILE + tl.arange(0, TILE)[:, None]
    col_t = tile_row * TILE + tl.arange(0, TILE)[None, :]
    return row, col, (row < rows) & (col < cols), row_t, col_t, (row_t < cols) & (col_t < rows)


@triton.jit
def _transpose_kernel(
    x_ptr, out_ptr, rows, cols, col_tiles, WIDE: tl.constexpr, TILE: tl.constexpr
):
    """out[j, i] = x[i, j] for one TILE x TILE tile of x (rows x cols, row-major); program
    p takes tile (p // col_tiles, p % col_tiles)."""
    row, col, mask, row_t, col_t, mask_t = tile_places(
        tl.program_id(0), rows, cols, col_tiles, WIDE, TILE
    )
    tile = tl.load(x_ptr + row * cols + col, mask=mask)
    tl.store(out_ptr + row_t * rows + col_t, tl.trans(tile), mask=mask_t)


def transpose(x: Tensor, *, kernel: bool | None = None) -> Tensor:
    """``x.T.contiguous()`` of a 2-D tensor (any dtype): by the tiled kernel for a
    contiguous CUDA tensor (``kernel=None``; True: also a CPU tensor under Triton's
    interpreter, for tests), else by PyTorch's copy.  The values are copied, never
    converted: the result equals ``x.T`` bit for bit."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D; got shape {tuple(x.shape)}")
    use_kernel = on_kernel_device(x) if kernel is None else kernel
    if kernel and not (x.is_cuda or INTERPRETED):
        raise ValueError("kernel=True needs a CUDA tensor or TRITON_INTERPRET=1")
    if not use_kernel or not x.is_contiguous() or x.numel() == 0:
        return x.T.contiguous()
    rows, cols = x.shape
    out = x.new_empty((cols, rows))
    wide = x.numel() + TILE * max(rows, cols) >= 2**31
    constants = (("WIDE", wide), ("TILE", TILE), ("num_warps", _NUM_WARPS))
    launch = bound_launch(_transpose_kernel, constants)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return transpose(x, kernel=kernel)
    col_tiles = cdiv(cols, TILE)
    device = x.device.index if x.is_cuda else -1
    launch(device, cdiv(rows, TILE) * col_tiles, x, out, rows, cols, col_tiles)
    return out


__all__ = ["TILE", "tile_places", "transpose"]
