"""DTensor inputs: each rank quantizes its shard of whole rows (placements `Replicate` or
`Shard(0)`) with the words of its elements' global indices and the whole tensor's NVFP4
tensor scale, so that the shards hold the unsharded call's bits.  The manual:
docs/guide/blocks.md."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from ..shards import block_of, local_block, placed
from .dispatch import fake_quantize_local, quantize_local
from .formats import BlockFormat
from .layout import SCALE_TILE, swizzled_shape
from .reference import absolute_max, rht_rotated
from .request import BlockArguments, BlockRequest, check_call, check_extras, tensor_scale_choice
from .scales import TensorScale, nvfp4_tensor_scales
from .tensor import BlockTensor, output_shapes

if TYPE_CHECKING:  # for annotations only: importing distributed costs every plain call
    from torch.distributed.tensor import DTensor

__all__ = ["fake_quantize_shards", "quantize_shards"]


class _ShardLayout(NamedTuple):
    """Where this rank's shard of a DTensor x lies and where its outputs go in the whole
    tensor's: ``first_index``, the global row-major index of the shard's first element
    (``first_row * row_length``); the global shapes of the codes and of the scales
    (swizzled where swizzled) and the shard's first row in each; ``scale_shape``, the
    global unswizzled scales' shape."""

    first_index: int
    codes_shape: tuple[int, ...]
    codes_first: int
    scales_shape: tuple[int, ...]
    scales_first: int
    scale_shape: tuple[int, ...]


def _every_shard_rows(x: DTensor) -> list[tuple[int, int]]:
    """(first row, rows) along dimension 0 of the shard of every rank of x's mesh:
    computed alike on every rank, so that a rule refusing one rank's shard refuses the call
    on every rank (none is left waiting in the amax's all-reduce)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = x.device_mesh
    shards = []
    for coordinate in itertools.product(*(range(size) for size in mesh.shape)):
        shape, offset = _compute_local_shape_and_global_offset(
            x.shape, mesh.shape, list(coordinate), x.placements
        )
        shards.append((offset[0], shape[0]))
    return shards


def _check_placements(x: DTensor, fmt: BlockFormat, axis: int) -> bool:
    """Whether some placement of x shards it; ValueError unless every placement is
    `Replicate` or `Shard(0)` (a shard of whole rows) and, where x is sharded, the 1-D
    blocks run along another axis than 0 (no shard cuts a block)."""
    from torch.distributed.tensor import Replicate, Shard

    sharded = False
    for placement in x.placements:
        if isinstance(placement, Replicate):
            continue
        # exactly Shard: its subclass _StridedShard holds no range of whole rows
        if type(placement) is not Shard or placement.dim != 0:
            raise ValueError(
                "a DTensor x must be placed Replicate or Shard(0) (each shard a range of "
                f"whole rows, the blocks along the last axis); got placements {x.placements}: "
                f"{placement} is not supported"
            )
        sharded = True
    if sharded and axis == 0 and not isinstance(fmt.block, tuple):
        raise ValueError(
            f"x sharded as {x.placements} cuts its axis 0, which the blocks run along: "
            "quantize a Shard(0) x along another axis (the last: axis=-1)"
        )
    return sharded


def _shard_layout(x: DTensor, request: BlockRequest, swizzle: bool) -> _ShardLayout:
    """This rank's `_ShardLayout`, the sharding rules checked for every rank's shard
    (ValueError naming the rule and the shard's rows): placements `Replicate` or `Shard(0)`
    (`_check_placements`); 2-D tiles over x's two axes: every shard's first row and row
    count multiples of the tile's rows; swizzled scales: every shard's scale rows start on
    a 128-row scale tile and fill their tiles (the last shard's may end short), so that
    the swizzled shards are the chunks of the whole tensor's swizzled scales."""
    fmt, axis = request.fmt, request.axis
    sharded = _check_placements(x, fmt, axis)
    shards = _every_shard_rows(x) if sharded else []
    block = fmt.block
    # the rows of x per row of scales along dimension 0 (2-D tiles over x's two axes)
    tile_rows = block[0] if isinstance(block, tuple) and x.dim() == 2 else 1
    codes_shape, scale_shape = output_shapes(x.shape, fmt, axis)
    # the swizzle's [rows, cols] view: scale matrix rows per scale row of dimension 0
    per_row, matrix_rows = math.prod(scale_shape[1:-1]), math.prod(scale_shape[:-1])
    for first, rows in shards:
        if first % tile_rows or rows % tile_rows:
            raise ValueError(
                f"2-D blocks {block} must not straddle shards: every shard's first row and "
                f"row count must be multiples of {tile_rows}; a shard holds rows "
                f"{first}..{first + rows} of {x.shape[0]} (placements {x.placements})"
            )
        start, count = first // tile_rows * per_row, rows // tile_rows * per_row
        tile = SCALE_TILE[0]
        if swizzle and (start % tile or (count % tile and start + count != matrix_rows)):
            raise ValueError(
                "swizzle=True with a sharded x needs every shard's scale rows to start on a "
                f"multiple of {tile} and fill {tile}-row tiles (the last shard excepted), so "
                f"that its swizzled scales are a chunk of the whole tensor's; a shard holds "
                f"scale rows {start}..{start + count} of {matrix_rows}: pass swizzle=False"
            )
    local_shape, offset = local_block(x)
    first_row = offset[0] if local_shape[0] else 0
    scales_shape, scales_first = scale_shape, first_row // tile_rows
    if swizzle:
        scales_shape = swizzled_shape(matrix_rows, scale_shape[-1])
        scales_first = swizzled_shape(scales_first * per_row, 1)[0]
    return _ShardLayout(
        first_row * math.prod(x.shape[1:]),
        codes_shape,
        first_row,
        scales_shape,
        scales_first,
        scale_shape,
    )


def _as_shards(local: Tensor, x: DTensor, shape: tuple[int, ...], first: int) -> DTensor:
    """``local`` (an output of this rank's shard) as the DTensor of global ``shape`` with
    x's mesh and placements; ValueError unless it is that DTensor's shard on this rank
    (its shape, and its first row ``first``)."""
    expected, offset = block_of(torch.Size(shape), x.device_mesh, x.placements)
    if tuple(local.shape) != tuple(expected) or (local.numel() and offset[0] != first):
        raise ValueError(
            f"x of shape {tuple(x.shape)} sharded as {x.placements}: this rank's output of "
            f"shape {tuple(local.shape)} from row {first} is not the shard {tuple(expected)} "
            f"from row {offset[0]} of the whole output of shape {shape}"
        )
    return placed(local, x.device_mesh, x.placements, shape)


def _global_amax(x: DTensor, amax: Tensor) -> Tensor:
    """The amax of the whole of x from this rank's shard's ``amax`` (fp32, 0-d): the
    maximum over the ranks of each mesh dimension that shards x (all-reduce MAX), NaN if
    any shard's is NaN (the NaN travels as a flag: a reduction's MAX need not keep it)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    nan = amax.isnan()
    stats = torch.stack([torch.where(nan, torch.zeros_like(amax), amax), nan.to(amax.dtype)])
    for dim, placement in enumerate(x.placements):
        if isinstance(placement, Shard):
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=x.device_mesh.get_group(dim))
    return torch.where(stats[1] > 0, torch.full_like(stats[0], float("nan")), stats[0])


def _sharded_tensor_scale(
    x: DTensor, local: Tensor, request: BlockRequest, args: BlockArguments
) -> TensorScale:
    """NVFP4's tensor scales of the whole of x (a `TensorScale`): ``nvfp4_tensor_scales`` of
    the global amax of x rotated as the call rotates it, the same on every rank."""
    rotated, _ = rht_rotated(local, args.rht, args.rht_signs, request.axis, args.rht_bf16)
    return nvfp4_tensor_scales(_global_amax(x, absolute_max(rotated)), request.flavour)


def _sharded_call(
    x: DTensor, args: BlockArguments, swizzle: bool
) -> tuple[Tensor, _ShardLayout, BlockArguments]:
    """A call on a DTensor x checked, and what each rank's call on its local tensor takes:
    the local tensor, its `_ShardLayout`, and the arguments with ``index_offset`` moved by
    the shard's first index and NVFP4's tensor scale from the global amax given.  SR needs
    ``seed=`` or ``stream=``: a seed drawn from each rank's generator need not agree."""
    x_checked, request = check_call(x, args)
    check_extras(x_checked, request, args)
    layout = _shard_layout(x, request, swizzle)
    if request.mode == "sr" and args.seed is None and args.stream is None:
        raise ValueError(
            "a DTensor x rounded with mode='sr' needs seed= (or stream=): every rank must "
            "draw the same words, and a seed drawn from each rank's generator need not agree"
        )
    local = x.to_local()
    tensor_scale = args.tensor_scale
    if tensor_scale_choice(request.fmt, tensor_scale) == "amax":
        tensor_scale = _sharded_tensor_scale(x, local, request, args)
    index_offset = request.index_offset + layout.first_index
    return local, layout, args._replace(index_offset=index_offset, tensor_scale=tensor_scale)


def quantize_shards(x: DTensor, args: BlockArguments, swizzle: bool) -> BlockTensor:
    """`quantize` of a DTensor x: each rank quantizes its local tensor (`quantize_local`);
    the codes and scales are DTensors with x's mesh and placements, equal
    (``full_tensor()``) to the unsharded call's; the tensor scale a plain 0-d tensor, the
    same on every rank."""
    local, layout, local_args = _sharded_call(x, args, swizzle)
    stream = local_args.seed, local_args.offset, local_args.stream
    q = quantize_local(local, local_args.choices(), swizzle, *stream)
    return dataclasses.replace(
        q,
        codes=_as_shards(q.codes, x, layout.codes_shape, layout.codes_first),
        scales=_as_shards(q.scales, x, layout.scales_shape, layout.scales_first),
        shape=x.shape,
        scale_shape=layout.scale_shape,
    )


def fake_quantize_shards(x: DTensor, clip_mask: bool, args: BlockArguments) -> DTensor:
    """`fake_quantize` of a DTensor x: each rank's local tensor fake-quantized as a shard
    of the whole (`fake_quantize_local`), the result a DTensor placed as x (the
    straight-through gradient passes through ``to_local`` and ``from_local``)."""
    from torch.distributed.tensor import DTensor

    local, _, local_args = _sharded_call(x, args, False)
    out = fake_quantize_local(local, clip_mask, local_args)
    return DTensor.from_local(out, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())
