"""Stagnation: small increments vanish under round-to-nearest and survive under SR.

(a) 1.0 + 0.001, added 1000 times, the accumulator held in bf16 and in fp16:
``s <- round(s + fp32(0.001))`` where the sum of the two operands is formed exactly (in
float64, which holds it: at most 35 significant bits) and rounded once to the format.
(b) The harmonic series ``s_n = round(s_{n-1} + fp32(1/n))``, held in bf16 and fp16.  It
*stagnates at n* when n is the first index with ``s_n == s_{n-1}``; since the terms
decrease, every later term is below half an ulp of the same sum too, so the sum never moves
again (under rne).

Random bits: run k of an SR accumulation (of ``runs``) draws, at step t, the 32-bit word at
index ``k * steps + t`` of the Philox stream ``(seed, offset = format index)``; the words
are drawn up front and passed as ``rand=``, so every step and every run gets its own word
and the result is a pure function of ``seed``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .. import random as streams
from .. import rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

FORMATS = ("bf16", "fp16")
START = 1.0
INCREMENT = 0.001
STEPS = 1000
RUNS = 20


def sr_words(runs: int, steps: int, seed: int, offset: int) -> torch.Tensor:
    """Words (runs, steps): run k, step t gets word k * steps + t of stream (seed, offset)."""
    return streams.random_words_like(torch.empty(runs, steps), seed, offset)


def accumulate(
    start: float,
    terms: torch.Tensor,
    fmt: str,
    mode: str,
    words: torch.Tensor | None,
    progress: ProgressLike,
    label: str,
) -> torch.Tensor:
    """All partial sums (runs, steps + 1): s_0 = start, s_t = round(s_{t-1} + terms[t-1]).

    ``terms`` are float64 tensors holding fp32 values; s_{t-1} + term is exact in float64
    for the magnitudes used here, so each step rounds the exact sum once, to ``fmt`` by
    ``mode``.  ``words`` (runs, steps): the SR words, passed as rand= (None: one rne run);
    ``progress`` reports the loop under ``label``.
    """
    runs = 1 if words is None else words.shape[0]
    sums = torch.empty(runs, terms.numel() + 1, dtype=torch.float64)
    s = torch.full((runs,), start, dtype=torch.float64)
    sums[:, 0] = s
    for t in progress.track(range(terms.numel()), label, terms.numel()):
        exact = s + terms[t]
        if words is None:
            s = rounding.round(exact, fmt, mode)
        else:
            s = rounding.round(exact, fmt, "sr", rand=words[:, t])
        sums[:, t + 1] = s
    return sums


def stagnation_index(sums: torch.Tensor) -> int | None:
    """The first n >= 1 with s_n == s_{n-1} (sums[0] is s_0), or None."""
    same = (sums[1:] == sums[:-1]).nonzero()
    return int(same[0]) + 1 if same.numel() else None


def harmonic_rne(fmt: str, limit: int, round_terms: bool) -> tuple[int | None, float, list[float]]:
    """Run the rne harmonic sum until it stagnates (or n = limit): (n, s_n, sums).

    round_terms: add the term rounded to the format first (rne) instead of the fp32 term.
    """
    s = torch.zeros(1, dtype=torch.float64)
    sums = [0.0]
    for n in range(1, limit + 1):
        term = torch.tensor([1.0 / n], dtype=torch.float32).double()
        if round_terms:
            term = rounding.round(term, fmt, "rne")
        new = rounding.round(s + term, fmt, "rne")
        if bool(new == s):
            return n, float(s), sums
        s = new
        sums.append(float(s))
    return None, float(s), sums


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    harmonic_terms = 2**12 if quick else 2**16
    key: dict[str, float | int | str | bool] = {}

    # (a) 1 + 0.001, 1000 times
    increment = torch.full((STEPS,), INCREMENT, dtype=torch.float32).double()
    expected = START + STEPS * float(increment[0])  # E[SR sum]: exact SR is unbiased
    rows_a = []
    curves_a = {}
    for index, fmt in enumerate(FORMATS):
        rne = accumulate(START, increment, fmt, "rne", None, progress, f"1+0.001 {fmt} rne")
        words = sr_words(RUNS, STEPS, seed, index)
        sr = accumulate(START, increment, fmt, "sr", words, progress, f"1+0.001 {fmt} sr")
        final = sr[:, -1]
        mean, std = float(final.mean()), float(final.std())
        key[f"add_{fmt}_rne"] = float(rne[0, -1])
        key[f"add_{fmt}_rne_stagnates_at"] = stagnation_index(rne[0]) or 0
        key[f"add_{fmt}_sr_mean"] = mean
        key[f"add_{fmt}_sr_std"] = std
        key[f"add_{fmt}_sr_min"] = float(final.min())
        key[f"add_{fmt}_sr_max"] = float(final.max())
        curves_a[fmt] = (rne[0], sr)
        rows_a.append(
            [
                fmt,
                repr(float(rne[0, -1])),
                f"{mean:.4f} ± {std:.4f}",
                f"{float(final.min()):.4f} .. {float(final.max()):.4f}",
                f"{std / math.sqrt(RUNS):.4f}",
            ]
        )
    key["add_expected"] = expected
    key["add_runs"] = RUNS
    table_a = Table(
        f"1.0 + 0.001, added {STEPS} times (exact: {expected:.7f})",
        ["accumulator", "rne", f"SR mean ± std ({RUNS} runs)", "SR min .. max", "std error"],
        rows_a,
        [
            "Each step rounds the exact sum s + fp32(0.001) once to the format. bf16 rne "
            "stagnates at 1.0: 0.001 is below half an ulp of 1 (2^-8).",
        ],
    )

    # (b) harmonic series
    rows_b = []
    curves_b = {}
    for index, fmt in enumerate(FORMATS):
        n_stag, s_stag, rne_sums = harmonic_rne(fmt, harmonic_terms, round_terms=False)
        n_rounded, s_rounded, _ = harmonic_rne(fmt, harmonic_terms, round_terms=True)
        terms = (1.0 / torch.arange(1, harmonic_terms + 1, dtype=torch.float64)).float().double()
        words = sr_words(RUNS, harmonic_terms, seed, len(FORMATS) + index)
        sr = accumulate(0.0, terms, fmt, "sr", words, progress, f"harmonic {fmt} sr")
        exact = float(terms.sum())
        final = sr[:, -1]
        key[f"harmonic_{fmt}_rne_n"] = n_stag or 0
        key[f"harmonic_{fmt}_rne_sum"] = s_stag
        key[f"harmonic_{fmt}_rne_n_rounded_terms"] = n_rounded or 0
        key[f"harmonic_{fmt}_rne_sum_rounded_terms"] = s_rounded
        key[f"harmonic_{fmt}_sr_mean"] = float(final.mean())
        key[f"harmonic_{fmt}_sr_std"] = float(final.std())
        key[f"harmonic_{fmt}_exact"] = exact
        curves_b[fmt] = (rne_sums, sr, terms.cumsum(0))
        rows_b.append(
            [
                fmt,
                str(n_stag),
                repr(s_stag),
                f"{n_rounded} / {s_rounded!r}",
                f"{float(final.mean()):.4f} ± {float(final.std()):.4f}",
                f"{exact:.4f}",
            ]
        )
    key["harmonic_terms"] = harmonic_terms
    table_b = Table(
        "Harmonic series under rne: where it stagnates",
        [
            "accumulator",
            "stagnates at n",
            "sum there",
            "same, terms rounded first",
            f"SR at n = {harmonic_terms} (mean ± std)",
            f"exact H_{harmonic_terms}",
        ],
        rows_b,
        [
            "n is the first index with s_n == s_{n-1}, where s_n = rne(s_{n-1} + fp32(1/n)); "
            "adding the term rounded to the format first gives the same n and sum.",
        ],
    )

    figures = [_plot_add(curves_a, out), _plot_harmonic(curves_b, harmonic_terms, out)]
    markdown = (
        "Small increments are lost under round-to-nearest once they fall below half an ulp "
        "of the accumulator; SR keeps them in expectation. Each step rounds the exact sum of "
        "the accumulator and an fp32 term once. SR runs draw one 32-bit Philox word per run "
        "and step (index run * steps + step of stream (seed, offset)), passed as rand=."
    )
    return Experiment(
        name="stagnation",
        title="Stagnation: 1 + 0.001 and the harmonic series",
        tables=[table_a, table_b],
        figures=figures,
        key_numbers=key,
        markdown=markdown,
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "runs": RUNS, "harmonic_terms": harmonic_terms},
    )


def _plot_add(curves, out: Path) -> Path:
    figure, axes = new_figure()
    steps = torch.arange(STEPS + 1)
    axes.plot(steps, START + INCREMENT * steps, "k:", label="exact")
    for (fmt, (rne, sr)), color in zip(curves.items(), ("C0", "C1"), strict=True):
        axes.plot(steps, rne, color=color, linestyle="--", label=f"{fmt} rne")
        mean, std = sr.mean(0), sr.std(0)
        axes.plot(steps, mean, color=color, label=f"{fmt} SR (mean of {sr.shape[0]})")
        axes.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
    axes.set_xlabel("step")
    axes.set_ylabel("accumulator")
    axes.set_title("1.0 + 0.001, added 1000 times")
    axes.legend()
    return save_figure(figure, out, "stagnation_add")


def _plot_harmonic(curves, terms: int, out: Path) -> Path:
    figure, axes = new_figure()
    n = torch.arange(terms + 1)
    exact = None
    for (fmt, (rne_sums, sr, exact_sums)), color in zip(curves.items(), ("C0", "C1"), strict=True):
        rne = torch.tensor(rne_sums + [rne_sums[-1]] * (terms + 1 - len(rne_sums)))
        axes.plot(n[1:], rne[1:], color=color, linestyle="--", label=f"{fmt} rne")
        mean, std = sr.mean(0), sr.std(0)
        axes.plot(n[1:], mean[1:], color=color, label=f"{fmt} SR (mean of {sr.shape[0]})")
        axes.fill_between(n[1:], (mean - std)[1:], (mean + std)[1:], color=color, alpha=0.2)
        exact = exact_sums
    assert exact is not None
    axes.plot(n[1:], exact, "k:", label="exact")
    axes.set_xscale("log")
    axes.set_xlabel("n")
    axes.set_ylabel("sum of 1/k, k = 1..n")
    axes.set_title("Harmonic series")
    axes.legend()
    return save_figure(figure, out, "stagnation_harmonic")
