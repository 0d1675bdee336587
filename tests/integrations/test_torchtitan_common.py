"""stochround inside torchtitan, whichever supported release is installed: the offline
data, the recipe names, ``stochround titan`` and a bit-exact resume from a DCP checkpoint
(torchtitan's trainer on the CPU, gloo)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "torchtitan",
    reason="torchtitan is not installed (pip install 'stochround[torchtitan]', Python >= 3.11)",
)

from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from typer.testing import CliRunner

import stochround as sr
from stochround.cli import app
from stochround.integrations.torchtitan import (
    TITAN_API,
    ByteTokenizer,
    RecipeChoice,
    StdlibDataset,
    make_recipe,
)

SRC = Path(__file__).resolve().parents[2] / "src"
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_byte_tokenizer_and_stdlib_samples() -> None:
    tokenizer = ByteTokenizer()
    assert tokenizer.encode("é", add_bos=True, add_eos=True) == [256, 0xC3, 0xA9, 257]
    assert tokenizer.decode([256, 0xC3, 0xA9, 257]) == "é"
    dataset = StdlibDataset(tokenizer, 64)
    samples = iter(dataset)
    first, second = next(samples), next(samples)
    (inputs, labels) = first[0]["input"], first[1]
    assert inputs[0] == 256 and torch.equal(inputs[1:], labels[:-1])
    assert first[0]["positions"].tolist() == list(range(64))
    assert second[0]["positions"][0] == 0  # the file's continuation restarts at 0
    # resuming from the state gives the same next sample
    state = dataset.state_dict()
    third = next(samples)
    resumed = StdlibDataset(tokenizer, 64)
    resumed.load_state_dict(state)
    again = next(iter(resumed))
    assert torch.equal(again[0]["input"], third[0]["input"])


@pytest.mark.parametrize("infinite", [False, True])
def test_a_resumed_dataset_continues_as_the_uninterrupted_one(tmp_path, infinite) -> None:
    """Resumed from the state after each sample, the dataset yields the uninterrupted run's
    next samples and passes through its states (a DCP checkpoint of a resumed run is the
    uninterrupted run's), across files and, infinite, the epoch's end.  (Before, a resumed
    iterator read the next file before yielding the restored buffer's samples: the same
    samples but other states, and a finite one dropped its last file's samples.)"""
    for name, size in (("a.py", 70), ("b.py", 9), ("c.py", 40)):
        (tmp_path / name).write_text("x" * size)

    def run(dataset: StdlibDataset, count: int) -> list[tuple[list[int], dict]]:
        samples = iter(dataset)
        out = []
        for sample in samples:
            out.append((sample[0]["input"].tolist(), dataset.state_dict()))
            if len(out) == count:
                break
        return out

    tokenizer = ByteTokenizer()
    whole = run(StdlibDataset(tokenizer, 16, root=str(tmp_path), infinite=infinite), 12)
    assert len(whole) == (12 if infinite else 7)
    for k in range(1, len(whole)):
        resumed = StdlibDataset(tokenizer, 16, root=str(tmp_path), infinite=infinite)
        resumed.load_state_dict(whole[k - 1][1])
        assert run(resumed, len(whole) - k) == whole[k:]


def test_the_samples_are_the_files_tokens_packed_as_the_spec_says(tmp_path) -> None:
    """The samples against the corpus module's spec written out on its own: each file's
    BOS + bytes + EOS, the inputs all but its last token, the labels all but its first,
    the positions counting from 0 in each file; the three cut in ``seq_len`` pieces over the
    files in order, and a sample's leading positions (a file begun in an earlier sample)
    counted from 0 again.  Also that the state is plain ints (torchtitan pickles it into
    the checkpoint)."""
    texts = {"a.py": "x" * 37, "b.py": "é" * 5, "c.py": "yz" * 20, "d.py": "w"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    inputs: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for text in texts.values():
        tokens = [256, *text.encode("utf-8"), 257]
        inputs += tokens[:-1]
        labels += tokens[1:]
        positions += list(range(len(tokens) - 1))
    seq_len = 11
    dataset = StdlibDataset(ByteTokenizer(), seq_len, root=str(tmp_path), infinite=False)
    samples = list(dataset)
    assert len(samples) == len(inputs) // seq_len
    for k, (sample, label) in enumerate(samples):
        cut = slice(k * seq_len, (k + 1) * seq_len)
        want = positions[cut]
        head = want.index(0) if 0 in want else seq_len
        want = [p - want[0] for p in want[:head]] + want[head:]
        assert sample["input"].tolist() == inputs[cut]
        assert label.tolist() == labels[cut]
        assert sample["positions"].tolist() == want
        assert sample["input"].dtype == label.dtype == sample["positions"].dtype == torch.long
    state = dataset.state_dict()
    left = len(inputs) % seq_len
    assert state["inputs"] == inputs[len(inputs) - left :]
    assert all(
        type(each) is int for key in ("inputs", "labels", "positions") for each in state[key]
    )


def test_recipe_names_switches_and_rules() -> None:
    with pytest.raises(ValueError, match="recipe must be one of bf16, nvfp4"):
        make_recipe("nvfp5")
    with pytest.raises(ValueError, match="recipe 'bf16' takes no switches"):
        make_recipe("bf16", {"rht": False})
    choice = RecipeChoice(
        "nvfp4", {"stochastic_rounding": False}, rules=[("a", "bf16"), ("b", "int8")], seed=3
    )
    assert choice.recipe_of("a") is None
    assert choice.recipe_of("b") == sr.nn.int8(seed=3)
    assert choice.recipe_of("c") == sr.nn.nvfp4(stochastic_rounding=False, seed=3)
    assert RecipeChoice("bf16").recipe_of("c") is None
    pow2 = make_recipe("nvfp4", {"tensor_scale": "pow2"}, seed=1)  # `--switch` of the CLI
    assert pow2 == sr.nn.nvfp4(tensor_scale="pow2", seed=1)
    assert pow2.spec("dgrad_grad_output").nvfp4_flavour == "pow2"


@pytest.mark.parametrize(
    ("steps", "flags", "logged"),
    [("2", [], [1, 2]), ("5", ["--log-every", "2"], [1, 2, 4])],
    ids=["every-step", "every-other-step"],
)
def test_titan_command_trains_a_tiny_model_on_the_cpu(tmp_path, steps, flags, logged) -> None:
    """A row for each step; with ``--log-every 2``, for step 1 (which torchtitan always
    logs) and the even steps only, each with its step's number, and the last logged step's
    loss printed."""
    out = tmp_path / "run"
    args = ["titan", "--recipe", "int8", "--flavor", "tiny", "--device", "cpu", "--steps", steps]
    args += ["--seq-len", "32", "--batch", "1", "--optimizer", "SRAdamW", *flags]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == logged
    assert rows[0]["recipe"] == "int8" and rows[0]["optimizer"] == "SRAdamW"
    assert all(row["loss"] > 0 and row["tps"] > 0 for row in rows)
    assert f"step {logged[-1]}: loss" in result.output
    # no step graph on the CPU
    assert all(row["graph_captures"] == row["graph_replays"] == 0 for row in rows)


def test_titan_command_trains_tensor_parallel_on_two_gloo_ranks(tmp_path) -> None:
    """``torchrun --nproc_per_node 2 -m stochround titan --tensor-parallel 2`` on the CPU:
    torchtitan's trainer shards each layer over both ranks (under 0.3.0 with
    `TENSOR_PARALLEL_SPMD_BACKEND`, the weights DTensors and `QuantizedLinear` on its own
    tensor-parallel path: the default backend stops in FSDP2's wrapping), mxfp8, three
    steps: a row a step, each counting two ranks, each loss finite.  (Not a one-rank run's
    losses: torchtitan initialises DTensor weights by DTensor's random generator.)"""
    out = tmp_path / "tp"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = ["-m", "stochround", "titan", "--recipe", "mxfp8", "--flavor", "tiny", "--device"]
    args += ["cpu", "--steps", "3", "--seq-len", "32", "--batch", "2", "--tensor-parallel", "2"]
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [*launch, *args, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(row["step"], row["world_size"]) for row in rows] == [(1, 2), (2, 2), (3, 2)]
    assert all(math.isfinite(row["loss"]) and row["loss"] > 0 for row in rows)


def test_a_row_counts_the_step_graphs_captures_and_replays_so_far(tmp_path, monkeypatch) -> None:
    """Each row holds the process's step-graph counts at its step (`STEP_GRAPHS`), so that
    captures going on while the steps are timed show in the rows."""
    from stochround.integrations.torchtitan.rows import RowsLogger
    from stochround.nn.step_graphs import STEP_GRAPHS

    logger = RowsLogger(tmp_path / "rows.jsonl", {"recipe": "nvfp4"})
    metrics = {"loss_metrics/global_avg_loss": 2.5, "throughput(tps)": 100.0}
    monkeypatch.setattr(STEP_GRAPHS, "captures", 3)
    monkeypatch.setattr(STEP_GRAPHS, "replays", 7)
    logger.log(metrics, 1)
    monkeypatch.setattr(STEP_GRAPHS, "captures", 4)
    monkeypatch.setattr(STEP_GRAPHS, "replays", 19)
    logger.log(metrics, 2)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(row["graph_captures"], row["graph_replays"]) for row in rows] == [(3, 7), (4, 19)]
    assert rows[0]["recipe"] == "nvfp4" and rows[1]["loss"] == 2.5


def test_titan_command_bad_recipe_is_a_bad_input_exit(tmp_path) -> None:
    result = CliRunner().invoke(app, ["titan", "--recipe", "nvfp5", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "recipe must be one of" in result.output


def test_titan_command_step_graphs_on_the_cpu_is_a_bad_input_exit(tmp_path) -> None:
    args = ["titan", "--device", "cpu", "--step-graphs", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--step-graphs replays CUDA launches: it needs --device cuda, got cpu" in (result.output)


@pytest.mark.parametrize(
    ("flags", "before", "during"),
    [([], True, True), ([], False, False), (["--no-step-graphs"], True, False)],
)
def test_titan_command_leaves_the_step_graphs_to_the_library_unless_told(
    tmp_path, monkeypatch, flags, before, during
) -> None:
    """Without a flag the run keeps the process's setting (on by default, or as
    ``STOCHROUND_STEP_GRAPHS`` says), also on the CPU; ``--no-step-graphs`` turns them off
    for the run; the setting is restored after it."""
    from stochround.integrations import torchtitan
    from stochround.nn.step_graphs import STEP_GRAPHS, use_step_graphs

    seen = []

    def run_training(config, device, fields) -> Path:
        seen.append((device, STEP_GRAPHS.enabled))
        return tmp_path / "rows.jsonl"

    monkeypatch.setattr(torchtitan, "run_training", run_training)
    previous = use_step_graphs(before)
    try:
        args = ["titan", "--device", "cpu", *flags, "--out", str(tmp_path)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert seen == [("cpu", during)] and STEP_GRAPHS.enabled == before
    finally:
        use_step_graphs(previous)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "cpu", "--compile"], "--cudagraphs replays CUDA launches: it needs "),
        (["--device", "cuda"], "--cudagraphs captures the compiled blocks: it needs --compile"),
        (
            ["--device", "cuda", "--compile", "--step-graphs"],
            "the layers' step graphs are off under it (with them on the backward quantizes "
            "again); drop --step-graphs",
        ),
    ],
    ids=["cpu", "uncompiled", "step-graphs"],
)
def test_titan_command_cudagraphs_without_its_preconditions_is_a_bad_input_exit(
    tmp_path, flags, message
) -> None:
    args = ["titan", "--cudagraphs", *flags, "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_titan_command_cudagraphs_runs_with_graph_trees_on_and_step_graphs_off(
    tmp_path, monkeypatch
) -> None:
    """``--cudagraphs``: the run sees inductor's CUDA graph trees on (what
    ``mode="reduce-overhead"`` sets) and the layers' step graphs off; both settings are
    restored after it.  The trainer is stood in for (no GPU here)."""
    import torch._inductor.config as inductor_config

    from stochround.integrations import torchtitan
    from stochround.nn.step_graphs import STEP_GRAPHS, use_step_graphs

    seen = []

    def run_training(config, device, fields) -> Path:
        seen.append((device, inductor_config.triton.cudagraphs, STEP_GRAPHS.enabled))
        return tmp_path / "rows.jsonl"

    monkeypatch.setattr(torchtitan, "run_training", run_training)
    monkeypatch.setattr(inductor_config.triton, "cudagraphs", False)
    previous = use_step_graphs(True)
    try:
        args = ["titan", "--device", "cuda", "--compile", "--cudagraphs", "--out", str(tmp_path)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert seen == [("cuda", True, False)]
        assert (inductor_config.triton.cudagraphs, STEP_GRAPHS.enabled) == (False, True)
    finally:
        use_step_graphs(previous)


def test_titan_command_bad_activation_checkpoint_is_a_bad_input_exit(tmp_path) -> None:
    args = ["titan", "--activation-checkpoint", "offload", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "activation_checkpoint must be one of none, full, selective; got 'offload'" in (
        result.output
    )


def test_titan_command_bad_reshard_after_forward_is_a_bad_input_exit(tmp_path) -> None:
    args = ["titan", "--reshard-after-forward", "sometimes", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert (
        "reshard_after_forward must be one of 'default', 'always', 'never'; got 'sometimes'"
        in result.output
    )


def test_an_unsupported_torchtitan_is_an_import_error_naming_the_releases() -> None:
    from stochround.integrations.torchtitan.versions import titan_api

    assert (titan_api("0.2.2"), titan_api("0.3.0")) == ("0.2", "0.3")
    with pytest.raises(ImportError, match=r"supports torchtitan 0\.2\.2, 0\.3\.0; .* 0\.2\.1 is"):
        titan_api("0.2.1")
    with pytest.raises(ImportError, match=r"needs torchtitan: .*'stochround\[torchtitan-0\.2\]'"):
        titan_api(None)


def checkpointed_run(
    folder: Path,
    ranks: int,
    steps: int,
    interval: int,
    load: Path | None = None,
    device: str = "cpu",
) -> tuple[list[float], dict[str, object]]:
    """``titan_checkpointed_run.py`` on ``ranks`` processes on ``device`` (gloo on the CPU,
    NCCL on GPUs; two: FSDP2): the losses of its steps and its last checkpoint, every
    entry flattened to a dotted key."""
    script = Path(__file__).with_name("titan_checkpointed_run.py")
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    args = [str(script), str(folder), str(steps), str(interval), str(load or ""), device]
    # without the rendezvous an in-process run of an earlier test left in os.environ (its
    # store's port may still be taken): the run picks its own, or torchrun sets them
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [*launch, *args], env=env, capture_output=True, text=True, timeout=500, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert [row["world_size"] for row in rows] == [ranks] * len(rows)
    whole = folder / "whole.pt"
    dcp_to_torch_save(folder / "checkpoint" / f"step-{steps}", whole)
    return [row["loss"] for row in rows], flat(torch.load(whole, weights_only=False))


def flat(tree: dict[str, object], prefix: str = "") -> dict[str, object]:
    """A nested state dict as ``{dotted key: leaf}``."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# torchtitan 0.3.0's FSDP2 does not run on gloo ranks on this torch (2.13 CPU): under its
# spmd_types backend fully_shard wants DTensor parameters ("all parameters must be DTensors
# on the full SPMD mesh", a bf16 model too), under partial_dtensor its reduce-scatter uses
# ReduceOp.PREMUL_SUM, which gloo lacks.  Its two-rank resume is for NCCL.
FSDP2_ON_GLOO = pytest.mark.skipif(
    TITAN_API == "0.3", reason="torchtitan 0.3.0's FSDP2 does not run on gloo (see above)"
)


@pytest.mark.parametrize(
    ("device", "ranks"),
    [
        ("cpu", 1),
        pytest.param("cpu", 2, marks=FSDP2_ON_GLOO),
        pytest.param("cuda", 1, marks=pytest.mark.gpu),
        pytest.param("cuda", 2, marks=pytest.mark.gpus2),
    ],
    ids=["one-rank", "fsdp2-two-ranks", "one-gpu", "fsdp2-two-gpus"],
)
def test_a_run_resumed_from_a_dcp_checkpoint_is_the_uninterrupted_run(
    tmp_path, device, ranks
) -> None:
    """torchtitan's trainer (either release: 0.3.0's runs on the CPU since `cpu_trainer`
    serves it; before, only a plain loop did) under nvfp4 (SR gradients) and SRAdamW: 4
    steps saving a full
    checkpoint at step 2, then a run resumed from it for steps 3 and 4.  The resumed run's
    losses are the uninterrupted run's, and its step-4 checkpoint is the uninterrupted one's
    entry for entry, bit for bit: parameters, the layers' step counters, the optimizer's
    states and steps, the LR scheduler, the data loader's position.  On GPUs too (the
    layers' step graphs on, torch's deterministic algorithms)."""
    losses, whole = checkpointed_run(tmp_path / "whole", ranks, 4, 2, None, device)
    middle = tmp_path / "whole" / "checkpoint" / "step-2"
    resumed_losses, resumed = checkpointed_run(tmp_path / "resumed", ranks, 4, 2, middle, device)
    assert resumed_losses == losses[2:]
    assert resumed.keys() == whole.keys()
    different = [
        key
        for key, value in whole.items()
        if not (
            torch.equal(value, resumed[key])
            if isinstance(value, torch.Tensor)
            else value == resumed[key]
        )
    ]
    assert different == []
    assert int(whole["layers.1.feed_forward.w2.step"]) == 4
    assert int(whole["optimizer.state.layers.1.feed_forward.w2.weight.step"]) == 4
    assert whole["train_state.step"] == 4
