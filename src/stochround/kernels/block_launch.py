"""The block kernel's launch (`stochround.kernels.block_kernel.quantize_blocks_kernel`): a
call's checks (`check_block_call`, `check_block_tensors`), its arguments (`BlockCall`),
its constexprs, bound launch and grid (`block_grid`) and the launch itself
(`launch_blocks`), which `stochround.kernels.blocks`' entry points and prepared launches
share."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..block_constants import NVFP4_FLAVOURS, SCALE_RULES
from ..formats import Format
from ..formats import format as find_format
from ..random import seed_tensor
from ..reference import MODES, VARIANTS, check_choice, check_rbits
from .availability import current_device
from .block_kernel import (
    BlockOutput,
    BlockStream,
    BlockTiling,
    QuantizeTiling,
    check_tiling,
    quantize_blocks_kernel,
    quantize_tiling,
)
from .block_math import BlockScale, element_format, element_rounding
from .block_rotation import checked_rotation
from .common import INPUT_DTYPES, NAN16_BITS, as_int64, kernel_supports
from .grid import cdiv, next_power_of_2
from .runtime import Launch, PartialLaunch, Varying, bound_launch


def check_block_call(
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
    take (the callers check the rest: `stochround.blocks.request`)."""
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


class BlockCall(NamedTuple):
    """A call's checked element format and its arguments as `quantize_blocks` takes them
    (``flavour``: ``nvfp4_flavour``), with what the kernel stores (``output``) and where it
    raises the amax of what it quantizes (``record``: one fp32, or None:
    `block_kernel.raise_record`)."""

    fmt: Format
    block: int
    scale_rule: str
    output: str
    tensor_scale: Tensor | None
    mode: str
    n: int
    variant: str
    flavour: str
    seed: int | Tensor
    offset: int | Tensor
    index_offset: int
    rht: int | None
    rht_signs: Tensor | None
    rht_bf16: bool
    amax: Tensor | None
    tiling: QuantizeTiling | None = None
    flag_below: int = 0  # `BlockOutput.FLAG_BELOW`
    record: Tensor | None = None


def check_block_tensors(x: Tensor, call: BlockCall) -> None:
    """ValueError unless the call's given amax, tensor scale and record suit x."""
    amax, tensor_scale, record = call.amax, call.tensor_scale, call.record
    if record is not None and (
        record.dtype != torch.float32 or record.numel() != 1 or record.device != x.device
    ):
        raise ValueError("record must be a one-element float32 tensor on x's device")
    if amax is not None and (
        amax.dtype != torch.float32
        or amax.numel() != x.numel() // call.block
        or amax.device != x.device
        or not amax.is_contiguous()
        or call.rht is not None
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


class BlockGrid(NamedTuple):
    """A call's launch, fixed by its shape and choices: the bound kernel, its programs and
    blocks, and the checked signs of its rotation."""

    launch: Launch
    programs: int
    blocks: int
    signs: Tensor | None


class BlockConstants(NamedTuple):
    """A call's constexprs and launch options (as ``tuple(dict.items())``, in the kernel's
    order), its programs and blocks, and the checked signs of its rotation."""

    constants: tuple[tuple[str, object], ...]
    programs: int
    blocks: int
    signs: Tensor | None


def block_grid(x: Tensor, out_dtype: torch.dtype, call: BlockCall, from_tensors: bool) -> BlockGrid:
    """The launch of a checked call on x (its constexprs as typed records)."""
    bound = block_constants(x, out_dtype, call, from_tensors)
    launch = bound_launch(quantize_blocks_kernel, bound.constants)
    return BlockGrid(launch, bound.programs, bound.blocks, bound.signs)


def block_constants(
    x: Tensor, out_dtype: torch.dtype, call: BlockCall, from_tensors: bool
) -> BlockConstants:
    """The constexprs of `quantize_blocks_kernel` for a checked call on x (typed records),
    which a kernel built on `quantize_tile` takes too."""
    count = x.numel()
    block, index_offset = call.block, call.index_offset
    groups = next_power_of_2(cdiv(block, 4))
    rotation_size = call.rht or 0
    tiling = call.tiling or quantize_tiling(rotation_size, call.mode == "sr")
    check_tiling(tiling, groups * 4, rotation_size)
    tile = tiling.ELEMENTS // (groups * 4)
    if call.rht is not None and (groups * 4 != block or call.scale_rule == "absmax"):
        raise ValueError(
            f"rht= needs a block that is a power of two of at least 4 and a scale rule other "
            f"than 'absmax'; got block {block}, rule {call.scale_rule!r}"
        )
    signs, rotation = checked_rotation(
        x, call.rht, call.rht_signs, call.rht_bf16, tile * groups * 4
    )
    tensor_scales = 0 if call.tensor_scale is None else call.tensor_scale.numel()
    constants = {
        "TILING": BlockTiling(
            BLOCK=block,
            GROUPS=groups,
            TILE=tile,
            WIDE=count + index_offset + tile * groups * 4 >= 2**31,
        ),
        "STREAM": BlockStream(
            FROM_TENSORS=from_tensors, ALIGNED=index_offset % 4 == 0 and block % 4 == 0
        ),
        "SCALE": BlockScale(
            RULE=call.scale_rule,
            FLAVOUR=call.flavour,
            TENSOR_SCALE=tensor_scales,
            AMAX_GIVEN=call.amax is not None,
        ),
        "ELEMENT": element_format(call.fmt, call.mode),
        "ROUNDING": element_rounding(call.fmt, call.mode, call.n, call.variant),
        "ROTATION": rotation,
        "OUTPUT": BlockOutput(
            KIND=call.output,
            NAN16=NAN16_BITS.get(x.dtype, 0),
            OUT_NAN16=NAN16_BITS.get(out_dtype, 0) if call.output == "gemm" else 0,
            FLAG_BELOW=call.flag_below,
            RECORD=call.record is not None,
        ),
        "num_warps": tiling.WARPS,
        # no multiply-add contraction: every product is rounded, as the PyTorch path
        # rounds it (the inverse rotation adds products that can be inexact)
        "enable_fp_fusion": False,
    }
    blocks = count // block
    return BlockConstants(tuple(constants.items()), cdiv(blocks, tile), blocks, signs)


def stream_template(from_tensors: bool, seed: Varying, offset: Varying) -> tuple:
    """The kernels' four stream arguments (seed and offset pointers, then values) in a
    partial launch's template: the seed and offset where they come (tensors or ints), the
    other two fixed absent (None pointers, or 0 values)."""
    return (seed, offset, 0, 0) if from_tensors else (None, None, seed, offset)


def quantize_partial(
    grid: BlockGrid, values: Tensor, index_offset: int, from_tensors: bool
) -> PartialLaunch:
    """A prepared quantization's launch of ``grid``, taking x, the codes, the scales, the
    tensor scales (or None), the seed and the offset; fixed: the values it does not write,
    the signs, no amax and no record, the stream's other two arguments, the blocks, the
    index offset."""
    x, codes, scales, tensor_scale, seed, offset = map(Varying, range(6))
    stream = stream_template(from_tensors, seed, offset)
    return grid.launch.partial(
        (x, codes, scales, values, tensor_scale, grid.signs, None, None, *stream, grid.blocks,
         index_offset)
    )  # fmt: skip


def gemm_partial(grid: BlockGrid, empty: Tensor, index_offset: int) -> PartialLaunch:
    """A prepared GEMM operand's launch of ``grid`` (its stream from tensors), taking x, the
    flags, out, the tensor scales, the signs, the amax, the record, the seed and the
    offset; fixed: the codes and scales it does not write (``empty``), the stream's values,
    the blocks, the index offset."""
    x, flags, out, tensor_scale, signs, amax, record, seed, offset = map(Varying, range(9))
    stream = stream_template(True, seed, offset)
    return grid.launch.partial(
        (x, empty, flags, out, tensor_scale, signs, amax, record, *stream, grid.blocks,
         index_offset)
    )  # fmt: skip


def launch_blocks(x: Tensor, codes: Tensor, scales: Tensor, out: Tensor, call: BlockCall) -> None:
    """Launch the kernel on x's device (made current for the launch: Triton launches on
    the current device) for a checked call."""
    count = x.numel()
    if count == 0:
        return
    check_block_tensors(x, call)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            launch_blocks(x, codes, scales, out, call)
        return
    seed_pointer: Tensor | None = None
    offset_pointer: Tensor | None = None
    seed_value = offset_value = 0
    from_tensors = isinstance(call.seed, Tensor) or isinstance(call.offset, Tensor)
    if from_tensors:
        seed_pointer = seed_tensor(call.seed, "seed", x.device)
        offset_pointer = seed_tensor(call.offset, "offset", x.device)
    else:  # two's complement above 2**63: the kernel reads seeds as unsigned 64-bit
        seed_value, offset_value = as_int64(int(call.seed)), as_int64(int(call.offset))
    grid = block_grid(x, out.dtype, call, from_tensors)
    grid.launch(
        x.device.index if x.is_cuda else -1,
        grid.programs,
        x,
        codes,
        scales,
        out,
        call.tensor_scale,
        grid.signs,
        call.amax,
        call.record,
        seed_pointer,
        offset_pointer,
        seed_value,
        offset_value,
        grid.blocks,
        call.index_offset,
    )


__all__ = [
    "BlockCall",
    "BlockConstants",
    "BlockGrid",
    "block_constants",
    "block_grid",
    "check_block_call",
    "check_block_tensors",
    "gemm_partial",
    "launch_blocks",
    "quantize_partial",
    "stream_template",
]
