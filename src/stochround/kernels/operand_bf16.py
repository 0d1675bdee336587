"""An fp32 GEMM operand of few significant bits as exact bf16 values, one row per program:
the row's shift (`stochround.blocks.gemm.bf16_row_shifts`, the spec) from its smallest
nonzero and largest magnitudes, then each value times ``2**s`` in bf16, and ``2**-s``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .runtime import bound_launch, current_device

# values a program reads at a time (a power of two)
CHUNK = 1024
_NUM_WARPS = 4


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
def _exact_bf16_rows_kernel(
    x_ptr, out_ptr, unshift_ptr, COLS: tl.constexpr, MBITS: tl.constexpr, CHUNK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    start = x_ptr + row * COLS
    offsets = tl.arange(0, CHUNK)
    largest = tl.zeros((CHUNK,), tl.float32)
    smallest = tl.full((CHUNK,), float("inf"), tl.float32)
    for first in range(0, COLS, CHUNK):
        mask = first + offsets < COLS
        m = tl.abs(tl.load(start + first + offsets, mask=mask, other=0.0))
        largest = tl.maximum(largest, m)  # a NaN takes no part, as in the spec
        smallest = tl.minimum(smallest, tl.where(m > 0, m, float("inf")))
    high = tl.max(largest, axis=0)
    low = tl.min(smallest, axis=0)
    need = tl.where(low < float("inf"), -133 + MBITS - _floor_log2(low), 0)
    room = tl.where((high < float("inf")) & (high > 0), 127 - _floor_log2(high), 127)
    shift = tl.minimum(tl.maximum(need, 0), room)
    factor = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(unshift_ptr + row, ((127 - shift) << 23).to(tl.float32, bitcast=True))
    for first in range(0, COLS, CHUNK):
        mask = first + offsets < COLS
        v = tl.load(start + first + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + row * COLS + first + offsets, _bf16_bits(v * factor), mask=mask)


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


__all__ = ["exact_bf16_rows"]
