"""Error growth of recursive summation: ~ n u under round-to-nearest, ~ sqrt(n) u under SR.

``s_k = round(s_{k-1} + x_k)`` with x_k uniform in [0, 1) rounded (rne) to the accumulator's
format first, so the exact sum of the same inputs is known (float64 prefix sums: relative
error below n 2**-53, negligible).  Each step rounds the exact sum s + x (formed in float64,
which holds it) once.  All inputs are positive, so once increments fall below half an ulp
of the sum round-to-nearest loses them systematically (stagnation) and its error grows
linearly; SR stays unbiased and its error grows like a random walk (Connolly, Higham & Mary
2021).  The relative error |s_n - exact_n| / exact_n is recorded at checkpoints n and
averaged over runs; the slope is the least-squares fit of log10(mean error) on log10(n).

Random bits: run k at step t uses word k * n_max + t of stream (seed, offset = 16 + format
index), passed as rand=; inputs come from torch.Generator seeded with ``seed``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from .. import random as streams
from .. import rounding
from ..formats import format as find_format
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

FORMATS = ("fp16", "bf16")
MODES = ("rne", "sr")
RUNS = 8
CHECKPOINTS_PER_DECADE = 4
STREAM_OFFSET = 16


def checkpoints(n_max: int) -> list[int]:
    """n = 10, 10**(1 + 1/4), ..., n_max (rounded to integers, distinct)."""
    decades = math.log10(n_max) - 1
    count = round(decades * CHECKPOINTS_PER_DECADE) + 1
    points = np.unique(np.round(np.logspace(1, math.log10(n_max), count)).astype(int))
    return [int(p) for p in points]


def fit_slope(ns: list[int], errors: list[float]) -> float:
    """Least-squares slope of log10(error) against log10(n)."""
    slope, _ = np.polyfit(np.log10(ns), np.log10(errors), 1)
    return float(slope)


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    n_max = 10**4 if quick else 10**6
    points = checkpoints(n_max)
    generator = torch.Generator().manual_seed(seed)
    raw = torch.rand(RUNS, n_max, generator=generator, dtype=torch.float32)
    key: dict[str, float | int | str | bool] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    rows = []
    for index, fmt in enumerate(FORMATS):
        inputs = rounding.round(raw, fmt, "rne").double()
        exact = inputs.cumsum(1)[:, [p - 1 for p in points]]
        words = streams.random_words_like(torch.empty(RUNS, n_max), seed, STREAM_OFFSET + index)
        columns = inputs.t().contiguous()
        for mode in MODES:
            s = torch.zeros(RUNS, dtype=torch.float64)
            taken = []
            for t in progress.track(range(n_max), f"summation {fmt} {mode}", n_max):
                if mode == "rne":
                    s = rounding.round(s + columns[t], fmt, "rne")
                else:
                    s = rounding.round(s + columns[t], fmt, "sr", rand=words[:, t])
                if t + 1 == points[len(taken)]:
                    taken.append(s)
                    if len(taken) == len(points):
                        break
            computed = torch.stack(taken, 1)
            relative = ((computed - exact).abs() / exact).mean(0)
            errors[fmt, mode] = [float(e) for e in relative]
        u = find_format(fmt).eps / 2
        for mode in MODES:
            slope = fit_slope(points, errors[fmt, mode])
            key[f"{fmt}_{mode}_slope"] = slope
            key[f"{fmt}_{mode}_error_at_n_max"] = errors[fmt, mode][-1]
            rows.append(
                [
                    f"{fmt} {mode}",
                    f"{slope:.3f}",
                    *(f"{e:.2e}" for e in errors[fmt, mode][::CHECKPOINTS_PER_DECADE]),
                ]
            )
        key[f"{fmt}_unit_roundoff"] = u
    key["n_max"] = n_max
    table = Table(
        f"Relative error of recursive summation (mean of {RUNS} runs)",
        ["accumulator", "fitted slope", *(f"n={p}" for p in points[::CHECKPOINTS_PER_DECADE])],
        rows,
        [
            "slope: least squares of log10(mean relative error) on log10(n) over "
            f"{len(points)} checkpoints from 10 to {n_max}; n u predicts 1, sqrt(n) u 0.5.",
        ],
    )
    figure = _plot(points, errors, out)
    return Experiment(
        name="summation",
        title="Error growth of recursive summation",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "runs": RUNS, "n_max": n_max},
    )


def _plot(points: list[int], errors, out: Path) -> Path:
    figure, axes = new_figure()
    n = np.array(points, dtype=float)
    for index, fmt in enumerate(FORMATS):
        color = f"C{index}"
        u = find_format(fmt).eps / 2
        for mode, style in (("rne", "--o"), ("sr", "-s")):
            axes.plot(n, errors[fmt, mode], style, color=color, markersize=3, label=f"{fmt} {mode}")
        axes.plot(n, n * u, ":", color=color, linewidth=0.8, label=f"n u ({fmt})")
        axes.plot(n, np.sqrt(n) * u, "-.", color=color, linewidth=0.8, label=f"sqrt(n) u ({fmt})")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("n")
    axes.set_ylabel("relative error")
    axes.set_title("Recursive summation of uniform [0, 1) values")
    axes.legend(fontsize=7, ncol=2)
    return save_figure(figure, out, "summation")
