"""A per-tensor (current scaling) operand in one pass: ``round(fp32(x) * multiplier)`` into
a float8 format with finite saturation, stored as the format's codes or as its values in
bf16 (exact: a float8 value is a bf16 value), and optionally also transposed, in the same
pass: the FP8 recipe's operand of a tensor and of its transpose (`stochround.nn.operands`).

Bit-identical to the PyTorch path it fuses, ``cast(x * multiplier.reshape(1), dtype, mode,
sat="finite", ...)`` followed by ``.to(torch.bfloat16)`` and ``.T.contiguous()``: the
product is one fp32 multiply rounded to nearest (as PyTorch's), the rounding the rounding
kernels' (`kernels.common.rounded_fp32_bits`), SR's word of each element the stream's word
of its row-major index.  A program takes a square tile of x, so that both its rows and
its transpose's rows are stored as contiguous runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..formats import Format
from .availability import current_device
from .common import (
    block_tile_words,
    encode_bits,
    format_constants,
    fp32_bits_of,
    overflow_bits,
    rounded_fp32_bits,
)
from .grid import cdiv
from .runtime import Launch
from .transpose import TILE, tile_places  # the side of a tile stored both ways, its places

_NUM_WARPS = 4

# what the kernel stores: the format's codes (one byte each) or its values as bf16
TENSOR_OUTPUTS = ("codes", "bfloat16")


class TensorRounding(NamedTuple):
    """A call's rounding choices: the float8 format, the mode ("rne" or "sr"), SR's random
    bits (32: exact) and variant, and the output (`TENSOR_OUTPUTS`)."""

    fmt: Format
    mode: str
    nbits: int
    variant: str
    output: str


@triton.jit
def _tile_words(seed_ptr, offset_ptr, position, ALIGNED: tl.constexpr, TILE: tl.constexpr):
    """The stream word (uint32) of each element of a TILE x TILE tile at its row-major
    ``position``; ALIGNED (rows of a multiple of 4 elements): each run of four along a row
    is one Philox block, computed once."""
    seed = tl.load(seed_ptr)
    offset = tl.load(offset_ptr)
    shape: tl.constexpr = (TILE, TILE // 4, 4)
    lane = tl.arange(0, 4)[None, None, :]
    word = block_tile_words(seed, offset, tl.reshape(position, shape), lane, ALIGNED)
    return tl.reshape(word, (TILE, TILE))


@triton.jit
def _nearest_float8(
    bits, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr,
    MIN_NORMAL_BITS: tl.constexpr, NAN_CODE: tl.constexpr, OUTPUT: tl.constexpr,
):  # fmt: skip
    """Round to nearest even with finite saturation into an 8-bit sign-magnitude float
    format with signed zeros and +-max as its extremes (`nearest_float8_serves`), from x's
    fp32 bits (int32): the codes (OUTPUT "codes") or the values' fp32 bits, equal to
    `stochround.kernels.common.rounded_fp32_bits` (and `encode_bits`) for these formats.
    From 2**EMIN up the fp32 significand is rounded to MBITS bits in place (a carry steps
    the exponent); below, fp32's sum with 2**(EMIN - MBITS + 23), whose ulp is the
    format's subnormal ulp, rounds to nearest even there (an input below fp32's normals,
    flushed or not, sums to the anchor itself: both give zero), its low bits counting ulps."""
    DISCARDED: tl.constexpr = 23 - MBITS
    ANCHOR_BITS: tl.constexpr = (EMIN - MBITS + 150) << 23
    anchor = tl.cast(ANCHOR_BITS, tl.int32).to(tl.float32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    tiny = magnitude.to(tl.float32, bitcast=True) + anchor
    half_ulp_or_less = (1 << (DISCARDED - 1)) - 1 + ((magnitude >> DISCARDED) & 1)
    normal = (magnitude + half_ulp_or_less) >> DISCARDED  # fp32's exponent field, MBITS bits
    subnormal = magnitude < MIN_NORMAL_BITS
    if OUTPUT == "codes":
        # the code's magnitude: the exponent field rebiased, or the subnormal's ulps
        LIMIT: tl.constexpr = (MAX_BITS >> DISCARDED) - ((127 - BIAS) << MBITS)
        code = normal - ((127 - BIAS) << MBITS)
        code = tl.where(subnormal, tiny.to(tl.int32, bitcast=True) - ANCHOR_BITS, code)
        code = tl.minimum(code, LIMIT) | ((bits >> 24) & 0x80)  # overflow, infinities: max
        return tl.where(magnitude > 0x7F800000, NAN_CODE, code)
    else:
        tl.static_assert(OUTPUT == "bfloat16", "OUTPUT must be codes or bfloat16")
        below = (tiny - anchor).to(tl.int32, bitcast=True)
        value = tl.where(subnormal, below, normal << DISCARDED)
        value = tl.minimum(value, MAX_BITS) | (bits & -0x80000000)
        return tl.where(magnitude > 0x7F800000, 0x7FC00000, value)


@triton.jit
def _tensor_round_kernel(
    x_ptr,
    multiplier_ptr,
    out_ptr,
    out_t_ptr,
    seed_ptr,
    offset_ptr,
    rows,
    cols,
    col_tiles,
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
    EBITS: tl.constexpr,
    SIGNED: tl.constexpr,
    TWOS_COMPLEMENT: tl.constexpr,
    INFINITY_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    CODE_MASK: tl.constexpr,
    MODE: tl.constexpr,
    VARIANT: tl.constexpr,
    NBITS: tl.constexpr,
    OUTPUT: tl.constexpr,
    ARITHMETIC: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    ALIGNED: tl.constexpr,
    WIDE: tl.constexpr,
    TILE: tl.constexpr,
):
    """out[i, j] = Q(x[i, j] * multiplier) for one TILE x TILE tile of x (rows x cols,
    row-major), and with TRANSPOSE out_t[j, i] the same; program p takes tile
    (p // col_tiles, p % col_tiles).  ``multiplier``: a 0-d fp32 tensor; ``seed`` and
    ``offset``: one-element int64 tensors (SR only)."""
    row, col, mask, row_t, col_t, mask_t = tile_places(
        tl.program_id(0), rows, cols, col_tiles, WIDE, TILE
    )
    position = row * cols + col
    x = tl.load(x_ptr + position, mask=mask, other=0.0)
    # one fp32 multiply, rounded to nearest: x's fp32 value (bf16 widened by its bits)
    product = fp32_bits_of(x).to(tl.float32, bitcast=True) * tl.load(multiplier_ptr)
    bits = product.to(tl.int32, bitcast=True)
    if ARITHMETIC == "nearest_float8":  # the codes, or the values' fp32 bits
        result = _nearest_float8(bits, MBITS, EMIN, BIAS, MAX_BITS, MIN_NORMAL_BITS, NAN_CODE,
                                 OUTPUT)  # fmt: skip
    else:
        tl.static_assert(ARITHMETIC == "general", "ARITHMETIC must be nearest_float8 or general")
        if MODE == "sr":
            word = _tile_words(seed_ptr, offset_ptr, position, ALIGNED, TILE)
            r = word.to(tl.int64) >> (32 - NBITS)
        else:
            r = bits.to(tl.int64) * 0
        result = rounded_fp32_bits(
            bits, r, MBITS, EMIN, BIAS, HAS_ZERO, HAS_NEGATIVE_ZERO, MAX_BITS,
            NEGATIVE_LIMIT_BITS, MIN_NORMAL_BITS, OVERFLOW_POSITIVE, OVERFLOW_NEGATIVE,
            INFINITY_POSITIVE, INFINITY_NEGATIVE, MODE, VARIANT, NBITS,
        )  # fmt: skip
        if OUTPUT == "codes":
            result = encode_bits(result, EBITS, MBITS, EMIN, BIAS, SIGNED, TWOS_COMPLEMENT,
                                 INFINITY_CODE, NAN_CODE, CODE_MASK)  # fmt: skip
    if OUTPUT == "codes":
        # float8 codes stored as their bytes (the output is the float8 dtype's tensor)
        value = result.to(tl.uint8)
    else:
        tl.static_assert(OUTPUT == "bfloat16", "OUTPUT must be codes or bfloat16")
        # a float8 value's fp32 bits end in 16 zeros: its bf16 bits are the top 16 (NaN's
        # 0x7FC00000 gives bf16's 0x7FC0)
        value = (result >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    tl.store(out_ptr.to(tl.pointer_type(value.dtype)) + position, value, mask=mask)
    if TRANSPOSE:
        out_t = out_t_ptr.to(tl.pointer_type(value.dtype))
        tl.store(out_t + row_t * rows + col_t, tl.trans(value), mask=mask_t)


def nearest_float8_serves(rounding: TensorRounding) -> bool:
    """Whether `_nearest_float8` rounds a call: round to nearest even (saturation is always
    finite here) into an 8-bit sign-magnitude format with signed zeros, +-max its extremes,
    at least one mantissa bit and its subnormal ulp an fp32 normal (e4m3fn, e5m2): the
    general arithmetic (`rounded_fp32_bits`, `encode_bits`) otherwise."""
    fmt = rounding.fmt
    return (
        rounding.mode == "rne"
        and fmt.signed
        and fmt.ebits + fmt.mbits == 7
        and not fmt.twos_complement
        and fmt.has_zero
        and fmt.has_negative_zero
        and fmt.lowest == -fmt.max
        and 1 <= fmt.mbits <= 22
        and fmt.emin - fmt.mbits >= -126
    )


@functools.cache
def _launch(rounding: TensorRounding, transpose: bool, aligned: bool, wide: bool) -> Launch:
    """`_tensor_round_kernel` bound to a call's choices (made once per combination)."""
    fmt = rounding.fmt
    constants: dict[str, object] = {**format_constants(fmt)}
    constants.update(overflow_bits(fmt, rounding.mode, "finite"))
    constants.update(
        MODE=rounding.mode,
        VARIANT=rounding.variant,
        NBITS=rounding.nbits,
        OUTPUT=rounding.output,
        ARITHMETIC="nearest_float8" if nearest_float8_serves(rounding) else "general",
        TRANSPOSE=transpose,
        ALIGNED=aligned,
        WIDE=wide,
        TILE=TILE,
        num_warps=_NUM_WARPS,
    )
    return Launch(_tensor_round_kernel, constants)


def tensor_round(
    x: Tensor,
    multiplier: Tensor,
    rounding: TensorRounding,
    seed: Tensor | None,
    offset: Tensor | None,
    transpose: bool,
) -> tuple[Tensor, Tensor | None]:
    """``round(fp32(x) * multiplier)`` of a 2-D contiguous x (fp32, bf16 or fp16) into
    ``rounding``'s format with finite saturation, as its float8 codes (output "codes",
    in the format's torch dtype) or bf16 values, and with ``transpose`` also its
    transpose (contiguous), else None.  ``multiplier``: a 0-d fp32 tensor on x's device,
    read there (no synchronization); ``seed``, ``offset``: the SR stream's one-element
    int64 tensors (None for "rne")."""
    device = x.get_device()  # -1 on the CPU (the interpreter)
    if device >= 0 and device != current_device():
        with torch.cuda.device(device):
            return tensor_round(x, multiplier, rounding, seed, offset, transpose)
    rows, cols = x.shape
    dtype = rounding.fmt.torch_dtype if rounding.output == "codes" else torch.bfloat16
    assert dtype is not None  # a float8 format has its torch dtype (the caller's check)
    out = x.new_empty(rows, cols, dtype=dtype)
    out_t = x.new_empty(cols, rows, dtype=dtype) if transpose else None
    if x.numel() == 0:
        return out, out_t
    col_tiles = cdiv(cols, TILE)
    wide = x.numel() + TILE * max(rows, cols) >= 2**31
    launch = _launch(rounding, transpose, cols % 4 == 0, wide)
    launch(device, cdiv(rows, TILE) * col_tiles, x, multiplier, out, out_t, seed, offset,
           rows, cols, col_tiles)  # fmt: skip
    return out, out_t


__all__ = ["TENSOR_OUTPUTS", "TensorRounding", "nearest_float8_serves", "tensor_round"]
