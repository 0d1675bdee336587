"""DTensor inputs: each rank rounds its shard with the random words of its global indices.

Two CPU processes with the gloo backend; the sharded result must equal the unsharded
one bit for bit, and a replicated tensor must round identically on both ranks.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def _worker(rank: int, store_path: str, results: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import stochround as sr

    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        # 9 rows of 3: rank 1 starts at element 15, not a multiple of four
        x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0)) * 3
        whole = sr.round(x, "e4m3fn", "sr", seed=11)
        sharded = sr.round(distribute_tensor(x, mesh, [Shard(0)]), "e4m3fn", "sr", seed=11)
        replicated = sr.round(distribute_tensor(x, mesh, [Replicate()]), "e4m3fn", "sr", seed=11)
        results[rank] = (
            torch.equal(sharded.full_tensor(), whole),
            torch.equal(replicated.to_local(), whole),
            sharded.placements == (Shard(0),),
        )
    finally:
        dist.destroy_process_group()


def test_dtensor_shards_and_replicas_round_like_the_whole_tensor() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        assert dict(results) == {rank: (True, True, True) for rank in range(WORLD_SIZE)}
