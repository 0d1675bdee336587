"""Scientific programs written as plain PyTorch, run in low precision under
`stochround.emulate.emulate` (no rounding call in any model): Lorenz-96, a 2-D heat
equation, and a Monte Carlo arithmetic profile of a small program with an unstable step.

(1) Lorenz-96 (the `lorenz96` experiment's model: dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} -
x_i + F, N = 40, F = 8, RK4, dt = 0.01), written with ``torch.roll`` and run under
``emulate(fmt, mode)`` for fp16 and bf16 with rne and SR: every ATen op's result (each RK4
stage's roll, product and sum) is rounded to the format, not only the stored state as in
`lorenz96`.  An ensemble of members, started from points of one float64 trajectory on the
attractor (1000 steps of spin-up from x = F + 0.01 e_0, then one member every 50 steps),
is run side by side in one tensor; the float64 run of the same code outside any emulation
is the reference.  Reported: the mean and the standard deviation of x_i over members,
sites and steps (the climate statistics of `lorenz96`), and the error growth, the RMS
over members and sites of x(t) - x_fp64(t) against time.

(2) The 2-D heat equation u_t = kappa (u_xx + u_yy) on an n x n interior grid with the
walls held at u = 1, explicit Euler with the 5-point stencil: u <- u + r (u_N + u_S + u_E
+ u_W - 4 u), r = kappa dt / h^2 (stable for r <= 1/4), from a hot spot u = 1 + A
exp(-|p - c|^2 / (2 s^2)).  Written in plain PyTorch (``F.pad`` for the walls) and run in
fp16 with rne and with SR (an ensemble of SR members in one tensor, each element its own
random words) and in fp32 with rne, against the float64 run.  As the field flattens the
increment r * laplacian falls below half an ulp of u (2^-11 for 1 <= u < 2 in fp16) and
rne loses it: once every increment of a step is lost the state is a fixed point of the
rounded map and stays there for ever (the step at which it stopped changing is reported),
the heat stuck in the domain; SR keeps the increments in expectation and does not
stagnate (Kimpson, Paxton, Chantry & Palmer 2023, "Climate-change modelling at reduced
floating-point precision with stochastic rounding", QJRMS 149, 843).  Over a long enough
run fp32 rne stagnates too, later.  Reported: the final mean error of u against float64
(for SR, mean and spread over the members).

(3) An MCA profile: the variance of 64 values 100 + k/32 (k = -32 .. 31; 13 significant
bits each, held exactly) by the naive one-pass formula (sum of squares minus n mean^2,
whose subtraction cancels about log10(mean(x^2) / variance) digits, 4.5 here) and by the
two-pass formula, run n times by ``stochround.emulate.mca(main, precision=24,
trace=True)`` (Verificarlo's MCA at fp32's precision).  The program is written to
``OUT/emulate_science_program.py`` and imported from there: the trace names its lines
(the library's own frames are skipped) and ``stochround mca
OUT/emulate_science_program.py --precision 24`` reruns it.  Reported: each output's
significant digits against the exact variance (Fractions), and the call sites, worst
first.

Random words: every emulation draws from the stream ``((seed + index) mod 2^64, offset =
k)``, k its counter (one offset per rounded tensor); index: Lorenz-96 fp16 rne 0, fp16 SR
1, bf16 rne 2, bf16 SR 3; heat fp16 rne 4, fp16 SR 5, fp32 rne 6 (rne draws none); the
MCA runs use the stream ``(seed + 7) mod 2^64``, its counter continuing from run to run
(`stochround.emulate.mca`).
"""

from __future__ import annotations

import importlib.util
import math
import time
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as functional

from .. import random as streams
from ..emulate import MCAResult, emulate, mca
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

VARIABLES = 40
FORCING = 8.0
DT = 0.01
SPIN_UP = 1000
MEMBER_SPACING = 50  # steps of the float64 trajectory between two members' starts
LORENZ_RUNS = (("float16", "rne"), ("float16", "sr"), ("bfloat16", "rne"), ("bfloat16", "sr"))

WALL = 1.0  # the walls' temperature
HOT_SPOT = 0.9  # A: the hot spot's amplitude above the walls
DIFFUSION = 0.05  # r = kappa dt / h^2
HEAT_RUNS = (("float16", "rne"), ("float16", "sr"), ("float32", "rne"))

MCA_PRECISION = 24  # fp32's significant bits
MCA_DATA_MEAN = 100
MCA_DATA_SIZE = 64
PROGRAM_NAME = "emulate_science_program.py"
CANCELLING_MARK = "# cancels"

# the profiled program, written to OUT and imported from there (module docstring, (3))
PROGRAM = f'''"""The program `stochround run emulate-science` profiles with Monte Carlo arithmetic:
the variance of {MCA_DATA_SIZE} values {MCA_DATA_MEAN} + k/32 by the naive one-pass formula and
by the two-pass formula.  Rerun it with `stochround mca {PROGRAM_NAME} --precision 24`."""

import torch

DATA = {MCA_DATA_MEAN} + torch.arange(-32, 32, dtype=torch.float64) / 32


def naive_variance(x):
    n = x.numel()
    total = x.sum()
    squares = (x * x).sum()
    return (squares - total * total / n) / (n - 1)  {CANCELLING_MARK}


def two_pass_variance(x):
    mean = x.mean()
    deviations = x - mean
    return (deviations * deviations).sum() / (x.numel() - 1)


def main():
    return {{"naive": naive_variance(DATA), "two_pass": two_pass_variance(DATA)}}
'''


def stream_seed(seed: int, index: int) -> int:
    """The seed of run ``index``'s stream: (seed + index) mod 2^64 (module docstring).  Each
    emulation counts its own offsets from 0, so the runs differ by seed, not by offset."""
    return (seed + index) % streams.TWO_POW_64


# --------------------------------------------------------------------------------------
# (1) Lorenz-96
# --------------------------------------------------------------------------------------


def tendency(x: torch.Tensor) -> torch.Tensor:
    """dx/dt of Lorenz-96 along the last dimension (cyclic): (x_{i+1} - x_{i-2}) x_{i-1} -
    x_i + F."""
    ahead = torch.roll(x, -1, dims=-1)
    behind = torch.roll(x, 1, dims=-1)
    behind2 = torch.roll(x, 2, dims=-1)
    return (ahead - behind2) * behind - x + FORCING


def rk4_step(x: torch.Tensor, dt: float) -> torch.Tensor:
    """One classical Runge-Kutta step of ``dt`` for Lorenz-96 (each row a system)."""
    k1 = tendency(x)
    k2 = tendency(x + dt / 2 * k1)
    k3 = tendency(x + dt / 2 * k2)
    k4 = tendency(x + dt * k3)
    return x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def lorenz_starts(members: int) -> torch.Tensor:
    """The members' float64 starting states (members, N): after SPIN_UP steps from x = F +
    0.01 e_0, one state every MEMBER_SPACING steps of the same trajectory."""
    x = torch.full((VARIABLES,), FORCING, dtype=torch.float64)
    x[0] += 0.01
    for _ in range(SPIN_UP):
        x = rk4_step(x, DT)
    starts = []
    for _ in range(members):
        starts.append(x)
        for _ in range(MEMBER_SPACING):
            x = rk4_step(x, DT)
    return torch.stack(starts)


def lorenz_run(
    starts: torch.Tensor, steps: int, fmt: str | None, mode: str, seed: int
) -> torch.Tensor:
    """The trajectory (steps + 1, members, N), float64, of every member: plain float64
    when ``fmt`` is None, else under ``emulate(fmt, mode, seed=seed)`` (the start rounded
    by a product by 1 under it; the trajectory is stored outside the emulation, as it is).

    Args:
        starts: the members' starting states (members, N), float64 (`lorenz_starts`).
        steps: the number of RK4 steps.
        fmt: the emulated format's name, or None for plain float64.
        mode: the rounding mode (`stochround.reference.MODES`).
        seed: the emulation's seed (unused for plain float64).
    """
    trajectory = torch.empty(steps + 1, *starts.shape, dtype=torch.float64)
    if fmt is None:
        x = starts.clone()
        trajectory[0] = x
        for t in range(steps):
            x = rk4_step(x, DT)
            trajectory[t + 1] = x
        return trajectory
    emulation = emulate(fmt, mode, seed=seed)
    with emulation:
        # the start rounded to the format by an op under the emulation (a product by 1:
        # exact, then rounded; a copy is not rounded, docs/guide/emulate.md)
        x = starts * 1.0
    trajectory[0] = x
    for t in range(steps):
        with emulation:
            x = rk4_step(x, DT)
        trajectory[t + 1] = x
    return trajectory


def lorenz(
    members: int, steps: int, seed: int, progress: ProgressLike
) -> tuple[dict[str, float | int | str | bool], Table, dict[str, np.ndarray]]:
    """The Lorenz-96 runs: key numbers, the table, and each run's RMS error against float64
    per step (``members`` members, ``steps`` steps, SR words from ``seed``; ``progress``
    reports the runs)."""
    starts = lorenz_starts(members)
    reference = lorenz_run(starts, steps, None, "rne", seed)
    labels = ["fp64"] + [f"{_short(fmt)} {mode}" for fmt, mode in LORENZ_RUNS]
    runs = {"fp64": reference}
    for index, (fmt, mode) in enumerate(
        progress.track(LORENZ_RUNS, "emulate-science lorenz96", len(LORENZ_RUNS))
    ):
        runs[labels[index + 1]] = lorenz_run(starts, steps, fmt, mode, stream_seed(seed, index))
    key: dict[str, float | int | str | bool] = {"lorenz_members": members, "lorenz_steps": steps}
    errors = {}
    rows = []
    for label, trajectory in runs.items():
        name = label.replace(" ", "_")
        mean, std = float(trajectory[1:].mean()), float(trajectory[1:].std())
        error = (trajectory - reference).pow(2).mean(dim=(1, 2)).sqrt().numpy()
        errors[label] = error
        key[f"lorenz_{name}_mean"] = mean
        key[f"lorenz_{name}_std"] = std
        key[f"lorenz_{name}_final_rms_error"] = float(error[-1])
        rows.append([label, f"{mean:.4f}", f"{std:.4f}", f"{error[1]:.2e}", f"{error[-1]:.2e}"])
    table = Table(
        f"Lorenz-96 under emulate: N = {VARIABLES}, F = {FORCING:g}, RK4 dt = {DT}, "
        f"{members} members, {steps} steps",
        ["run", "mean of x_i", "std of x_i", "RMS error after 1 step", f"after {steps} steps"],
        rows,
        [
            "The model is plain PyTorch; every op's result is rounded to the format by the "
            "emulation. Mean and std over members, sites and steps; RMS error against the "
            "float64 run of the same code from the same starts.",
        ],
    )
    return key, table, errors


# --------------------------------------------------------------------------------------
# (2) the heat equation
# --------------------------------------------------------------------------------------


def heat_start(size: int, members: int) -> torch.Tensor:
    """The interior's initial temperature (members, size, size), float64: the walls' value
    plus a Gaussian hot spot of amplitude HOT_SPOT and width size / 6 at the centre."""
    position = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    squared = position[:, None] ** 2 + position[None, :] ** 2
    spot = WALL + HOT_SPOT * torch.exp(-squared / (2 * (size / 6) ** 2))
    return spot.expand(members, size, size).clone()


def heat_step(u: torch.Tensor, r: float) -> torch.Tensor:
    """One explicit Euler step of the heat equation on the interior u (..., n, n) with the
    walls at WALL: u + r (u_N + u_S + u_E + u_W - 4 u)."""
    padded = functional.pad(u, (1, 1, 1, 1), value=WALL)
    neighbours = padded[..., :-2, 1:-1] + padded[..., 2:, 1:-1]
    neighbours = neighbours + padded[..., 1:-1, :-2] + padded[..., 1:-1, 2:]
    return u + r * (neighbours - 4 * u)


def heat_run(
    start: torch.Tensor, steps: int, fmt: str | None, mode: str, seed: int
) -> tuple[np.ndarray, torch.Tensor, int | None]:
    """A heat run of ``steps`` steps: the mean temperature of each member per step (steps +
    1, members), the final state, and, for a deterministic run (``mode`` not "sr"), the
    first step that left the state unchanged (None if none did): the map is then at a
    fixed point and every later step leaves it too.  An SR step that changes nothing proves
    no such thing (the next one draws new words): None for SR.  Plain float64 when ``fmt``
    is None, else under ``emulate(fmt, mode, seed=seed)``.

    Args:
        start: the initial interior temperature (members, n, n), float64.
        steps: the number of steps.
        fmt: the emulated format's name, or None for plain float64.
        mode: the rounding mode (`stochround.reference.MODES`).
        seed: the emulation's seed.
    """
    means = np.empty((steps + 1, start.shape[0]))
    u = start.clone()
    emulation = None if fmt is None else emulate(fmt, mode, seed=seed)
    if emulation is not None:
        with emulation:
            u = start * 1.0  # rounded to the format (a copy is not)
    means[0] = u.mean(dim=(-2, -1)).numpy()
    frozen = None
    for t in range(steps):
        if emulation is None:
            new = heat_step(u, DIFFUSION)
        else:
            with emulation:
                new = heat_step(u, DIFFUSION)
        if frozen is None and mode != "sr" and torch.equal(new, u):
            frozen = t + 1
        u = new
        means[t + 1] = u.mean(dim=(-2, -1)).numpy()
    return means, u, frozen


def heat(
    size: int, steps: int, members: int, seed: int, progress: ProgressLike
) -> tuple[dict[str, float | int | str | bool], Table, dict[str, np.ndarray]]:
    """The heat runs: key numbers, the table, and each run's mean temperature per step
    (member 0 for rne, every member for SR) against float64's."""
    reference, reference_final, _ = heat_run(heat_start(size, 1), steps, None, "rne", seed)
    key: dict[str, float | int | str | bool] = {
        "heat_size": size,
        "heat_steps": steps,
        "heat_sr_members": members,
        "heat_fp64_final_mean": float(reference[-1, 0]),
        "heat_initial_mean": float(reference[0, 0]),
    }
    curves = {"fp64": reference[:, 0]}
    rows = [["fp64", f"{reference[-1, 0]:.6f}", "0", "0", "-"]]
    for index, (fmt, mode) in enumerate(
        progress.track(HEAT_RUNS, "emulate-science heat", len(HEAT_RUNS))
    ):
        label = f"{_short(fmt)} {mode}"
        name = label.replace(" ", "_")
        count = members if mode == "sr" else 1
        means, final, frozen = heat_run(
            heat_start(size, count), steps, fmt, mode, stream_seed(seed, 4 + index)
        )
        error = means[-1] - reference[-1, 0]
        rms = (final - reference_final).pow(2).mean(dim=(-2, -1)).sqrt()
        key[f"heat_{name}_final_mean"] = float(means[-1].mean())
        key[f"heat_{name}_mean_error"] = float(error.mean())
        key[f"heat_{name}_rms_error"] = float(rms.mean())
        key[f"heat_{name}_frozen_at"] = 0 if frozen is None else frozen
        spread = f" ± {error.std(ddof=1):.2e}" if count > 1 else ""
        rows.append(
            [
                label + (f" ({count} members)" if count > 1 else ""),
                f"{means[-1].mean():.6f}",
                f"{error.mean():.2e}{spread}",
                f"{float(rms.mean()):.2e}",
                "never" if frozen is None else str(frozen),
            ]
        )
        curves[label] = means
    table = Table(
        f"2-D heat equation under emulate: {size} x {size} interior, walls at {WALL:g}, "
        f"r = {DIFFUSION}, {steps} steps",
        ["run", "final mean of u", "mean error", "RMS error of u", "state frozen from step"],
        rows,
        [
            f"Explicit Euler, 5-point stencil, from a hot spot of amplitude {HOT_SPOT:g}; "
            f"errors against float64 at the last step (SR: mean ± std over the members). "
            "A frozen rne state is a fixed point of the rounded map: every increment "
            "r * laplacian is below half an ulp of u. SR is never frozen (a step that "
            "changes nothing is followed by one with fresh random words).",
        ],
    )
    return key, table, curves


# --------------------------------------------------------------------------------------
# (3) an MCA profile
# --------------------------------------------------------------------------------------


def load_program(out: Path) -> ModuleType:
    """Write `PROGRAM` to ``out/PROGRAM_NAME`` and import it from there (a fresh module)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / PROGRAM_NAME
    path.write_text(PROGRAM, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("emulate_science_program", path)
    assert spec is not None and spec.loader is not None  # a .py file path always has one
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_variance(values: torch.Tensor) -> Fraction:
    """The sample variance (n - 1) of float64 values, exactly (Fractions)."""
    data = [Fraction(v) for v in values.tolist()]
    mean = sum(data, Fraction(0)) / len(data)
    return sum(((v - mean) ** 2 for v in data), Fraction(0)) / (len(data) - 1)


def cancelling_line() -> int:
    """The line of `PROGRAM` (1-based) holding the cancelling subtraction."""
    lines = PROGRAM.splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(CANCELLING_MARK))


def profile(
    runs: int, seed: int, out: Path
) -> tuple[dict[str, float | int | str | bool], list[Table], MCAResult]:
    """The MCA profile of `PROGRAM` (``runs`` runs, stream ``seed``): key numbers, the
    tables of outputs and sites, and the result."""
    program = load_program(out)
    result = mca(program.main, n=runs, precision=MCA_PRECISION, seed=seed, trace=True)
    exact = exact_variance(program.DATA)
    mean_square = float(program.DATA.pow(2).mean())
    expected_loss = math.log10(mean_square / float(exact))
    key: dict[str, float | int | str | bool] = {
        "mca_runs": runs,
        "mca_precision": MCA_PRECISION,
        "mca_exact_variance": float(exact),
        "mca_expected_digits_lost": expected_loss,
        "mca_cancelling_line": cancelling_line(),
    }
    rows = []
    for label, mean, digits in zip(result.labels, result.mean, result.digits, strict=True):
        name = label.strip("[]'")
        error = abs(Fraction(float(mean)) - exact) / exact
        key[f"mca_{name}_digits"] = float(digits)
        key[f"mca_{name}_relative_error"] = float(error)
        rows.append([name, f"{float(mean):.8g}", f"{float(digits):.2f}", f"{float(error):.1e}"])
    outputs = Table(
        f"MCA of two variance formulas: {runs} runs at {MCA_PRECISION} bits",
        ["formula", "MCA mean", "significant digits", "relative error of the mean"],
        rows,
        [
            f"Exact variance (Fractions) {float(exact):.10g}; the naive formula's "
            f"subtraction cancels about log10(mean(x^2) / variance) = {expected_loss:.2f} "
            f"of the {MCA_PRECISION * math.log10(2):.2f} digits.",
        ],
    )
    source = PROGRAM.splitlines()
    site_rows = []
    for rank, site in enumerate(result.sites):
        where, function = site.site.rsplit(" ", 1)
        line = int(where.rsplit(":", 1)[1])
        if rank == 0:
            key["mca_worst_site_line"] = line
            key["mca_worst_site_digits"] = site.digits
        site_rows.append(
            [f"{line}", function, source[line - 1].strip(), str(site.calls), f"{site.digits:.2f}"]
        )
    sites = Table(
        f"MCA trace of {PROGRAM_NAME}: call sites, worst first",
        ["line", "function", "code", "ATen calls", "fewest digits"],
        site_rows,
        [
            "Per line of the program, the fewest significant digits of any output of its "
            f"ATen ops across the {runs} runs; line {cancelling_line()} is the naive "
            "formula's cancelling subtraction.",
        ],
    )
    return key, [outputs, sites], result


# --------------------------------------------------------------------------------------


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    streams.check_seed(seed, "seed")
    members, steps = (16, 100) if quick else (32, 2000)
    size, heat_steps, heat_members = (12, 600, 4) if quick else (32, 20_000, 8)
    mca_runs = 16 if quick else 64
    key, lorenz_table, errors = lorenz(members, steps, seed, progress)
    heat_key, heat_table, curves = heat(size, heat_steps, heat_members, seed, progress)
    mca_key, mca_tables, _ = profile(mca_runs, stream_seed(seed, 7), out)
    key.update(heat_key)
    key.update(mca_key)
    figures = [_plot_lorenz(errors, out), _plot_heat(curves, out)]
    return Experiment(
        name="emulate-science",
        title="Scientific programs under emulate: Lorenz-96, heat, MCA",
        tables=[lorenz_table, heat_table, *mca_tables],
        figures=figures,
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={
            "quick": quick,
            "seed": seed,
            "lorenz_members": members,
            "lorenz_steps": steps,
            "heat_size": size,
            "heat_steps": heat_steps,
            "heat_sr_members": heat_members,
            "mca_runs": mca_runs,
        },
    )


def _short(fmt: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[fmt]


def _plot_lorenz(errors: dict[str, np.ndarray], out: Path) -> Path:
    """RMS error against float64 per step, log scale, for each emulated run."""
    figure, axes = new_figure()
    for label, error in errors.items():
        if label == "fp64":
            continue
        style = "-" if label.endswith("sr") else "--"
        color = "C0" if label.startswith("fp16") else "C1"
        time_axis = np.arange(1, error.size) * DT
        axes.plot(time_axis, error[1:], linestyle=style, color=color, label=label)
    axes.set_yscale("log")
    axes.set_xlabel("time (time units)")
    axes.set_ylabel("RMS of x - x_fp64")
    axes.set_title("Lorenz-96 under emulate: error growth")
    axes.legend(fontsize=8)
    return save_figure(figure, out, "emulate_science_lorenz96")


def _plot_heat(curves: dict[str, np.ndarray], out: Path) -> Path:
    """The mean temperature per step minus float64's, for each run (SR: every member)."""
    figure, axes = new_figure()
    reference = curves["fp64"]
    steps = np.arange(reference.size)
    colors = {"fp16 rne": "C0", "fp16 sr": "C1", "fp32 rne": "C2"}
    for label, means in curves.items():
        if label == "fp64":
            continue
        gap = means - reference[:, None]
        for member in range(gap.shape[1]):
            axes.plot(
                steps,
                gap[:, member],
                color=colors[label],
                linewidth=0.8,
                label=label if member == 0 else None,
            )
    axes.axhline(0, color="k", linewidth=0.6)
    axes.set_xlabel("step")
    axes.set_ylabel("mean of u - mean of u_fp64")
    axes.set_title("2-D heat equation under emulate: mean of u against float64")
    axes.legend(fontsize=8)
    return save_figure(figure, out, "emulate_science_heat")
