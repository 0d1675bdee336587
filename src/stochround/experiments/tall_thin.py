"""SR implicitly regularizes tall-and-thin matrices (Dexter, Boutsikas, Ma, Ipsen, Drineas 2024).

A (m x n, m >> n) is rank deficient; we round it to bf16, fp16 and e4m3fn and compute the
smallest singular value of the rounded matrix (torch.linalg.svdvals in float64).  SR
rounds each entry independently and without bias, so SR(A) = A + E with E's entries
independent, zero mean, of variance Var(E_ij) = (a_ij - rd(a_ij)) (ru(a_ij) - a_ij).  For a
unit null vector v of A, (A + E) v = E v, so sigma_min(SR(A)) <= |E v|, and E|E v|^2 =
sum_ij v_j^2 Var(E_ij): a sum over m rows, so sigma_min grows like sqrt(m) u |a| (u the unit
roundoff); since m >> n, E v is nearly orthogonal to A's range and sigma_min stays close to
|E v| (its square is smaller by about a fraction n / m).  The prediction shown is
sqrt(sum_ij v_j^2 Var(E_ij)), computed exactly from A.

Two matrices.  "duplicated column": n - 1 standard normal columns and a last column equal
to the first (a repeated feature).  rne maps equal values to equal values, so rne(A) keeps
the two equal columns and stays exactly rank deficient (sigma_min at float64's own level,
~1e-15), in every format; SR rounds the two copies independently, v = (e_1 - e_n) / sqrt(2)
and the prediction is sqrt(sum_i Var(E_i1)).  "low rank": A = G H with G (m x (n - 1)) and
H ((n - 1) x n) standard normal (scaled by 1 / sqrt(n - 1)), rank n - 1 in float64 and
nearly so in fp32.  There rne's rounding errors, though deterministic, look like
independent noise of variance ~ulp^2 / 12 (SR's averages E[nu (1 - nu)] ulp^2 = ulp^2 / 6), so
rne lifts sigma_min to about the prediction / sqrt(2), the same sqrt(m) scale: the
regularization is SR's guarantee, rne's only by accident of the data.

Random bits: SR seed k of format f rounds with the words of stream (seed, offset = 128 + f)
(duplicated column) or 136 + f (low rank) or 144 + f (the sweep over m, on the first m rows
of the largest matrix) at indices k * m * n .. (k + 1) * m * n - 1, passed as rand=; the
matrices come from torch.Generator seeded with ``seed`` (the sweep's with
``(seed + 1) mod 2**64``, so that every seed in [0, 2**64) works).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

FORMATS = ("bf16", "fp16", "e4m3fn")
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "e4m3fn": 2.0**-4}
MATRICES = ("duplicated column", "low rank")
STREAM_OFFSET = {"duplicated column": 128, "low rank": 136, "sweep": 144}
PLOT_FLOOR = 1e-16  # rne's exact zeros and float64-level values, drawn on the log axis


def duplicated_column(rows: int, columns: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 (rows x columns): standard normal columns, the last a copy of the first."""
    a = torch.randn(rows, columns - 1, generator=generator, dtype=torch.float64).float()
    return torch.cat([a, a[:, :1]], dim=1)


def low_rank(rows: int, columns: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 G H / sqrt(columns - 1): rank columns - 1 in float64, entries ~ N(0, 1)."""
    g = torch.randn(rows, columns - 1, generator=generator, dtype=torch.float64)
    h = torch.randn(columns - 1, columns, generator=generator, dtype=torch.float64)
    return (g @ h / (columns - 1) ** 0.5).float()


def null_vector(a: torch.Tensor) -> torch.Tensor:
    """The right singular vector of A's smallest singular value (float64)."""
    return torch.linalg.svd(a.double(), full_matrices=False).Vh[-1]


def sr_variance(a: torch.Tensor, fmt: str) -> torch.Tensor:
    """Var of exact SR's error per entry, (a - rd(a)) (ru(a) - a), in float64."""
    x = a.double()
    down = rounding.round(a, fmt, "rd").double()
    up = rounding.round(a, fmt, "ru").double()
    return (x - down) * (up - x)


def predicted_sigma_min(a: torch.Tensor, fmt: str, v: torch.Tensor) -> float:
    """sqrt(E |E v|^2) = sqrt(sum_ij v_j^2 Var(E_ij)): the scale of sigma_min(SR(A))."""
    return float((sr_variance(a, fmt) * v**2).sum().sqrt())


def sigma_min(a: torch.Tensor) -> float:
    return float(torch.linalg.svdvals(a.double())[-1])


def sr_sigma_mins(a: torch.Tensor, fmt: str, words: torch.Tensor) -> torch.Tensor:
    """sigma_min of SR(A) for each seed's words (seeds, m, n); float64 (seeds,)."""
    rounded = rounding.round(a.expand(words.shape[0], *a.shape), fmt, "sr", rand=words)
    return torch.linalg.svdvals(rounded.double())[:, -1]


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    rows, columns, seeds = (1000, 20, 8) if quick else (10_000, 50, 32)
    sweep = (250, 500, 1000, 2000, 4000) if quick else (500, 1000, 2000, 4000, 8000, 16_000)
    generator = torch.Generator().manual_seed(seed)
    builders = {"duplicated column": duplicated_column, "low rank": low_rank}
    key: dict[str, float | int | str | bool] = {"rows": rows, "columns": columns, "seeds": seeds}
    table_rows: list[list[str]] = []
    for matrix in MATRICES:
        a = builders[matrix](rows, columns, generator)
        v = null_vector(a)
        name = matrix.replace(" ", "_")
        key[f"{name}_fp32"] = sigma_min(a)
        table_rows.append([matrix, "fp32", "-", f"{key[f'{name}_fp32']:.3e}", "-", "-", "-"])
        for index in progress.track(range(len(FORMATS)), f"tall-thin {matrix}", len(FORMATS)):
            fmt = FORMATS[index]
            predicted = predicted_sigma_min(a, fmt, v)
            crude = rows**0.5 * UNIT_ROUNDOFF[fmt] * float(a.double().pow(2).mean().sqrt())
            rne = sigma_min(rounding.round(a, fmt, "rne"))
            words = streams.random_words_like(
                torch.empty(seeds, rows, columns), seed, STREAM_OFFSET[matrix] + index
            )
            sr = sr_sigma_mins(a, fmt, words)
            mean, std = float(sr.mean()), float(sr.std())
            key |= {
                f"{name}_{fmt}_rne": rne,
                f"{name}_{fmt}_sr_mean": mean,
                f"{name}_{fmt}_sr_std": std,
                f"{name}_{fmt}_sr_min": float(sr.min()),
                f"{name}_{fmt}_predicted": predicted,
                f"{name}_{fmt}_sqrt_m_u_rms": crude,
            }
            for mode, value, spread in (("rne", rne, "-"), ("sr", mean, f"{std:.2e}")):
                table_rows.append(
                    [matrix, fmt, mode, f"{value:.3e}", spread, f"{predicted:.3e}", f"{crude:.3e}"]
                )
    table = Table(
        f"Smallest singular value of the rounded {rows} x {columns} matrix",
        [
            "matrix",
            "format",
            "mode",
            "sigma_min (SR: mean)",
            f"SR std ({seeds} seeds)",
            "predicted sqrt(E|Ev|^2)",
            "sqrt(m) u rms(a)",
        ],
        table_rows,
        [
            "predicted: the SR scale sqrt(sum_ij v_j^2 Var(E_ij)) for A's null vector v; "
            "sqrt(m) u rms(a) is the paper's order of magnitude (u: unit roundoff).",
            "fp32 row: A as stored before rounding (duplicated column: exactly singular).",
        ],
    )
    curves = _sweep(sweep, columns, seeds, seed, progress)
    for fmt in FORMATS:
        key[f"sweep_{fmt}_sr_over_predicted_min"] = min(
            s / p for s, p in zip(curves[f"{fmt} sr"], curves[f"{fmt} predicted"], strict=True)
        )
        key[f"sweep_{fmt}_rne_max"] = max(curves[f"{fmt} rne"])
    figure = _plot(sweep, curves, columns, out)
    return Experiment(
        name="tall-thin",
        title="Stochastic rounding regularizes tall-and-thin matrices",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "rows": rows, "columns": columns, "seeds": seeds},
    )


def _sweep(
    sweep: tuple[int, ...], columns: int, seeds: int, seed: int, progress: ProgressLike
) -> dict[str, list[float]]:
    """sigma_min vs m on the first m rows of one duplicated-column matrix, per format."""
    # modulo 2**64: torch.Generator takes seeds below 2**64 only, and the largest seed the
    # random streams take, 2**64 - 1, must work here too
    generator = torch.Generator().manual_seed((seed + 1) % 2**64)
    largest = duplicated_column(max(sweep), columns, generator)
    v = torch.zeros(columns, dtype=torch.float64)
    v[0], v[-1] = 0.5**0.5, -(0.5**0.5)
    curves: dict[str, list[float]] = {}
    for index in progress.track(range(len(FORMATS)), "tall-thin sweep", len(FORMATS)):
        fmt = FORMATS[index]
        words = streams.random_words_like(
            torch.empty(seeds, max(sweep), columns), seed, STREAM_OFFSET["sweep"] + index
        )
        for rows in sweep:
            a = largest[:rows]
            curves.setdefault(f"{fmt} rne", []).append(sigma_min(rounding.round(a, fmt, "rne")))
            sr = sr_sigma_mins(a, fmt, words[:, :rows].contiguous())
            curves.setdefault(f"{fmt} sr", []).append(float(sr.mean()))
            curves.setdefault(f"{fmt} predicted", []).append(predicted_sigma_min(a, fmt, v))
    return curves


def _plot(sweep: tuple[int, ...], curves: dict[str, list[float]], columns: int, out: Path):
    figure, axes = new_figure()
    for color, fmt in zip(("C0", "C1", "C2"), FORMATS, strict=True):
        axes.plot(sweep, curves[f"{fmt} sr"], color=color, marker="o", label=f"{fmt} sr")
        rne = [max(value, PLOT_FLOOR) for value in curves[f"{fmt} rne"]]
        axes.plot(sweep, rne, color=color, linestyle="--", marker="x", label=f"{fmt} rne")
        axes.plot(sweep, curves[f"{fmt} predicted"], color=color, linestyle=":", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(sweep, [str(rows) for rows in sweep])
    axes.minorticks_off()
    axes.set_xlabel("rows m")
    axes.set_ylabel("smallest singular value")
    axes.set_title(f"m x {columns}, last column = first: rne stays singular, SR does not")
    axes.legend(fontsize=8, ncol=2, title="dotted: predicted sqrt(E|Ev|^2)", title_fontsize=7)
    return save_figure(figure, out, "tall_thin")
