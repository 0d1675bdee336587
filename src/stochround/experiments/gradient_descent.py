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
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

FORMATS = ("bf16", "e4m3fn")
MODES = ("rne", "sr")
SAMPLES = 256
FEATURES = 16
LEARNING_RATE = 0.01
NOISE = 0.01
STREAM_OFFSET = 64
RUNS = 4


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


def descend(
    a: torch.Tensor,
    b: torch.Tensor,
    fmt: str | None,
    mode: str,
    steps: int,
    seed: int,
    offset: int,
    progress: ProgressLike,
    record_every: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run GD from w = 0: (final w (runs, d), losses (records, runs) at steps 0, every, ...)."""
    runs = RUNS if mode == "sr" else 1
    w = torch.zeros(runs, FEATURES, dtype=torch.float32)
    recorded = [losses(a, b, w)]
    label = f"gd {fmt or 'fp32'} {mode}"
    if mode == "sr":  # drawn up front: one Philox call instead of one per step
        words = streams.random_words_like(torch.empty(steps, runs, FEATURES), seed, offset)
    for t in progress.track(range(steps), label, steps):
        grad = (w @ a.t() - b) @ a / a.shape[0]
        update = w - LEARNING_RATE * grad
        if fmt is None:
            w = update
        elif mode == "rne":
            w = rounding.round(update, fmt, "rne")
        else:
            w = rounding.round(update, fmt, "sr", rand=words[t])
        if (t + 1) % record_every == 0:
            recorded.append(losses(a, b, w))
    return w, torch.stack(recorded)


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    steps = 1500 if quick else 10_000
    record_every = steps // 100
    a, b, w_opt = problem(seed)
    optimum = float(losses(a, b, w_opt[None])[0])
    key: dict[str, float | int | str | bool] = {"optimal_loss": optimum, "steps": steps}
    curves: dict[str, torch.Tensor] = {}
    _, fp32_curve = descend(a, b, None, "fp32", steps, seed, 0, progress, record_every)
    curves["fp32"] = fp32_curve[:, 0]
    key["fp32_final_loss"] = float(fp32_curve[-1, 0])
    rows = [["fp32", "-", f"{float(fp32_curve[-1, 0]):.3e}", "-", "-"]]
    for index, fmt in enumerate(FORMATS):
        for mode in MODES:
            w, curve = descend(
                a, b, fmt, mode, steps, seed, STREAM_OFFSET + index, progress, record_every
            )
            final = curve[-1]
            mean = float(final.mean())
            distance = float((w.double() - w_opt).norm(dim=1).mean())
            curves[f"{fmt} {mode}"] = curve.mean(1)
            key[f"{fmt}_{mode}_final_loss"] = mean
            key[f"{fmt}_{mode}_distance_to_optimum"] = distance
            spread = f"{float(final.min()):.3e} .. {float(final.max()):.3e}"
            rows.append(
                [fmt, mode, f"{mean:.3e}", spread if mode == "sr" else "-", f"{distance:.3e}"]
            )
        key[f"{fmt}_rne_over_sr"] = key[f"{fmt}_rne_final_loss"] / key[f"{fmt}_sr_final_loss"]
    table = Table(
        f"Least squares by gradient descent, {steps} steps (optimal loss {optimum:.3e})",
        ["parameters", "mode", "final loss", f"SR min .. max ({RUNS} runs)", "|w - w_opt|"],
        rows,
        [
            f"A: {SAMPLES} x {FEATURES} standard normal, lr = {LEARNING_RATE}, w_0 = 0; "
            "SR rows are means over the runs.",
        ],
    )
    figure = _plot(curves, record_every, optimum, out)
    return Experiment(
        name="gradient-descent",
        title="Gradient descent with parameters stored in bf16 and 8 bits",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "steps": steps, "lr": LEARNING_RATE},
    )


def _plot(curves: dict[str, torch.Tensor], every: int, optimum: float, out: Path) -> Path:
    figure, axes = new_figure()
    styles = {"fp32": ("k", "-"), "bf16 rne": ("C0", "--"), "bf16 sr": ("C0", "-")}
    styles |= {"e4m3fn rne": ("C1", "--"), "e4m3fn sr": ("C1", "-")}
    for label, curve in curves.items():
        color, style = styles.get(label, (None, "-"))
        steps = np.arange(curve.numel()) * every
        axes.plot(steps, curve.numpy(), color=color, linestyle=style, label=label)
    axes.axhline(optimum, color="grey", linestyle=":", linewidth=0.8, label="optimum")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title("Least squares: parameters rounded after every step")
    axes.legend(fontsize=8)
    return save_figure(figure, out, "gradient_descent")
