"""Tests for stochround.cli.experiments: `stochround demo` (`stochround run` is exercised by
tests/experiments/test_experiments.py)."""

import json
import re

import pytest
import torch
from helpers import invoke, ok, row


def _rows(output: str, first_cell: str) -> list[list[str]]:
    """Every table row (cells split on runs of 2+ spaces) starting with first_cell."""
    found = [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()]
    return [cells for cells in found if cells[0] == first_cell]


def test_demo_runs_every_quick_experiment_and_writes_one_report(tmp_path):
    """The numbers are those of the quick experiments with the default seed; the bands are
    the experiments' own (tests/experiments/test_experiments.py derives them)."""
    from stochround.experiments import EXPERIMENTS

    output = ok("demo", "--out", str(tmp_path))
    assert row(output, "sr")[3] == "+0.000000"  # exact SR is unbiased
    assert row(output, "rne")[1] == "1.25"
    # stagnation: 1 + 0.001, 1000 times, bf16 (the first "bf16" row)
    stagnation = _rows(output, "bf16")[0]
    assert stagnation[1] == "1.0"
    mean, std = (float(v) for v in stagnation[2].split(" ± "))
    assert 1.9 <= mean <= 2.1
    assert 0 < std < 0.2  # per-step variance <= ulp^2 / 4, ulp <= 2^-6: std <= 0.25
    # summation: rne's slope ~1 (n u), SR's ~0.5 (sqrt(n) u)
    assert 0.9 <= float(row(output, "bf16 rne")[2]) <= 1.35
    assert 0.35 <= float(row(output, "bf16 sr")[2]) <= 0.65
    # hardware units: documented exact SR, zero bias
    assert row(output, "amd-mi300-fp8")[3] == "0"
    # the time is printed, not asserted: speed goals live in benchmarks, and a loaded CI
    # machine runs the demo several times slower than an idle one
    assert re.search(r"demo took \d+\.\d s", output)
    payload = json.loads((tmp_path / "results.json").read_text())
    # gradient descent (from the JSON: its wide table wraps in a narrow terminal): SR's
    # final loss at least 10x below rne's in bf16
    descent = payload["gradient-descent"]["key_numbers"]
    assert descent["bf16_sr_final_loss"] * 10 <= descent["bf16_rne_final_loss"]
    assert set(payload) == set(EXPERIMENTS)
    assert payload["stagnation"]["key_numbers"]["add_bf16_sr_mean"] == pytest.approx(mean, 1e-4)
    for name in EXPERIMENTS:
        for figure in payload[name]["figures"]:
            assert (tmp_path / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# stochround demo")
    assert "## Some formats" in report
    assert f"| bf16 | 1.0 | {stagnation[2]} |" in report
    assert "| e4m3fn | 8 | 4 | 3 | 7 | 4 | -6 | 8 | 448 |" in report


def test_run_rejects_an_unknown_device_before_running(tmp_path):
    result = invoke("run", "lm", "--device", "gpu", "--out", str(tmp_path / "new"))
    assert result.exit_code == 2
    assert "--device must be one of auto, cpu, cuda; got 'gpu'" in result.output
    assert not (tmp_path / "new").exists()  # checked before the folder is made


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_run_on_cuda_without_cuda_is_a_bad_input_exit(tmp_path):
    result = invoke("run", "lm", "--device", "cuda", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "--device cuda needs CUDA" in result.output


def test_the_device_reaches_only_the_experiments_that_take_one():
    from stochround.cli.experiments import takes_device
    from stochround.experiments import EXPERIMENTS

    assert [name for name, module in EXPERIMENTS.items() if takes_device(module.run)] == ["lm"]
