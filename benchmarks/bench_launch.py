"""Host time a launch of stochround's rounding kernels: `Launch`'s fast path against
``kernel[grid](...)``.

stochround launches its kernels through ``stochround.kernels.runtime.Launch`` (before the
layers' split ``kernels.launch.Launch``), which binds a kernel's constexprs once and, on
the Triton release it was written for, calls the compiled kernel's launcher itself (the
fast path); elsewhere it launches ``kernel[grid](*args, **constexprs)`` as Triton's
tutorials do. This benchmark decides whether the shortcut pays for itself on the installed
Triton. It records the launches that one public call makes (2**log2n fp32 values,
``backend="triton"``), then launches each recorded kernel with the same arguments
``--calls`` times back to back through ``Launch(kernel, constants)`` (provider
launch_fast), through its `PartialLaunch` with every argument fixed but the first two (x
and the output: provider launch_partial, the least a partial launch specializes; trees
without `Launch.partial` have no such row) and through ``Launch(kernel, constants,
fast=False)`` (kernel_grid): the wall time a launch, median of ``--repeats`` runs; the
whole public call is timed beside them (case ``<call>``; the launches are cases
``<call>_launch<i>``, the kernel's name in the notes). Each launch's output (the kernel's
second argument) is compared bit for bit with the one the library's own launch wrote.

Unlike the other scripts this one reads stochround's internals; where the library makes no
`Launch`, its launch rows are missing and only the public calls are timed.

    python benchmarks/bench_launch.py                                      # GPU
    python benchmarks/bench_launch.py --device cpu --calls 3 --repeats 2   # smoke test
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from functools import partial
from types import ModuleType

import torch
from harness import Benchmark, Run, equal_check, stochround_run
from torch import Tensor

FP4 = torch.float4_e2m1fn_x2
# public calls: name, then `harness.stochround_run`'s function, arguments, keywords, format
CALLS = [
    ("bf16", "cast", (torch.bfloat16, "sr"), {}, "bfloat16"),
    ("e4m3fn", "cast", (torch.float8_e4m3fn, "sr"), {}, "e4m3fn"),
    ("e2m1", "cast", (FP4, "sr"), {"nan": "zero"}, "e2m1"),
    ("e5m2_sr8_a", "round", ("e5m2", "sr"), {"rbits": 8, "variant": "a"}, "e5m2"),
]


def runtime() -> ModuleType:
    """stochround's module of `Launch` and `FAST_LAUNCH`: ``kernels.runtime``, or
    ``kernels.launch`` in trees before the layers' split (a baseline)."""
    for name in ("stochround.kernels.runtime", "stochround.kernels.launch"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "Launch"):
            return module
    raise ImportError("stochround.kernels has no Launch")


def recorded_launches(call: Callable[[], object]) -> list[tuple]:
    """The `Launch`es one call of ``call`` makes: (launch, device, programs, arguments, a
    copy of the output it wrote)."""
    launch_class = runtime().Launch
    seen, original = [], launch_class.__call__

    def record(self: object, device: int, programs: int, *args: object) -> None:
        original(self, device, programs, *args)
        seen.append((self, device, programs, args, args[1].clone()))

    launch_class.__call__ = record
    try:
        call()
    finally:
        launch_class.__call__ = original
    return seen


def launch_run(recorded: tuple, fast: bool) -> Run:
    """Launches of a recorded kernel through a new `Launch`, fast path or ``kernel[grid]``."""
    module = runtime()
    launch, device, programs, args, written = recorded
    bound = module.Launch(launch.kernel, launch.constants, fast=fast and module.FAST_LAUNCH)
    output: Tensor = args[1]

    def call() -> Tensor:
        bound(device, programs, *args)
        return output

    name = getattr(launch.kernel, "__name__", type(launch.kernel).__name__)
    how = "fast path" if bound.fast else "kernel[grid]"
    return Run(call, equal_check(written), args[0].numel(), notes=f"{name}, {how}")


def partial_run(recorded: tuple) -> Run:
    """Launches of a recorded kernel through a `PartialLaunch` of a new `Launch` (fast
    path) with every argument fixed but x and the output (its first two)."""
    module = runtime()
    launch, device, programs, args, written = recorded
    bound = module.Launch(launch.kernel, launch.constants, fast=module.FAST_LAUNCH)
    varying = (module.Varying(0), module.Varying(1))
    partial_launch = bound.partial((*varying, *args[2:]))
    source, output = args[0], args[1]

    def call() -> Tensor:
        partial_launch(device, programs, source, output)
        return output

    name = getattr(launch.kernel, "__name__", type(launch.kernel).__name__)
    how = "partial, 2 varying" if bound.fast else "kernel[grid]"
    return Run(call, equal_check(written), source.numel(), notes=f"{name}, {how}")


def main() -> int:
    bench = Benchmark("bench_launch", __doc__, timer="host")
    bench.parser.add_argument("--log2n", type=int, default=12, help="elements 2**log2n (12)")
    args = bench.parse_args()
    generator = torch.Generator(device=bench.device).manual_seed(0)
    x = torch.randn(2**args.log2n, generator=generator, device=bench.device)
    for name, *spec in CALLS:
        public = partial(stochround_run, x, *spec, backend="triton", count=args.check_count)
        bench.add(name, "stochround", public, ours=True)
        try:
            launches = recorded_launches(public().call)
        except ImportError as error:
            print(f"{name}: no launches recorded ({error})")
            continue
        for number, recorded in enumerate(launches, 1):
            case = f"{name}_launch{number}"
            bench.add(case, "launch_fast", partial(launch_run, recorded, True), ours=True)
            if hasattr(runtime(), "PartialLaunch"):
                bench.add(case, "launch_partial", partial(partial_run, recorded), ours=True)
            bench.add(case, "kernel_grid", partial(launch_run, recorded, False))
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
