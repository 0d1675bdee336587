"""Optimizer-state precision: AdamW on a teacher-student MLP with parameters and states in
fp32 or bf16, stored by round-to-nearest-even or stochastic rounding.

The teacher is a fixed random MLP 8 -> 64 (x5 hidden layers, GELU) -> 1 with He-normal
weights (std sqrt(2 / fan_in)) and zero biases; the student has the same shape and starts
from a different draw of the same init; inputs are standard normal, targets the teacher's
outputs, the loss the mean squared error over the full batch.  Every row starts from the
same student init (rounded to bf16 by rne for bf16 rows) and sees the same data.  AdamW
(``stochround.optim.AdamW``: betas (0.9, 0.999), eps 1e-8, weight decay 0.01), lr 3e-3 with a
cosine schedule to 0.  The forward and backward passes run in fp32 (bf16 parameters are
upcast), so the rows differ only in how the parameters and the two moment estimates are
stored after each step: what is measured is storage precision, not bf16 arithmetic.

The parameters are one flat tensor (viewed as the layers' weights and biases in the
forward pass): AdamW's update is elementwise, so this is the same update as one tensor per
layer, with one rounded store per tensor per step instead of twelve (an eager SR cast has
a fixed cost per call that, for tensors this small, outweighs the work on the elements).

Under rne a parameter stops moving once lr * |update| < ulp(p) / 2; with the cosine decay
to 0 every parameter stalls before the end, and the loss plateaus well above fp32's.  SR
moves each parameter by the update in expectation, so bf16 with SR (6 bytes per parameter)
lands near fp32 (12 bytes) in the quick run.  fp32 parameters with bf16 rne states (8
bytes) end somewhat above fp32 in the quick run: the moments tolerate a relative error of
2^-9, the parameters' small increments do not.  At the full size fp32 goes on to a much
lower loss, while SR's noise floor holds bf16 SR well above it, and the rows with bf16 rne
states (fp32 parameters, master weights, Kahan, ECC alike) higher still, all of them far
below rne: there bf16 SR is not near fp32, only far ahead of rne.  The gap is the price of
2-byte parameters, not of SR: the fp32 row's final parameters rounded to nearest bf16 (the
report prints their loss for every run) lose more than bf16 SR training does.  The full
run is the reference setting (2048 samples, 10k steps); the quick run uses 512 samples and
600 steps, and there rne ends well above SR and SR close to fp32.  With fewer steps the gap
shrinks, as fp32 has not yet gone below rne's plateau.  The optional rows keep bf16 rne
states, so they are to be compared with the fp32-parameter, bf16-state row.

Random bits: the SR rows use ``AdamW(seed=seed)`` (the optimizer's own streams); the
teacher, the student init and the inputs come from torch.Generator seeded with ``seed``.
Optional rows (bf16 with float32 master weights, Kahan-compensated and ECC bf16
parameters) are added when the installed ``stochround.optim`` supports them.
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..optim import AdamW
from ..optim import base as optim_base
from .report import Experiment, ProgressLike, Table, new_figure, number, save_figure

INPUTS = 8
WIDTH = 64
HIDDEN_LAYERS = 5
LEARNING_RATE = 3e-3
SAMPLES = 2048
QUICK_SAMPLES = 512
STEPS = 10_000
QUICK_STEPS = 600
RECORDS = 100


@dataclass
class Setting:
    """One row: how the parameters and the AdamW states are stored."""

    key: str
    label: str
    param_dtype: torch.dtype
    state_dtype: torch.dtype
    rounding: str
    extra: dict[str, Any] = field(default_factory=dict)


def settings() -> list[Setting]:
    """The four core rows, then whichever optional rows the installed optimizer supports."""
    fp32, bf16 = torch.float32, torch.bfloat16
    rows = [
        Setting("fp32", "fp32 params + fp32 states", fp32, fp32, "rne"),
        Setting("bf16_rne", "bf16 params + bf16 states, rne", bf16, bf16, "rne"),
        Setting("bf16_sr", "bf16 params + bf16 states, sr", bf16, bf16, "sr"),
        Setting("fp32_bf16_rne", "fp32 params + bf16 states, rne", fp32, bf16, "rne"),
    ]
    if "master_weights" in inspect.signature(AdamW.__init__).parameters:
        extra = {"master_weights": True}
        rows.append(
            Setting(
                "bf16_master",
                "bf16 params + fp32 master, bf16 states, rne",
                bf16,
                bf16,
                "rne",
                extra,
            )
        )
    for mode in ("kahan", "ecc"):
        if mode in optim_base.ROUNDINGS:
            rows.append(
                Setting(f"bf16_{mode}", f"bf16 params ({mode}) + bf16 states", bf16, bf16, mode)
            )
    return rows


def shapes() -> list[tuple[int, ...]]:
    widths = [INPUTS] + [WIDTH] * HIDDEN_LAYERS + [1]
    result: list[tuple[int, ...]] = []
    for fan_in, fan_out in itertools.pairwise(widths):
        result += [(fan_out, fan_in), (fan_out,)]
    return result


def init(generator: torch.Generator) -> torch.Tensor:
    """A flat fp32 parameter vector: He-normal weights, zero biases."""
    parts = []
    for shape in shapes():
        if len(shape) == 2:
            parts.append(torch.randn(shape, generator=generator) * math.sqrt(2 / shape[1]))
        else:
            parts.append(torch.zeros(shape))
    return torch.cat([part.flatten() for part in parts])


def forward(flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The MLP with the weights and biases viewed from ``flat`` (upcast to fp32)."""
    values = flat.float()
    tensors, start = [], 0
    for shape in shapes():
        size = math.prod(shape)
        tensors.append(values[start : start + size].view(shape))
        start += size
    h = x
    layers = len(tensors) // 2
    for layer in range(layers):
        h = F.linear(h, tensors[2 * layer], tensors[2 * layer + 1])
        if layer < layers - 1:
            h = F.gelu(h)
    return h


def train(
    setting: Setting,
    student: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    seed: int,
    progress: ProgressLike,
) -> tuple[float, torch.Tensor, float, float, torch.Tensor]:
    """Train the flat ``student`` init on inputs ``x`` and targets ``y`` for ``steps``
    steps, stored as ``setting`` says, AdamW seeded with ``seed``: (final loss, losses at
    steps 0, every, 2 every, ..., bytes per parameter, seconds, the final parameters)."""
    started = time.perf_counter()
    every = max(1, steps // RECORDS)
    param = student.to(setting.param_dtype).clone().requires_grad_()
    optimizer = AdamW(
        [param],
        lr=LEARNING_RATE,
        state_dtype=setting.state_dtype,
        rounding=setting.rounding,
        seed=seed,
        **setting.extra,
    )
    recorded = []
    for step in progress.track(range(steps), setting.label, steps):
        lr = LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * step / steps))
        optimizer.param_groups[0]["lr"] = lr
        loss = F.mse_loss(forward(param, x), y)
        if step % every == 0:
            recorded.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        final = float(F.mse_loss(forward(param, x), y))
    recorded.append(final)
    seconds = time.perf_counter() - started
    return final, torch.tensor(recorded), optimizer.bytes_per_param(), seconds, param.detach()


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    steps = QUICK_STEPS if quick else STEPS
    samples = QUICK_SAMPLES if quick else SAMPLES
    generator = torch.Generator().manual_seed(seed)
    teacher = init(generator)
    student = init(generator)
    x = torch.randn(samples, INPUTS, generator=generator)
    with torch.no_grad():
        y = forward(teacher, x)
    key: dict[str, float | int | str | bool] = {
        "steps": steps,
        "samples": samples,
        "parameters": teacher.numel(),
        "target_variance": float(y.var()),
        "initial_loss": float(F.mse_loss(forward(student, x), y)),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for these small tensors
    try:
        results = []
        for setting in settings():
            final, curve, size, seconds, final_param = train(
                setting, student, x, y, steps, seed, progress
            )
            results.append((setting, final, curve, size, seconds))
            if setting.key == "fp32":
                fp32_param = final_param
    finally:
        torch.set_num_threads(threads)
    fp32_final = results[0][1]
    with torch.no_grad():  # what storing the fp32 solution in bf16 alone costs it
        in_bf16 = float(F.mse_loss(forward(fp32_param.to(torch.bfloat16), x), y))
    key["fp32_result_in_bf16_loss"] = in_bf16
    rows: list[list[str]] = []
    curves: dict[str, torch.Tensor] = {}
    for setting, final, curve, size, seconds in results:
        key[f"{setting.key}_final_loss"] = final
        key[f"{setting.key}_bytes_per_param"] = size
        key[f"{setting.key}_over_fp32"] = final / fp32_final
        key[f"{setting.key}_seconds"] = seconds
        curves[setting.label] = curve
        rows.append(
            [
                setting.label,
                f"{size:g}",
                f"{final:.3e}",
                f"{final / fp32_final:.2f}",
                f"{seconds:.1f}",
            ]
        )
    key["bf16_rne_over_sr"] = number(key, "bf16_rne_final_loss") / number(key, "bf16_sr_final_loss")
    key["optional_rows"] = ",".join(s.key for s, *_ in results[4:]) or "none"
    table = Table(
        f"AdamW on a teacher-student MLP, {steps} steps, {samples} samples "
        f"(initial loss {key['initial_loss']:.3e})",
        ["storage", "bytes/param", "final loss", "loss / fp32", "seconds"],
        rows,
        [
            f"MLP {INPUTS} -> {WIDTH} (x{HIDDEN_LAYERS}, GELU) -> 1, {teacher.numel()} "
            f"parameters; AdamW lr {LEARNING_RATE} cosine to 0, full batch; forward and "
            "backward in fp32.",
            f"The fp32 row's final parameters rounded to bf16 (rne, no training): loss "
            f"{in_bf16:.3e} ({in_bf16 / fp32_final:.2f}x fp32), the cost of bf16 storage alone.",
        ],
    )
    figure = _plot(curves, steps, out)
    return Experiment(
        name="optimizer-state",
        title="Optimizer-state precision: AdamW with bf16 parameters and states",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={
            "quick": quick,
            "seed": seed,
            "steps": steps,
            "samples": samples,
            "lr": LEARNING_RATE,
        },
    )


def _plot(curves: dict[str, torch.Tensor], steps: int, out: Path) -> Path:
    figure, axes = new_figure(width=7.5, height=4.5)
    every = max(1, steps // RECORDS)
    for label, curve in curves.items():
        x_steps = np.minimum(np.arange(curve.numel()) * every, steps)
        style = "--" if "rne" in label else "-"
        axes.plot(x_steps, curve.numpy(), linestyle=style, label=label)
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (MSE)")
    axes.set_title("Teacher-student MLP, AdamW: storage of parameters and states", fontsize=10)
    axes.legend(fontsize=8)
    return save_figure(figure, out, "optimizer_state")
