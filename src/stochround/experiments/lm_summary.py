"""The language-model experiment's report: the final validation losses per row and the
paired comparisons (`summarize`), and the loss and ratio plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .lm_rows import COMPARISONS, row_by_key
from .lm_training import SQRT3, RunResult
from .report import KeyNumber, Table, new_figure, save_figure


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (ddof 1; NaN for one value)."""
    array = np.asarray(values, dtype=np.float64)
    std = float(array.std(ddof=1)) if array.size > 1 else math.nan
    return float(array.mean()), std


def verdict(differences: Sequence[float], unit: str = "") -> str:
    """ "none" if the mean of the paired ``differences`` is smaller in size than their
    standard deviation, else "lower" / "higher" with the mean; "n/a (1 seed)" for one."""
    mean, std = _mean_std(differences)
    if math.isnan(std):
        return "n/a (1 seed)"
    if abs(mean) < std:
        return "none"
    return f"{'lower' if mean < 0 else 'higher'} by {abs(mean):.3g}{unit}"


def _pm(mean: float, std: float, digits: int = 4, suffix: str = "") -> str:
    """``mean ± std`` (``mean`` alone where std is NaN)."""
    if math.isnan(std):
        return f"{mean:.{digits}f}{suffix}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}{suffix}"


def summarize(
    results: dict[str, list[RunResult]],
) -> tuple[list[Table], dict[str, KeyNumber]]:
    """The tables (final validation loss per row; the comparisons) and key numbers."""
    key: dict[str, KeyNumber] = {}
    base = results.get("bf16")
    rows: list[list[str]] = []
    for row_key, runs in results.items():
        finals = [run.final for run in runs]
        mean, std = _mean_std(finals)
        key[f"{row_key}_val_loss_mean"] = mean
        key[f"{row_key}_val_loss_std"] = 0.0 if math.isnan(std) else std
        key[f"{row_key}_seconds"] = float(np.mean([run.seconds for run in runs]))
        key[f"{row_key}_quantized_layers"] = runs[0].quantized_layers
        relative_text = versus_text = "-"
        if base is not None and row_key != "bf16":
            relative = [100 * (r.final / b.final - 1) for r, b in zip(runs, base, strict=True)]
            rel_mean, rel_std = _mean_std(relative)
            key[f"{row_key}_vs_bf16_pct_mean"] = rel_mean
            key[f"{row_key}_vs_bf16_pct_std"] = 0.0 if math.isnan(rel_std) else rel_std
            relative_text = _pm(rel_mean, rel_std, 2, " %")
            versus_text = verdict(relative, " %")
            key[f"{row_key}_vs_bf16"] = versus_text
        ratio_text = "-"
        if runs[0].ratio:
            firsts = [run.first_below() for run in runs]
            final_ratio = float(np.mean([run.ratio[-1] for run in runs]))
            key[f"{row_key}_ratio_first"] = float(np.mean([run.ratio[0] for run in runs]))
            key[f"{row_key}_ratio_final"] = final_ratio
            below = [f for f in firsts if f is not None]
            key[f"{row_key}_ratio_below_sqrt3_step"] = min(below) if below else -1
            crossed = ", ".join("never" if f is None else str(f) for f in firsts)
            ratio_text = f"{final_ratio:.3g}; {crossed}"
        rows.append(
            [
                row_by_key(row_key).label,
                _pm(mean, std),
                relative_text,
                versus_text,
                ratio_text,
                f"{key[f'{row_key}_seconds']:.1f}",
            ]
        )
    seeds = len(next(iter(results.values())))
    table = Table(
        f"Byte-level GPT on the standard library's source: final validation loss, {seeds} "
        f"seed{'s' if seeds > 1 else ''} per row",
        [
            "row",
            "val loss (nats/byte)",
            "vs bf16",
            "verdict vs bf16",
            "ratio at end; first step < √3",
            "s/run",
        ],
        rows,
        [
            "mean ± std over seeds; vs bf16: per-seed 100 (L / L_bf16 - 1); a mean smaller "
            "than its spread is reported as none.",
            "ratio = ||G||_F / ||N||_F of the quantized layers' weight gradients (the exact "
            "fp32 gradient over the quantization noise), mean over seeds at the last "
            "logging step; the first logging step below √3 per seed.",
        ],
    )
    comparison_rows = []
    for first, second, what in COMPARISONS:
        if first not in results or second not in results:
            continue
        differences = [
            a.final - b.final for a, b in zip(results[first], results[second], strict=True)
        ]
        mean, std = _mean_std(differences)
        text = verdict(differences)
        key[f"{first}_vs_{second}_diff_mean"] = mean
        key[f"{first}_vs_{second}"] = text
        comparison_rows.append(
            [what, f"{first} - {second}", _pm(mean, std), text],
        )
    comparisons = Table(
        "Paired comparisons of final validation loss",
        ["comparison", "rows", "difference (nats/byte)", "verdict"],
        comparison_rows,
        ["per-seed difference, mean ± std; |mean| < std is none."],
    )
    return [table, comparisons], key


def plot_curves(results: dict[str, list[RunResult]], out: Path) -> Path:
    """Validation loss over training, the mean over seeds per row (left), and each row's
    loss relative to bf16's, ``100 (L / L_bf16 - 1)`` per seed then the mean (right: the
    differences the left panel's scale hides)."""
    figure, (absolute, relative) = new_figure(width=12.0, height=4.8, columns=2)
    colours = _row_colours()
    baseline = results.get("bf16")
    for index, (row_key, runs) in enumerate(results.items()):
        # one colour a row in both panels (the right one has no bf16 line)
        style = {
            "linestyle": "-" if row_key in ("bf16", "nvfp4") else "--",
            "color": colours(index % colours.N),
        }
        label = row_by_key(row_key).label
        curve = np.mean([run.validation for run in runs], axis=0)
        absolute.plot(runs[0].steps, curve, label=label, **style)
        if baseline is None or row_key == "bf16":
            continue
        percent = [
            100 * (np.asarray(run.validation) / np.asarray(base.validation) - 1)
            for run, base in zip(runs, baseline, strict=True)
        ]
        relative.plot(runs[0].steps, np.mean(percent, axis=0), label=label, **style)
    absolute.set_xlabel("step")
    absolute.set_ylabel("validation loss (nats/byte)")
    absolute.set_title("Byte-level GPT under each recipe (mean over seeds)", fontsize=10)
    absolute.legend(fontsize=8)
    relative.axhline(0.0, color="black", linewidth=0.8)
    relative.set_xlabel("step")
    relative.set_ylabel("validation loss vs bf16 (%)")
    relative.set_title("Relative to bf16, same seeds (mean over seeds)", fontsize=10)
    relative.legend(fontsize=8)
    return save_figure(figure, out, "lm_loss")


def _row_colours():
    """matplotlib's 20 distinct colours (more rows than its default cycle's 10)."""
    import matplotlib

    return matplotlib.colormaps["tab20"]


def plot_ratio(results: dict[str, list[RunResult]], out: Path) -> Path:
    """The ratio ||G|| / ||N|| over training, the mean over seeds per quantized row (log
    scale), with the √3 line."""
    figure, axes = new_figure(width=7.5, height=4.5)
    for row_key, runs in results.items():
        if not runs[0].ratio:
            continue
        curve = np.mean([run.ratio for run in runs], axis=0)
        axes.plot(runs[0].steps, curve, label=row_by_key(row_key).label)
    axes.axhline(SQRT3, color="black", linestyle=":", label="√3")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("||G|| / ||N|| (gradient / quantization noise)")
    axes.set_title("Gradient norm over quantization noise (Chmiel et al.'s ratio)", fontsize=10)
    axes.legend(fontsize=8)
    return save_figure(figure, out, "lm_ratio")


__all__ = ["plot_curves", "plot_ratio", "summarize"]
