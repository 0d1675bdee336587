"""Run a test's body on several ranks: spawned processes in one torch.distributed process
group (gloo on the CPU, NCCL on CUDA devices, one a rank), each rank's result returned to
the test.

    def body(rank: int, world_size: int, device: str) -> object: ...   # module level
    results = run_ranks(body, device="cpu")                              # [rank 0's, rank 1's]

The body runs with the process group initialized (a file store in a temporary folder) and
destroyed after it; its return value travels back by `torch.save` (tensors allowed). An
exception on a rank fails the test with that rank's traceback. Spawned processes import
the body's module afresh, so a body is a module-level function and takes what it needs as
``args``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
# a rank that raised before a collective leaves the other waiting in it: the wait fails
# after this long instead of holding the test for the default half hour
COLLECTIVE_TIMEOUT = timedelta(minutes=3)


def _rank_main(
    rank: int,
    body: Callable[..., Any],
    world_size: int,
    device: str,
    folder: str,
    args: tuple[Any, ...],
) -> None:
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{os.path.join(folder, 'store')}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    outcome: dict[str, Any]
    try:
        outcome = {"result": body(rank, world_size, device, *args)}
        # no rank tears its group down while another still has a collective in flight
        dist.barrier()
    except BaseException:  # reported to the test, which raises it
        outcome = {"error": traceback.format_exc()}
    finally:
        dist.destroy_process_group()
    torch.save(outcome, Path(folder) / f"rank{rank}.pt")
    sys.stdout.flush()
    sys.stderr.flush()
    # The outcome is on disk and the group destroyed; skip the interpreter's teardown, where
    # objects still holding the gloo group (device meshes, DTensor caches) are destroyed
    # with its worker threads running, which aborted a rank under load (SIGABRT,
    # "terminate called without an active exception").
    os._exit(0)


def run_ranks(
    body: Callable[..., Any],
    *args: Any,
    world_size: int = WORLD_SIZE,
    device: str = "cpu",
) -> list[Any]:
    """``body(rank, world_size, device, *args)`` on ``world_size`` ranks; their results in
    rank order (AssertionError with a rank's traceback where one raised)."""
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(
            _rank_main, args=(body, world_size, device, folder, args), nprocs=world_size, join=True
        )
        outcomes = [
            torch.load(Path(folder) / f"rank{rank}.pt", weights_only=False)
            for rank in range(world_size)
        ]
    errors = [f"rank {r}:\n{o['error']}" for r, o in enumerate(outcomes) if "error" in o]
    if errors:
        raise AssertionError("\n".join(errors))
    return [outcome["result"] for outcome in outcomes]


def integers(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as the integers of its element size."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as integers on the CPU (NaNs and signed zeros compare exactly); a
    DTensor's gathered (``full_tensor()``), one-byte dtypes as uint8: gloo gathers no
    float8 dtype (nor int16 and int32, which wider floats are gathered without)."""
    if type(t).__name__ != "DTensor":
        return integers(t.detach().cpu().contiguous())
    if t.element_size() > 1:
        return integers(t.full_tensor().detach().cpu().contiguous())  # type: ignore[attr-defined]
    from torch.distributed.tensor import DTensor

    local = integers(t.to_local().detach().contiguous())  # type: ignore[attr-defined]
    placed = DTensor.from_local(
        local,
        t.device_mesh,  # type: ignore[attr-defined]
        t.placements,  # type: ignore[attr-defined]
        shape=t.shape,
        stride=t.stride(),
    )
    return placed.full_tensor().cpu()


def devices() -> list[Any]:
    """The devices a distributed test runs on: the CPU (gloo) always, CUDA (NCCL) marked
    ``gpus2`` (conftest.py leaves it out where fewer than two GPUs are present)."""
    import pytest

    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpus2)]
