"""Judge the benchmarks' JSON results against ``targets.toml``: PASS, FAIL, N/A or INFO.

Reads every JSON file the benchmark scripts wrote into a folder (those of one ``--tag``:
none by default, ``baseline`` for a baseline tree's), judges each target of
``targets.toml`` (its header says how) and adds one line per file: every stochround row ran
and passed its output check. Prints a table; exit status 1 if any line is FAIL.

    python benchmarks/check.py out/bench
    python benchmarks/check.py out/bench --tag baseline
    python benchmarks/check.py out/bench --markdown   # also RESULTS.md's sections
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BOUNDS = {
    "min": lambda value, limit: value >= limit,
    "above": lambda value, limit: value > limit,
    "max": lambda value, limit: value <= limit,
}
STYLES = {"PASS": "green", "FAIL": "red", "N/A": "yellow", "INFO": "cyan"}


def results(folder: Path, tag: str) -> dict[str, dict]:
    """The JSON files of ``folder`` written with ``tag``, by benchmark name."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "rows" in data and data.get("tag", "") == tag:
            found[data.get("benchmark", path.stem)] = data
    return found


def row(data: dict, key: str) -> dict | None:
    return next((r for r in data["rows"] if f"{r['case']}/{r['provider']}" == key), None)


def measured(entry: dict | None) -> bool:
    return entry is not None and entry["status"] == "ok" and entry.get("median_us") is not None


def per_element(entry: dict) -> float:
    return entry["median_us"] / (entry.get("elements") or 1)


def judge(target: dict, data: dict | None) -> tuple[str, str]:
    """(verdict, detail) of one target on its benchmark's results."""
    if data is None:
        return "N/A", f"no {target['bench']}.json"
    device = data["device"].split(":")[0]
    if device != target.get("device", "cuda"):
        return "N/A", f"ran on {device}"
    mine = row(data, target["row"])
    if mine is None:
        return "N/A", f"row {target['row']} not run"
    if mine["status"] != "ok":
        return ("FAIL" if mine["ours"] and failed(mine) else "N/A"), mine["status"]
    others = [row(data, key) for key in target["of"]]
    others = [entry for entry in others if measured(entry)]
    if not others:
        return "N/A", f"{', '.join(target['of'])} not measured"
    metric = target["metric"]
    if metric == "percent_of":
        value, unit = 100 * mine["tb_s"] / max(o["tb_s"] for o in others), "%"
    elif metric == "speedup_over":
        value, unit = min(per_element(o) for o in others) / per_element(mine), "x"
    elif metric == "ratio_to":
        value, unit = per_element(mine) / min(per_element(o) for o in others), "x"
    elif metric == "x_floor":  # tb_s * 1e6: bytes a microsecond
        floor_us = mine["floor_bytes"] / (max(o["tb_s"] for o in others) * 1e6)
        value, unit = mine["median_us"] / floor_us, "x"
    else:
        raise ValueError(f"unknown metric {metric!r} in target {target['name']!r}")
    times = f"{mine['median_us']:.1f} us against {others[0]['median_us']:.1f} us"
    detail = f"{value:.3g}{unit} ({times})"
    given = {bound: target[bound] for bound in BOUNDS if bound in target}
    need = ", ".join(f"{bound} {limit:g}{unit}" for bound, limit in given.items())
    if target.get("report"):
        return "INFO", detail + (f"; not judged: {need}" if need else "")
    passed = all(BOUNDS[bound](value, limit) for bound, limit in given.items())
    return ("PASS" if passed else "FAIL"), f"{detail}; need {need}"


def failed(entry: dict) -> bool:
    """Whether a row failed its call or its check (a skipped row did not)."""
    return entry["status"] != "ok" and not entry["status"].startswith("skipped")


def rows_checked(name: str, data: dict) -> tuple[str, str, str]:
    """Every stochround row of a file ran (or was skipped) and passed its check."""
    line = f"{name}: stochround rows ran and passed their checks"
    ours = [entry for entry in data["rows"] if entry["ours"]]
    bad = [f"{entry['case']}/{entry['provider']}" for entry in ours if failed(entry)]
    if bad:
        return line, "FAIL", ", ".join(bad)
    ran = sum(entry["status"] == "ok" for entry in ours)
    return line, "PASS", f"{ran} of {len(ours)} ran ({len(ours) - ran} skipped)"


def markdown(data: dict) -> str:
    """A RESULTS.md section of one JSON file: command, machine, versions, commit, date, and
    its rows as a table (a case's rows together; % of the reference row's bandwidth)."""
    versions, dash = data["versions"], "—"
    machine = data["cpu"]
    if "gpu" in data:
        machine = f"{data['gpu']}, driver {data['driver']}, CUDA {data['cuda']}; host {machine}"
    peers = ", ".join(f"{name} {versions[name]}" for name in ("torchao", "heavyball", "gfloat"))
    lines = [
        f"## {data['benchmark']}",
        "",
        f"- Command: `python3 {' '.join(data['argv'])}`",
        f"- Machine: {machine}",
        f"- torch {versions['torch']}, Triton {versions['triton']}; {peers}",
        f"- Commit {data['commit']}, {data['date']}; timer: {data['timer']}",
        "",
        "| case | provider | elements | median us | TB/s | % of ref | check / status |",
        "|---|---|---|---|---|---|---|",
    ]
    reference = row(data, data.get("reference") or "")
    ref_bw = reference.get("tb_s") if reference else None
    cases = list(dict.fromkeys(entry["case"] for entry in data["rows"]))
    for entry in sorted(data["rows"], key=lambda entry: cases.index(entry["case"])):
        median, tb_s = entry.get("median_us"), entry.get("tb_s")
        cells = [
            entry["case"],
            f"**{entry['provider']}**" if entry["ours"] else entry["provider"],
            str(entry.get("elements") or dash),
            dash if median is None else f"{median:.1f}",
            dash if tb_s is None else f"{tb_s:.3f}",
            f"{100 * tb_s / ref_bw:.1f}" if tb_s and ref_bw else dash,
            entry["check"] if entry["status"] == "ok" else entry["status"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the benchmarks wrote their JSON")
    parser.add_argument("--tag", default="", help="judge the files written with --tag TAG")
    parser.add_argument("--targets", type=Path, default=Path(__file__).with_name("targets.toml"))
    parser.add_argument("--markdown", action="store_true", help="print RESULTS.md sections")
    args = parser.parse_args(argv)
    found = results(args.folder, args.tag)
    if args.markdown:
        print("\n".join(markdown(data) for data in found.values()))
    targets = tomllib.loads(args.targets.read_text())["target"]
    lines = [(t["name"], *judge(t, found.get(t["bench"]))) for t in targets]
    lines += [rows_checked(name, data) for name, data in found.items()]
    table = Table(title=f"targets: {args.folder}{f' (tag {args.tag})' if args.tag else ''}")
    for header in ("target", "verdict", "detail"):
        table.add_column(header, overflow="fold")
    for name, verdict, detail in lines:
        table.add_row(name, verdict, detail, style=STYLES[verdict])
    Console(width=None if sys.stdout.isatty() else 160, highlight=False, markup=False).print(table)
    failed = sum(verdict == "FAIL" for _, verdict, _ in lines)
    print(f"{failed} FAIL, {sum(v == 'PASS' for _, v, _ in lines)} PASS of {len(lines)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
