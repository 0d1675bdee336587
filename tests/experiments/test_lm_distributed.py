"""The lm experiment under FSDP2 (`stochround.experiments.lm_distributed`) on two ranks.

- "same" batches: rows bf16 and nvfp4 (SR gradients, RHT, 2-D weight blocks, the SR AdamW)
  trained with every block and the root `fully_shard`-ed give the single-process run's
  training and validation losses bit for bit, on both ranks.
- "split" batches (data parallel): both ranks log the same curves (the mean over the
  ranks), which differ from the single process's by rounding only.
- A folder of single-device runs serves as the reference (written, then read); rank 0
  writes the JSON of both curves and their comparison.

Every case of a device runs in one spawn of the ranks (`ranks.run_ranks`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks import devices, run_ranks

from stochround.experiments import lm_data, lm_rows
from stochround.experiments import lm_distributed as lmd
from stochround.experiments.report import NoProgress

# tiny sizes: d 32 holds whole 16 x 16 NVFP4 weight tiles, and the tokens of a step (and
# of a rank's half of it) are a multiple of the RHT's 16
TINY = lm_rows.Sizes(
    d_model=32,
    n_layer=1,
    n_head=2,
    context=16,
    batch=4,
    steps=4,
    warmup=2,
    lr=3e-3,
    log_every=2,
    eval_batches=1,
    seeds=1,
)
SEED = 11
CASES = (("bf16", "same"), ("nvfp4", "same"), ("bf16", "split"))


def body(rank: int, world_size: int, device: str, folder: str) -> dict[str, lmd.Outcome]:
    # two ranks of two threads each spin on two cores (a third of the speed); the
    # reference and the sharded run share the process, so they share the thread count
    torch.set_num_threads(1)
    if device == "cuda":
        lmd.deterministic_cuda()
    data = lm_data.load_data()
    outcome = {
        f"{row}/{split}": lmd.train_sharded(row, TINY, SEED, data, device, split, NoProgress())
        for row, split in CASES
    }
    # a reference folder: the first call trains and writes the reference, the second reads it
    for name in ("written", "read"):
        outcome[f"bf16/{name}"] = lmd.train_sharded(
            "bf16", TINY, SEED, data, device, "same", NoProgress(), Path(folder)
        )
    return outcome


@pytest.fixture(scope="module", params=devices())
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("lm-runs")
    return run_ranks(body, str(folder), device=request.param)


@pytest.mark.parametrize("row", ["bf16", "nvfp4"])
def test_fsdp2_on_the_same_batch_equals_one_device_bit_for_bit(outcomes, row: str) -> None:
    first, second = (outcome[f"{row}/same"] for outcome in outcomes)
    reference = first.reference
    assert reference is not None and second.reference is None  # rank 0 trains it
    for run in (first.run, second.run):
        assert lmd.bit_equal(run.train_loss, reference.train_loss)
        assert lmd.bit_equal(run.validation, reference.validation)
        assert len(run.train_loss) == TINY.steps and run.steps == [0, 2, 3]
    # the runs trained, and nvfp4's quantized every Linear of the block (qkv, proj, fc,
    # fc2), so the equality covers the recipe's quantized GEMMs
    assert reference.train_loss[-1] < reference.train_loss[0]
    assert first.run.quantized_layers == (4 if row == "nvfp4" else 0)
    assert first.run.ratio == []  # not measured on sharded gradients


def test_fsdp2_on_split_batches_agrees_across_ranks_and_differs_by_rounding(outcomes) -> None:
    first, second = (outcome["bf16/split"] for outcome in outcomes)
    assert first.reference is not None
    assert lmd.bit_equal(first.run.train_loss, second.run.train_loss)
    assert lmd.bit_equal(first.run.validation, second.run.validation)
    comparison = lmd.compare(first.run, first.reference)
    # each rank's bf16 gradient of half the batch is rounded before the reduce-scatter
    # averages them: the curves part from the second step on, by about bf16's rounding
    assert not comparison["train_bit_equal"]
    assert comparison["train_max_relative"] < 1e-3
    assert comparison["validation_max_relative"] < 1e-3


def test_a_reference_folder_is_written_then_read(outcomes) -> None:
    written, read = outcomes[0]["bf16/written"], outcomes[0]["bf16/read"]
    assert written.reference_source.startswith("inline, written to ")
    assert read.reference_source.endswith(f"bf16-seed{SEED}.json")
    assert read.reference is not None and written.reference is not None
    assert lmd.bit_equal(read.reference.train_loss, written.reference.train_loss)
    assert lmd.bit_equal(read.run.train_loss, read.reference.train_loss)


def test_rank_zero_writes_both_curves_and_their_comparison(outcomes, tmp_path: Path) -> None:
    outcome = outcomes[0]["nvfp4/same"]
    path = lmd.write(tmp_path, TINY, outcome, "cpu", "same", 2, "gloo")
    assert path.name == "lm-distributed-nvfp4-same-w2.json"
    payload = json.loads(path.read_text())
    assert payload["settings"]["world_size"] == 2 and payload["settings"]["row"] == "nvfp4"
    assert payload["comparison"]["train_bit_equal"] is True
    assert payload["comparison"]["first_differing_step"] is None
    assert payload["distributed"]["train_loss"] == outcome.run.train_loss
    with pytest.raises(ValueError, match="rank 0's outcome"):
        lmd.write(tmp_path, TINY, outcomes[1]["nvfp4/same"], "cpu", "same", 2, "gloo")


def test_a_rank_takes_its_contiguous_slice_of_the_batch() -> None:
    offsets = torch.arange(8)
    assert torch.equal(lmd.rank_slice(offsets, 1, 2), torch.arange(4, 8))
    assert torch.equal(lmd.rank_slice(offsets, 0, 4), torch.arange(0, 2))
    with pytest.raises(ValueError, match="batch must be a multiple of the world size"):
        lmd.rank_slice(torch.arange(7), 0, 2)


def test_an_unknown_batch_split_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_split must be one of same, split; got 'half'"):
        lmd.fsdp_placement("cpu", "half")


def test_curves_compare_bit_for_bit() -> None:
    assert lmd.bit_equal([1.5, 2.0], [1.5, 2.0])
    assert not lmd.bit_equal([0.0], [-0.0])  # equal under ==, not in their bits
    assert not lmd.bit_equal([1.0], [1.0 + 2**-52])
    assert lmd.max_relative([1.0, 3.0], [1.0, 2.0]) == 0.5
