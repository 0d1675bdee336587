"""Tests for stochround.cli.experiments: `stochround demo` (`stochround run` is exercised by
tests/experiments/test_experiments.py)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import assert_demo_report, invoke, ok

from stochround.cli.experiments import takes_device
from stochround.experiments import DEFAULT_SEED, EXPERIMENTS
from stochround.experiments.report import Experiment, Table, new_figure, save_figure

# The quick experiments that take most of the demo's two minutes, stood in for below: each
# one's quick run is tested in tests/experiments/ (lm's at a smaller size), and CI's first
# run (.ci/run) runs the README's `stochround demo` whole and checks its report with
# `assert_demo_report`, as this test does.
STOOD_IN = ("lorenz96", "optimizer-state", "emulate-science", "recipes-regime", "lm")


def stand_in(name: str, calls: list[tuple[object, ...]]) -> SimpleNamespace:
    """An experiment module for ``name`` whose ``run`` records its arguments in ``calls``
    and returns at once one table and one figure; it takes ``device`` where the
    experiment's own ``run`` does."""

    def run(quick: bool, seed: int, out: Path, progress: object, device: object = None):
        calls.append((name, quick, seed, out, device))
        figure, axes = new_figure()
        axes.plot([0, 1], [0, 1])
        table = Table(f"{name} stood in", ["case", "value"], [["one", "1"]])
        figures = [save_figure(figure, out, name.replace("-", "_"))]
        return Experiment(name, f"{name} (stood in)", [table], figures, {"stood_in": True})

    if takes_device(EXPERIMENTS[name].run):
        return SimpleNamespace(run=run)
    return SimpleNamespace(run=lambda quick, seed, out, progress: run(quick, seed, out, progress))


def test_demo_runs_every_quick_experiment_and_writes_one_report(tmp_path, monkeypatch):
    """The demo's tables, results.json and report.md (`assert_demo_report`), from the
    quick experiments with the default seed, the slow ones (`STOOD_IN`) stood in for:
    each of them is run once, quick, with the default seed and the folder, and lm with
    the device left to it."""
    calls: list[tuple[object, ...]] = []
    for name in STOOD_IN:
        monkeypatch.setitem(EXPERIMENTS, name, stand_in(name, calls))
    output = ok("demo", "--out", str(tmp_path))
    assert_demo_report(output, tmp_path)
    assert calls == [(name, True, DEFAULT_SEED, tmp_path, None) for name in STOOD_IN]


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
    assert [name for name, module in EXPERIMENTS.items() if takes_device(module.run)] == ["lm"]
