"""Bias of documented hardware SR units against exact SR (`stochround.hardware` presets).

For each preset, ``hardware.bias_against_exact`` gives E[unit(x)] - x in ulps of the
target at x, exactly (every random integer enumerated when rbits <= 16, the closed form
above).  The inputs are values of the preset's source format (the instruction's operand,
so the source rounding does not count): fp32 values with random significands, log-uniform
over the target's normal range (both signs), and a second set in its subnormal range.
A unit adding n random bits to d discarded bits (variant a) is exact SR when n >= d and
is otherwise biased toward zero by less than 2**-n ulp; for fp32 operands d = 23 - mbits
in the normal range and more in the subnormal range.  Presets documented (``exact_domain``)
as exact SR there must show zero bias on the normal grid.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .. import hardware, rounding
from .report import Experiment, ProgressLike, Table, new_figure, save_figure


def documented_exact(p: hardware.HardwarePreset) -> bool:
    """The preset's exact_domain says it is exact SR (on normal results, at least)."""
    return "exact SR" in p.exact_domain


def grids(
    p: hardware.HardwarePreset, count: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normal, subnormal) inputs: source-format values log-uniform over the target's normal
    range [min_normal, max / 2] and over [min_subnormal, min_normal), random signs:
    ``count`` values each for preset ``p``, drawn from ``generator``."""
    target = p.target

    def log_uniform(low: float, high: float) -> torch.Tensor:
        exponent = torch.rand(count, generator=generator, dtype=torch.float64)
        values = torch.exp2(math.log2(low) + exponent * (math.log2(high) - math.log2(low)))
        signs = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
        return rounding.round(values * signs, p.source_format, "rne")

    normal = log_uniform(target.min_normal, target.max / 2)
    subnormal = log_uniform(target.min_subnormal, target.min_normal * 0.999)
    return normal, subnormal


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    count = 32 if quick else 512
    generator = torch.Generator().manual_seed(seed)
    key: dict[str, float | int | str | bool] = {}
    rows = []
    worst: dict[str, tuple[float, float]] = {}
    names = list(hardware.PRESETS)
    for name in progress.track(names, "hardware presets", len(names)):
        p = hardware.PRESETS[name]
        normal, subnormal = grids(p, count, generator)
        bias_normal = hardware.bias_against_exact(p, normal)
        bias_subnormal = hardware.bias_against_exact(p, subnormal)
        # bias is signed with x; -bias * sign(x) > 0 means toward zero
        toward_zero = -(bias_normal * normal.sign())
        dropped = p.operand.mbits - p.target.mbits
        exact = documented_exact(p)
        max_normal = float(bias_normal.abs().max())
        key[f"{name}_max_abs_bias_normal"] = max_normal
        key[f"{name}_mean_bias_toward_zero_normal"] = float(toward_zero.mean())
        key[f"{name}_max_abs_bias_subnormal"] = float(bias_subnormal.abs().max())
        key[f"{name}_documented_exact"] = exact
        worst[name] = (max_normal, float(bias_subnormal.abs().max()))
        rows.append(
            [
                name,
                f"{p.source_format}->{p.target_format}",
                f"{p.rbits} / {dropped}",
                f"{max_normal:.3g}",
                f"{float(toward_zero.mean()):.3g}",
                f"{float(bias_subnormal.abs().max()):.3g}",
                f"{2.0**-p.rbits:.3g}",
                "yes" if exact else "no",
            ]
        )
    key["inputs_per_grid"] = count
    table = Table(
        "Hardware SR units: bias against exact SR (ulps of the target)",
        [
            "preset",
            "operand -> target",
            "rbits / discarded bits",
            "max |bias| (normal)",
            "mean bias toward 0 (normal)",
            "max |bias| (subnormal)",
            "2^-rbits",
            "documented exact SR",
        ],
        rows,
        [
            f"{count} operand values per grid, log-uniform with random signs. Bias is "
            "E[unit(x)] - x exactly (enumerated or closed form), in ulps of the target at x.",
        ],
    )
    figure = _plot(worst, out)
    return Experiment(
        name="hardware-units",
        title="Hardware SR units against exact SR",
        tables=[table],
        figures=[figure],
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={"quick": quick, "seed": seed, "inputs_per_grid": count},
    )


def _plot(worst: dict[str, tuple[float, float]], out: Path) -> Path:
    """Horizontal bars of the worst |bias| per preset, normal and subnormal results; a zero
    bias is labelled "0" at the left edge of the log axis."""
    import numpy as np

    figure, axes = new_figure(7.5, 5.0)
    names = list(worst)
    floor = 2.0**-30
    positions = np.arange(len(names))
    for column, (label, color, shift) in enumerate(
        (("normal results", "C0", -0.2), ("subnormal results", "C1", 0.2))
    ):
        values = [worst[name][column] for name in names]
        axes.barh(positions + shift, [max(v, floor) for v in values], 0.4, color=color, label=label)
        for position, value in zip(positions, values, strict=True):
            if value == 0:
                axes.text(floor * 1.3, position + shift, "0", va="center", fontsize=6)
    axes.set_yticks(positions, names)
    axes.set_xscale("log", base=2)
    axes.set_xlim(left=floor)
    axes.invert_yaxis()
    axes.tick_params(axis="y", labelsize=7)
    axes.set_xlabel("max |bias| against exact SR (ulp)")
    axes.set_title("Hardware SR presets: worst bias against exact SR")
    axes.legend(fontsize=7, loc="lower right")
    return save_figure(figure, out, "hardware_units")
