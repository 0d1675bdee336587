"""Where a `QuantizedLinear` step's host time goes: the wall time of a forward + backward
in a loop and a cProfile of the same loop, with the layer's CUDA step graphs on (the
default) and off, for one recipe and shape; ``--compiled``: the layer under
``torch.compile`` (Inductor, ``fullgraph=True``), whose step calls the layer's opaque ops
(the step counter's advance, the forward and the backward op, each replaying its step
graph where one serves it) from Inductor's code, so the profile shows their Python.

A small step is host-bound: its wall time in a loop is the host's time (the device's
kernels take a fraction of it), so the profile's lines are what to cut.  The wall time is
timed without the profiler (``time.perf_counter`` around ``--steps`` steps after
``--warmup``, synchronized at both ends); the profile is a second loop of the same steps,
its lines sorted by own time (``tottime``) and printed with the functions' call counts
per step.  Each launch from Python (a ``copy_``, a ``_foreach_copy_``, a graph's
``replay``) shows as a line of its own; the autograd engine's C++ time shows in
``run_backward``.

    python benchmarks/profile_step_host.py              # GPU: nvfp4, 2048 x 1024 x 1024
    python benchmarks/profile_step_host.py --recipe mxfp8 --tokens 8192 --features 768
    python benchmarks/profile_step_host.py --compiled --tokens 16384 --features 256
    python benchmarks/profile_step_host.py --device cpu --steps 3 --warmup 1   # smoke test

Writes ``--out`` (JSON: per setting, the wall time a step and the top lines) when given.
Not rows: the figures go into benchmarks/notes by hand, with the command and the GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import stochround.nn as srnn
from stochround.nn.step_graphs import STEP_GRAPHS

# what --recipe takes besides the recipes' names: fp8() with its GEMMs on the FP8 tensor
# cores, and the plain bf16 nn.Linear the quantized steps are compared with
FP8_NATIVE, PLAIN = "fp8_native", "linear"


def layer_step(
    recipe: str, tokens: int, features: int, device: str, compiled: bool = False
) -> Callable[[], None]:
    """A forward + backward of a bf16 ``QuantizedLinear(features, features)`` under
    ``RECIPES[recipe]()`` (`FP8_NATIVE`: ``fp8(native=True)``; `PLAIN`: an ``nn.Linear``)
    on fixed x and dy, the gradients set to None first; ``compiled``: the layer under
    ``torch.compile(fullgraph=True)``."""
    layer: torch.nn.Linear
    if recipe == PLAIN:
        layer = torch.nn.Linear(features, features, bias=False, device=device, dtype=torch.bfloat16)
    else:
        made = srnn.fp8(native=True) if recipe == FP8_NATIVE else srnn.RECIPES[recipe]()
        layer = srnn.QuantizedLinear(
            features, features, bias=False, device=device, dtype=torch.bfloat16, recipe=made
        )
    model = torch.compile(layer, fullgraph=True) if compiled else layer
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (tokens, features)
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator)
    x.requires_grad_()
    dy = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator)

    def step() -> None:
        layer.weight.grad = None
        x.grad = None
        model(x).backward(dy)

    return step


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def wall_us(step: Callable[[], None], steps: int, device: str) -> float:
    """The wall time a step of ``steps`` back to back, in microseconds."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps * 1e6


def profile_lines(step: Callable[[], None], steps: int, device: str, top: int) -> list[dict]:
    """cProfile of ``steps`` steps: the ``top`` functions by own time, each with its calls a
    step and its own and cumulative microseconds a step."""
    profiler = cProfile.Profile()
    synchronize(device)
    profiler.enable()
    for _ in range(steps):
        step()
    synchronize(device)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).name}:{line}({name})" if line else name
        rows.append(
            {
                "function": where,
                "calls_a_step": calls / steps,
                "own_us_a_step": own / steps * 1e6,
                "cumulative_us_a_step": cumulative / steps * 1e6,
            }
        )
    rows.sort(key=lambda row: -row["own_us_a_step"])
    return rows[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", default="nvfp4", choices=[*sorted(srnn.RECIPES), FP8_NATIVE, PLAIN]
    )
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200, help="timed and profiled steps")
    parser.add_argument("--warmup", type=int, default=20, help="steps before timing")
    parser.add_argument("--top", type=int, default=25, help="profile lines printed")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--compiled", action="store_true", help="the layer under torch.compile (Inductor)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON of the figures")
    args = parser.parse_args(argv)
    for name in ("tokens", "features", "steps", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1; got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0; got {args.warmup}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU (use --device cpu for a smoke test)")
    results = {}
    previous = STEP_GRAPHS.enabled
    try:
        # the plain layer has no step graphs: one setting
        for graphs in (True,) if args.recipe == PLAIN else (True, False):
            STEP_GRAPHS.enabled = graphs
            torch._dynamo.reset()  # each setting traced anew (the trace reads the switch)
            step = layer_step(args.recipe, args.tokens, args.features, args.device, args.compiled)
            for _ in range(args.warmup):
                step()
            wall = wall_us(step, args.steps, args.device)
            lines = profile_lines(step, args.steps, args.device, args.top)
            setting = "step graphs on" if graphs else "step graphs off"
            setting = "nn.Linear" if args.recipe == PLAIN else setting
            setting += ", compiled" if args.compiled else ""
            results[setting] = {"wall_us_a_step": wall, "top": lines}
            print(f"{args.recipe}() {args.tokens} x {args.features} x {args.features}, "
                  f"{setting}: {wall:.1f} us a step (wall, {args.steps} steps)")  # fmt: skip
            print(f"  {'calls':>6} {'own us':>8} {'cum us':>8}  function (a step)")
            for line in lines:
                print(
                    f"  {line['calls_a_step']:6.1f} {line['own_us_a_step']:8.1f} "
                    f"{line['cumulative_us_a_step']:8.1f}  {line['function']}"
                )
    finally:
        STEP_GRAPHS.enabled = previous
    if args.out is not None:
        args.out.write_text(json.dumps(vars(args) | {"out": str(args.out), **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
