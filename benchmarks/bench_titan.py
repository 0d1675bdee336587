"""torchtitan runs of the recipes: loss curves and tokens/s on one or more GPUs (issue 45).

Each case is one ``stochround titan`` run of torchtitan's Llama 3 debug model on the Python
standard library's source (`stochround.integrations.torchtitan`, with whichever torchtitan
is installed: 0.3.0 on torch >= 2.13, 0.2.2 on torch 2.10 to 2.12), the same data, seed and
steps for every case:

- ``bf16``: no layer quantized, torch's AdamW (the baseline);
- ``nvfp4``, ``mxfp8``, ``fp8``: the recipe on every linear but the LM head, torch's AdamW;
- ``nvfp4_sr_adamw``: ``nvfp4`` with stochround's SR AdamW (bf16 states);
- ``nvfp4_no_step_graphs``: ``nvfp4`` with the layers' CUDA step graphs off
  (``--no-step-graphs``; the other cases run with the default, on where CUDA:
  `stochround.nn.step_graphs`);
- ``nvfp4_pow2``: ``nvfp4`` with power-of-two tensor scales (``--switch
  'tensor_scale="pow2"'``: no scaling pass after the GEMMs; reported beside ``nvfp4``,
  whose default scales the target is judged on).

With ``--gpus N`` above 1 each run is ``torchrun --nproc_per_node N -m stochround titan``:
FSDP2 over the N GPUs, each GPU taking ``--batch`` samples a step (the global batch is N
times the one-GPU batch); with ``--replicate`` each GPU holds the whole model instead
(torchtitan's ``data_parallel_replicate_degree`` = N: DDP under 0.2.2, FSDP2 with one
shard under 0.3.0), which tells FSDP2's sharding apart from data parallelism.
``--reshard-after-forward never`` (or ``always``; default: torchtitan's ``default``) passes
FSDP2's policy on (``stochround titan --reshard-after-forward``): with ``never`` each block
keeps its parameters unsharded from its forward to its backward, so the backward gathers
nothing (one all-gather a block a step less, fewer FSDP2 hooks with work to do, the
unsharded model held in memory).  It acts where torchtitan applies FSDP2: above one GPU
without ``--replicate``, and under 0.3.0 also on one GPU and with ``--replicate`` (FSDP2 on
a one-rank shard), so a scaling ratio's one-GPU run takes the same policy; under 0.2.2 the
command notes that it has no effect there.  ``--tensor-parallel T`` (T dividing N) shards
each layer's weight over T GPUs (``stochround titan --tensor-parallel``, torchtitan's
``parallelism.tensor_parallel_degree``: each GPU quantizes its own shard), the other
factor of the GPUs data parallel; its tokens/s are torchtitan's per device (a
tensor-parallel group's tokens over its GPUs), so ``scaling`` compares the run's total
with one GPU's as for data parallelism.

``--log-every K`` (default 1) has each run write a row at step 1 and every Kth step only
(``stochround titan --log-every``, torchtitan's ``metrics.log_freq``; the steps a multiple
of K, so the last step has its row).  A logged step reads the loss and the gradient norm on
the host, which waits there for the GPU to finish the step; between logged steps the host
runs ahead of the GPU, launching the next step while the GPU finishes this one.  So with
K = 1 every step is host-synchronized, and a host-bound run's tokens/s counts the GPU's
idle time at every sync; ``--log-every 10`` (torchtitan's own default) measures throughput
with the host running ahead nine steps in ten.  A row's tokens/s is torchtitan's: the
tokens since the previous row over the time since, the K steps up to the row's taken
together (step 1's row: step 1 alone); its loss is its step's only.

Written under ``--out``, ``RUN`` being ``<N>gpu``, then ``-tp<T>`` with T above 1, then
``-replicate`` with ``--replicate``, then ``-reshard-<policy>`` with a policy other than
the default, then
``-log<K>`` with K above 1 (so no run overwrites another's files; a run logging every K
steps is another measurement of tokens/s than one logging every step, and the default run
keeps its names): ``<case>-RUN/rows.jsonl`` (torchtitan's dump folder: one row per logged
step, its ``step``, loss and tokens/s per device), ``summary-RUN.json`` (per case, by the
rows' steps: the last loss, the mean loss of the rows in the last tenth of the steps, the
median tokens/s per device of the rows after the first tenth, and its ratio to bf16's,
the step graphs captured while those rows were timed (``timed_captures``);
with several GPUs and a one-GPU run's summary in the same folder, also ``over_one_gpu``,
the tokens/s a GPU over the one-GPU run's, and ``scaling``, the total over the one GPU's:
the issue's target is ``scaling`` within 10% of the GPUs' count) and ``loss-RUN.png``
(the loss curves in one plot, a point per row).  The one-GPU run compared is the one with
the same reshard policy and logging interval, else the default policy's
(`one_gpu_runs`).

``--cudagraphs`` (with ``--compile``) runs each case, bf16's too, with ``stochround titan
--cudagraphs``: inductor's CUDA graph trees over each compiled block, forward and backward
(what ``torch.compile(mode="reduce-overhead")`` turns on; torchtitan 0.2.2 takes no compile
mode), and the layers' step graphs off (as the recipes guide advises under
``reduce-overhead``: a step captured whole has nothing for them to save); its files take
``-cudagraphs``.  A compiled step that the host cannot keep up with replays its launches
from graphs there, as GPT-2 small's ``compiled_cudagraphs`` rows do (`bench_model.py`).

``--profile-steps K`` has torchtitan's profiler record each run's last K steps (left out of
the tokens/s median: the profiler slows them) and prints, per case and rank, where a step's
time goes (`titan_profile`): the step's wall time, the GPU's busy time, its compute
kernels, NCCL's kernels per collective and the part of them no other GPU work hides, the
GPU's idle time (wall less busy), the kernels launched, the CPU's top self times (ops, CUDA
runtime calls, FSDP2's hooks, the optimizer's foreach ops) and the top annotations; also
written to ``profile-RUN.json``, the traces kept in each case's ``profile_traces/`` (open
them in Perfetto).

    python benchmarks/bench_titan.py --gpus 1 --out "$OUT"          # one GPU, 200 steps
    python benchmarks/bench_titan.py --gpus 2 --out "$OUT"          # two GPUs, FSDP2
    python benchmarks/bench_titan.py --gpus 2 --flavor 100M --compile --steps 16 \\
        --profile-steps 3 --cases bf16 nvfp4 --out "$OUT"             # where the time goes
    python benchmarks/bench_titan.py --gpus 2 --flavor 100M --compile --batch 32 \\
        --reshard-after-forward never --cases bf16 nvfp4 --out "$OUT"   # no backward all-gather
    python benchmarks/bench_titan.py --gpus 1 --flavor 100M --compile --log-every 10 \\
        --cases bf16 nvfp4 --out "$OUT"                               # the host running ahead
    python benchmarks/bench_titan.py --gpus 1 --flavor 100M --compile --cudagraphs \\
        --log-every 10 --cases bf16 nvfp4 --out "$OUT"                # blocks as CUDA graphs
    python benchmarks/bench_titan.py --gpus 2 --tensor-parallel 2 --compile --log-every 10 \\
        --cases bf16 nvfp4 --out "$OUT"                               # tensor parallel
    python benchmarks/bench_titan.py --device cpu --flavor tiny --steps 2 --seq-len 32 \\
        --batch 1 --cases bf16 nvfp4 --out /tmp/titan                 # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from titan_profile import load_trace, profile_record, rank_profile, report

# case -> (recipe, optimizer, the layers' CUDA step graphs on, the recipe's switches)
CASES: dict[str, tuple[str, str, bool, tuple[str, ...]]] = {
    "bf16": ("bf16", "AdamW", True, ()),
    "nvfp4": ("nvfp4", "AdamW", True, ()),
    "mxfp8": ("mxfp8", "AdamW", True, ()),
    "fp8": ("fp8", "AdamW", True, ()),
    "nvfp4_sr_adamw": ("nvfp4", "SRAdamW", True, ()),
    "nvfp4_no_step_graphs": ("nvfp4", "AdamW", False, ()),
    "nvfp4_pow2": ("nvfp4", "AdamW", True, ('tensor_scale="pow2"',)),
}


def command(case: str, args: argparse.Namespace, folder: Path) -> list[str]:
    """The ``stochround titan`` command line of one case."""
    recipe, optimizer, step_graphs, switches = CASES[case]
    launcher = [sys.executable, "-m"]
    if args.gpus > 1:
        launcher += ["torch.distributed.run", "--standalone", f"--nproc_per_node={args.gpus}"]
        launcher += ["-m"]
    return [
        *launcher,
        "stochround",
        "titan",
        "--recipe",
        recipe,
        "--optimizer",
        optimizer,
        "--steps",
        str(args.steps),
        "--flavor",
        args.flavor,
        "--seq-len",
        str(args.seq_len),
        "--batch",
        str(args.batch),
        "--device",
        args.device,
        "--seed",
        str(args.seed),
        "--out",
        str(folder),
        *(["--compile"] if args.compile else []),
        *([] if step_graphs else ["--no-step-graphs"]),
        *(word for switch in switches for word in ("--switch", switch)),
        *option("--profile-steps", args.profile_steps, 0),
        *(["--replicate"] if args.replicate else []),
        *option("--reshard-after-forward", args.reshard_after_forward, "default"),
        *option("--tensor-parallel", args.tensor_parallel, 1),
        *option("--log-every", args.log_every, 1),
        *(["--cudagraphs"] if args.cudagraphs else []),
    ]


def option(name: str, value: object, default: object) -> list[str]:
    """``stochround titan``'s option ``name value``, or nothing where ``value`` is its
    default (so the default run's command line is unchanged)."""
    return [] if value == default else [name, str(value)]


def run_name(args: argparse.Namespace) -> str:
    """The run's part of the folder and file names:
    ``<N>gpu[-tpT][-replicate][-reshard-POLICY][-logK][-cudagraphs]`` (no tensor-parallel
    part for T = 1, no policy part for the default, no logging part for K = 1)."""
    name = f"{args.gpus}gpu" + ("" if args.tensor_parallel == 1 else f"-tp{args.tensor_parallel}")
    name += "-replicate" if args.replicate else ""
    policy = args.reshard_after_forward
    name += "" if policy == "default" else f"-reshard-{policy}"
    name += "" if args.log_every == 1 else f"-log{args.log_every}"
    return name + ("-cudagraphs" if args.cudagraphs else "")


def one_gpu_runs(args: argparse.Namespace) -> list[str]:
    """The names of the one-GPU runs a run of several GPUs is compared with, first found
    first: the one-GPU run with the same reshard policy and logging interval, then with the
    default policy (under torchtitan 0.2.2 one GPU has no FSDP2, so no policy): their
    `run_name`s."""
    alone = argparse.Namespace(
        **{**vars(args), "gpus": 1, "replicate": False, "tensor_parallel": 1}
    )
    default = argparse.Namespace(**{**vars(alone), "reshard_after_forward": "default"})
    return list(dict.fromkeys((run_name(alone), run_name(default))))


def add_scaling(results: dict[str, dict[str, float]], gpus: int, one_gpu: dict) -> None:
    """Each case's ``over_one_gpu`` (its tokens/s a GPU over the one-GPU run's) and
    ``scaling`` (the run's total tokens/s over the one-GPU run's: ``gpus`` times that),
    where the one-GPU summary ``one_gpu`` has the case."""
    for case, values in results.items():
        alone = one_gpu.get(case, {}).get("tps")
        if alone and "tps" in values:
            values["over_one_gpu"] = values["tps"] / alone
            values["scaling"] = gpus * values["over_one_gpu"]


def summary(rows: list[dict[str, float]], profiled: int = 0) -> dict[str, float]:
    """A run's figures by its rows' steps (a row at step 1 and every Kth step, its tokens/s
    over the steps since the previous row): the last step and its loss, the mean loss of
    the rows in the last tenth of the steps, and the median tokens/s of the rows after the
    first tenth (start-up, compilation) whose steps all precede the last ``profiled`` steps
    (the profiler slows those).  With one row a step, a row's figures are its step's.
    Where the rows count the step graphs' captures, ``timed_captures``: those between the
    first and the last of the rows timed (layers whose graphs had not settled)."""
    last = int(rows[-1]["step"])
    tenth = max(1, last // 10)
    later = [r for r in rows if tenth < r["step"] <= last - profiled] or rows
    figures = {
        "steps": last,
        "last_loss": rows[-1]["loss"],
        "tail_loss": statistics.fmean(r["loss"] for r in rows if r["step"] > last - tenth),
        "tps": statistics.median(r["tps"] for r in later),
    }
    if "graph_captures" in rows[-1]:
        figures["timed_captures"] = later[-1]["graph_captures"] - later[0]["graph_captures"]
    return figures


def profiles(folder: Path) -> list[dict[str, Any]]:
    """Each rank's summary of a run's traces (`titan_profile`), printed and returned."""
    from stochround.integrations.torchtitan.profiling import trace_files

    found = []
    for path in trace_files(folder):
        profile = rank_profile(load_trace(path))
        print(report(profile), flush=True)
        found.append(profile_record(profile))
    return found


def plot(curves: dict[str, list[dict[str, float]]], path: Path, title: str) -> None:
    """The loss curves in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for case, rows in curves.items():
        axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=case, lw=1)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (bytes, nats)")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options, checked (a bad one exits as argparse's errors do)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (torchrun above 1)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--flavor", default="debugmodel", choices=("debugmodel", "100M", "tiny"))
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="samples a step per GPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile (torchtitan compiles each block)"
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="steps torchtitan's profiler records at each run's end, summarized (0: off)",
    )
    parser.add_argument(
        "--replicate",
        action="store_true",
        help="data parallelism by whole-model replicas (DDP), not FSDP2's shards",
    )
    parser.add_argument(
        "--reshard-after-forward",
        default="default",
        choices=("default", "always", "never"),
        help="FSDP2's reshard-after-forward policy (torchtitan's; never: no all-gather in "
        "the backward, parameters unsharded from forward to backward)",
    )
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        help="GPUs each layer's weight is sharded over (torchtitan's tensor-parallel "
        "degree; it divides --gpus, the other factor data parallel)",
    )
    parser.add_argument(
        "--log-every",
        type=int,
        default=1,
        help="a row at step 1 and every K steps (a logged step syncs the host with the GPU: "
        "10, torchtitan's default, to measure throughput; 1 for every step's loss)",
    )
    parser.add_argument(
        "--cudagraphs",
        action="store_true",
        help="inductor's CUDA graph trees over each compiled block, the layers' step graphs "
        "off (needs --compile)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cudagraphs and not args.compile:
        parser.error("--cudagraphs captures the compiled blocks: it needs --compile")
    if args.device == "cpu" and args.gpus != 1:
        parser.error("--device cpu runs one process: --gpus 1")
    if args.tensor_parallel < 1 or args.gpus % args.tensor_parallel:
        parser.error("--tensor-parallel must be at least 1 and divide --gpus")
    if args.replicate and args.gpus == 1:
        parser.error("--replicate spreads replicas over GPUs: --gpus above 1")
    if args.log_every < 1 or args.steps % args.log_every:
        parser.error("--log-every must be at least 1 and divide --steps (the last step logged)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_options(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    curves: dict[str, list[dict[str, float]]] = {}
    results: dict[str, dict[str, float]] = {}
    traced: dict[str, list[dict[str, Any]]] = {}
    run = run_name(args)
    for case in args.cases:
        folder = args.out / f"{case}-{run}"
        line = command(case, args, folder)
        print(" ".join(line), flush=True)
        done = subprocess.run(line, check=False)
        if done.returncode != 0:
            results[case] = {"returncode": done.returncode}
            continue
        rows = [json.loads(x) for x in (folder / "rows.jsonl").read_text().splitlines()]
        curves[case] = rows
        results[case] = summary(rows, args.profile_steps)
        if args.profile_steps:
            print(f"{case}, {run}: where a step's time goes", flush=True)
            traced[case] = profiles(folder)
    base = results.get("bf16", {}).get("tps")
    for values in results.values():
        if base and "tps" in values:
            values["tps_over_bf16"] = values["tps"] / base
    if args.gpus > 1:  # against the one-GPU run in the same folder, where there is one
        found = [args.out / f"summary-{name}.json" for name in one_gpu_runs(args)]
        baseline = next((path for path in found if path.exists()), None)
        if baseline is not None:
            add_scaling(results, args.gpus, json.loads(baseline.read_text()))
    (args.out / f"summary-{run}.json").write_text(json.dumps(results, indent=2))
    if traced:
        (args.out / f"profile-{run}.json").write_text(json.dumps(traced, indent=2))
    if curves:
        title = f"Llama 3 {args.flavor} on the stdlib, {run}, {args.steps} steps"
        plot(curves, args.out / f"loss-{run}.png", title)
    for case, values in results.items():
        print(case, json.dumps(values))
    return 0 if all("tps" in v for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
