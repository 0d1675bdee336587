"""torchtitan's profiler, data parallelism by replicas, torch's deterministic algorithms,
FSDP2's reshard-after-forward policy, the logging interval and the tensor-parallel degree
in a stochround run, whichever supported release is installed: ``titan_config(
profile_steps=..., data_parallel_replicate_degree=..., deterministic=...,
reshard_after_forward=..., log_every=..., tensor_parallel_degree=...)`` in each release's
config, ``stochround titan --profile-steps N --replicate --deterministic
--reshard-after-forward POLICY --log-every N --tensor-parallel N``, and real traces
of torchtitan's trainer (the CPU; one and two GPUs) summarized by
benchmarks/titan_profile.py (a run's rows every Nth step: test_torchtitan_common.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip(
    "torchtitan",
    reason="torchtitan is not installed (pip install 'stochround[torchtitan]', Python >= 3.11)",
)

from typer.testing import CliRunner

from stochround.cli import app
from stochround.integrations.torchtitan import TITAN_API, titan_config
from stochround.integrations.torchtitan.fsdp import RESHARD_AFTER_FORWARD, applies_fsdp2
from stochround.integrations.torchtitan.launch import DETERMINISTIC_WARN_ONLY
from stochround.integrations.torchtitan.profiling import (
    TRACES_FOLDER,
    ProfileSchedule,
    profile_schedule,
    trace_files,
    trace_rank,
)
from stochround.integrations.torchtitan.rows import check_log_every

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from titan_profile import RankProfile, load_trace, rank_profile  # noqa: E402


def profiler_refuses_no_activity() -> bool:
    """Whether this torch's profiler refuses ``None`` among its activities, which torchtitan
    0.2.2's profiler passes where there is no GPU (``[CPU, None]``)."""
    try:
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, None])  # type: ignore[list-item]
    except TypeError:
        return True
    return False


CPU_PROFILING = pytest.mark.skipif(
    TITAN_API == "0.2" and not torch.cuda.is_available() and profiler_refuses_no_activity(),
    reason="torchtitan 0.2.2's profiler passes activities [CPU, None] without a GPU, which "
    "this torch refuses (TypeError: Expected ProfilerActivity or dict)",
)


def profiler_settings(config: Any) -> tuple[bool, str, int, int, int]:
    """``(enable_profiling, save_traces_folder, profile_freq, profiler_warmup,
    profiler_active)`` of a run's config: 0.3.0's ``profiler``, 0.2.2's ``profiling``."""
    section = config.profiler if TITAN_API == "0.3" else config.profiling
    return (
        section.enable_profiling,
        section.save_traces_folder,
        section.profile_freq,
        section.profiler_warmup,
        section.profiler_active,
    )


def test_the_profiler_records_the_last_steps_after_one_warm_up_step() -> None:
    assert profile_schedule(20, 0) is None
    assert profile_schedule(20, 3) == ProfileSchedule(freq=20, warmup=1, active=3)
    assert profile_schedule(3, 1) == ProfileSchedule(freq=3, warmup=1, active=1)


@pytest.mark.parametrize(("steps", "profile_steps"), [(2, 1), (10, 9), (10, -1)])
def test_profiling_the_first_step_or_a_negative_count_is_refused(steps, profile_steps) -> None:
    with pytest.raises(ValueError, match=f"profile_steps must be 0 .off. or 1 to {steps - 2}"):
        profile_schedule(steps, profile_steps)
    with pytest.raises(ValueError, match="profile_steps must be"):
        titan_config("bf16", flavor="tiny", steps=steps, profile_steps=profile_steps)


def test_the_config_turns_torchtitans_profiler_on_for_the_last_steps() -> None:
    assert profiler_settings(titan_config("bf16", flavor="tiny", steps=20))[0] is False
    config = titan_config("nvfp4", flavor="tiny", steps=20, profile_steps=3)
    assert profiler_settings(config) == (True, TRACES_FOLDER, 20, 1, 3)


def test_the_config_sets_torchtitans_replicate_degree() -> None:
    assert titan_config("bf16", flavor="tiny").parallelism.data_parallel_replicate_degree == 1
    config = titan_config("bf16", flavor="tiny", data_parallel_replicate_degree=2)
    assert config.parallelism.data_parallel_replicate_degree == 2
    assert config.parallelism.data_parallel_shard_degree == -1  # the ranks left: one


@pytest.mark.parametrize("policy", RESHARD_AFTER_FORWARD)
def test_the_config_sets_torchtitans_reshard_after_forward_policy(policy: str) -> None:
    assert titan_config("bf16", flavor="tiny").parallelism.fsdp_reshard_after_forward == "default"
    config = titan_config("nvfp4", flavor="tiny", reshard_after_forward=policy)
    assert config.parallelism.fsdp_reshard_after_forward == policy


def test_a_bad_reshard_after_forward_policy_is_refused_naming_the_policies() -> None:
    with pytest.raises(
        ValueError,
        match="reshard_after_forward must be one of 'default', 'always', 'never'; got 'once'",
    ):
        titan_config("bf16", flavor="tiny", reshard_after_forward="once")


def test_the_config_sets_torchtitans_log_freq() -> None:
    """Every step by default (the rows' per-step losses); torchtitan's ``metrics.log_freq``
    as asked."""
    assert titan_config("bf16", flavor="tiny").metrics.log_freq == 1
    assert titan_config("nvfp4", flavor="tiny", log_every=10).metrics.log_freq == 10


@pytest.mark.parametrize("log_every", [0, -10, True, 2.0, "10", None])
def test_a_logging_interval_other_than_a_positive_int_is_refused(log_every: object) -> None:
    message = f"log_every must be an int >= 1 .steps between rows.; got {log_every!r}"
    with pytest.raises(ValueError, match=message):
        titan_config("bf16", flavor="tiny", log_every=log_every)  # type: ignore[arg-type]


def test_a_numpy_integer_is_a_logging_interval() -> None:
    assert check_log_every(np.int64(10)) == 10 and type(check_log_every(np.int64(10))) is int


def test_fsdp2_and_its_policy_apply_under_0_3_always_and_under_0_2_to_shards_only() -> None:
    """0.3.0 wraps the model in FSDP2 on a one-rank shard too; 0.2.2 only above one rank
    (one GPU: plain tensors; replicas: DDP)."""
    assert applies_fsdp2("0.3", 1) and applies_fsdp2("0.3", 2)
    assert not applies_fsdp2("0.2", 1) and applies_fsdp2("0.2", 2)


def captured_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> Any:
    """The config ``stochround titan ARGS`` hands to `run_training` (which does not run)."""
    return captured_run(tmp_path, monkeypatch, args)[0]


def captured_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> tuple[Any, str]:
    """`captured_config` and the command's output (stdout and stderr)."""
    from stochround.integrations import torchtitan

    seen = []

    def run_training(config: Any, device: str, fields: dict[str, Any]) -> Path:
        seen.append(config)
        return tmp_path / "rows.jsonl"

    monkeypatch.setattr(torchtitan, "run_training", run_training)
    result = CliRunner().invoke(app, ["titan", "--device", "cpu", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return seen[0], result.output


def test_titan_command_profile_steps_and_replicate_reach_the_config(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node 2 sets it
    args = ["--recipe", "bf16", "--steps", "12", "--profile-steps", "2", "--replicate"]
    config = captured_config(tmp_path, monkeypatch, args)
    assert profiler_settings(config) == (True, TRACES_FOLDER, 12, 1, 2)
    assert config.parallelism.data_parallel_replicate_degree == 2


def test_titan_command_defaults_profile_nothing_and_shard(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = captured_config(tmp_path, monkeypatch, ["--recipe", "bf16"])
    assert profiler_settings(config)[0] is False
    assert config.parallelism.data_parallel_replicate_degree == 1


def test_titan_command_deterministic_reaches_the_config(tmp_path, monkeypatch) -> None:
    """Off by default; ``--deterministic`` sets torchtitan's ``debug.deterministic``, with
    an op that has no deterministic implementation warning (`DETERMINISTIC_WARN_ONLY`)."""
    assert captured_config(tmp_path, monkeypatch, ["--recipe", "bf16"]).debug.deterministic is False
    config = captured_config(tmp_path, monkeypatch, ["--recipe", "nvfp4", "--deterministic"])
    assert config.debug.deterministic is True
    assert config.debug.deterministic_warn_only is DETERMINISTIC_WARN_ONLY is True


def test_titan_command_reshard_after_forward_reaches_the_config(tmp_path, monkeypatch) -> None:
    """torchtitan's default unless told; ``--reshard-after-forward never`` on two ranks
    sharding the model is torchtitan's ``never``, with no note."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = captured_config(tmp_path, monkeypatch, ["--recipe", "bf16"])
    assert config.parallelism.fsdp_reshard_after_forward == "default"
    args = ["--recipe", "nvfp4", "--reshard-after-forward", "never"]
    config, printed = captured_run(tmp_path, monkeypatch, args)
    assert config.parallelism.fsdp_reshard_after_forward == "never"
    assert "note:" not in printed


@pytest.mark.parametrize("ranks", [["WORLD_SIZE", "1"], ["WORLD_SIZE", "2", "--replicate"]])
def test_titan_command_passes_the_policy_on_without_fsdp2_with_a_note_where_it_does_nothing(
    tmp_path, monkeypatch, ranks
) -> None:
    """One rank, or replicas: the policy still reaches torchtitan (0.3.0's FSDP2 applies it
    to a one-rank shard); under 0.2.2, which applies no FSDP2 there, a note says it has no
    effect."""
    monkeypatch.setenv(ranks[0], ranks[1])
    args = ["--recipe", "bf16", "--reshard-after-forward", "always", *ranks[2:]]
    config, printed = captured_run(tmp_path, monkeypatch, args)
    assert config.parallelism.fsdp_reshard_after_forward == "always"
    note = "note: --reshard-after-forward always has no effect in this run: torchtitan 0.2.2"
    assert (note in printed) is (TITAN_API == "0.2")


@pytest.mark.parametrize(
    ("flags", "degrees"),
    [
        ([], (1, 1)),
        (["--tensor-parallel", "2"], (1, 2)),
        (["--tensor-parallel", "2", "--replicate"], (2, 2)),
    ],
)
def test_titan_command_tensor_parallel_reaches_the_config(
    tmp_path, monkeypatch, flags, degrees
) -> None:
    """On four ranks: ``--tensor-parallel 2`` is torchtitan's tensor-parallel degree (the
    other factor FSDP2's shards, which torchtitan resolves), and with ``--replicate`` the
    replicas are the ranks over the degree."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    parallelism = captured_config(tmp_path, monkeypatch, ["--recipe", "bf16", *flags]).parallelism
    assert (
        parallelism.data_parallel_replicate_degree,
        parallelism.tensor_parallel_degree,
    ) == degrees


@pytest.mark.parametrize(
    ("world", "degree", "message"),
    [
        ("1", "0", "tensor_parallel_degree must be an int >= 1; got 0"),
        ("2", "3", "tensor_parallel_degree=3 does not divide the run's 2 processes"),
    ],
)
def test_titan_command_bad_tensor_parallel_degree_is_a_bad_input_exit(
    tmp_path, monkeypatch, world, degree, message
) -> None:
    monkeypatch.setenv("WORLD_SIZE", world)
    args = ["titan", "--tensor-parallel", degree, "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_titan_config_refuses_a_tensor_parallel_degree_below_1() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_degree must be an int >= 1; got 0"):
        titan_config("bf16", tensor_parallel_degree=0)


def test_titan_command_notes_a_policy_without_effect_when_tensor_parallel_leaves_one_shard(
    tmp_path, monkeypatch
) -> None:
    """Two ranks, both one tensor-parallel group: one data-parallel shard, no FSDP2 under
    0.2.2 (a note), FSDP2 over one rank under 0.3.0 (no note)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["--recipe", "bf16", "--reshard-after-forward", "never", "--tensor-parallel", "2"]
    printed = captured_run(tmp_path, monkeypatch, args)[1]
    assert ("note: --reshard-after-forward never has no effect" in printed) is (TITAN_API == "0.2")


def test_titan_command_log_every_reaches_the_config(tmp_path, monkeypatch) -> None:
    assert captured_config(tmp_path, monkeypatch, ["--recipe", "bf16"]).metrics.log_freq == 1
    config = captured_config(tmp_path, monkeypatch, ["--recipe", "nvfp4", "--log-every", "10"])
    assert config.metrics.log_freq == 10


def test_titan_command_log_every_zero_is_a_bad_input_exit(tmp_path) -> None:
    result = CliRunner().invoke(app, ["titan", "--log-every", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "log_every must be an int >= 1 (steps between rows); got 0" in result.output


def test_titan_command_profiling_every_step_is_a_bad_input_exit(tmp_path) -> None:
    args = ["titan", "--steps", "5", "--profile-steps", "5", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "profile_steps must be 0 (off) or 1 to 3 (steps 5" in result.output


def test_trace_files_are_found_in_rank_order(tmp_path) -> None:
    folder = tmp_path / TRACES_FOLDER / "iteration_12"
    folder.mkdir(parents=True)
    for rank in (10, 2, 0):
        (folder / f"rank{rank}_trace.json.gz").write_text("")
    assert [trace_rank(path) for path in trace_files(tmp_path)] == [0, 2, 10]


def tiny_run_args(device: str, steps: int, profile_steps: int) -> list[str]:
    """``stochround titan``'s options of a short profiled bf16 run of the tiny flavour."""
    args = ["--recipe", "bf16", "--flavor", "tiny", "--device", device, "--steps", str(steps)]
    return [*args, "--seq-len", "32", "--batch", "1", "--profile-steps", str(profile_steps)]


def profiled_run(out: Path, device: str, steps: int, profile_steps: int) -> list[RankProfile]:
    """Each rank's summary of a `tiny_run_args` run in this process."""
    args = ["titan", *tiny_run_args(device, steps, profile_steps), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    traces = trace_files(out)
    assert [path.parent.name for path in traces] == [f"iteration_{steps}"]
    return [rank_profile(load_trace(path)) for path in traces]


@CPU_PROFILING
def test_a_cpu_run_leaves_a_trace_of_its_last_step_that_the_summary_reads(tmp_path) -> None:
    """torchtitan's trainer on the CPU (gloo, one rank), three steps, the last recorded:
    one trace, rank 0's, at step 3; its summary has one step, no GPU work, and the
    optimizer's step among the annotations."""
    (profile,) = profiled_run(tmp_path / "run", "cpu", steps=3, profile_steps=1)
    assert (profile.rank, profile.steps) == (0, 1)
    assert profile.wall > 0 and profile.idle == profile.wall
    assert (profile.busy, profile.kernels, profile.nccl) == (0.0, 0.0, {})
    assert "Optimizer.step#AdamW.step" in dict(profile.annotations)
    assert profile.cpu_self and all(ms > 0 for _, ms in profile.cpu_self)


@pytest.mark.gpu
def test_a_gpu_run_leaves_a_trace_with_its_kernels(tmp_path) -> None:
    """One GPU, four steps, the last two recorded: the summary sees the GPU's kernels."""
    (profile,) = profiled_run(tmp_path / "run", "cuda", steps=4, profile_steps=2)
    assert (profile.rank, profile.steps) == (0, 2)
    assert profile.kernels > 0 and 0 < profile.compute <= profile.busy


def two_gpu_profiles(out: Path, *flags: str) -> list[RankProfile]:
    """Each rank's summary of a `tiny_run_args` run on two GPUs under ``torchrun``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", "-m", "stochround", "titan"]
    command += [*tiny_run_args("cuda", 4, 2), *flags, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    profiles = [rank_profile(load_trace(path)) for path in trace_files(out)]
    assert [profile.rank for profile in profiles] == [0, 1]
    return profiles


@pytest.mark.gpus2
def test_fsdp2_on_two_gpus_shows_its_all_gathers_and_reduce_scatters(tmp_path) -> None:
    for profile in two_gpu_profiles(tmp_path / "fsdp2"):
        assert profile.nccl["all_gather"] > 0 and profile.nccl["reduce_scatter"] > 0


@pytest.mark.gpus2
def test_replicas_on_two_gpus_all_reduce_their_gradients(tmp_path) -> None:
    for profile in two_gpu_profiles(tmp_path / "replicas", "--replicate"):
        assert profile.nccl["all_reduce"] > 0
