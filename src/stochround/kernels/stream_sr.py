"""SR from the stream in one pass (`@triton.jit`): to fp8/fp6/fp4 codes (a fast kernel that
leaves tiles holding special values to an exact one) and fp32 -> bf16, with the launches
they are bound to."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from ..formats import Format
from ..torch_path import nan_code
from .availability import INTERPRETED
from .common import bf16_sr, fp32_bits, layout_constants, sign_bit
from .row_tiles import TILE_ROWS, flag_nan, store_row_codes, stream_row_tile
from .runtime import Launch

# compiled kernels call libdevice's conversions; the interpreter has none
_NATIVE_CONVERSIONS = tl.constexpr(not INTERPRETED)


# (rows, warps) of an SR-to-codes tile: the fastest shape of a sweep over tile shapes for
# fp8 codes, packed fp4 and fp16 values alike (benchmarks/RESULTS.md)
CODES_LAYOUT = (TILE_ROWS, 4) if INTERPRETED else (1024, 4)


# the codes kernels' scratch words: the NaN flag, the length of the list of tiles left to
# the exact kernel, its programs' arrival count, then the list
LIST_START = tl.constexpr(3)


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
        flag_nan(flag_ptr, is_nan, mask)
    return tl.where(is_nan, NAN_CODE, code | sign_bit(bits, code, SIGN_SHIFT, HAS_NEGATIVE_ZERO))


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
    lane, _, _, bits, word = stream_row_tile(
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
        store_row_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)
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
                lane, _, mask, bits, word = stream_row_tile(
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
                store_row_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)


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
    _, position, mask, bits, word = stream_row_tile(
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


def codes_launch(
    *,
    fmt: Format,
    output: str,
    n: int,
    variant: str,
    sat: str,
    check_nan: bool,
    stream: dict[str, bool],
    iterations: int | None,
) -> Launch:
    """`_sr_codes_kernel` bound to a request's choices and the per-call ``stream``
    constexprs (FROM_TENSORS, ALIGNED, WIDE); with ``iterations``, `_exact_codes_kernel`,
    its grid walking the list of tiles that many times."""
    fast, exact = _codes_constants(fmt, output, n, variant, sat)
    if iterations is None:
        return Launch(_sr_codes_kernel, {**fast, **stream})
    constants = {**exact, **stream, "CHECK_NAN": check_nan, "ITERATIONS": iterations}
    return Launch(_exact_codes_kernel, constants)


def bf16_sr_launch(*, sat: str, n: int, stream: dict[str, bool]) -> Launch:
    """`_bf16_sr_kernel` bound to a request's saturation and bits and the per-call
    ``stream`` constexprs."""
    constants = {"SATURATION": sat, "NBITS": n, "ROWS": TILE_ROWS, **stream}
    return Launch(_bf16_sr_kernel, constants)


__all__ = ["CODES_LAYOUT", "LIST_START", "bf16_sr_launch", "codes_launch"]
