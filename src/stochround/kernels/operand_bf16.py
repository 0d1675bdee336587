"""An fp32 GEMM operand of few significant bits as exact bf16 values, one row per program:
the row's shift (`stochround.blocks.gemm.bf16_row_shifts`, the spec) from its smallest
nonzero and largest magnitudes, then each value times ``2**s`` in bf16, and ``2**-s``.

The block quantizer can write such an operand in bf16 itself (`flag_bits`): a row without
a value below ``2**(mbits - 133)`` takes the shift 0, so its values are already its bf16
row; a block holding such a value is flagged and stored times ``2**FLAGGED_SHIFT`` (exact:
its scale is tiny), and `shift_flagged_rows` rewrites the rows holding a flagged block from
those exact values, the other rows' flags read alone: the same bits as `exact_bf16_rows` of
the fp32 operand."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import current_device
from .grid import next_power_of_2
from .runtime import bound_launch

# values a program reads at a time (a power of two)
CHUNK = 1024
_NUM_WARPS = 4

# a flagged block's values are stored times 2**FLAGGED_SHIFT: a nonzero fp32 value's lowest
# bit (2**-149 or above) then lies at or above bf16's (2**-133), and a flagged block's
# values lie below 2**-90 (an element format's range is below 2**40), far from overflow
FLAGGED_SHIFT = 16
_UNFLAG = tl.constexpr(2.0**-FLAGGED_SHIFT)


def flag_bits(mbits: int) -> int:
    """The fp32 bits of ``2**(mbits - 133)``: a nonzero value of ``mbits + 1`` significant
    bits at or above it is exact in bf16 (its lowest bit at or above ``2**-133``), and a
    row without a nonzero value below it takes the shift 0 (`bf16_row_shifts`); a
    subnormal for mbits < 7 (bit ``mbits + 16`` of the pattern), the smallest normal for 7."""
    if not 0 <= mbits <= 7:
        raise ValueError(
            f"mbits must be an int in 0..7 (bf16 holds 8 significant bits); got {mbits}"
        )
    return 1 << (mbits + 16)


@triton.jit
def _floor_log2(m):
    """floor(log2 m) of a positive finite fp32 scalar, subnormals included."""
    subnormal = m < 1.1754943508222875e-38
    lifted = tl.where(subnormal, m * 18446744073709551616.0, m)
    field = (lifted.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return field - 127 - tl.where(subnormal, 64, 0)


@triton.jit
def _bf16_bits(v):
    """The bf16 bit pattern (int16) of fp32 v rounded to nearest-even, as PyTorch converts:
    bf16 is fp32's upper half, so rounding the pattern's lower half rounds the value, in
    every binade and into infinity alike; a NaN as 0x7FC0.  (Integer arithmetic: Triton's
    interpreter converts fp32 subnormals to bf16 wrongly.)"""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _row_shift(high, low, MBITS: tl.constexpr):
    """A row's shift s (int32) from its largest magnitude ``high`` (NaN excluded) and its
    smallest nonzero one ``low`` (infinity: none), as `bf16_row_shifts` computes it."""
    need = tl.where(low < float("inf"), -133 + MBITS - _floor_log2(low), 0)
    room = tl.where((high < float("inf")) & (high > 0), 127 - _floor_log2(high), 127)
    return tl.minimum(tl.maximum(need, 0), room)


@triton.jit
def _exact_bf16_rows_kernel(
    x_ptr, out_ptr, unshift_ptr, COLS: tl.constexpr, MBITS: tl.constexpr, CHUNK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    # an fp32 row: no flags to read (x_ptr stands in for them)
    _shift_row(x_ptr + row * COLS, out_ptr + row * COLS, unshift_ptr + row, x_ptr,
               COLS, 1, MBITS, CHUNK, False)  # fmt: skip


@triton.jit
def _shift_flagged_rows_kernel(
    values_ptr,
    flags_ptr,
    unshift_ptr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    MBITS: tl.constexpr,
    CHUNK: tl.constexpr,
    FLAG_CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    FLAGS: tl.constexpr = COLS // BLOCK
    row_flags = flags_ptr + row * FLAGS
    flag_offsets = tl.arange(0, FLAG_CHUNK)
    any_flag = tl.zeros((FLAG_CHUNK,), tl.int32)
    for first in range(0, FLAGS, FLAG_CHUNK):
        mask = first + flag_offsets < FLAGS
        flags = tl.load(row_flags + first + flag_offsets, mask=mask, other=0).to(tl.int32)
        any_flag = tl.maximum(any_flag, flags)
    # a row without a flagged block keeps its values (shift 0, `_row_shift` of an empty
    # row): its flags are all the program reads (a scalar branch, taken per row)
    if tl.max(any_flag, axis=0) != 0:
        start = values_ptr + row * COLS
        _shift_row(start, start, unshift_ptr + row, row_flags, COLS, BLOCK, MBITS, CHUNK, True)
    else:
        tl.store(unshift_ptr + row, 1.0)


@triton.jit
def _shift_row(
    source,
    target,
    unshift_ptr,
    row_flags,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    MBITS: tl.constexpr,
    CHUNK: tl.constexpr,
    STORED: tl.constexpr,
):
    """One row: its values (at ``source``: fp32, or with STORED the quantizer's bf16 values
    and the row's flags, `_stored_value`) times ``2**s`` in bf16 at ``target`` (bit
    patterns), ``2**-s`` at ``unshift_ptr``, s the row's `_row_shift`."""
    offsets = tl.arange(0, CHUNK)
    largest = tl.zeros((CHUNK,), tl.float32)
    smallest = tl.full((CHUNK,), float("inf"), tl.float32)
    for first in range(0, COLS, CHUNK):
        mask = first + offsets < COLS
        m = tl.abs(_row_values(source + first + offsets, row_flags, first + offsets, mask,
                               BLOCK, STORED))  # fmt: skip
        largest = tl.maximum(largest, m)  # a NaN takes no part, as in the spec
        smallest = tl.minimum(smallest, tl.where(m > 0, m, float("inf")))
    shift = _row_shift(tl.max(largest, axis=0), tl.min(smallest, axis=0), MBITS)
    factor = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(unshift_ptr, ((127 - shift) << 23).to(tl.float32, bitcast=True))
    patterns = target.to(tl.pointer_type(tl.int16))
    for first in range(0, COLS, CHUNK):
        mask = first + offsets < COLS
        v = _row_values(source + first + offsets, row_flags, first + offsets, mask, BLOCK, STORED)
        tl.store(patterns + first + offsets, _bf16_bits(v * factor), mask=mask)


@triton.jit
def _row_values(pointers, row_flags, columns, mask, BLOCK: tl.constexpr, STORED: tl.constexpr):
    """A chunk of a row's fp32 values: loaded, or with STORED `_stored_value`'s."""
    if STORED:
        values = _stored_value(pointers, row_flags, columns, mask, BLOCK)
    else:
        values = tl.load(pointers, mask=mask, other=0.0)
    return values


@triton.jit
def _stored_value(pointers, row_flags, columns, mask, BLOCK: tl.constexpr):
    """The fp32 operand values of the bf16 values the quantizer stored, a flagged
    block's times ``2**-FLAGGED_SHIFT`` (exact: the pattern holds the value times
    ``2**FLAGGED_SHIFT``)."""
    pattern = tl.load(pointers, mask=mask, other=0).to(tl.uint16, bitcast=True)
    v = (pattern.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    block_flag = tl.load(row_flags + columns // BLOCK, mask=mask, other=0)
    return tl.where(block_flag != 0, v * _UNFLAG, v)


class FlaggedRows:
    """`shift_flagged_rows` for one shape and block and one element's mbits, its launch
    bound once (a training layer's operand: the same at every step)."""

    def __init__(self, rows: int, cols: int, block: int, mbits: int) -> None:
        flag_bits(mbits)  # checks mbits
        if block < 1 or cols % block:
            raise ValueError(f"block must divide the row's length {cols}; got {block}")
        constants = (
            ("COLS", cols),
            ("BLOCK", block),
            ("MBITS", mbits),
            ("CHUNK", CHUNK),
            ("FLAG_CHUNK", min(CHUNK, next_power_of_2(cols // block))),
            ("num_warps", _NUM_WARPS),
        )
        self.shape = (rows, cols)
        self.flags_shape = (rows, cols // block)
        self.launch = bound_launch(_shift_flagged_rows_kernel, constants)

    def __call__(self, values: Tensor, flags: Tensor) -> tuple[Tensor, Tensor]:
        """(bf16 ``v * 2**s``, fp32 ``2**-s`` of shape (M, 1)) as `exact_bf16_rows` gives
        them for the fp32 operand v, from the block quantizer's bf16 ``values`` (M, K;
        rewritten in place) and its uint8 flags (M, K / block) (module docstring), both
        contiguous on one device: a row without a flagged block is its values and
        ``2**0``, read no further.  The caller gives the prepared shapes."""
        rows = self.shape[0]
        unshift = values.new_empty((rows, 1), dtype=torch.float32)
        if values.numel():
            device = current_device() if values.is_cuda else 0
            self.launch(device, rows, values, flags, unshift)
        return values, unshift


def shift_flagged_rows(
    values: Tensor, flags: Tensor, block: int, mbits: int
) -> tuple[Tensor, Tensor]:
    """`FlaggedRows` of the shapes of ``values`` (bf16, (M, K)) and ``flags`` (uint8, one a
    block of ``block`` elements of each row), checked, applied to them."""
    if (
        values.dtype != torch.bfloat16
        or flags.dtype != torch.uint8
        or values.dim() != 2
        or not values.is_contiguous()
        or not flags.is_contiguous()
        or block < 1
        or values.shape[1] % block
        or flags.shape != (values.shape[0], values.shape[1] // block)
    ):
        raise ValueError(
            f"values must be contiguous 2-D bf16 and flags contiguous uint8, one a block of "
            f"{block} of each row; got {values.dtype} {tuple(values.shape)} and {flags.dtype} "
            f"{tuple(flags.shape)}"
        )
    rows, cols = values.shape
    return FlaggedRows(rows, cols, block, mbits)(values, flags)


def exact_bf16_rows(values: Tensor, mbits: int) -> tuple[Tensor, Tensor]:
    """(bf16 ``values * 2**s``, fp32 ``2**-s`` of shape (M, 1)) of a contiguous 2-D fp32
    tensor, ``s`` per row as `stochround.blocks.gemm.bf16_row_shifts` computes it."""
    values = values.contiguous()
    rows, cols = values.shape
    out = torch.empty_like(values, dtype=torch.int16)  # the bf16 patterns
    unshift = values.new_empty((rows, 1))
    if values.numel():
        # the row length a constexpr: a layer's operands come in a few lengths
        constants = (
            ("COLS", cols),
            ("MBITS", mbits),
            ("CHUNK", CHUNK),
            ("num_warps", _NUM_WARPS),
        )
        device = current_device() if values.is_cuda else 0
        bound_launch(_exact_bf16_rows_kernel, constants)(device, rows, values, out, unshift)
    return out.view(torch.bfloat16), unshift


__all__ = [
    "FLAGGED_SHIFT",
    "FlaggedRows",
    "exact_bf16_rows",
    "flag_bits",
    "shift_flagged_rows",
]
