"""Triton rounding kernels, bit-identical to the PyTorch path (`stochround.torch_path`).

The PyTorch path evaluates the rounding contract in floating point; these kernels evaluate
it on the bits of fp32 with the shared helpers of `stochround.kernels.common`.  Three
kernels:

- `_round_kernel`: every mode, variant, rbits, saturation and random source; values,
  codes, packed fp4 or fp6.
- `_bf16_sr_kernel`: fp32 -> bf16 SR with n >= 16 bits (any variant) or variant a: exactly
  16 bits are discarded, so adding the random bits below bit 16 and truncating decides as
  the contract does.
- `_sr_codes_kernel`: SR from the stream straight to fp8/fp4 codes the same way, with the
  number of discarded bits varying below the smallest normal; magnitudes the saturation
  sends to the format's max are clamped to it, and tiles holding any other value beyond
  the format's range (NaN, infinities kept as such, overflow without saturation) are left
  to `_exact_codes_kernel`.

`KernelPlan` binds a call's choices to its kernel once; `kernel_plan` caches one plan per
set of choices.  Kernel choices are string constexprs: MODE in `stochround.reference.MODES`,
VARIANT in `VARIANTS`, SOURCE in `SOURCES`, OUTPUT in `stochround.torch_path.OUTPUTS`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import libdevice

from ..formats import Format
from ..random import seed_tensor
from ..torch_path import (
    checks_nan,
    nan_code,
    nan_without_code,
    output_shape,
    refuse_capture,
    saturation_bounds,
)
from .availability import INTERPRETED
from .common import (
    INPUT_DTYPES,
    NAN16_BITS,
    as_int64,
    bf16_sr,
    encode_bits,
    format_constants,
    fp32_bits,
    fp32_bits_of,
    kernel_supports,
    layout_constants,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    seed_and_offset,
    sign_bit,
    tile_words,
)
from .grid import cdiv, next_power_of_2
from .philox import data_word, random_word
from .runtime import SCRATCH, Launch, current_device, current_stream, persistent_programs

# where SR's random integers come from: the counter-based stream, explicit integers, or
# words hashed from each value and its index
SOURCES = ("stream", "rand", "data")
# Each program rounds ROWS x 4 elements; a row is one Philox block.  The interpreter runs
# programs one after another, so there large blocks cost far less.
_ROWS = 4096 if INTERPRETED else 256
# compiled kernels call libdevice's conversions; the interpreter has none
_NATIVE_CONVERSIONS = tl.constexpr(not INTERPRETED)
# (rows, warps) of an SR-to-codes tile: the fastest shape of a sweep over tile shapes for
# fp8 codes, packed fp4 and fp16 values alike (benchmarks/RESULTS.md)
CODES_LAYOUT = (_ROWS, 4) if INTERPRETED else (1024, 4)
# the codes kernels' scratch words: the NaN flag, the length of the list of tiles left to
# the exact kernel, its programs' arrival count, then the list
LIST_START = tl.constexpr(3)


@functools.cache
def codes_supported(fmt: Format) -> bool:
    """Formats whose codes the kernels write: at most 8 bits, values normal in fp32."""
    return kernel_supports(fmt) and fmt.bits <= 8 and fmt.min_subnormal >= 2.0**-126


@functools.cache
def format_unsupported(fmt: Format, output: str) -> str | None:
    """Why the kernels cannot round to ``fmt`` for ``output`` (None if they can)."""
    if not kernel_supports(fmt):
        return f"format {fmt.name} is wider than the kernels' fp32 arithmetic"
    if output != "value" and not codes_supported(fmt):
        return f"the kernels write codes of formats of at most 8 bits, not {fmt.name}"
    return None


def rounding_refusal(x_dtype: torch.dtype, fmt: Format, output: str) -> str | None:
    """Why the kernels cannot round x of this dtype to ``fmt`` for ``output`` (None if they
    can); where they can run at all is `kernels.availability.kernels_refusal`'s call."""
    if x_dtype not in INPUT_DTYPES:
        return f"the kernels read fp32/bf16/fp16 inputs, not {x_dtype}"
    return format_unsupported(fmt, output)


@triton.jit
def _words(
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


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _round_kernel(
    x_ptr,
    out_ptr,
    flag_ptr,
    rand_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    CHECK_NAN: tl.constexpr,
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
    SOURCE: tl.constexpr,
    ALIGNED: tl.constexpr,
    OUTPUT: tl.constexpr,
    NAN16: tl.constexpr,
    EBITS: tl.constexpr,
    SIGNED: tl.constexpr,
    TWOS_COMPLEMENT: tl.constexpr,
    INFINITY_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    CODE_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    WIDE: tl.constexpr,
    CLAMP: tl.constexpr,
    CLAMP_LOW: tl.constexpr,
    CLAMP_HIGH: tl.constexpr,
    CLAMP_LOW_BITS: tl.constexpr,
    CLAMP_HIGH_BITS: tl.constexpr,
):
    program = tl.program_id(0)
    if WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    lane, position, mask, x, group = _tile(x_ptr, program, count, index_offset, ROWS)
    index = position + index_offset
    if MODE == "sr":
        seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
        word = _words(
            seed, offset, index, lane, group, rand_ptr, position, x, mask, SOURCE, ALIGNED
        )
        if SOURCE == "rand":
            r = word
        else:
            r = word >> (32 - NBITS)
    else:
        r = position.to(tl.int64) * 0
    result = rounded_fp32_bits(
        fp32_bits_of(x),
        r,
        MBITS,
        EMIN,
        BIAS,
        HAS_ZERO,
        HAS_NEGATIVE_ZERO,
        MAX_BITS,
        NEGATIVE_LIMIT_BITS,
        MIN_NORMAL_BITS,
        OVERFLOW_POSITIVE,
        OVERFLOW_NEGATIVE,
        INFINITY_POSITIVE,
        INFINITY_NEGATIVE,
        MODE,
        VARIANT,
        NBITS,
    )
    if OUTPUT == "value":
        if NAN16 == 0:
            tl.store(out_ptr + position, result.to(tl.float32, bitcast=True), mask=mask)
        else:
            narrow = narrow_to_16_bits(result, out_ptr.dtype.element_ty, NAN16)
            if CLAMP:
                narrow = _clamp_narrowed(result, narrow, CLAMP_LOW, CLAMP_HIGH, CLAMP_LOW_BITS,
                                         CLAMP_HIGH_BITS)  # fmt: skip
            tl.store(out_ptr + position, narrow, mask=mask)
    else:
        code = encode_bits(
            result,
            EBITS,
            MBITS,
            EMIN,
            BIAS,
            SIGNED,
            TWOS_COMPLEMENT,
            INFINITY_CODE,
            NAN_CODE,
            CODE_MASK,
        )
        _store_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)
        if CHECK_NAN:
            _flag_nan(flag_ptr, (result & 0x7FFFFFFF) > 0x7F800000, mask)


@triton.jit
def _clamp_narrowed(result, narrow, LOW, HIGH, LOW_BITS: tl.constexpr, HIGH_BITS: tl.constexpr):
    """16-bit values narrowed to nearest from finite fp32 results (``result``: their bits)
    clamped to [LOW, HIGH], the saturation bounds of a 16-bit dtype that cannot hold the
    format's range (`stochround.torch_path.saturation_bounds`); infinite and NaN results
    keep their narrowing.  Values inside the bounds keep their bits (the bounds' bits are
    selected, no value is converted back)."""
    dtype: tl.constexpr = narrow.dtype
    bits = narrow.to(tl.int16, bitcast=True)
    value = narrow.to(tl.float32)
    finite = (result & 0x7FFFFFFF) < 0x7F800000
    bits = tl.where(finite & (value > HIGH), HIGH_BITS, bits)
    bits = tl.where(finite & (value < LOW), LOW_BITS, bits)
    return bits.to(tl.int16).to(dtype, bitcast=True)


@triton.jit
def _store_codes(out_ptr, code, program, lane, count, OUTPUT: tl.constexpr, ROWS: tl.constexpr):
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
def _flag_nan(flag_ptr, is_nan, mask):
    """Raise the flag when a format without a NaN code would have to hold NaN: an atomic
    from each such element only (no block-wide reduction on the common path)."""
    tl.atomic_max(flag_ptr + is_nan.to(tl.int32) * 0, 1, mask=is_nan & mask, sem="relaxed")


@triton.jit
def _exact_codes(
    bits,
    word,
    flag_ptr,
    mask,
    NBITS: tl.constexpr,
    EXACT_C: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    HAS_NEGATIVE_ZERO: tl.constexpr,
    MAX_CODE: tl.constexpr,
    OVERFLOW_CODE: tl.constexpr,
    INFINITY_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    CHECK_NAN: tl.constexpr,
):
    """Codes of every input (`_sr_codes_kernel`): NaN and infinities, overflow, and values
    more than 32 bits below the ulp, where kept is 0 and away iff count + r >= 2**n, count
    the floor (a) or half-even (c) rounding of nu 2**n = m 2**(n - d) <= 2**24."""
    magnitude = bits & 0x7FFFFFFF
    exponent_field = magnitude >> 23
    # fp32 subnormals: no implicit bit, exponent field read as 1 (they can round up in
    # formats whose ulp lies within 32 bits of them: a large bias)
    m = ((magnitude & 0x7FFFFF) | tl.where(exponent_field > 0, 0x800000, 0)).to(tl.uint32)
    below_emin = tl.maximum(EMIN + 127 - tl.maximum(exponent_field, 1), 0)
    d = below_emin + (23 - MBITS)  # discarded bits
    short = tl.minimum(d, 31).to(tl.uint32)
    if NBITS == 32:  # the word's bits just below bit d
        noise = word >> (32 - short)
    else:
        r = word >> (32 - NBITS)
        noise = tl.where(
            short >= NBITS, r << (short - NBITS), r >> (NBITS - tl.minimum(short, NBITS))
        )
    total = ((m + noise) >> short).to(tl.int32)  # exact where d <= 31
    tail_shift = tl.minimum(tl.maximum(d - NBITS, 0), 31).to(tl.uint32)
    tail_count = m >> tail_shift
    if EXACT_C:
        below = m - (tail_count << tail_shift)
        half = (1 << tail_shift) >> 1
        up = (below > half) | ((below == half) & ((tail_count & 1) == 1) & (tail_shift > 0))
        tail_count = tail_count + up.to(tl.uint32)
    r_tail = word >> (32 - NBITS)
    total_tail = r_tail + tail_count  # < 2**33: the carry out of bit n (or the wrap) decides
    if NBITS == 32:
        tail = (total_tail < r_tail).to(tl.int32)
    else:
        tail = (total_tail >> NBITS).to(tl.int32)
    total = tl.where(d > 31, tail, total)
    code = ((tl.maximum(exponent_field, EMIN + 127) + (BIAS - 128)) << MBITS) + total
    code = tl.where(code > MAX_CODE, OVERFLOW_CODE, code)
    code = tl.where(magnitude == 0x7F800000, INFINITY_CODE, code)
    is_nan = magnitude > 0x7F800000
    if OVERFLOW_CODE < 0 or INFINITY_CODE < 0:
        is_nan = is_nan | (code < 0)
    if CHECK_NAN:
        _flag_nan(flag_ptr, is_nan, mask)
    return tl.where(is_nan, NAN_CODE, code | sign_bit(bits, code, SIGN_SHIFT, HAS_NEGATIVE_ZERO))


@triton.jit
def _tile(x_ptr, program, count, index_offset, ROWS: tl.constexpr):
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
def _stream_tile(
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
    """Program ``program``'s [ROWS, 4] tile (`_tile`) with the elements' words of the
    stream: lane, position, mask, x's fp32 bits (int32) and the random words (uint32)."""
    lane, position, mask, x, group = _tile(x_ptr, program, count, index_offset, ROWS)
    seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
    word = _words(
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
def _scaled_count(
    magnitude, clamped, SCALE_FIELD: tl.constexpr, SCALE_SPLIT: tl.constexpr, EXACT_C: tl.constexpr
):
    """|x| 2**(32 - q), q = max(e, emin) - mbits the ulp's exponent, as uint64 (``magnitude``:
    |x|'s fp32 bits; ``clamped``: the exponent field of 2**max(e, emin)): the integer m 2**(32
    - d) where d <= 32 bits are discarded (exact in fp32: a power-of-two scaling of x), else
    nu 2**32 < 2**23 rounded half to even (EXACT_C) or floored.  The scale is the fp32
    2**(SCALE_FIELD - clamped - 127), times 2**SCALE_SPLIT where it would exceed fp32's range."""
    scale = ((SCALE_FIELD - clamped) << 23).to(tl.float32, bitcast=True)
    if not _NATIVE_CONVERSIONS:  # NaN and infinities (tiles not stored) would make numpy warn
        magnitude = tl.minimum(magnitude, 0x7F7FFFFF)
    scaled = magnitude.to(tl.float32, bitcast=True) * scale
    if SCALE_SPLIT > 0:
        scaled = scaled * 2.0**SCALE_SPLIT
    if EXACT_C:
        if _NATIVE_CONVERSIONS:  # one conversion rounding to nearest even (cvt.rni.u64.f32)
            return libdevice.float2ull_rn(scaled).to(tl.uint64, bitcast=True)
        # the interpreter has no libdevice: every fp32 value from 2**23 up is an integer,
        # and below, adding 2**23 rounds to one half to even
        scaled = tl.where(scaled < 8388608.0, (scaled + 8388608.0) - 8388608.0, scaled)
    return scaled.to(tl.uint64)


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _sr_codes_kernel(
    x_ptr,
    out_ptr,
    flag_ptr,
    note_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    NBITS: tl.constexpr,
    EXACT_C: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    HAS_NEGATIVE_ZERO: tl.constexpr,
    MAX_BITS: tl.constexpr,
    CLAMP_BITS: tl.constexpr,
    SCALE_FIELD: tl.constexpr,
    SCALE_SPLIT: tl.constexpr,
    OUTPUT: tl.constexpr,
    ALIGNED: tl.constexpr,
    ROWS: tl.constexpr,
    WIDE: tl.constexpr,
):
    """SR straight to codes of a signed format of at most 8 bits (module docstring), with
    n random bits: variant a, or exact SR (EXACT_C: variant c with n = 32).

    kept + away = floor(m 2**-d + r 2**-n) with d <= 32 bits discarded, for either variant
    (nu 2**n is an integer or floored): the high word of the 64-bit sum m 2**(32 - d) +
    (r << (32 - n)).  With d > 32, kept is 0 and away iff count + r >= 2**n, count the floor
    (a) or half-even (c) rounding of nu 2**n: the same high word of count + (r << (32 - n)),
    count = nu 2**32 rounded (for a, floor of nu 2**32 then floor by n bits is floor of
    nu 2**n).  Both are one fp32 scaling of |x| by 2**(32 - q) converted to an integer
    (`_scaled_count`).  The code of 2**max(e, emin) is added to the high word.

    CLAMP_BITS (`_clamp_bits`): the largest |x| (fp32 bits) whose result the
    saturation makes the format's max whenever |x| exceeds it, MAX_BITS where none does.
    Such |x| are clamped to max first, which rounds to max exactly: above max, SR rounds
    down to max or up beyond it, where the saturation gives max.  A program whose values
    all lie within CLAMP_BITS (so no code overflows, and no value is NaN or an infinity
    kept as such) stores its codes; any other leaves its tile to `_exact_codes_kernel`,
    appending its number to the list at ``flag_ptr + LIST_START`` (length at ``flag_ptr +
    1``) and, unless ``note_ptr`` is None, setting the word at ``note_ptr`` to 1 (a host
    word: the checked call reads it without a copy).  A NaN result needs a listed tile (a
    NaN input, an infinity or an overflow), so the NaN check reads the list alone."""
    program = tl.program_id(0)
    if WIDE:
        program = program.to(tl.int64)
    lane, _, _, bits, word = _stream_tile(
        x_ptr,
        program,
        seed_ptr,
        offset_ptr,
        seed_value,
        offset_value,
        count,
        index_offset,
        FROM_TENSORS,
        ALIGNED,
        ROWS,
    )
    magnitude = bits & 0x7FFFFFFF
    # a value the saturation sends to max rounds as max itself: one minimum on the bits
    # keeps its tile on this path
    if CLAMP_BITS > MAX_BITS:
        rounded_magnitude = tl.minimum(magnitude, MAX_BITS)
    else:
        rounded_magnitude = magnitude
    clamped = tl.maximum(rounded_magnitude >> 23, EMIN + 127)
    scaled = _scaled_count(rounded_magnitude, clamped, SCALE_FIELD, SCALE_SPLIT, EXACT_C)
    noise = (word & (((1 << NBITS) - 1) << (32 - NBITS))).to(tl.uint64)  # r << (32 - n)
    base = (clamped + (BIAS - 128)) << MBITS  # code of 2**max(e, emin), less 2**mbits
    code = base + ((scaled + noise) >> 32).to(tl.int32)
    # rounded before the tile's check: inside its branch the compiler keeps more registers
    # live (128 against 100 on sm_90), fewer programs fit an SM, and the kernel is slower
    if tl.max(magnitude) <= CLAMP_BITS:
        code = code | sign_bit(bits, code, SIGN_SHIFT, HAS_NEGATIVE_ZERO)
        _store_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)
    else:
        slot = tl.atomic_add(flag_ptr + 1, 1, sem="relaxed")
        tl.store(flag_ptr + LIST_START + slot, program.to(tl.int32))
        if note_ptr is not None:
            tl.store(note_ptr, 1)


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _exact_codes_kernel(
    x_ptr,
    out_ptr,
    flag_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    NBITS: tl.constexpr,
    EXACT_C: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    HAS_NEGATIVE_ZERO: tl.constexpr,
    MAX_CODE: tl.constexpr,
    OVERFLOW_CODE: tl.constexpr,
    INFINITY_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    CHECK_NAN: tl.constexpr,
    OUTPUT: tl.constexpr,
    ALIGNED: tl.constexpr,
    ROWS: tl.constexpr,
    WIDE: tl.constexpr,
    ITERATIONS: tl.constexpr,
):
    """The tiles `_sr_codes_kernel` left, listed at ``flag_ptr + LIST_START``: ITERATIONS x
    the grid covers every tile; each program walks its slots of the list and rounds every
    element of a listed tile with `_exact_codes` (same stream, same tile).  (The trip count
    is a constexpr: Triton 3.6's interpreter cannot loop to a tensor bound under numpy >=
    2.4, triton-lang/triton#9171.)

    The list's length is cleared for the stream's next call: each program, once it has
    read it, counts itself in at ``flag_ptr + 2``, and the last to arrive zeroes both
    words (the atomic orders every program's read before the last one's stores)."""
    listed = tl.load(flag_ptr + 1)
    if listed > 0:  # most calls list no tile: the grid then exits at once
        arrived = tl.atomic_add(flag_ptr + 2, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            tl.store(flag_ptr + 1, 0)
            tl.store(flag_ptr + 2, 0)
        for step in range(ITERATIONS):
            slot = tl.program_id(0) + step * tl.num_programs(0)
            if slot < listed:
                program = tl.load(flag_ptr + LIST_START + slot)
                if WIDE:
                    program = program.to(tl.int64)
                lane, _, mask, bits, word = _stream_tile(
                    x_ptr,
                    program,
                    seed_ptr,
                    offset_ptr,
                    seed_value,
                    offset_value,
                    count,
                    index_offset,
                    FROM_TENSORS,
                    ALIGNED,
                    ROWS,
                )
                code = _exact_codes(
                    bits,
                    word,
                    flag_ptr,
                    mask,
                    NBITS,
                    EXACT_C,
                    MBITS,
                    EMIN,
                    BIAS,
                    SIGN_SHIFT,
                    HAS_NEGATIVE_ZERO,
                    MAX_CODE,
                    OVERFLOW_CODE,
                    INFINITY_CODE,
                    NAN_CODE,
                    CHECK_NAN,
                )
                _store_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _bf16_sr_kernel(
    x_ptr,
    out_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    SATURATION: tl.constexpr,
    NBITS: tl.constexpr,
    ALIGNED: tl.constexpr,
    ROWS: tl.constexpr,
    WIDE: tl.constexpr,
):
    """fp32 -> bf16 SR: add the random bits just below bit 16, truncate (module docstring).
    SATURATION: "none", "propagate" (finite overflow to +-max) or "finite" (infinities too)."""
    program = tl.program_id(0)
    if WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    _, position, mask, bits, word = _stream_tile(
        x_ptr,
        program,
        seed_ptr,
        offset_ptr,
        seed_value,
        offset_value,
        count,
        index_offset,
        FROM_TENSORS,
        ALIGNED,
        ROWS,
    )
    rounded = bf16_sr(bits.to(tl.uint32, bitcast=True), word, NBITS, SATURATION)
    tl.store(out_ptr + position, rounded, mask=mask)


# bytes of a row of four codes (the kernels store a row as one word, fp6 as three bytes)
ROW_BYTES = {"codes": 4, "fp4x2": 2, "fp6x4": 3}


def _empty(x: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An uninitialized tensor on x's device.  Sizes go as separate ints, which PyTorch
    parses faster than a shape tuple or a `torch.Size`, and `new_empty` takes x's device
    without building a `torch.device`: this runs on every call's host path."""
    return x.new_empty(*shape, dtype=dtype) if shape else x.new_empty((), dtype=dtype)


def _output_tensor(x: Tensor, output: str, out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(the result, the buffer the kernel writes): code outputs are written a row of four
    codes at a time, into a buffer padded to whole rows (the result itself when x holds
    whole rows)."""
    if output == "value":
        out = _empty(x, x.shape, out_dtype)
        return out, out
    count = x.numel()
    shape = output_shape(x.shape, output)
    if count % 4 == 0:
        out = _empty(x, shape, torch.uint8)
        return out, out
    row_bytes = ROW_BYTES[output]
    buffer = _empty(x, ((count + 3) // 4 * row_bytes,), torch.uint8)
    # the packings' last dimensions hold whole bytes: 8 bits a code, two, or four per three
    return buffer[: count * row_bytes // 4].view(shape), buffer


class KernelPlan:
    """How the Triton kernels round one set of request choices (`round`): the kernel path
    ("bf16", "codes" or "round", the general kernel), whether the call checks for NaN
    results, the rows of a tile, and the path's kernels bound to the choices (`Launch`es,
    made once per combination of the per-call constexprs FROM_TENSORS, ALIGNED and WIDE)."""

    def __init__(
        self,
        output: str,
        out_dtype: torch.dtype,
        nan: str,
        fmt: Format,
        mode: str,
        sat: str,
        n: int,
        variant: str,
        source: str,
    ) -> None:
        self.fmt, self.output, self.out_dtype, self.nan = fmt, output, out_dtype, nan
        self.mode, self.sat, self.n, self.variant, self.source = mode, sat, n, variant, source
        self.check_nan = checks_nan(fmt, nan, output)
        self.path = self._choose_path()
        self.rows = CODES_LAYOUT[0] if self.path == "codes" else _ROWS
        # the kernels write codes as bytes; `cast` views them as its dtype
        self.view_dtype = None if output == "value" or out_dtype == torch.uint8 else out_dtype
        self.launches: dict[tuple, Launch] = {}

    def round(
        self,
        x: Tensor,
        seed: int | Tensor,
        offset: int | Tensor,
        index_offset: int,
        rand: Tensor | None,
    ) -> Tensor:
        """Round x with these choices and a call's checked values (as `stochround.rounding`
        checks them): seed and offset of the stream, int or one-element int64 tensor; the
        flat position of x's first element; explicit integers for source "rand".

        The result: values in ``out_dtype`` (fp32, bf16 or fp16), or bytes viewed as it:
        "codes" (one a byte), "fp4x2" (two 4-bit codes per byte) or "fp6x4" (four 6-bit
        codes per three bytes), packing along the last dimension.  Work that needs no
        result of the launch (the view) is done while the kernel runs: a checked call's
        device idles through the host time before the launch and after the wait.  The
        kernels run on x's device (made current for the call where it is not) in that
        device's current stream.
        """
        device = x.get_device()  # -1 on the CPU (the interpreter)
        if device >= 0 and device != current_device():
            # Triton launches on the current device's current stream, PyTorch's ops on
            # their tensors' device: round x where it lies, in its device's stream order
            # (checked first, not a `torch.cuda.device` block around every call: x's
            # device is almost always current, and the block would cost host time)
            with torch.cuda.device(device):
                return self.round(x, seed, offset, index_offset, rand)
        check_nan = self.check_nan
        refuse_capture(check_nan, x, self.fmt)
        x = x.contiguous()
        out, buffer = _output_tensor(x, self.output, self.out_dtype)
        count = x.numel()
        if count == 0:
            return self._viewed(out)
        seed_pointer: Tensor | None
        offset_pointer: Tensor | None
        if isinstance(seed, Tensor) or isinstance(offset, Tensor):
            from_tensors = True
            seed_pointer = seed_tensor(seed, "seed", x.device)
            offset_pointer = seed_tensor(offset, "offset", x.device)
            seed_value = offset_value = 0
        else:  # two's complement above 2**63: the kernels read seeds as unsigned 64-bit
            from_tensors = False
            seed_value, offset_value = as_int64(seed), as_int64(offset)
            seed_pointer = offset_pointer = None  # no pointers: the kernels read the values
        stream = (seed_pointer, offset_pointer, seed_value, offset_value, count, index_offset)
        programs = cdiv(count, self.rows * 4)
        common = (from_tensors, index_offset % 4 == 0, _wide(count, index_offset, self.rows))
        if self.path == "bf16":
            self.launch(common)(device, programs, x, out, *stream)
            return out
        # in plain ints: arithmetic on a constexpr object goes through Triton's wrappers
        size = LIST_START.value + programs if self.path == "codes" else 1
        flag, note, note_view, key = SCRATCH.take(size, device, capturable=not check_nan)
        if self.path == "codes":
            self.launch(common)(
                device, programs, x, buffer, flag, note if check_nan else None, *stream
            )
            result = self._viewed(out)
            # the NaN check synchronizes anyway: it reads whether any tile was listed first,
            # and only listed tiles can hold NaN (no tile: no exact kernel, no flag read)
            if check_nan:
                # a checked call is never captured (`take` gave it a note)
                assert note_view is not None
                if device >= 0:
                    current_stream(key).synchronize()
                if note_view[0] == 0:
                    SCRATCH.give_back(flag, note, note_view, key)
                    return result
            iterations = next_power_of_2(cdiv(programs, persistent_programs(x.device)))
            self.launch(common, iterations)(
                device, cdiv(programs, iterations), x, buffer, flag, *stream
            )
        else:
            if rand is not None:
                rand = rand.to(device=x.device, dtype=torch.int64).expand(x.shape).contiguous()
            self.launch(common)(device, programs, x, buffer, flag, rand, *stream)
            result = self._viewed(out)
        if check_nan:
            if bool(flag[0].item()):  # waits for the kernels
                raise nan_without_code(self.fmt)
            if self.path == "codes":  # a tile was listed, and the note says so
                assert note_view is not None  # checked: never captured, so it has a note
                note_view[0] = 0
        # unchecked, the kernels clear what they wrote before the stream's next call
        SCRATCH.give_back(flag, note, note_view, key)
        return result

    def _viewed(self, out: Tensor) -> Tensor:
        """The kernels' output as the result's dtype."""
        return out if self.view_dtype is None else out.view(self.view_dtype)

    def _choose_path(self) -> str:
        """ "bf16": fp32/fp16/bf16 -> bf16 SR (bf16 output) from the stream with n >= 16 bits
        (any variant) or variant a: from the fp32 bits exactly 16 bits are discarded, so
        adding and truncating is the contract.  "codes": SR from the stream to codes of a
        signed sign-magnitude format with zero (fp8, fp4, or binary16 for an fp16 result),
        variant a with any n or exact SR (variant c, n = 32).  "round": anything else."""
        fmt, output = self.fmt, self.output
        stream_sr = self.mode == "sr" and self.source == "stream"
        if (
            stream_sr
            and output == "value"
            and self.out_dtype == torch.bfloat16
            and fmt.name == "bfloat16"
            and (self.n >= 16 or self.variant == "a")
        ):
            return "bf16"
        fp16 = output == "value" and self.out_dtype == torch.float16 and fmt.name == "binary16"
        if (
            stream_sr
            and (output in ("codes", "fp4x2") or fp16)
            and (self.variant == "a" or (self.variant == "c" and self.n == 32))
            and fmt.signed
            and not fmt.twos_complement
            and fmt.has_zero
        ):
            return "codes"
        return "round"

    def launch(self, common: tuple[bool, bool, bool], iterations: int | None = None) -> Launch:
        """The path's kernel for the per-call constexprs (FROM_TENSORS, ALIGNED, WIDE); with
        ``iterations``, the codes path's `_exact_codes_kernel`, its grid walking the list of
        tiles that many times."""
        key = common if iterations is None else (*common, iterations)
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = self._bind(common, iterations)
        return launch

    def _bind(self, common: tuple[bool, bool, bool], iterations: int | None) -> Launch:
        stream = _stream_constants(common)
        if self.path == "bf16":
            constants = {"SATURATION": self.sat, "NBITS": self.n, "ROWS": _ROWS, **stream}
            return Launch(_bf16_sr_kernel, constants)
        if self.path == "codes":
            fast, exact = _codes_constants(self.fmt, self.output, self.n, self.variant, self.sat)
            if iterations is None:
                return Launch(_sr_codes_kernel, {**fast, **stream})
            constants = {
                **exact,
                **stream,
                "CHECK_NAN": self.check_nan,
                "ITERATIONS": iterations,
            }
            return Launch(_exact_codes_kernel, constants)
        constants = {
            "CHECK_NAN": self.check_nan,
            **format_constants(self.fmt),
            **overflow_bits(self.fmt, self.mode, self.sat),
            "MODE": self.mode,
            "VARIANT": self.variant,
            "NBITS": self.n,
            "SOURCE": self.source,
            "OUTPUT": self.output,
            "NAN16": NAN16_BITS.get(self.out_dtype, 0),
            "ROWS": _ROWS,
            **_clamp_constants(self.fmt, self.output, self.out_dtype, self.sat),
            **stream,
        }
        return Launch(_round_kernel, constants)


# one plan per choices (`KernelPlan`'s arguments): a call looks its plan up once
kernel_plan = functools.cache(KernelPlan)


def _stream_constants(common: tuple[bool, bool, bool]) -> dict[str, bool]:
    """The per-call constexprs of every rounding kernel: (FROM_TENSORS, ALIGNED, WIDE)."""
    from_tensors, aligned, wide = common
    return {"FROM_TENSORS": from_tensors, "ALIGNED": aligned, "WIDE": wide}


def _clamp_constants(
    fmt: Format, output: str, out_dtype: torch.dtype, sat: str
) -> dict[str, object]:
    """`_round_kernel`'s clamp of 16-bit values: a 16-bit result dtype that cannot hold the
    format's range clamps the finite results to `saturation_bounds` (the PyTorch path's
    rule: narrowing to nearest would step beyond the format's max, bf16 rounding fp16's
    65504 to 65536)."""
    bounds = None
    if output == "value" and out_dtype in NAN16_BITS:
        bounds = saturation_bounds(fmt, out_dtype, sat)
    if bounds is None:
        return {"CLAMP": False, "CLAMP_LOW": 0.0, "CLAMP_HIGH": 0.0, "CLAMP_LOW_BITS": 0,
                "CLAMP_HIGH_BITS": 0}  # fmt: skip
    low, high = bounds
    low_bits, high_bits = torch.tensor([low, high], dtype=out_dtype).view(torch.int16).tolist()
    # An infinite bound (none on that side) is passed as fp32's largest value, which only
    # an infinity exceeds: it is selected as itself, by its bits.
    largest = torch.finfo(torch.float32).max
    return {
        "CLAMP": True,
        "CLAMP_LOW": max(low, -largest),
        "CLAMP_HIGH": min(high, largest),
        "CLAMP_LOW_BITS": low_bits,
        "CLAMP_HIGH_BITS": high_bits,
    }


@functools.cache
def _codes_constants(
    fmt: Format, output: str, n: int, variant: str, sat: str
) -> tuple[Mapping[str, object], Mapping[str, object]]:
    """Launch constants (and warps) of `_sr_codes_kernel` and `_exact_codes_kernel` for a
    request's choices; the per-call ones (FROM_TENSORS, ALIGNED, WIDE, CHECK_NAN,
    ITERATIONS) are added at the launch.

    The fast kernel scales |x| by 2**(32 - q) = 2**(32 + mbits - max(e, emin)), an fp32
    power of two of exponent field 286 + mbits - (max(e, emin) + 127) for finite x; where
    that exceeds 254 (at e <= emin, for mbits - emin > 95: formats with a large bias) the
    scale is split, SCALE_SPLIT bits of it a constant factor.  The exact kernel's magnitude
    codes for overflow and infinite inputs are -1 where the result is NaN.

    CLAMP_BITS: `_clamp_bits`."""
    rows, warps = CODES_LAYOUT
    split = max(fmt.mbits - fmt.emin - 95, 0)
    both = {
        **layout_constants(fmt),
        "SIGN_SHIFT": fmt.ebits + fmt.mbits,
        "NBITS": n,
        "EXACT_C": variant == "c",
        "OUTPUT": output,
        "ROWS": rows,
        "num_warps": warps,
    }
    infinity = fmt.max_magnitude_code + 1 if fmt.inf else -1
    fast = {
        **both,
        "MAX_BITS": fp32_bits(fmt.max),
        "CLAMP_BITS": _clamp_bits(fmt, sat),
        "SCALE_FIELD": 286 + fmt.mbits - split,
        "SCALE_SPLIT": split,
    }
    exact = {
        **both,
        "MAX_CODE": fmt.max_magnitude_code,
        "OVERFLOW_CODE": fmt.max_magnitude_code if sat != "none" else infinity,
        "INFINITY_CODE": fmt.max_magnitude_code if sat == "finite" else infinity,
        "NAN_CODE": nan_code(fmt),
    }
    return MappingProxyType(fast), MappingProxyType(exact)


def _clamp_bits(fmt: Format, sat: str) -> int:
    """The largest |x| (fp32 bits, as `fp32_bits` gives them) that `_sr_codes_kernel` clamps
    to ``fmt``'s max under saturation ``sat``: every |x| above max whose result ``sat``
    makes max.  "propagate" saturates finite overflow (fp32's largest finite value),
    "finite" infinities too (fp32's infinity); "none" saturates nothing (max itself:
    overflow stays the exact kernel's)."""
    if sat == "finite":
        return 0x7F800000
    if sat == "propagate":
        return 0x7F7FFFFF
    return fp32_bits(fmt.max)


def _wide(count: int, index_offset: int, rows: int) -> bool:
    """Whether a grid of ``rows x 4`` tiles over ``count`` values from ``index_offset``
    reaches positions beyond int32 (the last tile's masked lanes included)."""
    return count + index_offset + rows * 4 >= 2**31
