"""``stochround demo`` (a few formats, one value under every mode, then the quick version of
every experiment, as one report) and ``stochround run NAME`` (the experiment suite)."""

import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from .. import experiments, outcomes, reference, rounding
from ..experiments import report
from ..formats import format as find_format
from . import output
from .formats import formats_section
from .output import Section

DEMO_FORMATS = ("bfloat16", "binary16", "e4m3fn", "e5m2", "e3m2", "e2m1", "p3109_k8p4se")
DEMO_VALUE = 1.3
DEMO_DRAWS = 20_000  # below torch's parallel grain size: no thread start-up per op


def signed_text(value: float) -> str:
    """A signed difference to 6 decimals, without a "-0.000000" for tiny negatives."""
    text = f"{value:+.6f}"
    return "+0.000000" if text == "-0.000000" else text


def demo_formats_section() -> Section:
    """The key numbers of the demo's formats."""
    return formats_section([find_format(name) for name in DEMO_FORMATS], "Some formats")


def demo_modes_section(x: float = DEMO_VALUE, fmt_name: str = "e4m3fn") -> Section:
    """One value rounded under every mode (and two few-bit SR variants): the result of one
    draw, the exact expectation and bias, and the mean of many draws."""
    fmt = find_format(fmt_name)
    cases: list[tuple[str, str, int | None, str]] = [
        (mode, mode, None, "c") for mode in reference.MODES
    ]
    cases += [("sr rbits=2 a", "sr", 2, "a"), ("sr rbits=2 c", "sr", 2, "c")]
    rows = []
    for label, mode, rbits, variant in cases:
        distribution = outcomes.outcomes(x, fmt, mode, rbits=rbits, variant=variant)
        options: dict[str, Any] = (
            {"rbits": rbits, "variant": variant, "seed": 0} if mode == "sr" else {}
        )
        one = rounding.round(torch.tensor([x], dtype=torch.float64), fmt, mode, **options)
        draws = rounding.round(
            torch.full((DEMO_DRAWS,), x, dtype=torch.float64), fmt, mode, **options
        )
        rows.append(
            [
                label,
                output.value_text(float(one.item())),
                f"{float(outcomes.mean(distribution)):.6f}",
                signed_text(float(outcomes.bias(x, distribution))),
                f"{float(draws.mean()):.6f}",
            ]
        )
    lower, upper = reference.neighbours(x, fmt)
    notes = [
        f"x = {x}; neighbours in {fmt.name}: {output.value_text(lower)} and "
        f"{output.value_text(upper)}. "
        "Exact SR is unbiased (E = x); deterministic modes and few-bit SR are not.",
    ]
    return Section(
        f"{x} rounded to {fmt.name} under every mode",
        ["mode", "one draw (seed 0)", "E[result]", "bias", f"mean of {DEMO_DRAWS} draws"],
        rows,
        notes,
        left=("mode",),
    )


def demo_sections() -> list[Section]:
    """The demo's introductory tables, before the experiments."""
    return [demo_formats_section(), demo_modes_section()]


def demo_command(
    out: Annotated[
        Path,
        typer.Option(help="Folder for report.md, results.json and PNG plots.", metavar="DIR"),
    ] = Path("stochround-demo"),
    seed: Annotated[int | None, typer.Option(help="Seed of inputs and random bits.")] = None,
) -> None:
    """The tour: a few formats, one value under every mode, then the quick version of every
    experiment, written to DIR as one report."""
    console = output.new_console()
    started = time.perf_counter()
    sections = demo_sections()
    for section in sections:
        section.print(console)
    seed = experiments.DEFAULT_SEED if seed is None else seed
    results = []
    for module in experiments.EXPERIMENTS.values():
        with report.progress_bar(console, enabled=console.is_terminal) as progress:
            result = module.run(True, seed, out, progress)
        report.print_experiment(result, console)
        results.append(result)
    preamble = "\n".join(section.markdown() for section in sections)
    json_path, report_path = report.write_results(results, out, "stochround demo", preamble)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)
    console.print(f"demo took {time.perf_counter() - started:.1f} s", markup=False)


def run_command(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="An experiment (stagnation, summation, ...) or all."),
    ],
    quick: Annotated[bool, typer.Option(help="Small sizes: seconds instead of minutes.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed of inputs and random bits.")] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for report.md, results.json and PNG plots.", metavar="DIR")
    ] = Path("stochround-report"),
) -> None:
    """Run experiments, print their tables, write report.md, results.json and plots to DIR."""
    suite = experiments.EXPERIMENTS
    if name != "all" and name not in suite:
        output.fail(f"NAME must be one of {', '.join([*suite, 'all'])}; got {name!r}")
    names = list(suite) if name == "all" else [name]
    seed = experiments.DEFAULT_SEED if seed is None else seed
    console = output.new_console()
    results = []
    for experiment_name in names:
        with report.progress_bar(console, enabled=console.is_terminal) as progress:
            result = suite[experiment_name].run(quick, seed, out, progress)
        report.print_experiment(result, console)
        results.append(result)
    json_path, report_path = report.write_results(results, out)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)
