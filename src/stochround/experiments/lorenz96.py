"""Lorenz-96 with its state stored in low precision: climate statistics and periodic orbits
(Klöwer, Coveney, Paxton & Palmer 2023).

dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - x_i + F, i cyclic, N = 40 variables, F = 8, RK4
with dt = 0.01 (the classical setting: stable and accurate for this step).  The RK4 stages
are computed in float64 from the stored state and the new state is stored rounded to bf16
or fp16, with rne or exact SR; the float64 run is the reference.  Every run starts from the
same state, the float64 run's after a spin-up of 1000 steps from x = F + 0.01 e_0.  The
chaotic trajectories decorrelate within a few time units, so only statistics compare:
the long-run mean and variance of all x_i over the run.  A rne run is a deterministic map
on a finite set, so it is eventually periodic; a state seen twice (exactly) is reported
with the period.  SR runs are Markov chains, not maps: a repeated state does not repeat
the future.

Random bits: step t of the SR run of format index f draws the words of stream (seed,
offset = 96 + f) at indices t * N .. t * N + N - 1, passed as rand=.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

VARIABLES = 40
FORCING = 8.0
DT = 0.01
SPIN_UP = 1000
FORMATS = ("bf16", "fp16")
MODES = ("rne", "sr")
STREAM_OFFSET = 96


def tendency(x: torch.Tensor) -> torch.Tensor:
    """dx/dt of Lorenz-96 for each row of x."""
    return (x.roll(-1, -1) - x.roll(2, -1)) * x.roll(1, -1) - x + FORCING


def rk4(x: torch.Tensor) -> torch.Tensor:
    k1 = tendency(x)
    k2 = tendency(x + DT / 2 * k1)
    k3 = tendency(x + DT / 2 * k2)
    k4 = tendency(x + DT * k3)
    return x + DT / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    steps = 3000 if quick else 100_000
    x = torch.full((VARIABLES,), FORCING, dtype=torch.float64)
    x[0] += 0.01
    for _ in range(SPIN_UP):
        x = rk4(x)
    labels = ["fp64"] + [f"{fmt} {mode}" for fmt in FORMATS for mode in MODES]
    state = x.repeat(len(labels), 1)
    for row, label in enumerate(labels[1:], 1):
        state[row] = rounding.round(x, label.split()[0], "rne")
    words = {
        fmt: streams.random_words_like(torch.empty(steps, VARIABLES), seed, STREAM_OFFSET + f)
        for f, fmt in enumerate(FORMATS)
    }
    total = torch.zeros(len(labels), dtype=torch.float64)
    total_squares = torch.zeros(len(labels), dtype=torch.float64)
    seen: dict[str, dict[bytes, int]] = {label: {} for label in labels if label.endswith("rne")}
    period: dict[str, tuple[int, int] | None] = dict.fromkeys(seen)
    trace = torch.empty(steps, len(labels), dtype=torch.float64)
    for t in progress.track(range(steps), "lorenz96", steps):
        new = rk4(state)
        for row, label in enumerate(labels[1:], 1):
            fmt, mode = label.split()
            if mode == "rne":
                new[row] = rounding.round(new[row], fmt, "rne")
            else:
                new[row] = rounding.round(new[row], fmt, "sr", rand=words[fmt][t])
        state = new
        total += state.sum(1)
        total_squares += (state**2).sum(1)
        trace[t] = state[:, 0]
        for row, label in enumerate(labels):
            if label in seen and period[label] is None:
                signature = state[row].numpy().tobytes()
                if signature in seen[label]:
                    period[label] = (seen[label][signature], t - seen[label][signature])
                else:
                    seen[label][signature] = t
    count = steps * VARIABLES
    means = total / count
    variances = total_squares / count - means**2
    key: dict[str, float | int | str | bool] = {"steps": steps}
    rows = []
    for row, label in enumerate(labels):
        name = label.replace(" ", "_")
        key[f"{name}_mean"] = float(means[row])
        key[f"{name}_variance"] = float(variances[row])
        orbit = "-"
        if label in period:
            found = period[label]
            key[f"{name}_period"] = 0 if found is None else found[1]
            key[f"{name}_period_starts_at"] = -1 if found is None else found[0]
            orbit = f"none in {steps} steps" if found is None else f"{found[1]} from {found[0]}"
        rows.append([label, f"{float(means[row]):.4f}", f"{float(variances[row]):.4f}", orbit])
    table = Table(
        f"Lorenz-96, N = {VARIABLES}, F = {FORCING:g}, RK4 dt = {DT}, {steps} steps",
        ["state", "mean of x_i", "variance of x_i", "periodic orbit (period, first step)"],
        rows,
        [
            "The state is rounded after each step; the RK4 stages are float64. Statistics "
            "over all variables and steps after the shared spin-up.",
        ],
    )
    figure = _plot(trace, labels, out)
    return Experiment(
        name="lorenz96",
        title="Lorenz-96 with a low-precision state",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "steps": steps, "dt": DT},
    )


def _plot(trace: torch.Tensor, labels: list[str], out: Path) -> Path:
    """Histogram of x_0 over the run for each state."""
    figure, axes = new_figure()
    bins = np.linspace(-12, 16, 57)
    for row, label in enumerate(labels):
        style = "-" if label.endswith("sr") or label == "fp64" else "--"
        color = "k" if label == "fp64" else f"C{(row - 1) // 2}"
        counts, edges = np.histogram(trace[:, row].numpy(), bins=bins, density=True)
        axes.step(edges[:-1], counts, where="post", linestyle=style, color=color, label=label)
    axes.set_xlabel("x_0")
    axes.set_ylabel("density")
    axes.set_title("Lorenz-96: distribution of x_0 over the run")
    axes.legend(fontsize=8)
    return save_figure(figure, out, "lorenz96")
