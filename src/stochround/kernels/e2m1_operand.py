"""NVFP4's GEMM operand values specialised for its e2m1 elements (`@triton.jit`): fewer
instructions an element than the generic `block_math.fast_round` and
`common.narrow_to_16_bits` for the same bits, where the two-orientation quantizer
(`stochround.kernels.two_orientation`) spends them once per element and orientation.

- `e2m1_value`: an fp32 value (its magnitude and sign apart) rounded to e2m1 (saturating
  to +-6) by round-to-nearest-even or SR variant a / c, as `fast_round`'s value for the
  same choices where it is not NaN; no NaN handling (the caller's scale covers it).
- `exact_bf16`: operand values that bf16 holds exactly (an e2m1 value times an E4M3
  scale: at most 6 significant bits, magnitudes in [2**-10, 2688]) or NaN with the sign
  bit clear as their bf16s, their high halves (no rounding addition), bf16's canonical
  NaN for the NaNs.
- `rounded_to_bf16`: the rotated values rounded to x's 16-bit dtype and then to bf16 as
  `block_rotation.rotation_rounded` rounds them, by the hardware conversion where the
  kernel is compiled (one conversion, round to nearest even, subnormals kept), the second
  rounding left out where x is bf16 (bf16 values round to themselves).  A NaN's payload
  may differ from `rotation_rounded`'s; NVFP4 quantization reads only that it is a NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .availability import INTERPRETED
from .block_math import narrowed_value, nearest_integer

# compiled kernels convert with the hardware; the interpreter's bf16 conversion flushes
# subnormals, so there the integer rounding of `narrowed_value` stays
_NATIVE_CONVERSIONS = tl.constexpr(not INTERPRETED)
# e2m1's largest value, 6.0, as fp32 bits
_E2M1_MAX_BITS = tl.constexpr(0x40C00000)


@triton.jit
def e2m1_value(magnitude, sign, r, ROUNDING: tl.constexpr):
    """fp32 values of magnitude ``magnitude`` (fp32, not NaN) and the sign of ``sign``
    (fp32 bits, int32) rounded to e2m1, saturating to +-6 (-0 kept), as `fast_round`'s
    value for e2m1 (mbits 1, emin 0), never NaN (a NaN magnitude gives 6): with q =
    max(e, 0) - 1 the ulp's exponent of the clamped |x|, round-to-nearest-even adds and
    subtracts C = 2**(q + 23) in fp32 (exact); SR with n random bits ``r`` takes, with v =
    |x| 2**(B - q), floor((floor(v) + r 2**(32 - n)) / 2**32) 2**q (variant a, B = 32) or
    floor((rne(v) + r) / 2**n) 2**q (variant c, B = n), as `fast_round` does, in one 64-bit
    conversion, addition and shift.  ROUNDING: the record, its FAST_BITS the B."""
    clamped = tl.minimum(magnitude.to(tl.int32, bitcast=True), _E2M1_MAX_BITS)
    if ROUNDING.MODE == "rne":
        # 2**max(e, 0) (|x|'s exponent, clamped at 1.0's) times 2**22 is C: fused into
        # the addition and the subtraction, both exact products, so each rounds once as
        # |x| + C and its difference with C do
        binade = (tl.maximum(clamped, 0x3F800000) & 0x7F800000).to(tl.float32, bitcast=True)
        rounded = tl.fma(binade, 4194304.0, clamped.to(tl.float32, bitcast=True))
        value = tl.fma(binade, -4194304.0, rounded)
    else:
        field = tl.maximum(clamped >> 23, 127)
        tl.static_assert(ROUNDING.MODE == "sr", "e2m1_value rounds rne or sr")
        B: tl.constexpr = ROUNDING.FAST_BITS
        # 2**(B - q) = 2**(B + 1 + 127 - field), an fp32 normal power of two
        scale = ((255 + B - field) << 23).to(tl.float32, bitcast=True)
        v = clamped.to(tl.float32, bitcast=True) * scale
        if ROUNDING.VARIANT == "a":
            count = v.to(tl.uint64)
            noise = r.to(tl.uint64) << (32 - ROUNDING.NBITS)
        else:
            tl.static_assert(ROUNDING.VARIANT == "c", "e2m1_value rounds SR variants a and c")
            count = nearest_integer(v)
            noise = r.to(tl.uint64)
        total = ((count + noise) >> B).to(tl.int32)
        # total 2**q as C + total 2**q (C = 2**(q + 23): C's bits plus total) less C, both
        # exact: integer and fp32 additions, no int-to-float conversion (a slow pipe)
        magic_bits = (field + 22) << 23
        value = (magic_bits + total).to(tl.float32, bitcast=True) - magic_bits.to(
            tl.float32, bitcast=True
        )
    # x's sign as a bit (a float negation is 0 - v in Triton, which loses -0)
    return (value.to(tl.int32, bitcast=True) | (sign & -0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def exact_bf16(value):
    """bf16 of fp32 values that bf16 holds exactly (their high halves), or NaN with the
    sign bit clear, as bf16's canonical NaN (0x7FC0): the minimum of the bits with
    0x7FC00000's as signed integers keeps every finite value (a positive one's bits are
    below 0x7F800000, a negative one's negative) and takes every such NaN to it."""
    bits = tl.minimum(value.to(tl.int32, bitcast=True), 0x7FC00000)
    return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def rounded_to_bf16(value, NAN16: tl.constexpr, x_dtype: tl.constexpr, BF16: tl.constexpr):
    """fp32 values rounded to x's dtype (16-bit x: NAN16 its NaN; fp32 x: NAN16 0, kept),
    then to bf16 where BF16, back in fp32: `rotation_rounded`'s values (a NaN any NaN)."""
    if NAN16 != 0:
        if _NATIVE_CONVERSIONS:
            value = value.to(x_dtype).to(tl.float32)
        else:
            value = narrowed_value(value, x_dtype, NAN16)
    if BF16 and not (NAN16 != 0 and x_dtype == tl.bfloat16):
        if _NATIVE_CONVERSIONS:
            value = value.to(tl.bfloat16).to(tl.float32)
        else:
            value = narrowed_value(value, tl.bfloat16, 0x7FC0)
    return value


__all__ = ["e2m1_value", "exact_bf16", "rounded_to_bf16"]
