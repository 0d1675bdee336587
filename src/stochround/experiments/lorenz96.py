"""Lorenz-96 with its state stored in low precision: climate statistics and periodic orbits
(Klöwer, Coveney, Paxton & Palmer 2023, "Periodic orbits in chaotic systems simulated at
low precision", Sci. Rep. 13, 11410).

dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - x_i + F, i cyclic, F = 8, RK4.  The RK4 stages are
computed in float64 from the stored state and the new state is stored rounded to the format,
with rne or exact SR; the float64 run is the reference.  Every run starts from the float64
state after a spin-up of 1000 steps from x = F + 0.01 e_0 (rounded with rne to the format).

Climate: N = 40 variables, dt = 0.01 (the classical setting), bf16 and fp16.  The chaotic
trajectories decorrelate within a few time units, so only statistics compare: the mean and
variance of all x_i over the run, and the autocorrelation of x_i(t) with x_i(t + lag) at
lags 0.1, 0.2, 0.5 and 1 time unit, averaged over the 40 sites (statistically identical by
symmetry), with the e-folding time where it first drops below 1/e.  The ± are standard
errors by batch means over blocks of 5 time units (the run's ACF estimate and its spread
over the blocks).

Periodic orbits: N = 5 .. 6 (quick; 5 .. 8 full), dt = 0.05 (Lorenz's own step), e4m3fn and
e5m2.  A rne run is a deterministic map on a finite set of states, so once a stored state
(all N bit patterns) repeats, at steps s and s + P, the run is periodic from step s with
period P for ever; the code checks that every later step repeats the state P steps back.  An
SR run is a Markov chain, not a map: a revisited state is followed by fresh random bits, so
it would count as periodic only if its last steps repeated a whole cycle (each of the last
>= P steps equal to the state P steps earlier, the same lag throughout); the revisits and
the longest stretch of same-lag repeats are reported.  The fp64 runs give the largest
Lyapunov exponent (a twin run 1e-8 away in x_0, renormalised every time unit): positive for
N >= 5, so these small systems are chaotic (at N = 4 it is close to zero: not chaotic even
in exact arithmetic).  Why this setting: Klöwer et al. find orbit lengths
growing exponentially with N and with the precision, and with N = 40 no bf16 or fp16 state
repeats within the climate runs; at dt = 0.01 the 8-bit formats' rne runs stagnate instead
(the increment dt dx/dt ~ 0.1 is below half an ulp, 0.5 .. 1 for 4 <= |x| < 16 in e4m3fn, so
each variable freezes and the run sits on a fixed point within a few hundred steps), while
dt = 0.05 moves the variables by about an ulp per step.

What the full run shows (the tables give each run's numbers): the rne orbits' periods grow
steeply with N and with the precision (e4m3fn's 4 significant bits against e5m2's 3), as
Klöwer et al. find (a separate, longer rne run at N = 9 finds a longer period still), and
an rne run may also end on a fixed point.  No SR run becomes periodic: its longest same-lag
stretch stays a few steps long; revisits of earlier states are most frequent in the
smallest, coarsest system (e5m2, N = 5) and absent from the larger e4m3fn ones.  In the
climate runs the means, autocorrelations and e-folding times of every bf16 and fp16 run
agree closely with fp64's, and no bf16 or fp16 rne state repeats.

Random bits: climate, step t of the SR run of format index f (bf16 0, fp16 1) draws the
words of stream (seed, offset = 96 + f) at indices t * 40 .. t * 40 + 39; orbits, step t of
the SR run of N variables in format index f (e4m3fn 0, e5m2 1) draws the words of stream
(seed, offset = 104 + f) at indices t * 256 + 16 N + i for variable i (independent of which
other N run alongside); all passed as rand=.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

VARIABLES = 40
FORCING = 8.0
DT = 0.01
SPIN_UP = 1000
FORMATS = ("bf16", "fp16")
MODES = ("rne", "sr")
STREAM_OFFSET = 96
LAGS = (10, 20, 50, 100)  # autocorrelation lags in steps: 0.1, 0.2, 0.5, 1 time unit
MAX_LAG = 200  # the autocorrelation plot's last lag (2 time units)
BLOCK = 500  # steps per batch-means block (5 time units)

ORBIT_DT = 0.05
ORBIT_FORMATS = ("e4m3fn", "e5m2")
ORBIT_STREAM_OFFSET = 104
ORBIT_WORDS_PER_STEP = 256  # ring of N variables: words 16 N .. 16 N + N - 1 of each step
LYAPUNOV_DISTANCE = 1e-8
LYAPUNOV_EVERY = 20  # steps between renormalisations of the twin run (1 time unit)


def neighbours(sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of x_{i+1}, x_{i-1}, x_{i-2} for a vector holding cyclic systems of the given
    sizes one after another."""
    ahead, behind, behind2 = [], [], []
    start = 0
    for n in sizes:
        for i in range(n):
            ahead.append(start + (i + 1) % n)
            behind.append(start + (i - 1) % n)
            behind2.append(start + (i - 2) % n)
        start += n
    return torch.tensor(ahead), torch.tensor(behind), torch.tensor(behind2)


def tendency(x: torch.Tensor, ring: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """dx/dt of Lorenz-96 for each row of x (its systems laid out as `neighbours` says)."""
    ahead, behind, behind2 = ring
    return (x[..., ahead] - x[..., behind2]) * x[..., behind] - x + FORCING


def rk4(x: torch.Tensor, ring: tuple[torch.Tensor, ...], dt: float) -> torch.Tensor:
    k1 = tendency(x, ring)
    k2 = tendency(x + dt / 2 * k1, ring)
    k3 = tendency(x + dt / 2 * k2, ring)
    k4 = tendency(x + dt * k3, ring)
    return x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def starts_of(sizes: tuple[int, ...]) -> list[int]:
    """Where each system starts in the state vector."""
    return [sum(sizes[:k]) for k in range(len(sizes))]


def spun_up(sizes: tuple[int, ...], ring: tuple[torch.Tensor, ...], dt: float) -> torch.Tensor:
    """The float64 state after SPIN_UP steps from x = F + 0.01 e_0 in each system."""
    x = torch.full((sum(sizes),), FORCING, dtype=torch.float64)
    x[starts_of(sizes)] += 0.01
    for _ in range(SPIN_UP):
        x = rk4(x, ring, dt)
    return x


@dataclass
class Recurrence:
    """Exact repeats of one run's stored state, fed one step at a time."""

    last_seen: dict[bytes, int] = field(default_factory=dict)
    first_repeat: tuple[int, int] | None = None  # (step first seen, lag) of the first revisit
    revisits: int = 0  # steps whose state had occurred before
    lag: int = 0  # the latest step's lag to the state's previous occurrence (0: new state)
    run: int = 0  # consecutive steps, up to the latest, that repeated with that same lag
    longest_run: int = 0

    def add(self, signature: bytes, step: int) -> None:
        previous = self.last_seen.get(signature)
        self.last_seen[signature] = step
        if previous is None:
            self.lag = self.run = 0
            return
        lag = step - previous
        self.revisits += 1
        if self.first_repeat is None:
            self.first_repeat = (previous, lag)
        self.run = self.run + 1 if lag == self.lag else 1
        self.lag = lag
        self.longest_run = max(self.longest_run, self.run)

    @property
    def follows_cycle(self) -> bool:
        """The last `lag` (or more) steps each repeated the state `lag` steps earlier: the run
        ends on a whole cycle followed again."""
        return 0 < self.lag <= self.run


def autocorrelation(series: np.ndarray, mean: float, variance: float, blocks: int) -> np.ndarray:
    """Autocorrelation at lags 0 .. MAX_LAG of ``series`` (steps, sites), averaged over the
    sites, about the given mean and variance: row 0 is the whole run's, rows 1 .. blocks each
    block's (pairs within the block only)."""
    length = series.shape[0] // blocks
    pieces = [series] + [series[b * length : (b + 1) * length] for b in range(blocks)]
    result = []
    for piece in pieces:
        centred = (piece.astype(np.float64) - mean) / math.sqrt(variance)
        size = piece.shape[0]
        spectrum = np.fft.rfft(centred, n=2 * size, axis=0)
        sums = np.fft.irfft(spectrum * spectrum.conj(), n=2 * size, axis=0)[: MAX_LAG + 1]
        result.append(sums.sum(axis=1) / ((size - np.arange(MAX_LAG + 1)) * piece.shape[1]))
    return np.stack(result)


def e_folding_time(acf: np.ndarray, dt: float) -> float:
    """The first time the autocorrelation drops below 1/e, linearly interpolated."""
    below = np.nonzero(acf < math.exp(-1))[0]
    if below.size == 0:
        return math.inf
    k = int(below[0])
    fraction = (acf[k - 1] - math.exp(-1)) / (acf[k - 1] - acf[k])
    return (k - 1 + fraction) * dt


def climate(
    steps: int, seed: int, progress: ProgressLike
) -> tuple[list[str], dict[str, float | int | str | bool], Table, torch.Tensor, np.ndarray]:
    """The N = 40 runs of ``steps`` steps: statistics, autocorrelation and exact repeats of
    the rne states (SR words from ``seed``; ``progress`` reports the loop)."""
    ring = neighbours((VARIABLES,))
    x = spun_up((VARIABLES,), ring, DT)
    labels = ["fp64"] + [f"{fmt} {mode}" for fmt in FORMATS for mode in MODES]
    state = x.repeat(len(labels), 1)
    for row, label in enumerate(labels[1:], 1):
        state[row] = rounding.round(x, label.split()[0], "rne")
    words = {
        fmt: streams.random_words_like(torch.empty(steps, VARIABLES), seed, STREAM_OFFSET + f)
        for f, fmt in enumerate(FORMATS)
    }
    total = torch.zeros(len(labels), dtype=torch.float64)
    total_squares = torch.zeros(len(labels), dtype=torch.float64)
    seen = {label: Recurrence() for label in labels if label.endswith("rne")}
    # float32 holds bf16 and fp16 exactly; fp64's trace only feeds the autocorrelation
    trace = np.empty((steps, len(labels), VARIABLES), dtype=np.float32)
    for t in progress.track(range(steps), "lorenz96 climate", steps):
        new = rk4(state, ring, DT)
        for row, label in enumerate(labels[1:], 1):
            fmt, mode = label.split()
            if mode == "rne":
                new[row] = rounding.round(new[row], fmt, "rne")
            else:
                new[row] = rounding.round(new[row], fmt, "sr", rand=words[fmt][t])
        state = new
        total += state.sum(1)
        total_squares += (state**2).sum(1)
        trace[t] = state.numpy()
        for row, label in enumerate(labels):
            if label in seen and seen[label].first_repeat is None:
                seen[label].add(state[row].numpy().tobytes(), t)
    count = steps * VARIABLES
    means = (total / count).numpy()
    variances = (total_squares / count).numpy() - means**2
    blocks = max(steps // BLOCK, 1)
    acf = np.stack(
        [
            autocorrelation(trace[:, row], means[row], variances[row], blocks)
            for row in range(len(labels))
        ],
        axis=-1,
    )  # (1 + blocks, MAX_LAG + 1, rows)
    key: dict[str, float | int | str | bool] = {"steps": steps, "acf_blocks": blocks}
    rows = []
    for row, label in enumerate(labels):
        name = label.replace(" ", "_")
        key[f"{name}_mean"] = float(means[row])
        key[f"{name}_variance"] = float(variances[row])
        cells = [label, f"{means[row]:.4f}", f"{variances[row]:.3f}"]
        for lag in LAGS:
            spread = float(acf[1:, lag, row].std(ddof=1) / math.sqrt(blocks)) if blocks > 1 else 0
            key[f"{name}_autocorrelation_lag{lag}"] = float(acf[0, lag, row])
            key[f"{name}_autocorrelation_lag{lag}_se"] = spread
            cells.append(f"{acf[0, lag, row]:.3f} ± {spread:.3f}")
        times = [e_folding_time(acf[b, :, row], DT) for b in range(1, blocks + 1)]
        decorrelation = e_folding_time(acf[0, :, row], DT)
        spread = float(np.std(times, ddof=1) / math.sqrt(blocks)) if blocks > 1 else 0.0
        key[f"{name}_decorrelation_time"] = decorrelation
        key[f"{name}_decorrelation_time_se"] = spread
        cells.append(f"{decorrelation:.3f} ± {spread:.3f}")
        orbit = "-"
        if label in seen:
            found = seen[label].first_repeat
            key[f"{name}_period"] = 0 if found is None else found[1]
            key[f"{name}_period_starts_at"] = -1 if found is None else found[0]
            orbit = f"none in {steps} steps" if found is None else f"{found[1]} from {found[0]}"
        cells.append(orbit)
        rows.append(cells)
    table = Table(
        f"Lorenz-96 climate, N = {VARIABLES}, F = {FORCING:g}, RK4 dt = {DT}, {steps} steps",
        ["state", "mean of x_i", "variance of x_i"]
        + [f"ACF at {lag * DT:g}" for lag in LAGS]
        + ["e-folding time", "periodic orbit (period, first step)"],
        rows,
        [
            "The state is rounded after each step; the RK4 stages are float64. Statistics "
            "over all variables and steps after the shared spin-up. ACF: correlation of "
            "x_i(t) with x_i(t + lag), lag in time units, averaged over the sites; ± standard "
            f"errors by batch means over {blocks} blocks of {BLOCK * DT:g} time units.",
        ],
    )
    return labels, key, table, torch.from_numpy(trace[:, :, 0]), acf[0]


@dataclass
class OrbitRun:
    """One orbit run's label, its system's size and where it lies in the state vector."""

    fmt: str
    mode: str
    size: int
    start: int
    row: int
    recurrence: Recurrence = field(default_factory=Recurrence)


def orbits(
    sizes: tuple[int, ...], steps: int, seed: int, progress: ProgressLike
) -> tuple[dict[str, float | int | str | bool], Table, list[OrbitRun], np.ndarray, list[float]]:
    """Small systems in 8-bit formats: exact repeats of the stored state under rne and SR,
    one system per N in ``sizes``, ``steps`` steps (SR words from ``seed``; ``progress``
    reports the loop)."""
    if max(sizes) >= 16:
        raise ValueError("the word layout holds systems of up to 15 variables")
    ring = neighbours(sizes)
    x = spun_up(sizes, ring, ORBIT_DT)
    starts = starts_of(sizes)
    labels = ["fp64", "fp64 twin"] + [f"{fmt} {mode}" for fmt in ORBIT_FORMATS for mode in MODES]
    state = x.repeat(len(labels), 1)
    state[1, starts] += LYAPUNOV_DISTANCE
    for row, label in enumerate(labels[2:], 2):
        state[row] = rounding.round(x, label.split()[0], "rne")
    columns = torch.cat([16 * n + torch.arange(n) for n in sizes])
    index = torch.arange(steps)[:, None] * ORBIT_WORDS_PER_STEP + columns
    words = {
        fmt: streams.random_words(index, seed, ORBIT_STREAM_OFFSET + f)
        for f, fmt in enumerate(ORBIT_FORMATS)
    }
    runs = [
        OrbitRun(fmt, mode, n, start, row)
        for row, (fmt, mode) in enumerate(map(str.split, labels[2:]), 2)
        for n, start in zip(sizes, starts, strict=True)
    ]
    references = [
        OrbitRun("fp64", "-", n, start, 0) for n, start in zip(sizes, starts, strict=True)
    ]
    growth = [0.0] * len(sizes)
    trace = np.empty((steps, len(labels), sum(sizes)), dtype=np.float32)
    for t in progress.track(range(steps), "lorenz96 orbits", steps):
        new = rk4(state, ring, ORBIT_DT)
        for row, label in enumerate(labels[2:], 2):
            fmt, mode = label.split()
            rand = words[fmt][t] if mode == "sr" else None  # None: round's default
            new[row] = rounding.round(new[row], fmt, mode, rand=rand)
        state = new
        if (t + 1) % LYAPUNOV_EVERY == 0:
            for k, (n, start) in enumerate(zip(sizes, starts, strict=True)):
                gap = state[1, start : start + n] - state[0, start : start + n]
                distance = float(gap.norm())
                growth[k] += math.log(distance / LYAPUNOV_DISTANCE)
                state[1, start : start + n] = state[0, start : start + n] + gap * (
                    LYAPUNOV_DISTANCE / distance
                )
        # the 8-bit values are exact in float32; fp64 states are hashed at full precision
        trace[t] = state.to(torch.float32).numpy()
        for run in runs:
            run.recurrence.add(trace[t, run.row, run.start : run.start + run.size].tobytes(), t)
        for run in references:
            run.recurrence.add(state[0, run.start : run.start + run.size].numpy().tobytes(), t)
    lyapunov = [g / ((steps // LYAPUNOV_EVERY) * LYAPUNOV_EVERY * ORBIT_DT) for g in growth]
    key: dict[str, float | int | str | bool] = {"orbit_steps": steps, "orbit_dt": ORBIT_DT}
    rows = []
    for k, n in enumerate(sizes):
        key[f"orbit_n{n}_lyapunov"] = lyapunov[k]
        seen = references[k].recurrence
        key[f"orbit_n{n}_fp64_revisits"] = seen.revisits
        first_cell = _repeat_cell(seen.first_repeat)
        cells = [str(seen.revisits), str(seen.longest_run), "-"]
        rows.append([str(n), "fp64", str(len(seen.last_seen)), first_cell, *cells])
    for run in sorted(runs, key=lambda run: (run.size, run.fmt, run.mode)):
        seen = run.recurrence
        name = f"orbit_{run.fmt}_n{run.size}_{run.mode}"
        if run.mode == "rne":
            periodic = seen.first_repeat is not None
            entry, period = seen.first_repeat if seen.first_repeat is not None else (-1, 0)
            # a deterministic map: every step after the first repeat repeats with its lag
            followed = steps - entry - period if periodic else 0
            if periodic and (seen.lag, seen.run) != (period, followed):
                raise RuntimeError(f"{name}: the rne run left its orbit")
        else:
            periodic = seen.follows_cycle
            period = seen.lag if periodic else 0
            entry = steps - seen.run - seen.lag if periodic else -1
            followed = seen.run if periodic else 0
        first = seen.first_repeat
        key[f"{name}_periodic"] = periodic
        key[f"{name}_period"] = period
        key[f"{name}_entry"] = entry
        key[f"{name}_followed_steps"] = followed
        key[f"{name}_first_repeat_step"] = -1 if first is None else first[0]
        key[f"{name}_first_repeat_lag"] = 0 if first is None else first[1]
        key[f"{name}_revisits"] = seen.revisits
        key[f"{name}_longest_run"] = seen.longest_run
        key[f"{name}_distinct_states"] = len(seen.last_seen)
        verdict = f"{period} from {entry}" if periodic else f"none in {steps} steps"
        rows.append(
            [
                str(run.size),
                f"{run.fmt} {run.mode}",
                str(len(seen.last_seen)),
                _repeat_cell(first),
                str(seen.revisits),
                str(seen.longest_run),
                verdict,
            ]
        )
    exponents = ", ".join(f"N = {n}: {value:.2f}" for n, value in zip(sizes, lyapunov, strict=True))
    table = Table(
        f"Lorenz-96 periodic orbits, F = {FORCING:g}, RK4 dt = {ORBIT_DT}, {steps} steps",
        [
            "N",
            "state",
            "distinct states",
            "first exact repeat (steps)",
            "revisits",
            "longest same-lag run",
            "periodic orbit (period, entered at step)",
        ],
        rows,
        [
            f"Largest Lyapunov exponent of the float64 runs (per time unit): {exponents}.",
            "rne: the first exact repeat of the whole state proves a periodic orbit (a "
            "deterministic map); every later step was checked to repeat it. SR: periodic "
            "only if the run's last steps followed a whole cycle again. Revisits: steps whose "
            "state had occurred before; longest same-lag run: the most consecutive steps "
            "that each repeated the state the same number of steps earlier. Period 1 is a "
            "fixed point of the rounded map (every increment below half an ulp).",
        ],
    )
    return key, table, runs, trace, lyapunov


def _repeat_cell(first: tuple[int, int] | None) -> str:
    return "none" if first is None else f"{first[0] + first[1]} = {first[0]}"


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    steps = 3000 if quick else 100_000
    sizes = (5, 6) if quick else (5, 6, 7, 8)
    orbit_steps = 6000 if quick else 100_000
    labels, key, table, x0, acf = climate(steps, seed, progress)
    orbit_key, orbit_table, runs, orbit_trace, _ = orbits(sizes, orbit_steps, seed, progress)
    key.update(orbit_key)
    figures = [
        _plot_climate(x0, acf, labels, out),
        _plot_orbits(runs, orbit_trace, sizes, orbit_steps, out),
    ]
    return Experiment(
        name="lorenz96",
        title="Lorenz-96 with a low-precision state",
        tables=[table, orbit_table],
        figures=figures,
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={
            "quick": quick,
            "seed": seed,
            "steps": steps,
            "dt": DT,
            "orbit_sizes": ",".join(map(str, sizes)),
            "orbit_steps": orbit_steps,
            "orbit_dt": ORBIT_DT,
        },
    )


def _style(label: str, row: int) -> tuple[str, str]:
    style = "-" if label.endswith("sr") or label == "fp64" else "--"
    return style, "k" if label == "fp64" else f"C{(row - 1) // 2}"


def _plot_climate(x0: torch.Tensor, acf: np.ndarray, labels: list[str], out: Path) -> Path:
    """Histogram of x_0 over the run and the autocorrelation of x_i, for each state."""
    figure, _ = new_figure(11, 4.2)
    figure.clear()
    histogram, correlation = figure.subplots(1, 2)
    bins = np.linspace(-12, 16, 57)
    lags = np.arange(MAX_LAG + 1) * DT
    for row, label in enumerate(labels):
        style, color = _style(label, row)
        counts, edges = np.histogram(x0[:, row].numpy(), bins=bins, density=True)
        histogram.step(edges[:-1], counts, where="post", linestyle=style, color=color, label=label)
        correlation.plot(lags, acf[:, row], linestyle=style, color=color, label=label)
    histogram.set_xlabel("x_0")
    histogram.set_ylabel("density")
    histogram.set_title("distribution of x_0 over the run")
    histogram.legend(fontsize=8)
    correlation.axhline(math.exp(-1), color="0.6", linewidth=0.8)
    correlation.axhline(0, color="0.8", linewidth=0.8)
    correlation.set_xlabel("lag (time units)")
    correlation.set_ylabel("autocorrelation of x_i")
    correlation.set_title(f"Lorenz-96, N = {VARIABLES}: autocorrelation (1/e line)")
    return save_figure(figure, out, "lorenz96")


def _plot_orbits(
    runs: list[OrbitRun], trace: np.ndarray, sizes: tuple[int, ...], steps: int, out: Path
) -> Path:
    """Orbit period against N (rne), and for the largest N whose e4m3fn rne orbit was followed
    for a whole period the distance of each step's state to the state one period earlier,
    rne against SR."""
    figure, _ = new_figure(11, 4.2)
    figure.clear()
    periods, distance = figure.subplots(1, 2)
    for f, fmt in enumerate(ORBIT_FORMATS):
        found = [
            (run.size, run.recurrence.first_repeat[1])
            for run in runs
            if run.fmt == fmt and run.mode == "rne" and run.recurrence.first_repeat
        ]
        if found:
            found_sizes, found_periods = zip(*found, strict=True)
            periods.plot(found_sizes, found_periods, "o-", color=f"C{f}", label=f"{fmt} rne")
            for size, length in found:
                periods.annotate(
                    str(length),
                    (size, length),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                    color=f"C{f}",
                )
    periods.set_yscale("log")
    periods.set_xticks(list(sizes))
    periods.set_xlabel("N (variables)")
    periods.set_ylabel("period of the rne orbit (steps)")
    sr_periodic = sum(run.mode == "sr" and run.recurrence.follows_cycle for run in runs)
    sr_total = sum(run.mode == "sr" for run in runs)
    periods.set_title(f"rne orbits; SR: {sr_periodic} of {sr_total} runs periodic in {steps} steps")
    periods.legend(fontsize=8)
    chosen = [
        run
        for run in runs
        if (run.fmt, run.mode) == (ORBIT_FORMATS[0], "rne") and run.recurrence.first_repeat
    ]
    if chosen:
        # the largest system whose orbit was followed for a whole period, if any
        whole = [run for run in chosen if run.recurrence.run >= run.recurrence.lag]
        rne = max(whole or chosen, key=lambda run: run.size)
        size = rne.size
        sr = next(run for run in runs if (run.fmt, run.size, run.mode) == (rne.fmt, size, "sr"))
        first = rne.recurrence.first_repeat
        assert first is not None  # the chosen runs repeated
        entry, period = first
        end = min(steps, entry + 3 * period)  # two periods after the lock at most
        steps_axis = np.arange(period, end) * ORBIT_DT
        for run, color, order in ((sr, "C1", 1), (rne, "C0", 2)):
            block = trace[:end, run.row, run.start : run.start + run.size]
            gap = np.abs(block[period:] - block[:-period]).max(axis=1)
            label = f"{run.fmt} {run.mode}"
            distance.plot(steps_axis, gap, color=color, linewidth=0.7, label=label, zorder=order)
        distance.axvline((entry + period) * ORBIT_DT, color="0.5", linestyle=":")
        distance.set_xlabel("time (time units)")
        distance.set_ylabel(f"max_i |x_i(t) - x_i(t - {period} steps)|")
        distance.set_title(f"N = {size}: rne locks onto its {period}-step orbit")
        distance.legend(fontsize=8)
    return save_figure(figure, out, "lorenz96_orbits")
