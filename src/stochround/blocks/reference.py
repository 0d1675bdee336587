"""The PyTorch path of block quantization, the executable definition that the Triton kernel
(`stochround.kernels.blocks`) matches bit for bit: rotate, cut into blocks, scale each block
by its rule, round the elements with the core.  The manual: docs/guide/blocks.md."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..block_constants import POWER_OF_TWO_RULES
from ..formats import Format
from ..packing import pack_codes
from ..reference import WORD_BITS
from ..rounding import encode
from ..rounding import round as round_to
from .formats import OCP_INT8, Block, BlockFormat
from .hadamard import hadamard
from .layout import swizzle_scales
from .request import BlockRequest, default_signs, given_scales, tensor_scale_choice
from .scales import (
    TensorScale,
    absmax_scales,
    as_e8m0,
    e8m0_codes,
    nvfp4_scales,
    nvfp4_tensor_scales,
    power_of_two_exponent,
    power_of_two_multiply,
)
from .tensor import BlockTensor, stored_codes

__all__ = ["absolute_max", "quantize_torch", "rht_rotated"]


def rht_rotated(
    x: Tensor, rht: int | None, signs: Tensor | None, axis: int, rht_bf16: bool
) -> tuple[Tensor, Tensor | None]:
    """x rotated by the Hadamard transform of ``rht`` values along axis (and its signs)."""
    if rht is None:
        if signs is not None:
            raise ValueError("rht_signs applies with rht= (the Hadamard size); got rht=None")
        return x, None
    if signs is None:
        signs = default_signs(rht, x.device)
    narrow = x.dtype in (torch.bfloat16, torch.float16)
    rotated = hadamard(x.float() if narrow else x, rht, signs=signs, axis=axis)
    # narrowed by the core's op, not a cast: where a narrowed tensor only feeds further
    # arithmetic, inductor keeps the cast's input at full precision, which would change
    # the bits under torch.compile; the op's values are on the narrow grid whatever follows
    if narrow:
        rotated = round_to(rotated, x.dtype, "rne").to(x.dtype)
    if rht_bf16:
        rotated = round_to(rotated, torch.bfloat16, "rne").to(torch.bfloat16)
    return rotated, signs


def _blocked_amax(values: Tensor, block: Block) -> Tensor:
    """Each block's max |value| (NaN where the block holds NaN), with a unit axis per block
    axis so that it broadcasts over ``_blocked(values)``."""
    return _blocked(values, block).abs().amax(dim=_block_dims(block), keepdim=True)


def _blocked(values: Tensor, block: Block) -> Tensor:
    """values (quantized layout) with the block axes split out."""
    if isinstance(block, tuple):
        *lead, rows, cols = values.shape
        return values.reshape(*lead, rows // block[0], block[0], cols // block[1], block[1])
    length = values.shape[-1]
    size = length if block is None else block
    return values.reshape(*values.shape[:-1], length // size, size)


def _block_dims(block: Block) -> tuple[int, ...]:
    return (-3, -1) if isinstance(block, tuple) else (-1,)


def _squeeze_blocks(scales: Tensor, block: Block) -> Tensor:
    return scales.squeeze(-1).squeeze(-2) if isinstance(block, tuple) else scales.squeeze(-1)


def _scale_and_multiplier(
    values: Tensor,
    fmt: BlockFormat,
    flavour: str,
    tensor_scale: TensorScale | None,
) -> tuple[Tensor, Tensor]:
    """The blocks' scales (squeezed; E8M0 scales as their uint8 codes, which `as_e8m0`
    views as torch.float8_e8m0fnu) and the scaled fp32 elements (blocked layout) of
    ``values`` (the quantized layout: fp32, bf16 or fp16)."""
    rule = fmt.scale_rule
    amax = _blocked_amax(values, fmt.block)
    blocked = _blocked(values, fmt.block).to(torch.float32)
    if rule in POWER_OF_TWO_RULES:
        exponent = power_of_two_exponent(
            amax, rule, emax=fmt.element_emax, mbits=fmt.element_mbits, max_value=fmt.element_max
        )
        scaled = power_of_two_multiply(blocked, exponent, amax, rule)
        return _squeeze_blocks(e8m0_codes(exponent, amax), fmt.block), scaled
    if rule == "nvfp4":
        scales, multiplier = nvfp4_scales(amax, tensor_scale, flavour)
    else:
        scales, multiplier = absmax_scales(amax, fmt.element_max)
    return _squeeze_blocks(scales, fmt.block), blocked * multiplier


def _element_codes(
    scaled: Tensor,
    element: Format,
    request: BlockRequest,
    seed: int | Tensor,
    offset: int | Tensor,
    packed: bool,
) -> Tensor:
    """The elements' codes (uint8; 4-bit codes packed two a byte where ``packed``) of the
    scaled fp32 values, rounded by the core with sat="finite"; SR draws the word of each
    value's row-major position in ``scaled``.  A hardware preset rounds with its own
    saturation: the values are first clamped to the element's finite range, which
    saturates them whatever the preset's."""
    kwargs: dict[str, Any] = {"nan": "zero", "packed": packed, "backend": "torch"}
    if request.mode == "sr":
        kwargs.update(seed=seed, offset=offset, index_offset=request.index_offset)
    if element == OCP_INT8:
        # MXINT8's symmetric range (`OCP_INT8`): -2 (code -128) is never stored, so that
        # the largest scale cannot take a finite block to -2 * 2**127, an fp32 -inf
        scaled = scaled.clamp(min=-request.fmt.element_max)
    if request.hardware is not None:
        bound = request.fmt.element_max
        clamped = scaled.clamp(-bound, bound)
        return encode(clamped, element, "sr", hardware=request.hardware, **kwargs)
    rbits = request.n if request.mode == "sr" and request.n != WORD_BITS else None
    return encode(
        scaled,
        element,
        request.mode,
        rbits=rbits,
        variant=request.variant,
        sat="finite",
        **kwargs,
    )


def quantize_torch(
    x: Tensor,
    request: BlockRequest,
    *,
    tensor_scale: Tensor | float | bool | TensorScale | None = None,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    swizzle: bool = False,
) -> tuple[BlockTensor, Tensor]:
    """The PyTorch path: the `BlockTensor` of x and a bool mask, in x's layout, of the
    elements whose scaled value lay beyond the element's finite range (clipped by the
    saturation), for `fake_quantize`'s ``clip_mask``.  Arguments as `quantize` takes them,
    checked (``request``: the choices; ``seed``/``offset`` the stream, already drawn).

    The steps: rotate x by the RHT along the axis (`rht_rotated`); move the axis last (1-D
    blocks) and cut it into blocks; each block's amax (NaN if it holds a NaN) gives its
    scale and fp32 multiplier by the scale rule, NVFP4's tensor scale from the whole
    amax; the elements ``fp32(x) * multiplier`` are rounded by the core, saturating to
    the finite range.  SR draws ``random_words(index_offset + i, seed, offset)`` for the
    element of row-major index ``i`` in x (before the axis moves), so that every device,
    compiled or not, whole or sharded, gets the same bits."""
    fmt, axis = request.fmt, request.axis
    rotated, signs = rht_rotated(x, rht, rht_signs, axis, rht_bf16)
    if rotated.dtype == torch.float64:
        # rounded to fp32 before any amax, as the values are scaled in fp32: a value beyond
        # fp32's range is an infinity, whose block is the one an fp32 infinity makes (NaN
        # for the MX formats), not one scaled by a finite scale that its values overflow
        rotated = rotated.to(torch.float32)
    choice = tensor_scale_choice(fmt, tensor_scale)
    pair: TensorScale | None = None
    if choice == "amax":
        pair = nvfp4_tensor_scales(absolute_max(rotated), request.flavour)
    elif choice != "none":
        pair = given_scales(tensor_scale, x.device)
    tiles = isinstance(fmt.block, tuple)
    moved = not tiles and axis != x.dim() - 1
    layout = rotated.movedim(axis, -1) if moved else rotated
    scales, scaled = _scale_and_multiplier(layout, fmt, request.flavour, pair)
    flat = scaled.reshape(layout.shape)
    packed = fmt.element.bits == 4
    if moved and request.mode == "sr":
        # rounded in x's layout, where each value's row-major position is its index in x
        # (its word's), then moved with the axis and packed along it; inside the core's one
        # op, so that no Philox rounds reach inductor's graph
        in_x = flat.movedim(-1, axis)
        unpacked = _element_codes(in_x, fmt.element, request, seed, offset, packed=False)
        codes = unpacked.movedim(axis, -1).contiguous()
        if packed:
            codes = pack_codes(codes, fmt.element.bits)
    else:
        codes = _element_codes(flat, fmt.element, request, seed, offset, packed=packed)
    clipped = flat.abs() > fmt.element_max
    if moved:
        clipped = clipped.movedim(-1, axis)
    if fmt.scale_rule == "absmax":
        scales = scales.to(x.dtype)  # held in x's dtype (float64's: its fp32 scale)
    scale_shape = tuple(scales.shape)
    if swizzle:
        scales = swizzle_scales(scales.reshape(-1, scale_shape[-1]))
    if fmt.scale_rule in POWER_OF_TWO_RULES:
        scales = as_e8m0(scales)
    result = BlockTensor(
        codes=stored_codes(codes, fmt.element),
        scales=scales,
        tensor_scale=None if pair is None else pair.decode,
        format=fmt,
        axis=axis,
        shape=x.shape,
        dtype=x.dtype,
        rht=rht,
        rht_signs=signs,
        swizzled=swizzle,
        scale_shape=scale_shape,
    )
    return result, clipped


def absolute_max(x: Tensor) -> Tensor:
    """max |x| in fp32, a 0-d tensor: NaN if x holds a NaN, 0 for an x with no elements
    (nothing raises the maximum of |x| >= 0), as the kernels' amax gives it."""
    if not x.numel():
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.abs().amax().to(torch.float32)
