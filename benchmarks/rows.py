"""The benchmarks' results as rows: one measured figure a row, the current one of each.

A `Row` is one metric (``median_us``, ``back_to_back_us``, ``tb_s``) of one provider on
one case of one benchmark script, at one shape, on one machine, with what ran it (driver,
versions, commit, date). ``benchmarks/results/<capability>.csv`` holds the rows of the
scripts of a capability (`CAPABILITIES`), one line a row. Writing rows *replaces* the
rows of the same `Row.key` (bench, case, provider, shape, metric, machine) in place and
appends new ones: a file holds the current figure of each, in the order first measured;
history lives in git.

    python benchmarks/rows.py merge out/gpu/rows    # a run's rows into benchmarks/results
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, fields
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# the benchmark scripts by capability: results/<capability>.csv
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "cast": ("bench_cast", "bench_stream_floor"),
    "optimizers": ("bench_optim",),
    "blocks": ("bench_blocks", "bench_fp8_operand", "bench_pair"),
    "nn": ("bench_nn", "bench_model", "bench_gemm"),
    "gaussws": ("bench_gaussws",),
    "emulate": ("bench_emulate", "bench_mca"),
    "distributed": ("bench_distributed",),
    "cpu": ("bench_cpu",),
    "host": ("bench_host", "bench_launch"),
}
METRICS = ("median_us", "back_to_back_us", "tb_s")  # what the harness records, in order
PEERS = ("torchao", "heavyball", "gfloat")  # the versions recorded beside torch and Triton


@dataclass(frozen=True)
class Row:
    """One figure. ``value`` is NaN where a stochround row failed its call or its check
    (``check`` says how); ``check`` is otherwise the output check's verdict. ``device`` is
    "cuda" or "cpu"; ``machine`` the GPU's name, or the CPU's for a CPU run; ``driver``
    empty on the CPU; ``versions`` "torch X, triton Y, <peer> Z, ..."; ``date`` a day."""

    bench: str
    case: str
    provider: str
    shape: str
    metric: str
    value: float
    ours: bool
    check: str
    device: str
    machine: str
    driver: str
    versions: str
    commit: str
    date: str

    @property
    def key(self) -> tuple[str, str, str, str, str, str]:
        """What a newer row of the same figure replaces it by."""
        return (self.bench, self.case, self.provider, self.shape, self.metric, self.machine)


COLUMNS = tuple(f.name for f in fields(Row))


def capability(bench: str) -> str:
    """The capability (results file) of a benchmark script."""
    for name, benches in CAPABILITIES.items():
        if bench in benches:
            return name
    known = ", ".join(b for benches in CAPABILITIES.values() for b in benches)
    raise ValueError(f"bench must be one of {known}; got {bench!r}")


def size(elements: int) -> str:
    """A shape from an element count: ``2^k`` for a power of two, else the count."""
    exponent = elements.bit_length() - 1
    return f"2^{exponent}" if elements > 0 and elements == 1 << exponent else str(elements)


def elements(shape: str) -> int:
    """The element count of a shape: its first word, as `size` wrote it (``2^k`` or an
    integer) or as dimensions (``AxB``: their product; bench_mca's ``<ops>x<width>``, the
    same for its rows, so that their figures per element compare as their totals); 0 for
    no shape (a row that failed before it knew its size)."""
    if not shape:
        return 0
    word = shape.split()[0].rstrip(",")
    if word.startswith("2^"):
        return 2 ** int(word[2:])
    return math.prod(int(part) for part in word.split("x"))


def parse(record: Mapping[str, str]) -> Row:
    """A row from a CSV record (`COLUMNS`); ValueError naming the column if one is bad."""
    missing = [name for name in COLUMNS if name not in record]
    if missing:
        raise ValueError(f"row lacks columns {missing}: {dict(record)}")
    if record["ours"] not in ("true", "false"):
        raise ValueError(f"ours must be true or false; got {record['ours']!r}")
    if record["device"] not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu; got {record['device']!r}")
    if record["metric"] not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {record['metric']!r}")
    try:
        value = float(record["value"])
    except ValueError:
        raise ValueError(f"value must be a number; got {record['value']!r}") from None
    text = {name: record[name] for name in COLUMNS if name not in ("value", "ours")}
    return Row(value=value, ours=record["ours"] == "true", **text)


def cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # four decimals: finer than any timer or bandwidth here, short lines in the diff
        return "nan" if math.isnan(value) else format(round(value, 4), ".10g")
    return str(value)


def read(path: Path) -> list[Row]:
    """The rows of one CSV file, in its order."""
    with path.open(newline="") as stream:
        return [parse(record) for record in csv.DictReader(stream)]


def read_folder(folder: Path) -> list[Row]:
    """Every row of the ``*.csv`` files of ``folder``, file by file (names sorted)."""
    return [row for path in sorted(folder.glob("*.csv")) for row in read(path)]


def write(path: Path, rows: Iterable[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows([cell(value) for value in astuple(row)] for row in rows)


def merged(old: Iterable[Row], new: Iterable[Row]) -> list[Row]:
    """``old`` with each row that ``new`` has a row of the same key for replaced in place,
    then ``new``'s other rows in their order."""
    rows = {row.key: row for row in old}
    for row in new:
        rows[row.key] = row  # a dict keeps the place of a key it already holds
    return list(rows.values())


def merge(folder: Path, new: Iterable[Row]) -> list[Path]:
    """Write ``new`` into ``folder``'s capability files (`merged`); the paths written."""
    by_file: dict[str, list[Row]] = {}
    for row in new:
        by_file.setdefault(capability(row.bench), []).append(row)
    paths = []
    for name, rows in by_file.items():
        path = folder / f"{name}.csv"
        write(path, merged(read(path) if path.exists() else [], rows))
        paths.append(path)
    return paths


def run_rows(info: Mapping[str, object], measured: Iterable[Mapping[str, object]]) -> list[Row]:
    """The rows of one run of a script: ``info`` is `harness.environment`'s record with
    ``benchmark``; ``measured`` the harness's row dicts (case, provider, ours, status,
    check, elements, the `METRICS`; ``shape`` where the script sets one). A row skipped
    (a peer missing, no CUDA) gives none; a failed one its ``median_us`` as NaN."""
    versions = info["versions"]
    assert isinstance(versions, Mapping)
    names = [("torch", "torch"), ("triton", "triton")] + [(p, p) for p in PEERS]
    installed = [(label, versions.get(name)) for label, name in names]
    device = str(info["device"]).split(":")[0]
    machine = str(info["gpu_name"] if device == "cuda" else info["cpu"])
    common = {
        "bench": str(info["benchmark"]),
        "device": device,
        "machine": machine,
        "driver": str(info.get("driver", "")) if device == "cuda" else "",
        "versions": ", ".join(f"{k} {v}" for k, v in installed if v and v != "not installed"),
        "commit": str(info["commit"]),
        "date": str(info["date"])[:10],
    }
    rows = []
    for entry in measured:
        status = str(entry["status"])
        if status.startswith("skipped"):
            continue
        count = entry.get("elements")
        shape = entry.get("shape") or (size(count) if isinstance(count, int) else "")
        head = {"case": str(entry["case"]), "provider": str(entry["provider"])}
        head.update(shape=str(shape), ours=bool(entry["ours"]))
        if status != "ok":
            rows.append(Row(metric="median_us", value=math.nan, check=status, **head, **common))
            continue
        for metric in METRICS:
            value = entry.get(metric)
            if isinstance(value, (int, float)):
                check = str(entry.get("check", ""))
                rows.append(Row(metric=metric, value=float(value), check=check, **head, **common))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    merge_command = commands.add_parser("merge", help="a run's rows into the results")
    merge_command.add_argument("source", type=Path, help="folder of a run's CSV files")
    merge_command.add_argument("--into", type=Path, default=RESULTS, help="(benchmarks/results)")
    args = parser.parse_args(argv)
    if not any(args.source.glob("*.csv")):
        parser.error(f"no CSV files in {args.source}")
    for path in merge(args.into, read_folder(args.source)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
