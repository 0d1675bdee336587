"""Judge the benchmarks' rows against ``targets.toml``: PASS, FAIL, N/A or INFO.

Reads the rows (`rows.Row`) of every CSV file of a folder (by default
``benchmarks/results``, the committed current figures; a run's own folder judges that
run), judges each target of ``targets.toml`` (its header says how) on each machine whose
rows hold the target's benchmark, and adds one line per benchmark and machine: every
stochround row ran and passed its output check. Prints a table; exit status 1 if any line
is FAIL. `report.py` puts the same lines into RESULTS.md.

    python benchmarks/check.py                    # the committed rows
    python benchmarks/check.py out/gpu/rows       # one run's rows
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rows import RESULTS, Row, elements, read_folder

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TARGETS = Path(__file__).with_name("targets.toml")
BOUNDS = {
    "min": lambda value, limit: value >= limit,
    "above": lambda value, limit: value > limit,
    "max": lambda value, limit: value <= limit,
}
STYLES = {"PASS": "green", "FAIL": "red", "N/A": "yellow", "INFO": "cyan"}


@dataclass
class Measured:
    """One provider's figures on one case (a row of a script's table)."""

    ours: bool
    check: str
    elements: int
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def median_us(self) -> float:
        return self.metrics.get("median_us", math.nan)

    @property
    def ok(self) -> bool:
        """Whether it ran and passed its check (a failed row's median is NaN)."""
        return not math.isnan(self.median_us)

    def per_element(self) -> float:
        return self.median_us / (self.elements or 1)


@dataclass
class Group:
    """A benchmark's rows on one machine, by "case/provider" (where a case/provider has
    rows of several shapes, the file's last)."""

    bench: str
    machine: str
    device: str
    found: dict[str, Measured] = field(default_factory=dict)
    # every shape's rows, by ("case/provider", shape): targets that name a shape
    shaped: dict[tuple[str, str], Measured] = field(default_factory=dict)


def groups(rows: Iterable[Row]) -> dict[tuple[str, str], Group]:
    """The rows by (bench, machine), in the order of their first rows."""
    found: dict[tuple[str, str], Group] = {}
    shapes: dict[tuple[str, str, str], str] = {}
    for row in rows:
        group = found.setdefault(
            (row.bench, row.machine), Group(row.bench, row.machine, row.device)
        )
        key = f"{row.case}/{row.provider}"
        if shapes.get((row.bench, row.machine, key)) != row.shape:
            shapes[(row.bench, row.machine, key)] = row.shape
            group.found[key] = Measured(row.ours, row.check, elements(row.shape))
        group.found[key].metrics[row.metric] = row.value
        group.found[key].check = row.check
        shaped = group.shaped.setdefault(
            (key, row.shape), Measured(row.ours, row.check, elements(row.shape))
        )
        shaped.metrics[row.metric] = row.value
        shaped.check = row.check
    return found


def measured(group: Group, key: str, shape: str | None) -> Measured | None:
    """A row's measurements: of ``shape`` where a target names one, else the file's last
    shape of the row."""
    return group.found.get(key) if shape is None else group.shaped.get((key, shape))


def judge(target: dict, group: Group) -> tuple[str, str]:
    """(verdict, detail) of one target on its benchmark's rows on one machine."""
    shape = target.get("shape")
    mine = measured(group, target["row"], shape)
    if mine is None:
        return "N/A", f"row {target['row']} not run" + (f" at {shape}" if shape else "")
    if not mine.ok:
        return ("FAIL" if mine.ours else "N/A"), mine.check
    others = [measured(group, key, shape) for key in target["of"]]
    others = [entry for entry in others if entry is not None and entry.ok]
    if not others:
        return "N/A", f"{', '.join(target['of'])} not measured"
    metric = target["metric"]
    if metric in ("percent_of", "x_floor") and any("tb_s" not in o.metrics for o in others):
        return "N/A", f"no bandwidth for {', '.join(target['of'])}"
    if metric == "percent_of":
        if "tb_s" not in mine.metrics:
            return "N/A", f"no bandwidth for {target['row']}"
        best = max(o.metrics["tb_s"] for o in others)
        value, unit = 100 * mine.metrics["tb_s"] / best, "%"
    elif metric == "speedup_over":
        value, unit = min(o.per_element() for o in others) / mine.per_element(), "x"
    elif metric == "ratio_to":
        value, unit = mine.per_element() / min(o.per_element() for o in others), "x"
    elif metric == "x_floor":  # tb_s * 1e6: bytes a microsecond
        floor_bytes = target["floor_bytes_per_element"] * mine.elements
        floor_us = floor_bytes / (max(o.metrics["tb_s"] for o in others) * 1e6)
        value, unit = mine.median_us / floor_us, "x"
    else:
        raise ValueError(f"unknown metric {metric!r} in target {target['name']!r}")
    times = f"{mine.median_us:.1f} us against {others[0].median_us:.1f} us"
    detail = f"{value:.3g}{unit} ({times})"
    given = {bound: target[bound] for bound in BOUNDS if bound in target}
    need = ", ".join(f"{bound} {limit:g}{unit}" for bound, limit in given.items())
    if target.get("report"):
        return "INFO", detail + (f"; not judged: {need}" if need else "")
    passed = all(BOUNDS[bound](value, limit) for bound, limit in given.items())
    return ("PASS" if passed else "FAIL"), f"{detail}; need {need}"


def rows_checked(group: Group) -> tuple[str, str, str]:
    """Every stochround row of a benchmark on a machine ran and passed its check."""
    line = f"{group.bench}: stochround rows ran and passed their checks"
    ours = {key: entry for key, entry in group.found.items() if entry.ours}
    bad = [key for key, entry in ours.items() if not entry.ok]
    if bad:
        return line, "FAIL", ", ".join(bad)
    return line, "PASS", f"{len(ours)} of {len(ours)} ran"


def verdicts(rows: Iterable[Row], targets: list[dict]) -> list[tuple[str, str, str, str]]:
    """(target, machine, verdict, detail): each target on each machine whose rows hold the
    target's row (on its device: "cuda" unless it says; N/A once where none does), then
    `rows_checked` a benchmark and machine."""
    found = groups(rows)
    lines = []
    for target in targets:
        device = target.get("device", "cuda")
        mine = [
            group
            for group in found.values()
            if group.bench == target["bench"]
            and group.device == device
            and target["row"] in group.found
        ]
        if not mine:
            detail = f"no {device} rows of {target['bench']} hold {target['row']}"
            lines.append((target["name"], "—", "N/A", detail))
        lines += [(target["name"], group.machine, *judge(target, group)) for group in mine]
    for group in found.values():
        name, verdict, detail = rows_checked(group)
        lines.append((name, group.machine, verdict, detail))
    return lines


def load_targets(path: Path = TARGETS) -> list[dict]:
    return tomllib.loads(path.read_text())["target"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=RESULTS, help="rows' folder")
    parser.add_argument("--targets", type=Path, default=TARGETS)
    args = parser.parse_args(argv)
    lines = verdicts(read_folder(args.folder), load_targets(args.targets))
    table = Table(title=f"targets: {args.folder}")
    for header in ("target", "machine", "verdict", "detail"):
        table.add_column(header, overflow="fold")
    for name, machine, verdict, detail in lines:
        table.add_row(name, machine, verdict, detail, style=STYLES[verdict])
    Console(width=None if sys.stdout.isatty() else 160, highlight=False, markup=False).print(table)
    failed = sum(line[2] == "FAIL" for line in lines)
    print(f"{failed} FAIL, {sum(line[2] == 'PASS' for line in lines)} PASS of {len(lines)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
