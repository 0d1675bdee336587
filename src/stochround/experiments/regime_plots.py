"""The recipes-regime experiment's figures, one per axis: the mean over seeds with a band
of ± one standard deviation."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .report import new_figure, save_figure

COLOURS = {"fp32": "C0", "bf16": "C1", "nvfp4_rn": "C3", "nvfp4_sr": "C2"}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (ddof 1; 0.0 for one value)."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def band(axes: Any, x: Sequence[float], runs: Sequence[Sequence[float]], **style: Any) -> None:
    """The mean over ``runs`` (one sequence per seed) as a line, ± std as a band."""
    array = np.asarray(runs, dtype=np.float64)
    mean = array.mean(axis=0)
    std = array.std(axis=0, ddof=1) if array.shape[0] > 1 else np.zeros_like(mean)
    axes.plot(x, mean, **style)
    axes.fill_between(
        x, np.maximum(mean - std, 1e-300), mean + std, alpha=0.2, color=style.get("color")
    )


def plot_noise(batches: Sequence[int], finals: dict, out: Path) -> Path:
    """Final excess loss against the batch size, per dy rounding (log-log)."""
    figure, axes = new_figure(width=6.4, height=4.4)
    for gradient, colour in COLOURS.items():
        runs = np.asarray([finals[b, gradient] for b in batches]).T  # (seeds, batches)
        band(axes, list(batches), runs, color=colour, marker="o", label=gradient)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("batch size (the last: full batch)")
    axes.set_ylabel("final excess loss L(W) - L(W*)")
    axes.set_title("Noise axis: only wgrad's dy rounded", fontsize=10)
    axes.legend(fontsize=8)
    return save_figure(figure, out, "regime_noise")


def plot_horizon(curves: dict, sqrt3: float, out: Path) -> Path:
    """Left: excess loss over training per (batch, rounding); right: the ratio with √3."""
    figure, (loss, ratio) = new_figure(width=12.0, height=4.6, columns=2)
    for (batch, gradient), runs in curves.items():
        style = {
            "color": COLOURS[gradient],
            "linestyle": "-" if batch == max(b for b, _ in curves) else "--",
        }
        label = f"{gradient}, batch {batch}"
        band(loss, runs[0].steps, [run.excess for run in runs], label=label, **style)
        if runs[0].ratio:
            finite = [[min(r, 1e6) for r in run.ratio] for run in runs]
            band(ratio, runs[0].steps, finite, label=label, **style)
    ratio.axhline(sqrt3, color="black", linestyle=":", label="√3")
    for axes in (loss, ratio):
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.legend(fontsize=7)
    loss.set_ylabel("excess loss")
    loss.set_title("Past the decay (second half at 5% of the peak lr)", fontsize=10)
    ratio.set_ylabel("||G|| / ||N||")
    ratio.set_title("Chmiel et al.'s ratio (wgrad of the one layer)", fontsize=10)
    return save_figure(figure, out, "regime_horizon")


def plot_rht(labels: Sequence[str], curves: dict, error_of: Callable, out: Path) -> Path:
    """Left: the wgrad error averaged along training (``error_of`` a run), right: the
    final excess loss, per outliers case (``labels``), dy RN or SR, RHT or none."""
    figure, (error, loss) = new_figure(width=12.0, height=4.4, columns=2)
    x = list(range(len(labels)))
    for gradient, colour in (("nvfp4_rn", "C3"), ("nvfp4_sr", "C2")):
        for size, line in ((None, "-"), (16, "--")):
            runs = [curves[label, (gradient, size)] for label in labels]
            style = {"color": colour, "linestyle": line, "marker": "o"}
            name = f"dy {gradient[6:].upper()}, {'RHT-16' if size else 'no RHT'}"
            band(error, x, np.asarray([[error_of(c) for c in r] for r in runs]).T,
                 label=name, **style)  # fmt: skip
            band(loss, x, np.asarray([[c.excess[-1] for c in r] for r in runs]).T,
                 label=name, **style)  # fmt: skip
    for axes in (error, loss):
        axes.set_xticks(x, list(labels), rotation=20, fontsize=8)
        axes.set_xlabel("outliers (channels x scale, at 1 token in every; else every token)")
        axes.legend(fontsize=8)
    loss.set_yscale("log")
    error.set_ylabel("||Q(dy)^T Q(x) - dy^T x|| / ||dy^T x||, mean over steps")
    loss.set_ylabel("final excess loss")
    error.set_title("RHT axis: NVFP4 wgrad error along training", fontsize=10)
    loss.set_title("RHT axis: full-batch training, x RN", fontsize=10)
    return save_figure(figure, out, "regime_rht")


def plot_closed_form(found: dict, out: Path) -> Path:
    """Measured stall against the projection prediction, with the identity line."""
    figure, axes = new_figure(width=5.6, height=4.8)
    low, high = math.inf, 0.0
    for gradient, colour in (("nvfp4_rn", "C3"), ("bf16", "C1")):
        keys = [k for k in found if k[1] == gradient]
        predicted = [mean_std(found[k][0]) for k in keys]
        measured = [mean_std(found[k][2]) for k in keys]
        axes.errorbar(
            [p for p, _ in predicted], [m for m, _ in measured],
            xerr=[s for _, s in predicted], yerr=[s for _, s in measured],
            fmt="o", color=colour, label=gradient,
        )  # fmt: skip
        values = [p for p, _ in predicted] + [m for m, _ in measured]
        low, high = min(low, *values), max(high, *values)
    axes.plot([low / 2, high * 2], [low / 2, high * 2], color="black", linestyle=":", label="y = x")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("predicted stall ||P_X e*||² / 2n")
    axes.set_ylabel("measured final excess loss")
    axes.set_title("Closed form: RN stall, predicted vs measured", fontsize=10)
    axes.legend(fontsize=8)
    return save_figure(figure, out, "regime_closed_form")


__all__ = ["band", "mean_std", "plot_closed_form", "plot_horizon", "plot_noise", "plot_rht"]
