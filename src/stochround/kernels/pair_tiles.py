"""Where a two-orientation program's tile of x lies and how it is read (`@triton.jit`), for
the pair's kernels (`stochround.kernels.two_orientation`): the tiling record, a program's
first token and feature, and the tile's blocks of 16 as [blocks, 4, 4], row-wise (16
features of a token) and column-wise (16 tokens of a feature, rotated along the tokens),
one thread a block, with their places in the operands."""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from .block_rotation import rotated
from .common import fp32_bits_of
from .e2m1_operand import rounded_to_bf16


class PairTiling(NamedTuple):
    """A program's tile: TOKENS x FEATURES elements of x (multiples of the block and of the
    rotation); WIDE: positions beyond int32; X_FEATURES: x's features (its rows' stride,
    a constant: every element's offset from its thread's first is an immediate, and a
    program's tile a division by a constant); EVEN: x's tokens fill whole tiles with no
    padding tokens and its features whole tiles (no masks); STAGED: the operands stored
    as tile matrices (`two_orientation.STAGED_STORES`)."""

    TOKENS: int
    FEATURES: int
    WIDE: bool
    X_FEATURES: int
    EVEN: bool
    STAGED: bool


@triton.jit
def tile_start(program, TILING: tl.constexpr):
    """A program's first token and feature (int64 where TILING.WIDE)."""
    FEATURE_TILES: tl.constexpr = (TILING.X_FEATURES + TILING.FEATURES - 1) // TILING.FEATURES
    if TILING.WIDE:
        program = program.to(tl.int64)
    return (program // FEATURE_TILES) * TILING.TOKENS, (program % FEATURE_TILES) * TILING.FEATURES


@triton.jit
def _block_places(first_line, first, LINES: tl.constexpr, LENGTH: tl.constexpr):
    """A LINES x LENGTH tile (its first line and element ``first_line``, ``first``) cut
    into blocks of 16 along its lines, as [LINES * LENGTH // 16, 4, 4] (block, group,
    lane): each block's line ([blocks, 1, 1]) and each element's place along its line,
    the blocks line by line."""
    CHUNKS: tl.constexpr = LENGTH // 16
    block = tl.arange(0, LINES * CHUNKS)[:, None, None]
    group = tl.arange(0, 4)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    line, chunk = block // CHUNKS, block % CHUNKS
    return first_line + line, first + chunk * 16 + group * 4 + lane


@triton.jit
def row_blocks(x_ptr, first_token, first_feature, tokens, TILING: tl.constexpr):
    """The tile's row-wise blocks (16 features of a token) as fp32 bits [blocks, 4, 4] (int32,
    zero beyond x), their places in x (and in the row-wise operand: the same layout) and
    whether they lie in x (not read where TILING.EVEN).  x's features are a multiple of 16:
    each group of four is one vector access."""
    token, feature = _block_places(first_token, first_feature, TILING.TOKENS, TILING.FEATURES)
    position = token * TILING.X_FEATURES + feature
    inside = (token < tokens) & (feature < TILING.X_FEATURES)
    if TILING.EVEN:
        x = tl.load(x_ptr + position)
    else:
        x = tl.load(x_ptr + position, mask=inside, other=0.0)
    return fp32_bits_of(x), position, inside


@triton.jit
def column_blocks(
    x_ptr,
    signs_ptr,
    first_token,
    first_feature,
    tokens,
    padded,
    TILING: tl.constexpr,
    ROTATION: tl.constexpr,
    NAN16: tl.constexpr,
    ROUNDED: tl.constexpr,
):
    """The tile's column-wise blocks (16 tokens of a feature, the tokens from ``tokens`` to
    ``padded`` zero) as fp32 bits [blocks, 4, 4], rotated along the tokens as
    `quantize_blocks_kernel` rotates x^T's rows, their places in x^T ``(features,
    padded)`` and whether they lie in it (not read where TILING.EVEN).  The values are
    gathered from x in the blocks' own layout (each thread's elements a block's tokens),
    as the row-wise blocks of the same tile were just read: the second read is served by
    the cache, and the rotation, the amax and the stream's groups of four stay within a
    thread, as in the block kernel.  The tile's first token is a multiple of the rotation's
    size, so an element's sign is that of its token's place in the tile (for RHT-16 its
    place in the block).  ROUNDED: the rotated values rounded as the quantize kernels hold
    them (`rounded_to_bf16`: any NaN a NaN, which is all the quantization reads of one),
    else in fp32 as the butterfly leaves them.  Also returns the values before the
    rotation."""
    feature, token = _block_places(first_feature, first_token, TILING.FEATURES, TILING.TOKENS)
    features: tl.constexpr = TILING.X_FEATURES
    if TILING.EVEN:
        x = tl.load(x_ptr + token * features + feature)
    else:
        inside = (token < tokens) & (feature < features)
        x = tl.load(x_ptr + token * features + feature, mask=inside, other=0.0)
    raw = fp32_bits_of(x)
    bits = raw
    if ROTATION.SIZE > 0:
        value = rotated(raw.to(tl.float32, bitcast=True), signs_ptr, token - first_token,
                        ROTATION, False)  # fmt: skip
        if ROUNDED:
            value = rounded_to_bf16(value, NAN16, x.dtype, ROTATION.BF16)
        bits = value.to(tl.int32, bitcast=True)
    return raw, bits, feature * padded + token, (feature < features) & (token < padded)


__all__ = ["PairTiling", "column_blocks", "row_blocks", "tile_start"]
