"""What every command shares: consoles, bad-input exits, titled tables and value rendering.

Bad input ends a command with the library's own message in red on stderr and exit status
2, never a traceback.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from .. import outcomes
from ..blocks.formats import BLOCK_FORMATS, BlockFormat
from ..experiments import report
from ..formats import Format
from ..formats import format as find_format

EXIT_BAD_INPUT = 2
# Every seed the library's random streams take: torch.Generator's range too.
SEED_LIMIT = 2**64
SEED_RANGE = f"an integer in [0, 2**64) (0 to {SEED_LIMIT - 1})"

T = TypeVar("T")


def new_console(stderr: bool = False) -> Console:
    """A fresh console, so that the terminal width (COLUMNS) is read at each command."""
    return Console(stderr=stderr, highlight=False)


def fail(message: str) -> NoReturn:
    """Print a bad-input message in red on stderr and exit with status 2 (no traceback)."""
    new_console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def note(message: str) -> None:
    """Print a note on stderr (e.g. an option that has no effect in this run); the command
    goes on."""
    new_console(stderr=True).print(Text(f"note: {message}", style="yellow"), soft_wrap=True)


def checked(action: Callable[[], T]) -> T:
    """Run ``action``; a ValueError or TypeError from the library becomes a bad-input exit."""
    try:
        return action()
    except (ValueError, TypeError) as error:
        fail(str(error))


def block_format_message(block: BlockFormat, option: str) -> str:
    """Why ``option`` cannot take the block format ``block``, and what to pass instead.

    A value rounded in a block format is its element format's value times its block's
    shared scale, which comes from the block's largest magnitude: a lone value (or each op
    output, for mca) has no block, so its rounding is not defined by the name alone.  The
    message names the element format, which is what a value with scale 1 rounds to."""
    scale = block.scale.name if block.scale is not None else "no"
    size = "row" if block.block_size is None else f"{block.block_size} elements"
    shared = f"{block.element.name} elements, one {scale} scale per {size}"
    try:
        element = find_format(block.element.name).name
    except ValueError:  # mxint8's element grid (ocp_int8) has no registered name
        element = None
    instead = (
        f"to round to its elements pass {option} {element}, and see "
        if element is not None
        else "its element grid has no format name here: see "
    )
    return (
        f"{option} {block.name} is a block format ({shared}): a value's rounding in it "
        f"depends on its block's scale, which one value does not have; {instead}"
        f"stochround info {block.name}"
    )


def checked_format(name: str, option: str = "--format") -> Format:
    """The scalar format ``name`` names (a name or alias, any case); a block format (mxfp4,
    nvfp4, ...) or an unknown name is a bad-input exit (`block_format_message`, or the
    library's message)."""
    block = BLOCK_FORMATS.get(name.strip().lower())
    if block is not None:
        fail(block_format_message(block, option))
    return checked(lambda: find_format(name))


def parse_seed(text: str, option: str = "--seed") -> int:
    """The seed given as ``text`` (decimal digits; ``_`` between them allowed, as in Python).

    Args:
        text: the option's text, as typed.
        option: the option's name, for the error message.

    Every command takes the seeds the library's streams take, [0, 2**64): anything else
    (a negative number, 2**64 or more, text that is no integer) is a bad-input exit naming
    the option and that range, before any work starts.
    """
    try:
        seed = int(text)
    except ValueError:
        fail(f"{option} must be {SEED_RANGE}; got {text!r}")
    if not 0 <= seed < SEED_LIMIT:
        fail(f"{option} must be {SEED_RANGE}; got {seed}")
    return seed


def prepare_out(out: Path, option: str = "--out") -> Path:
    """Create the output folder ``out`` (and its parents) and check that files can be
    written in it, so that a bad folder fails before minutes of experiments, not after.

    Args:
        out: the folder, as given.
        option: the option's name, for the error message.

    Returns ``out``.  A path that is a file, lies under a file, or where the folder or a
    file in it cannot be created (permissions, a read-only or pseudo file system) is a
    bad-input exit naming the option and the reason the system gave.
    """
    if out.exists() and not out.is_dir():
        fail(f"{option} must be a folder (existing or new); {str(out)!r} is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a probe file: the only check that holds for every kind of file system and user
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        fail(
            f"{option} must be a folder that can be created and written to; {str(out)!r}: {reason}"
        )
    return out


@dataclass
class Section:
    """A titled table with notes, rendered both as a rich table and as Markdown.

    ``groups`` (lists of headers) splits a table too wide for the terminal into several,
    each repeating the first (key) column.
    """

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    left: tuple[str, ...] = ()
    groups: list[list[str]] = field(default_factory=list)

    def rich_table(self, headers: Sequence[str] | None = None, title: str | None = None) -> Table:
        """The table (or only the given columns of it), left-justifying the ``left`` ones."""
        headers = list(self.headers if headers is None else headers)
        columns = [self.headers.index(header) for header in headers]
        table = Table(
            title=self.title if title is None else title,
            box=box.SIMPLE_HEAD,
            title_justify="left",
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for header in headers:
            justify: JustifyMethod = "left" if header in self.left else "right"
            table.add_column(Text(header), justify=justify, overflow="fold")
        for row in self.rows:  # Text: cells are plain text, never rich markup
            table.add_row(*(Text(row[column]) for column in columns))
        return table

    def print(self, console: Console) -> None:
        """The table (split into its groups where it is wider than the terminal), its notes
        and a blank line."""
        table = self.rich_table()
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        if self.groups and natural > console.width:
            for index, group in enumerate(self.groups):
                title = f"{self.title} ({index + 1}/{len(self.groups)})"
                console.print(self.rich_table([self.headers[0], *group], title))
        else:
            console.print(table)
        for note in self.notes:
            console.print(note, soft_wrap=True, markup=False)
        console.print()

    def markdown(self) -> str:
        """The section as a Markdown heading, pipe table and notes."""
        return report.markdown_table(f"## {self.title}", self.headers, self.rows, self.notes)


def value_text(value: float) -> str:
    """A format value, exactly: Python's shortest round-trip repr (1.0, -0.0, inf, nan)."""
    return repr(float(value))


def number_text(value: float) -> str:
    """A compact rendering for tables: small integers as such, powers of two as 2^k."""
    if math.isnan(value) or math.isinf(value):
        return repr(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    mantissa, exponent = math.frexp(abs(value))
    if mantissa == 0.5:
        return f"{'-' if value < 0 else ''}2^{exponent - 1}"
    return f"{value:.4g}"


def hex_code(code: int, fmt: Format) -> str:
    """A bit pattern in hex, one digit per four bits of the format (0x3c for e4m3fn)."""
    return f"0x{code:0{(fmt.bits + 3) // 4}x}"


def code_text(value: float, fmt: Format) -> str:
    """The bit pattern of a value of the format, in hex (or why there is none)."""
    code = outcomes.code_of(value, fmt)
    if code is None:
        return "(no NaN code)" if math.isnan(value) else "(no inf code)"
    return hex_code(code, fmt)
