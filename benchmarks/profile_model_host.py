"""Where a model step's host time goes, by Python function: torch.profiler's Python tracer
over a few steps of `bench_model.py`'s GPT under a variant (eager or compiled), each
function's self time (its own, less the functions it calls) and its total time, per step,
the functions that take most of either printed.

cProfile misleads under torch.compile (the frames dynamo runs outside its graphs, such as
the bodies of stochround's opaque ops, are charged to torch's dispatch); the profiler's
Python tracer records them:

    python benchmarks/profile_model_host.py --variant nvfp4 --how compiled
    python benchmarks/profile_model_host.py --variant gaussws --how compiled --match stochround

The first steps compile; ``--warmup`` steps run before the profile.  The tracer slows every
Python call, so the figures rank functions and do not time the step.  Not rows: the
figures go into benchmarks/notes by hand, with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from bench_gaussws import Inputs, step
from bench_model import COMPILE_MODES, PRESETS, VARIANTS, build_model, uses_step_graphs
from torch.profiler import ProfilerActivity, profile

from stochround.nn.step_graphs import use_step_graphs


def python_events(trace: Path) -> list[dict]:
    """The Python functions' complete events (name, ts, dur, tid) of a Chrome trace, of
    the threads that ran a step (not the idle helper threads that wait on locks)."""
    events = json.loads(trace.read_text())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
    stepping = {e.get("tid") for e in calls if "bench_gaussws.py" in e["name"]}
    return [e for e in calls if e.get("tid") in stepping]


def self_and_total(
    events: list[dict],
) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Each function's (self, total) microseconds and its calls: per thread, an event's
    self time is its duration less its direct children's (events nest by time); a
    function's total counts only its outermost calls, so that recursion is not counted
    twice."""
    own: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    by_thread: dict[object, list[dict]] = defaultdict(list)
    for event in events:
        by_thread[event.get("tid")].append(event)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [event, its children's time]
        for event in (*thread, None):
            until = float("inf") if event is None else event["ts"]
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= until:
                closed, children = stack.pop()
                own[closed["name"]] += closed["dur"] - children
                calls[closed["name"]] += 1
                if all(outer["name"] != closed["name"] for outer, _ in stack):
                    total[closed["name"]] += closed["dur"]
                if stack:
                    stack[-1][1] += closed["dur"]
            if event is not None:
                stack.append([event, 0.0])
    return own, total, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=tuple(PRESETS), default="gpt2-small")
    parser.add_argument("--variant", choices=VARIANTS, default="nvfp4")
    parser.add_argument("--how", choices=("eager", *COMPILE_MODES), default="compiled")
    parser.add_argument("--layers", type=int, default=None, help="overrides the preset's")
    parser.add_argument("--batch", type=int, default=None, help="overrides the preset's")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--warmup", type=int, default=4, help="steps before the profile")
    parser.add_argument("--steps", type=int, default=2, help="steps profiled")
    parser.add_argument("--top", type=int, default=30, help="functions printed per table")
    parser.add_argument("--match", default="", help="only functions whose name has this")
    args = parser.parse_args(argv)
    if min(args.warmup, args.steps - 1, args.top) < 0:
        parser.error("--warmup and --top must be at least 0, --steps at least 1")
    d_model, layers, heads, context, batch = PRESETS[args.preset]
    device = torch.device(args.device)
    use_step_graphs(False)  # drops any graphs, then on as bench_model's rows run
    use_step_graphs(uses_step_graphs(args.variant, args.how))
    shape = (d_model, args.layers or layers, heads, context)
    model = build_model(shape, args.variant, device)
    runner = model if args.how == "eager" else torch.compile(model, mode=COMPILE_MODES[args.how])
    call = step(runner, Inputs(args.batch or batch, context, device))  # type: ignore[arg-type]
    for _ in range(args.warmup):
        call()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(args.steps):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        own, total, calls = self_and_total(python_events(trace))
    print(f"{args.variant} {args.how} on {args.device}: Python functions, us and calls a step")
    for title, figures in (("self", own), ("total", total)):
        print(f"-- by {title} time")
        chosen = [(name, us) for name, us in figures.items() if args.match in name]
        for name, us in sorted(chosen, key=lambda item: -item[1])[: args.top]:
            print(f"{us / args.steps:10.1f} {calls[name] // args.steps:6d}x  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
