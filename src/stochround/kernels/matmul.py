"""A Triton matmul with per-operation rounding, bit-identical to `stochround.arith.matmul`.

`arith.matmul` (the PyTorch path) is the definition: C[..., i, j] accumulates the terms
p_k = a[..., i, k] b[..., k, j], each the exact product rounded once to ``product_fmt``
(or kept exact with ``product_fmt="exact"``), and every accumulation step is the exact sum
of two values rounded once to ``fmt`` (the rounding contract: every mode, n-bit SR
variants, saturation), in the order ``order`` gives.  This kernel computes the same steps
on the same values and draws the same random words, so the bits agree:

- product (b, i, j, k): word ``((b M + i) N + j) K + k`` of stream (seed, offset);
- reduction step t: stream (seed, offset + 1 + t), word ``b M N + i N + j`` for steps on
  one partial sum per output (recursive, compensated, block sums), and
  ``(b M N + i N + j) blocks + u`` for the partial sums of blocks u (blocked).

Exact arithmetic in integers (no float64 on the GPU): every value is ±sig 2**exp with sig
a non-negative int64.

- Inputs (fp32/bf16/fp16), rounded products and partial sums are fp32 values: sig < 2**24.
- An exact product: sig = sig_a sig_b < 2**48, exp = exp_a + exp_b; no overflow or
  underflow, since exp is an integer.
- A sum (`_exact_sum`): both significands shifted to a leading bit at 61; the smaller one
  shifted right by the gap, the bits shifted out folded into its last bit (round to odd);
  then one int64 addition (< 2**63).  Each operand has at most 48 significant bits, so
  bits are lost only when the gap is at least 15; then |x + y| > 2**(lead - 1) and the
  target ulp lies at least 60 - mbits >= 37 bits above the folded bit.  As in
  `arith.round_pair`, every decision of the contract (half and sticky bits; for n-bit SR
  floor(nu 2**(n+1)) and whether nu 2**(n+1) is an integer) needs n + 2 <= 34 bits, so
  the folded sum rounds exactly as the exact sum does.
- Rounding (`_round_exact`): sig normalized to [2**62, 2**63) (at least 39 bits lie below
  the target ulp), kept = the bits above it, rem = those below, the mode's decision on
  them; the rounded value (kept + away) 2**q lies on the format's grid, and fp32 holds it
  unless it reaches 2**128 (an overflow of every supported format, handled here), so
  `kernels.common.rounded_fp32_bits` finishes it (overflow, saturation, signed zeros,
  formats without zero) without rounding again.

Supported (`matmul_refusal` says why not otherwise): fp32/bf16/fp16 inputs; ``fmt`` and
``product_fmt`` where `kernel_supports` (values exact in fp32, emin >= -126); orders
``recursive``, ``blocked`` and ``compensated``; random bits from the stream (seed and offset
ints or device tensors).  Not supported: ``order="pairwise"``, explicit ``rand`` integers
and ``rand="data"``, and SR with mbits + n + 2 > 52 (fp32 accumulators with more than 27
random bits), which `arith.round_pair` refuses too.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..cpu_path import INFINITY_BITS
from ..formats import Format
from ..random import seed_tensor
from .availability import INTERPRETED
from .common import (
    INPUT_DTYPES,
    NAN16_BITS,
    as_int64,
    deterministic_away,
    format_constants,
    fp32_bits_of,
    kernel_supports,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    seed_and_offset,
    sr_count_rounds_up,
)
from .grid import cdiv, next_power_of_2
from .philox import four_words, random_word, to_u64

__all__ = ["KERNEL_ORDERS", "matmul_refusal", "matmul_triton"]

KERNEL_ORDERS = ("recursive", "blocked", "compensated")
# Each program computes ROWS x 4 outputs (a row shares one Philox call for the reduction's
# words).  The interpreter runs programs one after another: there one program does all.
GPU_ROWS = 32
INTERPRETER_ROWS = 1024
# constants the kernels read (globals in kernels must be constexprs)
SIGN = tl.constexpr(-0x80000000)  # the fp32 sign bit as int32
NAN_BITS = tl.constexpr(0x7FC00000)
_INFINITY = tl.constexpr(INFINITY_BITS)  # cpu_path's pattern, as a constexpr
ZERO_EXPONENT = tl.constexpr(-(1 << 30))  # a zero's exponent in a sum: below any other's


# --------------------------------------------------------------------------------------
# exact values: (negative, sig, exp, special) = ±sig 2**exp, or the fp32 bits of an
# infinity or NaN in special (0 for finite values)
# --------------------------------------------------------------------------------------


@triton.jit
def _leading_bit(sig):
    """floor(log2 sig) (int32) for int64 0 < sig < 2**63; -1 for 0.  fp32(sig) is sig rounded
    to 24 bits: its exponent is the answer, or one more when the rounding carries."""
    estimate = (sig.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    estimate = tl.maximum(estimate, 0)
    return estimate - ((sig >> estimate.to(tl.int64)) == 0).to(tl.int32)


@triton.jit
def _unpack(bits):
    """fp32 bit patterns (int32) as exact values: sig the 24-bit significand (implicit bit
    included; fp32 subnormals have exponent -126 and no implicit bit), exp = e - 23."""
    magnitude = bits & 0x7FFFFFFF
    field = magnitude >> 23
    sig = ((magnitude & 0x7FFFFF) | tl.where(field > 0, 0x800000, 0)).to(tl.int64)
    exp = tl.maximum(field, 1) - 150
    special = tl.where(field == 255, bits, 0)
    return bits < 0, sig, exp, special


@triton.jit
def _negate(value):
    """-value (IEEE 754 negation: zeros and infinities change sign)."""
    negative, sig, exp, special = value
    return ~negative, sig, exp, special ^ tl.where(special != 0, SIGN, 0)


@triton.jit
def _exact_product(x, y):
    """x y exactly: sig_x sig_y < 2**48 at exponent exp_x + exp_y; inf times zero is NaN."""
    x_negative, x_sig, x_exp, x_special = x
    y_negative, y_sig, y_exp, y_special = y
    negative = x_negative ^ y_negative
    x_magnitude = x_special & 0x7FFFFFFF
    y_magnitude = y_special & 0x7FFFFFFF
    x_zero = (x_sig == 0) & (x_special == 0)
    y_zero = (y_sig == 0) & (y_special == 0)
    nan = (x_magnitude > _INFINITY) | (y_magnitude > _INFINITY)
    nan = nan | ((x_magnitude == _INFINITY) & y_zero) | ((y_magnitude == _INFINITY) & x_zero)
    infinity = _INFINITY | tl.where(negative, SIGN, 0)
    special = tl.where((x_special != 0) | (y_special != 0), infinity, 0)
    special = tl.where(nan, NAN_BITS, special)
    return negative, x_sig * y_sig, x_exp + y_exp, special


@triton.jit
def _normalized(sig, exp):
    """The same value with sig's leading bit at 61 (an exact left shift); zero gets the
    exponent ZERO_EXPONENT, so the other operand of a sum is the larger."""
    shift = 61 - _leading_bit(sig)
    return sig << shift.to(tl.int64), tl.where(sig == 0, ZERO_EXPONENT, exp - shift)


@triton.jit
def _special_sum(x_special, y_special):
    """x + y where either is infinite or NaN (fp32 bits; 0 where neither is): NaN when
    either is NaN or for inf - inf, else the infinity."""
    x_magnitude = x_special & 0x7FFFFFFF
    y_magnitude = y_special & 0x7FFFFFFF
    x_infinite = x_magnitude == _INFINITY
    nan = (x_magnitude > _INFINITY) | (y_magnitude > _INFINITY)
    nan = nan | (x_infinite & (y_magnitude == _INFINITY) & (x_special != y_special))
    return tl.where(nan, NAN_BITS, tl.where(x_infinite, x_special, y_special))


@triton.jit
def _exact_sum(x, y, MODE: tl.constexpr):
    """x + y as (negative, sig, exp, special) with sig < 2**63 the exact sum rounded to odd
    at 2**exp (module docstring); an exact zero sum is +0, -0 when both terms are -0, and
    in rd -0 unless both are +0 (IEEE 754 6.3)."""
    x_negative, x_sig, x_exp, x_special = x
    y_negative, y_sig, y_exp, y_special = y
    x_zero = (x_sig == 0) & (x_special == 0)
    y_zero = (y_sig == 0) & (y_special == 0)
    x_sig, x_exp = _normalized(x_sig, x_exp)
    y_sig, y_exp = _normalized(y_sig, y_exp)
    x_larger = x_exp >= y_exp
    big_sig = tl.where(x_larger, x_sig, y_sig)
    big_exp = tl.where(x_larger, x_exp, y_exp)
    big_negative = tl.where(x_larger, x_negative, y_negative)
    small_sig = tl.where(x_larger, y_sig, x_sig)
    small_negative = tl.where(x_larger, y_negative, x_negative)
    gap = tl.minimum(big_exp - tl.where(x_larger, y_exp, x_exp), 63).to(tl.int64)
    aligned = small_sig >> gap
    aligned = aligned | ((aligned << gap) != small_sig).to(tl.int64)  # round to odd
    total = tl.where(big_negative == small_negative, big_sig + aligned, big_sig - aligned)
    negative = tl.where(total < 0, ~big_negative, big_negative)
    if MODE == "rd":
        zero_negative = ~(x_zero & y_zero & ~x_negative & ~y_negative)
    else:
        zero_negative = x_zero & y_zero & x_negative & y_negative
    negative = tl.where(total == 0, zero_negative, negative)
    return negative, tl.abs(total), big_exp, _special_sum(x_special, y_special)


# --------------------------------------------------------------------------------------
# rounding an exact value once
# --------------------------------------------------------------------------------------


@triton.jit
def _sr_count(rem, d, NBITS: tl.constexpr, VARIANT: tl.constexpr):
    """The integer SR adds r to (int64): floor (a), half-up (b), half-even (c) or half-odd
    (odd) rounding of nu 2**n, nu = rem / 2**d, for int64 rem < 2**min(d, 63) and d > n."""
    down = tl.minimum(d - NBITS, 63).to(tl.int64)
    floor = rem >> down
    below = rem - (floor << down)
    half = (rem * 0 + 1) << (down - 1)
    reachable = d - NBITS <= 63  # beyond, half = 2**(d - n - 1) > 2**63 > below
    up = sr_count_rounds_up(floor, below, half, VARIANT)
    return floor + (up & reachable).to(tl.int64)


@triton.jit
def _away(
    kept,
    rem,
    d,
    e,
    negative,
    r,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    MODE: tl.constexpr,
    VARIANT: tl.constexpr,
    NBITS: tl.constexpr,
):
    """The mode's decision (int1) for kept (the bits above the ulp) and rem (the d >= 39 bits
    below it), as `rounding._away` decides on nu = rem / 2**d.  MODE is the index in
    reference.MODES: rne, rna, rz, ru, rd, ro, sr."""
    if MBITS > 0:
        odd = (kept & 1) == 1
    else:  # p = 1: the code's last bit is the exponent field's
        odd = (kept != 0) & (((e + BIAS) & 1) == 1)
    if MODE == "sr":
        away = ((_sr_count(rem, d, NBITS, VARIANT) + r) >> NBITS) != 0
    else:
        cut = tl.minimum(d, 63).to(tl.int64)
        half = (rem * 0 + 1) << (cut - 1)
        within = d <= 63  # beyond, nu < 2**63 / 2**64 = 1/2
        above_half = (rem > half) & within
        at_half = (rem == half) & within
        away = deterministic_away(above_half, at_half, rem != 0, odd, negative, MODE)
    return away


@triton.jit
def _round_exact(value, r, FMT: tl.constexpr, ROUNDING: tl.constexpr):
    """fp32 bits (int32) of an exact value rounded once to the format FMT
    (`exact_rounding_constants`) with ROUNDING = (MODE, VARIANT, NBITS):
    e = max(floor(log2 |v|), emin), q = e - mbits, kept + away at the ulp 2**q, then
    `rounded_fp32_bits` on that on-grid value for overflow, signs and zeros."""
    negative, sig, exp, special = value
    MBITS: tl.constexpr = FMT[0]
    EMIN: tl.constexpr = FMT[1]
    # a tuple's strings reach a called function only as constexprs (named here)
    MODE: tl.constexpr = ROUNDING[0]
    VARIANT: tl.constexpr = ROUNDING[1]
    lead = _leading_bit(sig)
    sig = sig << (62 - lead).to(tl.int64)  # in [2**62, 2**63), or 0
    exp = exp - (62 - lead)
    e = tl.maximum(exp + 62, EMIN)
    q = e - MBITS
    d = q - exp  # bits of sig below the ulp: >= 62 - mbits >= 39
    cut = tl.minimum(d, 63).to(tl.int64)
    kept = sig >> cut
    rem = sig - (kept << cut)
    away = _away(kept, rem, d, e, negative, r, MBITS, FMT[2], MODE, VARIANT, ROUNDING[2])
    total = (kept + away.to(tl.int64)).to(tl.int32)  # <= 2**(mbits + 1) <= 2**24
    total_bits = total.to(tl.float32).to(tl.int32, bitcast=True)
    exponent = (total_bits >> 23) - 127 + q  # floor(log2) of the rounded magnitude
    huge = (exponent > 127) & (total != 0)  # beyond fp32, so beyond every format's max
    normal = total_bits + (tl.minimum(q, 128) << 23)
    subnormal = total << tl.minimum(tl.maximum(q + 149, 0), 31)
    bits = tl.where(exponent >= -126, normal, subnormal)
    bits = tl.where(total == 0, 0, bits)
    if not FMT[3]:  # no zero: the smallest magnitude is the smallest normal
        bits = tl.maximum(bits, FMT[7])
    bits = bits | tl.where(negative, SIGN, 0)
    bits = tl.where(special != 0, special, bits)
    rounded = rounded_fp32_bits(
        bits,
        r * 0,
        MBITS,
        EMIN,
        FMT[2],
        FMT[3],
        FMT[4],
        FMT[5],
        FMT[6],
        FMT[7],
        FMT[8],
        FMT[9],
        FMT[10],
        FMT[11],
        MODE,
        VARIANT,
        ROUNDING[2],
    )
    overflow = tl.where(negative, FMT[9], FMT[8])
    return tl.where(huge & (special == 0), overflow, rounded)


# --------------------------------------------------------------------------------------
# random integers
# --------------------------------------------------------------------------------------


@triton.jit
def _integers_at(seed, offset, index, NBITS: tl.constexpr):
    """r = the top n bits of the word of each element's global index (int64)."""
    return (random_word(seed, offset, index) >> (32 - NBITS)).to(tl.int64)


@triton.jit
def _integers_of_outputs(seed, offset, group, lane, NBITS: tl.constexpr):
    """r of the [ROWS, 4] tile of outputs at flat indices 4 group + lane: one Philox call
    serves a row."""
    word0, word1, word2, word3 = four_words(seed, offset, group)
    word = tl.where(lane == 0, word0[:, None], word1[:, None])
    word = tl.where(lane == 2, word2[:, None], word)
    word = tl.where(lane == 3, word3[:, None], word)
    return (word >> (32 - NBITS)).to(tl.int64)


# --------------------------------------------------------------------------------------
# the kernel.  Argument bundles: stream = (seed, offset); tile = (position, group, lane),
# the outputs' flat indices, and the Philox group and lane of each; operands = (a_ptr,
# b_ptr, a_row, b_column, stride_ak, stride_bk, mask); ROUNDING = (MODE, VARIANT, NBITS).
# --------------------------------------------------------------------------------------


@triton.jit
def _term(operands, k, stream, tile, K, PRODUCT: tl.constexpr, ROUNDING: tl.constexpr):
    """Term k of each output: a[i, k] b[k, j] exactly, rounded once to PRODUCT unless it is
    None, drawing product (position, k)'s word, index position K + k of stream (seed,
    offset)."""
    a_ptr, b_ptr, a_row, b_column, stride_ak, stride_bk, mask = operands
    position = tile[0]
    a = tl.load(a_ptr + a_row + k * stride_ak, mask=mask, other=0.0)
    b = tl.load(b_ptr + b_column + k * stride_bk, mask=mask, other=0.0)
    product = _exact_product(_unpack(fp32_bits_of(a)), _unpack(fp32_bits_of(b)))
    if PRODUCT is not None:
        if ROUNDING[0] == "sr":
            r = _integers_at(stream[0], stream[1], position * K + k, ROUNDING[2])
        else:
            r = position * 0
        product = _unpack(_round_exact(product, r, PRODUCT, ROUNDING))
    return product


@triton.jit
def _step(value, step, index, stream, tile, FMT: tl.constexpr, ROUNDING: tl.constexpr):
    """Reduction step t: the exact value rounded once to FMT (fp32 bits), drawing element
    ``index`` of stream (seed, offset + 1 + t mod 2**64); index None: the output's own
    word (index = position), from one Philox call a row of the tile."""
    position, group, lane = tile
    if ROUNDING[0] == "sr":
        offset = to_u64(stream[1]) + to_u64(step + 1)
        if index is None:
            r = _integers_of_outputs(stream[0], offset, group, lane, ROUNDING[2])
        else:
            r = _integers_at(stream[0], offset, index, ROUNDING[2])
    else:
        r = position * 0
    return _round_exact(value, r, FMT, ROUNDING)


@triton.jit
def _add(x, y, step, index, stream, tile, FMT: tl.constexpr, ROUNDING: tl.constexpr):
    """x + y (exact values) rounded once at reduction step t, as `_step` (fp32 bits)."""
    MODE: tl.constexpr = ROUNDING[0]
    return _step(_exact_sum(x, y, MODE), step, index, stream, tile, FMT, ROUNDING)


@triton.jit
def _recursive_sum(
    operands,
    start,
    length,
    index,
    stream,
    tile,
    K,
    FMT: tl.constexpr,
    PRODUCT: tl.constexpr,
    ROUNDING: tl.constexpr,
):
    """s = round(x_start); s = round(s + x_k) for the next length - 1 terms, step s of the
    sum drawing element ``index`` (`_step`); fp32 bits of s."""
    term = _term(operands, start, stream, tile, K, PRODUCT, ROUNDING)
    total = _step(term, 0, index, stream, tile, FMT, ROUNDING)
    step = K * 0 + 1
    while step < length:
        term = _term(operands, start + step, stream, tile, K, PRODUCT, ROUNDING)
        total = _add(_unpack(total), term, step, index, stream, tile, FMT, ROUNDING)
        step += 1
    return total


@triton.jit
def _kahan_sum(
    operands, stream, tile, K, FMT: tl.constexpr, PRODUCT: tl.constexpr, ROUNDING: tl.constexpr
):
    """Compensated order (arith._reduce): y = x_k - c; t = s + y; c = (t - s) - y; s = t,
    each rounded, term k's four steps numbered 4 k - 3 .. 4 k; fp32 bits of s."""
    term = _term(operands, 0, stream, tile, K, PRODUCT, ROUNDING)
    total = _step(term, 0, None, stream, tile, FMT, ROUNDING)
    compensation = total * 0
    k = K * 0 + 1
    while k < K:
        step = 4 * k - 3
        term = _term(operands, k, stream, tile, K, PRODUCT, ROUNDING)
        y = _negate(_unpack(compensation))
        corrected = _add(term, y, step, None, stream, tile, FMT, ROUNDING)
        y = _unpack(corrected)
        new_total = _add(_unpack(total), y, step + 1, None, stream, tile, FMT, ROUNDING)
        y = _negate(_unpack(total))
        change = _add(_unpack(new_total), y, step + 2, None, stream, tile, FMT, ROUNDING)
        y = _negate(_unpack(corrected))
        compensation = _add(_unpack(change), y, step + 3, None, stream, tile, FMT, ROUNDING)
        total = new_total
        k += 1
    return total


# K is never specialized: Triton 3.6 fails to compile the K == 1 specialization (its
# coalescing pass crashes on the loops' constant bounds).
@triton.jit(do_not_specialize=["seed_value", "offset_value", "K"])
def _matmul_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    count,
    N,
    MN,
    K,
    block,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    ACCUMULATOR: tl.constexpr,
    PRODUCT: tl.constexpr,
    ORDER: tl.constexpr,
    ROUNDING: tl.constexpr,
    FROM_TENSORS: tl.constexpr,
    NAN16: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Outputs 4 ROWS program .. 4 ROWS (program + 1) - 1 of the flat (batch, M, N) result.
    ORDER: "recursive", "blocked" (more than one block) or "compensated".  PRODUCT: the
    product format's constants, None for exact products."""
    program = tl.program_id(0).to(tl.int64)
    row = tl.arange(0, ROWS)[:, None]
    lane = tl.arange(0, 4)[None, :]
    position = program * (ROWS * 4) + row * 4 + lane
    tile = (position, program * ROWS + tl.arange(0, ROWS), lane)
    mask = position < count
    batch = position // MN
    i = (position - batch * MN) // N
    j = position - batch * MN - i * N
    a_row = batch * stride_ab + i * stride_am
    b_column = batch * stride_bb + j * stride_bn
    operands = (a_ptr, b_ptr, a_row, b_column, stride_ak, stride_bk, mask)
    if ROUNDING[0] == "sr":
        stream = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
    else:
        stream = (seed_value, offset_value)  # unused
    if ORDER == "recursive":
        total = _recursive_sum(
            operands, 0, K, None, stream, tile, K, ACCUMULATOR, PRODUCT, ROUNDING
        )
    elif ORDER == "blocked":
        # block u's partial sum draws element position blocks + u of each step's
        # (..., blocks) tensor; the block sums are added at steps block + u - 1
        blocks = (K + block - 1) // block
        index = position * blocks
        total = _recursive_sum(
            operands, 0, block, index, stream, tile, K, ACCUMULATOR, PRODUCT, ROUNDING
        )
        u = K * 0 + 1
        while u < blocks:
            start = u * block
            length = tl.minimum(block, K - start)
            partial = _recursive_sum(
                operands,
                start,
                length,
                index + u,
                stream,
                tile,
                K,
                ACCUMULATOR,
                PRODUCT,
                ROUNDING,
            )
            total = _add(
                _unpack(total),
                _unpack(partial),
                block + u - 1,
                None,
                stream,
                tile,
                ACCUMULATOR,
                ROUNDING,
            )
            u += 1
    else:
        tl.static_assert(ORDER == "compensated", "ORDER must be recursive, blocked or compensated")
        total = _kahan_sum(operands, stream, tile, K, ACCUMULATOR, PRODUCT, ROUNDING)
    if NAN16 == 0:
        tl.store(out_ptr + position, total.to(tl.float32, bitcast=True), mask=mask)
    else:
        narrow = narrow_to_16_bits(total, out_ptr.dtype.element_ty, NAN16)
        tl.store(out_ptr + position, narrow, mask=mask)


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------


def exact_rounding_constants(fmt: Format, mode: str, sat: str) -> tuple:
    """What `_round_exact` needs of a format, in `rounded_fp32_bits`'s order: MBITS, EMIN,
    BIAS, HAS_ZERO, HAS_NEGATIVE_ZERO, MAX_BITS, NEGATIVE_LIMIT_BITS, MIN_NORMAL_BITS and
    the overflow and infinity results (positive, negative)."""
    constants = {**format_constants(fmt), **overflow_bits(fmt, mode, sat)}
    names: tuple[str, ...] = ("MBITS", "EMIN", "BIAS", "HAS_ZERO", "HAS_NEGATIVE_ZERO", "MAX_BITS")
    names += ("NEGATIVE_LIMIT_BITS", "MIN_NORMAL_BITS", "OVERFLOW_POSITIVE")
    names += ("OVERFLOW_NEGATIVE", "INFINITY_POSITIVE", "INFINITY_NEGATIVE")
    return tuple(constants[name] for name in names)


def matmul_refusal(
    dtypes: tuple[torch.dtype, torch.dtype],
    fmt: Format,
    product_fmt: Format | None,
    order: str,
    mode: str,
    n: int,
    rand: object,
) -> str | None:
    """Why the kernel cannot compute this matmul (None if it can)."""
    for name, dtype in zip(("a", "b"), dtypes, strict=True):
        if dtype not in INPUT_DTYPES:
            return f"the kernel reads fp32/bf16/fp16 inputs, and {name} is {dtype}"
    for name, target in (("fmt", fmt), ("product_fmt", product_fmt)):
        if target is not None and not kernel_supports(target):
            return (
                f"{name}={target.name} is wider than the kernel's fp32 values (it needs a "
                "format whose values fp32 holds, with emin >= -126)"
            )
    if order not in KERNEL_ORDERS:
        return f"order={order!r}: the kernel computes the orders {', '.join(KERNEL_ORDERS)}"
    if rand is not None:
        return (
            "the kernel draws its random bits from the stream (seed, offset); explicit rand "
            "integers and rand='data' run on the PyTorch path (backend='torch')"
        )
    if mode == "sr" and fmt.mbits + n + 2 > 52:
        return (
            f"SR with {n} random bits into {fmt.name} (mbits={fmt.mbits}) needs mbits + n + 2 "
            f"<= 52, which the PyTorch path (arith.round_pair) also needs; pass "
            f"rbits <= {50 - fmt.mbits}"
        )
    return None


def matmul_triton(
    a: Tensor,
    b: Tensor,
    fmt: Format,
    product_fmt: Format | None,
    mode: str,
    *,
    order: str,
    block: int,
    n: int,
    variant: str,
    sat: str,
    seed: int | Tensor,
    offset: int | Tensor,
) -> Tensor:
    """`arith.matmul` by the kernel, for checked arguments the kernel supports (`matmul_refusal`
    returned None); ``product_fmt`` None means exact products, ``n`` the random bits."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    rows, inner = a.shape[-2:]
    columns = b.shape[-1]
    batches = math.prod(batch)
    a3 = a.expand(*batch, rows, inner).reshape(batches, rows, inner)
    b3 = b.expand(*batch, inner, columns).reshape(batches, inner, columns)
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    out = torch.empty((batches, rows, columns), dtype=out_dtype, device=a.device)
    count = out.numel()
    if count == 0:
        return out.reshape(*batch, rows, columns)
    if mode != "sr":  # no random words
        from_tensors = False
        seed_pointer = offset_pointer = out
        seed_value = offset_value = 0
    elif isinstance(seed, Tensor) or isinstance(offset, Tensor):
        from_tensors = True
        seed_pointer = seed_tensor(seed, "seed", a.device)
        offset_pointer = seed_tensor(offset, "offset", a.device)
        seed_value = offset_value = 0
    else:  # two's complement above 2**63: the kernel reads them as unsigned 64-bit
        from_tensors = False
        seed_pointer = offset_pointer = out
        seed_value, offset_value = as_int64(seed), as_int64(offset)
    blocked = order == "blocked" and inner > block
    accumulator = exact_rounding_constants(fmt, mode, sat)
    if INTERPRETED:  # no larger than needed: the interpreter computes every lane
        tile_rows = min(INTERPRETER_ROWS, next_power_of_2(cdiv(count, 4)))
    else:
        tile_rows = GPU_ROWS
    # Triton launches on the current device: a's (-1 on the CPU: no change)
    with torch.cuda.device(a.get_device()):
        _matmul_kernel[(cdiv(count, tile_rows * 4),)](
            a3,
            b3,
            out,
            seed_pointer,
            offset_pointer,
            seed_value,
            offset_value,
            count,
            columns,
            rows * columns,
            inner,
            block,
            *a3.stride(),
            *b3.stride(),
            ACCUMULATOR=accumulator,
            PRODUCT=None
            if product_fmt is None
            else exact_rounding_constants(product_fmt, mode, sat),
            ORDER="compensated"
            if order == "compensated"
            else "blocked"
            if blocked
            else "recursive",
            ROUNDING=(mode, variant, n),
            FROM_TENSORS=from_tensors,
            NAN16=NAN16_BITS.get(out_dtype, 0),
            ROWS=tile_rows,
        )
    return out.reshape(*batch, rows, columns)
