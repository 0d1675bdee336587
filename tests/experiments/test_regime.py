"""The recipes-regime experiment: its quick run's rows, the closed-form stall, and RN's
stall against SR in the quick noise-axis configuration."""

from __future__ import annotations

import math

import pytest
import torch

from stochround import blocks
from stochround.experiments import EXPERIMENTS
from stochround.experiments import recipes_regime as regime
from stochround.experiments.regime_lsq import (
    NO_OUTLIERS,
    RHT_SIZE,
    Outliers,
    Training,
    batch_lr,
    channel_scale,
    data_lr,
    least_squares,
    preconditioned_lr,
    predicted_stall,
    predicted_stall_iid,
    round_dy,
    round_x,
    train,
    with_outliers,
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
    noise, horizon, error, training, closed = experiment.tables
    assert noise.columns == ["batch", "peak lr", "fp32", "bf16", "nvfp4_rn", "nvfp4_sr", "RN - SR"]
    assert [row[0] for row in noise.rows] == [str(b) for b in sizes.batches]
    assert horizon.columns[:3] == ["batch", "gradient", "final excess loss"]
    assert len(horizon.rows) == 6
    # every quantized horizon row names the first crossing of each of its 3 seeds
    assert all(len(row[4].split(", ")) == sizes.seeds for row in horizon.rows if row[3] != "-")
    assert sizes.outliers == (NO_OUTLIERS, Outliers(1, 30.0), Outliers(1, 30.0, 16))
    labels = ["none", "1 x 30", "1 x 30, 1/16"]
    assert [row[0] for row in error.rows] == [row[0] for row in training.rows] == labels
    rht_columns = ["dy RN, no RHT", "dy RN, RHT-16", "RHT - none",
                   "dy SR, no RHT", "dy SR, RHT-16", "RHT - none"]  # fmt: skip
    assert error.columns == ["outliers", *rht_columns]
    assert training.columns == ["outliers", "fp32", *rht_columns]
    # the errors are averages of per-step relative errors: a mean ± std, positive, below 10
    for row in error.rows:
        for cell in (row[1], row[2], row[4], row[5]):
            mean = float(cell.split(" ± ")[0])
            assert 0 < mean < 10
        assert row[3] in ("none",) or row[3].startswith(("lower by", "higher by"))
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


def test_channel_outliers_are_exactly_the_chosen_channels_for_every_token() -> None:
    base = least_squares(64, 8, 4, 0.5, 3)
    # a power-of-two scale multiplies exactly: columns 0 and 1 are 64 x, the rest untouched
    scaled = least_squares(64, 8, 4, 0.5, 3, Outliers(2, 64.0))
    assert torch.equal(scaled.x[:, :2], 64.0 * base.x[:, :2])
    assert torch.equal(scaled.x[:, 2:], base.x[:, 2:])
    assert torch.equal(with_outliers(base.x, NO_OUTLIERS), base.x)
    with pytest.raises(
        ValueError, match=r"outliers.channels must be in 0\.\.8 \(x.s channels\); got 9"
    ):
        with_outliers(base.x, Outliers(9, 10.0))


def test_token_outliers_are_exactly_the_chosen_tokens_and_channels() -> None:
    base = least_squares(64, 8, 4, 0.5, 3)
    scaled = least_squares(64, 8, 4, 0.5, 3, Outliers(3, 64.0, 16))
    tokens, channels = torch.nonzero(scaled.x != base.x, as_tuple=True)
    # tokens 0, 16, 32, 48 (one in 16, the first of each block) of channels 0, 1, 2 only
    assert sorted(set(tokens.tolist())) == [0, 16, 32, 48]
    assert sorted(set(channels.tolist())) == [0, 1, 2]
    assert torch.equal(scaled.x[::16, :3], 64.0 * base.x[::16, :3])
    assert Outliers(3, 64.0, 16).label == "3 x 64, 1/16"
    assert Outliers(3, 64.0).label == "3 x 64" and NO_OUTLIERS.label == "none"
    with pytest.raises(ValueError, match=r"every must be an int >= 1 \(1: every token\); got 0"):
        Outliers(1, 10.0, 0)
    with pytest.raises(ValueError, match="channels must be >= 0; got -1"):
        Outliers(-1)


def test_one_token_outlier_zeroes_its_block_with_and_without_the_rht() -> None:
    # one 16-token block of one channel: the outlier 96 at token 0, 15 values in (-1, 1)
    generator = torch.Generator().manual_seed(1)
    x = (torch.rand(16, 1, generator=generator) * 2 - 1).contiguous()
    x[0, 0] = 96.0
    # no RHT: the block scale is 96 / 6 = 16 (FP4's smallest nonzero, 0.5 x 16 = 8, lies
    # above every other value's double), so the outlier is exact and the rest exactly 0
    plain = round_x(x, None)
    assert plain[0, 0] == 96.0
    assert torch.count_nonzero(plain[1:]) == 0
    # RHT-16: the outlier spread as 16 values of magnitude 96 / 4 = 24, the others' mix
    # (each at most 15 / 4) riding on them; FP4's top levels are 4 and 6 times the block
    # scale (amax / 6), and here every rotated value lies above 5 / 6 of the amax: the
    # codes are one magnitude, 6, and un-rotated they are the spike alone -- the 15 small
    # values are lost as without the RHT, and the outlier is no longer exact
    rotated = blocks.quantize(x, "nvfp4", "rne", axis=0, rht=RHT_SIZE, rht_bf16=True)
    nibbles = torch.cat([rotated.codes & 0xF, rotated.codes >> 4]).flatten()
    assert set((nibbles & 0x7).tolist()) == {0b111}  # e2m1 magnitude 6
    spread = round_x(x, RHT_SIZE)
    assert torch.count_nonzero(spread[1:]) == 0
    assert spread[0, 0] != 96.0


def test_wgrad_rht_runs_along_the_tokens_and_never_mixes_channels() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator, dtype=torch.float64)
    dy = torch.randn(64, 4, generator=generator, dtype=torch.float64)
    signs = blocks.random_signs(RHT_SIZE, seed=5)
    # the rotation along the tokens is orthogonal: dy^T x unchanged up to rounding
    hx = blocks.hadamard(x, RHT_SIZE, signs=signs, axis=0)
    hdy = blocks.hadamard(dy, RHT_SIZE, signs=signs, axis=0)
    torch.testing.assert_close(hdy.T @ hx, dy.T @ x, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(hx, x)
    # one outlier channel: x's NVFP4 wgrad operand after the RHT (as nvfp4()) is zero on
    # every other channel, exactly -- the 16-token blocks and their rotation stay in it
    one = torch.zeros(64, 8)
    one[:, 3] = 100.0 * x[:, 3].float()
    quantized = round_x(one, RHT_SIZE)
    assert torch.count_nonzero(quantized[:, [0, 1, 2, 4, 5, 6, 7]]) == 0
    assert torch.count_nonzero(quantized[:, 3]) > 48


def test_channel_scale_preconditions_to_the_normalized_data() -> None:
    x = torch.tensor([[2.0, 0.0], [0.0, 1.0], [2.0, 1.0], [-2.0, -1.0]])
    # mean squares: (4 + 0 + 4 + 4) / 4 = 3 and (0 + 1 + 1 + 1) / 4 = 0.75
    assert channel_scale(x).tolist() == [3.0, 0.75]
    normalized = x / channel_scale(x).sqrt()
    assert preconditioned_lr(x) == data_lr(normalized)
    scaled = with_outliers(x, Outliers(1, 100.0))
    # an outlier channel leaves the preconditioned step unchanged (up to rounding) while
    # plain gradient descent's stable step falls by about scale^2
    assert preconditioned_lr(scaled) == pytest.approx(preconditioned_lr(x), rel=1e-6)
    assert data_lr(scaled) < data_lr(x) / 1000
