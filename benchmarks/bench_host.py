"""Host time of one small call: what a rounding call costs the CPU before any GPU work.

For tensors of a few thousand values the device work takes microseconds and the Python
side decides a call's cost (argument checks, output allocation, the Triton launch, and for
fp4 with nan="raise" the flag read that waits for the kernel).  Each row calls one entry
point on the same small tensor ``calls`` times back to back and reports the wall-clock time
a call, the median of ``repeats`` such runs, after a warm-up; PyTorch's own cast to bf16
is the reference row.

    python benchmarks/bench_host.py [--log2n 12] [--calls 2000] [--repeats 5]   # on the GPU
"""

import statistics
import time
from collections.abc import Callable
from typing import Annotated

import torch
import typer
from gpu_timing import device_description, synchronize
from rich.console import Console
from rich.table import Table

import stochround

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def rows(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The timed calls, by row name."""
    fp4 = torch.float4_e2m1fn_x2
    return {
        "torch x.to(bf16) (reference)": lambda: x.to(torch.bfloat16),
        "cast bf16 SR": lambda: stochround.cast(x, torch.bfloat16, "sr", seed=1),
        "cast e4m3fn SR": lambda: stochround.cast(x, torch.float8_e4m3fn, "sr", seed=1),
        "cast e2m1 SR (nan='raise': synchronizes)": lambda: stochround.cast(x, fp4, "sr", seed=1),
        "cast e2m1 SR, nan='zero'": lambda: stochround.cast(x, fp4, "sr", seed=1, nan="zero"),
        "round e5m2 SR (8 bits, variant a)": lambda: stochround.round(
            x, "e5m2", "sr", rbits=8, variant="a", seed=1
        ),
    }


def microseconds_a_call(function: Callable[[], object], calls: int, device: torch.device) -> float:
    """Wall-clock microseconds a call over ``calls`` back-to-back calls (then synchronized)."""
    synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        function()
    synchronize(device)
    return (time.perf_counter() - started) / calls * 1e6


@app.command()
def main(
    log2n: Annotated[int, typer.Option(help="Round 2**log2n values.")] = 12,
    calls: Annotated[int, typer.Option(help="Calls per timed run.")] = 2000,
    repeats: Annotated[int, typer.Option(help="Timed runs per row (median reported).")] = 5,
    device: Annotated[str, typer.Option(help="cuda (default) or cpu.")] = "cuda",
) -> None:
    """Time one small call of each entry point (host time: wall clock, back to back)."""
    target = torch.device(device)
    console = Console(highlight=False)
    described = ", ".join(f"{key} {value}" for key, value in device_description(target).items())
    console.print(f"{described}; 2**{log2n} fp32 values", markup=False)
    x = torch.randn(2**log2n, device=target)
    table = Table(title=f"host time of one call, {calls} calls a run, median of {repeats} runs")
    for header in ("call", "us a call", "runs (us)"):
        table.add_column(header, justify="left" if header == "call" else "right")
    for name, function in rows(x).items():
        for _ in range(max(calls // 10, 10)):  # warm-up: compiles and caches
            function()
        times = [microseconds_a_call(function, calls, target) for _ in range(repeats)]
        table.add_row(name, f"{statistics.median(times):.1f}", " ".join(f"{t:.1f}" for t in times))
    console.print(table)


if __name__ == "__main__":
    app()
