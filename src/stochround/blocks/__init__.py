"""Block-scaled formats: MX (OCP v1.0), NVFP4, int8 row-wise and any block format of the
core's element formats, quantized with every rounding mode of the core, with random
Hadamard transforms and the 128x4 swizzled scale layout of block-scaled GEMMs.

`formats` describes the formats, `scales` the scale rules, `quantize` the entry points
(over `request`, the arguments' checks; `dispatch`, kernel or PyTorch path; `reference`,
the PyTorch path; `sharded`, DTensors; `tensor`, the `BlockTensor`), `gemm` the emulated
block-scaled GEMM, `hadamard` the rotations and `layout` the scale layouts.
"""

from __future__ import annotations

from ..block_constants import SCALE_RULES
from .formats import BLOCK_FORMATS, BlockFormat, block_format
from .gemm import scaled_mm
from .hadamard import hadamard, inverse_hadamard, random_signs
from .layout import swizzle_scales, unswizzle_scales
from .quantize import fake_quantize, gemm_operand, quantize, to_nvfp4
from .tensor import BlockTensor, GemmOperand, gemm_operand_of

__all__ = [
    "BLOCK_FORMATS",
    "SCALE_RULES",
    "BlockFormat",
    "BlockTensor",
    "GemmOperand",
    "block_format",
    "fake_quantize",
    "gemm_operand",
    "gemm_operand_of",
    "hadamard",
    "inverse_hadamard",
    "quantize",
    "random_signs",
    "scaled_mm",
    "swizzle_scales",
    "to_nvfp4",
    "unswizzle_scales",
]
