"""Where SR and the RHT pay in quantized training: least-squares sweeps with error bars.

The problem.  Teacher-student least squares: X (n, d) standard normal, a teacher T (m, d)
with N(0, 1/d) entries, labels ``Y = X T^T + noise E``; loss ``L(W) = ||X W^T - Y||_F^2 /
(2 n)``, reported as the excess ``L(W) - L(W*)`` over the least-squares solution W*
(float64).  SGD from W = 0: a batch of B distinct rows (all n rows, in order, for the full
batch), ``dy = (X_B W^T - Y_B) / B``, ``W -= lr_t Q(dy)^T X_B``.  Only wgrad's dy is
rounded (the hook is built here from `stochround.blocks.fake_quantize`, the layer is
untouched): fp32 (not at all), bf16 (round to nearest), or NVFP4 along the tokens (the
wgrad GEMM's contraction axis: 16-element blocks, e4m3 block scales, fp32 tensor scale)
with round to nearest (RN) or stochastic rounding (SR), as `nvfp4()` rounds dy.  Why dy
alone: the whole recipe also rounds x (and W) to nearest, a fixed perturbation of the
data that no rounding of dy can undo; rounding dy alone isolates the question SR answers.
The weights stay fp32.  Every row: ``seeds`` seeds (the data, the batches and SR's bits
from seed ``seed + i``), mean ± std (ddof 1); two rows whose seed-paired difference has a
mean smaller than its std are reported as "none".

1. Noise axis.  Batch sizes up to n; the learning rate by one rule, ``1 / (1 +
   sqrt(d / B))^2`` (the inverse of the largest eigenvalue of a Gaussian batch's
   ``X_B^T X_B / B``), a cosine to 0 over ``steps`` steps.  The batch's sampling noise has
   variance proportional to ``1/B - 1/n``: zero at the full batch, where only rounding is
   left.

2. Horizon axis.  The same problem with the learning rate as a cosine to 5% of its peak
   over half the run, then 5% for the second half (training past the decay), at a small
   batch and the full batch.  Chmiel et al.'s ratio ``||G||_F / ||N||_F`` (G = dy^T X_B of
   the unrounded operands, N the rounded GEMM's difference from it) at every logging step,
   with their sqrt(3) line.

3. RHT axis.  Outliers of x (`regime_lsq.Outliers`): its first ``count`` channels (of
   d) times ``scale`` at one token in ``every``.  Outlier channels (every = 1, as in LLM
   activations: a column large for every token) and token outliers (every > 1, as LLMs'
   massive activations: a few tokens huge in a few channels).  The wgrad GEMM as
   `nvfp4()` computes it: x RN, dy RN or SR, both NVFP4 along the tokens (wgrad = dy^T x
   contracts over them), after the same 16-point RHT along the tokens with bf16 rotation,
   or no RHT.  An outlier channel is a column of x: its 16-token blocks are all large, one
   block scale each, and the RHT mixes 16 tokens of that one channel, never two channels.
   A token outlier (every >= 16) is one element that sets its block's scale, the other 15
   small beside it; the RHT spreads it over the block as 16 values of magnitude ``scale
   |x| / 4``, the others' values riding on them.  Full-batch training with both operands
   so rounded, ``rht_steps`` steps (a cosine to 0), the step preconditioned by each
   channel's mean square (`regime_lsq.channel_scale`, standing in for Adam's per-weight
   scaling: plain gradient descent's stable step would be 1 / scale^2 and the other
   channels would not move), from ``1 / lambda_max`` of the normalized data.  Reported:
   the wgrad error ``||Q(dy)^T Q(x) - dy^T x||_F / ||dy^T x||_F`` (the exact product of
   the same operands), at every logging step of each run, averaged; and the final excess
   loss, with fp32's beside it.

4. Closed form.  With RN, dy's rounding error at W* is a deterministic ``e*`` (``n Q(r*/n)
   - r*``, r* the residual at W*).  Treating rounding as locally mean-preserving (a small
   move of W flips roundings in proportion), full-batch GD stops where ``X^T (r* + X D^T +
   e*) = 0``: ``X D^T = -P_X e*`` (P_X the projection on X's columns), so the stall's
   excess loss is ``||P_X e*||_F^2 / (2 n)``; for errors uncorrelated with X of mean square
   sigma^2 this is ``d m sigma^2 / (2 n)``.  Predicted (both, from one rounding of r*, no
   training) against the measured final excess of full-batch RN training, over the label
   noise; the same for bf16.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .lm_summary import verdict
from .regime_lsq import (
    GRADIENTS,
    NO_OUTLIERS,
    RHT_SIZE,
    WGRADS,
    Curve,
    Outliers,
    Problem,
    Training,
    batch_lr,
    least_squares,
    preconditioned_lr,
    predicted_stall,
    predicted_stall_iid,
    rounding_error,
    train,
)
from .regime_plots import mean_std, plot_closed_form, plot_horizon, plot_noise, plot_rht
from .report import Experiment, KeyNumber, ProgressLike, Table

SQRT3 = math.sqrt(3.0)


@dataclass(frozen=True)
class Sizes:
    """The experiment's sizes (`QUICK`, `FULL`)."""

    n: int
    d: int
    m: int
    noise: float
    steps: int
    batches: tuple[int, ...]
    seeds: int
    noises: tuple[float, ...]
    horizon_steps: int
    horizon_batch: int
    log_every: int
    outliers: tuple[Outliers, ...]
    rht_steps: int


QUICK = Sizes(
    n=64, d=8, m=4, noise=0.5, steps=40, batches=(16, 64), seeds=3, noises=(0.5,),
    horizon_steps=40, horizon_batch=16, log_every=10,
    outliers=(NO_OUTLIERS, Outliers(1, 30.0), Outliers(1, 30.0, 16)), rht_steps=60,
)  # fmt: skip
FULL = Sizes(
    n=512, d=32, m=16, noise=0.5, steps=300, batches=(16, 32, 64, 128, 256, 512), seeds=3,
    noises=(0.125, 0.25, 0.5, 1.0, 2.0), horizon_steps=400, horizon_batch=32, log_every=5,
    outliers=(NO_OUTLIERS, Outliers(4, 100.0), Outliers(4, 10.0, 64), Outliers(4, 100.0, 64),
              Outliers(4, 1000.0, 64), Outliers(4, 100.0, 256)),
    rht_steps=900,
)  # fmt: skip


def seeds_of(seed: int, count: int) -> list[int]:
    """``count`` seeds from ``seed`` (mod 2**63, torch.Generator's range kept simple)."""
    return [(seed + i) % 2**63 for i in range(count)]


def pm(values: list[float]) -> str:
    """``mean ± std`` in 3 significant digits."""
    mean, std = mean_std(values)
    return f"{mean:.3g} ± {std:.2g}"


def noise_axis(
    sizes: Sizes, seeds: list[int], problems: dict[int, Problem], progress: ProgressLike
) -> dict[tuple[int, str], list[float]]:
    """The final excess loss of every (batch, gradient) over the seeds."""
    finals: dict[tuple[int, str], list[float]] = {}
    cases = [(b, g) for b in sizes.batches for g in GRADIENTS]
    for batch, gradient in progress.track(cases, "regime: noise axis", len(cases)):
        run = Training(sizes.steps, batch, batch_lr(batch, sizes.d), gradient)
        finals[batch, gradient] = [train(problems[s], run, s).excess[-1] for s in seeds]
    return finals


def noise_table(sizes: Sizes, finals: dict[tuple[int, str], list[float]]) -> Table:
    rows = []
    for batch in sizes.batches:
        cells = [pm(finals[batch, g]) for g in GRADIENTS]
        rn = finals[batch, "nvfp4_rn"]
        differences = [a - b for a, b in zip(rn, finals[batch, "nvfp4_sr"], strict=True)]
        rows.append([str(batch), f"{batch_lr(batch, sizes.d):.3f}", *cells, verdict(differences)])
    return Table(
        f"Noise axis: final excess loss by batch size (n = {sizes.n}, d = {sizes.d}, m = "
        f"{sizes.m}, {sizes.steps} steps)",
        ["batch", "peak lr", *GRADIENTS, "RN - SR"],
        rows,
        [
            "excess loss L(W) - L(W*), mean ± std over seeds; only wgrad's dy rounded; "
            "RN - SR: the seed-paired difference (none: |mean| < std).",
        ],
    )


def horizon_axis(
    sizes: Sizes, seeds: list[int], problems: dict[int, Problem], progress: ProgressLike
) -> dict[tuple[int, str], list]:
    """The curves of every (batch, gradient) of the horizon axis over the seeds."""
    curves: dict[tuple[int, str], list] = {}
    cases = [(b, g) for b in (sizes.horizon_batch, sizes.n) for g in ("fp32", *GRADIENTS[2:])]
    for batch, gradient in progress.track(cases, "regime: horizon axis", len(cases)):
        run = Training(sizes.horizon_steps, batch, batch_lr(batch, sizes.d), gradient, tail=0.05)
        curves[batch, gradient] = [train(problems[s], run, s, sizes.log_every) for s in seeds]
    return curves


def first_below(steps: list[int], ratios: list[float]) -> int | None:
    """The first logging step whose ratio is below sqrt(3), or None."""
    return next((s for s, r in zip(steps, ratios, strict=True) if r < SQRT3), None)


def horizon_table(sizes: Sizes, curves: dict[tuple[int, str], list]) -> Table:
    rows = []
    for (batch, gradient), runs in curves.items():
        ratio_text = first_text = "-"
        if runs[0].ratio:
            ratio_text = pm([run.ratio[-1] for run in runs])
            firsts = [first_below(run.steps, run.ratio) for run in runs]
            first_text = ", ".join("never" if f is None else str(f) for f in firsts)
        rows.append(
            [str(batch), gradient, pm([run.excess[-1] for run in runs]), ratio_text, first_text]
        )
    return Table(
        f"Horizon axis: {sizes.horizon_steps} steps, the second half at 5% of the peak lr",
        ["batch", "gradient", "final excess loss", "ratio at the end", "first step < √3"],
        rows,
        ["ratio = ||G||_F / ||N||_F of the wgrad GEMM (one layer), logged every "
         f"{sizes.log_every} steps; first logging step below √3 per seed."],
    )  # fmt: skip


Wgrad = tuple[str, int | None]  # (dy's rounding, RHT size or None), `WGRADS`


def rht_axis(
    sizes: Sizes, seeds: list[int], progress: ProgressLike
) -> tuple[dict[tuple[Outliers, Wgrad], list[Curve]], dict[Outliers, list[float]]]:
    """The curves of every (outliers, wgrad) over the seeds, and fp32's final excess per
    outliers (module docstring, 3.)."""
    curves: dict[tuple[Outliers, Wgrad], list[Curve]] = {}
    fp32: dict[Outliers, list[float]] = {}
    for outliers in progress.track(sizes.outliers, "regime: RHT axis", len(sizes.outliers)):
        fp32[outliers] = []
        for key in WGRADS:
            curves[outliers, key] = []
        for seed in seeds:
            problem = least_squares(sizes.n, sizes.d, sizes.m, sizes.noise, seed, outliers)
            lr = preconditioned_lr(problem.x)
            run = Training(sizes.rht_steps, sizes.n, lr, "fp32", precondition=True)
            fp32[outliers].append(train(problem, run, seed).excess[-1])
            for gradient, rht in WGRADS:
                run = Training(sizes.rht_steps, sizes.n, lr, gradient, rht, True, precondition=True)
                curves[outliers, (gradient, rht)].append(train(problem, run, seed, sizes.log_every))
    return curves, fp32


def mean_error(curve: Curve) -> float:
    """The wgrad error ``||N|| / ||G||`` (the inverse of the logged ratio) averaged over a
    run's logging steps."""
    return sum(1.0 / r for r in curve.ratio) / len(curve.ratio)


def rht_cells(on: list[float], off: list[float]) -> list[str]:
    """no RHT, RHT-16, and their seed-paired verdict."""
    return [pm(off), pm(on), verdict([a - b for a, b in zip(on, off, strict=True)])]


def rht_tables(
    sizes: Sizes,
    curves: dict[tuple[Outliers, Wgrad], list[Curve]],
    fp32: dict[Outliers, list[float]],
) -> list[Table]:
    def of(outliers: Outliers, gradient: str, rht: int | None, what: str) -> list[float]:
        runs = curves[outliers, (gradient, rht)]
        return [mean_error(c) if what == "error" else c.excess[-1] for c in runs]

    tables = []
    for what in ("error", "loss"):
        rows = []
        for outliers in sizes.outliers:
            row = [outliers.label] + ([pm(fp32[outliers])] if what == "loss" else [])
            for gradient in ("nvfp4_rn", "nvfp4_sr"):
                off = of(outliers, gradient, None, what)
                row += rht_cells(of(outliers, gradient, RHT_SIZE, what), off)
            rows.append(row)
        rht_columns = ["dy RN, no RHT", "dy RN, RHT-16", "RHT - none",
                       "dy SR, no RHT", "dy SR, RHT-16", "RHT - none"]  # fmt: skip
        if what == "error":
            title = "RHT axis: wgrad error along training, averaged"
            columns = ["outliers", *rht_columns]
            note = (f"||Q(dy)^T Q(x) - dy^T x||_F / ||dy^T x||_F every {sizes.log_every} steps"
                    " of each run, x RN, averaged; mean ± std over seeds.")  # fmt: skip
        else:
            title = "RHT axis: final excess loss, wgrad as nvfp4() (x RN)"
            columns = ["outliers", "fp32", *rht_columns]
            note = (f"{sizes.rht_steps} full-batch steps, preconditioned by each channel's "
                    "mean square, cosine to 0; mean ± std over seeds.")  # fmt: skip
        tables.append(
            Table(
                f"{title} (n = {sizes.n}, d = {sizes.d}, m = {sizes.m}; outliers: channels x "
                "scale, at 1 token in every (every token if not given))",
                columns,
                rows,
                [note, "RHT - none: the seed-paired difference (none: |mean| < std)."],
            )
        )
    return tables


def closed_form(
    sizes: Sizes, seeds: list[int], progress: ProgressLike
) -> dict[tuple[float, str], tuple[list[float], list[float], list[float]]]:
    """(predicted by projection, predicted by the i.i.d. closed form, measured) per
    (label noise, gradient) over the seeds."""
    found: dict[tuple[float, str], tuple[list[float], list[float], list[float]]] = {}
    cases = [(v, g) for v in sizes.noises for g in ("nvfp4_rn", "bf16")]
    for noise, gradient in progress.track(cases, "regime: closed form", len(cases)):
        projected, iid, measured = [], [], []
        for seed in seeds:
            problem = least_squares(sizes.n, sizes.d, sizes.m, noise, seed)
            error = rounding_error(problem, gradient)
            projected.append(predicted_stall(problem.x, error))
            ms = float(error.square().mean())
            iid.append(predicted_stall_iid(sizes.n, sizes.d, sizes.m, ms))
            run = Training(sizes.steps, sizes.n, batch_lr(sizes.n, sizes.d), gradient)
            measured.append(train(problem, run, seed).excess[-1])
        found[noise, gradient] = (projected, iid, measured)
    return found


def closed_table(
    found: dict[tuple[float, str], tuple[list[float], list[float], list[float]]],
) -> Table:
    rows = []
    for (noise, gradient), (projected, iid, measured) in found.items():
        ratio = [m / p for m, p in zip(measured, projected, strict=True)]
        rows.append([gradient, f"{noise:g}", pm(iid), pm(projected), pm(measured), pm(ratio)])
    return Table(
        "Closed form: the RN stall's excess loss, predicted and measured (full batch)",
        ["gradient", "label noise", "d m σ² / 2n", "||P_X e*||² / 2n", "measured",
         "measured / predicted"],
        rows,
        ["e* = the rounding error of dy at W*, σ² its mean square; measured: the final "
         "excess of full-batch training with a cosine to 0; mean ± std over seeds."],
    )  # fmt: skip


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    """Run the four axes at `QUICK` or `FULL` sizes (module docstring), the figures to
    ``out``."""
    started = time.perf_counter()
    sizes = QUICK if quick else FULL
    seeds = seeds_of(seed, sizes.seeds)
    problems = {s: least_squares(sizes.n, sizes.d, sizes.m, sizes.noise, s) for s in seeds}
    finals = noise_axis(sizes, seeds, problems, progress)
    curves = horizon_axis(sizes, seeds, problems, progress)
    rht_curves, rht_fp32 = rht_axis(sizes, seeds, progress)
    found = closed_form(sizes, seeds, progress)
    tables = [noise_table(sizes, finals), horizon_table(sizes, curves)]
    tables += rht_tables(sizes, rht_curves, rht_fp32)
    tables.append(closed_table(found))
    key: dict[str, KeyNumber] = {"seeds": sizes.seeds}
    full = sizes.n
    for gradient in GRADIENTS:
        mean, std = mean_std(finals[full, gradient])
        key[f"full_batch_{gradient}_excess_mean"] = mean
        key[f"full_batch_{gradient}_excess_std"] = std
    rn_sr = [a - b for a, b in zip(finals[full, "nvfp4_rn"], finals[full, "nvfp4_sr"], strict=True)]
    key["full_batch_rn_vs_sr"] = verdict(rn_sr)
    projected, _, measured = found[sizes.noise, "nvfp4_rn"]
    key["closed_form_predicted_mean"] = mean_std(projected)[0]
    key["closed_form_measured_mean"] = mean_std(measured)[0]
    figures = [
        plot_noise(sizes.batches, finals, out),
        plot_horizon(curves, SQRT3, out),
        plot_rht(
            [o.label for o in sizes.outliers],
            {(o.label, key): runs for (o, key), runs in rht_curves.items()},
            mean_error,
            out,
        ),
        plot_closed_form(found, out),
    ]
    settings: dict[str, KeyNumber] = {"quick": quick, "seed": seed}
    settings.update({k: str(v) for k, v in asdict(sizes).items()})
    settings["outliers"] = "; ".join(o.label for o in sizes.outliers)
    return Experiment(
        name="recipes-regime",
        title="Where SR and the RHT pay: least-squares sweeps with error bars",
        tables=tables,
        figures=figures,
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings=settings,
    )


__all__ = ["FULL", "QUICK", "Sizes", "closed_form", "noise_axis", "run"]
