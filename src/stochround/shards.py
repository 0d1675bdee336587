"""Where a rank's shard of a DTensor lies in the whole tensor: the global indices its
elements' random words are drawn at.

stochround keys every random word by the global row-major index of the element it rounds,
so a sharded tensor rounds as the whole tensor does when each rank knows where its local
tensor sits. A shard of whole rows (placements `Replicate` or `Shard(0)`, on any mesh) is
one range of global indices, from `first_index`; any other shard of `Shard(d)` placements
is a block of the tensor (`local_block`) whose indices are computed element by element.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor


def is_dtensor(x: object) -> TypeGuard[DTensor]:
    """Whether x is a DTensor (by name: importing torch.distributed.tensor costs every
    plain call)."""
    return type(x).__name__ == "DTensor"


def local_block(x: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, global offset) of this rank's shard of x: its block of the whole
    tensor. ValueError for placements other than `Replicate` and `Shard(d)` (`Partial`
    holds no values of the whole tensor yet; `_StridedShard`, no block of it)."""
    return block_of(x.shape, x.device_mesh, x.placements)


def block_of(
    shape: torch.Size, mesh: DeviceMesh, placements: tuple
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`local_block` of a DTensor of ``shape`` on ``mesh`` placed by ``placements`` (also
    the block of an output of another shape placed as its input)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for placement in placements:
        # exactly Shard: its subclass _StridedShard holds no block of the global tensor
        if not (isinstance(placement, Replicate) or type(placement) is Shard):
            raise ValueError(
                f"DTensor placements must be Replicate or Shard(dim) for SR; got {placements}"
            )
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    return tuple(local_shape), tuple(offset)


def holds_whole_rows(x: DTensor, local_shape: tuple[int, ...]) -> bool:
    """Whether a shard of ``local_shape`` holds whole rows of x (every dimension but the
    first complete): then its elements are one range of global indices."""
    return local_shape[1:] == tuple(x.shape[1:])


def first_index(x: Tensor) -> int | None:
    """The global row-major index of the first element of this rank's shard of x when the
    shard is a range of whole rows (`holds_whole_rows`), its elements then at
    ``first_index + i``; 0 for a plain tensor (the whole of itself); None for a shard that
    is no such range (sharded along another dimension).  Found once per shape, mesh and
    placements (an optimizer asks for every parameter at every step)."""
    if not is_dtensor(x):
        return 0
    return _first_index_of(x.shape, x.device_mesh, x.placements)


@functools.lru_cache(maxsize=4096)
def _first_index_of(shape: torch.Size, mesh: DeviceMesh, placements: tuple) -> int | None:
    """`first_index` of this rank's shard of a DTensor of ``shape`` on ``mesh``."""
    local_shape, global_offset = block_of(shape, mesh, placements)
    if local_shape[1:] != tuple(shape[1:]):
        return None
    return global_offset[0] * math.prod(shape[1:]) if shape else 0


def placed(local: Tensor, mesh: DeviceMesh, placements: tuple, shape: Sequence[int]) -> DTensor:
    """The DTensor of global ``shape`` (contiguous strides) on ``mesh`` placed by
    ``placements`` whose shard on this rank is ``local``: an output computed shard by
    shard."""
    from torch.distributed.tensor import DTensor

    size = torch.Size(shape)
    stride = torch.empty(size, device="meta").stride()
    return DTensor.from_local(local, mesh, placements, shape=size, stride=stride)
