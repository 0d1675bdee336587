"""Gradient descent with low-precision parameters: rne stalls, SR converges (Xia et al.).

Least squares, loss(w) = ||A w - b||^2 / (2 m), A (m x d) standard normal, b = A w* + 0.01
noise, w* standard normal.  The parameters are stored in bf16 or in an 8-bit format
(e4m3fn); each step computes the gradient A^T (A w - b) / m in fp32 from the stored w and
stores ``w <- round(w - lr * grad)`` (the update formed in fp32) with rne or exact SR.
fp32 (no rounding of w) with the same steps is the reference.  Under rne a coordinate stops
moving once |lr * grad_i| < ulp(w_i) / 2, which happens at a distance of about
ulp / (2 lr lambda) from the minimum (lambda: a curvature of A^T A / m, in [0.56, 1.56]
here), so the loss plateaus; SR moves by lr * grad_i in expectation, so w converges to the
minimum up to a stationary noise of variance about ulp^2 / (8 lr lambda) per coordinate:
the loss excess of rne over SR's is about 2 / (lr lambda) as long as the stall distance
stays below |w*| (bf16), and smaller where rne barely moves from the start (8 bits).

Random bits: SR run j (of ``runs``, all stepping together) at step t draws the words of
stream (seed, offset = 64 + format index) at indices (t * runs + j) * d .. + d - 1, passed
as rand=; A, w* and the noise come from torch.Generator seeded with ``seed``.

Logistic regression on the same kind of design: X (m x d) standard normal, labels
y_i ~ Bernoulli(sigmoid(x_i . w*)) with w* = 0.5 * standard normal (not separable, so a
finite minimum exists, found by Newton's method in float64); loss(w) = mean_i
(log(1 + exp(x_i . w)) - y_i x_i . w), gradient X^T (sigmoid(X w) - y) / m in fp32, the
same stores, formats and modes, lr = 0.5 (the Hessian's eigenvalues lie in about
[0.07, 0.25], so fp32 converges to float64 accuracy within the quick run's 1500 steps).  The
loss at the optimum is ~0.5, so the table shows the excess loss(w) - loss(w_opt): rne
stalls at an excess set by the stall distance ulp / (2 lr lambda), SR's excess is its
stationary noise, which is below the least-squares estimate because a step much smaller
than an ulp moves w with variance ulp * |step| rather than ulp^2 / 4.  SR run j at step t
draws the words of stream (seed, offset = 80 + format index) at the same indices as above;
X, w* and the labels come from torch.Generator seeded with ``(seed + 1) mod 2**64`` (every
seed in [0, 2**64) works, the largest wrapping to 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, number, save_figure

FORMATS = ("bf16", "e4m3fn")
MODES = ("rne", "sr")
SAMPLES = 256
FEATURES = 16
LEARNING_RATE = 0.01
NOISE = 0.01
STREAM_OFFSET = 64
RUNS = 4
LOGISTIC_LEARNING_RATE = 0.5
LOGISTIC_WEIGHT_SCALE = 0.5
LOGISTIC_STREAM_OFFSET = 80
NEWTON_STEPS = 50


@dataclass
class Problem:
    """A minimization problem for GD: fp32 gradient of w (runs, d), float64 loss per run."""

    name: str
    gradient: Callable[[torch.Tensor], torch.Tensor]
    loss: Callable[[torch.Tensor], torch.Tensor]
    w_opt: torch.Tensor
    learning_rate: float


def problem(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, b, w_opt) in fp32; w_opt is the least-squares solution (computed in float64)."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(SAMPLES, FEATURES, generator=generator, dtype=torch.float64)
    w_true = torch.randn(FEATURES, generator=generator, dtype=torch.float64)
    b = a @ w_true + NOISE * torch.randn(SAMPLES, generator=generator, dtype=torch.float64)
    a32, b32 = a.float(), b.float()
    w_opt = torch.linalg.lstsq(a32.double(), b32.double()[:, None]).solution[:, 0]
    return a32, b32, w_opt


def losses(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """loss of each row of w (runs, d), in float64."""
    residual = w.double() @ a.double().t() - b.double()
    return (residual**2).sum(1) / (2 * a.shape[0])


def least_squares(seed: int) -> Problem:
    a, b, w_opt = problem(seed)
    return Problem(
        "least squares",
        lambda w: (w @ a.t() - b) @ a / a.shape[0],
        lambda w: losses(a, b, w),
        w_opt,
        LEARNING_RATE,
    )


def logistic_problem(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X, y, w_opt): X fp32 standard normal, y in {0, 1} fp32 drawn from a planted logistic
    model, w_opt the cross-entropy minimizer (Newton's method in float64)."""
    # modulo 2**64: torch.Generator takes seeds below 2**64 only, and the largest seed the
    # random streams take, 2**64 - 1, must work here too
    generator = torch.Generator().manual_seed((seed + 1) % 2**64)
    x = torch.randn(SAMPLES, FEATURES, generator=generator, dtype=torch.float64).float()
    w_true = LOGISTIC_WEIGHT_SCALE * torch.randn(FEATURES, generator=generator, dtype=torch.float64)
    uniform = torch.rand(SAMPLES, generator=generator, dtype=torch.float64)
    y = (uniform < torch.sigmoid(x.double() @ w_true)).float()
    xd, yd = x.double(), y.double()
    w = torch.zeros(FEATURES, dtype=torch.float64)
    for _ in range(NEWTON_STEPS):
        p = torch.sigmoid(xd @ w)
        hessian = (xd.t() * (p * (1 - p))) @ xd / SAMPLES
        w = w - torch.linalg.solve(hessian, xd.t() @ (p - yd) / SAMPLES)
    return x, y, w


def cross_entropy(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """mean_i log(1 + exp(z_i)) - y_i z_i, z = X w, for each row of w (runs, d), in float64."""
    z = w.double() @ x.double().t()
    return (torch.nn.functional.softplus(z) - y.double() * z).mean(1)


def logistic_regression(seed: int) -> Problem:
    x, y, w_opt = logistic_problem(seed)
    return Problem(
        "logistic regression",
        lambda w: (torch.sigmoid(w @ x.t()) - y) @ x / x.shape[0],
        lambda w: cross_entropy(x, y, w),
        w_opt,
        LOGISTIC_LEARNING_RATE,
    )


def descend(
    task: Problem,
    fmt: str | None,
    mode: str,
    steps: int,
    seed: int,
    offset: int,
    progress: ProgressLike,
    record_every: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run GD from w = 0: (final w (runs, d), losses (records, runs) at steps 0, every, ...).

    ``w`` is stored in ``fmt`` (None: fp32, unrounded) by ``mode`` ("rne" or "sr"; SR draws
    stream ``(seed, offset)``); a loss is recorded every ``record_every`` steps, and
    ``progress`` reports the loop.
    """
    runs = RUNS if mode == "sr" else 1
    w = torch.zeros(runs, FEATURES, dtype=torch.float32)
    recorded = [task.loss(w)]
    label = f"gd {task.name} {fmt or 'fp32'} {mode}"
    if mode == "sr":  # drawn up front: one Philox call instead of one per step
        words = streams.random_words_like(torch.empty(steps, runs, FEATURES), seed, offset)
    for t in progress.track(range(steps), label, steps):
        update = w - task.learning_rate * task.gradient(w)
        if fmt is None:
            w = update
        elif mode == "rne":
            w = rounding.round(update, fmt, "rne")
        else:
            w = rounding.round(update, fmt, "sr", rand=words[t])
        if (t + 1) % record_every == 0:
            recorded.append(task.loss(w))
    return w, torch.stack(recorded)


def _solve_all(
    task: Problem,
    prefix: str,
    offset: int,
    steps: int,
    seed: int,
    progress: ProgressLike,
    key: dict[str, float | int | str | bool],
) -> tuple[list[list[str]], dict[str, torch.Tensor], float]:
    """Run fp32 and every (format, mode); fill key (names prefixed) and return the table rows,
    the mean loss curves and the optimal loss."""
    record_every = steps // 100
    optimum = float(task.loss(task.w_opt[None])[0])
    key[f"{prefix}optimal_loss"] = optimum
    curves: dict[str, torch.Tensor] = {}
    _, fp32_curve = descend(task, None, "fp32", steps, seed, 0, progress, record_every)
    curves["fp32"] = fp32_curve[:, 0]
    fp32_final = float(fp32_curve[-1, 0])
    key[f"{prefix}fp32_final_loss"] = fp32_final
    key[f"{prefix}fp32_excess_loss"] = fp32_final - optimum
    rows = [[task.name, "fp32", "-", f"{fp32_final:.4e}", f"{fp32_final - optimum:.2e}", "-", "-"]]
    for index, fmt in enumerate(FORMATS):
        for mode in MODES:
            w, curve = descend(task, fmt, mode, steps, seed, offset + index, progress, record_every)
            final = curve[-1]
            mean = float(final.mean())
            excess = final - optimum
            distance = float((w.double() - task.w_opt).norm(dim=1).mean())
            curves[f"{fmt} {mode}"] = curve.mean(1)
            key[f"{prefix}{fmt}_{mode}_final_loss"] = mean
            key[f"{prefix}{fmt}_{mode}_excess_loss"] = float(excess.mean())
            key[f"{prefix}{fmt}_{mode}_distance_to_optimum"] = distance
            spread = f"{float(excess.min()):.2e} .. {float(excess.max()):.2e}"
            rows.append(
                [
                    task.name,
                    fmt,
                    mode,
                    f"{mean:.4e}",
                    f"{float(excess.mean()):.2e}",
                    spread if mode == "sr" else "-",
                    f"{distance:.3e}",
                ]
            )
        if prefix:  # the ratio of excess losses: the losses themselves differ little
            ratio = number(key, f"{prefix}{fmt}_rne_excess_loss") / number(
                key, f"{prefix}{fmt}_sr_excess_loss"
            )
        else:  # least squares keeps its historical key: the ratio of the losses
            ratio = number(key, f"{fmt}_rne_final_loss") / number(key, f"{fmt}_sr_final_loss")
        key[f"{prefix}{fmt}_rne_over_sr"] = ratio
    return rows, curves, optimum


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    steps = 1500 if quick else 10_000
    record_every = steps // 100
    key: dict[str, float | int | str | bool] = {"steps": steps}
    tasks = (
        (least_squares(seed), "", STREAM_OFFSET),
        (logistic_regression(seed), "logistic_", LOGISTIC_STREAM_OFFSET),
    )
    rows: list[list[str]] = []
    panels: list[tuple[str, dict[str, torch.Tensor], float]] = []
    for task, prefix, offset in tasks:
        task_rows, curves, optimum = _solve_all(task, prefix, offset, steps, seed, progress, key)
        rows += task_rows
        panels.append((task.name, curves, optimum))
    optimum, logistic_optimum = number(key, "optimal_loss"), number(key, "logistic_optimal_loss")
    table = Table(
        f"Gradient descent, {steps} steps (optimal loss: least squares {optimum:.3e}, "
        f"logistic {logistic_optimum:.4e})",
        [
            "problem",
            "parameters",
            "mode",
            "final loss",
            "excess over optimum",
            f"SR excess min .. max ({RUNS} runs)",
            "|w - w_opt|",
        ],
        rows,
        [
            f"Design: {SAMPLES} x {FEATURES} standard normal, w_0 = 0; lr = {LEARNING_RATE} "
            f"(least squares), {LOGISTIC_LEARNING_RATE} (logistic); SR rows are means over "
            "the runs.",
        ],
    )
    figure = _plot(panels, record_every, out)
    return Experiment(
        name="gradient-descent",
        title="Gradient descent with parameters stored in bf16 and 8 bits",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={
            "quick": quick,
            "seed": seed,
            "steps": steps,
            "lr": LEARNING_RATE,
            "logistic_lr": LOGISTIC_LEARNING_RATE,
        },
    )


def _plot(panels: list[tuple[str, dict[str, torch.Tensor], float]], every: int, out: Path) -> Path:
    """One panel per problem: least squares shows the loss, logistic regression its excess
    over the optimum (the loss itself levels off near 0.5 for every run)."""
    figure, _ = new_figure(width=11.5, height=4.2)
    figure.clf()  # new_figure's single axes replaced by one per panel
    axes_row = figure.subplots(1, len(panels))
    styles = {"fp32": ("k", "-"), "bf16 rne": ("C0", "--"), "bf16 sr": ("C0", "-")}
    styles |= {"e4m3fn rne": ("C1", "--"), "e4m3fn sr": ("C1", "-")}
    for axes, (name, curves, optimum) in zip(axes_row, panels, strict=True):
        excess = name != "least squares"
        for label, curve in curves.items():
            color, style = styles.get(label, (None, "-"))
            steps = np.arange(curve.numel()) * every
            values = (curve - optimum).clamp(min=1e-16) if excess else curve
            axes.plot(steps, values.numpy(), color=color, linestyle=style, label=label)
        if not excess:
            axes.axhline(optimum, color="grey", linestyle=":", linewidth=0.8, label="optimum")
        axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.set_ylabel("loss - optimal loss" if excess else "loss")
        axes.set_title(f"{name.capitalize()}: parameters rounded after every step", fontsize=10)
        axes.legend(fontsize=8)
    return save_figure(figure, out, "gradient_descent")
