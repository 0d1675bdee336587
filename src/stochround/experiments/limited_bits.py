"""Bias of SR with few random bits: variants a, b, c and odd against rbits n = 1..12.

For a discarded fraction nu (in ulps) SR with n random bits rounds away with probability
P(nu) = count(nu 2**n) / 2**n, where count is floor for a, half-up for b, half-even for c
and half-odd for odd (variant a rounds away when floor(nu 2**n) + r >= 2**n for a random
integer r in [0, 2**n), the others likewise with their own rounding of nu 2**n), so the
expected rounding error is (P - nu) ulp: the bias.  It is computed exactly for every
nu = k / 2**16 (k = 0 .. 2**16 - 1) in integer arithmetic; sampled points are checked
against `reference.away_probability`, and for each format the library's `round` is run
with every random integer r in [0, 2**n) (rand=) on inputs v + nu ulp(v), so the
enumeration gives P(away) exactly and must match.
Expected bounds: a is biased toward zero by less than 2**-n ulp; b, c and odd by at most
2**-(n+1) ulp.  The bias depends on nu only, so it is the same in every format.
"""

from __future__ import annotations

import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from .. import reference, rounding
from ..formats import format as find_format
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

VARIANTS = ("a", "b", "c", "odd")
FORMATS = ("bf16", "e4m3fn", "e2m1")
GRID_BITS = 16
MAX_RBITS = 12


def counts(k: np.ndarray, n: int, variant: str) -> np.ndarray:
    """count(nu 2**n) for nu = k / 2**GRID_BITS, exactly in integers (n <= GRID_BITS)."""
    shift = GRID_BITS - n
    floor = k >> shift
    if shift == 0:
        return floor
    rem = k & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if variant == "a":
        return floor
    if variant == "b":
        return floor + (rem >= half)
    tie_up = (floor % 2 == 1) if variant == "c" else (floor % 2 == 0)
    return floor + ((rem > half) | ((rem == half) & tie_up))


def bias_numerators(n: int, variant: str) -> np.ndarray:
    """(P(away) - nu) * 2**GRID_BITS for every grid nu: integers."""
    k = np.arange(2**GRID_BITS, dtype=np.int64)
    return counts(k, n, variant) * (1 << (GRID_BITS - n)) - k


def bound(n: int, variant: str) -> Fraction:
    return Fraction(1, 2**n) if variant == "a" else Fraction(1, 2 ** (n + 1))


def enumerate_format(fmt_name: str, n: int, variant: str, nus: list[int]) -> list[Fraction]:
    """P(away) for inputs v + nu ulp(v) (nu = k / 2**GRID_BITS for each k in ``nus``), by
    rounding to format ``fmt_name`` with every r in [0, 2**n), variant ``variant``."""
    fmt = find_format(fmt_name)
    v = 1.0 if fmt.max > 2 else fmt.min_normal  # a value with a normal ulp above it
    lower, upper = reference.neighbours(v * (1 + 1e-9), fmt)
    ulp = upper - lower
    x = torch.tensor([v + k / 2**GRID_BITS * ulp for k in nus], dtype=torch.float64)
    r = torch.arange(2**n, dtype=torch.int64)
    grid_x = x[:, None].expand(len(nus), 2**n)
    grid_r = r[None, :].expand(len(nus), 2**n)
    rounded = rounding.round(grid_x, fmt, "sr", rbits=n, variant=variant, rand=grid_r)
    away = (rounded > torch.tensor(v, dtype=torch.float64)).sum(1)
    return [Fraction(int(a), 2**n) for a in away]


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    rbits = list(range(1, MAX_RBITS + 1))
    key: dict[str, float | int | str | bool] = {}
    max_bias: dict[str, list[float]] = {v: [] for v in VARIANTS}
    rows = []
    bounds_hold = True
    for variant in VARIANTS:
        for n in progress.track(rbits, f"bias {variant}", len(rbits)):
            numerators = bias_numerators(n, variant)
            worst = Fraction(int(np.abs(numerators).max()), 2**GRID_BITS)
            mean = Fraction(int(numerators.sum()), 2 ** (2 * GRID_BITS))
            limit = bound(n, variant)
            holds = worst < limit if variant == "a" else worst <= limit
            if variant == "a":
                holds = holds and bool((numerators <= 0).all())
            bounds_hold = bounds_hold and holds
            key[f"{variant}_n{n}_max_abs_bias"] = float(worst)
            key[f"{variant}_n{n}_mean_bias"] = float(mean)
            max_bias[variant].append(float(worst))
            rows.append(
                [variant, str(n), str(worst), f"{float(mean):+.3e}", str(limit), str(holds)]
            )
    key["bounds_hold"] = bounds_hold

    # reference and library agreement
    step = 4099 if quick else 257
    sample = [*range(0, 2**GRID_BITS, step), 2**15, 2**14, 2**GRID_BITS - 1]
    reference_agrees = all(
        reference.away_probability(Fraction(k, 2**GRID_BITS), n, variant)
        == Fraction(int(counts(np.array([k]), n, variant)[0]), 2**n)
        for variant in VARIANTS
        for n in rbits
        for k in sample
    )
    key["reference_agrees"] = reference_agrees
    format_rows = []
    enumeration_agrees = True
    enum_bits = range(1, 7) if quick else rbits
    for fmt in FORMATS:
        agrees = True
        for variant in VARIANTS:
            for n in enum_bits:
                expected = [Fraction(int(c), 2**n) for c in counts(np.array(sample), n, variant)]
                agrees = agrees and enumerate_format(fmt, n, variant, sample) == expected
        key[f"{fmt}_enumeration_agrees"] = agrees
        enumeration_agrees = enumeration_agrees and agrees
        format_rows.append([fmt, f"1..{max(enum_bits)}", str(len(sample)), str(agrees)])
    key["enumeration_agrees"] = enumeration_agrees

    table = Table(
        f"Bias of limited-bit SR over nu = k / 2^{GRID_BITS} (in ulps)",
        ["variant", "rbits n", "max |bias|", "mean bias", "bound", "bound holds"],
        rows,
        [
            "bound: a < 2^-n (and never away from zero on average: bias <= 0); b, c, odd <= "
            "2^-(n+1)."
        ],
    )
    format_table = Table(
        "P(away) by enumerating every r with the library's round, per format",
        ["format", "rbits", "fractions checked", "matches the closed form"],
        format_rows,
    )
    figure = _plot(rbits, max_bias, out)
    return Experiment(
        name="limited-bits",
        title="Bias of SR with few random bits",
        tables=[table, format_table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "grid": f"k/2^{GRID_BITS}", "enumerated_rbits": max(enum_bits)},
    )


def _plot(rbits: list[int], max_bias: dict[str, list[float]], out: Path) -> Path:
    figure, axes = new_figure()
    for variant, marker in zip(VARIANTS, "os^v", strict=True):
        axes.plot(rbits, max_bias[variant], marker=marker, label=f"variant {variant}")
    n = np.array(rbits, dtype=float)
    axes.plot(n, 2.0**-n, "k:", label="2^-n")
    axes.plot(n, 2.0 ** -(n + 1), "k--", label="2^-(n+1)")
    axes.set_yscale("log", base=2)
    axes.set_xlabel("random bits n")
    axes.set_ylabel("max |bias| (ulp)")
    axes.set_title("Limited-bit SR: worst-case bias")
    axes.legend()
    return save_figure(figure, out, "limited_bits")
