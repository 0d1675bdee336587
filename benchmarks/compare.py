"""Before and after: each benchmark row of a baseline run beside the same row of this run.

``run_gpu.sh`` with ``BASELINE_SRC`` runs every benchmark twice in one device call: on the
tree under test (rows into ``<results>/rows``) and on another source tree (rows into
``<results>/baseline``). This prints, per figure in both folders (same bench, case,
provider, shape and machine; stochround's rows, ``--all``: every row), the baseline's
median, this run's, and the change in time (negative: faster now). A change within the
spread of the two copy rows of a script (``copy`` and ``copy_repeat``, where it has them)
is noise.

    python benchmarks/compare.py out/gpu/baseline out/gpu/rows [--all]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rows import Row, read_folder


def medians(rows: list[Row]) -> dict[tuple[str, ...], Row]:
    """The ``median_us`` rows by key (the metric left out)."""
    return {row.key[:4] + row.key[5:]: row for row in rows if row.metric == "median_us"}


def number(row: Row) -> str:
    return row.check if math.isnan(row.value) else f"{row.value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the baseline's rows")
    parser.add_argument("after", type=Path, help="this run's rows")
    parser.add_argument("--all", action="store_true", help="every row, not only stochround's")
    args = parser.parse_args(argv)
    before, after = medians(read_folder(args.before)), medians(read_folder(args.after))
    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False, markup=False)
    benches = sorted({key[0] for key in after.keys() & before.keys()})
    for bench in benches:
        keys = [key for key in after if key[0] == bench and key in before]
        commits = f"{before[keys[0]].commit} (before) -> {after[keys[0]].commit} (after)"
        table = Table(title=f"{bench}: {commits}")
        for header in ("case/provider", "before us", "after us", "change"):
            table.add_column(header, justify="left" if header == "case/provider" else "right")
        for key in keys:
            new, old = after[key], before[key]
            if not (new.ours or args.all):
                continue
            name = f"{new.case}/{new.provider}"
            if math.isnan(new.value) or math.isnan(old.value):
                table.add_row(name, number(old), number(new), "—")
                continue
            change = 100 * (new.value / old.value - 1)
            style = "red" if change > 2 else "green" if change < -2 else None
            table.add_row(name, number(old), number(new), f"{change:+.1f}%", style=style)
        console.print(table)
        copies = [r for k, r in after.items() if k[0] == bench and k[1] in ("copy", "copy_repeat")]
        if len(copies) == 2 and not any(math.isnan(c.value) for c in copies):
            first, last = (c.value for c in copies)
            spread = 100 * abs(last - first) / first
            print(f"noise: the copy took {first:.1f} and {last:.1f} us ({spread:.1f}% apart)")
    if not benches:
        print(f"no figure is in both {args.before} and {args.after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
