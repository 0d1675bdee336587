"""The ranks of a torchtitan run, both torchtitan APIs: the data-parallel rank of a
process, which keys the words of its layers' x and dy (`stochround.nn.streams` says why),
and the tensor-parallel degree a config asks for (`check_tensor_parallel_degree`).

torchtitan lays its ranks out as ``(pp, dp_replicate, dp_shard, cp, tp)`` and flattens the
data-parallel and context-parallel axes into its ``loss`` mesh: the ranks that hold other
tokens (other samples, or other chunks of a sequence), over which it averages the loss.
A layer's rank on that mesh is its data-parallel rank; its tensor-parallel rank keys all
its words apart (`stochround.nn.tensor_parallel.rank_key`), and pipeline stages hold other
layers.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch.distributed as dist


def process_rank() -> int:
    """This process's global rank, 0 where torch.distributed is not initialized: the data-
    parallel rank a layer takes when it is built, until torchtitan's ``parallelize`` gives
    it its rank on the ``loss`` mesh (`data_parallel_rank`).  torchtitan 0.3.0 calls a
    module's ``parallelize`` only under the ``spmd_types`` and ``full_dtensor`` backends
    or with tensor parallelism on: under ``partial_dtensor`` with data or context
    parallelism alone its ranks would otherwise all keep 0 and share their words.  There
    the ``loss`` mesh is every rank of a stage, so the global rank tells the data-parallel
    ranks apart as that mesh's rank does (and pipeline stages hold other layers)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def data_parallel_rank(parallel_dims: Any) -> int:
    """This process's rank on torchtitan's ``loss`` mesh (module docstring), 0 where the
    mesh is one rank (``get_optional_mesh`` gives None for it: 0.2.2 and 0.3.0 alike)."""
    mesh = parallel_dims.get_optional_mesh("loss")
    return 0 if mesh is None else int(mesh.get_local_rank())


def check_tensor_parallel_degree(degree: object, world_size: int | None = None) -> int:
    """``degree``, torchtitan's ``parallelism.tensor_parallel_degree`` (the ranks each
    layer's weight is sharded over, colwise or rowwise: `stochround.nn.tensor_parallel`),
    as an int; ValueError where it is not an int >= 1, or where given ``world_size`` (the
    run's processes) is not a multiple of it (the other factor is data parallelism)."""
    if isinstance(degree, bool) or not isinstance(degree, numbers.Integral) or degree < 1:
        raise ValueError(f"tensor_parallel_degree must be an int >= 1; got {degree!r}")
    if world_size is not None and world_size % int(degree):
        raise ValueError(
            f"tensor_parallel_degree={degree} does not divide the run's {world_size} "
            "processes (the rest of the ranks are data parallel)"
        )
    return int(degree)


__all__ = ["check_tensor_parallel_degree", "data_parallel_rank", "process_rank"]
