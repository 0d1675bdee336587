"""The rounding kernels' [ROWS, 4] tiles (`@triton.jit`): a program's elements and their
random words (a row of four is one Philox call), and the stores of their codes."""

from __future__ import annotations

import triton
import triton.language as tl

from .availability import INTERPRETED
from .common import fp32_bits_of, seed_and_offset, tile_words
from .philox import data_word, random_word

# Each program rounds ROWS x 4 elements; a row is one Philox block.  The interpreter runs
# programs one after another, so there large blocks cost far less.
TILE_ROWS = 4096 if INTERPRETED else 256


@triton.jit
def tile_random_words(
    seed,
    offset,
    index,
    lane,
    group,
    rand_ptr,
    position,
    x,
    mask,
    SOURCE: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """The 32-bit random word (or explicit integer) of each element, as int64."""
    if SOURCE == "rand":
        return tl.load(rand_ptr + position, mask=mask, other=0).to(tl.int64)
    elif SOURCE == "data":
        return data_word(x, index).to(tl.int64)
    else:
        tl.static_assert(SOURCE == "stream", "SOURCE must be stream, rand or data")
        if ALIGNED:
            return tile_words(seed, offset, group, lane).to(tl.int64)
        else:
            return random_word(seed, offset, index).to(tl.int64)


@triton.jit
def row_tile(x_ptr, program, count, index_offset, ROWS: tl.constexpr):
    """Program ``program``'s [ROWS, 4] tile of x: each element's lane and flat position, the
    mask of positions below ``count``, x's values (0 beyond), and each row's Philox block
    at its global index (a row of four elements is one Philox call)."""
    row = tl.arange(0, ROWS)[:, None]
    lane = tl.arange(0, 4)[None, :]
    position = program * ROWS * 4 + row * 4 + lane
    mask = position < count
    x = tl.load(x_ptr + position, mask=mask, other=0.0)
    group = program * ROWS + tl.arange(0, ROWS) + (index_offset >> 2)
    return lane, position, mask, x, group


@triton.jit
def stream_row_tile(
    x_ptr,
    program,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    ALIGNED: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Program ``program``'s [ROWS, 4] tile (`row_tile`) with the elements' words of the
    stream: lane, position, mask, x's fp32 bits (int32) and the random words (uint32)."""
    lane, position, mask, x, group = row_tile(x_ptr, program, count, index_offset, ROWS)
    seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
    word = tile_random_words(
        seed,
        offset,
        position + index_offset,
        lane,
        group,
        seed_ptr,
        position,
        x,
        mask,
        "stream",
        ALIGNED,
    ).to(tl.uint32)
    return lane, position, mask, fp32_bits_of(x), word


@triton.jit
def store_row_codes(out_ptr, code, program, lane, count, OUTPUT: tl.constexpr, ROWS: tl.constexpr):
    """Store a [ROWS, 4] tile of codes: 16 bits each (OUTPUT "value": fp16 values are
    binary16's codes), one 32-bit word a row ("codes": four byte codes), one 16-bit word a
    row ("fp4x2": four 4-bit codes, the first in the low nibble), or three bytes a row
    ("fp6x4": four 6-bit codes, little-endian), whatever ``out_ptr``'s element type (the
    output's bytes are written as these words).  Word stores need the padded buffers of
    `_output_tensor`."""
    row = program * ROWS + tl.arange(0, ROWS)
    rows = (count + 3) // 4
    if OUTPUT == "fp6x4":
        word24 = tl.sum(code << (lane * 6), axis=1)
        byte_position = row[:, None] * 3 + lane
        byte = (word24[:, None] >> (lane * 8)) & 0xFF
        out_bytes = out_ptr.to(tl.pointer_type(tl.uint8))
        tl.store(
            out_bytes + byte_position, byte.to(tl.uint8), mask=(lane < 3) & (row[:, None] < rows)
        )
    else:
        if OUTPUT == "value":
            position = row[:, None] * 4 + lane
            pointer = out_ptr.to(tl.pointer_type(tl.int16)) + position
            value = code.to(tl.int16)
            mask = position < count
        else:
            # each thread's rows lie 32 x warps apart, so a warp's store of one word per
            # row is contiguous: said so (contiguity 1), the compiler stores the words
            # where they are instead of moving them through shared memory to vectorize
            words = out_ptr.to(tl.pointer_type(tl.int32 if OUTPUT == "codes" else tl.int16))
            pointer = words + tl.max_contiguous(row, 1)
            value = tl.sum(code << (lane * (8 if OUTPUT == "codes" else 4)), axis=1)
            value = value.to(tl.int32 if OUTPUT == "codes" else tl.int16)
            mask = row < rows
        # a full tile stores unmasked: a mask the compiler cannot prove uniform splits the
        # stores into single elements (2 bytes each for fp4)
        if (program + 1) * ROWS * 4 <= count:
            tl.store(pointer, value)
        else:
            tl.store(pointer, value, mask=mask)


@triton.jit
def flag_nan(flag_ptr, is_nan, mask):
    """Raise the flag when a format without a NaN code would have to hold NaN: an atomic
    from each such element only (no block-wide reduction on the common path)."""
    tl.atomic_max(flag_ptr + is_nan.to(tl.int32) * 0, 1, mask=is_nan & mask, sem="relaxed")


__all__ = [
    "TILE_ROWS",
    "flag_nan",
    "row_tile",
    "store_row_codes",
    "stream_row_tile",
    "tile_random_words",
]
