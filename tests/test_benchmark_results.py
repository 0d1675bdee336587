"""The benchmarks' results as data: the committed rows parse, and RESULTS.md and README's
performance table are what `benchmarks/report.py` makes of them (so they cannot drift);
the harness writes a run's rows, replacing the figures it measured again."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import check  # noqa: E402
import report  # noqa: E402
import rows  # noqa: E402

COMMITTED = rows.read_folder(rows.RESULTS)


def row(**changes: object) -> rows.Row:
    base = rows.Row(
        bench="bench_cast",
        case="bf16",
        provider="stochround",
        shape="2^28",
        metric="median_us",
        value=530.5,
        ours=True,
        check="ok",
        device="cuda",
        machine="GPU",
        driver="1",
        versions="torch 2",
        commit="abc",
        date="2026-11-25",
    )
    return replace(base, **changes)


def test_committed_rows_parse_one_figure_a_key_in_their_capability_file() -> None:
    assert len(COMMITTED) > 200
    for path in sorted(rows.RESULTS.glob("*.csv")):
        found = rows.read(path)
        assert found, path
        assert {rows.capability(r.bench) for r in found} == {path.stem}
        keys = [r.key for r in found]
        assert len(keys) == len(set(keys)), path
        for r in found:
            assert rows.elements(r.shape) > 0
            assert len(r.date) == 10 and r.date[4] == "-", r
            assert r.machine and r.commit and r.versions.startswith("torch "), r
    assert {path.stem for path in rows.RESULTS.glob("*.csv")} == set(rows.CAPABILITIES)


def test_results_md_is_generated_from_the_rows() -> None:
    expected = report.render_results(COMMITTED, check.load_targets())
    assert report.RESULTS_MD.read_text() == expected, "run python benchmarks/report.py"


def test_readme_performance_table_is_generated_from_the_rows() -> None:
    text = report.README.read_text()
    assert report.with_performance(text, report.render_performance(COMMITTED)) == text
    block = text.split(report.BEGIN)[1].split(report.END)[0]
    assert "| fp32 → bf16 SR | 530.5 us (101% of copy bandwidth) |" in block
    assert "| 1.273 ms (1.02x the 14 B/param floor) |" in block


def test_readme_table_names_a_missing_row() -> None:
    without = [r for r in COMMITTED if not (r.bench == "bench_cast" and r.case == "copy")]
    with pytest.raises(ValueError, match="needs the row 'bench_cast/copy/torch'"):
        report.render_performance(without)


def test_with_performance_needs_both_markers_once() -> None:
    with pytest.raises(ValueError, match="performance:begin"):
        report.with_performance("no markers", "| table |\n")
    text = f"a\n{report.BEGIN}\nold\n{report.END}\nb\n"
    assert report.with_performance(text, "new\n") == f"a\n{report.BEGIN}\nnew\n{report.END}\nb\n"


def test_merge_replaces_the_same_figure_in_place_and_appends_new_ones(tmp_path: Path) -> None:
    first = [row(), row(provider="torchao", ours=False, value=770.9), row(metric="tb_s", value=3.0)]
    rows.merge(tmp_path, first)
    newer = row(value=531.0, commit="def")
    rows.merge(tmp_path, [newer, row(machine="other GPU", value=600.0)])
    found = rows.read(tmp_path / "cast.csv")
    assert [(r.provider, r.metric, r.machine, r.value) for r in found] == [
        ("stochround", "median_us", "GPU", 531.0),
        ("torchao", "median_us", "GPU", 770.9),
        ("stochround", "tb_s", "GPU", 3.0),
        ("stochround", "median_us", "other GPU", 600.0),
    ]
    assert found[0] == newer


def test_values_round_trip_and_nan_is_a_failed_row(tmp_path: Path) -> None:
    figures = [row(value=1340567.25), row(provider="failed", value=math.nan, check="failed")]
    rows.write(tmp_path / "cast.csv", figures)
    back = rows.read(tmp_path / "cast.csv")
    assert back[0] == figures[0]
    assert math.isnan(back[1].value) and back[1].check == "failed"


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("metric", "p50", "metric must be one of"),
        ("value", "fast", "value must be a number; got 'fast'"),
        ("ours", "yes", "ours must be true or false; got 'yes'"),
        ("device", "gpu", "device must be cuda or cpu; got 'gpu'"),
    ],
)
def test_a_bad_cell_is_named(tmp_path: Path, column: str, value: str, message: str) -> None:
    path = tmp_path / "cast.csv"
    rows.write(path, [row()])
    with path.open() as stream:
        records = list(csv.DictReader(stream))
    records[0][column] = value
    with pytest.raises(ValueError, match=message):
        rows.parse(records[0])


def test_capability_names_the_known_scripts() -> None:
    assert rows.capability("bench_launch") == "host"
    with pytest.raises(ValueError, match=r"bench must be one of bench_cast, .*; got 'bench_x'"):
        rows.capability("bench_x")


def test_check_judges_rows_per_machine() -> None:
    figures = [
        row(case="copy", provider="torch", ours=False, metric="tb_s", value=3.0),
        row(case="copy", provider="torch", ours=False, value=715.6),
        row(metric="tb_s", value=3.03),
        row(),
        row(machine="GPU 2", value=math.nan, check="failed during timing: boom"),
    ]
    target = {"name": "t", "bench": "bench_cast", "row": "bf16/stochround", "metric": "percent_of"}
    target.update(of=["copy/torch"], min=90)
    lines = check.verdicts(figures, [target])
    assert lines[0] == ("t", "GPU", "PASS", "101% (530.5 us against 715.6 us); need min 90%")
    assert lines[1] == ("t", "GPU 2", "FAIL", "failed during timing: boom")
    assert lines[3][1:3] == ("GPU 2", "FAIL")


def test_harness_writes_a_runs_rows(tmp_path: Path) -> None:
    """A CPU run of the harness: a measured row gives its figures, a failed stochround row
    a NaN median with its status, a skipped one nothing; a second run replaces them."""
    import harness

    def broken() -> harness.Run:
        raise RuntimeError("boom")

    def run_once() -> int:
        bench = harness.Benchmark("bench_host", None, timer="host")
        argv = ["--device", "cpu", "--out", str(tmp_path / "json"), "--calls", "2"]
        bench.parse_args([*argv, "--repeats", "1", "--results", str(tmp_path / "rows")])
        bench.add("tiny", "stochround", lambda: harness.Run(lambda: None, None, 4096), ours=True)
        bench.add("tiny", "broken", broken, ours=True)
        bench.add("tiny", "peer", broken, requires=("no_such_package_here",))
        return bench.run()

    assert run_once() == 1
    assert run_once() == 1
    found = rows.read(tmp_path / "rows" / "host.csv")
    assert [(r.provider, r.metric, r.shape, r.device) for r in found] == [
        ("stochround", "median_us", "2^12", "cpu"),
        ("broken", "median_us", "", "cpu"),
    ]
    assert found[0].value > 0 and found[0].ours
    assert math.isnan(found[1].value)
    assert found[1].check == "failed during build: RuntimeError: boom"
    assert check.verdicts(found, [])[0][2:] == ("FAIL", "tiny/broken")
    assert (tmp_path / "json" / "bench_host.json").exists()


def test_interleaved_runs_go_in_rounds_of_every_row(tmp_path: Path) -> None:
    """``--interleave``: every row is built and checked before any is timed, its warm-up
    calls come next, then the runs alternate row by row (``--repeats`` rounds of
    ``--calls`` calls); a failed row is reported and left out of the rounds, and the
    device timer refuses the flag."""
    import harness

    order: list[str] = []

    def build(name: str) -> harness.Run:
        order.append(f"build {name}")
        return harness.Run(lambda: order.append(name), None, 4096)

    def broken() -> harness.Run:
        raise RuntimeError("boom")

    bench = harness.Benchmark("bench_host", None, timer="host")
    argv = ["--device", "cpu", "--out", str(tmp_path / "json"), "--interleave"]
    bench.parse_args([*argv, "--calls", "2", "--repeats", "3", "--results", str(tmp_path)])
    bench.add("tiny", "a", lambda: build("a"), ours=True)
    bench.add("tiny", "broken", broken, ours=True)
    bench.add("tiny", "b", lambda: build("b"), ours=True)
    assert bench.run() == 1
    first_calls = ["build a", "a", "build b", "b"]
    warm_up = ["a", "a", "b", "b"]
    rounds = ["a", "a", "b", "b"] * 3
    assert order == first_calls + warm_up + rounds
    found = {r.provider: r for r in rows.read(tmp_path / "host.csv")}
    assert found["a"].value > 0 and found["b"].value > 0 and math.isnan(found["broken"].value)
    device_timed = harness.Benchmark("bench_cast", None)
    with pytest.raises(SystemExit):
        device_timed.parse_args(["--device", "cpu", "--interleave"])


def test_the_step_host_profile_times_and_profiles_both_settings(tmp_path: Path) -> None:
    """`profile_step_host.py` (CPU smoke run): a wall time and profile lines for the step
    graphs on and off, written to its JSON; its argument checks name the argument."""
    import profile_step_host

    out = tmp_path / "profile.json"
    args = ["--device", "cpu", "--steps", "1", "--warmup", "0", "--tokens", "32"]
    assert profile_step_host.main([*args, "--features", "32", "--top", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    for setting in ("step graphs on", "step graphs off"):
        assert data[setting]["wall_us_a_step"] > 0
        top = data[setting]["top"]
        assert len(top) == 3 and top[0]["own_us_a_step"] >= top[-1]["own_us_a_step"]
    with pytest.raises(SystemExit):
        profile_step_host.main(["--device", "cpu", "--steps", "0"])
    compiled = tmp_path / "compiled.json"
    assert (
        profile_step_host.main([*args, "--features", "32", "--compiled", "--out", str(compiled)])
        == 0
    )
    data = json.loads(compiled.read_text())
    functions = [line["function"] for line in data["step graphs on, compiled"]["top"]]
    assert data["step graphs off, compiled"]["wall_us_a_step"] > 0 and functions
