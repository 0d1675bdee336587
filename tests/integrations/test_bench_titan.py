"""benchmarks/bench_titan.py: a case's command line (the default one unchanged by the
options left at their defaults), the run's name, and its summary by the rows' steps, with
a row every step or every Kth (``--log-every K``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import module_from_file

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from bench_titan import (  # noqa: E402
    add_scaling,
    command,
    one_gpu_runs,
    parse_options,
    run_name,
    summary,
)


def test_the_default_command_line_passes_no_option_left_at_its_default(tmp_path) -> None:
    args = parse_options(["--out", str(tmp_path)])
    assert command("bf16", args, tmp_path / "run") == [
        sys.executable,
        "-m",
        "stochround",
        "titan",
        *("--recipe", "bf16", "--optimizer", "AdamW", "--steps", "200"),
        *("--flavor", "debugmodel", "--seq-len", "2048", "--batch", "8"),
        *("--device", "cuda", "--seed", "0", "--out", str(tmp_path / "run")),
    ]
    assert run_name(args) == "1gpu"


def test_log_every_is_passed_on_and_names_the_run(tmp_path) -> None:
    """A run logging every K steps measures tokens/s otherwise: its files take ``-logK``."""
    args = parse_options(["--log-every", "10", "--out", str(tmp_path)])
    assert command("nvfp4", args, tmp_path)[-2:] == ["--log-every", "10"]
    assert run_name(args) == "1gpu-log10"
    flags = ["--gpus", "2", "--replicate", "--reshard-after-forward", "never"]
    args = parse_options([*flags, "--log-every", "10", "--out", str(tmp_path)])
    assert run_name(args) == "2gpu-replicate-reshard-never-log10"


def test_the_pow2_case_passes_the_recipes_switch_and_nothing_else(tmp_path) -> None:
    """``nvfp4_pow2`` is ``nvfp4``'s command line and the switch the CLI parses as JSON."""
    args = parse_options(["--out", str(tmp_path)])
    nvfp4 = command("nvfp4", args, tmp_path)
    assert command("nvfp4_pow2", args, tmp_path) == [*nvfp4, "--switch", 'tensor_scale="pow2"']


def test_cudagraphs_pass_the_option_on_and_name_the_run(tmp_path) -> None:
    """``--cudagraphs``: each case's command line is the plain one with ``stochround titan
    --cudagraphs`` added (bf16's too), and the run's files are named apart."""
    plain = parse_options(["--compile", "--log-every", "10", "--out", str(tmp_path)])
    graphed = parse_options(
        ["--compile", "--log-every", "10", "--cudagraphs", "--out", str(tmp_path)]
    )
    for case in ("bf16", "nvfp4"):
        assert command(case, graphed, tmp_path) == [*command(case, plain, tmp_path), "--cudagraphs"]
    assert "--cudagraphs" not in command("nvfp4", plain, tmp_path)
    assert run_name(graphed) == "1gpu-log10-cudagraphs"


def test_tensor_parallel_passes_the_degree_on_names_the_run_and_compares_one_gpu(
    tmp_path,
) -> None:
    """``--tensor-parallel 2`` on two GPUs: ``stochround titan --tensor-parallel 2`` under
    torchrun, the run named ``2gpu-tp2``, compared with the plain one-GPU run."""
    args = parse_options(["--gpus", "2", "--tensor-parallel", "2", "--out", str(tmp_path)])
    line = command("nvfp4", args, tmp_path)
    assert line[line.index("--tensor-parallel") + 1] == "2"
    assert "--tensor-parallel" not in command(
        "nvfp4", parse_options(["--out", str(tmp_path)]), tmp_path
    )
    assert run_name(args) == "2gpu-tp2"
    assert one_gpu_runs(args) == ["1gpu"]


@pytest.mark.parametrize(
    "flags", [["--tensor-parallel", "0"], ["--gpus", "2", "--tensor-parallel", "3"]]
)
def test_a_tensor_parallel_degree_not_dividing_the_gpus_is_refused(tmp_path, flags, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options([*flags, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--tensor-parallel must be at least 1 and divide --gpus" in capsys.readouterr().err


def test_cudagraphs_without_compile_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options(["--cudagraphs", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert (
        "--cudagraphs captures the compiled blocks: it needs --compile" in capsys.readouterr().err
    )


@pytest.mark.parametrize("flags", [["--log-every", "0"], ["--steps", "25", "--log-every", "10"]])
def test_a_logging_interval_below_1_or_not_dividing_the_steps_is_refused(
    tmp_path, flags, capsys
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options([*flags, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--log-every must be at least 1 and divide --steps" in capsys.readouterr().err


def test_a_row_every_step_is_summarized_step_by_step() -> None:
    """20 steps, the last 3 profiled: tokens/s over steps 3 to 17, the loss of steps 19-20."""
    rows = [{"step": step, "loss": 100.0 - step, "tps": 10.0 * step} for step in range(1, 21)]
    assert summary(rows, profiled=3) == {
        "steps": 20,
        "last_loss": 80.0,
        "tail_loss": 80.5,
        "tps": 100.0,
    }


def test_a_row_every_tenth_step_is_summarized_by_its_steps() -> None:
    """Rows at steps 1, 10, ..., 200 (``--log-every 10``), the last 3 profiled: tokens/s
    from the rows after step 20 (the first tenth of the steps) up to step 190 (the row at
    200 covers profiled steps), the loss of the rows past step 180."""
    steps = [1, *range(10, 201, 10)]
    rows = [{"step": step, "loss": 1000.0 - step, "tps": float(step)} for step in steps]
    assert summary(rows, profiled=3) == {
        "steps": 200,
        "last_loss": 800.0,
        "tail_loss": 805.0,
        "tps": 110.0,  # the median of 30 ... 190
    }


def test_the_graphs_captured_while_timed_are_counted_where_the_rows_have_them() -> None:
    """Rows counting the step graphs' captures: ``timed_captures`` are those between the
    first and the last timed row (steps 3 and 17 here: 9 - 4)."""
    rows = [
        {"step": step, "loss": 1.0, "tps": 1.0, "graph_captures": min(step, 9) + 1}
        for step in range(1, 21)
    ]
    assert summary(rows, profiled=3)["timed_captures"] == 10 - 4


def test_several_gpus_are_compared_with_the_one_gpu_run_of_the_same_options(tmp_path) -> None:
    """``scaling``: the total tokens/s over the one-GPU run's (2 GPUs at 0.9x a GPU: 1.8x),
    against the one-GPU run with the same policy and interval, else the default policy's;
    a case the one-GPU run lacks gets none."""
    flags = ["--gpus", "2", "--reshard-after-forward", "never", "--log-every", "10"]
    args = parse_options([*flags, "--out", str(tmp_path)])
    assert one_gpu_runs(args) == ["1gpu-reshard-never-log10", "1gpu-log10"]
    assert one_gpu_runs(parse_options(["--gpus", "2", "--out", str(tmp_path)])) == ["1gpu"]
    results = {"bf16": {"tps": 90.0}, "nvfp4": {"tps": 45.0}, "fp8": {"returncode": 1}}
    add_scaling(results, 2, {"bf16": {"tps": 100.0}, "fp8": {"tps": 10.0}})
    assert results["bf16"]["over_one_gpu"] == pytest.approx(0.9)
    assert results["bf16"]["scaling"] == pytest.approx(1.8)
    assert "scaling" not in results["nvfp4"] and "scaling" not in results["fp8"]


def test_the_datasets_stand_in_holds_torchtitans_names_and_refuses_them() -> None:
    """benchmarks/stand_ins/datasets (for a GPU machine without Hugging Face datasets):
    the names torchtitan 0.2.2 imports from ``datasets`` and ``datasets.distributed``
    (loaded under names of their own: a test process may have the real package)."""
    folder = BENCHMARKS / "stand_ins" / "datasets"
    package = module_from_file("datasets_stand_in", folder / "__init__.py")
    distributed = module_from_file("datasets_stand_in_distributed", folder / "distributed.py")
    assert isinstance(package.Dataset, type) and isinstance(package.IterableDataset, type)
    with pytest.raises(RuntimeError, match="the datasets stand-in loads nothing"):
        package.load_dataset("c4")
    with pytest.raises(RuntimeError, match="the datasets stand-in splits nothing"):
        distributed.split_dataset_by_node(None, rank=0, world_size=1)
