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


def test_dtensor_shards_and_replicas_round_like_the_whole_tensor() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        expected = (True,) * 5
        assert dict(results) == {rank: expected for rank in range(WORLD_SIZE)}


def _optimizer_run(params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> list:
    """Three AdamW steps (bf16 parameters and states, SR): the parameters and states."""
    from stochround.optim import AdamW

    optimizer = AdamW(params, lr=1e-2, weight_decay=0.1, state_dtype=torch.bfloat16, seed=5)
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = grad
        optimizer.step()
    states = [optimizer.state[p][name] for p in params for name in ("exp_avg", "exp_avg_sq")]
    return [*params, *states]


def _optimizer_worker(rank: int, store_path: str, results: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        generator = torch.Generator().manual_seed(1)
        # 7 rows of 5: the shards start at elements 0 and 20, 2 rows at 20 of 35
        shapes = ((7, 5), (6,), (64, 3))
        values = [torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]
        grads = [[torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]
                 for _ in range(3)]  # fmt: skip
        whole = _optimizer_run([v.clone().requires_grad_() for v in values], grads)
        outcome = {}
        for name, placement in (("shard", Shard(0)), ("replicate", Replicate())):
            params = [
                distribute_tensor(v.clone(), mesh, [placement]).requires_grad_() for v in values
            ]
            dgrads = [[distribute_tensor(g, mesh, [placement]) for g in step] for step in grads]
            ran = _optimizer_run(params, dgrads)
            outcome[name] = all(
                torch.equal(r.full_tensor().view(torch.int16), w.detach().view(torch.int16))
                for r, w in zip(ran, whole, strict=True)
            )
        results[rank] = outcome
    finally:
        dist.destroy_process_group()


def test_sharded_and_replicated_optimizer_steps_equal_the_single_process_step() -> None:
    """FSDP-style Shard(0) and DDP-style replicated DTensor parameters: every rank updates
    its elements with the random words of their global indices, so the parameters and
    states equal a single process's bit for bit."""
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_optimizer_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        expected = {"shard": True, "replicate": True}
        assert dict(results) == {rank: expected for rank in range(WORLD_SIZE)}
