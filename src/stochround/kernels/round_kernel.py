"""The general rounding kernel (`@triton.jit`): every mode, variant, rbits, saturation and
random source, to values, codes, packed fp4 or fp6, and the launch it is bound to."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats import Format
from ..torch_path import saturation_bounds
from .common import (
    NAN16_BITS,
    encode_bits,
    format_constants,
    fp32_bits_of,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    seed_and_offset,
)
from .row_tiles import TILE_ROWS, flag_nan, row_tile, store_row_codes, tile_random_words
from .runtime import Launch


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
    lane, position, mask, x, group = row_tile(x_ptr, program, count, index_offset, ROWS)
    index = position + index_offset
    if MODE == "sr":
        seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
        word = tile_random_words(
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
        store_row_codes(out_ptr, code, program, lane, count, OUTPUT, ROWS)
        if CHECK_NAN:
            flag_nan(flag_ptr, (result & 0x7FFFFFFF) > 0x7F800000, mask)


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


def round_launch(
    *,
    fmt: Format,
    output: str,
    out_dtype: torch.dtype,
    mode: str,
    sat: str,
    n: int,
    variant: str,
    source: str,
    check_nan: bool,
    stream: dict[str, bool],
) -> Launch:
    """`_round_kernel` bound to a request's choices and the per-call ``stream`` constexprs
    (FROM_TENSORS, ALIGNED, WIDE)."""
    constants = {
        "CHECK_NAN": check_nan,
        **format_constants(fmt),
        **overflow_bits(fmt, mode, sat),
        "MODE": mode,
        "VARIANT": variant,
        "NBITS": n,
        "SOURCE": source,
        "OUTPUT": output,
        "NAN16": NAN16_BITS.get(out_dtype, 0),
        "ROWS": TILE_ROWS,
        **_clamp_constants(fmt, output, out_dtype, sat),
        **stream,
    }
    return Launch(_round_kernel, constants)


__all__ = ["round_launch"]
