"""The fused SR AdamW step on FSDP2-sharded parameters against the same step on one GPU.

    torchrun --nproc-per-node 2 benchmarks/bench_distributed.py     # two GPUs (and one)
    torchrun --nproc-per-node 1 benchmarks/bench_distributed.py     # one GPU alone
    torchrun --nproc-per-node 2 benchmarks/bench_distributed.py --device cpu --params 4096

Each rank holds ``--params`` parameters (2**26): a stack of bias-free ``Linear(w, w)``
layers (w = ``--width``, 4096, or sqrt(params) where smaller), bf16, with
`stochround.optim.AdamW` (rounding "sr", bf16 states, lr 1e-3, betas 0.9/0.999, eps
1e-8, weight decay 0.01; backend "triton" on CUDA, so the fused kernel is what is timed
and a shard it cannot update raises, "auto" on the CPU). Two rows on every rank:

- ``single``: ``params / w**2`` layers, plain tensors, not sharded: one GPU's step;
- ``fsdp2_xN``: ``N params / w**2`` layers (N the world size), ``fully_shard`` each layer
  and then the root over all N ranks: each rank's ``params`` local elements are rows of
  the layers' DTensors (``Shard(0)``), which the fused step updates in place (no gather).

Gradients are fixed tensors (0.02 randn for the weights, randn for the gradients, bf16,
from one seeded generator), set once: no backward is timed. A step is timed alone: CUDA
events around each step (the CPU: ``time.perf_counter`` around it), ``--warmup`` steps
first, then the median of ``--steps`` (50); every rank times its own steps and rank 0
gathers them (the slowest rank's median is the row's). ``bytes``: what a step must move a
parameter, 14 B (read the bf16 parameter, gradient and both states, write the parameter
and both states), times the rank's local parameters; ``tb_s`` per rank. The target: the
sharded step's time a local parameter within 10% of the single GPU's (``per_param_ratio``
in the JSON; ``% ref`` in the table is the inverse, as bandwidth). Checks: after the timed
steps every local parameter is finite, the first changed, and the states are bf16.

Rank 0 writes the rows into ``<results>/distributed.csv`` (`rows.Row`; shape: the local
parameters and the ranks, ``2^26 x 2 ranks``), its record to
``<out>/bench_distributed[_<tag>].json`` in the harness's form (machine, GPU, versions,
commit from BENCH_COMMIT, date, rows) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import rows as results_rows
import torch
import torch.distributed as dist
from harness import environment, print_table
from torch import Tensor, nn

import stochround

ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
BYTES_PER_PARAM = 14  # read p, g, m, v and write p, m, v: seven bf16 values
SEED = 0
TARGET = 1.10  # the sharded step's time a local parameter, at most this times one GPU's


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    add("--device", default=default_device, choices=("cuda", "cpu"), help=default_device)
    add("--params", type=int, default=2**26, help="parameters a rank holds (2**26)")
    add("--width", type=int, default=4096, help="the layers' width, at most (4096)")
    add("--steps", type=int, default=50, help="timed steps (50)")
    add("--warmup", type=int, default=5, help="steps before timing (5)")
    add("--out", type=Path, default=Path("out/bench"), help="JSON folder (out/bench)")
    add("--tag", default="", help="JSON name suffix: bench_distributed_<tag>.json")
    add("--commit", default=os.environ.get("BENCH_COMMIT"), help="commit to record")
    add("--results", type=Path, default=results_rows.RESULTS, help="rows folder")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available: pass --device cpu")
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0; got {args.steps}, {args.warmup}")
    return args


def layer_shape(params: int, width: int) -> tuple[int, int]:
    """(layers a rank's ``params`` make, their width): width ``min(width, isqrt(params))``;
    ValueError unless the layers hold exactly ``params``."""
    side = min(width, math.isqrt(params))
    if side < 1 or params % (side * side):
        raise ValueError(
            f"params must be a whole number of width x width layers; got {params} with width {side}"
        )
    return params // (side * side), side


def make_model(layers: int, width: int, device: torch.device) -> nn.Sequential:
    """``layers`` bias-free Linear(width, width), bf16, 0.02 randn (one seeded generator:
    the same values on every rank)."""
    generator = torch.Generator().manual_seed(SEED)
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return model.to(device=device, dtype=torch.bfloat16)


def local(tensor: Tensor) -> Tensor:
    """A DTensor's local shard (a plain tensor as it is)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def set_gradients(model: nn.Module) -> None:
    """Every parameter's gradient: randn in bf16 (a DTensor parameter's shard filled
    through its local tensor), from one seeded generator."""
    generator = torch.Generator().manual_seed(SEED + 1)
    for param in model.parameters():
        grad = torch.zeros_like(param)
        shard = local(grad)
        shard.copy_(torch.randn(shard.shape, generator=generator))
        param.grad = grad


def timed_steps(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> float:
    """The median microseconds of ``steps`` calls after ``warmup`` (module docstring)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(1e3 * start.elapsed_time(end))
        else:
            started = time.perf_counter()
            step()
            times.append(1e6 * (time.perf_counter() - started))
    return statistics.median(times)


def measure(model: nn.Module, args: argparse.Namespace, device: torch.device) -> dict:
    """This rank's median step time over ``model``'s parameters, and its check."""
    set_gradients(model)
    backend = "triton" if device.type == "cuda" else "auto"
    optimizer = stochround.optim.AdamW(
        model.parameters(), **ADAMW, state_dtype=torch.bfloat16, rounding="sr",
        seed=SEED, backend=backend,
    )  # fmt: skip
    first = local(next(model.parameters()))
    before = first.clone()
    median_us = timed_steps(optimizer.step, device, args.warmup, args.steps)
    shards = [local(p) for p in model.parameters()]
    finite = all(bool(torch.isfinite(s).all()) for s in shards)
    changed = float((first != before).float().mean())
    states = sorted(
        {
            str(t.dtype)
            for state in optimizer.state.values()
            for t in state.values()
            if t.numel() > 1
        }
    )  # the moments, not the step counters
    return {
        "median_us": median_us,
        "elements": sum(s.numel() for s in shards),
        "check": f"finite {finite}, p0 {100 * changed:.0f}% changed, states {'/'.join(states)}",
        "ok": finite and changed > 0 and states == ["torch.bfloat16"],
        "backend": backend,
    }


def sharded(model: nn.Sequential, device: torch.device) -> nn.Sequential:
    """FSDP2: each layer, then the root, over a 1-D mesh of every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def row(provider: str, ranks: list[dict], world: int) -> dict:
    """A harness-style row from every rank's measurement: the slowest rank's time."""
    slowest = max(ranks, key=lambda r: r["median_us"])
    elements = ranks[0]["elements"]
    moved = BYTES_PER_PARAM * elements
    ok = all(r["ok"] for r in ranks)
    return {
        "case": "adamw_sr_bf16",
        "provider": provider,
        "ours": True,
        "status": "ok" if ok else "check failed",
        "check": ranks[0]["check"] if ok else f"BAD {[r['check'] for r in ranks]}",
        "median_us": slowest["median_us"],
        "ranks_median_us": [r["median_us"] for r in ranks],
        "elements": elements,
        "shape": f"{results_rows.size(elements)} x {world} ranks",
        "bytes": moved,
        "tb_s": moved / slowest["median_us"] / 1e6,
        "ns_per_param": 1e3 * slowest["median_us"] / elements,
        "world_size": world,
        "backend": ranks[0]["backend"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        layers, width = layer_shape(args.params, args.width)
        single = measure(make_model(layers, width, device), args, device)
        dist.barrier()
        fsdp = measure(sharded(make_model(world * layers, width, device), device), args, device)
        gathered: list[list[dict]] = [[] for _ in range(world)]
        dist.all_gather_object(gathered, [single, fsdp])
        if rank == 0:
            report(args, device, world, layers, width, gathered)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def report(
    args: argparse.Namespace,
    device: torch.device,
    world: int,
    layers: int,
    width: int,
    gathered: list[list[dict]],
) -> None:
    """Rank 0's JSON and table (module docstring)."""
    rows = [
        row("single", [ranks[0] for ranks in gathered], world),
        row(f"fsdp2_x{world}", [ranks[1] for ranks in gathered], world),
    ]
    ratio = rows[1]["ns_per_param"] / rows[0]["ns_per_param"]
    info = environment(device, args.commit)
    info.update(benchmark="bench_distributed", tag=args.tag, reference="adamw_sr_bf16/single")
    info.update(
        timer="CUDA events around each step, median" if device.type == "cuda"
        else "time.perf_counter around each step, median",
        world_size=world, backend=dist.get_backend(), layers_per_rank=layers, width=width,
        steps=args.steps, warmup=args.warmup, per_param_ratio=ratio, target_ratio=TARGET,
        within_target=ratio <= TARGET, rows=rows,
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"bench_distributed{'_' + args.tag if args.tag else ''}.json"
    path = args.out / name
    path.write_text(json.dumps(info, indent=1))
    print_table(
        f"bench_distributed on {world} x {info.get('gpu', info['cpu'])}",
        rows,
        "adamw_sr_bf16/single",
    )
    for entry in rows:
        ranks = ", ".join(f"{us:.1f}" for us in entry["ranks_median_us"])
        print(
            f"{entry['provider']}: {entry['ns_per_param']:.4f} ns a local parameter, "
            f"{entry['tb_s']:.3f} TB/s a rank (ranks' medians {ranks} us; {entry['backend']})"
        )
    verdict = "within" if ratio <= TARGET else "NOT within"
    print(f"sharded / single time a parameter: {ratio:.3f} ({verdict} the target {TARGET})")
    written = results_rows.merge(args.results, results_rows.run_rows(info, rows))
    print(f"wrote {path}", *(f"and {csv_path}" for csv_path in written))


if __name__ == "__main__":
    sys.exit(main())
