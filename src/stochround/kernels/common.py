"""Triton helpers shared by the kernels (rounding, optimizers, matmul), and the host-side
constants they are specialized on.

The rounding contract on the bits of fp32, in 32-bit integers (bf16 and fp16 inputs are
widened exactly): with |x| = m 2**(e_in - 23), m the 24-bit significand (e_in = -126 for
fp32 subnormals, which every supported format clamps to emin >= -126 anyway),

    e = max(e_in, emin),  d = e - e_in + 23 - mbits  (bits discarded from m),
    kept = m >> d,  rem = m mod 2**d,  nu = rem / 2**d,  magnitude = (kept + away) 2**(e - mbits).

Deterministic modes compare rem with 2**(d-1) (`deterministic_away`); SR compares count + r
with 2**n, where count is the floor / half-up / half-even / half-odd rounding of nu 2**n
(`sr_count`).  `rounded_fp32_bits` builds the result's fp32 bits with integer operations
only (no float multiply, so no flush-to-zero of subnormals), then handles overflow, signed
zeros, infinities and NaN.  Kernel choices are string constexprs: MODE in
`stochround.reference.MODES`, VARIANT in `VARIANTS`, SATURATION in `SATURATIONS`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ..cpu_path import INPUT_DTYPES
from ..formats import Format
from ..reference import overflow_value
from ..torch_path import nan_code
from .availability import kernel_supports
from .philox import four_words, random_word

NAN16_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def fp32_bits(value: float) -> int:
    """The fp32 bit pattern of a float that fp32 holds exactly (NaN: 0x7FC00000), as the
    signed int32 the kernels compare and select."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


@triton.jit
def tile_words(seed, offset, group, lane):
    """The uint32 words of a [ROWS, 4] tile whose row r is Philox block ``group[r]``."""
    word0, word1, word2, word3 = four_words(seed, offset, group)
    word = tl.where(lane == 0, word0[:, None], word1[:, None])
    word = tl.where(lane == 2, word2[:, None], word)
    return tl.where(lane == 3, word3[:, None], word)


@triton.jit
def block_tile_words(seed, offset, index, lane, ALIGNED: tl.constexpr):
    """The uint32 stream word of each element of a [TILE, GROUPS, 4] tile of blocks
    (``index``: the global indices; the block kernels' tile); ALIGNED: the four lanes of
    each group are one Philox block, computed once (its number, index >> 2, taken as a max
    over the lanes, a reduction within each thread: the words then come in the tile's own
    layout, with no conversion)."""
    if ALIGNED:
        group = tl.max(index, axis=2) >> 2
        word0, word1, word2, word3 = four_words(seed, offset, group)
        word = tl.where(lane == 0, word0[:, :, None], word1[:, :, None])
        word = tl.where(lane == 2, word2[:, :, None], word)
        return tl.where(lane == 3, word3[:, :, None], word)
    else:
        return random_word(seed, offset, index)


@triton.jit
def deterministic_away(above_half, at_half, inexact, odd, negative, MODE: tl.constexpr):
    """Whether a deterministic mode (MODE: "rne", "rna", "rz", "ru", "rd" or "ro") rounds a
    magnitude away from zero, given how its discarded part compares with half an ulp."""
    if MODE == "rne":
        return above_half | (at_half & odd)
    elif MODE == "rna":
        return above_half | at_half
    elif MODE == "rz":
        return inexact & ~inexact
    elif MODE == "ru":
        return inexact & ~negative
    elif MODE == "rd":
        return inexact & negative
    else:
        tl.static_assert(MODE == "ro", "MODE must be a deterministic rounding mode")
        return inexact & ~odd


@triton.jit
def sr_count_rounds_up(floor, below, half, VARIANT: tl.constexpr):
    """Whether the count SR adds r to rounds up from ``floor``, the floor of nu 2**n, given
    ``below`` (what the floor dropped) and ``half`` (half of one count): never (variant "a"),
    from half up ("b"), above half or at half to even ("c"), or at half to odd ("odd")."""
    if VARIANT == "a":
        return below < 0
    elif VARIANT == "b":
        return below >= half
    elif VARIANT == "c":
        return (below > half) | ((below == half) & ((floor & 1) == 1))
    else:
        tl.static_assert(VARIANT == "odd", "VARIANT must be a, b, c or odd")
        return (below > half) | ((below == half) & ((floor & 1) == 0))


@triton.jit
def sr_count(rem, d, NBITS: tl.constexpr, VARIANT: tl.constexpr):
    """The integer each SR variant adds to r (int64): floor, half-up, half-even or half-odd
    of nu 2**n for nu = rem / 2**d (rem < 2**24, int32)."""
    exact = d <= NBITS  # nu 2**n = rem 2**(n - d) is an integer
    up_shift = tl.minimum(tl.maximum(NBITS - d, 0), 31)  # d >= 1 when rem != 0
    down_shift = tl.minimum(tl.maximum(d - NBITS, 1), 31)  # rem < 2**24: 31 clears it
    floor = rem >> down_shift
    below = rem - (floor << down_shift)
    half = 1 << (down_shift - 1)
    up = sr_count_rounds_up(floor, below, half, VARIANT)
    rounded = (floor + up.to(tl.int32)).to(tl.int64)
    return tl.where(exact, rem.to(tl.int64) << up_shift, rounded)


@triton.jit
def rounded_fp32_bits(
    bits,
    r,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    HAS_NEGATIVE_ZERO: tl.constexpr,
    MAX_BITS: tl.constexpr,
    NEGATIVE_LIMIT_BITS: tl.constexpr,
    MIN_NORMAL_BITS: tl.constexpr,
    OVERFLOW_POSITIVE: tl.constexpr,
    OVERFLOW_NEGATIVE: tl.constexpr,
    INFINITY_POSITIVE: tl.constexpr,
    INFINITY_NEGATIVE: tl.constexpr,
    MODE: tl.constexpr,
    VARIANT: tl.constexpr,
    NBITS: tl.constexpr,
):
    """fp32 bit patterns (int32) of x (its fp32 bits, int32) rounded per the contract;
    r: the random integers (int64).  Everything but the final SR comparison is int32."""
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    is_infinite = magnitude == 0x7F800000
    is_zero = magnitude == 0
    negative = (bits < 0) & (magnitude != 0)
    exponent_field = magnitude >> 23
    m = (magnitude & 0x7FFFFF) | tl.where(exponent_field > 0, 0x800000, 0)
    e_in = tl.maximum(exponent_field, 1) - 127
    e = tl.maximum(e_in, EMIN)
    d = e - e_in + (23 - MBITS)  # bits discarded from m
    shift = tl.minimum(d, 31)  # m < 2**24: a shift of 31 clears it, and nu < 1/2 stays so
    kept = m >> shift
    rem = m - (kept << shift)
    if MBITS > 0:
        odd = (kept & 1) == 1
    else:  # p = 1: the code's last bit is the exponent field's
        odd = (kept != 0) & (((e + BIAS) & 1) == 1)
    if MODE == "sr":
        count = sr_count(rem, d, NBITS, VARIANT)
        away = ((count + r) >> NBITS) != 0
    else:
        half = 1 << tl.maximum(shift - 1, 0)
        above_half = (rem > half) & (shift > 0)
        at_half = (rem == half) & (shift > 0)
        away = deterministic_away(above_half, at_half, rem != 0, odd, negative, MODE)
    total = kept + away.to(tl.int32)  # <= 2**24
    q = e - MBITS
    total_bits = total.to(tl.float32).to(tl.int32, bitcast=True)
    normal = (total_bits >> 23) - 127 + q >= -126
    result = tl.where(normal, total_bits + (q << 23), total << tl.minimum(q + 149, 31))
    result = tl.where(total == 0, 0, result)
    if not HAS_ZERO:
        result = tl.maximum(result, MIN_NORMAL_BITS)
    overflow_positive = ~negative & (result > MAX_BITS)
    overflow_negative = negative & (result > NEGATIVE_LIMIT_BITS)
    if HAS_NEGATIVE_ZERO:
        result = tl.where(negative, result | -0x80000000, result)
    else:
        result = tl.where(negative & (result != 0), result | -0x80000000, result)
    result = tl.where(overflow_positive, OVERFLOW_POSITIVE, result)
    result = tl.where(overflow_negative, OVERFLOW_NEGATIVE, result)
    if HAS_ZERO:
        if HAS_NEGATIVE_ZERO:
            zero = bits & -0x80000000
        else:
            zero = bits * 0
    else:
        zero = bits * 0 + MIN_NORMAL_BITS
    result = tl.where(is_zero, zero, result)
    result = tl.where(is_infinite, tl.where(bits < 0, INFINITY_NEGATIVE, INFINITY_POSITIVE), result)
    return tl.where(is_nan, 0x7FC00000, result)


@triton.jit
def encode_bits(
    value_bits,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    SIGNED: tl.constexpr,
    TWOS_COMPLEMENT: tl.constexpr,
    INFINITY_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    CODE_MASK: tl.constexpr,
):
    """Codes of fp32 bit patterns of format values (normal in fp32): magnitude code
    (max(e, emin) + bias - 1) 2**mbits + K, K the significand at the ulp 2**(max(e, emin) - m)."""
    magnitude = value_bits & 0x7FFFFFFF
    e = (magnitude >> 23) - 127
    e_clamped = tl.maximum(e, EMIN)
    significand = (magnitude & 0x7FFFFF) | 0x800000
    k = significand >> tl.minimum(23 - MBITS + e_clamped - e, 31)
    code = ((e_clamped + BIAS - 1) << MBITS) + k
    code = tl.where(magnitude == 0, 0, code)
    code = tl.where(magnitude == 0x7F800000, INFINITY_CODE, code)
    negative = value_bits < 0
    if TWOS_COMPLEMENT:
        code = tl.where(negative, (CODE_MASK + 1 - code) & CODE_MASK, code)
    elif SIGNED:
        code = code | tl.where(negative, 1 << (EBITS + MBITS), 0)
    return tl.where(magnitude > 0x7F800000, NAN_CODE, code)


@triton.jit
def sign_bit(bits, code, SIGN_SHIFT: tl.constexpr, HAS_NEGATIVE_ZERO: tl.constexpr):
    """The sign bit of each code (at bit SIGN_SHIFT of a sign-magnitude code) from x's fp32
    bits (int32): x's sign, except on zero in formats without -0."""
    sign = (bits >> (31 - SIGN_SHIFT)) & (1 << SIGN_SHIFT)
    if not HAS_NEGATIVE_ZERO:
        sign = tl.where(code != 0, sign, 0)
    return sign


@triton.jit
def fp32_bits_of(x):
    """The fp32 bit pattern (int32) of fp32/bf16/fp16 values; bf16 widened with integer
    operations (the interpreter's bf16 -> fp32 conversion flushes subnormals)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16
    else:
        return x.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def narrow_to_16_bits(result, dtype: tl.constexpr, NAN16: tl.constexpr):
    """fp32 bit patterns (int64) to bf16 or fp16 values, round to nearest even, NaN to the
    canonical NaN.  bf16 is narrowed with integer operations (keeps subnormals everywhere)."""
    if dtype == tl.bfloat16:
        wide = result.to(tl.uint32, bitcast=True)
        narrow = ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).to(tl.int32, bitcast=True)
    else:
        value = result.to(tl.float32, bitcast=True)
        narrow = value.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    narrow = tl.where((result & 0x7FFFFFFF) > 0x7F800000, NAN16, narrow)
    return narrow.to(tl.int16).to(dtype, bitcast=True)


@triton.jit
def store_block_tile(
    out_ptr,
    values,
    position,
    mask,
    program,
    blocks,
    BLOCK: tl.constexpr,
    GROUPS: tl.constexpr,
    TILE: tl.constexpr,
):
    """Store a [TILE, GROUPS, 4] tile of element values (TILE blocks of BLOCK consecutive
    elements, program ``program``'s) at ``position`` where ``mask``.  Where the blocks fill
    their groups (GROUPS * 4 == BLOCK), the tile is one run of TILE * BLOCK elements,
    stored as that run, which Triton stores coalesced (16 bytes a thread, the next thread
    the next 16) through shared memory: from the threads' own blocks, each vector store
    instruction fills only a part of each sector it touches."""
    if GROUPS * 4 == BLOCK:
        ELEMENTS: tl.constexpr = TILE * BLOCK
        place = program * ELEMENTS + tl.arange(0, ELEMENTS)
        inside = place // BLOCK < blocks  # the run's blocks that the tensor holds
        tl.store(out_ptr + place, tl.reshape(values, (ELEMENTS,)), mask=inside)
    else:
        tl.store(out_ptr + position, values, mask=mask)


@triton.jit
def seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS: tl.constexpr):
    """Seed and offset: loaded from device tensors (CUDA graphs replay them) or as given."""
    if FROM_TENSORS:
        return tl.load(seed_ptr), tl.load(offset_ptr)
    else:
        return seed_value, offset_value


@triton.jit
def bf16_sr(bits, word, NBITS: tl.constexpr, SATURATION: tl.constexpr):
    """bf16 values of fp32 bits (uint32) rounded stochastically by their words (uint32):
    the random bits added just below bit 16, then truncated.  SATURATION: "none",
    "propagate" (finite overflow to +-max) or "finite" (infinities too)."""
    if NBITS >= 16:  # n >= 16 bits: every variant is exact SR, the top 16 bits decide
        noise = word >> 16
    else:  # variant a with n bits: r placed just below the kept bits
        noise = (word >> (32 - NBITS)) << (16 - NBITS)
    rounded = (bits + noise) >> 16
    magnitude = bits & 0x7FFFFFFF
    if SATURATION != "none":
        limit = 0x7F800000 if SATURATION == "propagate" else 0x7F800001
        overflowed = ((rounded & 0x7FFF) == 0x7F80) & (magnitude < limit)
        rounded = tl.where(overflowed, rounded - 1, rounded)
    rounded = tl.where(magnitude > 0x7F800000, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


# launch constants are cached per format and choices (read-only mappings: calls unpack them)
@functools.cache
def overflow_bits(fmt: Format, mode: str, sat: str) -> Mapping[str, int]:
    return MappingProxyType(
        {
            "OVERFLOW_POSITIVE": fp32_bits(overflow_value(False, False, fmt, mode, sat)),
            "OVERFLOW_NEGATIVE": fp32_bits(overflow_value(True, False, fmt, mode, sat)),
            "INFINITY_POSITIVE": fp32_bits(overflow_value(False, True, fmt, mode, sat)),
            "INFINITY_NEGATIVE": fp32_bits(overflow_value(True, True, fmt, mode, sat)),
        }
    )


def layout_constants(fmt: Format) -> dict[str, int]:
    """What every rounding kernel needs of a format's layout."""
    return {
        "MBITS": fmt.mbits,
        "EMIN": fmt.emin,
        "BIAS": fmt.exponent_bias,
        "HAS_NEGATIVE_ZERO": fmt.has_negative_zero,
    }


@functools.cache
def format_constants(fmt: Format) -> Mapping[str, int]:
    return MappingProxyType(
        {
            **layout_constants(fmt),
            "HAS_ZERO": fmt.has_zero,
            "MAX_BITS": fp32_bits(fmt.max),
            # negative results beyond this magnitude overflow; -1: every negative value does
            "NEGATIVE_LIMIT_BITS": fp32_bits(abs(fmt.lowest)) if fmt.lowest <= 0 else -1,
            "MIN_NORMAL_BITS": fp32_bits(fmt.min_normal),
            "EBITS": fmt.ebits,
            "SIGNED": fmt.signed,
            "TWOS_COMPLEMENT": fmt.twos_complement,
            "INFINITY_CODE": fmt.max_magnitude_code + 1,
            "NAN_CODE": nan_code(fmt),
            "CODE_MASK": fmt.num_codes - 1,
        }
    )


def as_int64(value: int) -> int:
    """A seed or offset in [0, 2**64) as the signed 64-bit integer of the same bits (the
    kernels read it as unsigned 64-bit)."""
    return value - 2**64 if value >= 2**63 else value


__all__ = [
    "INPUT_DTYPES",
    "NAN16_BITS",
    "as_int64",
    "bf16_sr",
    "block_tile_words",
    "deterministic_away",
    "encode_bits",
    "format_constants",
    "fp32_bits",
    "fp32_bits_of",
    "kernel_supports",
    "layout_constants",
    "narrow_to_16_bits",
    "overflow_bits",
    "rounded_fp32_bits",
    "seed_and_offset",
    "sign_bit",
    "sr_count",
    "sr_count_rounds_up",
    "store_block_tile",
    "tile_words",
]
