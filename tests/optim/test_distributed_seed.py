"""The default seed across processes: two CPU processes with the gloo backend (the pattern
of tests/test_distributed.py), each seeding torch differently, as data order and dropout
want.  Built after the process group, ``seed=None`` optimizers agree on rank 0's seed, so
replicated parameters stay bit-identical; built before it, each process keeps its own and
the replicas drift apart."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
STEPS = 20
SHAPES = ((7, 5), (6,), (64, 3))


def _train() -> tuple[int, list[list[int]]]:
    """20 steps of bf16 SR AdamW (``seed=None``) on parameters that start equal on every
    rank, with gradients equal on every rank (what DDP's all-reduce gives), while the rank's
    own global generator serves dropout-like draws: (the seed, the parameters' bits)."""
    from stochround.optim import AdamW

    generator = torch.Generator().manual_seed(1)
    params = [torch.randn(s, generator=generator).to(torch.bfloat16).requires_grad_()
              for s in SHAPES]  # fmt: skip
    optimizer = AdamW(params, lr=1e-2, weight_decay=0.1)
    for _ in range(STEPS):
        torch.rand(8)  # the rank's own draws (dropout, data order): as each rank seeded them
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator).to(torch.bfloat16)
        optimizer.step()
    bits = [param.detach().view(torch.int16).flatten().tolist() for param in params]
    return optimizer.param_groups[0]["seed"], bits


def _worker(rank: int, store_path: str, results: dict) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(100 + rank)  # per-rank global seeds
    alone = _train()  # no process group yet: the rank's own default seed
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        results[rank] = {"alone": alone, "in_group": _train()}
    finally:
        dist.destroy_process_group()


def test_default_seed_is_agreed_across_ranks_so_replicas_stay_identical() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manager = mp.Manager()
        results = manager.dict()
        store_path = os.path.join(directory, "store")
        mp.spawn(_worker, args=(store_path, results), nprocs=WORLD_SIZE, join=True)
        first, second = results[0], results[1]
    # built after init_process_group: rank 0's seed on both ranks, parameters bit-identical
    assert first["in_group"][0] == second["in_group"][0]
    assert first["in_group"][1] == second["in_group"][1]
    # built before it (no agreement): each rank's own seed, and the replicas drift apart
    assert first["alone"][0] != second["alone"][0]
    assert first["alone"][1] != second["alone"][1]
