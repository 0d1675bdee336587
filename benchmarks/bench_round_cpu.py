"""SR to e4m3fn on the CPU: stochround's PyTorch path against gfloat's `round_ndarray`.

Both round the same 2**log2n fp32 values drawn from normal(0, 100) (some beyond e4m3fn's
448, which both turn into NaN) with 8 random bits, P3109 StochasticC (gfloat's
``RoundMode.Stochastic``), and the same explicit random integers in [0, 256).  The results
are first compared bit for bit (as float32, NaN equal to NaN); a disagreement exits 1.

    python benchmarks/bench_round_cpu.py [--log2n 24] [--repeats 3] [--threads N]
"""

import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Annotated

import numpy as np
import torch
import typer
from gfloat import RoundMode, round_ndarray
from gfloat.formats import format_info_ocp_e4m3
from rich.console import Console
from rich.table import Table

import stochround

RBITS = 8
FORMAT = "e4m3fn"
VARIANT = "c"  # P3109 StochasticC == gfloat RoundMode.Stochastic

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def inputs(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """normal(0, 100) fp32 values and uint8-range random integers, from one numpy generator."""
    generator = np.random.default_rng(seed)
    values = generator.normal(0.0, 100.0, size=count).astype(np.float32)
    rand = generator.integers(0, 2**RBITS, size=count, dtype=np.uint8)
    return values, rand


def run_stochround(values: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    return stochround.round(values, FORMAT, "sr", rbits=RBITS, variant=VARIANT, rand=rand)


def run_gfloat(values: np.ndarray, rand: np.ndarray) -> np.ndarray:
    return round_ndarray(
        format_info_ocp_e4m3,
        values,
        RoundMode.Stochastic,
        sat=False,
        srbits=rand,
        srnumbits=RBITS,
    )


def mismatches(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Indices where two float32 arrays differ in their bits (any NaN equals any NaN)."""
    same_bits = ours.view(np.uint32) == theirs.view(np.uint32)
    both_nan = np.isnan(ours) & np.isnan(theirs)
    return np.flatnonzero(~(same_bits | both_nan))


def median_seconds(function: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


@app.command()
def main(
    log2n: Annotated[int, typer.Option(help="Round 2**log2n values.")] = 24,
    repeats: Annotated[int, typer.Option(help="Timed runs per implementation.")] = 3,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (default: torch's choice).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the inputs.")] = 0,
) -> None:
    """Time SR to e4m3fn (8 random bits, variant c) in stochround and gfloat on one CPU run."""
    if threads is not None:
        torch.set_num_threads(threads)
    console = Console(highlight=False)
    count = 2**log2n
    console.print(
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); "
        f"gfloat {version('gfloat')}, numpy {np.__version__}",
        markup=False,
    )
    console.print(
        f"SR of 2**{log2n} = {count} fp32 values ~ normal(0, 100) to {FORMAT}, rbits={RBITS}, "
        f"variant {VARIANT} (gfloat RoundMode.Stochastic), sat none; median of {repeats} runs",
        markup=False,
    )

    values, rand = inputs(count, seed)
    values_tensor, rand_tensor = torch.from_numpy(values), torch.from_numpy(rand)

    # The check doubles as a warm-up run of each implementation.
    ours = run_stochround(values_tensor, rand_tensor).numpy()
    # gfloat returns float64 for float32 input; e4m3fn values (and NaN) convert exactly.
    theirs = run_gfloat(values, rand).astype(np.float32)
    assert ours.dtype == np.float32
    differing = mismatches(ours, theirs)
    overflowed = int(np.count_nonzero(np.isnan(theirs)))
    if differing.size:
        console.print(
            f"results DISAGREE at {differing.size} of {count} elements; first: "
            + ", ".join(
                f"x={values[i]!r} r={rand[i]} stochround={ours[i]!r} gfloat={theirs[i]!r}"
                for i in differing[:5]
            ),
            style="red",
            markup=False,
        )
    else:
        console.print(
            f"results agree bit for bit on all {count} elements ({overflowed} overflow to NaN)",
            markup=False,
        )

    timings = {
        "stochround (torch, CPU)": median_seconds(
            lambda: run_stochround(values_tensor, rand_tensor), repeats
        ),
        "gfloat round_ndarray (numpy)": median_seconds(lambda: run_gfloat(values, rand), repeats),
    }
    baseline = timings["gfloat round_ndarray (numpy)"][0]
    table = Table(title=f"SR to {FORMAT}, {count} elements")
    for header in ("implementation", "median s", "Melem/s", "speed-up vs gfloat", "runs (s)"):
        table.add_column(header, justify="left" if header == "implementation" else "right")
    for name, (median, times) in timings.items():
        table.add_row(
            name,
            f"{median:.3f}",
            f"{count / median / 1e6:.1f}",
            f"{baseline / median:.2f}x",
            " ".join(f"{t:.3f}" for t in times),
        )
    console.print(table)
    if differing.size:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
