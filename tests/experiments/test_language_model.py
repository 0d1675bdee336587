"""Tests for stochround.experiments.language_model (`stochround run lm`): the data, the model,
the ratio probe, micro training runs of every row, and the report's tables."""

import dataclasses
import math
import platform

import pytest
import torch
import torch.nn.functional as F

from stochround import nn as snn
from stochround.experiments import EXPERIMENTS, lm_data, lm_model, lm_rows, lm_summary, lm_training
from stochround.experiments import language_model as lm
from stochround.experiments.report import NoProgress

# the smallest sizes every recipe's blocks fit: d 64 (RHT-64 of mxfp4_tseng along the
# projection's 64 outputs), tokens 2 x 32 = 64 (RHT-64 along the tokens in wgrad)
MICRO = lm_rows.Sizes(
    d_model=64,
    n_layer=1,
    n_head=2,
    context=32,
    batch=2,
    steps=3,
    warmup=1,
    lr=3e-3,
    log_every=1,
    eval_batches=1,
    seeds=1,
)


@pytest.fixture(scope="module")
def data():
    return lm_data.load_data()


@pytest.fixture(scope="module")
def micro_runs(data):
    """Every row at MICRO sizes with seed 5."""
    return lm_training.run_rows(MICRO, 5, "cpu", NoProgress(), data=data)


def test_lm_is_registered_last():
    assert list(EXPERIMENTS)[-1] == "lm"
    assert EXPERIMENTS["lm"] is lm


def test_the_data_are_the_listed_files_split_by_file(data):
    root = lm_data.stdlib_folder()
    assert data.train.dtype == torch.uint8
    assert data.train.numel() == sum((root / n).stat().st_size for n in lm_data.TRAIN_FILES)
    assert data.validation.numel() == sum(
        (root / n).stat().st_size for n in lm_data.VALIDATION_FILES
    )
    assert not set(lm_data.TRAIN_FILES) & set(lm_data.VALIDATION_FILES)
    assert len(lm_data.TRAIN_FILES) == 40
    first = (root / lm_data.TRAIN_FILES[0]).read_bytes()
    assert bytes(data.train[: len(first)].tolist()) == first


def test_a_missing_file_is_named_in_the_error(tmp_path):
    (tmp_path / "a.py").write_bytes(b"x = 1\n")
    with pytest.raises(ValueError, match=r"files nope\.py, not found in"):
        lm_data.load_data(tmp_path, ("a.py",), ("nope.py",))
    with pytest.raises(ValueError, match=r"share a\.py"):
        lm_data.load_data(tmp_path, ("a.py",), ("a.py",))
    (tmp_path / "b.py").write_bytes(b"y = 2\n")
    found = lm_data.load_data(tmp_path, ("a.py",), ("b.py",))
    assert bytes(found.validation.tolist()) == b"y = 2\n"


def test_training_batches_are_shifted_windows_fixed_by_the_seed():
    text = torch.arange(200, dtype=torch.uint8)
    starts = lm_data.batch_starts(200, 5, 4, 16, torch.Generator().manual_seed(3))
    again = lm_data.batch_starts(200, 5, 4, 16, torch.Generator().manual_seed(3))
    assert starts.shape == (5, 4)
    assert torch.equal(starts, again)
    assert int(starts.min()) >= 0
    assert int(starts.max()) <= 200 - 17  # the last window ends at the text's last byte
    inputs, targets = lm_data.windows_at(text, starts[2], 16)
    assert inputs.shape == targets.shape == (4, 16)
    assert torch.equal(inputs[:, 0], starts[2])  # the arange text: a byte is its offset
    assert torch.equal(targets, inputs + 1)
    with pytest.raises(ValueError, match="shorter than context"):
        lm_data.batch_starts(16, 5, 4, 16, torch.Generator())


def test_validation_windows_are_evenly_spaced_and_fixed():
    text = torch.arange(100, dtype=torch.uint8)
    windows = lm_data.validation_windows(text, 3, 9)
    assert windows[:, 0].tolist() == [0, 45, 90]
    assert windows.shape == (3, 10)
    assert torch.equal(windows[2], torch.arange(90, 100))


def test_the_model_maps_bytes_to_logits_and_counts_its_parameters():
    model = lm_model.build_model(MICRO, torch.Generator().manual_seed(0))
    assert sum(p.numel() for p in model.parameters()) == lm_model.parameter_count(64, 1, 32)
    assert model(torch.zeros(3, 32, dtype=torch.long)).shape == (3, 32, 256)
    # the full size: about 10M parameters, by the formula 2 V d + C d + L (12 d^2 + 4 d) + 2 d
    assert (
        lm_model.parameter_count(384, 6, 256)
        == 2 * 256 * 384 + 256 * 384 + 6 * (12 * 384**2 + 4 * 384) + 2 * 384
    )
    assert lm_model.parameter_count(384, 6, 256) == 10_921_728


def test_the_initial_weights_depend_on_the_seed_only():
    first = lm_model.build_model(MICRO, torch.Generator().manual_seed(1)).state_dict()
    second = lm_model.build_model(MICRO, torch.Generator().manual_seed(1)).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert float(first["blocks.0.ln1.weight"].min()) == 1.0
    assert float(first["blocks.0.ln1.bias"].abs().max()) == 0.0


def test_the_schedule_warms_up_decays_and_ends_low():
    sizes = dataclasses.replace(MICRO, steps=100, warmup=10, lr=1.0)
    assert lm_training.learning_rate(0, sizes) == pytest.approx(0.1)
    assert lm_training.learning_rate(9, sizes) == pytest.approx(1.0)
    assert lm_training.learning_rate(10, sizes) == pytest.approx(1.0)
    assert lm_training.learning_rate(74, sizes) == pytest.approx(lm_training.LOW_LR, abs=2e-3)
    assert lm_training.learning_rate(75, sizes) == lm_training.LOW_LR
    assert lm_training.learning_rate(99, sizes) == lm_training.LOW_LR
    assert lm_training.logging_steps(sizes)[:3] == [0, 1, 2]
    assert lm_training.logging_steps(dataclasses.replace(sizes, log_every=30)) == [
        0,
        30,
        60,
        90,
        99,
    ]


def test_each_row_builds_its_recipe_with_the_run_seed_and_the_lm_head_kept():
    expected = {
        "bf16": None,
        "nvfp4": snn.nvfp4(seed=7, keep=("lm_head",)),
        "nvfp4_rn": snn.nvfp4(stochastic_rounding=False, seed=7, keep=("lm_head",)),
        "nvfp4_no_rht": snn.nvfp4(rht=False, seed=7, keep=("lm_head",)),
        "mxfp4_tseng": snn.mxfp4_tseng(seed=7, keep=("lm_head",)),
        "mxfp8": snn.mxfp8(seed=7, keep=("lm_head",)),
        "int8": snn.int8("uniform", seed=7, keep=("lm_head",)),
        "nvfp4_fp32_adamw": snn.nvfp4(seed=7, keep=("lm_head",)),
        "gaussws_e3m2": None,
        "gaussws_e2m3": None,
        "gaussws_e4m3": None,
        "diffq_e3m2": None,
        "sr_e3m2": None,
    }
    assert [row.key for row in lm_rows.ROWS] == list(expected)
    for row in lm_rows.ROWS:
        assert row.make_recipe(7) == expected[row.key], row.key
    assert [row.optimizer for row in lm_rows.ROWS].count("fp32-master") == 1


def test_every_quantized_row_quantizes_the_four_linears_of_each_block(micro_runs):
    for key, (run,) in micro_runs.items():
        row = lm_rows.row_by_key(key)
        if row.recipe is None:
            assert (run.quantized_layers, run.recipe_names, run.ratio) == (0, [], [])
            continue
        # qkv, proj, fc, fc2 per block; the lm_head is kept in bf16
        assert run.quantized_layers == 4 * MICRO.n_layer, key
        assert run.recipe_names == [row.make_recipe(0).name], key
        assert len(run.ratio) == len(run.steps) == MICRO.steps, key
        assert all(0 < r < math.inf for r in run.ratio), (key, run.ratio)
        assert all(math.isfinite(v) for v in run.validation + run.train_loss), key


def test_a_run_is_a_function_of_its_seed(data, micro_runs):
    again = lm_training.train_run(lm_rows.row_by_key("nvfp4"), MICRO, 5, data, "cpu", NoProgress())
    (first,) = micro_runs["nvfp4"]
    assert again.train_loss == first.train_loss
    assert again.validation == first.validation
    assert again.ratio == first.ratio
    # every row of a seed starts from the same weights and sees the same first batch, and
    # the quantized forward pass differs from bf16's
    losses = {key: runs[0].train_loss[0] for key, runs in micro_runs.items()}
    assert losses["nvfp4"] == losses["nvfp4_rn"] == losses["nvfp4_fp32_adamw"]
    assert losses["nvfp4"] != losses["bf16"]


def test_a_cached_run_is_read_back_under_the_same_settings_only(data, tmp_path):
    row = lm_rows.row_by_key("bf16")
    first = lm_training.cached_run(row, MICRO, 5, data, "cpu", NoProgress(), tmp_path)
    path = tmp_path / "bf16-seed5.json"
    assert path.is_file()
    stored = lm_training.cached_run(row, MICRO, 5, data, "cpu", NoProgress(), tmp_path)
    assert stored == first
    other = dataclasses.replace(MICRO, steps=2)
    assert (
        len(lm_training.cached_run(row, other, 5, data, "cpu", NoProgress(), tmp_path).steps) == 2
    )


def test_the_probe_measures_the_exact_gradient_and_the_quantization_noise():
    """With loss = sum(c * y), dy = c whatever the quantized forward gives, so the exact
    weight gradient is c^T x."""
    generator = torch.Generator().manual_seed(0)
    layer = snn.quantize_(torch.nn.Linear(64, 32, bias=False), snn.nvfp4(seed=1))
    x = torch.randn(64, 64, generator=generator)
    c = torch.randn(64, 32, generator=generator)
    probe = lm_training.NoiseProbe(layer)
    probe.active = True
    (layer(x) * c).sum().backward()
    ratio, gradient, noise = probe.ratio()
    exact = c.T @ x
    assert gradient == pytest.approx(float(exact.norm()), rel=1e-6)
    assert noise == pytest.approx(float((layer.weight.grad - exact).norm()), rel=1e-6)
    assert ratio == pytest.approx(gradient / noise)
    assert noise > 0
    probe.remove()
    with pytest.raises(ValueError, match="active forward and backward"):
        probe.ratio()


def _result(key, seed, final, ratio=()):
    return lm_training.RunResult(
        row=key,
        seed=seed,
        steps=[0, 10],
        validation=[5.0, final],
        ratio=list(ratio),
        train_loss=[5.0],
        seconds=2.0,
        quantized_layers=0 if not ratio else 4,
    )


def test_the_tables_give_paired_differences_and_their_verdicts():
    results = {
        "bf16": [_result("bf16", s, v) for s, v in enumerate([2.0, 2.2, 2.4])],
        # +10 %, +10 %, +10 %: no spread, a difference
        "nvfp4": [_result("nvfp4", s, v, (3.0, 1.5)) for s, v in enumerate([2.2, 2.42, 2.64])],
        # paired differences to nvfp4 -0.01, +0.01, -0.02 (nats): smaller than their spread
        "nvfp4_rn": [
            _result("nvfp4_rn", s, v, (3.0, 2.0)) for s, v in enumerate([2.21, 2.41, 2.66])
        ],
    }
    tables, key = lm_summary.summarize(results)
    assert key["nvfp4_vs_bf16_pct_mean"] == pytest.approx(10.0)
    assert key["nvfp4_vs_bf16"] == "higher by 10 %"
    assert key["nvfp4_vs_nvfp4_rn"] == "none"
    assert key["nvfp4_ratio_below_sqrt3_step"] == 10
    assert key["nvfp4_rn_ratio_below_sqrt3_step"] == -1
    assert key["bf16_val_loss_mean"] == pytest.approx(2.2)
    assert key["bf16_val_loss_std"] == pytest.approx(0.2)
    assert tables[0].rows[0][:2] == ["bf16", "2.2000 ± 0.2000"]
    assert tables[0].rows[1][4] == "1.5; 10, 10, 10"
    assert tables[1].rows == [
        ["SR vs RN gradients", "nvfp4 - nvfp4_rn", "-0.0067 ± 0.0153", "none"]
    ]


def test_one_seed_has_no_verdict():
    assert lm_summary.verdict([0.5]) == "n/a (1 seed)"
    assert lm_summary.verdict([1.0, 1.2]) == "higher by 1.1"
    assert lm_summary.verdict([-1.0, 1.2]) == "none"


def test_the_device_defaults_to_the_cpu_for_the_quick_run():
    assert lm.resolve_device(None, quick=True) == "cpu"
    assert lm.resolve_device("cpu", quick=False) == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert lm.resolve_device(None, quick=False) == expected
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or None; got 'gpu'"):
        lm.resolve_device("gpu", quick=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_is_an_error():
    with pytest.raises(ValueError, match="needs CUDA"):
        lm.resolve_device("cuda", quick=True)


def test_the_loss_is_cross_entropy_in_nats_per_byte(data):
    model = lm_model.build_model(MICRO, torch.Generator().manual_seed(0))
    windows = lm_data.validation_windows(data.validation, 4, MICRO.context)
    with torch.no_grad():
        logits = model(windows[:, :-1])
        expected = F.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))
    assert lm_training.validation_loss(model, windows, 4) == pytest.approx(float(expected))
    # an untrained model with small weights predicts nearly uniformly: about ln 256
    assert float(expected) == pytest.approx(math.log(256), abs=0.05)


def test_the_experiment_reports_every_row_and_records_its_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "QUICK", MICRO)
    experiment = lm.run(True, 9, tmp_path, NoProgress())
    assert experiment.name == "lm"
    assert [row[0] for row in experiment.tables[0].rows] == [row.label for row in lm_rows.ROWS]
    assert [row[0] for row in experiment.tables[1].rows] == [c[2] for c in lm_rows.COMPARISONS]
    assert experiment.settings["python"] == platform.python_version()
    assert experiment.settings["device"] == "cpu"
    assert experiment.settings["seeds"] == 1
    key = experiment.key_numbers
    assert key["parameters"] == lm_model.parameter_count(64, 1, 32)
    assert key["nvfp4_quantized_layers"] == 4
    assert key["bf16_quantized_layers"] == 0
    assert key["nvfp4_vs_nvfp4_rn"] == "n/a (1 seed)"
    assert [figure.name for figure in experiment.figures] == ["lm_loss.png", "lm_ratio.png"]
    for figure in experiment.figures:
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stored = sorted(path.name for path in (tmp_path / "lm-runs").iterdir())
    assert stored == sorted(f"{row.key}-seed9.json" for row in lm_rows.ROWS)


def test_the_sampling_rows_sample_the_four_linears_of_each_block_and_not_the_head(micro_runs):
    """GaussWS, DiffQ and SR fake-quantization rows parametrize the blocks' Linears (4 a
    block) and leave the lm_head bf16; no other row samples weights."""
    for key, (run,) in micro_runs.items():
        row = lm_rows.row_by_key(key)
        expected = 4 * MICRO.n_layer if row.sampling is not None else 0
        assert run.sampled_layers == expected, key
        assert run.quantized_layers == 0 or row.sampling is None
