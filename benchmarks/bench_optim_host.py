"""Host time of one eager optimizer step on CUDA: the Python work before the GPU starts.

`bench_optim.py` times steps with `triton.testing.do_bench`, which clears the L2 cache (a
large memset) before each call; the host prepares the step while that runs, so its time
does not show there.  Here the GPU is idle at each step's start (synchronized before it)
and the wall clock around `step()` is the host time: median of ``--steps`` steps after
three warm-up steps, for stochround's AdamW (bf16 parameters and states, SR) and torch's
fused AdamW on the same bf16 parameters.  ``--profile`` adds cProfile's top entries.

    python benchmarks/bench_optim_host.py [--label after] [--ours-only] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch

import stochround

BF16 = torch.bfloat16
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
# (case, parameter count, each parameter's shape): bench_optim.py's adamw and adamw_small
CASES = (("adamw", 16, (4096, 4096)), ("adamw_small", 1000, (65536,)))


def parameters(count: int, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """bf16 CUDA parameters with bf16 gradients, the same for every provider."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    made = []
    for _ in range(count):
        param = torch.randn(shape, generator=generator, device="cuda").mul_(0.02).to(BF16)
        param.grad = torch.randn(shape, generator=generator, device="cuda").to(BF16)
        made.append(param)
    return made


def host_us(step: Callable[[], object], steps: int) -> float:
    """Median wall-clock microseconds of ``step()`` started on an idle GPU."""
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


PROVIDERS: dict[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] = {
    "stochround": lambda ps: stochround.optim.AdamW(
        ps, **ADAMW, state_dtype=BF16, rounding="sr", seed=0
    ),
    "torch_fused_bf16": lambda ps: torch.optim.AdamW(ps, **ADAMW, fused=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="", help="a label printed on each line")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (median)")
    parser.add_argument("--ours-only", action="store_true", help="skip torch's optimizer")
    parser.add_argument("--profile", action="store_true", help="cProfile 20 of our steps")
    args = parser.parse_args()
    for case, count, shape in CASES:
        for name, build in PROVIDERS.items():
            if args.ours_only and name != "stochround":
                continue
            optimizer = build(parameters(count, shape))
            host = host_us(optimizer.step, args.steps)
            print(f"{args.label} {case}/{name}: host {host:.1f} us a step", flush=True)
            if args.profile and name == "stochround":
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(20):
                    optimizer.step()
                profile.disable()
                torch.cuda.synchronize()
                stats = pstats.Stats(profile, stream=sys.stdout)
                stats.sort_stats("tottime").print_stats(14)
            del optimizer
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
