"""Before and after: each benchmark row of a baseline run beside the same row of this run.

``run_gpu.sh`` with ``BASELINE_SRC`` runs every benchmark twice in one device call: on the
tree under test and on another source tree (``--tag baseline``). This prints, per row run
in both (stochround's rows; ``--all``: every row), the baseline's median, this run's, and
the change in time (negative: faster now). A change within the spread of the two copy rows
of a script (``copy`` and ``copy_repeat``, where it has them) is noise.

    python benchmarks/compare.py out/bench [--all] [--tag baseline]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from check import results, row
from rich.console import Console
from rich.table import Table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the benchmarks wrote their JSON")
    parser.add_argument("--tag", default="baseline", help="the baseline's tag (baseline)")
    parser.add_argument("--all", action="store_true", help="every row, not only stochround's")
    args = parser.parse_args(argv)
    after, before = results(args.folder, ""), results(args.folder, args.tag)
    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False, markup=False)
    for name in sorted(after.keys() & before.keys()):
        new, old = after[name], before[name]
        table = Table(title=f"{name}: {old['commit']} (before) -> {new['commit']} (after)")
        for header in ("case/provider", "before us", "after us", "change"):
            table.add_column(header, justify="left" if header == "case/provider" else "right")
        for entry in new["rows"]:
            key = f"{entry['case']}/{entry['provider']}"
            previous = row(old, key)
            if previous is None or not (entry["ours"] or args.all):
                continue
            if entry["median_us"] is None or previous["median_us"] is None:
                table.add_row(key, previous["status"], entry["status"], "—")
                continue
            change = 100 * (entry["median_us"] / previous["median_us"] - 1)
            style = "red" if change > 2 else "green" if change < -2 else None
            table.add_row(
                key,
                f"{previous['median_us']:.1f}",
                f"{entry['median_us']:.1f}",
                f"{change:+.1f}%",
                style=style,
            )
        console.print(table)
        copies = [row(new, key) for key in ("copy/torch", "copy_repeat/torch")]
        if all(c is not None and c["median_us"] for c in copies):
            first, last = (c["median_us"] for c in copies)
            spread = 100 * abs(last - first) / first
            print(f"noise: the copy took {first:.1f} and {last:.1f} us ({spread:.1f}% apart)")
    if not after.keys() & before.keys():
        print(f"no benchmark has both a run and a {args.tag!r} run in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
