"""``stochround mca SCRIPT.py``: Monte Carlo arithmetic on a script's ``main()``: run it on
n samples with every floating ATen op rounded at random (`stochround.emulate.mca` with
``trace=True``: the n samples together, or with ``--serial`` n runs one after another; a
script that cannot be batched runs serially after a notice naming the op), then print the
time against one unrounded call of ``main()``, the significant digits of what it returns
and the call sites (lines of the script) that keep the fewest, and plot the digits of
every site.

The script is imported as a module (its top-level code runs once, unrounded: data set up
there is exact); only ``main()`` runs under the emulation.  Bad options, a missing script, a
script that cannot be imported or has no ``main()`` taking no arguments are bad-input exits
before ``main()`` runs; so are, after it, an exception ``main()`` raises (its type, message
and the script's line that raised it, `raised_at`), a ``sys.exit`` in it, and results
`stochround.emulate.mca.mca` cannot measure (a str, results that change from run to run):
one ``error: ...`` line and exit status 2, as every command's bad input.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import torch
import typer

from ..emulate.mca import (
    MCA_MODES,
    BatchingError,
    MCAResult,
    SiteDigits,
    mca,
    virtual_precision,
)
from ..emulate.mca_digits import ESTIMATORS
from ..experiments import report
from ..reference import MODES, check_choice, check_mode
from . import output
from .output import Section

MCA_EPILOG = (
    "Examples: stochround mca model.py --precision 11 ; "
    "stochround mca solver.py --format bfloat16 --n 64 --out mca-solver"
)
# the sites the table lists (the plot shows every site)
WORST_SITES = 15
# the sites the plot shows, worst first: a bar chart taller than this is not read
PLOTTED_SITES = 40
PLOT_NAME = "mca-sites"


@contextmanager
def script_folder_on_path(folder: Path) -> Iterator[None]:
    """The script's folder first on ``sys.path`` while it is imported, so that its own
    imports of modules beside it work as ``python SCRIPT.py`` would run them."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def load_main(script: Path) -> Callable[[], object]:
    """The ``main`` function of a Python file, imported as a module.

    Args:
        script: the file, as given.

    A path that is no ``.py`` file, a script whose import raises, or one without a
    ``main`` callable with no arguments is a bad-input exit naming SCRIPT and the reason.
    """
    if not script.is_file() or script.suffix != ".py":
        output.fail(f"SCRIPT must be a Python file (.py); {str(script)!r} is not one")
    name = f"stochround_mca_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        output.fail(f"SCRIPT {str(script)!r} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    # registered while it runs, as an imported module is (dataclasses, pickling look it up)
    sys.modules[name] = module
    try:
        with script_folder_on_path(script.resolve().parent):
            spec.loader.exec_module(module)
    except Exception as error:  # the script's own code: any error it raises
        output.fail(f"importing SCRIPT {str(script)!r} raised {type(error).__name__}: {error}")
    except SystemExit as error:  # sys.exit or argparse at the script's top level
        output.fail(f"importing SCRIPT {str(script)!r} called sys.exit({error.code!r})")
    finally:
        sys.modules.pop(name, None)
    main = getattr(module, "main", None)
    if not callable(main):
        output.fail(f"SCRIPT {str(script)!r} must define a function main() to run; it has none")
    try:
        inspect.signature(main).bind()
    except TypeError:
        output.fail(f"SCRIPT {str(script)!r}: main() must take no arguments")
    except ValueError:  # a callable without a signature (a builtin): called as it is
        pass
    return main


def checked_target(format_name: str | None, precision: int | None) -> str:
    """A description of the formats the options ask for, after checking that at most one
    of --format and --precision is given and that it is valid (a bad-input exit naming the
    option otherwise); neither: each dtype's own precision."""
    if format_name is not None and precision is not None:
        output.fail("give at most one of --format F (a format) and --precision T (bits)")
    if format_name is None and precision is None:
        return "each dtype's own precision (24 bits for float32, 53 for float64)"
    if precision is not None:
        formats = output.checked(lambda: virtual_precision(precision))
        dtypes = ", ".join(str(dtype).removeprefix("torch.") for dtype in formats)
        return f"a virtual precision of {precision} bits ({dtypes} results)"
    assert format_name is not None  # exactly one of the two is given (checked above)
    return output.checked_format(format_name).name


class MainFailed(Exception):
    """main() raised or called sys.exit during a run: the message says what and where."""


def raised_at(error: BaseException, script: Path) -> str:
    """Where ``error`` was raised, as a site ``file:line function`` (`short_site`): the
    innermost frame in the script's own file (the line its author wrote, also for an error
    raised inside torch or stochround by an op it called), else the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if Path(frame.filename).resolve() == script.resolve()]
    frame = (own or frames)[-1]
    return short_site(f"{frame.filename}:{frame.lineno} {frame.name}")


def guarded(main: Callable[[], object], script: Path) -> Callable[[], object]:
    """``main``, with what it raises (an exception, or ``SystemExit`` from ``sys.exit``)
    turned into a `MainFailed` naming the exception's type and message and `raised_at`.
    The wrapper keeps main's name, which `mca`'s own messages use (``main() returned ...``)."""

    @functools.wraps(main)
    def run() -> object:
        try:
            return main()
        except BatchingError:  # the batched run's refusal: the command runs serially
            raise
        except Exception as error:
            message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            where = raised_at(error, script)
            raise MainFailed(f"main() raised {message} (at {where})") from error
        except SystemExit as error:
            raise MainFailed(
                f"main() called sys.exit({error.code!r}) (at {raised_at(error, script)}); "
                "mca needs main() to return what it measures"
            ) from error

    return run


def short_site(site: str) -> str:
    """A site ``"file:line function"`` with the file relative to the working folder where
    it lies inside it."""
    location, _, function = site.rpartition(" ")
    path, _, line = location.rpartition(":")
    if not path:  # NO_PYTHON_FRAME
        return site
    relative = os.path.relpath(path)
    shown = path if relative.startswith("..") else relative
    return f"{shown}:{line} {function}"


def digits_text(value: float) -> str:
    """Significant digits, two decimals; "nan" where the outputs hold NaN, "exact" for inf
    (an integer or bool output that every run gave the same)."""
    if math.isinf(value):
        return "exact"
    return "nan" if math.isnan(value) else f"{value:.2f}"


def outputs_section(result: MCAResult, n: int) -> Section:
    """Per output of main(): its shape and its fewest significant digits, with the mean
    and std of the element that keeps them."""
    rows = []
    for label, mean, std, digits in zip(
        result.labels, result.mean, result.std, result.digits, strict=True
    ):
        flat = digits.flatten()
        if flat.numel() == 0:
            rows.append([label, str(tuple(mean.shape)), "-", "-", "-"])
            continue
        # NaN counts as the worst: the element a reader must look at
        worst = int(torch.where(flat.isnan(), -math.inf, flat).argmin())
        rows.append(
            [
                label,
                str(tuple(mean.shape)),
                digits_text(float(flat[worst])),
                f"{float(mean.flatten()[worst]):.6g}",
                f"{float(std.flatten()[worst]):.3g}",
            ]
        )
    notes = [
        f"digits = -log10(std / |mean|) over the {n} runs, elementwise, at most p log10 2 "
        "for the format of p bits the output's dtype was rounded to; mean and std are "
        "those of the element with the fewest digits."
    ]
    if any(bool(digits.isinf().any()) for digits in result.digits):
        notes.append(
            "exact: an integer or bool output that every run gave the same (no rounding "
            "touches it; one that varies has -log10(std / |mean|) digits, unclamped)."
        )
    return Section(
        "Significant digits of main()'s results",
        ["output", "shape", "min digits", "mean", "std"],
        rows,
        notes,
        left=("output",),
    )


def sites_section(sites: tuple[SiteDigits, ...], n: int) -> Section:
    """The call sites that keep the fewest digits, worst first."""
    shown = sites[:WORST_SITES]
    rows = [[short_site(s.site), str(s.calls), digits_text(s.digits)] for s in shown]
    notes = [
        f"{len(shown)} of {len(sites)} sites (the lines of the program that ran ATen ops); "
        f"calls: the ATen ops it ran in a run; min digits: the fewest significant digits of any "
        f"element of any of them across the {n} runs."
    ]
    return Section(
        "Where the digits are lost", ["site", "calls", "min digits"], rows, notes, ("site",)
    )


def plot_sites(sites: tuple[SiteDigits, ...], max_digits: float, out: Path) -> Path:
    """A horizontal bar per site (the `PLOTTED_SITES` worst, worst on top): its fewest
    significant digits, against the format's p log10 2; written to ``out``."""
    shown = sites[:PLOTTED_SITES]
    figure, axes = report.new_figure(8.0, 1.2 + 0.3 * max(len(shown), 1))
    labels = [short_site(s.site) for s in shown]
    values = [0.0 if math.isnan(s.digits) else s.digits for s in shown]
    axes.barh(range(len(shown)), values, color="tab:blue")
    axes.set_yticks(range(len(shown)), labels, fontsize=7)
    axes.invert_yaxis()
    axes.axvline(max_digits, color="tab:gray", linestyle="--")
    axes.set_xlabel("fewest significant digits across the runs (dashed: the format's p log10 2)")
    axes.set_title("Significant digits per call site (NaN shown as 0)")
    return report.save_figure(figure, out, PLOT_NAME)


def timed(run: Callable[[], object]) -> float:
    """Seconds ``run()`` takes, the accelerator's queued work included."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
    synchronize()
    start = time.perf_counter()
    run()
    synchronize()
    return time.perf_counter() - start


def max_digits_of(result: MCAResult) -> float:
    """The most digits any rounded result can keep: p log10 2 of the widest format."""
    return max(fmt.precision for fmt in result.formats.values()) * math.log10(2)


def mca_command(
    script: Annotated[
        Path, typer.Argument(metavar="SCRIPT.py", help="A Python file defining main().")
    ],
    format_name: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="F",
            help="Round every op to this format (bfloat16, e4m3fn, ...).",
            show_default=False,
        ),
    ] = None,
    precision: Annotated[
        int | None,
        typer.Option(
            "--precision",
            metavar="T",
            help="Or: a virtual precision of T significant bits, in each dtype's exponent range.",
            show_default=False,
        ),
    ] = None,
    mode_text: Annotated[
        str, typer.Option("--mode", help=f"Rounding mode: {', '.join(MODES)} (any case).")
    ] = "sr",
    mca_mode: Annotated[
        str,
        typer.Option(
            "--mca-mode",
            help=f"Verificarlo's mode: {', '.join(MCA_MODES)} (round outputs, inputs, both).",
        ),
    ] = "rr",
    estimator: Annotated[
        str,
        typer.Option(
            "--estimator",
            help=f"Significant digits: {', '.join(ESTIMATORS)} (cnh: 99% of samples, 95% "
            "confidence; bernoulli: 90%, 95%, n >= 29).",
        ),
    ] = "plain",
    n: Annotated[int, typer.Option("--n", help="Runs of main() (at least 2).")] = 32,
    seed: Annotated[
        str, typer.Option("--seed", metavar="SEED", help="Seed of the random roundings.")
    ] = "0",
    out: Annotated[
        Path, typer.Option(metavar="DIR", help="Folder for the plot (created if missing).")
    ] = Path("stochround-mca"),
    serial: Annotated[
        bool,
        typer.Option(
            "--serial",
            help="Run main() n times one after another (default: once, on the n samples "
            "together, falling back to --serial with a notice where it cannot).",
        ),
    ] = False,
) -> None:
    """Monte Carlo arithmetic on SCRIPT.py's main(): run it n times with every floating op
    rounded at random, print the significant digits of its results and the lines that lose
    the most, and plot the digits of every line."""
    # every option is checked before main() runs once
    target = checked_target(format_name, precision)
    mode = output.checked(lambda: check_mode(mode_text))
    output.checked(lambda: check_choice("--mca-mode", mca_mode, MCA_MODES))
    output.checked(lambda: check_choice("--estimator", estimator, ESTIMATORS))
    # the Bernoulli estimator's statement needs n >= 29 at 90%: the CLI asks for that
    probability = 0.9 if estimator == "bernoulli" else 0.99
    if n < 2:
        output.fail(f"--n must be an integer >= 2 (a std needs two runs); got {n}")
    checked_seed = output.parse_seed(seed)
    output.prepare_out(out)
    main = guarded(load_main(script), script)
    console = output.new_console()

    def measured(batched: bool) -> MCAResult:
        return mca(
            main,
            n=n,
            precision=precision,
            fmt=format_name,
            mode=mode,
            seed=checked_seed,
            trace=True,
            mca_mode=mca_mode,
            estimator=estimator,
            probability=probability,
            batched=batched,
        )

    found: list[MCAResult] = []
    try:
        alone = timed(main)  # once unrounded: the time the MCA is measured against
        try:
            took = timed(lambda: found.append(measured(not serial)))
        except BatchingError as error:
            console.print(
                f"notice: {error}; running main() {n} times one after another",
                markup=False,
                soft_wrap=True,
            )
            serial = True
            took = timed(lambda: found.append(measured(False)))
    except MainFailed as error:
        output.fail(str(error))
    except (TypeError, RuntimeError) as error:  # what main() returned: mca cannot measure it
        output.fail(str(error))
    except ValueError as error:  # too few runs for the Bernoulli estimator's statement
        output.fail(str(error).replace("n >=", "--n >=").replace("got n=", "got --n "))
    result = found[0]
    runs = f"run {n} times" if serial else f"run once on {n} samples together"
    console.print(
        f"{script}: main() {runs}, every op rounded to {target} with {mode} "
        f"(MCA mode {mca_mode}, digits by {estimator}), seed {checked_seed}",
        markup=False,
        soft_wrap=True,
    )
    console.print(
        f"time: main() alone {alone:.3g} s (one unrounded call, first), MCA {took:.3g} s "
        f"({took / max(alone, 1e-9):.3g}x)",
        markup=False,
        soft_wrap=True,
    )
    console.print()
    if result.labels:
        outputs_section(result, n).print(console)
    else:
        console.print("main() returned no tensors or numbers: only the sites are measured.")
        console.print()
    if not result.sites:
        console.print("main() ran no floating-point ATen op: there is no site to show.")
        return
    sites_section(result.sites, n).print(console)
    path = plot_sites(result.sites, max_digits_of(result), out)
    console.print(f"wrote {path}", markup=False, soft_wrap=True)
