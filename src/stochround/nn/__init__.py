"""Quantized training: recipes (`Recipe`, `QuantSpec` and the named NVFP4, MXFP4, MXFP8,
FP8 and int8 recipes), the `QuantizedLinear` layer whose three GEMMs take quantized
operands (emulated: dequantized operands, fp32 matmul), `quantize_`, which swaps a
model's `nn.Linear` layers for it, and `unquantize_`, the way back; Gaussian weight
sampling (`GaussWS`, a parametrization that samples each training forward's weight with
rounded-Gaussian noise at a target format's resolution, `gaussws_`, which registers it on
a model's `nn.Linear` weights, and the functional `sample_weight`).

`recipes` holds the data, `linear` the layer, `layer_plan` the recipe resolved for a
layer, `matmul` the layer's autograd function, `operands` the
quantization of one GEMM operand, `orientations` both orientations of a tensor from one
read, `tensor_parallel` the layer under torch's colwise and rowwise tensor parallelism,
`recompute` the step a checkpoint's recomputation reads, `streams` the stream offsets of a
step's draws, `step_ops` the step's opaque ops under torch.compile, `step_graphs` the
CUDA graphs of a layer's step (`use_step_graphs` turns them off), `apply` the module
swaps (both ways), `gaussws_noise` the sampling's noise (the PyTorch path the kernel
matches) and `gaussws` the sampling applied to a model.
"""

from __future__ import annotations

from . import recipes
from .apply import quantize_, unquantize_
from .gaussws import GaussWS, gaussws_, sample_weight
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
from .step_graphs import use_step_graphs

__all__ = [
    "RECIPES",
    "ROLES",
    "GaussWS",
    "QuantSpec",
    "QuantizedLinear",
    "Recipe",
    "bf16",
    "fp8",
    "gaussws_",
    "int8",
    "mxfp4_tseng",
    "mxfp8",
    "nvfp4",
    "quantize_",
    "recipes",
    "sample_weight",
    "stream_offset",
    "unquantize_",
    "use_step_graphs",
]
