"""``stochround titan``: train torchtitan's Llama 3 on the Python standard library under a
stochround recipe (`stochround.integrations.torchtitan`, the ``torchtitan`` extra).

One command, offline: ``stochround titan --recipe nvfp4 --steps 200``, with torchtitan
0.3.0 or 0.2.2 (whichever is installed).  On CUDA it runs torchtitan's trainer (under
``torchrun --nproc_per_node N -m stochround titan ...``, one process per GPU with FSDP2);
on the CPU, the same trainer with gloo (slow: choose a small ``--flavor`` and
``--seq-len``).  ``--replicate`` makes the data parallelism replicas instead of FSDP2's
shards (torchtitan's ``data_parallel_replicate_degree`` = the world size over the
tensor-parallel degree); ``--tensor-parallel N`` shards each layer's weight over N ranks
(torchtitan's ``parallelism.tensor_parallel_degree``; each rank quantizes its own shard:
`stochround.nn.tensor_parallel`), the other factor of the ranks data parallel.  Each logged
step's loss and tokens/s go to ``OUT/rows.jsonl``; the last logged loss is printed.
``--profile-steps N`` has torchtitan's profiler record the last N steps: each rank's
Chrome trace goes to ``OUT/profile_traces/iteration_STEPS/``
(`stochround.integrations.torchtitan.profiling`; ``benchmarks/bench_titan.py`` summarizes
them).  ``--deterministic`` runs under torch's
deterministic algorithms (an op that has none warns), to tell which op makes two runs
differ.  ``--reshard-after-forward never`` keeps each FSDP2 group's parameters unsharded
from its forward to its backward (torchtitan's ``parallelism.fsdp_reshard_after_forward``:
one all-gather a group a step less, for the memory of the unsharded model); it is passed
to torchtitan whatever the ranks, since 0.3.0's FSDP2 acts on one rank and under
``--replicate`` too, and a note on stderr says when torchtitan applies no FSDP2 to the
run (0.2.2 on one rank or with ``--replicate``: `stochround.integrations.torchtitan.fsdp`).
``--log-every N`` writes a row at step 1 and every Nth step only (torchtitan's
``metrics.log_freq``; default 1, every step): each logged step waits on the host for the
device to finish it, so ``--log-every 10`` (torchtitan's own default) lets the host run
ahead to measure throughput (`stochround.integrations.torchtitan.rows`).
``--cudagraphs`` (with ``--compile``, on CUDA) replays each compiled block's forward and
backward from CUDA graphs (inductor's CUDA graph trees, what ``torch.compile``'s
``mode="reduce-overhead"`` turns on; torchtitan takes no compile mode) with the layers'
step graphs off (a block captured whole has nothing for them to save).  Bad options, and
a missing torchtitan, are bad-input exits (``error: ...``, status 2).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from ..nn.step_graphs import use_step_graphs
from . import output

TITAN_EPILOG = (
    "Examples: stochround titan --recipe nvfp4 --steps 200 ; "
    "stochround titan --recipe int8 --flavor tiny --device cpu --steps 20 --seq-len 64 ; "
    "torchrun --nproc_per_node 2 -m stochround titan --recipe nvfp4 --optimizer SRAdamW ; "
    "stochround titan --recipe nvfp4 --compile --no-step-graphs ; "
    "stochround titan --recipe bf16 --steps 20 --profile-steps 3 ; "
    "torchrun --nproc_per_node 2 -m stochround titan --reshard-after-forward never ; "
    "torchrun --nproc_per_node 2 -m stochround titan --tensor-parallel 2 ; "
    "stochround titan --recipe nvfp4 --compile --log-every 10 ; "
    "stochround titan --recipe nvfp4 --compile --cudagraphs --log-every 10"
)


def titan_command(
    recipe: Annotated[
        str, typer.Option(help="bf16, nvfp4, mxfp8, fp8, int8 or mxfp4_tseng.")
    ] = "nvfp4",
    steps: Annotated[int, typer.Option(help="Training steps.")] = 200,
    flavor: Annotated[
        str, typer.Option(help="debugmodel (torchtitan's), 100M, or tiny (tests).")
    ] = "debugmodel",
    optimizer: Annotated[
        str, typer.Option(help="AdamW (torch's), or SRAdamW, SRAdam, SRSGD, SRLion.")
    ] = "AdamW",
    device: Annotated[str, typer.Option(help="cuda or cpu; default: cuda when there is one.")] = "",
    seq_len: Annotated[int, typer.Option(help="Tokens (bytes) per sample.")] = 2048,
    batch: Annotated[int, typer.Option(help="Samples per step and device.")] = 8,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 8e-4,
    seed: Annotated[int, typer.Option(help="The recipe's and the run's seed.")] = 0,
    switch: Annotated[
        list[str] | None,
        typer.Option(help="A recipe switch NAME=JSON, e.g. stochastic_rounding=false."),
    ] = None,
    keep: Annotated[
        list[str] | None,
        typer.Option(help="Module-path regex kept in bf16 (default: the output head)."),
    ] = None,
    compile_model: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model (CUDA).")
    ] = False,
    activation_checkpoint: Annotated[
        str,
        typer.Option(help="torchtitan's activation checkpointing: none, full or selective."),
    ] = "none",
    step_graphs: Annotated[
        bool | None,
        typer.Option(
            "--step-graphs/--no-step-graphs",
            help="Replay each quantized layer's step as a CUDA graph (CUDA; default: on "
            "there, unless STOCHROUND_STEP_GRAPHS=0).",
        ),
    ] = None,
    profile_steps: Annotated[
        int,
        typer.Option(
            help="Steps torchtitan's profiler records at the end of the run (0: off); "
            "traces in OUT/profile_traces."
        ),
    ] = 0,
    replicate: Annotated[
        bool,
        typer.Option(
            "--replicate",
            help="Data parallelism by whole-model replicas over the ranks (torchtitan's "
            "data_parallel_replicate_degree), not FSDP2's shards.",
        ),
    ] = False,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic",
            help="torch's deterministic algorithms (torchtitan's debug.deterministic; an op "
            "without one warns).",
        ),
    ] = False,
    reshard_after_forward: Annotated[
        str,
        typer.Option(
            help="FSDP2's reshard-after-forward policy (torchtitan's "
            "parallelism.fsdp_reshard_after_forward): default (torchtitan's: every group "
            "but the last reshards), always, or never (each group keeps its parameters "
            "unsharded from its forward to its backward: one all-gather less a group, "
            "more memory). Acts where torchtitan applies FSDP2: several ranks without "
            "--replicate; under torchtitan 0.3.0 also one rank and --replicate."
        ),
    ] = "default",
    log_every: Annotated[
        int,
        typer.Option(
            help="A row in OUT/rows.jsonl every N steps and at step 1 (torchtitan's "
            "metrics.log_freq). A logged step syncs the host with the GPU: 10 "
            "(torchtitan's default) to measure throughput; 1 (default) for every step's "
            "loss."
        ),
    ] = 1,
    tensor_parallel: Annotated[
        int,
        typer.Option(
            help="Ranks each layer's weight is sharded over (torchtitan's "
            "parallelism.tensor_parallel_degree); it divides the ranks, the other factor "
            "data parallel.",
        ),
    ] = 1,
    cudagraphs: Annotated[
        bool,
        typer.Option(
            "--cudagraphs",
            help="Replay each compiled block's forward and backward as CUDA graphs "
            "(inductor's CUDA graph trees, torch.compile's reduce-overhead); needs "
            "--compile and CUDA; the layers' step graphs are off under it.",
        ),
    ] = False,
    out: Annotated[
        Path, typer.Option(help="Dump folder (rows.jsonl, checkpoints, traces).")
    ] = Path("titan-run"),
) -> None:
    """Train Llama 3 on the standard library's source with a stochround recipe."""
    try:
        from ..integrations.torchtitan import run_training, titan_config
        from ..integrations.torchtitan.ranks import check_tensor_parallel_degree
    except ImportError as error:
        output.fail(str(error))
    if steps < 1:
        output.fail(f"--steps must be >= 1, got {steps}")
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if step_graphs is True and chosen != "cuda":
        output.fail(f"--step-graphs replays CUDA launches: it needs --device cuda, got {chosen}")
    if cudagraphs:
        output.checked(lambda: check_cudagraphs(chosen, compile_model, step_graphs))
    tp = output.checked(lambda: check_tensor_parallel_degree(tensor_parallel, world_size()))
    switches = output.checked(lambda: parse_switches(switch or []))
    # the head's path differs between torchtitan releases: its default comes from the config
    kept: dict[str, Any] = {} if keep is None else {"keep": tuple(keep)}
    config = output.checked(
        lambda: titan_config(
            recipe,
            flavor=flavor,
            optimizer=optimizer,
            switches=switches,
            seed=seed,
            steps=steps,
            seq_len=seq_len,
            local_batch_size=batch,
            lr=lr,
            compile_model=compile_model,
            activation_checkpoint=activation_checkpoint,
            profile_steps=profile_steps,
            data_parallel_replicate_degree=world_size() // tp if replicate else 1,
            deterministic=deterministic,
            reshard_after_forward=reshard_after_forward,
            log_every=log_every,
            tensor_parallel_degree=tp,
            dump_folder=str(out),
            **kept,
        )
    )
    note_reshard_without_fsdp2(reshard_after_forward, replicate, tp)
    fields = {"recipe": recipe, "optimizer": optimizer, "flavor": flavor}
    with graph_settings(False if cudagraphs else step_graphs, cudagraphs):
        rows = output.checked(lambda: run_training(config, chosen, fields))
    if rows.exists() and rows.read_text().strip():
        last = json.loads(rows.read_text().splitlines()[-1])
        print(f"step {last['step']}: loss {last['loss']:.4f} ({rows})")


def check_cudagraphs(device: str, compile_model: bool, step_graphs: bool | None) -> None:
    """``--cudagraphs``'s preconditions (ValueError naming the one that fails): CUDA, the
    compiled model, and no ``--step-graphs`` (a block captured whole has nothing for them to
    save, and a step traced with them on keeps no operand for its backward, which then
    quantizes again: the recipes guide, "torch.compile")."""
    if device != "cuda":
        raise ValueError(
            f"--cudagraphs replays CUDA launches: it needs --device cuda, got {device}"
        )
    if not compile_model:
        raise ValueError("--cudagraphs captures the compiled blocks: it needs --compile")
    if step_graphs:
        raise ValueError(
            "--cudagraphs captures each compiled block whole: the layers' step graphs are off "
            "under it (with them on the backward quantizes again); drop --step-graphs"
        )


@contextlib.contextmanager
def graph_settings(step_graphs: bool | None, cudagraphs: bool) -> Iterator[None]:
    """The run's CUDA graph settings, restored after it: the layers' step graphs as
    ``step_graphs`` says (None: the process's setting), and inductor's CUDA graph trees
    (``torch._inductor.config.triton.cudagraphs``, what ``TORCHINDUCTOR_CUDAGRAPHS=1`` and
    ``mode="reduce-overhead"`` set) on under ``cudagraphs``."""
    import torch._inductor.config as inductor_config

    previous = None if step_graphs is None else use_step_graphs(step_graphs)
    try:
        with inductor_config.patch({"triton.cudagraphs": True} if cudagraphs else {}):
            yield
    finally:
        if previous is not None:
            use_step_graphs(previous)


def world_size() -> int:
    """The processes of the run: ``torchrun``'s ``WORLD_SIZE``, 1 without it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def note_reshard_without_fsdp2(policy: str, replicate: bool, tensor_parallel: int = 1) -> None:
    """A note on stderr where ``--reshard-after-forward POLICY`` (not the default) has no
    effect: the installed torchtitan applies no FSDP2 to the run (`applies_fsdp2`: 0.2.2 on
    one data-parallel shard: one rank, one rank a tensor-parallel group, or with
    ``--replicate``, DDP); the run goes on, as torchtitan's would."""
    from ..integrations.torchtitan import TITAN_API, TITAN_VERSION
    from ..integrations.torchtitan.fsdp import applies_fsdp2

    shard_degree = 1 if replicate else world_size() // tensor_parallel
    if policy != "default" and not applies_fsdp2(TITAN_API, shard_degree):
        output.note(
            f"--reshard-after-forward {policy} has no effect in this run: torchtitan "
            f"{TITAN_VERSION} applies no FSDP2 to one data-parallel shard or with --replicate (DDP)"
        )


def parse_switches(items: list[str]) -> dict[str, object]:
    """``NAME=JSON`` items as a dict (ValueError naming the malformed one)."""
    switches: dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--switch must be NAME=JSON (e.g. rht=false); got {item!r}")
        try:
            switches[name] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--switch {name}: {value!r} is not JSON") from None
    return switches


__all__ = [
    "TITAN_EPILOG",
    "check_cudagraphs",
    "graph_settings",
    "note_reshard_without_fsdp2",
    "parse_switches",
    "titan_command",
    "world_size",
]
