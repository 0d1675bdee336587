"""Where a torchtitan step's time goes on one rank, from the Chrome trace torchtitan's
profiler wrote (``stochround titan --profile-steps N``; bench_titan.py prints it).

Per recorded step (the trace's ``ProfilerStep#`` spans on the CPU, the time between two
of the trainer's profiler steps; their copies on the GPU's timeline are not counted), all
in milliseconds:

- ``wall``: the mean step;
- ``busy``: the GPU's busy time, the union of its kernels, copies and memsets over every
  stream (work on two streams at once counts once);
- ``compute``: the union of the kernels other than NCCL's;
- ``nccl``: the union of NCCL's kernels of each collective (all-gather, reduce-scatter,
  all-reduce, other); an NCCL kernel runs from its launch until its peers' data has
  arrived, so a rank that waits for a slower one shows the wait here;
- ``exposed_nccl``: the NCCL time during which no other kernel, copy or memset runs (the
  communication that compute does not hide);
- ``idle``: ``wall - busy``, the GPU waiting for the CPU (launches, hooks, Python) or for
  a synchronization;
- ``kernels``: kernels launched;
- ``cpu_self``: the names with the most CPU self time (an op's, CUDA runtime call's or
  annotation's time less that of the events nested in it on its thread: an annotation's
  self time is the Python running in it outside any op), summed over every thread;
- ``annotations``: the ``record_function`` spans (FSDP2's hooks, the optimizer's step,
  compiled graphs) with the most total time, per-module suffixes dropped so each hook
  reads as one;
- ``gpu_kernels``: the kernels with the most GPU time, by name (the first
  `KERNEL_NAME_CHARS` characters), summed over their launches: which of a recipe's
  kernels the steps' device time goes to.

The GPU's work is counted whole, not clipped to the steps' CPU spans: it runs behind the
CPU, and the trainer synchronizes on every step's loss, so over the recorded steps the
work launched in them is the work in the trace.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

# Kineto's event categories: the GPU's work, and the CPU events nested on each thread
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_EVENTS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
STEP_PREFIX = "ProfilerStep#"
# NCCL kernel names (ncclDevKernel_AllGather_RING_LL, ncclKernel_ReduceScatter_...)
COLLECTIVES = {
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "allreduce": "all_reduce",
}
# the per-module or per-graph part of an annotation's name: "FSDP::pre_forward (layers.0)",
# "FSDP::backward_prefetch for layers.1", "## Call CompiledFxGraph f0a1... ##"
NAME_SUFFIX = re.compile(r" \(.*\)$| for \S+$|(?<=CompiledFxGraph) \w+")
# a kernel's name as listed (a GEMM's or a templated kernel's full name runs to hundreds)
KERNEL_NAME_CHARS = 80

Event = dict[str, Any]


@dataclass(frozen=True)
class RankProfile:
    """One rank's recorded steps (module docstring); times in ms per step."""

    rank: int
    steps: int
    wall: float
    busy: float
    compute: float
    nccl: dict[str, float]
    exposed_nccl: float
    idle: float
    kernels: float
    cpu_self: list[tuple[str, float]]
    annotations: list[tuple[str, float]]
    gpu_kernels: list[tuple[str, float]]


def load_trace(path: Path) -> dict[str, Any]:
    """A Chrome trace file (``.json`` or ``.json.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return dict(json.load(file))


def union_length(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def span(event: Event) -> tuple[float, float]:
    return event["ts"], event["ts"] + event["dur"]


def collective(name: str) -> str | None:
    """The collective of an NCCL kernel's name (None: not NCCL's)."""
    if not name.lower().startswith("nccl"):
        return None
    flat = name.lower().replace("_", "")
    return next((kind for key, kind in COLLECTIVES.items() if key in flat), "other")


def short_name(name: str) -> str:
    """An annotation's name without its module or graph part (`NAME_SUFFIX`)."""
    return NAME_SUFFIX.sub("", name)


def self_times(events: Iterable[Event]) -> dict[str, float]:
    """Each name's CPU self time, summed: an event's duration less its direct children's
    on its thread (events nest by time on one thread)."""
    by_thread: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for event in events:
        by_thread[event["pid"], event["tid"]].append(event)
    totals: dict[str, float] = defaultdict(float)
    for thread in by_thread.values():
        stack: list[tuple[float, str]] = []  # (end, name) of the open events
        for event in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            start, end = span(event)
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                totals[stack[-1][1]] -= event["dur"]
            name = short_name(event["name"])
            totals[name] += event["dur"]
            stack.append((end, name))
    return dict(totals)


def top(totals: dict[str, float], count: int, steps: int) -> list[tuple[str, float]]:
    """The ``count`` largest totals, in ms per step."""
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    return [(name, value / 1e3 / steps) for name, value in ranked]


class GpuTimes(NamedTuple):
    """The GPU's times over the recorded steps (µs): module docstring."""

    busy: float
    compute: float
    exposed_nccl: float
    nccl: dict[str, float]


def gpu_times(work: list[Event]) -> GpuTimes:
    """The GPU's times of its kernels, copies and memsets ``work``."""
    nccl: dict[str, list[tuple[float, float]]] = defaultdict(list)
    compute, not_nccl = [], []
    for event in work:
        kind = collective(event["name"]) if event["cat"] == "kernel" else None
        if kind:
            nccl[kind].append(span(event))
            continue
        not_nccl.append(span(event))
        if event["cat"] == "kernel":
            compute.append(span(event))
    busy = union_length(span(e) for e in work)
    return GpuTimes(
        busy=busy,
        compute=union_length(compute),
        exposed_nccl=busy - union_length(not_nccl),
        nccl={kind: union_length(spans) for kind, spans in nccl.items()},
    )


def times_by_name(
    events: Iterable[Event], category: str, name: Callable[[str], str]
) -> dict[str, float]:
    """The total duration (µs) of the ``events`` of ``category``, by ``name`` of their
    names."""
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event["cat"] == category:
            totals[name(event["name"])] += event["dur"]
    return dict(totals)


def kernel_times(work: list[Event]) -> dict[str, float]:
    """Each kernel's total GPU time (µs), by its name's first `KERNEL_NAME_CHARS`
    characters."""
    return times_by_name(work, "kernel", lambda full: full[:KERNEL_NAME_CHARS])


def split_steps(events: list[Event]) -> tuple[list[float], list[Event]]:
    """The CPU's ``ProfilerStep#`` durations (µs), and its other events."""
    steps, others = [], []
    for event in events:
        if event.get("cat") not in CPU_EVENTS:
            continue
        if event["name"].startswith(STEP_PREFIX):
            steps.append(event["dur"])
        else:
            others.append(event)
    return steps, others


def annotation_times(cpu: list[Event]) -> dict[str, float]:
    """Each annotation's total time (µs), by its short name."""
    return times_by_name(cpu, "user_annotation", short_name)


def rank_profile(trace: dict[str, Any], count: int = 8) -> RankProfile:
    """The summary of one rank's trace (module docstring), ``count`` names in each list;
    ValueError when the trace has no recorded step."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    durations, cpu = split_steps(events)
    if not durations:
        raise ValueError("the trace has no ProfilerStep# span: no step was recorded")
    steps = len(durations)
    work = [e for e in events if e.get("cat") in GPU_WORK]
    gpu = gpu_times(work)
    ms = 1e-3 / steps  # µs over the steps -> ms a step
    wall = sum(durations) * ms
    return RankProfile(
        rank=int(trace.get("distributedInfo", {}).get("rank", 0)),
        steps=steps,
        wall=wall,
        busy=gpu.busy * ms,
        compute=gpu.compute * ms,
        nccl={kind: value * ms for kind, value in gpu.nccl.items()},
        exposed_nccl=gpu.exposed_nccl * ms,
        idle=wall - gpu.busy * ms,
        kernels=sum(e["cat"] == "kernel" for e in work) / steps,
        cpu_self=top(self_times(cpu), count, steps),
        annotations=top(annotation_times(cpu), count, steps),
        gpu_kernels=top(kernel_times(work), count, steps),
    )


def listed(pairs: list[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in pairs) or "-"


def report(profile: RankProfile) -> str:
    """Four lines: the step's times, the CPU's top self times, the top annotations, the
    kernels with the most GPU time."""
    p = profile
    nccl = ", ".join(f"{kind} {ms:.2f}" for kind, ms in sorted(p.nccl.items())) or "none"
    return (
        f"rank {p.rank} ({p.steps} steps), ms a step: wall {p.wall:.2f}, GPU busy "
        f"{p.busy:.2f}, compute {p.compute:.2f}, NCCL [{nccl}] exposed "
        f"{p.exposed_nccl:.2f}, GPU idle {p.idle:.2f}; {p.kernels:.0f} kernels\n"
        f"  CPU self: {listed(p.cpu_self)}\n"
        f"  annotations: {listed(p.annotations)}\n"
        f"  GPU kernels: {listed(p.gpu_kernels)}"
    )


def profile_record(profile: RankProfile) -> dict[str, Any]:
    """The summary as JSON-ready data."""
    return asdict(profile)


__all__ = [
    "COLLECTIVES",
    "CPU_EVENTS",
    "GPU_WORK",
    "KERNEL_NAME_CHARS",
    "STEP_PREFIX",
    "GpuTimes",
    "RankProfile",
    "annotation_times",
    "collective",
    "gpu_times",
    "kernel_times",
    "load_trace",
    "profile_record",
    "rank_profile",
    "report",
    "self_times",
    "short_name",
    "split_steps",
    "times_by_name",
    "top",
    "union_length",
]
