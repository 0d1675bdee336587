"""The entry points of block quantization: `quantize` (a `BlockTensor`), `fake_quantize`,
`gemm_operand` and `to_nvfp4`.  Each bundles its arguments (`BlockArguments`) and sends a
DTensor to `sharded`, any other tensor to `dispatch` (the kernel or the PyTorch path of
`reference`).  The manual: docs/guide/blocks.md."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .. import random as streams
from ..block_constants import FOLDED_FLAVOURS
from ..kernels.availability import check_backend
from ..reference import check_choice
from ..shards import is_dtensor
from .dispatch import fake_quantize_local, kernel_gemm_operand, quantize_local
from .formats import Block, BlockFormat
from .request import BlockArguments
from .sharded import fake_quantize_shards, quantize_shards
from .tensor import (
    BlockTensor,
    GemmOperand,
    folded_tensor_scale,
    gemm_operand_of,
    rebuild_block_tensor,
)

# rebuild_block_tensor: saved BlockTensors of earlier versions name it in this module
__all__ = ["fake_quantize", "gemm_operand", "quantize", "rebuild_block_tensor", "to_nvfp4"]

_ROUNDING_MODES = {"rn": "rne", "rs": "sr"}  # to_nvfp4's names (torchao RFC #3264)


def quantize(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    axis: int = -1,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    swizzle: bool = False,
) -> BlockTensor:
    """Quantize x into a block-scaled format: each block's scale from its amax by the scale
    rule, the elements ``fp32(x) * multiplier`` rounded to the element format (the
    steps: `stochround.blocks.reference.quantize_torch`; the scale rules:
    `stochround.blocks.scales`; the manual: docs/guide/blocks.md).

    Args:
        x: a float64, float32, bfloat16 or float16 tensor (TypeError otherwise); its
            values are scaled in fp32 (float64 values are rounded to fp32 first).
        fmt: a block format name (`BLOCK_FORMATS`) or a `BlockFormat`.
        mode: the elements' rounding mode: rne, rna, rz, ru, rd, ro or sr.
        axis: the axis the 1-D blocks run along (moved last in the codes and scales);
            2-D tiles cover the last two axes (axis -1).
        block: replaces the format's block (an int, a 2-D tile ``(rows, cols)``, or None
            for the format's); it must divide the axis (ValueError; no padding).
        scale_rule: replaces the format's scale rule (one of `SCALE_RULES`, matching its
            scale format: the power-of-two rules for E8M0 scales).
        tensor_scale: NVFP4's per-tensor scale: None computes it from x's amax, a float
            or one-element tensor gives the decoding scale (delayed scaling; stored as
            ``BlockTensor.tensor_scale``; positive and finite, else ValueError, checked
            for numbers and CPU tensors), False quantizes single-level.
        nvfp4_flavour: "te" (default) or "torchao": whose operation order computes NVFP4
            scales (`stochround.blocks.scales`); "pow2": TE's, with the tensor scale
            rounded up to a power of two, which a GEMM operand then holds in its values.
        rht: the size of a random Hadamard transform applied along ``axis`` before
            quantizing (16..256, dividing the axis), or None.
        rht_signs: its ±1 signs (a tensor of ``rht`` values), or None for
            ``random_signs(rht, seed=RHT_SEED)``: one fixed rotation for every call, so
            that two GEMM operands share it whatever their rounding seeds.
        rht_bf16: round the rotated values to bf16 before taking amax (as TE does).
        rbits, variant: limited-bit SR (1..32 random bits; None: exact SR) and its variant
            a/b/c/odd, as `stochround.round`.
        seed, offset, stream: the SR stream, as `stochround.round` takes them (seed None:
            drawn from torch's default generator; ``stream`` advances by one per SR call).
            Element ``i`` (row-major index in x) draws ``random_words(i, seed, offset)``.
        hardware: a hardware SR preset for the elements (for instance
            ``"nvidia-cvt-rs-e2m1"``), with mode "sr".
        index_offset: the global row-major index of x's first element in the tensor x is
            a shard of (element ``i`` draws the word of ``index_offset + i``): a shard of
            whole rows quantized with ``index_offset = first_row * row_length`` gets the
            bits of the same rows of the whole tensor.
        backend: "auto" (the Triton kernel for CUDA tensors it serves, else the PyTorch
            path), "torch" or "triton".
        swizzle: store the scales in the 128x4 tiled layout (`swizzle_scales`).

    A DTensor x (placements `Replicate` or `Shard(0)`, on any mesh: each rank's shard a
    range of whole rows) is quantized shard by shard, each rank its local tensor with the
    words of its elements' global indices and NVFP4's tensor scale from the global amax
    (an all-reduce over the mesh dimensions that shard x): the codes and scales are
    DTensors placed as x, equal (``full_tensor()``) to the unsharded call's bit for bit;
    ``dequantize()`` gives a DTensor placed as x.  ValueError for: the blocks along axis 0
    of a sharded x; 2-D tiles over x's two axes that a shard boundary cuts (every shard's
    first row and row count must be multiples of the tile's rows); swizzled scales whose
    shards are not the chunks of the whole tensor's (each shard's scale rows from a
    multiple of 128, filling their tiles); other placements (`Shard(d)` of another
    dimension, `Partial`, `_StridedShard`); and mode "sr" without ``seed=`` or
    ``stream=`` (the ranks must agree on the seed).

    Returns a `BlockTensor`.
    """
    # `BlockArguments.choices`: its fields in their order, the stream's apart (a call that
    # finds its plan makes no record of its arguments)
    choices = (
        fmt, mode, axis, block, scale_rule, tensor_scale, nvfp4_flavour, rht, rht_signs,
        rht_bf16, rbits, variant, hardware, index_offset, backend,
    )  # fmt: skip
    if is_dtensor(x):
        return quantize_shards(x, BlockArguments.of(choices, seed, offset, stream), swizzle)
    return quantize_local(x, choices, swizzle, seed, offset, stream)


def fake_quantize(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    clip_mask: bool = False,
    axis: int = -1,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
) -> Tensor:
    """``quantize(x, ...).dequantize(x.dtype, unrotate=True)``: the quantized values in x's
    dtype, shape and basis (a Hadamard rotation is undone), with a straight-through
    gradient: d out / d x := 1, or 0 where ``clip_mask`` is True and the element's scaled
    value lay beyond the element's finite range (saturated).  The other arguments as in
    `quantize`; the Triton kernel writes the dequantized values itself where it serves the
    call (``backend``, routed as `quantize` routes it), except with ``clip_mask``, whose
    mask the PyTorch path computes.  A DTensor x (`Replicate` or `Shard(0)`, the rules of
    `quantize`) gives a DTensor placed as x, equal (``full_tensor()``) to the unsharded
    call's: each rank fake-quantizes its shard."""
    check_backend(backend)
    if backend == "triton" and clip_mask:
        raise ValueError("clip_mask=True runs on the PyTorch path: pass backend='auto' or 'torch'")
    if not isinstance(clip_mask, bool):
        raise TypeError(f"clip_mask must be a bool, got {type(clip_mask).__name__}")
    args = BlockArguments(
        fmt, mode, axis, block, scale_rule, tensor_scale, nvfp4_flavour, rht, rht_signs,
        rht_bf16, rbits, variant, seed, offset, stream, hardware, index_offset, backend,
    )  # fmt: skip
    if is_dtensor(x):
        return fake_quantize_shards(x, clip_mask, args)
    return fake_quantize_local(x, clip_mask, args)


def gemm_operand(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
) -> GemmOperand:
    """``gemm_operand_of(quantize(x, ...))``: a 2-D x quantized along its last axis (the
    GEMM's contraction axis) as a GEMM takes it (`GemmOperand`), the rotated basis kept.
    Arguments as `quantize` takes them; the Triton kernel writes the values itself where
    it serves the call (blocks with their own scales: not whole rows, whose scales the
    `GemmOperand` keeps apart), as exact as the codes.  Under ``nvfp4_flavour="pow2"`` the
    values hold the power-of-two tensor scale (`folded_tensor_scale`): the operand has
    none, and the GEMM no scaling of its result to do."""
    args = BlockArguments(
        fmt, mode, -1, block, scale_rule, tensor_scale, nvfp4_flavour, rht, rht_signs,
        rht_bf16, rbits, variant, seed, offset, stream, hardware, index_offset, backend,
    )  # fmt: skip
    operand = kernel_gemm_operand(x, args)
    if operand is not None:
        return operand
    q = quantize(
        x,
        fmt,
        mode,
        block=block,
        scale_rule=scale_rule,
        tensor_scale=tensor_scale,
        nvfp4_flavour=nvfp4_flavour,
        rht=rht,
        rht_signs=rht_signs,
        rht_bf16=rht_bf16,
        rbits=rbits,
        variant=variant,
        seed=seed,
        offset=offset,
        stream=stream,
        hardware=hardware,
        index_offset=index_offset,
        backend=backend,
    )
    operand = gemm_operand_of(q)
    # the kernel's values hold a "pow2" tensor scale: the same products
    return folded_tensor_scale(operand) if nvfp4_flavour in FOLDED_FLAVOURS else operand


def to_nvfp4(x: Tensor, rounding_mode: str = "rn", **options: Any) -> BlockTensor:
    """``quantize(x, "nvfp4", mode)`` with torchao RFC #3264's names for the mode:
    ``rounding_mode="rn"`` (round to nearest-even) or ``"rs"`` (stochastic rounding); the
    other keyword arguments as `quantize` takes them."""
    check_choice("rounding_mode", rounding_mode, tuple(_ROUNDING_MODES))
    if "mode" in options:
        raise ValueError("to_nvfp4 takes rounding_mode= ('rn' or 'rs'), not mode=")
    return quantize(x, "nvfp4", _ROUNDING_MODES[rounding_mode], **options)
