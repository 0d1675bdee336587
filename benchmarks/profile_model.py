"""Where a model step's time goes under the layers' CUDA step graphs: per step, the wall
time and the step graphs' counters (graphs captured, replays, graphs kept, whether they
filled their bounds, the bytes they hold), then the device time a step (torch.profiler over
three steps) against the wall time of ten, and the kernels that take most of it.

The model is `bench_model.py`'s GPT (``--preset gpt2-small``: 12 blocks, d = 768, 8 x
1024 tokens) under a variant, eager, compiled (inductor, default mode) or
``compiled_cudagraphs`` (``mode="reduce-overhead"``: the whole step replayed as CUDA
graphs, with the layers' step graphs off, as `bench_model.py`'s rows run it):

    python benchmarks/profile_model.py --variant nvfp4 --how compiled --steps 24
    python benchmarks/profile_model.py --variant bf16 --how compiled

The first step compiles.  A step that captures graphs is slow; captures that go on step
after step are the layers' addresses not yet settled (each capture moves the allocations
of the steps after it).  Not rows: the figures go into benchmarks/notes by hand, with the
command and the GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from bench_gaussws import Inputs, step
from bench_model import COMPILE_MODES, PRESETS, VARIANTS, build_model, uses_step_graphs
from torch.profiler import ProfilerActivity, profile

from stochround.nn.step_graphs import STEP_GRAPHS, use_step_graphs


def counters() -> str:
    """The step graphs' counters, short: captures, replays, graphs kept (of them reading
    in place), crowded, MiB."""
    crowded = " full" if STEP_GRAPHS.crowded else ""
    in_place = sum(each.addresses is not None for each in STEP_GRAPHS.graphs.values())
    return (
        f"captured {STEP_GRAPHS.captures}, replays {STEP_GRAPHS.replays}, "
        f"kept {len(STEP_GRAPHS.graphs)} ({in_place} in place){crowded}, "
        f"{STEP_GRAPHS.bytes >> 20} MiB"
    )


def timed_ms(call: Callable[[], object], steps: int) -> float:
    """Wall milliseconds a step over ``steps`` steps, synchronized at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=tuple(PRESETS), default="gpt2-small")
    parser.add_argument("--variant", choices=VARIANTS, default="nvfp4")
    parser.add_argument("--how", choices=("eager", *COMPILE_MODES), default="compiled")
    parser.add_argument("--steps", type=int, default=14, help="steps shown one by one")
    parser.add_argument("--top", type=int, default=12, help="kernels printed")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the step graphs and the profile need a GPU")
    if args.steps < 1 or args.top < 0:
        parser.error("--steps must be at least 1 and --top at least 0")
    d_model, layers, heads, context, batch = PRESETS[args.preset]
    device = torch.device("cuda")
    use_step_graphs(False)  # drops any graphs, then on as bench_model's rows run
    use_step_graphs(uses_step_graphs(args.variant, args.how))
    model = build_model((d_model, layers, heads, context), args.variant, device)
    runner = model if args.how == "eager" else torch.compile(model, mode=COMPILE_MODES[args.how])
    call = step(runner, Inputs(batch, context, device))  # type: ignore[arg-type]
    for index in range(args.steps):
        print(f"step {index}: {timed_ms(call, 1):.1f} ms; {counters()}", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    device_ms = sum(e.device_time_total for e in kernels) / 3e3
    print(f"{args.variant} {args.how}: device {device_ms:.2f} ms a step, wall "
          f"{timed_ms(call, 10):.2f} ms a step (10 steps)")  # fmt: skip
    for event in sorted(kernels, key=lambda e: -e.device_time_total)[: args.top]:
        print(f"  {event.device_time_total / 3e3:8.2f} ms {event.count // 3:5d}x {event.key[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
