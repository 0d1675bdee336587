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
        # 9 rows of 3 (of 6 for the packed codes): rank 1 starts at element 15 (30), not a
        # multiple of four
        x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0)) * 3
        whole = sr.round(x, "e4m3fn", "sr", seed=11)
        sharded = sr.round(distribute_tensor(x, mesh, [Shard(0)]), "e4m3fn", "sr", seed=11)
        replicated = sr.round(distribute_tensor(x, mesh, [Replicate()]), "e4m3fn", "sr", seed=11)
        results[rank] = (
            torch.equal(sharded.full_tensor(), whole),
            torch.equal(replicated.to_local(), whole),
            sharded.placements == (Shard(0),),
            _codes_match(torch.cat([x, -x], dim=1), mesh, rank),
            _explicit_and_hardware_match(x, mesh),
        )
    finally:
        dist.destroy_process_group()


def _codes_match(x: torch.Tensor, mesh: object, rank: int) -> bool:
    """Casts to fp8 and packed fp4 and `encode` (8-bit, 16-bit, packed) of DTensors: each
    rank's shard equals its rows of the whole tensor's result, and the global shape and
    dtype are the whole result's (compared locally: gloo gathers no fp8/fp4/int16)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import stochround as sr

    calls = (
        lambda t: sr.cast(t, torch.float8_e4m3fn, "sr", seed=3),
        lambda t: sr.cast(t, torch.float4_e2m1fn_x2, "sr", seed=3, sat="finite"),
        lambda t: sr.encode(t, "e5m2", "sr", seed=3),
        lambda t: sr.encode(t, "bf16", "sr", seed=3),
        lambda t: sr.encode(t, "e2m1", "sr", seed=3, packed=True, sat="finite"),
    )
    matches = []
    for call in calls:
        whole = call(x)
        for placement, expected in (
            (Shard(0), whole.chunk(WORLD_SIZE)[rank]),
            (Replicate(), whole),
        ):
            result = call(distribute_tensor(x, mesh, [placement]))
            local = result.to_local()
            matches.append(
                (result.shape, result.dtype, result.placements)
                == (whole.shape, whole.dtype, (placement,))
                and torch.equal(local.view(torch.uint8), expected.view(torch.uint8))
            )
    return all(matches)


def _explicit_and_hardware_match(x: torch.Tensor, mesh: object) -> bool:
    """Explicit integers (a plain tensor of the whole shape, a sharded DTensor, "data"),
    hardware presets (by seed and by explicit integers) and `round_float64` of a sharded
    DTensor equal the whole tensor's results."""
    from torch.distributed.tensor import Shard, distribute_tensor

    import stochround as sr
    from stochround.rounding import round_float64

    rand = torch.randint(0, 2**8, x.shape, generator=torch.Generator().manual_seed(1))
    sharded_rand = distribute_tensor(rand, mesh, [Shard(0)])
    calls = (
        lambda t, r: sr.round(t, "e4m3fn", "sr", rbits=8, rand=r),
        lambda t, r: sr.round(t, "e2m1", "sr", rand="data", sat="finite"),
        lambda t, r: sr.round(t, hardware="intel-fp16", seed=2),
        lambda t, r: sr.round(t, "e5m2fnuz", hardware="amd-mi300", rand=r),
        lambda t, r: round_float64(t, "e3m2", "sr", seed=2, index_offset=7),
    )
    sharded = distribute_tensor(x, mesh, [Shard(0)])
    return all(
        torch.equal(call(sharded, r).full_tensor(), call(x, rand))
        for call in calls
        for r in (rand, sharded_rand)
    )


def _any_dim_worker(rank: int, store_path: str, results: dict) -> None:
    """Shard(d) of every dimension d (FSDP2's shard_placement_fn may give any): each rank's
    shard rounds as its block of the whole tensor's result, for every random source and
    output; packed codes along a sharded last dimension where the shards hold whole
    groups; Partial placements refused."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    import stochround as sr
    from stochround.rounding import round_float64

    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        generator = torch.Generator().manual_seed(3)
        outcome = {}
        # (5, 6, 8): Shard(1) splits 6 into 3 + 3, so no shard is a range of global indices
        x = torch.randn(5, 6, 8, generator=generator) * 4
        rand = torch.randint(0, 2**8, x.shape, generator=generator)
        stream_state = sr.Stream(4, offset=9).state_dict()
        calls = {
            "stream": lambda t, r: sr.round(t, "e4m3fn", "sr", seed=11, offset=2, index_offset=3),
            "rbits": lambda t, r: sr.round(t, "e5m2", "sr", rbits=5, seed=2**64 - 1),
            "data": lambda t, r: sr.round(t, "e2m1", "sr", rand="data", sat="finite"),
            "rand": lambda t, r: sr.round(t, "e4m3fn", "sr", rbits=8, rand=r),
            "rne": lambda t, r: sr.round(t, "e4m3fn"),
            "cast": lambda t, r: sr.cast(t, torch.float8_e4m3fn, "sr", seed=3),
            "encode": lambda t, r: sr.encode(t, "bf16", "sr", seed=3),
            "hardware": lambda t, r: sr.round(t, hardware="graphcore-ipu-fp16", seed=2),
            "hardware rand": lambda t, r: sr.round(t, "e5m2fnuz", hardware="amd-mi300", rand=r),
            "float64": lambda t, r: round_float64(t, "e3m2", "sr", seed=2, index_offset=7),
            "fp4": lambda t, r: sr.cast(t, torch.float4_e2m1fn_x2, "sr", seed=3, sat="finite"),
            "fp6": lambda t, r: sr.encode(t, "e3m2", "sr", seed=3, sat="finite", packed=True),
            "stream=": lambda t, r: sr.round(t, "e4m3fn", "sr", stream=_stream(stream_state)),
        }
        for dim in (0, 1, 2):
            placement = [Shard(dim)]
            sharded, sharded_rand = (distribute_tensor(t, mesh, placement) for t in (x, rand))
            for name, call in calls.items():
                whole = call(x, rand)
                for r in (rand, sharded_rand):
                    result = call(sharded, r)
                    local = result.to_local()
                    # DTensor's Shard(dim): torch.chunk's pieces (gloo scatters no fp8)
                    expected = whole.chunk(WORLD_SIZE, dim)[rank]
                    outcome[(name, dim)] = outcome.get((name, dim), True) and (
                        (result.shape, result.dtype, result.placements)
                        == (whole.shape, whole.dtype, tuple(placement))
                        and torch.equal(local.view(torch.uint8), expected.view(torch.uint8))
                    )
        # a shard holding half a group of packed codes is refused, with the reason
        odd = distribute_tensor(torch.ones(2, 12), mesh, [Shard(1)])  # 6 + 6 of groups of 4
        try:
            sr.encode(odd, "e3m2", sat="finite", packed=True)
            outcome["packed refused"] = False
        except ValueError as error:
            outcome["packed refused"] = "whole groups of 4 codes" in str(error)
        partial = DTensor.from_local(torch.ones(4), mesh, [Partial()])
        try:
            sr.round(partial, "bf16")
            outcome["partial refused"] = False
        except ValueError as error:
            outcome["partial refused"] = "Replicate or Shard(dim)" in str(error)
        results[rank] = outcome
    finally:
        dist.destroy_process_group()


def _stream(state: dict) -> object:
    import stochround as sr

    stream = sr.Stream(0)
    stream.load_state_dict(state)
    return stream


def test_shards_of_any_dimension_round_like_the_whole_tensor() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_any_dim_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        for rank in range(WORLD_SIZE):
            failed = [key for key, ok in results[rank].items() if not ok]
            assert failed == [], (rank, failed)
            assert len(results[rank]) == 13 * 3 + 2


def test_dtensor_shards_and_replicas_round_like_the_whole_tensor() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        expected = (True,) * 5
        assert dict(results) == {rank: expected for rank in range(WORLD_SIZE)}
