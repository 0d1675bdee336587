"""Quantized training: recipes (`Recipe`, `QuantSpec` and the named NVFP4, MXFP4, MXFP8,
FP8 and int8 recipes), the `QuantizedLinear` layer whose three GEMMs take quantized
operands (emulated: dequantized operands, fp32 matmul), and `quantize_`, which swaps a
model's `nn.Linear` layers for it.

`recipes` holds the data, `linear` the layer and its autograd function, `apply` the
module swap.
"""

from __future__ import annotations

from . import recipes
from .apply import quantize_
from .linear import QuantizedLinear, stream_offset
from .recipes import (
    RECIPES,
    ROLES,
    QuantSpec,
    Recipe,
    bf16,
    fp8,
    int8,
    mxfp4_tseng,
    mxfp8,
    nvfp4,
)

__all__ = [
    "RECIPES",
    "ROLES",
    "QuantSpec",
    "QuantizedLinear",
    "Recipe",
    "bf16",
    "fp8",
    "int8",
    "mxfp4_tseng",
    "mxfp8",
    "nvfp4",
    "quantize_",
    "recipes",
    "stream_offset",
]
