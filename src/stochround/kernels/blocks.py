"""A fused Triton block quantizer, bit-identical to the PyTorch path of `stochround.blocks`.

`quantize_blocks` makes one pass over x: each program loads a tile of whole blocks (1-D
blocks of ``block`` consecutive elements along the last axis of a contiguous [rows, cols]
view), takes each block's amax (an integer max of the magnitudes' bits: NaN-aware), derives
the block's scale by the scale rule (`stochround.blocks.scales`, operation for operation:
fp32 quotients by `tl.math.div_rn`, products as the PyTorch path orders them, clamps as
selects that keep NaN), scales the elements, rounds them to the element format saturating
to its finite range, and stores the codes and the scales.  `fake_quantize_blocks` stores
the dequantized values in x's dtype instead (`fake_quantize` in one pass), `gemm_blocks`
each element times its block scale (a GEMM's operand), and
`tensor_amax` reads x once for NVFP4's tensor scale, which the kernel then reads from
device memory (no host synchronization).  With ``rht``, a random Hadamard transform of the
rows (`stochround.blocks.hadamard`'s fp32 butterfly) is applied in registers first.

Elements round by the core's contract: `_fast_round` (one fp32 scaling per element, the
rounding kernels' method, for sign-magnitude formats with zero: fp8, fp6, fp4; modes rne,
rna, rz, ru, rd and SR variants a and c) or the core's general `rounded_fp32_bits` (every
other format, mode and variant).  SR draws the core stream's word of each element's global
row-major index (``index_offset`` + its flat position), as the rounding kernels do, so the
kernel and the PyTorch path agree bit for bit on any device.  The kernel is compiled
without multiply-add contraction: every product is rounded as the PyTorch path rounds it.

The tile is [TILE, GROUPS, 4]: TILE blocks, each cut into groups of four consecutive
elements, one Philox call per group where the groups are aligned with the stream's
(``index_offset`` and ``block`` multiples of 4).  Codes are stored a group at a time, one
32-bit word of four byte codes, or one 16-bit word of four packed fp4 codes.

Kernel choices are string constexprs: SCALE_RULE in `block_constants.SCALE_RULES`, FLAVOUR in
`block_constants.NVFP4_FLAVOURS`, MODE in `stochround.reference.MODES`, VARIANT in
`stochround.reference.VARIANTS`, OUTPUT in `BLOCK_OUTPUTS`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import libdevice

from ..block_constants import (
    ABSMAX_FLOORS,
    E4M3_EPS,
    FLT_MAX,
    HADAMARD_SIZES,
    NVFP4_FLAVOURS,
    ONE_SIXTH,
    RESCALE,
    SCALE_RULES,
    SQRT2_FP32,
    fp32,
)
from ..formats import Format
from ..formats import format as find_format
from ..random import seed_tensor
from ..reference import MODES, VARIANTS, check_choice, check_rbits
from .availability import INTERPRETED
from .common import (
    INPUT_DTYPES,
    NAN16_BITS,
    as_int64,
    block_tile_words,
    encode_bits,
    format_constants,
    fp32_bits_of,
    kernel_supports,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    seed_and_offset,
    sign_bit,
)
from .grid import cdiv, next_power_of_2
from .runtime import bound_launch, current_device

# what the kernel writes: element codes one a byte, fp4 codes two a byte (low nibble
# first), the dequantized values in x's dtype, or a GEMM's operand: each element times its
# block scale alone (the tensor scale and floor-3/4's factor left to the GEMM's result, the
# values left in the rotated basis), in bf16 or fp32
BLOCK_OUTPUTS = ("codes", "fp4x2", "dequantized", "gemm")
# elements a program handles (a power of two): enough to hide the memory latency; the
# interpreter runs programs one after another, so there a larger tile costs less
TILE_ELEMENTS = 2**14 if INTERPRETED else 2**12
# element formats whose most negative code quantization never stores: MXINT8's grid
# (`stochround.blocks.formats.OCP_INT8`), clamped to the symmetric [-max, max]
SYMMETRIC_ELEMENTS = ("ocp_int8",)
# warps a program runs; both are read at each launch, so a benchmark can sweep them
_NUM_WARPS = 4
# compiled kernels call libdevice's conversions; the interpreter has none
_NATIVE_CONVERSIONS = tl.constexpr(not INTERPRETED)


# the fp32 constants of `stochround.block_constants` as the kernels read them (constexpr)
_FLT_MAX = tl.constexpr(FLT_MAX)
_ONE_SIXTH = tl.constexpr(ONE_SIXTH)
_E4M3_EPS = tl.constexpr(E4M3_EPS)
_ABSMAX_FLOOR = tl.constexpr(ABSMAX_FLOORS[torch.float32])
_ABSMAX_FLOOR_BF16 = tl.constexpr(ABSMAX_FLOORS[torch.bfloat16])
_ABSMAX_FLOOR_FP16 = tl.constexpr(ABSMAX_FLOORS[torch.float16])
_RESCALE = tl.constexpr(fp32(RESCALE))


@triton.jit
def _amax_bits(magnitude):
    """Each block's max |x| as fp32 bits (int32) from the [TILE, GROUPS, 4] magnitudes
    (fp32 bits without the sign): an integer max orders finite values, infinity and NaN
    as their values do, and any NaN in a block wins (its patterns lie above infinity)."""
    return tl.max(tl.max(magnitude, axis=2), axis=1)


@triton.jit
def _nan_where(condition, value):
    """fp32 ``value`` with NaN where ``condition`` holds (selected by its bits: a NaN
    constant cannot be a shared constexpr, as NaN equals nothing)."""
    bits = tl.where(condition, 0x7FC00000, value.to(tl.int32, bitcast=True))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _power_of_two(exponent):
    """fp32 2**exponent for integer exponents in [-149, 127], built from its bits (2**-127
    .. 2**-149 are subnormal)."""
    normal = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    subnormal = (1 << tl.maximum(exponent + 149, 0)).to(tl.float32, bitcast=True)
    return tl.where(exponent >= -126, normal, subnormal)


@triton.jit
def _e8m0_exponent(
    amax,
    EMAX: tl.constexpr,
    ELEMENT_MAX: tl.constexpr,
    MBITS: tl.constexpr,
    SCALE_RULE: tl.constexpr,
):
    """The exponent e in [-127, 127] of each block's E8M0 scale 2**e from its amax (fp32),
    as `stochround.blocks.scales.power_of_two_exponent` computes it: with q = amax (rceil:
    the fp32 quotient amax / max) and E = floor(log2 q), exactly for subnormal q too,
    "floor" E - emax; "ceil" E + [q no power of two] - emax; "rceil" E + [q no power of
    two]; "even" E + [q's significand rounds up to 2 at mbits fraction bits, ties away]
    - emax; "floor-3/4" as floor.  Zero and non-finite q give -127."""
    if SCALE_RULE == "rceil":
        q = tl.math.div_rn(amax, ELEMENT_MAX)
    else:
        q = amax
    bits = q.to(tl.int32, bitcast=True)
    regular = (bits > 0) & (bits < 0x7F800000)
    subnormal = (bits >> 23) == 0
    # a subnormal q times 2**64 is normal and exact: its fraction bits are frexp's
    normalized = tl.where(subnormal, q * 18446744073709551616.0, q).to(tl.int32, bitcast=True)
    exponent = (normalized >> 23) - 127 - tl.where(subnormal, 64, 0)
    fraction = normalized & 0x7FFFFF
    if SCALE_RULE == "ceil" or SCALE_RULE == "rceil":
        exponent = exponent + (fraction != 0).to(tl.int32)
    elif SCALE_RULE == "even":
        exponent = exponent + (fraction >= (1 << 23) - (1 << (22 - MBITS))).to(tl.int32)
    else:
        tl.static_assert(
            SCALE_RULE == "floor" or SCALE_RULE == "floor-3/4", "SCALE_RULE must be an E8M0 rule"
        )
    if SCALE_RULE != "rceil":
        exponent = exponent - EMAX
    exponent = tl.where(regular, exponent, -127)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def _nearest_integer(v):
    """Nonnegative fp32 values rounded to the nearest integer, ties to even, as uint64."""
    if _NATIVE_CONVERSIONS:  # one conversion (cvt.rni.u64.f32)
        return libdevice.float2ull_rn(v).to(tl.uint64, bitcast=True)
    # the interpreter has no libdevice: every fp32 value from 2**23 up is an integer, and
    # below, adding 2**23 rounds to one, half to even
    return tl.where(v < 8388608.0, (v + 8388608.0) - 8388608.0, v).to(tl.uint64)


@triton.jit
def _fast_round(
    bits,
    r,
    MODE: tl.constexpr,
    VARIANT: tl.constexpr,
    NBITS: tl.constexpr,
    B: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    MAX_BITS: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    HAS_NEGATIVE_ZERO: tl.constexpr,
    NAN_CODE: tl.constexpr,
):
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
    kept + away = floor((rne(v) + r) / 2**n) (kept 2**n is an integer, so rounding v
    rounds nu 2**n, half to even).  NaN gives NAN_CODE and NaN.  B: `fast_bits`."""
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    clamped_magnitude = tl.minimum(magnitude, MAX_BITS)
    field = tl.maximum(clamped_magnitude >> 23, EMIN + 127)
    # 2**(B - q) = 2**(B + mbits + 127 - field), an fp32 normal power of two
    scale = ((254 + B + MBITS - field) << 23).to(tl.float32, bitcast=True)
    v = clamped_magnitude.to(tl.float32, bitcast=True) * scale
    if MODE == "sr":
        if VARIANT == "a":
            count = v.to(tl.uint64)
            noise = r.to(tl.uint64) << (32 - NBITS)
        else:
            tl.static_assert(VARIANT == "c", "the fast path rounds SR variants a and c")
            count = _nearest_integer(v)
            noise = r.to(tl.uint64)
        total = ((count + noise) >> B).to(tl.int32)
    else:
        kept = v.to(tl.int32)
        fraction = v - kept.to(tl.float32)
        negative = bits < 0
        if MODE == "rne":
            away = (fraction > 0.5) | ((fraction == 0.5) & ((kept & 1) == 1))
        elif MODE == "rna":
            away = fraction >= 0.5
        elif MODE == "rz":
            away = fraction < 0.0
        elif MODE == "ru":
            away = (fraction > 0.0) & ~negative
        else:
            tl.static_assert(MODE == "rd", "the fast path rounds rne, rna, rz, ru, rd and sr")
            away = (fraction > 0.0) & negative
        total = kept + away.to(tl.int32)
    code = ((field + (BIAS - 128)) << MBITS) + total
    code = code | sign_bit(bits, code, SIGN_SHIFT, HAS_NEGATIVE_ZERO)
    # the value total 2**q: exact (a small integer times a normal power of two)
    value = total.to(tl.float32) * ((field - MBITS) << 23).to(tl.float32, bitcast=True)
    # x's sign as a bit (a float negation is 0 - v in Triton, which loses -0)
    value = (value.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)
    if not HAS_NEGATIVE_ZERO:
        value = tl.where(total != 0, value, 0.0)
    return tl.where(is_nan, NAN_CODE, code), _nan_where(is_nan, value)


@triton.jit
def _e4m3(value):
    """fp32 values rounded to nearest even into E4M3FN, saturating to +-448: their codes
    (NaN: 0x7F) and fp32 values (`_fast_round`, which rounds as the core does)."""
    bits = value.to(tl.int32, bitcast=True)
    return _fast_round(bits, bits * 0, "rne", "c", 32, 0, 3, -6, 7, 0x43E00000, 7, True, 0x7F)


@triton.jit
def _nvfp4_scale(amax, tensor_scale_ptr, FLAVOUR: tl.constexpr, TENSOR_SCALE: tl.constexpr):
    """Each block's NVFP4 scale (E4M3 code), its E4M3 value, that value times the decoding
    tensor scale and the elements' fp32 multiplier, in the flavour's operation order
    (`stochround.blocks.scales.nvfp4_scales`); TENSOR_SCALE: how many fp32 values
    ``tensor_scale_ptr`` holds: 0 (single-level), 1 (S_dec, and S_enc = 1 / S_dec) or 2
    (S_dec, then S_enc).  "te": s = e4m3(min(amax * (S_enc * fp32(1/6)), 448)), multiplier
    min(1 / (s * S_dec), FLT_MAX);
    "torchao": s = e4m3(clamp(amax / 6 / t, 2**-6, 448)), multiplier (1 / t) / s.  Clamps
    are selects, which keep NaN as the PyTorch path does."""
    if TENSOR_SCALE > 0:
        decode = tl.load(tensor_scale_ptr)
    if FLAVOUR == "te":
        if TENSOR_SCALE == 2:
            multiplier = tl.load(tensor_scale_ptr + 1) * _ONE_SIXTH
        elif TENSOR_SCALE == 1:
            multiplier = tl.math.div_rn(1.0, decode) * _ONE_SIXTH
        else:
            multiplier = _ONE_SIXTH
        # e4m3 rounding saturates: FLT_MAX's and 448's clamps give 448 as it does
        code, scale = _e4m3(amax * multiplier)
        block_value = scale
        if TENSOR_SCALE > 0:
            scale = scale * decode
        inverse = tl.math.div_rn(1.0, scale)
        inverse = tl.where(inverse > _FLT_MAX, _FLT_MAX, inverse)
    else:
        tl.static_assert(FLAVOUR == "torchao", "FLAVOUR must be te or torchao")
        wanted = tl.math.div_rn(amax, 6.0)
        if TENSOR_SCALE > 0:
            wanted = tl.math.div_rn(wanted, decode)
        code, scale = _e4m3(tl.where(wanted < _E4M3_EPS, _E4M3_EPS, wanted))
        block_value = scale
        if TENSOR_SCALE > 0:
            inverse = tl.math.div_rn(tl.math.div_rn(1.0, decode), scale)
            scale = scale * decode
        else:
            inverse = tl.math.div_rn(1.0, scale)
    return code, block_value, scale, inverse


@triton.jit
def _narrowed_value(value, dtype: tl.constexpr, NAN16: tl.constexpr):
    """fp32 values rounded to nearest even in bf16 or fp16 (``dtype``), back in fp32
    (bf16 widened with integer operations: the interpreter's conversion flushes
    subnormals)."""
    narrow = narrow_to_16_bits(value.to(tl.int32, bitcast=True), dtype, NAN16)
    return fp32_bits_of(narrow).to(tl.float32, bitcast=True)


@triton.jit
def _butterfly_stage(v, H: tl.constexpr, N: tl.constexpr):
    """One butterfly stage on the flat fp32 tile ``v`` (N values): in each run of 2H
    consecutive values, the pair (a, b) = (v[j], v[j + H]) becomes (a + b, a - b)."""
    pairs = tl.permute(tl.reshape(v, (N // (2 * H), 2, H)), (0, 2, 1))
    a, b = tl.split(pairs)
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (N,))


@triton.jit
def _butterfly(v, LOG_SIZE: tl.constexpr, N: tl.constexpr):
    """The unnormalized fast Walsh-Hadamard transform of each run of 2**LOG_SIZE (16 ..
    256) consecutive values of the flat fp32 tile ``v`` (N values): stages h = 1, 2, 4, ...
    in order (`_butterfly_stage`), as `stochround.blocks.hadamard.hadamard_fp32` computes
    it (fp32 additions, no products)."""
    v = _butterfly_stage(v, 1, N)
    v = _butterfly_stage(v, 2, N)
    v = _butterfly_stage(v, 4, N)
    v = _butterfly_stage(v, 8, N)
    if LOG_SIZE > 4:
        v = _butterfly_stage(v, 16, N)
    if LOG_SIZE > 5:
        v = _butterfly_stage(v, 32, N)
    if LOG_SIZE > 6:
        v = _butterfly_stage(v, 64, N)
    if LOG_SIZE > 7:
        v = _butterfly_stage(v, 128, N)
    return v


@triton.jit
def _rotated(
    value,
    signs_ptr,
    position,
    RHT: tl.constexpr,
    RHT_LOG: tl.constexpr,
    NORM: tl.constexpr,
    INVERSE: tl.constexpr,
):
    """The random Hadamard transform of each RHT consecutive values of a [TILE, GROUPS, 4]
    fp32 tile of consecutive values of x (GROUPS * 4 a power of two, RHT dividing the
    tile's size and x's rows): the signs (of flat ``position`` mod RHT), the butterfly,
    the normalization NORM; INVERSE: the butterfly, NORM, then the signs."""
    shape: tl.constexpr = value.shape
    count: tl.constexpr = shape[0] * shape[1] * shape[2]
    signs = tl.load(signs_ptr + position % RHT)
    if not INVERSE:
        value = value * signs
    flat = _butterfly(tl.reshape(value, (count,)), RHT_LOG, count) * NORM
    value = tl.reshape(flat, (shape[0], shape[1], shape[2]))
    if INVERSE:
        value = value * signs
    return value


@triton.jit
def _rotation_rounded(value, NAN16: tl.constexpr, X_DTYPE: tl.constexpr, RHT_BF16: tl.constexpr):
    """The rotated fp32 values as `stochround.blocks.quantize` holds them: rounded to x's
    dtype (16-bit x), then to bf16 with RHT_BF16."""
    if NAN16 != 0:
        value = _narrowed_value(value, X_DTYPE, NAN16)
    if RHT_BF16:
        value = _narrowed_value(value, tl.bfloat16, 0x7FC0)
    return value


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _quantize_blocks_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    tensor_scale_ptr,
    signs_ptr,
    amax_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    blocks,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    AMAX_GIVEN: tl.constexpr,
    OUT_NAN16: tl.constexpr,
    ALIGNED: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUPS: tl.constexpr,
    TILE: tl.constexpr,
    SCALE_RULE: tl.constexpr,
    FLAVOUR: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    EMAX: tl.constexpr,
    ELEMENT_MAX: tl.constexpr,
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
    NAN16: tl.constexpr,
    FAST_BITS: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    RHT: tl.constexpr,
    RHT_LOG: tl.constexpr,
    RHT_NORM: tl.constexpr,
    RHT_BF16: tl.constexpr,
):
    """Quantize TILE blocks of BLOCK elements (module docstring); RHT > 0: rotate them
    first (`_rotated`), and for OUTPUT "dequantized" rotate the result back.  AMAX_GIVEN:
    each block's amax is read from ``amax_ptr`` (a 2-D tile's, shared by its 1-D blocks)
    instead of taken from its elements; OUT_NAN16: the NaN of the bf16 "gemm" output (0:
    fp32)."""
    program = tl.program_id(0)
    if WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    block_id = program * TILE + tl.arange(0, TILE)
    group = tl.arange(0, GROUPS)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    column = group * 4 + lane
    position = block_id[:, None, None] * BLOCK + column
    mask = (block_id[:, None, None] < blocks) & (column < BLOCK)
    x = tl.load(x_ptr + position, mask=mask, other=0.0)
    bits = fp32_bits_of(x)
    if RHT > 0:
        rotated = _rotated(
            bits.to(tl.float32, bitcast=True), signs_ptr, position, RHT, RHT_LOG, RHT_NORM, False
        )
        rotated = _rotation_rounded(rotated, NAN16, x.dtype, RHT_BF16)
        bits = rotated.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    if AMAX_GIVEN:  # a 2-D tile's amax, one a 1-D block of the tile (fp32)
        given = tl.load(amax_ptr + block_id, mask=block_id < blocks, other=0.0)
        amax_bits = given.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    else:
        amax_bits = _amax_bits(magnitude)
    value = bits.to(tl.float32, bitcast=True)
    amax = amax_bits.to(tl.float32, bitcast=True)

    # each block's scale: its stored form (code or fp32), its fp32 value (times the
    # tensor scale: what dequantizing multiplies by), and the scaled fp32 elements
    if SCALE_RULE == "nvfp4":
        stored_scale, block_value, scale_value, multiplier = _nvfp4_scale(
            amax, tensor_scale_ptr, FLAVOUR, TENSOR_SCALE
        )
        scaled = value * multiplier[:, None, None]
    elif SCALE_RULE == "absmax":
        scale_value = tl.math.div_rn(amax, ELEMENT_MAX)
        if NAN16 != 0:  # the scale is held in x's dtype
            scale_value = _narrowed_value(scale_value, x.dtype, NAN16)
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
        exponent = _e8m0_exponent(amax, EMAX, ELEMENT_MAX, MBITS, SCALE_RULE)
        finite = amax_bits < 0x7F800000
        stored_scale = tl.where(finite, exponent + 127, 255)
        scale_value = _nan_where(~finite, _power_of_two(exponent))
        block_value = scale_value
        # x 2**-e as two fp32 products by normal powers of two, as the PyTorch path
        # (`torch_path.scale_by_power_of_two`) multiplies: the same roundings below fp32's
        # normal range.  A non-finite block's second factor is NaN, which makes every
        # product NaN (the PyTorch path's select, per block instead of per element).
        half = (-exponent) >> 1
        second = _nan_where(~finite, _power_of_two(-exponent - half))
        scaled = value * _power_of_two(half)[:, None, None]
        scaled = scaled * second[:, None, None]
        if SCALE_RULE == "floor-3/4":
            scaled = scaled * 0.75
    if SYMMETRIC:  # the element's negative range ends at -max (a select: NaN stays)
        scaled = tl.where(scaled < -ELEMENT_MAX, -ELEMENT_MAX, scaled)
    scaled_bits = scaled.to(tl.int32, bitcast=True)

    if MODE == "sr":
        seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
        # the indices made to depend on x's bits (magnitude >> 31 is 0), so that they,
        # the group numbers reduced from them and the words take the layout of x's load
        index = position + index_offset + (magnitude >> 31)
        word = block_tile_words(seed, offset, index, lane, ALIGNED)
        r = (word >> (32 - NBITS)).to(tl.int64)
    else:
        r = bits.to(tl.int64) * 0
    if FAST_BITS >= 0:
        code, element = _fast_round(
            scaled_bits,
            r,
            MODE,
            VARIANT,
            NBITS,
            FAST_BITS,
            MBITS,
            EMIN,
            BIAS,
            MAX_BITS,
            SIGN_SHIFT,
            HAS_NEGATIVE_ZERO,
            NAN_CODE,
        )
    else:
        result = rounded_fp32_bits(
            scaled_bits,
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
        element = result.to(tl.float32, bitcast=True)
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
    if OUTPUT == "dequantized":
        dequantized = element * scale_value[:, None, None]
        if SCALE_RULE == "floor-3/4":
            dequantized = dequantized * _RESCALE
        if RHT > 0:
            dequantized = _rotated(dequantized, signs_ptr, position, RHT, RHT_LOG, RHT_NORM, True)
        if NAN16 == 0:
            tl.store(out_ptr + position, dequantized, mask=mask)
        else:
            dequantized_bits = dequantized.to(tl.int32, bitcast=True)
            narrow = narrow_to_16_bits(dequantized_bits, out_ptr.dtype.element_ty, NAN16)
            tl.store(out_ptr + position, narrow, mask=mask)
    elif OUTPUT == "gemm":
        operand = element * block_value[:, None, None]
        if OUT_NAN16 == 0:
            tl.store(out_ptr + position, operand, mask=mask)
        else:  # exact: the caller asks for bf16 only where every product is a bf16 value
            narrow = narrow_to_16_bits(operand.to(tl.int32, bitcast=True), tl.bfloat16, OUT_NAN16)
            tl.store(out_ptr + position, narrow, mask=mask)
    else:
        _store_codes(codes_ptr, code, block_id, blocks, lane, position, mask, BLOCK, GROUPS, OUTPUT)
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


def fast_bits(fmt: Format, mode: str, n: int, variant: str) -> int:
    """The B of `_fast_round` where it rounds these choices exactly, else -1 (the core's
    general `rounded_fp32_bits`): sign-magnitude formats with zero and mbits >= 1 (fp8,
    fp6, fp4), the modes rne, rna, rz, ru, rd, and SR variants a (B = 32) and c (B = n)."""
    if not (fmt.signed and not fmt.twos_complement and fmt.has_zero and fmt.mbits >= 1):
        return -1
    if mode in ("rne", "rna", "rz", "ru", "rd"):
        return 0
    if mode == "sr" and variant in ("a", "c"):
        return 32 if variant == "a" else n
    return -1


def _run(
    kernel: triton.JITFunction, programs: int, x: Tensor, *args: object, **constants: object
) -> None:
    """``kernel[(programs,)](*args, **constants)`` on x's device (the current one), through
    its `Launch` for these constants."""
    device = x.device.index if x.is_cuda else -1
    bound_launch(kernel, tuple(constants.items()))(device, programs, *args)


@functools.cache
def _element_constants(fmt: Format, mode: str, n: int, variant: str) -> Mapping[str, object]:
    """The element format's launch constants, saturating to its finite range (made once
    per choice: a launch on the hot path reads them)."""
    return MappingProxyType(
        {
            **format_constants(fmt),
            **overflow_bits(fmt, mode, "finite"),
            "ELEMENT_MAX": fmt.max,
            "SIGN_SHIFT": fmt.ebits + fmt.mbits,
            "FAST_BITS": fast_bits(fmt, mode, n, variant),
        }
    )


@triton.jit
def _amax_kernel(
    x_ptr,
    partial_ptr,
    signs_ptr,
    count,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    RHT: tl.constexpr,
    RHT_LOG: tl.constexpr,
    RHT_NORM: tl.constexpr,
    RHT_BF16: tl.constexpr,
    NAN16: tl.constexpr,
):
    """Each program's max |x| over BLOCK elements (of x rotated as `_quantize_blocks_kernel`
    rotates it, with RHT > 0), as fp32 bits (int32): an integer max of the magnitudes'
    bits, so a NaN anywhere gives a NaN pattern."""
    program = tl.program_id(0)
    if WIDE:
        program = program.to(tl.int64)
    group = tl.arange(0, BLOCK // 4)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    position = program * BLOCK + group * 4 + lane
    x = tl.load(x_ptr + position, mask=position < count, other=0.0)
    bits = fp32_bits_of(x)
    if RHT > 0:
        rotated = _rotated(
            bits.to(tl.float32, bitcast=True), signs_ptr, position, RHT, RHT_LOG, RHT_NORM, False
        )
        rotated = _rotation_rounded(rotated, NAN16, x.dtype, RHT_BF16)
        bits = rotated.to(tl.int32, bitcast=True)
    tl.store(
        partial_ptr + program, tl.max(tl.max(tl.max(bits & 0x7FFFFFFF, axis=2), axis=1), axis=0)
    )


# elements an amax program reads
AMAX_BLOCK = 2**14 if INTERPRETED else 2**13


def rht_normalization(size: int) -> float:
    """The fp32 normalization of a Hadamard transform of ``size`` values, as
    `stochround.blocks.hadamard.NORMALIZATION` holds it: 2**(-log2(size)/2), exact for even
    log2(size), else fp32(sqrt(2)) times a power of two."""
    log_size = size.bit_length() - 1
    if log_size % 2 == 0:
        return math.ldexp(1.0, -log_size // 2)
    return math.ldexp(SQRT2_FP32, -(log_size + 1) // 2)


def _rotation_constants(
    x: Tensor, rht: int | None, signs: Tensor | None, rht_bf16: bool, tile: int
) -> tuple[Tensor | None, dict[str, object]]:
    """The signs pointer and constexprs of a rotation of ``rht`` values (None: none), its
    arguments checked (ValueError naming them): RHT one of `HADAMARD_SIZES` dividing x's rows and
    a kernel tile of ``tile`` elements, ``signs`` its fp32 ±1 signs on x's device."""
    if rht is None:
        if signs is not None or rht_bf16:
            raise ValueError("rht_signs and rht_bf16 apply with rht= (the Hadamard size)")
        return None, {"RHT": 0, "RHT_LOG": 0, "RHT_NORM": 1.0, "RHT_BF16": False}
    if rht not in HADAMARD_SIZES:
        raise ValueError(f"rht must be one of {', '.join(map(str, HADAMARD_SIZES))}; got {rht!r}")
    if x.shape[-1] % rht or tile % rht:
        raise ValueError(f"rht={rht} must divide x's rows ({x.shape[-1]}) and the kernel's tile")
    if (
        not isinstance(signs, Tensor)
        or signs.dtype != torch.float32
        or tuple(signs.shape) != (rht,)
        or signs.device != x.device
    ):
        raise ValueError(f"rht_signs must be a float32 tensor of {rht} signs on x's device")
    constants: dict[str, object] = {
        "RHT": rht,
        "RHT_LOG": rht.bit_length() - 1,
        "RHT_NORM": rht_normalization(rht),
        "RHT_BF16": bool(rht_bf16),
    }
    return signs, constants


def _partial_maxima(x: Tensor, rht: int | None, rht_signs: Tensor | None, rht_bf16: bool) -> Tensor:
    """Each `_amax_kernel` program's max |x| (rotated with ``rht``), fp32 bits as int32
    (one 0 for an empty x)."""
    if not isinstance(x, Tensor) or x.dtype not in INPUT_DTYPES or not x.is_contiguous():
        raise ValueError("x must be a contiguous float32, bfloat16 or float16 tensor")
    signs, rotation = _rotation_constants(x, rht, rht_signs, rht_bf16, AMAX_BLOCK)
    count = x.numel()
    if count == 0:
        return x.new_zeros(1, dtype=torch.int32)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return _partial_maxima(x, rht, rht_signs, rht_bf16)
    programs = cdiv(count, AMAX_BLOCK)
    partial = x.new_empty(programs, dtype=torch.int32)
    _run(
        _amax_kernel,
        programs,
        x,
        x,
        partial,
        signs,
        count,
        BLOCK=AMAX_BLOCK,
        WIDE=count + AMAX_BLOCK >= 2**31,
        NAN16=NAN16_BITS.get(x.dtype, 0),
        **rotation,
        enable_fp_fusion=False,
    )
    return partial


def tensor_amax(
    x: Tensor,
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
) -> Tensor:
    """max |x| of a contiguous fp32, bf16 or fp16 tensor as a 0-d fp32 tensor on x's
    device (NaN if x holds NaN, 0 for an empty x), equal to ``x.abs().amax()`` in fp32:
    one read of x (partial maxima of the magnitudes' bits, then their max), no
    temporary |x| and no host synchronization.  With ``rht``, ``rht_signs`` and
    ``rht_bf16`` (as `quantize_blocks` takes them): the max of x rotated along its last
    axis, as `quantize_blocks` rotates it.  `nvfp4_tensor_scale` also gives NVFP4's
    tensor scale from it, in one more launch."""
    return _partial_maxima(x, rht, rht_signs, rht_bf16).amax().view(torch.float32)


@triton.jit
def _tensor_scale_kernel(
    partial_ptr,
    amax_ptr,
    scale_ptr,
    count,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    FLAVOUR: tl.constexpr,
):
    """One program: the max of ``count`` partial maxima (fp32 bits, int32; STEPS x BLOCK
    of them cover ``count``), stored as the tensor's amax, and NVFP4's tensor scales from
    it, S_dec then S_enc (`stochround.blocks.scales.nvfp4_tensor_scales`): "te" S_enc =
    min(2688 / amax, FLT_MAX), 1 where amax is 0 or not finite (or S_enc is 0), and S_dec
    = 1 / S_enc; "torchao" S_dec = amax / 2688, 1 where amax is 0 or not finite, and
    S_enc = 1 / S_dec."""
    best = tl.zeros((BLOCK,), dtype=tl.int32)
    for step in tl.static_range(STEPS):
        position = step * BLOCK + tl.arange(0, BLOCK)
        best = tl.maximum(best, tl.load(partial_ptr + position, mask=position < count, other=0))
    amax_bits = tl.max(best, axis=0)
    amax = amax_bits.to(tl.float32, bitcast=True)
    bad = (amax_bits == 0) | (amax_bits >= 0x7F800000)
    if FLAVOUR == "te":
        encode = tl.math.div_rn(2688.0, amax)
        encode = tl.where(encode > _FLT_MAX, _FLT_MAX, encode)
        encode = tl.where(bad | (encode == 0.0), 1.0, encode)
        scale = tl.math.div_rn(1.0, encode)
    else:
        tl.static_assert(FLAVOUR == "torchao", "FLAVOUR must be te or torchao")
        scale = tl.where(bad, 1.0, tl.math.div_rn(amax, 2688.0))
        encode = tl.math.div_rn(1.0, scale)
    tl.store(amax_ptr, amax)
    tl.store(scale_ptr, scale)
    tl.store(scale_ptr + 1, encode)


def nvfp4_tensor_scale(
    x: Tensor,
    flavour: str = "te",
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4's tensor scales of x, S_dec and S_enc (a 2-element fp32 tensor), and x's amax
    (0-d fp32), on x's device, in two launches and one read of x (no host
    synchronization): `tensor_amax`'s partial maxima, then one program reducing them and
    computing the flavour's scales, equal to the `decode` and `encode` of
    ``stochround.blocks.scales.nvfp4_tensor_scales(x.abs().amax(), flavour)``.  ``flavour``
    "te" or "torchao"; the rotation as `tensor_amax` takes it.  Returns (scales, amax):
    `quantize_blocks` takes the scales as its ``tensor_scale``."""
    check_choice("flavour", flavour, NVFP4_FLAVOURS)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return nvfp4_tensor_scale(x, flavour, rht=rht, rht_signs=rht_signs, rht_bf16=rht_bf16)
    partial = _partial_maxima(x, rht, rht_signs, rht_bf16)
    amax = x.new_empty((), dtype=torch.float32)
    scale = x.new_empty(2, dtype=torch.float32)
    block = min(next_power_of_2(partial.numel()), 1024)
    steps = cdiv(partial.numel(), block)
    _run(
        _tensor_scale_kernel,
        1,
        x,
        partial,
        amax,
        scale,
        partial.numel(),
        BLOCK=block,
        STEPS=next_power_of_2(steps),
        FLAVOUR=flavour,
        enable_fp_fusion=False,
    )
    return scale, amax


def quantize_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    output: str = "codes",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Quantize the 1-D blocks of ``block`` consecutive elements along the last axis of a
    contiguous 2-D ``x`` (fp32, bf16 or fp16) in one pass (module docstring), as
    `stochround.blocks.quantize`'s PyTorch path computes them, bit for bit.

    Arguments: ``element`` the element format (a `Format` or its name; its codes at most
    8 bits); ``block`` the block length, dividing x's last dimension (the row's length for
    row-wise scales); ``scale_rule`` one of `SCALE_RULES` (E8M0 scales for the
    power-of-two rules, E4M3 for "nvfp4", fp32 for "absmax");  ``tensor_scale`` NVFP4's
    fp32 tensor scales on x's device that the kernel reads (no host synchronization):
    one element (S_dec; S_enc = 1 / S_dec) or two (S_dec, S_enc: `nvfp4_tensor_scale`'s),
    or None (single-level); ``mode`` (`stochround.reference.MODES`),
    ``n`` (random bits, 32 for exact SR) and ``variant`` (a, b, c, odd) the core's rounding
    choices for the elements, which saturate to the element's finite range; ``seed`` and
    ``offset`` the stream (ints in [0, 2**64) or one-element int64 tensors); ``index_offset``
    the global row-major index of x's first element (SR draws the word of index
    ``index_offset + i`` for x's flat element i); ``nvfp4_flavour`` "te" or "torchao";
    ``output`` "codes" (one code a byte) or "fp4x2" (two 4-bit codes a byte, low nibble
    first, along the last axis; ``block`` a multiple of 4); ``rht`` the size of a random
    Hadamard transform applied along the rows first (`stochround.blocks.hadamard`'s fp32
    arithmetic, the result rounded to x's dtype and with ``rht_bf16`` to bf16), one of
    `HADAMARD_SIZES`, with ``block`` a power of two and not the "absmax" rule; ``rht_signs``
    its fp32 ±1 signs on x's device; ``amax`` each block's amax (fp32, one a block, on
    x's device) to use instead of the block's own: 2-D tiles quantized as the 1-D blocks
    of their rows, each given its tile's amax (no ``rht``).

    Returns (codes, scales): codes uint8 [rows, cols] ([rows, cols / 2] for "fp4x2"),
    scales [rows, cols / block]: uint8 E8M0 or E4M3 codes, or for "absmax" fp32 values (of
    the scale held in x's dtype).
    """
    if output not in ("codes", "fp4x2"):
        raise ValueError(f"output must be 'codes' or 'fp4x2'; got {output!r}")
    fmt = _check_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    if fmt.bits > 8:
        raise ValueError(f"element codes are at most 8 bits; {fmt.name} has {fmt.bits}")
    if output == "fp4x2" and (block % 4 or fmt.bits != 4):
        raise ValueError(
            f"fp4x2 packs 4-bit codes of blocks of a multiple of 4; got {fmt.name}, block {block}"
        )
    rows, cols = x.shape
    codes = x.new_empty(rows, cols // 2 if output == "fp4x2" else cols, dtype=torch.uint8)
    scale_dtype = torch.float32 if scale_rule == "absmax" else torch.uint8
    scales = x.new_empty(rows, cols // block, dtype=scale_dtype)
    request = (fmt, block, scale_rule, tensor_scale, mode, n, variant, nvfp4_flavour, output)
    rotation = (rht, rht_signs, rht_bf16)
    streams = (seed, offset, index_offset)
    _launch(x, codes, scales, x.new_empty(0), request, rotation, streams, amax)
    return codes, scales


def fake_quantize_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> Tensor:
    """Quantize and dequantize in one pass: the values ``element * scale`` (times the
    tensor scale; times fp32(4/3) for "floor-3/4") in fp32, rounded to nearest-even into
    x's dtype, as `stochround.blocks.BlockTensor.dequantize` computes them from the
    PyTorch path's codes and scales; with ``rht``, rotated back (the inverse transform in
    fp32) before the rounding to x's dtype, as ``dequantize(unrotate=True)``.  Arguments
    as `quantize_blocks`'s; returns a tensor shaped like x, in x's dtype."""
    fmt = _check_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    out = torch.empty_like(x)
    empty = x.new_empty(0, dtype=torch.uint8)
    request = (fmt, block, scale_rule, tensor_scale, mode, n, variant, nvfp4_flavour, "dequantized")
    rotation = (rht, rht_signs, rht_bf16)
    _launch(x, empty, empty, out, request, rotation, (seed, offset, index_offset), amax)
    return out


def gemm_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    out_dtype: torch.dtype,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> Tensor:
    """Quantize in one pass and store what a block-scaled GEMM multiplies: each element
    times its block's scale, ``element * scale`` in fp32 (the E4M3 or E8M0 value, without
    NVFP4's tensor scale or floor-3/4's 4/3, which scale the GEMM's result), in the
    rotated basis where ``rht`` is given, stored in ``out_dtype`` (torch.bfloat16, which
    the caller asks for only where every such product is a bf16 value, or torch.float32).
    Arguments as `quantize_blocks`'s; returns a tensor shaped like x."""
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32; got {out_dtype}")
    fmt = _check_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    out = torch.empty_like(x, dtype=out_dtype)
    empty = x.new_empty(0, dtype=torch.uint8)
    request = (fmt, block, scale_rule, tensor_scale, mode, n, variant, nvfp4_flavour, "gemm")
    rotation = (rht, rht_signs, rht_bf16)
    _launch(x, empty, empty, out, request, rotation, (seed, offset, index_offset), amax)
    return out


def _check_call(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    mode: str,
    n: int,
    variant: str,
    flavour: str,
) -> Format:
    """The element format; ValueError/TypeError naming any argument the kernel cannot
    take (the callers check the rest: `stochround.blocks.quantize`)."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_contiguous():
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a contiguous 2-D tensor; got {shape}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16; got {x.dtype}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or x.shape[1] % block:
        raise ValueError(
            f"block must be a positive int dividing x's last dimension {x.shape[1]}; got {block!r}"
        )
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {', '.join(SCALE_RULES)}; got {scale_rule!r}")
    check_choice("mode", mode, MODES)
    check_choice("variant", variant, VARIANTS)
    check_choice("nvfp4_flavour", flavour, NVFP4_FLAVOURS)
    if check_rbits(n) != n:
        raise ValueError(f"n must be an int in 1..32; got {n!r}")
    fmt = find_format(element)
    if not kernel_supports(fmt):
        raise ValueError(
            f"the kernel rounds formats exact in fp32 with emin >= -126, not {fmt.name}"
        )
    return fmt


def _launch(
    x: Tensor,
    codes: Tensor,
    scales: Tensor,
    out: Tensor,
    request: tuple,
    rotation: tuple,
    streams: tuple[int | Tensor, int | Tensor, int],
    amax: Tensor | None,
) -> None:
    """Launch the kernel on x's device (made current for the launch: Triton launches on
    the current device) with a checked request (element format, block, scale rule, tensor
    scale, mode, n, variant, flavour, output), rotation (rht, signs, rht_bf16), streams
    (seed, offset, index_offset) and the blocks' given amax (or None)."""
    fmt, block, scale_rule, tensor_scale, mode, n, variant, flavour, output = request
    seed, offset, index_offset = streams
    count = x.numel()
    if count == 0:
        return
    if amax is not None and (
        amax.dtype != torch.float32
        or amax.numel() != count // block
        or amax.device != x.device
        or not amax.is_contiguous()
        or rotation[0] is not None
    ):
        raise ValueError(
            "amax must be a contiguous float32 tensor of one value a block on x's device, "
            "without rht"
        )
    if tensor_scale is not None and (
        tensor_scale.dtype != torch.float32
        or tensor_scale.numel() not in (1, 2)
        or tensor_scale.device != x.device
        or not tensor_scale.is_contiguous()
    ):
        raise ValueError(
            "tensor_scale must be a contiguous float32 tensor of one (S_dec) or two (S_dec, "
            "S_enc) elements on x's device"
        )
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            _launch(x, codes, scales, out, request, rotation, streams, amax)
        return
    seed_pointer: Tensor | None = None
    offset_pointer: Tensor | None = None
    seed_value = offset_value = 0
    from_tensors = isinstance(seed, Tensor) or isinstance(offset, Tensor)
    if from_tensors:
        seed_pointer = seed_tensor(seed, "seed", x.device)
        offset_pointer = seed_tensor(offset, "offset", x.device)
    else:  # two's complement above 2**63: the kernel reads seeds as unsigned 64-bit
        seed_value, offset_value = as_int64(int(seed)), as_int64(int(offset))
    groups = next_power_of_2(cdiv(block, 4))
    tile = max(1, TILE_ELEMENTS // (groups * 4))
    blocks = count // block
    rht, rht_signs, rht_bf16 = rotation
    if rht is not None and (groups * 4 != block or scale_rule == "absmax"):
        raise ValueError(
            f"rht= needs a block that is a power of two of at least 4 and a scale rule other "
            f"than 'absmax'; got block {block}, rule {scale_rule!r}"
        )
    signs, rotation_constants = _rotation_constants(x, rht, rht_signs, rht_bf16, tile * groups * 4)
    _run(
        _quantize_blocks_kernel,
        cdiv(blocks, tile),
        x,
        x,
        codes,
        scales,
        out,
        tensor_scale,
        signs,
        amax,
        seed_pointer,
        offset_pointer,
        seed_value,
        offset_value,
        blocks,
        index_offset,
        FROM_TENSORS=from_tensors,
        AMAX_GIVEN=amax is not None,
        OUT_NAN16=NAN16_BITS.get(out.dtype, 0) if output == "gemm" else 0,
        ALIGNED=index_offset % 4 == 0 and block % 4 == 0,
        WIDE=count + index_offset + tile * groups * 4 >= 2**31,
        BLOCK=block,
        GROUPS=groups,
        TILE=tile,
        SCALE_RULE=scale_rule,
        FLAVOUR=flavour,
        TENSOR_SCALE=0 if tensor_scale is None else tensor_scale.numel(),
        SYMMETRIC=fmt.twos_complement and fmt.name in SYMMETRIC_ELEMENTS,
        EMAX=fmt.emax,
        MODE=mode,
        VARIANT=variant,
        NBITS=n,
        OUTPUT=output,
        NAN16=NAN16_BITS.get(x.dtype, 0),
        **_element_constants(fmt, mode, n, variant),
        **rotation_constants,
        num_warps=_NUM_WARPS,
        # no multiply-add contraction: every product is rounded, as the PyTorch path
        # rounds it (the inverse rotation adds products that can be inexact)
        enable_fp_fusion=False,
    )


__all__ = [
    "BLOCK_OUTPUTS",
    "SYMMETRIC_ELEMENTS",
    "fake_quantize_blocks",
    "fast_bits",
    "gemm_blocks",
    "nvfp4_tensor_scale",
    "quantize_blocks",
    "rht_normalization",
    "tensor_amax",
]
