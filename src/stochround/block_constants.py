"""The block formats' vocabulary, one home for what the PyTorch path (`stochround.blocks`)
and the Triton kernels (`stochround.kernels.blocks`) both name: the scale rules, NVFP4's
flavours, the Hadamard sizes, and the fp32 constants of the scale rules.

The kernels wrap the numbers as ``tl.constexpr`` (Triton reads only constexpr globals);
the values are the fp32 numbers the PyTorch path computes with, so both give the same
bits. The rules' math: docs/guide/blocks.md and `stochround.blocks.scales`.
"""

from __future__ import annotations

import struct

import torch

# every scale rule a block format may take; the first five give power-of-two (E8M0)
# scales: OCP MX ("floor"), cuBLAS ("rceil"), torchao ("ceil", "even") and Tseng et al.'s
# "floor-3/4"; "absmax" is int8 row-wise (torchao), "nvfp4" NVIDIA's two-level E4M3 scales
SCALE_RULES = ("floor", "rceil", "ceil", "even", "floor-3/4", "absmax", "nvfp4")
POWER_OF_TWO_RULES = SCALE_RULES[:5]

# whose random word a row-wise (absmax) operand's element draws under SR: its own, its
# row's (Qwix's noise along the first axis) or its column's (the same noise transposed)
ROW_WORDS = ("element", "row", "column")

# how NVFP4's scales are computed: Transformer Engine's order of operations, torchao's, or
# TE's with the tensor scale rounded up to a power of two ("pow2"), which a GEMM operand
# then carries in its values, exactly (docs/guide/block-formats.md)
NVFP4_FLAVOURS = ("te", "torchao", "pow2")
# the flavours whose GEMM operands hold the tensor scale in their values (no tensor scale
# left to the GEMM's result)
FOLDED_FLAVOURS = ("pow2",)
# the least "pow2" tensor scale's exponent: an operand value (an e2m1 element, at least
# 1/2, times an E4M3 block scale, at least 2**-9, times the tensor scale) then has its
# lowest bit, 2**-5 of it at most 6 significant bits, at or above bf16's 2**-133
POW2_LEAST_EXPONENT = -118

# the group lengths of the random Hadamard transform (powers of two), and the fp32 nearest
# sqrt(2) = 0x1.6a09e667f3bc...: rounding to 23 fraction bits drops about 0x0.00000067f3
# (below half an ulp, 2**-24), so this is nearest, not a truncation
HADAMARD_SIZES = (16, 32, 64, 128, 256)
SQRT2_FP32 = float.fromhex("0x1.6a09e6p+0")


def fp32(value: float) -> float:
    """The float nearest ``value`` that fp32 holds."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


E4M3_MAX = 448.0
E2M1_MAX = 6.0
E4M3_EPS = 2.0**-6  # torchao's lower clamp of NVFP4 block scales (e4m3's smallest normal)
FLT_MAX = float(torch.finfo(torch.float32).max)
ONE_SIXTH = fp32(1.0 / 6.0)  # Transformer Engine's fp32 1/6
ABSMAX_EPS = fp32(1e-12)  # torchao's quantize_int8_rowwise eps, as the fp32 it divides by

# floor-3/4: what the scaled elements are multiplied by, and dequantization undoes
SHRINK = 0.75
RESCALE = 4.0 / 3.0


def _rounded_up_eps(dtype: torch.dtype) -> float:
    eps = torch.tensor(ABSMAX_EPS, dtype=torch.float32)
    floor = eps.to(dtype)
    if floor.to(torch.float32) < eps:
        floor = torch.nextafter(floor, torch.ones((), dtype=dtype))
    return float(floor)


# the least row scale int8 row-wise stores and divides by, by the scales' dtype (x's):
# torchao's eps rounded up to that dtype (computed once: a traced call reads a constant)
ABSMAX_FLOORS: dict[torch.dtype, float] = {
    dtype: _rounded_up_eps(dtype)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
}

__all__ = [
    "ABSMAX_EPS",
    "ABSMAX_FLOORS",
    "E2M1_MAX",
    "E4M3_EPS",
    "E4M3_MAX",
    "FLT_MAX",
    "FOLDED_FLAVOURS",
    "HADAMARD_SIZES",
    "NVFP4_FLAVOURS",
    "ONE_SIXTH",
    "POW2_LEAST_EXPONENT",
    "POWER_OF_TWO_RULES",
    "RESCALE",
    "ROW_WORDS",
    "SCALE_RULES",
    "SHRINK",
    "SQRT2_FP32",
    "fp32",
]
