"""The benchmarks' harness: cases and providers, timers, output checks, JSON and a table.

A script makes a `Benchmark`, adds its rows with ``add(case, provider, build)`` — the case
is the operation at its size, the provider who computes it (stochround, PyTorch, a peer) —
and calls `Benchmark.run`. For each row:

1. a provider whose package is missing, or that needs CUDA on the CPU, is reported as
   skipped, not as an error;
2. ``build()`` prepares the call (a `Run`); the first call compiles, and its output is
   checked (`Run.check`, e.g. `rounding_check`) before anything is timed;
3. the call is timed: on CUDA by ``triton.testing.do_bench(return_mode="median")`` (CUDA
   events around each call, the L2 cache cleared before it, after warm-up calls); on the
   CPU by the median of ``time.perf_counter`` around each call after a warm-up call; with
   ``timer="host"`` by the wall-clock time a call over ``--calls`` calls back to back, the
   median of ``--repeats`` such runs (what a small call costs the host); with
   ``--interleave`` (host timer only) every row is built and checked first and the runs go
   in rounds, one run of each row a round, so that the host's drift during the script
   falls on every row alike (the rows' ratios are then comparable within a run).

Bandwidth (TB/s) counts bytes read plus bytes written, each element once, in the formats of
input and output. The figures go, as `rows.Row` lines, into ``<results>/<capability>.csv``
(``--results``, by default ``benchmarks/results``: the committed current figures, each row
replacing the one of the same case, provider, shape, metric and machine), which
`check.py` judges against ``targets.toml`` and `report.py` turns into RESULTS.md; the run's
whole record (statuses, output checks, notes, extra fields) goes to
``<out>/<name>[_<tag>].json`` as its log, and a table is printed. Scripts use stochround's
public API only, so that they can time another source tree of it (``PYTHONPATH=that/src``).
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import rows as results_rows
import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

# Without a GPU the scripts' Triton kernels run in Triton's interpreter, which Triton reads
# when a kernel is decorated: so before any script imports stochround.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

PEERS = ("torchao", "heavyball", "gfloat", "numpy")
T = TypeVar("T")  # what a captured step returns
CHECK_COUNT = 2**20  # outputs checked per row (a prefix)
DASH = "—"


class CheckFailed(Exception):
    """A row's output is not what the operation must return."""


@dataclass
class Run:
    """What a provider's ``build()`` returns: the call to time and what is known of it.

    ``bytes`` (moved per call) may be a function, read after the first call (an optimizer's
    states exist only then); ``extra`` adds fields to the row's JSON."""

    call: Callable[[], object]
    check: Callable[[object], str] | None = None
    elements: int | None = None
    bytes: float | Callable[[], float] | None = None
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass
class Provider:
    """A row of a benchmark: who computes ``case`` (``ours``: stochround), how to build its
    call, and what it needs (packages that must be importable, a CUDA device)."""

    case: str
    name: str
    build: Callable[[], Run]
    ours: bool = False
    requires: tuple[str, ...] = ()
    cuda_only: bool = False
    reference: bool = False  # run even where --only or --ours-only leave it out


class Benchmark:
    """One script's rows, its command line and its results."""

    def __init__(
        self,
        name: str,
        doc: str | None,
        *,
        timer: str = "device",
        reference: str | None = None,
        back_to_back: int = 0,
    ) -> None:
        """``reference``: the "case/provider" row whose bandwidth is 100% in the table;
        ``back_to_back``: also time that many calls back to back (`back_to_back_us`)."""
        self.name, self.timer, self.back_to_back = name, timer, back_to_back
        self.reference = reference
        self.providers: list[Provider] = []
        self.device = torch.device("cpu")
        self.parser = argparse.ArgumentParser(
            description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        add = self.parser.add_argument
        default_device = "cuda" if torch.cuda.is_available() else "cpu"
        add("--device", default=default_device, help=f"cuda or cpu ({default_device})")
        add("--out", type=Path, default=Path("out/bench"), help="the JSON log's folder")
        add("--tag", default="", help="JSON name suffix: <name>_<tag>.json (e.g. baseline)")
        add(
            "--results",
            type=Path,
            default=results_rows.RESULTS,
            help="folder of the rows <capability>.csv (benchmarks/results)",
        )
        add("--only", default="", help="comma-separated patterns of case or case/provider")
        add("--ours-only", action="store_true", help="stochround's rows and the references")
        add("--commit", default=os.environ.get("BENCH_COMMIT"), help="commit to record")
        add("--warmup-ms", type=float, default=25, help="do_bench warm-up (25 ms)")
        add("--rep-ms", type=float, default=100, help="do_bench timed calls (100 ms)")
        add("--repeats", type=int, default=5, help="CPU and host timers: timed runs (5)")
        add("--calls", type=int, default=1000, help="host timer: calls a run (1000)")
        add("--check-count", type=int, default=CHECK_COUNT, help="outputs checked a row")
        add("--interleave", action="store_true", help="host timer: the rows' runs in rounds")
        self.args = argparse.Namespace()

    def parse_args(self, argv: list[str] | None = None) -> argparse.Namespace:
        self.args = self.parser.parse_args(argv)
        self.device = torch.device(self.args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            self.parser.error("CUDA is not available: pass --device cpu")
        if self.args.interleave and self.timer != "host":
            self.parser.error(f"--interleave needs the host timer; {self.name} times devices")
        return self.args

    def add(self, case: str, provider: str, build: Callable[[], Run], **options: object) -> None:
        """A row: ``options`` are `Provider`'s (ours, requires, cuda_only, reference)."""
        self.providers.append(Provider(case, provider, build, **options))

    def selected(self) -> list[Provider]:
        patterns = [p for p in self.args.only.split(",") if p]

        def wanted(p: Provider) -> bool:
            key = f"{p.case}/{p.name}"
            matched = not patterns or any(
                fnmatch.fnmatch(key, pat) or fnmatch.fnmatch(p.case, pat) for pat in patterns
            )
            return p.reference or (matched and (p.ours or not self.args.ours_only))

        return [p for p in self.providers if wanted(p)]

    def run(self) -> int:
        """Measure the selected rows, write them into the results' rows and the JSON log,
        print the table. Exit status 1 where a stochround row failed its call or its
        check, else 0."""
        info = environment(self.device, self.args.commit)
        print(f"{self.name}: {' '.join(sys.argv)}")
        print(", ".join(f"{k} {v}" for k, v in info.items() if k not in ("argv", "versions")))
        chosen = self.selected()
        if self.args.interleave:
            rows = self.measure_interleaved(chosen)
        else:
            rows = []
            for number, provider in enumerate(chosen, 1):
                print(f"[{number}/{len(chosen)}] {provider.case}/{provider.name} ...", end=" ")
                rows.append(self.measure(provider))
                print(describe(rows[-1]), flush=True)
        info.update(benchmark=self.name, tag=self.args.tag, timer=self.timer_name())
        info.update(reference=self.reference, rows=rows)
        self.args.out.mkdir(parents=True, exist_ok=True)
        path = self.args.out / f"{self.name}{'_' + self.args.tag if self.args.tag else ''}.json"
        path.write_text(json.dumps(info, indent=1))
        print_table(f"{self.name} on {info.get('gpu', info['cpu'])}", rows, self.reference)
        written = results_rows.merge(self.args.results, results_rows.run_rows(info, rows))
        print(f"wrote {path}", *(f"and {csv_path}" for csv_path in written))
        return 1 if any(row["ours"] and failed(row) for row in rows) else 0

    def timer_name(self) -> str:
        if self.timer == "host":
            return f"host: wall clock a call, {self.args.calls} calls, median of runs"
        if self.device.type == "cuda":
            return "triton.testing.do_bench median (CUDA events, L2 cleared before each)"
        return "time.perf_counter median after a warm-up call"

    def measure(self, provider: Provider) -> dict:
        """A row's build, first call and check (`prepare`), then its timing."""
        row, run = self.prepare(provider)
        if run is None:
            return row
        try:
            row["median_us"] = self.time(run.call)
            if self.back_to_back:
                row["back_to_back_us"] = back_to_back_us(
                    run.call, self.device, self.back_to_back, self.args.repeats
                )
            if row.get("bytes"):
                row["tb_s"] = row["bytes"] / row["median_us"] / 1e6
        except Exception as error:  # one failing row must not end the run
            row["status"] = f"failed during timing: {type(error).__name__}: {error}"[:300]
            traceback.print_exc(limit=3)
        finally:
            run = None
            free(self.device)
        return row

    def prepare(self, provider: Provider) -> tuple[dict, Run | None]:
        """A row's build, first call and check: the row (its elements and bytes moved) and
        the `Run` to time, or the row alone where it was skipped or failed (its status
        says why)."""
        row: dict[str, object] = {"case": provider.case, "provider": provider.name}
        row.update(ours=provider.ours, status="ok", check=DASH, median_us=None, tb_s=None)
        missing = [p for p in provider.requires if importlib.util.find_spec(p) is None]
        if missing:
            return {**row, "status": f"skipped: {', '.join(missing)} not installed"}, None
        if provider.cuda_only and self.device.type != "cuda":
            return {**row, "status": "skipped: needs CUDA"}, None
        stage = "build"
        try:
            run = provider.build()
            stage = "first call"
            started = time.perf_counter()
            output = run.call()
            synchronize(self.device)
            row.update(first_call_s=time.perf_counter() - started, notes=run.notes)
            stage = "check"
            if run.check is not None:
                row["check"] = run.check(output)
            moved = run.bytes() if callable(run.bytes) else run.bytes
            row.update(elements=run.elements, bytes=moved, **run.extra)
            return row, run
        except CheckFailed as error:
            row.update(status=f"check failed: {error}", check=f"BAD {error}")
        except ImportError as error:
            row["status"] = f"skipped: {error}"
        except Exception as error:  # one failing row must not end the run
            row["status"] = f"failed during {stage}: {type(error).__name__}: {error}"[:300]
            traceback.print_exc(limit=3)
        free(self.device)
        return row, None

    def measure_interleaved(self, chosen: list[Provider]) -> list[dict]:
        """`measure` of every row with the host timer's runs in rounds (``--interleave``):
        each row built, called and checked first (all kept alive), ``--calls // 10``
        warm-up calls each, then ``--repeats`` rounds of one run of ``--calls`` calls a
        row; a row's figure is the median of its runs, its fastest and slowest runs kept
        as ``runs_us``."""
        prepared: list[tuple[dict, Run | None]] = []
        for number, provider in enumerate(chosen, 1):
            print(f"[{number}/{len(chosen)}] {provider.case}/{provider.name} ...", end=" ")
            row, run = self.prepare(provider)
            prepared.append((row, run))
            print(row["status"] if failed(row) else f"built; {row['check']}", flush=True)
        ready = [(row, run) for row, run in prepared if run is not None]
        times: dict[int, list[float]] = {id(row): [] for row, _ in ready}
        for _, run in ready:
            for _ in range(max(self.args.calls // 10, 2)):
                run.call()
        for _ in range(self.args.repeats):
            for row, run in ready:
                times[id(row)].append(host_us(run.call, self.device, self.args.calls, 1, 0))
        for row, _ in ready:
            runs = times[id(row)]
            row.update(median_us=statistics.median(runs), runs_us=[min(runs), max(runs)])
            if row.get("bytes"):
                row["tb_s"] = row["bytes"] / row["median_us"] / 1e6
            print(f"{row['case']}/{row['provider']}: {describe(row)}, runs {min(runs):.1f}-"
                  f"{max(runs):.1f} us")  # fmt: skip
        free(self.device)
        return [row for row, _ in prepared]

    def time(self, call: Callable[[], object]) -> float:
        """Microseconds a call (module docstring)."""
        if self.timer == "host":
            return host_us(call, self.device, self.args.calls, self.args.repeats)
        if self.device.type == "cuda":
            from triton.testing import do_bench

            warmup, rep = self.args.warmup_ms, self.args.rep_ms
            return 1e3 * do_bench(call, warmup=warmup, rep=rep, return_mode="median")
        call()  # warm-up
        times = []
        for _ in range(self.args.repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return 1e6 * statistics.median(times)


# --------------------------------------------------------------------------------------
# timers and devices
# --------------------------------------------------------------------------------------


def graph_of(step: Callable[[], T]) -> Callable[[], T]:
    """``step`` captured as one CUDA graph (after three warm-up steps on a side stream, as
    torch.cuda.graphs asks): a call replays it and returns the captured outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()

    def replay() -> T:
        graph.replay()
        return outputs

    return replay


def with_step_graphs(step: Callable[[], T], enabled: bool) -> Callable[[], T]:
    """``step`` run with quantized layers' CUDA step graphs (`stochround.nn.step_graphs`) on
    or off as ``enabled`` says, the process's setting restored after each call (no graph
    dropped)."""
    from stochround.nn.step_graphs import STEP_GRAPHS

    def graphed() -> T:
        previous, STEP_GRAPHS.enabled = STEP_GRAPHS.enabled, enabled
        try:
            return step()
        finally:
            STEP_GRAPHS.enabled = previous

    return graphed


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    """Let the caching allocator give back what the last row held."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def sweep_seconds(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Seconds a call of ``fn`` (a sweep's timer): Triton's do_bench (median, ms) on CUDA;
    the median wall time on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=repeats * 10, return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_us(
    call: Callable[[], object],
    device: torch.device,
    calls: int,
    repeats: int,
    warmup: int | None = None,
) -> float:
    """Wall-clock microseconds a call over ``calls`` calls back to back (then a device
    synchronize), the median of ``repeats`` runs, after ``warmup`` warm-up calls (by
    default ``calls // 10``, at least 2)."""
    for _ in range(max(calls // 10, 2) if warmup is None else warmup):
        call()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize(device)
        times.append((time.perf_counter() - started) / calls)
    return 1e6 * statistics.median(times)


def back_to_back_us(
    call: Callable[[], object], device: torch.device, calls: int, repeats: int
) -> float:
    """Microseconds a call over ``calls`` calls back to back (the host's time between them
    counts, as in a training loop): median of ``repeats`` runs, CUDA events on CUDA."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(calls):
                call()
            end.record()
            end.synchronize()
            times.append(1e3 * start.elapsed_time(end) / calls)
        else:
            started = time.perf_counter()
            for _ in range(calls):
                call()
            times.append(1e6 * (time.perf_counter() - started) / calls)
    return statistics.median(times)


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def command_output(*command: str) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def environment(device: torch.device, commit: str | None) -> dict:
    """What ran: machine, GPU and driver, versions, stochround's tree and commit, date."""
    import stochround

    tree = Path(stochround.__file__).resolve().parent
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line for line in lines if line.startswith("model name")]
    cpu = names[0].split(":", 1)[1].strip() if names else cpu
    info: dict[str, object] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "device": str(device),
        "host": platform.node(),
        "cpu": f"{cpu}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
        "commit": commit
        or command_output("git", "-C", str(tree), "describe", "--always", "--dirty")
        or "unknown",
        "stochround": f"{getattr(stochround, '__version__', '?')} ({tree})",
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        driver = command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        info.update(
            gpu_name=properties.name,
            gpu=f"{properties.name} ({properties.multi_processor_count} SMs, "
            f"{properties.total_memory / 2**30:.0f} GiB)",
            driver=driver or "unknown",
            cuda=str(torch.version.cuda),
        )
    triton_version = "not installed"
    if importlib.util.find_spec("triton") is not None:
        import triton

        triton_version = triton.__version__
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["triton"] = triton_version
    info["versions"] = versions | {name: package_version(name) for name in PEERS}
    return info


# --------------------------------------------------------------------------------------
# output checks (stochround's PyTorch path is the yardstick: public API only)
# --------------------------------------------------------------------------------------


def float_values(output: Tensor, count: int) -> Tensor:
    return output.reshape(-1)[:count].float()


def fp4x2_values(output: Tensor, count: int) -> Tensor:
    """The first ``count`` values of packed e2m1 codes (two a byte)."""
    import stochround

    codes = stochround.unpack(output.reshape(-1)[: count // 2].view(torch.uint8), 4)
    return stochround.decode(codes, "e2m1")


def neighbours(x: Tensor, fmt: str) -> tuple[Tensor, Tensor]:
    """The format's values next to x: toward zero and away from zero (equal where exact)."""
    import stochround

    toward = stochround.round(x, fmt, "rz", backend="torch")
    up = stochround.round(x, fmt, "ru", backend="torch")
    down = stochround.round(x, fmt, "rd", backend="torch")
    return toward, torch.where(x >= 0, up, down)


def judge_rounding(x: Tensor, values: Tensor, fmt: str, mode: str, rbits: int | None) -> str:
    """Raise CheckFailed unless ``values`` round ``x`` to ``fmt``: each a neighbour of x;
    for "rn" the nearest; for "sr" away from zero at the rate nu (the discarded fraction in
    ulps): mean(away - nu) within 6 standard deviations (plus 2**-rbits, the bias that rbits
    random bits allow) over the elements with nu < 1/2 and with nu >= 1/2 apart, so that
    neither round-to-nearest nor truncation passes."""
    toward, away = neighbours(x, fmt)
    usable = torch.isfinite(x) & torch.isfinite(toward) & torch.isfinite(away)
    outside = usable & (values != toward) & (values != away)
    if outside.any():
        i = int(torch.nonzero(outside)[0])
        example = f"{float(x[i])!r} -> {float(values[i])!r}"
        raise CheckFailed(f"{int(outside.sum())} not a neighbour, e.g. {example}")
    gap = (away.double() - toward.double()).abs()
    inexact = usable & (gap > 0)
    nu = torch.where(inexact, (x.double().abs() - toward.double().abs()) / gap.clamp_min(1e-300), 0)
    rounded_away = (values == away) & inexact
    if mode == "rn":
        wrong = inexact & (((nu < 0.5) & rounded_away) | ((nu > 0.5) & ~rounded_away))
        if wrong.any():
            raise CheckFailed(f"{int(wrong.sum())} not the nearest")
        return "ok nearest"
    biases = []
    for half in (inexact & (nu < 0.5), inexact & (nu >= 0.5)):
        count = int(half.sum())
        if count < 100:
            raise CheckFailed(f"only {count} inexact elements in a half")
        nu_half = nu[half]
        bias = float((rounded_away[half].double() - nu_half).mean())
        tolerance = 6 * math.sqrt(float((nu_half * (1 - nu_half)).sum())) / count
        if abs(bias) > tolerance + (2.0**-rbits if rbits else 0.0):
            raise CheckFailed(f"SR bias {bias:+.1e} beyond {tolerance:.0e}")
        biases.append(f"{bias:+.0e}")
    return f"ok SR bias {'/'.join(biases)}"


def same_bytes(output: Tensor, twin: Tensor) -> bool:
    """Whether ``output`` starts with ``twin``'s bytes."""
    expected = twin.reshape(-1).contiguous().view(torch.uint8)
    mine = output.reshape(-1).contiguous().view(torch.uint8)[: expected.numel()]
    return torch.equal(mine, expected)


def rounding_check(
    x: Tensor,
    fmt: str,
    mode: str = "sr",
    *,
    rbits: int | None = None,
    values: Callable[[Tensor, int], Tensor] = float_values,
    twin: Callable[[Tensor], Tensor] | None = None,
    count: int = CHECK_COUNT,
) -> Callable[[object], str]:
    """A `Run.check`: the output's first ``count`` values round x (`judge_rounding`); with
    ``twin`` (the same call on a prefix of x through stochround's PyTorch path), the
    output's first bytes equal the twin's, bit for bit."""
    count = min(count, x.numel())

    def check(output: object) -> str:
        summary = judge_rounding(x[:count], values(output, count), fmt, mode, rbits)
        if twin is not None:
            if not same_bytes(output, twin(x[:count])):
                raise CheckFailed("differs from the PyTorch path")
            summary += "; = torch path"
        return summary

    return check


def stochround_run(
    x: Tensor,
    name: str,
    args: tuple,
    keywords: dict[str, object],
    fmt: str,
    nbytes: float | None = None,
    *,
    backend: str = "auto",
    count: int = CHECK_COUNT,
) -> Run:
    """``stochround.<name>(x, *args, seed=1, **keywords)`` on ``backend``, checked by
    `rounding_check` against the same call through stochround's PyTorch path (the check's
    mode "rn" where args end in "rne"). A seed of "tensor" passes seed and offset as device
    tensors. Where backend "triton" refuses the call (ValueError), the default backend
    runs it, said in the notes. ``nbytes``: bytes an element (read + written)."""
    import stochround

    function = getattr(stochround, name)
    keywords = {"seed": 1, **keywords}
    if keywords["seed"] == "tensor":
        keywords["seed"] = torch.tensor(1, dtype=torch.int64, device=x.device)
        keywords["offset"] = torch.zeros_like(keywords["seed"])
    notes = ""
    if backend != "auto":
        try:
            function(x, *args, backend=backend, **keywords)
        except ValueError as error:
            backend, notes = "auto", f"backend={backend!r} refused: {error}"
    check = rounding_check(
        x,
        fmt,
        "rn" if args[-1] == "rne" else "sr",
        rbits=keywords.get("rbits"),
        values=fp4x2_values if fmt == "e2m1" else float_values,
        twin=lambda prefix: function(prefix, *args, backend="torch", **keywords),
        count=count,
    )
    moved = None if nbytes is None else nbytes * x.numel()
    return Run(
        lambda: function(x, *args, backend=backend, **keywords), check, x.numel(), moved, notes
    )


def equal_check(expected: Tensor) -> Callable[[object], str]:
    """A `Run.check`: the output holds ``expected``'s bytes."""

    def check(output: object) -> str:
        if not same_bytes(output, expected):
            raise CheckFailed("output differs")
        return "ok exact"

    return check


# --------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------


def failed(row: dict) -> bool:
    """Whether a row failed its call or its check (a skipped row did not)."""
    return row["status"] != "ok" and not row["status"].startswith("skipped")


def describe(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    b2b = f", back to back {row['back_to_back_us']:.1f} us" if "back_to_back_us" in row else ""
    return f"{row['median_us']:.1f} us{b2b}; {row['check']}"


def per_element(row: dict | None) -> float | None:
    if row is None or row["status"] != "ok" or not row.get("elements"):
        return None
    return row["median_us"] / row["elements"]


def number(value: float | None, pattern: str, suffix: str = "") -> str:
    return DASH if value is None else format(value, pattern) + suffix


def size(elements: int | None) -> str:
    if not elements:
        return DASH
    exponent = elements.bit_length() - 1
    return f"2^{exponent}" if elements == 1 << exponent else f"{elements:.3g}"


def print_table(title: str, rows: list[dict], reference: str | None) -> None:
    """One line a row (a case's rows together, ``*`` marking stochround's): time, time back
    to back, bandwidth, % of the reference row's bandwidth, and how many times faster per
    element the case's first stochround row is; columns with no value in any row are left
    out."""
    ref = next((r for r in rows if f"{r['case']}/{r['provider']}" == reference), None)
    ref_bw = ref["tb_s"] if ref is not None else None
    ours: dict[str, dict] = {}
    for row in rows:
        if row["ours"] and row["status"] == "ok":
            ours.setdefault(row["case"], row)

    def speedup(row: dict) -> float | None:
        mine, theirs = per_element(ours.get(row["case"])), per_element(row)
        return theirs / mine if mine and theirs and not row["ours"] else None

    columns = {  # header: cell
        "case": lambda row: row["case"],
        "provider": lambda row: ("* " if row["ours"] else "") + row["provider"],
        "elements": lambda row: size(row.get("elements")),
        "median us": lambda row: number(row["median_us"], ".1f"),
        "b2b us": lambda row: number(row.get("back_to_back_us"), ".1f"),
        "TB/s": lambda row: number(row["tb_s"], ".3f"),
        "% ref": lambda row: number(
            100 * row["tb_s"] / ref_bw if ref_bw and row["tb_s"] else None, ".1f"
        ),
        "stochround speed-up": lambda row: number(speedup(row), ".3g", "x"),
        "check / status": lambda row: row["check"] if row["status"] == "ok" else row["status"],
    }
    cases = list(dict.fromkeys(row["case"] for row in rows))
    rows = sorted(rows, key=lambda row: cases.index(row["case"]))
    cells = {header: [cell(row) for row in rows] for header, cell in columns.items()}
    shown = [header for header, column in cells.items() if any(c != DASH for c in column)]
    table = Table(title=title)
    for header in shown:
        left = header in ("case", "provider", "check / status")
        table.add_column(header, justify="left" if left else "right", overflow="fold")
    for index in range(len(rows)):
        table.add_row(*(cells[header][index] for header in shown))
    Console(width=None if sys.stdout.isatty() else 200, highlight=False, markup=False).print(table)
