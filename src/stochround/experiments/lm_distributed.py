"""One row of the lm experiment trained with FSDP2 on several ranks, against the same row
trained on one device from the same seed.

    python -m torch.distributed.run --nproc-per-node 2 -m stochround.experiments.lm_distributed \\
        [--row ROW] [--steps N] [--quick] [--batch-split {same,split}] [--seed S] \\
        [--device {cpu,cuda}] [--reference DIR] [--out DIR]

The run is `lm_training.train_run`'s for the row (its model, data, recipe, optimizer
and schedule) with a `Placement`: every rank builds the same initial weights (one CPU
generator seeded with the run's seed), applies the row's recipe, then `fully_shard` shards
each block, then the root, over a 1-D mesh of all ranks (NCCL on CUDA, each rank on the
GPU of its local rank; gloo on the CPU).  FSDP2 all-gathers a block's bf16 weights before
its forward (the recipes quantize the whole weight, as on one device) and reduce-scatters
its bf16 gradients, their mean over the ranks; stochround's AdamW then updates each rank's
shards with the words of their elements' global indices.

Data (``--batch-split``):

- ``same``: every rank trains on the whole batch.  The ranks' gradients are equal, and
  their mean over the ranks is exact, so the run must equal the single-device run bit for
  bit: every training loss and every validation loss (the end-to-end proof).
- ``split``: data parallel: rank r trains on the r-th of ``world_size`` equal contiguous
  slices of each step's windows (the batch must divide evenly), and the logged training
  loss is the mean over the ranks of their slices' mean losses.  The same mathematics as
  one device, computed otherwise: each rank's gradient of its slice is rounded to bf16
  before the reduce-scatter averages them (one device rounds the whole batch's sum once),
  the loss's mean is taken in parts, and under a recipe each rank quantizes its own
  slice's activations and output gradients (their tensor-wide scales from that slice's
  amax, their SR words indexed within the rank's tensor).  So the curves differ from the
  single device's, and training carries the differences forward: reported as the largest
  relative difference of the training and the validation curve and the difference of the
  final validation loss.

The ratio of the gradient norm to the quantization noise is not measured here
(`Placement.ratio`).

The reference.  Without ``--reference`` it is trained inline by rank 0 on its device
before any model is sharded, while the other ranks wait at a barrier: right for the quick
sizes.  With ``--reference DIR`` it is `lm_training.cached_run`'s: read from
``DIR/ROW-seedSEED.json`` where a single-device run of the same settings is there (as
``stochround run lm --out OUT`` writes them under ``OUT/lm-runs``; train a full-size
reference once, beforehand), else trained inline as above and written there.  A bit-for-bit
comparison needs the reference trained under the same determinism setting.

Determinism on CUDA.  ``torch.use_deterministic_algorithms(True)`` (strict) is on unless
``--nondeterministic``: the flash-attention backward otherwise adds its query gradients
with atomic adds, in no fixed order, so that two runs of one process need not agree, and
no sharded run could be held to the single-device one.  cuBLAS needs
``CUBLAS_WORKSPACE_CONFIG`` for it (set to ``:4096:8`` where unset).  The CPU's kernels
are deterministic already.

Output.  Rank 0 writes ``OUT/lm-distributed-ROW-MODE-wWORLD.json`` (the settings, world
size, both runs' losses and their comparison) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch import Tensor, nn

from .lm_data import Data, load_data
from .lm_model import GPT
from .lm_rows import FULL, QUICK, ROWS, Sizes, row_by_key
from .lm_training import Placement, RunResult, cached_run, run_settings, train_run
from .report import NoProgress, ProgressLike, Table

MODES = ("same", "split")
# a rank waits at a barrier while rank 0 trains the reference: longer than NCCL's default
# timeout allows for the larger sizes
TIMEOUT = timedelta(hours=2)


def shard_model(model: nn.Module, device: str) -> None:
    """FSDP2: ``fully_shard`` each block of the `GPT` ``model``, then the root, in place,
    over a 1-D mesh of every rank on ``device`` ("cpu" or "cuda")."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not isinstance(model, GPT):
        raise TypeError(f"model must be a language_model.GPT, got {type(model).__name__}")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def rank_slice(offsets: Tensor, rank: int, world_size: int) -> Tensor:
    """Rank ``rank``'s windows of a step: the ``rank``-th of ``world_size`` equal
    contiguous slices of ``offsets`` ``(batch,)`` (ValueError unless they divide evenly)."""
    if offsets.shape[0] % world_size:
        raise ValueError(
            f"batch must be a multiple of the world size under batch_split='split'; got "
            f"batch {offsets.shape[0]} on {world_size} ranks"
        )
    return offsets.reshape(world_size, -1)[rank]


def mean_over_ranks(values: Tensor) -> Tensor:
    """The elementwise mean of ``values`` over the ranks: their all-reduced sum divided by
    the world size (gloo has no average)."""
    total = values.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def fsdp_placement(device: str, batch_split: str) -> Placement:
    """The `Placement` of an FSDP2 run on the initialized process group (module
    docstring): ``batch_split`` "same" (every rank the whole batch, its loss as it is) or
    "split" (each rank its slice, the loss's mean over the ranks)."""
    if batch_split not in MODES:
        raise ValueError(f"batch_split must be one of {', '.join(MODES)}; got {batch_split!r}")

    def shard(model: nn.Module) -> None:
        shard_model(model, device)

    if batch_split == "same":
        return Placement(shard=shard, ratio=False)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def windows(offsets: Tensor) -> Tensor:
        return rank_slice(offsets, rank, world_size)

    return Placement(shard=shard, windows=windows, mean_loss=mean_over_ranks, ratio=False)


def deterministic_cuda() -> None:
    """Strict deterministic algorithms on CUDA (module docstring), cuBLAS's workspace
    setting first where unset."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


@dataclass
class Outcome:
    """A rank's result: its FSDP2 run, and on rank 0 the single-device reference (None on
    the other ranks) and where it came from ("inline" or the file read)."""

    run: RunResult
    reference: RunResult | None
    reference_source: str


def train_sharded(
    row_key: str,
    sizes: Sizes,
    seed: int,
    data: Data,
    device: str,
    batch_split: str,
    progress: ProgressLike,
    reference: Path | None = None,
) -> Outcome:
    """On every rank of the initialized process group: rank 0 trains (or reads, from the
    folder ``reference``) the single-device run of ``row_key`` while the others wait, then
    all train it under FSDP2 (`fsdp_placement`)."""
    row = row_by_key(row_key)
    placement = fsdp_placement(device, batch_split)
    single: RunResult | None = None
    source = "inline"
    if dist.get_rank() == 0:
        if reference is None:
            single = train_run(row, sizes, seed, data, device, progress)
        else:
            path = reference / f"{row.key}-seed{seed}.json"
            settings = run_settings(sizes, device)
            stored = path.is_file() and json.loads(path.read_text())["settings"] == settings
            source = str(path) if stored else f"inline, written to {path}"
            single = cached_run(row, sizes, seed, data, device, progress, reference)
    dist.barrier()
    run = train_run(row, sizes, seed, data, device, progress, placement)
    return Outcome(run, single, source)


# --------------------------------------------------------------------------------------
# the comparison
# --------------------------------------------------------------------------------------


def bit_equal(first: Sequence[float], second: Sequence[float]) -> bool:
    """Whether two curves hold the same floats bit for bit (their hex forms: no NaN
    equals itself, and -0.0 equals 0.0, under ``==``)."""
    return [x.hex() for x in first] == [x.hex() for x in second]


def max_relative(values: Sequence[float], reference: Sequence[float]) -> float:
    """``max |v / r - 1|`` over the curve (ValueError where the lengths differ)."""
    if len(values) != len(reference):
        raise ValueError(f"curves of {len(values)} and {len(reference)} points")
    return max(abs(v / r - 1) for v, r in zip(values, reference, strict=True))


def compare(run: RunResult, reference: RunResult) -> dict[str, Any]:
    """The FSDP2 run against the single-device one: bit for bit or not (the training and
    the validation curve apart), the largest relative difference of each curve, the first
    step whose training loss differs, and the final validation losses' difference."""
    differing = [
        step
        for step, (a, b) in enumerate(zip(run.train_loss, reference.train_loss, strict=True))
        if a.hex() != b.hex()
    ]
    return {
        "train_bit_equal": bit_equal(run.train_loss, reference.train_loss),
        "validation_bit_equal": bit_equal(run.validation, reference.validation),
        "train_max_relative": max_relative(run.train_loss, reference.train_loss),
        "validation_max_relative": max_relative(run.validation, reference.validation),
        "first_differing_step": differing[0] if differing else None,
        "final_validation_difference": run.final - reference.final,
    }


def table(outcome: Outcome, comparison: dict[str, Any], batch_split: str, world: int) -> Table:
    """The two runs side by side (rank 0's `Outcome`)."""
    single, run = outcome.reference, outcome.run
    if single is None:
        raise ValueError("table needs rank 0's outcome, the one with the reference run")
    equal = {True: "yes", False: "no"}

    def line(what: str, a: float, b: float, same: bool) -> list[str]:
        return [what, f"{a:.7g}", f"{b:.7g}", f"{abs(b / a - 1):.3g}", equal[same]]

    rows = [
        line("training loss, first step", single.train_loss[0], run.train_loss[0],
             single.train_loss[0].hex() == run.train_loss[0].hex()),
        line("training loss, last step", single.train_loss[-1], run.train_loss[-1],
             single.train_loss[-1].hex() == run.train_loss[-1].hex()),
        line("validation loss, final", single.final, run.final,
             single.final.hex() == run.final.hex()),
        [f"training curve ({len(run.train_loss)} steps)", "", "",
         f"{comparison['train_max_relative']:.3g}", equal[comparison["train_bit_equal"]]],
        [f"validation curve ({len(run.validation)} points)", "", "",
         f"{comparison['validation_max_relative']:.3g}",
         equal[comparison["validation_bit_equal"]]],
        ["seconds", f"{single.seconds:.1f}", f"{run.seconds:.1f}", "", ""],
    ]  # fmt: skip
    first = comparison["first_differing_step"]
    return Table(
        f"lm row {run.row}, seed {run.seed}: one device against FSDP2 on {world} ranks "
        f"(batch split {batch_split!r})",
        ["", "one device", f"FSDP2 x{world}", "max |rel. diff|", "bit for bit"],
        rows,
        [
            f"reference: {outcome.reference_source}; first differing training step: "
            f"{'none' if first is None else first}.",
        ],
    )


# --------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch.distributed.run --nproc-per-node N -m "
        "stochround.experiments.lm_distributed",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    add = parser.add_argument
    add("--row", default="nvfp4", choices=[row.key for row in ROWS], help="the row (nvfp4)")
    add("--quick", action="store_true", help="the quick sizes (default: the full ones)")
    add("--steps", type=int, default=None, help="optimizer steps (default: the sizes')")
    add("--batch-split", default="same", choices=MODES, help="same or split (same)")
    add("--seed", type=int, default=2024, help="the run's seed (2024)")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    add("--device", default=default_device, choices=("cpu", "cuda"), help=default_device)
    add("--reference", type=Path, default=None, help="folder of single-device runs")
    add("--out", type=Path, default=Path("out"), help="the JSON's folder (out)")
    add("--nondeterministic", action="store_true", help="CUDA: leave determinism off")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1; got {args.steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs CUDA: pass --device cpu")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command on this rank (module docstring): launched by torch.distributed.run,
    which sets RANK, LOCAL_RANK, WORLD_SIZE and the rendezvous."""
    args = parse(argv)
    if "RANK" not in os.environ:
        raise SystemExit(
            "lm_distributed runs on ranks: launch it with python -m torch.distributed.run "
            "--nproc-per-node N -m stochround.experiments.lm_distributed ..."
        )
    sizes = QUICK if args.quick else FULL
    if args.steps is not None:
        sizes = dataclasses.replace(sizes, steps=args.steps)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not args.nondeterministic:
            deterministic_cuda()
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=TIMEOUT)
    try:
        outcome = train_sharded(
            args.row, sizes, args.seed, load_data(), args.device, args.batch_split,
            NoProgress(), args.reference,
        )  # fmt: skip
        if outcome.reference is not None:
            world, backend = dist.get_world_size(), dist.get_backend()
            write(args.out, sizes, outcome, args.device, args.batch_split, world, backend)
        dist.barrier()  # no rank tears the group down while another still uses it
    finally:
        dist.destroy_process_group()
    return 0


def write(
    out: Path,
    sizes: Sizes,
    outcome: Outcome,
    device: str,
    batch_split: str,
    world: int,
    backend: str,
) -> Path:
    """Rank 0's JSON, ``out/lm-distributed-ROW-SPLIT-wWORLD.json``, and its table (module
    docstring) for ``outcome`` trained at ``sizes`` on ``device`` with ``batch_split`` on
    ``world`` ranks of the process-group ``backend``."""
    run, reference = outcome.run, outcome.reference
    if reference is None:
        raise ValueError("write needs rank 0's outcome, the one with the reference run")
    comparison = compare(run, reference)
    settings: dict[str, Any] = dict(run_settings(sizes, device))
    settings.update(
        row=run.row,
        seed=run.seed,
        batch_split=batch_split,
        world_size=world,
        backend=backend,
        deterministic=torch.are_deterministic_algorithms_enabled(),
        reference_source=outcome.reference_source,
    )
    payload = {
        "settings": settings,
        "comparison": comparison,
        "reference": asdict(reference),
        "distributed": asdict(run),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"lm-distributed-{run.row}-{batch_split}-w{world}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    result = table(outcome, comparison, batch_split, world)
    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    console.print(result.rich())
    for note in result.notes:
        console.print(note, markup=False, soft_wrap=True)
    console.print(f"wrote {path}", markup=False, soft_wrap=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
