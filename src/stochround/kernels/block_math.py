"""The block kernels' element and scale arithmetic (`@triton.jit`), operation for operation as
`stochround.blocks.scales` and the core's rounding compute it, with the typed constexpr records
(`ElementFormat`, `ElementRounding`, `BlockScale`) the kernels read their choices from."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from ..block_constants import E4M3_EPS, FLT_MAX, ONE_SIXTH
from ..formats import Format
from ..formats import format as find_format
from .availability import INTERPRETED
from .common import (
    encode_bits,
    format_constants,
    fp32_bits_of,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    sign_bit,
)

# compiled kernels call libdevice's conversions; the interpreter has none
_NATIVE_CONVERSIONS = tl.constexpr(not INTERPRETED)
# the fp32 constants of `stochround.block_constants` as the kernels read them (constexpr)
_FLT_MAX = tl.constexpr(FLT_MAX)
_ONE_SIXTH = tl.constexpr(ONE_SIXTH)
_E4M3_EPS = tl.constexpr(E4M3_EPS)


class ElementFormat(NamedTuple):
    """An element format as the block kernel rounds to it, saturating to its finite range:
    `common.format_constants`' layout and codes, the overflow results of
    `common.overflow_bits`, EMAX and MAX (its largest exponent and value), SIGN_SHIFT (the
    sign bit of a sign-magnitude code) and SYMMETRIC (the most negative code never
    stored: MXINT8)."""

    MBITS: int
    EMIN: int
    BIAS: int
    HAS_NEGATIVE_ZERO: bool
    HAS_ZERO: bool
    MAX_BITS: int
    NEGATIVE_LIMIT_BITS: int
    MIN_NORMAL_BITS: int
    EBITS: int
    SIGNED: bool
    TWOS_COMPLEMENT: bool
    INFINITY_CODE: int
    NAN_CODE: int
    CODE_MASK: int
    OVERFLOW_POSITIVE: int
    OVERFLOW_NEGATIVE: int
    INFINITY_POSITIVE: int
    INFINITY_NEGATIVE: int
    EMAX: int
    MAX: float
    SIGN_SHIFT: int
    SYMMETRIC: bool


class ElementRounding(NamedTuple):
    """How the elements round: MODE in `stochround.reference.MODES`, VARIANT in
    `stochround.reference.VARIANTS`, NBITS random bits, and FAST_BITS the B of
    `fast_round` where it rounds these choices (`fast_bits`), -1 for the core's
    `rounded_fp32_bits`."""

    MODE: str
    VARIANT: str
    NBITS: int
    FAST_BITS: int


class BlockScale(NamedTuple):
    """How a block's scale is made: RULE in `block_constants.SCALE_RULES`, FLAVOUR in
    `block_constants.NVFP4_FLAVOURS`, TENSOR_SCALE the fp32 tensor scales the kernel reads
    (0, 1: S_dec, 2: S_dec and S_enc), AMAX_GIVEN whether each block's amax is read
    instead of taken from its elements."""

    RULE: str
    FLAVOUR: str
    TENSOR_SCALE: int
    AMAX_GIVEN: bool


# element formats whose most negative code quantization never stores: MXINT8's grid
# (`stochround.blocks.formats.OCP_INT8`), clamped to the symmetric [-max, max]
_SYMMETRIC_ELEMENTS = ("ocp_int8",)


@functools.cache
def element_format(fmt: Format, mode: str) -> ElementFormat:
    """``fmt``'s record, saturating to its finite range under ``mode`` (made once per
    choice: a launch on the hot path reads it)."""
    # the shared constants typed loosely (their flags are ints): the record types them
    shared: dict[str, Any] = {**format_constants(fmt), **overflow_bits(fmt, mode, "finite")}
    return ElementFormat(
        **shared,
        EMAX=fmt.emax,
        MAX=fmt.max,
        SIGN_SHIFT=fmt.ebits + fmt.mbits,
        SYMMETRIC=fmt.twos_complement and fmt.name in _SYMMETRIC_ELEMENTS,
    )


def fast_bits(fmt: Format, mode: str, n: int, variant: str) -> int:
    """The B of `fast_round` where it rounds these choices exactly, else -1 (the core's
    general `rounded_fp32_bits`): sign-magnitude formats with zero and mbits >= 1 (fp8,
    fp6, fp4), the modes rne, rna, rz, ru, rd, and SR variants a (B = 32) and c (B = n)."""
    if not (fmt.signed and not fmt.twos_complement and fmt.has_zero and fmt.mbits >= 1):
        return -1
    if mode in ("rne", "rna", "rz", "ru", "rd"):
        return 0
    if mode == "sr" and variant in ("a", "c"):
        return 32 if variant == "a" else n
    return -1


@functools.cache
def element_rounding(fmt: Format, mode: str, n: int, variant: str) -> ElementRounding:
    """The elements' rounding choices for ``fmt``, with `fast_bits`'s B."""
    return ElementRounding(mode, variant, n, fast_bits(fmt, mode, n, variant))


# NVFP4's block scales: E4M3FN, rounded to nearest even (no random bits)
_E4M3FN = tl.constexpr(element_format(find_format("e4m3fn"), "rne"))
_NEAREST_EVEN = tl.constexpr(ElementRounding(MODE="rne", VARIANT="c", NBITS=32, FAST_BITS=0))


@triton.jit
def nan_where(condition, value):
    """fp32 ``value`` with NaN where ``condition`` holds (selected by its bits: a NaN
    constant cannot be a shared constexpr, as NaN equals nothing)."""
    bits = tl.where(condition, 0x7FC00000, value.to(tl.int32, bitcast=True))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fp32_power_of_two(exponent):
    """fp32 2**exponent for integer exponents in [-149, 127], built from its bits (2**-127
    .. 2**-149 are subnormal)."""
    normal = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    subnormal = (1 << tl.maximum(exponent + 149, 0)).to(tl.float32, bitcast=True)
    return tl.where(exponent >= -126, normal, subnormal)


@triton.jit
def e8m0_exponent(amax, SCALE: tl.constexpr, ELEMENT: tl.constexpr):
    """The exponent e in [-127, 127] of each block's E8M0 scale 2**e from its amax (fp32),
    as `stochround.blocks.scales.power_of_two_exponent` computes it: with q = amax (rceil:
    the fp32 quotient amax / max) and E = floor(log2 q), exactly for subnormal q too,
    "floor" E - emax; "ceil" E + [q no power of two] - emax; "rceil" E + [q no power of
    two]; "even" E + [q's significand rounds up to 2 at mbits fraction bits, ties away]
    - emax; "floor-3/4" as floor.  Zero and non-finite q give -127."""
    if SCALE.RULE == "rceil":
        q = tl.math.div_rn(amax, ELEMENT.MAX)
    else:
        q = amax
    bits = q.to(tl.int32, bitcast=True)
    regular = (bits > 0) & (bits < 0x7F800000)
    subnormal = (bits >> 23) == 0
    # a subnormal q times 2**64 is normal and exact: its fraction bits are frexp's
    normalized = tl.where(subnormal, q * 18446744073709551616.0, q).to(tl.int32, bitcast=True)
    exponent = (normalized >> 23) - 127 - tl.where(subnormal, 64, 0)
    fraction = normalized & 0x7FFFFF
    if SCALE.RULE == "ceil" or SCALE.RULE == "rceil":
        exponent = exponent + (fraction != 0).to(tl.int32)
    elif SCALE.RULE == "even":
        exponent = exponent + (fraction >= (1 << 23) - (1 << (22 - ELEMENT.MBITS))).to(tl.int32)
    else:
        tl.static_assert(
            SCALE.RULE == "floor" or SCALE.RULE == "floor-3/4", "SCALE.RULE must be an E8M0 rule"
        )
    if SCALE.RULE != "rceil":
        exponent = exponent - ELEMENT.EMAX
    exponent = tl.where(regular, exponent, -127)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def nearest_integer(v):
    """Nonnegative fp32 values rounded to the nearest integer, ties to even, as uint64."""
    if _NATIVE_CONVERSIONS:  # one conversion (cvt.rni.u64.f32)
        return libdevice.float2ull_rn(v).to(tl.uint64, bitcast=True)
    # the interpreter has no libdevice: every fp32 value from 2**23 up is an integer, and
    # below, adding 2**23 rounds to one, half to even
    return tl.where(v < 8388608.0, (v + 8388608.0) - 8388608.0, v).to(tl.uint64)


@triton.jit
def magnitude_steps_up(kept, fraction, negative, ROUNDING: tl.constexpr):
    """Whether round-to-nearest or a directed rounding (ROUNDING.MODE: rne, rna, rz, ru,
    rd) takes a magnitude of integer part ``kept`` and fraction ``fraction`` (in [0, 1)) up
    to ``kept + 1``; ``negative``: the value's sign."""
    if ROUNDING.MODE == "rne":
        away = (fraction > 0.5) | ((fraction == 0.5) & ((kept & 1) == 1))
    elif ROUNDING.MODE == "rna":
        away = fraction >= 0.5
    elif ROUNDING.MODE == "rz":
        away = fraction < 0.0
    elif ROUNDING.MODE == "ru":
        away = (fraction > 0.0) & ~negative
    else:
        tl.static_assert(ROUNDING.MODE == "rd", "magnitude_steps_up takes rne, rna, rz, ru or rd")
        away = (fraction > 0.0) & negative
    return away


@triton.jit
def fast_round(bits, r, ROUNDING: tl.constexpr, ELEMENT: tl.constexpr):
    """Codes (int32) and values (fp32) of fp32 values (``bits``: int32) rounded to a
    sign-magnitude format with zero and mbits >= 1, saturating to its finite range, in
    one fp32 scaling (the rounding kernels' `_sr_codes_kernel` method, for every mode):

    |x| is clamped to max first (max is on the grid, so every mode rounds the clamped
    value to max, as the saturation does); with q = max(e, emin) - mbits the ulp's
    exponent, v = |x| 2**(B - q) is exact in fp32 (a power-of-two scaling) and the code is
    code(2**max(e, emin)) - 2**mbits + kept + away.  The deterministic modes take B = 0:
    kept = floor(v), and the fraction v - kept (exact) decides away.  SR with n random
    bits r: variant a takes B = 32, kept + away = floor((floor(v) + r 2**(32 - n)) / 2**32)
    (floor(nu 2**32) floored by 32 - n bits is floor(nu 2**n)); variant c takes B = n,
    kept + away = floor((rne(v) + r) / 2**n) (kept 2**n is an integer, so rounding v rounds
    nu 2**n, half to even); both in one 64-bit conversion, addition and shift (fewer
    instructions and registers than the same in 32-bit integers, which the RHT's tile,
    live in registers, pays for: benchmarks/kernel_resources.py).  Round-to-nearest-even
    takes no scaling: |x| + 2**(q + 23) in fp32 is |x| rounded to a multiple of 2**q, half
    to even, plus 2**(q + 23), and kept + away is its bits less those of 2**(q + 23).  The
    value (kept + away) 2**q is the fp32 of 2**(q + 23)'s bits plus kept + away, less
    2**(q + 23) (exact: no int-to-float conversion); in SR, total converted to fp32 times
    2**q (exact).  NaN gives NAN_CODE and NaN.  B: ROUNDING.FAST_BITS."""
    B: tl.constexpr = ROUNDING.FAST_BITS
    MBITS: tl.constexpr = ELEMENT.MBITS
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    clamped_magnitude = tl.minimum(magnitude, ELEMENT.MAX_BITS)
    field = tl.maximum(clamped_magnitude >> 23, ELEMENT.EMIN + 127)
    # C = 2**(q + 23), whose binade's ulp is 2**q: C + t 2**q (t < 2**23) has C's bits
    # plus t, so a multiple t of 2**q goes to fp32 by an integer addition and one exact
    # subtraction (no int-to-float conversion, a slow instruction on a GPU)
    magic_bits = (field + (23 - MBITS)) << 23
    magic = magic_bits.to(tl.float32, bitcast=True)
    if ROUNDING.MODE == "rne":
        # |x| + C: the fp32 addition rounds |x| to a multiple of 2**q, to nearest even (C
        # is an even multiple), and the multiple is its bits above C's: no scaling, no
        # float-to-int conversion
        rounded = clamped_magnitude.to(tl.float32, bitcast=True) + magic
        total = rounded.to(tl.int32, bitcast=True) - magic_bits
    elif ROUNDING.MODE == "sr":
        # 2**(B - q) = 2**(B + mbits + 127 - field), an fp32 normal power of two
        scale = ((254 + B + MBITS - field) << 23).to(tl.float32, bitcast=True)
        v = clamped_magnitude.to(tl.float32, bitcast=True) * scale
        if ROUNDING.VARIANT == "a":
            count = v.to(tl.uint64)
            noise = r.to(tl.uint64) << (32 - ROUNDING.NBITS)
        else:
            tl.static_assert(ROUNDING.VARIANT == "c", "the fast path rounds SR variants a and c")
            count = nearest_integer(v)
            noise = r.to(tl.uint64)
        total = ((count + noise) >> B).to(tl.int32)
    else:
        scale = ((254 + B + MBITS - field) << 23).to(tl.float32, bitcast=True)
        v = clamped_magnitude.to(tl.float32, bitcast=True) * scale
        kept = v.to(tl.int32)
        away = magnitude_steps_up(kept, v - kept.to(tl.float32), bits < 0, ROUNDING)
        total = kept + away.to(tl.int32)
    code = ((field + (ELEMENT.BIAS - 128)) << MBITS) + total
    code = code | sign_bit(bits, code, ELEMENT.SIGN_SHIFT, ELEMENT.HAS_NEGATIVE_ZERO)
    if ROUNDING.MODE == "sr":
        # the value total 2**q: a small integer times a normal power of two, exactly (C's
        # bits plus total less C compiles to more instructions in the SR kernels)
        value = total.to(tl.float32) * ((field - MBITS) << 23).to(tl.float32, bitcast=True)
    else:  # C + total 2**q (C's bits plus total), less C, exactly
        value = (magic_bits + total).to(tl.float32, bitcast=True) - magic
    # x's sign as a bit (a float negation is 0 - v in Triton, which loses -0)
    value = (value.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)
    if not ELEMENT.HAS_NEGATIVE_ZERO:
        value = tl.where(total != 0, value, 0.0)
    return tl.where(is_nan, ELEMENT.NAN_CODE, code), nan_where(is_nan, value)


@triton.jit
def general_round(bits, r, ROUNDING: tl.constexpr, ELEMENT: tl.constexpr):
    """Codes (int32) and values (fp32) of fp32 values (``bits``: int32) rounded by the
    core's `rounded_fp32_bits` (any format the kernels take, any mode and variant) and
    encoded by `encode_bits`, saturating to the format's finite range."""
    # the choices bound as constexprs: the helpers take them one by one
    MODE: tl.constexpr = ROUNDING.MODE
    VARIANT: tl.constexpr = ROUNDING.VARIANT
    result = rounded_fp32_bits(
        bits,
        r,
        MBITS=ELEMENT.MBITS,
        EMIN=ELEMENT.EMIN,
        BIAS=ELEMENT.BIAS,
        HAS_ZERO=ELEMENT.HAS_ZERO,
        HAS_NEGATIVE_ZERO=ELEMENT.HAS_NEGATIVE_ZERO,
        MAX_BITS=ELEMENT.MAX_BITS,
        NEGATIVE_LIMIT_BITS=ELEMENT.NEGATIVE_LIMIT_BITS,
        MIN_NORMAL_BITS=ELEMENT.MIN_NORMAL_BITS,
        OVERFLOW_POSITIVE=ELEMENT.OVERFLOW_POSITIVE,
        OVERFLOW_NEGATIVE=ELEMENT.OVERFLOW_NEGATIVE,
        INFINITY_POSITIVE=ELEMENT.INFINITY_POSITIVE,
        INFINITY_NEGATIVE=ELEMENT.INFINITY_NEGATIVE,
        MODE=MODE,
        VARIANT=VARIANT,
        NBITS=ROUNDING.NBITS,
    )
    code = encode_bits(
        result,
        EBITS=ELEMENT.EBITS,
        MBITS=ELEMENT.MBITS,
        EMIN=ELEMENT.EMIN,
        BIAS=ELEMENT.BIAS,
        SIGNED=ELEMENT.SIGNED,
        TWOS_COMPLEMENT=ELEMENT.TWOS_COMPLEMENT,
        INFINITY_CODE=ELEMENT.INFINITY_CODE,
        NAN_CODE=ELEMENT.NAN_CODE,
        CODE_MASK=ELEMENT.CODE_MASK,
    )
    return code, result.to(tl.float32, bitcast=True)


@triton.jit
def narrowed_value(value, dtype: tl.constexpr, NAN16: tl.constexpr):
    """fp32 values rounded to nearest even in bf16 or fp16 (``dtype``), back in fp32
    (bf16 widened with integer operations: the interpreter's conversion flushes
    subnormals)."""
    narrow = narrow_to_16_bits(value.to(tl.int32, bitcast=True), dtype, NAN16)
    return fp32_bits_of(narrow).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3(value):
    """fp32 values rounded to nearest even into E4M3FN, saturating to +-448: their codes
    (NaN: 0x7F) and fp32 values (`fast_round`, which rounds as the core does)."""
    bits = value.to(tl.int32, bitcast=True)
    # the records bound as constexprs (a global constexpr's fields are read from its value)
    ROUNDING: tl.constexpr = _NEAREST_EVEN.value
    ELEMENT: tl.constexpr = _E4M3FN.value
    return fast_round(bits, bits * 0, ROUNDING, ELEMENT)


@triton.jit
def nvfp4_scale(amax, tensor_scale_ptr, SCALE: tl.constexpr):
    """Each block's NVFP4 scale (E4M3 code), the factor its GEMM operand's elements take
    (the E4M3 value; times the decoding tensor scale under "pow2", whose power of two the
    operand holds exactly), that value times the decoding tensor scale and the elements'
    fp32 multiplier, in the flavour's operation order
    (`stochround.blocks.scales.nvfp4_scales`); SCALE.TENSOR_SCALE: how many fp32 values
    ``tensor_scale_ptr`` holds: 0 (single-level), 1 (S_dec, and S_enc = 1 / S_dec) or 2
    (S_dec, then S_enc).  "te": s = e4m3(min(amax * (S_enc * fp32(1/6)), 448)), multiplier
    min(1 / (s * S_dec), FLT_MAX) (and "pow2", whose tensor scales are powers of two);
    "torchao": s = e4m3(clamp(amax / 6 / t, 2**-6, 448)), multiplier (1 / t) / s.  Clamps
    are selects, which keep NaN as the PyTorch path does."""
    if SCALE.TENSOR_SCALE > 0:
        decode = tl.load(tensor_scale_ptr)
    if SCALE.FLAVOUR == "te" or SCALE.FLAVOUR == "pow2":  # pow2: TE's order
        if SCALE.TENSOR_SCALE == 2:
            multiplier = tl.load(tensor_scale_ptr + 1) * _ONE_SIXTH
        elif SCALE.TENSOR_SCALE == 1:
            multiplier = tl.math.div_rn(1.0, decode) * _ONE_SIXTH
        else:
            multiplier = _ONE_SIXTH
        # e4m3 rounding saturates: FLT_MAX's and 448's clamps give 448 as it does
        code, scale = _e4m3(amax * multiplier)
        block_value = scale
        if SCALE.TENSOR_SCALE > 0:
            scale = scale * decode
        if SCALE.FLAVOUR == "pow2":
            block_value = scale
        inverse = tl.math.div_rn(1.0, scale)
        inverse = tl.where(inverse > _FLT_MAX, _FLT_MAX, inverse)
    else:
        tl.static_assert(SCALE.FLAVOUR == "torchao", "SCALE.FLAVOUR must be te, torchao or pow2")
        wanted = tl.math.div_rn(amax, 6.0)
        if SCALE.TENSOR_SCALE > 0:
            wanted = tl.math.div_rn(wanted, decode)
        code, scale = _e4m3(tl.where(wanted < _E4M3_EPS, _E4M3_EPS, wanted))
        block_value = scale
        if SCALE.TENSOR_SCALE > 0:
            inverse = tl.math.div_rn(tl.math.div_rn(1.0, decode), scale)
            scale = scale * decode
        else:
            inverse = tl.math.div_rn(1.0, scale)
    return code, block_value, scale, inverse


__all__ = [
    "BlockScale",
    "ElementFormat",
    "ElementRounding",
    "e8m0_exponent",
    "element_format",
    "element_rounding",
    "fast_bits",
    "fast_round",
    "fp32_power_of_two",
    "general_round",
    "magnitude_steps_up",
    "nan_where",
    "narrowed_value",
    "nearest_integer",
    "nvfp4_scale",
]
