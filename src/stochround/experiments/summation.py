"""Error growth of recursive summation: ~ n u under round-to-nearest, ~ sqrt(n) u under SR.

``s_k = round(s_{k-1} + x_k)``, each step rounding the exact sum (formed in float64, which
holds it) once.  The inputs are adversarial for round-to-nearest (Connolly, Higham & Mary
2021 state the n u bound is attained when the errors share a sign): x_1 = rne(r_1) and
x_k = U (floor(r_k / U) + 9/16), with r_k uniform in [1/2, 1) and U = ulp(s_{k-1}) of the
round-to-nearest sum, so every rne step lands 9/16 of an ulp past the grid and rounds up by
7/16 ulp (binade crossings excepted).  Each step's error is then about (7/16) ulp(s_k), in
(7/16 u s_k, 7/8 u s_k], all upward: the relative error grows like n u, with no stagnation
involved (increments stay above an ulp).  The run stops where the rne sum reaches
2**(p-1): beyond it U >= 1 > r_k, so inputs in [1/2, 1) would be below an ulp and
stagnation would start.  SR sums the same inputs: its errors are unbiased martingale
differences of variance at most ulp^2 / 4, so its error grows like sqrt(n) u.  The
relative error |s_n - exact_n| / exact_n is averaged over runs at checkpoints n; the slope
is the least-squares fit of log10(mean error) on log10(n) over n = 10 .. n_stop.

Random bits: run j at step t uses word j * n_stop + t of stream (seed, offset = 16 + format
index), passed as rand=; r_k come from torch.Generator seeded with ``seed``.
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
from ..hardware import ulp as grid_spacing
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

FORMATS = ("fp16", "bf16")
MODES = ("rne", "sr")
CHECKPOINTS_PER_DECADE = 8
STREAM_OFFSET = 16
PAST_GRID = 9 / 16  # where each input puts the rne sum between two grid points (in ulps)


def checkpoints(n_max: int) -> list[int]:
    """n = 10, 10**(1 + 1/8), ..., n_max (rounded to integers, distinct)."""
    decades = math.log10(n_max) - 1
    count = round(decades * CHECKPOINTS_PER_DECADE) + 1
    points = np.unique(np.round(np.logspace(1, math.log10(n_max), count)).astype(int))
    return [int(p) for p in points]


def fit_slope(ns: list[int], errors: list[float]) -> float:
    """Least-squares slope of log10(error) against log10(n)."""
    slope, _ = np.polyfit(np.log10(ns), np.log10(errors), 1)
    return float(slope)


def adversarial_rne(fmt: str, raw: torch.Tensor, progress: ProgressLike) -> torch.Tensor:
    """Build the inputs (runs, n) while summing them under rne; stop where the sum of every
    run reaches 2**(p-1).  ``raw``: the uniform r_k (runs, n_max); ``fmt``: the format of
    the sum.  Returns the inputs (float64, each an fp32 value), trimmed."""
    limit = 2.0 ** (find_format(fmt).precision - 1)
    runs, n_max = raw.shape
    inputs = torch.empty(runs, n_max, dtype=torch.float64)
    inputs[:, 0] = rounding.round(raw[:, 0], fmt, "rne")
    s = inputs[:, 0].clone()
    n_stop = n_max
    for t in progress.track(range(1, n_max), f"summation {fmt} inputs", n_max - 1):
        spacing = grid_spacing(s, fmt)
        inputs[:, t] = spacing * (torch.floor(raw[:, t] / spacing) + PAST_GRID)
        s = rounding.round(s + inputs[:, t], fmt, "rne")
        if bool((s >= limit).any()):
            n_stop = t  # steps 1..t keep every run below the limit
            break
    assert bool((inputs[:, :n_stop].float().double() == inputs[:, :n_stop]).all())
    return inputs[:, :n_stop]


def partial_sums(
    inputs: torch.Tensor, fmt: str, mode: str, words: torch.Tensor, points: list[int]
) -> torch.Tensor:
    """s at each checkpoint (runs, len(points)), every step rounding the exact sum once:
    the ``inputs`` (runs, n) summed in ``fmt`` by ``mode``, SR step t of run j taking
    ``words[j, t]``."""
    s = torch.zeros(inputs.shape[0], dtype=torch.float64)
    taken: list[torch.Tensor] = []
    columns = inputs.t().contiguous()
    for t in range(points[-1]):
        if mode == "rne":
            s = rounding.round(s + columns[t], fmt, "rne")
        else:
            s = rounding.round(s + columns[t], fmt, "sr", rand=words[:, t])
        if t + 1 == points[len(taken)]:
            taken.append(s)
    return torch.stack(taken, 1)


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    runs = 64 if quick else 1024
    generator = torch.Generator().manual_seed(seed)
    key: dict[str, float | int | str | bool] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    all_points: dict[str, list[int]] = {}
    rows = []
    for index, fmt in enumerate(FORMATS):
        n_max = 2 ** (find_format(fmt).precision + 1)  # more than the limit takes
        raw = 0.5 + 0.5 * torch.rand(runs, n_max, generator=generator, dtype=torch.float64)
        inputs = adversarial_rne(fmt, raw.float().double(), progress)
        n_stop = inputs.shape[1]
        points = checkpoints(n_stop)
        all_points[fmt] = points
        exact = inputs.cumsum(1)[:, [p - 1 for p in points]]
        words = streams.random_words_like(torch.empty(runs, n_stop), seed, STREAM_OFFSET + index)
        u = find_format(fmt).eps / 2
        for mode in progress.track(MODES, f"summation {fmt}", len(MODES)):
            computed = partial_sums(inputs, fmt, mode, words, points)
            relative = ((computed - exact).abs() / exact).mean(0)
            errors[fmt, mode] = [float(e) for e in relative]
        for mode in MODES:
            slope = fit_slope(points, errors[fmt, mode])
            ratios = [e / (n * u) for e, n in zip(errors[fmt, mode], points, strict=True)]
            root_ratios = [
                e / (math.sqrt(n) * u) for e, n in zip(errors[fmt, mode], points, strict=True)
            ]
            key[f"{fmt}_{mode}_slope"] = slope
            key[f"{fmt}_{mode}_error_at_n_stop"] = errors[fmt, mode][-1]
            key[f"{fmt}_{mode}_min_error_over_nu"] = min(ratios)
            key[f"{fmt}_{mode}_max_error_over_nu"] = max(ratios)
            key[f"{fmt}_{mode}_max_error_over_sqrt_nu"] = max(root_ratios)
            rows.append(
                [
                    f"{fmt} {mode}",
                    str(n_stop),
                    f"{slope:.3f}",
                    f"{min(ratios):.3f} .. {max(ratios):.3f}",
                    f"{min(root_ratios):.3f} .. {max(root_ratios):.3f}",
                    f"{errors[fmt, mode][-1]:.2e}",
                ]
            )
        key[f"{fmt}_unit_roundoff"] = u
        key[f"{fmt}_n_stop"] = n_stop
    key["runs"] = runs
    table = Table(
        f"Relative error of recursive summation, inputs adversarial for rne (mean of {runs} runs)",
        [
            "accumulator",
            "n_stop",
            "fitted slope",
            "error / (n u)",
            "error / (sqrt(n) u)",
            "error at n_stop",
        ],
        rows,
        [
            "slope: least squares of log10(mean relative error) on log10(n) over checkpoints "
            "from 10 to n_stop (the rne sum reaches 2^(p-1) there); n u predicts 1, "
            "sqrt(n) u 0.5. Ranges are over the checkpoints.",
        ],
    )
    figure = _plot(all_points, errors, out)
    return Experiment(
        name="summation",
        title="Error growth of recursive summation",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "runs": runs},
    )


def _plot(points: dict[str, list[int]], errors, out: Path) -> Path:
    figure, axes = new_figure()
    for index, fmt in enumerate(FORMATS):
        color = f"C{index}"
        n = np.array(points[fmt], dtype=float)
        u = find_format(fmt).eps / 2
        for mode, style in (("rne", "--o"), ("sr", "-s")):
            axes.plot(n, errors[fmt, mode], style, color=color, markersize=3, label=f"{fmt} {mode}")
        axes.plot(n, n * u, ":", color=color, linewidth=0.8, label=f"n u ({fmt})")
        axes.plot(n, np.sqrt(n) * u, "-.", color=color, linewidth=0.8, label=f"sqrt(n) u ({fmt})")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("n")
    axes.set_ylabel("relative error")
    axes.set_title("Recursive summation, inputs adversarial for round-to-nearest")
    axes.legend(fontsize=7, ncol=2)
    return save_figure(figure, out, "summation")
