"""What every command shares: consoles, bad-input exits, titled tables and value rendering.

Bad input ends a command with the library's own message in red on stderr and exit status
2, never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

import typer
from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from .. import outcomes
from ..experiments import report
from ..formats import Format

EXIT_BAD_INPUT = 2

T = TypeVar("T")


def new_console(stderr: bool = False) -> Console:
    """A fresh console, so that the terminal width (COLUMNS) is read at each command."""
    return Console(stderr=stderr, highlight=False)


def fail(message: str) -> NoReturn:
    """Print a bad-input message in red on stderr and exit with status 2 (no traceback)."""
    new_console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def checked(action: Callable[[], T]) -> T:
    """Run ``action``; a ValueError or TypeError from the library becomes a bad-input exit."""
    try:
        return action()
    except (ValueError, TypeError) as error:
        fail(str(error))


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
