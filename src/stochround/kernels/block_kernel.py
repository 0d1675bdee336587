"""The fused block-quantization kernel (`@triton.jit`) that `stochround.kernels.blocks`
launches, and the typed constexpr records of its tile, stream and output."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..block_constants import ABSMAX_FLOORS, RESCALE, fp32
from .availability import INTERPRETED
from .block_math import (
    e8m0_exponent,
    fast_round,
    fp32_power_of_two,
    general_round,
    nan_where,
    narrowed_value,
    nvfp4_scale,
)
from .block_rotation import rotated, rotation_rounded
from .common import (
    block_tile_words,
    fp32_bits_of,
    narrow_to_16_bits,
    seed_and_offset,
    store_block_tile,
)
from .operand_bf16 import FLAGGED_SHIFT

# what the kernel writes: element codes one a byte, fp4 codes two a byte (low nibble
# first), the dequantized values in x's dtype, or a GEMM's operand: each element times its
# block scale alone (the tensor scale and floor-3/4's factor left to the GEMM's result, the
# values left in the rotated basis; NVFP4's "pow2" tensor scale folded in), in bf16 or fp32
BLOCK_OUTPUTS = ("codes", "fp4x2", "dequantized", "gemm")

# the fp32 constants of `stochround.block_constants` as the kernel reads them (constexpr)
_ABSMAX_FLOOR = tl.constexpr(ABSMAX_FLOORS[torch.float32])
_ABSMAX_FLOOR_BF16 = tl.constexpr(ABSMAX_FLOORS[torch.bfloat16])
_ABSMAX_FLOOR_FP16 = tl.constexpr(ABSMAX_FLOORS[torch.float16])
_RESCALE = tl.constexpr(fp32(RESCALE))
_FLAGGED_FACTOR = tl.constexpr(float(2**FLAGGED_SHIFT))


class BlockTiling(NamedTuple):
    """A program's tile: TILE blocks of BLOCK elements, each cut into GROUPS (a power of
    two) groups of four; WIDE: positions beyond int32."""

    BLOCK: int
    GROUPS: int
    TILE: int
    WIDE: bool


class QuantizeTiling(NamedTuple):
    """A launch's tiling (host side): ELEMENTS a program quantizes (a power of two, at least
    one block's power-of-two extent and a multiple of a rotation's size) with WARPS warps;
    `quantize_tiling` picks it per configuration, a benchmark passes its own."""

    ELEMENTS: int
    WARPS: int


# the default tiling, chosen by benchmarks/bench_quantize_tiling.py's sweep (its figures
# in benchmarks/RESULTS.md); the interpreter runs programs one after another, so there a
# larger tile costs less
_COMPILED_TILING = QuantizeTiling(ELEMENTS=2**11, WARPS=4)
_INTERPRETED_TILING = QuantizeTiling(ELEMENTS=2**14, WARPS=4)


def quantize_tiling(rotation: int, sr: bool) -> QuantizeTiling:
    """The default tiling of a configuration: ``rotation`` its Hadamard size (0: none),
    ``sr`` whether it draws random words (the two differ in registers a element).  One
    tiling for every configuration (benchmarks/notes/blocks.md says why)."""
    del rotation, sr  # the choice's inputs, kept for the per-configuration defaults
    return _INTERPRETED_TILING if INTERPRETED else _COMPILED_TILING


def check_tiling(tiling: QuantizeTiling, extent: int, rotation: int) -> None:
    """ValueError unless ``tiling`` is a QuantizeTiling of a power-of-two ELEMENTS of at
    least ``extent`` (a block's power-of-two extent) and ``rotation``, and WARPS in 1, 2,
    4, 8, 16."""
    elements, warps = tiling if isinstance(tiling, tuple) and len(tiling) == 2 else (0, 0)
    if (
        not isinstance(tiling, QuantizeTiling)
        or not isinstance(elements, int)
        or elements < max(extent, rotation, 1)
        or elements & (elements - 1)
        or warps not in (1, 2, 4, 8, 16)
    ):
        raise ValueError(
            f"tiling must be a QuantizeTiling of a power-of-two ELEMENTS >= {max(extent, rotation)}"
            f" and WARPS in 1, 2, 4, 8, 16; got {tiling!r}"
        )


class BlockStream(NamedTuple):
    """Where SR's words come from: FROM_TENSORS (seed and offset read from device
    tensors) and ALIGNED (each group of four one Philox block: ``index_offset`` and the
    block multiples of 4)."""

    FROM_TENSORS: bool
    ALIGNED: bool


class BlockOutput(NamedTuple):
    """What the kernel stores: KIND in `BLOCK_OUTPUTS`, NAN16 the NaN of x's 16-bit dtype
    (0: fp32), in which dequantized values and absmax scales are held, OUT_NAN16 the NaN
    of the bf16 "gemm" output (0: fp32); FLAG_BELOW (bf16 "gemm" output of power-of-two
    scales): the fp32 bits of ``2**(mbits - 133)``, below which a nonzero value is not
    exact in bf16 (`stochround.kernels.operand_bf16.flag_bits`), 0: no flags; RECORD: the
    largest magnitude the launch quantizes (after the rotation and its rounding: the amax
    NVFP4's "amax" tensor scale takes) raised into ``record_ptr``'s fp32 (`raise_record`),
    a delayed tensor scale's current amax."""

    KIND: str
    NAN16: int
    OUT_NAN16: int
    FLAG_BELOW: int = 0
    RECORD: bool = False


@triton.jit
def _amax_bits(magnitude):
    """Each block's max |x| as fp32 bits (int32) from the [TILE, GROUPS, 4] magnitudes
    (fp32 bits without the sign): an integer max orders finite values, infinity and NaN
    as their values do, and any NaN in a block wins (its patterns lie above infinity)."""
    return tl.max(tl.max(magnitude, axis=2), axis=1)


@triton.jit
def raise_record(record_ptr, block_amax_bits):
    """Raise the fp32 at ``record_ptr`` to the largest of a tile's block amaxes (fp32 bits of
    magnitudes, int32) by one atomic max on its bits: non-negative fp32 values (infinity
    and NaN patterns above them) order as their bits do as int32, so the launch leaves
    there the tensor's amax whichever program finishes last, and a NaN anywhere leaves a
    NaN, as the PyTorch path's amax holds one.  The caller zeroes it first (or leaves the
    same tensor's amax there: the maximum taken again is the same)."""
    largest = tl.max(block_amax_bits, axis=0)
    tl.atomic_max(record_ptr.to(tl.pointer_type(tl.int32)), largest, sem="relaxed")


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def quantize_blocks_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    tensor_scale_ptr,
    signs_ptr,
    amax_ptr,
    record_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    blocks,
    index_offset,
    TILING: tl.constexpr,
    STREAM: tl.constexpr,
    SCALE: tl.constexpr,
    ELEMENT: tl.constexpr,
    ROUNDING: tl.constexpr,
    ROTATION: tl.constexpr,
    OUTPUT: tl.constexpr,
):
    """Each program quantizes its tile (`quantize_tile`, which says how): tile
    ``tl.program_id(0)``."""
    quantize_tile(
        tl.program_id(0), x_ptr, codes_ptr, scales_ptr, out_ptr, tensor_scale_ptr, signs_ptr,
        amax_ptr, record_ptr, seed_ptr, offset_ptr, seed_value, offset_value, blocks,
        index_offset, TILING, STREAM, SCALE, ELEMENT, ROUNDING, ROTATION, OUTPUT,
    )  # fmt: skip


@triton.jit
def quantize_tile(
    program, x_ptr, codes_ptr, scales_ptr, out_ptr, tensor_scale_ptr, signs_ptr, amax_ptr,
    record_ptr, seed_ptr, offset_ptr, seed_value, offset_value, blocks, index_offset,
    TILING: tl.constexpr, STREAM: tl.constexpr, SCALE: tl.constexpr, ELEMENT: tl.constexpr,
    ROUNDING: tl.constexpr, ROTATION: tl.constexpr, OUTPUT: tl.constexpr,
):  # fmt: skip
    """Quantize tile ``program`` (taken to int64 here where positions pass int32:
    TILING.WIDE): TILING.TILE blocks of TILING.BLOCK consecutive elements along the last axis
    of a contiguous [rows, cols] x, in a [TILE, GROUPS, 4] tile: each block's amax (an
    integer max of the magnitudes' bits: NaN-aware; SCALE.AMAX_GIVEN: read from
    ``amax_ptr``, a 2-D tile's, shared by its 1-D blocks), its scale by SCALE.RULE
    (`stochround.blocks.scales`, operation for operation: fp32 quotients by
    `tl.math.div_rn`, products as the PyTorch path orders them, clamps as selects that keep
    NaN), the elements scaled and rounded to ELEMENT saturating to its finite range, and
    OUTPUT.KIND stored: codes and scales, the dequantized values in x's dtype, or each
    element times its block scale (a GEMM's operand; with OUTPUT.FLAG_BELOW, in bf16 with
    each block's flag in ``scales_ptr``); with OUTPUT.RECORD, the tile's amax raised into
    ``record_ptr`` (`raise_record`: of the magnitudes it quantizes, a given amax or not).

    Elements round by the core's contract: `fast_round` (one fp32 scaling per element, for
    sign-magnitude formats with zero: fp8, fp6, fp4; modes rne, rna, rz, ru, rd and SR
    variants a and c) or `general_round` (every other format, mode and variant).  SR draws
    the core stream's word of each element's global row-major index (``index_offset`` + its
    flat position), one Philox call per group of four where STREAM.ALIGNED, as the rounding
    kernels do.  With ROTATION.SIZE > 0, a random Hadamard transform of the rows is applied
    in registers first, and the "dequantized" result rotated back.  Compiled without
    multiply-add contraction: every product is rounded as the PyTorch path rounds it."""
    # the choices bound as constexprs where a helper takes them one by one
    BLOCK: tl.constexpr = TILING.BLOCK
    GROUPS: tl.constexpr = TILING.GROUPS
    TILE: tl.constexpr = TILING.TILE
    KIND: tl.constexpr = OUTPUT.KIND
    if TILING.WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    block_id = program * TILING.TILE + tl.arange(0, TILING.TILE)
    group = tl.arange(0, GROUPS)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    column = group * 4 + lane
    position = block_id[:, None, None] * BLOCK + column
    mask = (block_id[:, None, None] < blocks) & (column < BLOCK)
    x = tl.load(x_ptr + position, mask=mask, other=0.0)
    bits = fp32_bits_of(x)
    if ROTATION.SIZE > 0:
        value = rotated(
            bits.to(tl.float32, bitcast=True), signs_ptr, position, ROTATION, INVERSE=False
        )
        value = rotation_rounded(value, OUTPUT.NAN16, x.dtype, ROTATION)
        bits = value.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    if SCALE.AMAX_GIVEN:  # a 2-D tile's amax, one a 1-D block of the tile (fp32)
        given = tl.load(amax_ptr + block_id, mask=block_id < blocks, other=0.0)
        amax_bits = given.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        if OUTPUT.RECORD:
            raise_record(record_ptr, _amax_bits(magnitude))
    else:
        amax_bits = _amax_bits(magnitude)
        if OUTPUT.RECORD:
            raise_record(record_ptr, amax_bits)
    value = bits.to(tl.float32, bitcast=True)
    amax = amax_bits.to(tl.float32, bitcast=True)

    # each block's scale: its stored form (code or fp32), its fp32 value (times the
    # tensor scale: what dequantizing multiplies by), and the scaled fp32 elements
    if SCALE.RULE == "nvfp4":
        stored_scale, block_value, scale_value, multiplier = nvfp4_scale(
            amax, tensor_scale_ptr, SCALE
        )
        scaled = value * multiplier[:, None, None]
    elif SCALE.RULE == "absmax":
        scale_value = tl.math.div_rn(amax, ELEMENT.MAX)
        if OUTPUT.NAN16 != 0:  # the scale is held in x's dtype
            scale_value = narrowed_value(scale_value, x.dtype, OUTPUT.NAN16)
        if x.dtype == tl.bfloat16:
            floor = _ABSMAX_FLOOR_BF16
        elif x.dtype == tl.float16:
            floor = _ABSMAX_FLOOR_FP16
        else:
            floor = _ABSMAX_FLOOR
        scale_value = tl.where(scale_value < floor, floor, scale_value)  # keeps NaN
        stored_scale = scale_value
        block_value = scale_value
        multiplier = tl.math.div_rn(1.0, scale_value)
        scaled = value * multiplier[:, None, None]
    else:
        exponent = e8m0_exponent(amax, SCALE, ELEMENT)
        finite = amax_bits < 0x7F800000
        stored_scale = tl.where(finite, exponent + 127, 255)
        scale_value = nan_where(~finite, fp32_power_of_two(exponent))
        block_value = scale_value
        # x 2**-e as two fp32 products by normal powers of two, as the PyTorch path
        # (`torch_path.scale_by_power_of_two`) multiplies: the same roundings below fp32's
        # normal range.  A non-finite block's second factor is NaN, which makes every
        # product NaN (the PyTorch path's select, per block instead of per element).
        half = (-exponent) >> 1
        second = nan_where(~finite, fp32_power_of_two(-exponent - half))
        scaled = value * fp32_power_of_two(half)[:, None, None]
        scaled = scaled * second[:, None, None]
        if SCALE.RULE == "floor-3/4":
            scaled = scaled * 0.75
    if ELEMENT.SYMMETRIC:  # the element's negative range ends at -max (a select: NaN stays)
        scaled = tl.where(scaled < -ELEMENT.MAX, -ELEMENT.MAX, scaled)
    scaled_bits = scaled.to(tl.int32, bitcast=True)

    if ROUNDING.MODE == "sr":
        seed, offset = seed_and_offset(
            seed_ptr, offset_ptr, seed_value, offset_value, STREAM.FROM_TENSORS
        )
        # the indices made to depend on x's bits (magnitude >> 31 is 0), so that they,
        # the group numbers reduced from them and the words take the layout of x's load
        index = position + index_offset + (magnitude >> 31)
        word = block_tile_words(seed, offset, index, lane, STREAM.ALIGNED)
        r = (word >> (32 - ROUNDING.NBITS)).to(tl.int64)
    else:
        r = bits.to(tl.int64) * 0
    if ROUNDING.FAST_BITS >= 0:
        code, element = fast_round(scaled_bits, r, ROUNDING, ELEMENT)
    else:
        code, element = general_round(scaled_bits, r, ROUNDING, ELEMENT)
    if KIND == "dequantized":
        dequantized = element * scale_value[:, None, None]
        if SCALE.RULE == "floor-3/4":
            dequantized = dequantized * _RESCALE
        if ROTATION.SIZE > 0:
            dequantized = rotated(dequantized, signs_ptr, position, ROTATION, INVERSE=True)
        stored = dequantized
        if OUTPUT.NAN16 != 0:
            dequantized_bits = dequantized.to(tl.int32, bitcast=True)
            stored = narrow_to_16_bits(dequantized_bits, out_ptr.dtype.element_ty, OUTPUT.NAN16)
        store_block_tile(out_ptr, stored, position, mask, program, blocks, BLOCK, GROUPS, TILE)
    elif KIND == "gemm":
        operand = element * block_value[:, None, None]
        if OUTPUT.FLAG_BELOW != 0:
            # a block holding a nonzero value below 2**(mbits - 133) (its lowest bit below
            # bf16's) is flagged and stored times 2**FLAGGED_SHIFT, exactly (its scale is
            # tiny); `operand_bf16.shift_flagged_rows` shifts the rows holding one
            operand_magnitude = operand.to(tl.int32, bitcast=True) & 0x7FFFFFFF
            below = (operand_magnitude > 0) & (operand_magnitude < OUTPUT.FLAG_BELOW)
            flag = tl.max(tl.max(below.to(tl.int32), axis=2), axis=1)
            operand = tl.where(flag[:, None, None] != 0, operand * _FLAGGED_FACTOR, operand)
            tl.store(scales_ptr + block_id, flag.to(tl.uint8), mask=block_id < blocks)
        stored = operand
        if OUTPUT.OUT_NAN16 != 0:  # exact: bf16 only where every product is a bf16 value
            operand_bits = operand.to(tl.int32, bitcast=True)
            stored = narrow_to_16_bits(operand_bits, tl.bfloat16, OUTPUT.OUT_NAN16)
        store_block_tile(out_ptr, stored, position, mask, program, blocks, BLOCK, GROUPS, TILE)
    else:
        _store_codes(codes_ptr, code, block_id, blocks, lane, position, mask, BLOCK, GROUPS, KIND)
        scale_bits = stored_scale.to(scales_ptr.dtype.element_ty)
        tl.store(scales_ptr + block_id, scale_bits, mask=block_id < blocks)


@triton.jit
def _store_codes(
    codes_ptr,
    code,
    block_id,
    blocks,
    lane,
    position,
    mask,
    BLOCK: tl.constexpr,
    GROUPS: tl.constexpr,
    OUTPUT: tl.constexpr,
):
    """Store a [TILE, GROUPS, 4] tile of codes: a group of four as one 32-bit word of byte
    codes ("codes") or one 16-bit word of 4-bit codes, the first in the low nibble
    ("fp4x2"), where BLOCK is a multiple of 4; else a byte per code ("codes" only)."""
    if BLOCK % 4 == 0:
        group = tl.arange(0, GROUPS)[None, :]
        word_index = block_id[:, None] * (BLOCK // 4) + group
        word_mask = (block_id[:, None] < blocks) & (group < BLOCK // 4)
        if OUTPUT == "codes":
            words = codes_ptr.to(tl.pointer_type(tl.int32))
            packed = tl.sum((code & 0xFF) << (lane * 8), axis=2)
        else:
            words = codes_ptr.to(tl.pointer_type(tl.int16))
            packed = tl.sum((code & 0xF) << (lane * 4), axis=2).to(tl.int16)
        tl.store(words + word_index, packed, mask=word_mask)
    else:
        tl.static_assert(OUTPUT == "codes", "fp4 codes pack blocks of a multiple of 4")
        tl.store(codes_ptr + position, code.to(tl.uint8), mask=mask)


__all__ = [
    "BLOCK_OUTPUTS",
    "BlockOutput",
    "BlockStream",
    "BlockTiling",
    "QuantizeTiling",
    "check_tiling",
    "quantize_blocks_kernel",
    "quantize_tile",
    "quantize_tiling",
    "raise_record",
]
