"""``stochround demo`` (a few formats, one value under every mode, then the quick version of
every experiment, as one report) and ``stochround run NAME...`` (the experiment suite).

Both check every argument (names, --seed, --out) before the first experiment starts, so a
bad one costs no time and leaves no half-written report.
"""

import inspect
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console

from .. import experiments, outcomes, reference, rounding
from ..experiments import Experiment, report
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


SEED_HELP = "Seed of inputs and random bits: an integer in [0, 2**64)."
OUT_HELP = "Folder for report.md, results.json and PNG plots (created if missing)."


def seed_or_default(text: str | None) -> int:
    """The seed to run with.

    Args:
        text: the --seed option's text, or None where it was not given.

    Returns the suite's default seed for None, else the seed checked by
    `output.parse_seed` (an integer in [0, 2**64), or a bad-input exit).
    """
    return experiments.DEFAULT_SEED if text is None else output.parse_seed(text)


DEVICES = ("auto", "cpu", "cuda")
DEVICE_HELP = (
    "Where experiments that train models (lm) run: cpu, cuda, or auto (cuda for the full "
    "sizes where available, else cpu; the quick sizes on the cpu)."
)


def takes_device(function: Any) -> bool:
    """Whether an experiment's ``run`` takes a ``device`` argument."""
    return "device" in inspect.signature(function).parameters


def checked_device(text: str) -> str | None:
    """The --device option as ``run(device=...)`` takes it: None for "auto", else "cpu" or
    "cuda"; another value, or "cuda" without CUDA, is a bad-input exit."""
    if text not in DEVICES:
        output.fail(f"--device must be one of {', '.join(DEVICES)}; got {text!r}")
    if text == "cuda" and not torch.cuda.is_available():
        output.fail("--device cuda needs CUDA, and torch.cuda.is_available() is False here")
    return None if text == "auto" else text


def run_experiments(
    names: list[str],
    quick: bool,
    seed: int,
    out: Path,
    console: Console,
    device: str | None = None,
) -> list[Experiment]:
    """Run the named experiments in order, printing each one's tables as it finishes.

    Args:
        names: experiment names (keys of ``experiments.EXPERIMENTS``), already checked.
        quick: the small sizes.
        seed: the seed every experiment gets.
        out: the folder the experiments write their figures to (already created).
        console: where the progress bars and tables go.
        device: "cpu", "cuda" or None (each experiment's default), passed to the
            experiments whose ``run`` takes ``device``.

    Returns the experiments' results, in the order of ``names``.
    """
    results = []
    for name in names:
        module = experiments.EXPERIMENTS[name]
        options = {"device": device} if takes_device(module.run) else {}
        with report.progress_bar(console, enabled=console.is_terminal) as progress:
            result = module.run(quick, seed, out, progress, **options)
        report.print_experiment(result, console)
        results.append(result)
    return results


def demo_command(
    out: Annotated[Path, typer.Option(help=OUT_HELP, metavar="DIR")] = Path("stochround-demo"),
    seed: Annotated[
        str | None,
        typer.Option(
            "--seed",  # named: typer releases before 0.29 took the metavar for the name
            help=SEED_HELP,
            metavar="SEED",
            show_default=str(experiments.DEFAULT_SEED),
        ),
    ] = None,
) -> None:
    """The tour: a few formats, one value under every mode, then the quick version of every
    experiment, written to DIR as one report."""
    # every option is checked before the first table: no half-written report
    checked_seed = seed_or_default(seed)
    output.prepare_out(out)
    console = output.new_console()
    started = time.perf_counter()
    sections = demo_sections()
    for section in sections:
        section.print(console)
    results = run_experiments(list(experiments.EXPERIMENTS), True, checked_seed, out, console)
    preamble = "\n".join(section.markdown() for section in sections)
    json_path, report_path = report.write_results(results, out, "stochround demo", preamble)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)
    console.print(f"demo took {time.perf_counter() - started:.1f} s", markup=False)


def experiment_names(names: list[str]) -> list[str]:
    """The experiments to run, in the order given; ``all`` (alone) stands for every one.

    Args:
        names: the NAME arguments, as typed.

    An unknown name, a name given twice or ``all`` given with other names is a bad-input
    exit listing the known names, before any experiment runs.
    """
    known = [*experiments.EXPERIMENTS, "all"]
    unknown = [name for name in names if name not in known]
    if unknown:
        got = ", ".join(repr(name) for name in unknown)
        output.fail(f"NAME must be one of {', '.join(known)}; got {got}")
    if "all" in names:
        if len(names) > 1:
            output.fail("NAME all runs every experiment: give it alone")
        return list(experiments.EXPERIMENTS)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        output.fail(f"NAME: each experiment once; {', '.join(repeated)} given more than once")
    return names


def run_command(
    names: Annotated[
        list[str],
        typer.Argument(
            metavar="NAME",
            help="Experiments to run, in this order (stagnation, summation, ...), or all.",
            show_default=False,
        ),
    ],
    quick: Annotated[bool, typer.Option(help="Small sizes: seconds instead of minutes.")] = False,
    seed: Annotated[
        str | None,
        typer.Option(
            "--seed",  # named: typer releases before 0.29 took the metavar for the name
            help=SEED_HELP,
            metavar="SEED",
            show_default=str(experiments.DEFAULT_SEED),
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help=OUT_HELP, metavar="DIR")] = Path("stochround-report"),
    device: Annotated[
        str, typer.Option("--device", help=DEVICE_HELP, metavar="cpu|cuda|auto")
    ] = "auto",
) -> None:
    """Run experiments, print their tables, write report.md, results.json and plots to DIR
    (one report for all of them)."""
    # every argument is checked before the first experiment: no half-written report
    chosen = experiment_names(names)
    checked_seed = seed_or_default(seed)
    chosen_device = checked_device(device)
    output.prepare_out(out)
    console = output.new_console()
    results = run_experiments(chosen, quick, checked_seed, out, console, chosen_device)
    json_path, report_path = report.write_results(results, out)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)
