"""The ``stochround`` command: the format registry, one format in detail, one value rounded
(with the exact probability of each neighbour), the hardware SR units, the experiments, a
short demo, Monte Carlo arithmetic on a script (``stochround mca``), and torchtitan
training under a recipe (``stochround titan``, the ``torchtitan`` extra).

Each command lives in its own module and holds no numerics of its own: every number it
prints about a format or a probability comes from the scalar reference (through
`stochround.outcomes`, exact fractions), and every drawn result from the public `round`.
Bad input gets one line, ``error: ...`` (the library's own ValueError message, or one
naming the option and what it accepts), and exit status 2, never a traceback;
``stochround --version`` prints the version.  ``python -m stochround`` runs the same app.
"""

from typing import Annotated

import typer

from ..version import __version__
from .experiments import demo_command, run_command
from .formats import formats_command, info_command
from .hardware import HARDWARE_EPILOG, hardware_command
from .mca import MCA_EPILOG, mca_command
from .round import ROUND_CONTEXT, ROUND_EPILOG, round_command
from .titan import TITAN_EPILOG, titan_command

app = typer.Typer(
    name="stochround",
    help=(
        "Stochastic rounding and low-precision number formats: inspect formats, round a "
        "value and see the exact probability of each neighbour (under a mode or a hardware "
        "SR unit), run the demo."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def print_version(value: bool) -> None:
    """The ``--version`` callback.

    Args:
        value: whether --version was given; if so, print ``stochround VERSION`` and exit
            with status 0 before any command runs (the option is eager).
    """
    if value:
        print(f"stochround {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """The options before the command.

    Args:
        version: --version, handled by its callback (`print_version`).
    """


# Registration order is the order `stochround --help` lists the commands in.
app.command("formats")(formats_command)
app.command("info")(info_command)
app.command("round", context_settings=ROUND_CONTEXT, epilog=ROUND_EPILOG)(round_command)
app.command("hardware", epilog=HARDWARE_EPILOG)(hardware_command)
app.command("demo")(demo_command)
# `stochround run` alone shows its help, as `stochround` alone does
app.command("run", no_args_is_help=True)(run_command)
app.command("mca", no_args_is_help=True, epilog=MCA_EPILOG)(mca_command)
app.command("titan", epilog=TITAN_EPILOG)(titan_command)

__all__ = ["app"]
