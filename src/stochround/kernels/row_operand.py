"""A row-wise absmax GEMM operand in one launch (int8 row-wise, torchao's
``quantize_int8_rowwise`` rule): each program takes ROWS rows, their amax (an integer max
of the magnitudes' bits, chunk by chunk for a row longer than a program holds), the row
scale ``max(amax / max, floor)`` in x's dtype and the fp32 multiplier ``1 / scale``, then
the elements ``fp32(x) * multiplier`` rounded to the element format, saturating, stored
as the GEMM's values (bf16 or fp32) beside the fp32 row scales.  Bit for bit the PyTorch
path: `stochround.blocks.reference.quantize_torch` with `gemm_operand_of` for per-element
words, `stochround.nn.operands.row_noise_operand` for one word per row or column."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..block_constants import ABSMAX_FLOORS, ROW_WORDS
from ..formats import Format
from ..random import seed_tensor
from .availability import INTERPRETED, current_device, kernel_supports
from .block_math import (
    ElementRounding,
    element_format,
    element_rounding,
    fast_round,
    general_round,
    magnitude_steps_up,
    narrowed_value,
    nearest_integer,
)
from .common import (
    INPUT_DTYPES,
    NAN16_BITS,
    as_int64,
    block_tile_words,
    fp32_bits_of,
    narrow_to_16_bits,
    seed_and_offset,
)
from .grid import cdiv, next_power_of_2
from .philox import random_word
from .runtime import Launch, bound_launch, check_prepared

# whose word each element's SR draws: its own (the word of its row-major index), its
# row's (the word of the row's index), or its column's (the word of the column's index)
# the longest run of a row a program holds in registers (a power of two; a longer row is
# read twice, chunk by chunk: once for its amax, once to quantize), and the elements a
# program takes in all (short rows: several rows a program); read at each preparation, so
# that a test or a benchmark can set them
CHUNK_ELEMENTS = 2**14 if INTERPRETED else 2**12
ROW_TILE_ELEMENTS = 2**14 if INTERPRETED else 2**12
_NUM_WARPS = 4

_ABSMAX_FLOOR = tl.constexpr(ABSMAX_FLOORS[torch.float32])
_ABSMAX_FLOOR_BF16 = tl.constexpr(ABSMAX_FLOORS[torch.bfloat16])
_ABSMAX_FLOOR_FP16 = tl.constexpr(ABSMAX_FLOORS[torch.float16])


class RowTiling(NamedTuple):
    """A program's tile: ROWS rows of COLS elements, read CHUNK (a power of two, at least
    4) at a time as [ROWS, CHUNK / 4, 4]; WIDE: positions beyond int32."""

    COLS: int
    CHUNK: int
    ROWS: int
    WIDE: bool


class RowNoise(NamedTuple):
    """SR's words: WORDS in `ROW_WORDS`, FROM_TENSORS (seed and offset read from device
    tensors), ALIGNED (per-element words: each group of four one Philox block)."""

    WORDS: str
    FROM_TENSORS: bool
    ALIGNED: bool


class RowOutput(NamedTuple):
    """What is stored and how: PATH "integer" (`integer_round`), "fast" (`fast_round`) or
    "general" (`general_round`); NAN16 the NaN of x's 16-bit dtype, in which the scale is
    held (0: fp32); OUT_NAN16 bf16's NaN for bf16 values (0: fp32 values); NAN_ZERO: a NaN
    element's value is 0 (a format without a NaN code, encoded with ``nan="zero"``), else
    NaN; COUNT_SCALE: 2**n, SR's count scale in `integer_round` (variant c)."""

    PATH: str
    NAN16: int
    OUT_NAN16: int
    NAN_ZERO: bool
    COUNT_SCALE: float


@triton.jit
def integer_round(
    bits, r, ROUNDING: tl.constexpr, ELEMENT: tl.constexpr, COUNT_SCALE: tl.constexpr
):
    """fp32 values (``bits``: int32) rounded to an integer grid of unit ulp (int8: -128 ..
    127) and saturated to its finite range, as fp32 values (NaN stays NaN): with m = |x|
    (clamped to 2**(MBITS + 2), beyond either bound), nearest and directed modes from
    floor(m) and the exact fraction; SR with n random bits r, variant a: floor((floor(m
    2**32) + r 2**(32 - n)) / 2**32), variant c: floor((rne(m 2**n) + r) / 2**n) (m 2**k is
    exact: a power-of-two scaling), as `block_math.fast_round` rounds."""
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    negative = bits < 0
    # every magnitude from 2**(MBITS + 2) up saturates on both sides
    m = tl.minimum((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), 4.0 * ELEMENT.MAX)
    m = tl.where(is_nan, 0.0, m)
    if ROUNDING.MODE == "sr":
        if ROUNDING.VARIANT == "a":
            count = (m * 4294967296.0).to(tl.uint64)
            noise = r.to(tl.uint64) << (32 - ROUNDING.NBITS)
            total = ((count + noise) >> 32).to(tl.int32)
        else:
            tl.static_assert(ROUNDING.VARIANT == "c", "the integer path rounds SR a and c")
            count = nearest_integer(m * COUNT_SCALE)  # m 2**n
            total = ((count + r.to(tl.uint64)) >> ROUNDING.NBITS).to(tl.int32)
    else:
        kept = m.to(tl.int32)
        away = magnitude_steps_up(kept, m - kept.to(tl.float32), negative, ROUNDING)
        total = kept + away.to(tl.int32)
    # the negative side ends at the lowest value (int8: -128), the positive at max
    limit = tl.where(negative, ELEMENT.NEGATIVE_LIMIT_BITS, ELEMENT.MAX_BITS)
    limit_value = limit.to(tl.float32, bitcast=True).to(tl.int32)
    total = tl.minimum(total, limit_value)
    value = tl.where(negative, -total, total).to(tl.float32)
    return is_nan, value


@triton.jit
def _absmax_scale(amax, dtype: tl.constexpr, NAN16: tl.constexpr, MAX: tl.constexpr):
    """Each row's scale ``max(amax / max, floor)`` held in x's dtype (as fp32; NaN stays)
    and its fp32 multiplier ``1 / scale`` (`stochround.blocks.scales.absmax_scales`:
    correctly rounded quotients; the fp32 quotient rounded again to a 16-bit dtype is the
    correctly rounded one, fp32 holding more than twice its bits and two)."""
    scale = tl.math.div_rn(amax, MAX)
    if NAN16 != 0:
        scale = narrowed_value(scale, dtype, NAN16)
    if dtype == tl.bfloat16:
        floor = _ABSMAX_FLOOR_BF16
    elif dtype == tl.float16:
        floor = _ABSMAX_FLOOR_FP16
    else:
        floor = _ABSMAX_FLOOR
    scale = tl.where(scale < floor, floor, scale)  # a select: NaN stays
    return scale, tl.math.div_rn(1.0, scale)


@triton.jit
def _quantized(x, position, column, lane, multiplier, seed, offset, row_word, index_offset,
               NOISE: tl.constexpr, ELEMENT: tl.constexpr, ROUNDING: tl.constexpr,
               OUTPUT: tl.constexpr):  # fmt: skip
    """The GEMM values of a [ROWS, CHUNK / 4, 4] chunk of x (``position``: the elements'
    flat positions, ``column``: their column indices): each element times its row's
    multiplier, rounded (SR: the words of NOISE.WORDS, ``row_word`` the rows' own), in fp32
    (`_store_values` narrows them to bf16, exact: the caller asks for it only where every
    element value is one)."""
    bits = fp32_bits_of(x)
    scaled = bits.to(tl.float32, bitcast=True) * multiplier
    scaled_bits = scaled.to(tl.int32, bitcast=True)
    if ROUNDING.MODE == "sr":
        if NOISE.WORDS == "element":
            # the indices made to depend on x's bits (0), so that the words take its layout
            index = position + index_offset + ((bits & 0x7FFFFFFF) >> 31)
            word = block_tile_words(seed, offset, index, lane, NOISE.ALIGNED)
        elif NOISE.WORDS == "column":  # columns from a multiple of 4: one Philox block a group
            word = block_tile_words(seed, offset, column, lane, True)
        else:
            tl.static_assert(NOISE.WORDS == "row", "WORDS must be element, row or column")
            word = row_word
        r = (word >> (32 - ROUNDING.NBITS)).to(tl.int64)
    else:
        r = bits.to(tl.int64) * 0
    if OUTPUT.PATH == "integer":
        is_nan, value = integer_round(scaled_bits, r, ROUNDING, ELEMENT, OUTPUT.COUNT_SCALE)
    else:
        if OUTPUT.PATH == "fast":
            _, value = fast_round(scaled_bits, r, ROUNDING, ELEMENT)
        else:
            tl.static_assert(OUTPUT.PATH == "general", "PATH must be integer, fast or general")
            _, value = general_round(scaled_bits, r, ROUNDING, ELEMENT)
        is_nan = value != value
    if OUTPUT.NAN_ZERO:
        value = tl.where(is_nan, 0.0, value)
    else:
        value = tl.where(is_nan, float("nan"), value)
    return value


@triton.jit
def _store_values(pointer, value, mask, OUTPUT: tl.constexpr):
    """Store fp32 GEMM values: narrowed to bf16 with the canonical NaN where the output
    asks for it (a store in each branch: compiled Triton wants one return type)."""
    if OUTPUT.OUT_NAN16 != 0:
        narrow = narrow_to_16_bits(value.to(tl.int32, bitcast=True), tl.bfloat16, OUTPUT.OUT_NAN16)
        tl.store(pointer, narrow, mask=mask)
    else:
        tl.store(pointer, value, mask=mask)


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def row_operand_kernel(
    x_ptr,
    values_ptr,
    scales_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    rows,
    index_offset,
    TILING: tl.constexpr,
    NOISE: tl.constexpr,
    ELEMENT: tl.constexpr,
    ROUNDING: tl.constexpr,
    OUTPUT: tl.constexpr,
):
    """The values and the row scales of TILING.ROWS rows of a contiguous [rows, COLS] x
    (module docstring): the amax pass over the row's chunks (kept in registers where one
    chunk holds the row), the row scale stored, then each chunk quantized and stored.
    Compiled without multiply-add contraction: each product is rounded as the PyTorch path
    rounds it."""
    COLS: tl.constexpr = TILING.COLS
    CHUNK: tl.constexpr = TILING.CHUNK
    GROUPS: tl.constexpr = TILING.CHUNK // 4
    ROWS: tl.constexpr = TILING.ROWS  # a shape's entries must be constexpr when compiled
    program = tl.program_id(0)
    if TILING.WIDE:
        program = program.to(tl.int64)
    row = program * ROWS + tl.arange(0, ROWS)
    in_rows = row[:, None, None] < rows
    lane = tl.arange(0, 4)[None, None, :]
    column = tl.arange(0, GROUPS)[None, :, None] * 4 + lane
    start = row[:, None, None] * COLS
    if COLS <= CHUNK:  # one chunk holds the row: read once
        mask = in_rows & (column < COLS)
        x = tl.load(x_ptr + start + column, mask=mask, other=0.0)
        magnitude = fp32_bits_of(x) & 0x7FFFFFFF
    else:
        magnitude = tl.zeros((ROWS, GROUPS, 4), tl.int32)
        for first in range(0, COLS, CHUNK):
            mask = in_rows & (first + column < COLS)
            chunk = tl.load(x_ptr + start + first + column, mask=mask, other=0.0)
            magnitude = tl.maximum(magnitude, fp32_bits_of(chunk) & 0x7FFFFFFF)
    # an integer max of the magnitudes' bits orders them as their values, NaN above all
    amax_bits = tl.max(tl.max(magnitude, axis=2), axis=1)
    scale, multiplier = _absmax_scale(
        amax_bits.to(tl.float32, bitcast=True), x_ptr.dtype.element_ty, OUTPUT.NAN16, ELEMENT.MAX
    )
    tl.store(scales_ptr + row, scale, mask=row < rows)
    multiplier = multiplier[:, None, None]
    seed, offset = seed_and_offset(
        seed_ptr, offset_ptr, seed_value, offset_value, NOISE.FROM_TENSORS
    )
    row_word = row[:, None, None].to(tl.uint32) * 0
    if ROUNDING.MODE == "sr" and NOISE.WORDS == "row":  # one Philox call a row
        row_word = random_word(seed, offset, row)[:, None, None]
    if COLS <= CHUNK:
        value = _quantized(x, start + column, column, lane, multiplier, seed, offset, row_word,
                           index_offset, NOISE, ELEMENT, ROUNDING, OUTPUT)  # fmt: skip
        _store_values(values_ptr + start + column, value, mask, OUTPUT)
    else:  # the row read again, chunk by chunk (from the cache where it fits)
        for first in range(0, COLS, CHUNK):
            mask = in_rows & (first + column < COLS)
            position = start + first + column
            x = tl.load(x_ptr + position, mask=mask, other=0.0)
            value = _quantized(
                x, position, first + column, lane, multiplier, seed, offset, row_word,
                index_offset, NOISE, ELEMENT, ROUNDING, OUTPUT,
            )  # fmt: skip
            _store_values(values_ptr + position, value, mask, OUTPUT)


def integer_grid(fmt: Format) -> bool:
    """Whether ``fmt`` is a two's complement integer grid of unit ulp (int8, int4 ...),
    which `integer_round` rounds."""
    return fmt.twos_complement and fmt.ebits == 0 and fmt.emin == fmt.mbits


def _path(fmt: Format, rounding: ElementRounding) -> str:
    """The rounding helper that serves these choices (`RowOutput.PATH`)."""
    nearest_or_directed = rounding.MODE in ("rne", "rna", "rz", "ru", "rd")
    stochastic = rounding.MODE == "sr" and rounding.VARIANT in ("a", "c")
    if integer_grid(fmt) and (nearest_or_directed or stochastic):
        return "integer"
    return "fast" if rounding.FAST_BITS >= 0 else "general"


def row_operand_kernel_refusal(fmt: Format, x: Tensor) -> str | None:
    """Why the kernel cannot take x and elements of ``fmt`` (None if it can): a contiguous
    2-D fp32, bf16 or fp16 x with elements, elements of at most 8 bits exact in fp32, not a
    symmetric grid (MXINT8's, which has blocks)."""
    if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0:
        return "x must be a contiguous 2-D tensor with elements"
    if x.dtype not in INPUT_DTYPES:
        return f"x must be float32, bfloat16 or float16; got {x.dtype}"
    if fmt.bits > 8 or element_format(fmt, "rne").SYMMETRIC:
        return f"it does not round {fmt.name} elements"
    if not kernel_supports(fmt):
        return f"it does not round {fmt.name} elements"
    return None


class PreparedRowOperand:
    """The row-wise absmax operand's launch for one shape, dtype and device and one set of
    choices, checked and resolved once (the constexprs, the bound launch, the grid): a
    call costs the launch alone.  ``element`` the element format, ``mode``/``n``/
    ``variant`` its rounding (`stochround.reference`), ``words`` one of `ROW_WORDS`,
    ``out_dtype`` the values' dtype (torch.bfloat16 only where every element value is a
    bf16 value), ``nan_zero`` a NaN element's value 0 (else NaN), ``index_offset`` the
    global index of x's first element (per-element words)."""

    def __init__(
        self,
        x: Tensor,
        element: Format,
        *,
        mode: str,
        n: int,
        variant: str,
        words: str,
        out_dtype: torch.dtype,
        nan_zero: bool,
        index_offset: int = 0,
        from_tensors: bool = True,
    ) -> None:
        refusal = row_operand_kernel_refusal(element, x)
        if refusal is not None:
            raise ValueError(f"the row operand kernel refuses x: {refusal}")
        if words not in ROW_WORDS:
            raise ValueError(f"words must be one of {', '.join(ROW_WORDS)}; got {words!r}")
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32; got {out_dtype}")
        rows, cols = x.shape
        chunk = max(4, min(next_power_of_2(cols), CHUNK_ELEMENTS))
        tile_rows = max(1, ROW_TILE_ELEMENTS // chunk) if cols <= chunk else 1
        tile_rows = min(tile_rows, next_power_of_2(rows))
        rounding = element_rounding(element, mode, n, variant)
        constants = {
            "TILING": RowTiling(
                COLS=cols,
                CHUNK=chunk,
                ROWS=tile_rows,
                WIDE=x.numel() + index_offset + tile_rows * cols >= 2**31,
            ),
            "NOISE": RowNoise(
                WORDS=words,
                FROM_TENSORS=from_tensors,
                ALIGNED=index_offset % 4 == 0 and cols % 4 == 0,
            ),
            "ELEMENT": element_format(element, mode),
            "ROUNDING": rounding,
            "OUTPUT": RowOutput(
                PATH=_path(element, rounding),
                NAN16=NAN16_BITS.get(x.dtype, 0),
                OUT_NAN16=NAN16_BITS[torch.bfloat16] if out_dtype == torch.bfloat16 else 0,
                NAN_ZERO=nan_zero,
                COUNT_SCALE=float(2**n),
            ),
            "num_warps": _NUM_WARPS,
            "enable_fp_fusion": False,  # every product rounded, as the PyTorch path's
        }
        self.launcher: Launch = bound_launch(row_operand_kernel, tuple(constants.items()))
        self.programs = cdiv(rows, tile_rows)
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.out_dtype, self.index_offset = out_dtype, index_offset
        self.device_index = x.device.index if x.is_cuda else -1

    def check(self, x: Tensor) -> None:
        """ValueError unless x is a contiguous tensor of the prepared shape, dtype and
        device (`check_prepared`)."""
        check_prepared(x, "x", self.shape, self.dtype, self.device)

    def launch(self, x: Tensor, seed: Tensor | int, offset: Tensor | int) -> tuple[Tensor, Tensor]:
        """(values, fp32 row scales (rows, 1)) of x, checked (`check`), on the current
        device: the stream as one-element int64 device tensors (prepared with
        ``from_tensors``) or as ints in [0, 2**64)."""
        values = torch.empty_like(x, dtype=self.out_dtype)
        scales = x.new_empty((x.shape[0], 1), dtype=torch.float32)
        pointers: tuple[Tensor | None, Tensor | None]
        if isinstance(seed, Tensor) and isinstance(offset, Tensor):
            pointers, numbers = (seed, offset), (0, 0)
        else:
            pointers, numbers = (None, None), (as_int64(int(seed)), as_int64(int(offset)))
        self.launcher(
            self.device_index,
            self.programs,
            x,
            values,
            scales,
            *pointers,
            *numbers,
            x.shape[0],
            self.index_offset,
        )
        return values, scales

    def __call__(
        self, x: Tensor, seed: Tensor | int, offset: Tensor | int
    ) -> tuple[Tensor, Tensor]:
        """`launch` after the check, with x's device made current (Triton launches on the
        current device)."""
        self.check(x)
        if self.device_index >= 0 and current_device() != self.device_index:
            with torch.cuda.device(self.device):
                return self.launch(x, seed, offset)
        return self.launch(x, seed, offset)


def row_gemm_operand(
    x: Tensor,
    element: Format,
    *,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    words: str = "element",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    out_dtype: torch.dtype = torch.bfloat16,
    nan_zero: bool = True,
) -> tuple[Tensor, Tensor]:
    """(values, fp32 row scales (rows, 1)) of a contiguous 2-D x: `PreparedRowOperand`'s
    launch for one call; ``seed``/``offset`` ints in [0, 2**64) or one-element int64
    tensors (moved to x's device)."""
    from_tensors = isinstance(seed, Tensor) or isinstance(offset, Tensor)
    prepared = PreparedRowOperand(
        x,
        element,
        mode=mode,
        n=n,
        variant=variant,
        words=words,
        out_dtype=out_dtype,
        nan_zero=nan_zero,
        index_offset=index_offset,
        from_tensors=from_tensors,
    )
    if from_tensors:
        seed, offset = seed_tensor(seed, "seed", x.device), seed_tensor(offset, "offset", x.device)
    return prepared(x, seed, offset)


__all__ = [
    "PreparedRowOperand",
    "RowNoise",
    "RowOutput",
    "RowTiling",
    "integer_grid",
    "integer_round",
    "row_gemm_operand",
    "row_operand_kernel",
    "row_operand_kernel_refusal",
]
