"""Rounding a DTensor shard by shard, each element with the random words of its global
index, so that the result does not depend on how the tensor is sharded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .. import random as streams
from ..packing import PACK_GROUPS
from ..reference import WORD_BITS
from ..shards import block_of, first_index, local_block, placed
from ..torch_path import Request, output_shape

if TYPE_CHECKING:  # for annotations only: DTensor is torch.distributed's
    from torch.distributed.tensor import DTensor


def round_dtensor(
    x: DTensor, request: Request, output: str, round_local: Callable[[Tensor, Request], Tensor]
) -> Tensor:
    """Round a DTensor shard by shard: each rank rounds its local tensor with
    ``round_local`` and the random words of its elements' global (row-major) indices, so
    the result does not depend on the sharding; replicated placements round identically.

    Placements: `Replicate` and `Shard(d)` of any dimension, on meshes of any shape.  A
    shard of whole rows (sharded along dimension 0 only) is a range of global indices: it
    rounds from its first one (``index_offset``).  Any other shard draws its words (the
    stream's, or ``rand="data"``'s) at its elements' global indices and rounds with them
    as explicit integers; explicit ``rand`` gives each shard its part.  Packed codes
    (`encode(packed=True)`, `cast` to fp4) may be sharded along the last dimension where
    every shard holds whole groups of codes and the packed shards are the chunks of the
    packed result.  A checked call (``nan="raise"``) raises on the ranks whose shard holds
    a NaN result."""
    mesh, placements = x.device_mesh, x.placements
    local_shape, global_offset = local_block(x)
    # the global result: x's shape (packed codes: shorter rows), contiguous
    shape = torch.Size(output_shape(x.shape, output))
    expected = block_of(shape, mesh, placements)[0]
    group = PACK_GROUPS.get(output)
    if group is not None and (
        local_shape[-1] % group or tuple(output_shape(torch.Size(local_shape), output)) != expected
    ):
        raise ValueError(
            f"packed codes of x of shape {tuple(x.shape)} sharded as {placements}: every "
            f"shard must hold whole groups of {group} codes along the last dimension, and "
            "the packed shards must be the chunks of the packed result"
        )
    local_x = x.to_local()
    local = round_local(local_x, _shard_request(x, local_x, request, local_shape, global_offset))
    return placed(local, mesh, placements, shape)


def _shard_request(
    x: Tensor,
    local_x: Tensor,
    request: Request,
    local_shape: Sequence[int],
    global_offset: Sequence[int],
) -> Request:
    """The request of a shard (local shape and global offset of its block of ``x``) that
    rounds its elements as the whole tensor's request rounds them (`round_dtensor`)."""
    start = first_index(x)
    if start is not None:  # whole rows: a range of indices
        rand = request.rand  # x's shape (checked): the shard's rows
        if rand is not None and x.dim():
            rand = rand[global_offset[0] : global_offset[0] + local_shape[0]]
        return request._replace(index_offset=request.index_offset + start, rand=rand)
    block = tuple(
        slice(first, first + size) for first, size in zip(global_offset, local_shape, strict=True)
    )
    if request.source == "rand":
        assert request.rand is not None  # checked: x's shape
        return request._replace(rand=request.rand[block])
    if request.mode != "sr":
        return request
    strides, device = torch.empty(x.shape, device="meta").stride(), local_x.device
    index = torch.full(tuple(local_shape), request.index_offset, dtype=torch.int64, device=device)
    for dim, (first, size) in enumerate(zip(global_offset, local_shape, strict=True)):
        along = torch.arange(first, first + size, dtype=torch.int64, device=device)
        index = index + (along * strides[dim]).reshape(
            [size if d == dim else 1 for d in range(x.dim())]
        )
    if request.source == "data":
        words = streams.data_words(local_x.detach(), index)
    else:
        words = streams.random_words(index, request.seed, request.offset)
    rand = words >> (WORD_BITS - request.n)
    return request._replace(source="rand", rand=rand, index_offset=0)


__all__ = ["round_dtensor"]
