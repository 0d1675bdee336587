"""Shared helpers of the experiment suite: the result of one experiment, and writing it out.

An experiment module exposes ``run(quick, seed, out, progress) -> Experiment``.  Its tables
are printed with rich and written, with its key numbers, to ``out/results.json`` and
``out/report.md``; its plots are PNG files in ``out`` (matplotlib, Agg backend).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable
from rich.text import Text

KeyNumber = float | int | str | bool

T = TypeVar("T")


def number(key_numbers: Mapping[str, KeyNumber], name: str) -> float:
    """The key number ``name``, one an experiment stored as a number (a float, int or bool)."""
    value = key_numbers[name]
    assert not isinstance(value, str)  # the caller names a numeric key number
    return value


def markdown_table(
    heading: str, columns: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]
) -> str:
    """A Markdown heading, a pipe table (| in cells escaped) and its notes as lines."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [heading, ""]
    lines.append("| " + " | ".join(cell(c) for c in columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    if notes:
        lines.append("")
        lines += [f"{note}  " for note in notes]
    return "\n".join(lines) + "\n"


@dataclass
class Table:
    """A titled table: column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def rich(self) -> RichTable:
        table = RichTable(title=self.title, box=box.SIMPLE_HEAD, title_justify="left")
        for index, column in enumerate(self.columns):
            table.add_column(Text(column), justify="left" if index == 0 else "right")
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))
        return table

    def markdown(self) -> str:
        return markdown_table(f"### {self.title}", self.columns, self.rows, self.notes)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows}


@dataclass
class Experiment:
    """What one experiment found: tables, PNG figures, key numbers and a Markdown section."""

    name: str
    title: str
    tables: list[Table]
    figures: list[Path]
    key_numbers: dict[str, KeyNumber]
    markdown: str = ""  # the prose of the section: what was computed and how
    seconds: float = 0.0
    settings: dict[str, KeyNumber] = field(default_factory=dict)

    def section(self) -> str:
        """The experiment's section of report.md."""
        parts = [f"## {self.title}", ""]
        if self.markdown:
            parts += [self.markdown.strip(), ""]
        if self.settings:
            settings = ", ".join(f"{k} = {v}" for k, v in self.settings.items())
            parts += [f"Settings: {settings}; took {self.seconds:.1f} s.", ""]
        parts += [table.markdown() for table in self.tables]
        parts += [f"![{figure.stem}]({figure.name})\n" for figure in self.figures]
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "seconds": self.seconds,
            "settings": self.settings,
            "key_numbers": {k: _json_number(v) for k, v in self.key_numbers.items()},
            "tables": [table.to_json() for table in self.tables],
            "figures": [figure.name for figure in self.figures],
        }


def _json_number(value: KeyNumber) -> KeyNumber | None:
    """JSON has no inf/NaN: those become their repr (a string)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def print_experiment(experiment: Experiment, console: Console) -> None:
    console.rule(Text(experiment.title))
    for table in experiment.tables:
        console.print(table.rich())
        for note in table.notes:
            console.print(note, markup=False, soft_wrap=True)
        console.print()
    for figure in experiment.figures:
        console.print(f"figure: {figure}", markup=False, soft_wrap=True)
    console.print(f"{experiment.name} took {experiment.seconds:.1f} s", markup=False)


def write_results(
    experiments: Sequence[Experiment],
    out: Path,
    title: str = "stochround experiments",
    preamble: str = "",
) -> tuple[Path, Path]:
    """Write the ``experiments`` to ``out/results.json`` (key numbers and tables) and
    ``out/report.md`` (``# title``, then ``preamble``, then each experiment's section)."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    payload = {experiment.name: experiment.to_json() for experiment in experiments}
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    report_path = out / "report.md"
    body = "\n".join(experiment.section() for experiment in experiments)
    head = f"# {title}\n\n" + (f"{preamble.strip()}\n\n" if preamble.strip() else "")
    report_path.write_text(head + body, encoding="utf-8")
    return json_path, report_path


def new_figure(width: float = 6.4, height: float = 4.2, columns: int = 1):
    """A matplotlib figure (``width`` x ``height`` inches) and its axes (an array of
    ``columns`` side by side where ``columns`` > 1) on the Agg backend (no display
    needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(width, height))


def save_figure(figure, out: Path, name: str) -> Path:
    """Save as ``out/name.png`` and close the figure."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# --------------------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------------------


class ProgressLike(Protocol):
    def track(self, items: Iterable[T], description: str, total: int) -> Iterable[T]: ...


class NoProgress:
    """A progress reporter that shows nothing (tests, non-interactive use)."""

    def track(self, items: Iterable[T], description: str, total: int) -> Iterable[T]:
        return items


class RichProgress:
    """A rich progress bar per loop; ``track`` yields the items and advances the bar."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def track(self, items: Iterable[T], description: str, total: int) -> Iterator[T]:
        task = self._progress.add_task(description, total=total)
        for item in items:
            yield item
            self._progress.advance(task)
        self._progress.update(task, visible=False)


@contextmanager
def progress_bar(console: Console, enabled: bool = True) -> Iterator[ProgressLike]:
    """A RichProgress on ``console`` for the duration of the block (NoProgress unless
    ``enabled``)."""
    if not enabled:
        yield NoProgress()
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        yield RichProgress(progress)


def fmt_float(value: float, digits: int = 6) -> str:
    return f"{value:.{digits}g}"
