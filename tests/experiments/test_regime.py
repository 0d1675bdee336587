"""The recipes-regime experiment: its quick run's rows, the closed-form stall, and RN's
stall against SR in the quick noise-axis configuration."""

from __future__ import annotations

import math

import pytest
import torch

from stochround.experiments import EXPERIMENTS
from stochround.experiments import recipes_regime as regime
from stochround.experiments.regime_lsq import (
    Training,
    batch_lr,
    least_squares,
    predicted_stall,
    predicted_stall_iid,
    round_dy,
    train,
)
from stochround.experiments.regime_plots import mean_std
from stochround.experiments.report import NoProgress


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("regime")
    return EXPERIMENTS["recipes-regime"].run(True, 7, out, NoProgress()), out


def test_quick_rows_columns_and_seeds(quick) -> None:
    experiment, out = quick
    sizes = regime.QUICK
    noise, horizon, gemm, training, closed = experiment.tables
    assert noise.columns == ["batch", "peak lr", "fp32", "bf16", "nvfp4_rn", "nvfp4_sr", "RN - SR"]
    assert [row[0] for row in noise.rows] == [str(b) for b in sizes.batches]
    assert horizon.columns[:3] == ["batch", "gradient", "final excess loss"]
    assert len(horizon.rows) == 6
    # every quantized horizon row names the first crossing of each of its 3 seeds
    assert all(len(row[4].split(", ")) == sizes.seeds for row in horizon.rows if row[3] != "-")
    assert [row[0] for row in gemm.rows] == [f"{r:g}" for r in sizes.rates]
    assert len(training.rows) == len(sizes.train_rates)
    assert closed.columns[-1] == "measured / predicted"
    assert experiment.key_numbers["seeds"] == sizes.seeds == 3
    # every mean ± std cell has a spread (3 seeds, ddof 1)
    assert all("±" in cell for row in noise.rows for cell in row[2:6])
    names = sorted(path.name for path in experiment.figures)
    assert names == [
        "regime_closed_form.png", "regime_horizon.png", "regime_noise.png", "regime_rht.png"
    ]  # fmt: skip
    assert all((out / name).exists() for name in names)


def test_predicted_stall_by_hand() -> None:
    # X = the first two unit vectors of R^3 (n = 3, d = 2): P_X keeps the first two rows,
    # so ||P_X e||^2 = 1^2 + 2^2 = 5 and the excess is 5 / (2 * 3)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    error = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    assert predicted_stall(x, error) == pytest.approx(5 / 6, rel=1e-12)
    # d m sigma^2 / (2 n): d = 32, m = 16, sigma^2 = 0.01, n = 512
    assert predicted_stall_iid(512, 32, 16, 0.01) == pytest.approx(0.005, rel=1e-12)


def test_round_dy_rejects_unknown_gradient() -> None:
    with pytest.raises(ValueError, match="gradient must be one of fp32, bf16"):
        round_dy(torch.zeros(16, 2), "fp8", 0, 0)


def test_rn_stalls_and_sr_does_not_in_quick_noise_config() -> None:
    sizes = regime.QUICK
    seeds = regime.seeds_of(7, sizes.seeds)
    finals = {}
    for gradient in ("fp32", "nvfp4_rn", "nvfp4_sr"):
        run = Training(sizes.steps, sizes.n, batch_lr(sizes.n, sizes.d), gradient)
        finals[gradient] = [
            train(least_squares(sizes.n, sizes.d, sizes.m, sizes.noise, s), run, s).excess[-1]
            for s in seeds
        ]
    rn, rn_std = mean_std(finals["nvfp4_rn"])
    sr, sr_std = mean_std(finals["nvfp4_sr"])
    fp32, fp32_std = mean_std(finals["fp32"])
    # RN stays above SR by more than the two spreads together; SR sits within its own
    # spread of fp32's level, RN far above it
    assert rn - sr > rn_std + sr_std
    assert rn - fp32 > rn_std + fp32_std
    assert sr - fp32 < rn - sr
    assert math.isfinite(rn) and rn > 0
