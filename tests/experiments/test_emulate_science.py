"""Tests for the emulate-science experiment's parts at small sizes (the quick run itself is
in test_experiments.py): the heat equation's rne stagnation, the MCA trace's worst site,
Lorenz-96's values and reproducibility under the emulation."""

import math

import pytest
import torch

from stochround.emulate import emulate
from stochround.experiments import EXPERIMENTS
from stochround.experiments import emulate_science as science

SEED = 2024


def test_registered_between_optimizer_state_and_recipes_regime():
    names = list(EXPERIMENTS)
    assert EXPERIMENTS["emulate-science"] is science
    assert names.index("emulate-science") == names.index("optimizer-state") + 1
    assert names.index("recipes-regime") == names.index("emulate-science") + 1


def test_heat_rne_freezes_and_stays_frozen():
    """fp16 rne: from step 247 on (12 x 12, r = 0.05) every increment is below half an ulp,
    so the state stops changing; one more step under the emulation leaves it bit for bit."""
    start = science.heat_start(12, 1)
    means, final, frozen = science.heat_run(start, 260, "float16", "rne", SEED)
    assert frozen == 247
    assert (means[frozen:] == means[-1]).all()
    assert torch.equal(final, final.half().double())  # every value an fp16 value
    with emulate("float16", "rne", seed=SEED):
        again = science.heat_step(final, science.DIFFUSION)
    assert torch.equal(again, final)
    # the float64 run has not stopped: the heat rne kept is still leaving
    reference, _, reference_frozen = science.heat_run(start, 260, None, "rne", SEED)
    assert reference_frozen is None
    assert means[-1, 0] > reference[-1, 0]


def test_heat_sr_keeps_moving_and_reproduces():
    start = science.heat_start(12, 2)
    first = science.heat_run(start, 30, "float16", "sr", SEED)
    second = science.heat_run(start, 30, "float16", "sr", SEED)
    other = science.heat_run(start, 30, "float16", "sr", SEED + 1)
    assert first[2] is None
    assert torch.equal(first[1], second[1])
    assert not torch.equal(first[1], other[1])
    assert not torch.equal(first[1][0], first[1][1])  # members draw their own words


def test_lorenz_values_in_the_format_and_reproducible():
    starts = science.lorenz_starts(2)
    bf16 = science.lorenz_run(starts, 3, "bfloat16", "sr", SEED)
    assert torch.equal(bf16, bf16.bfloat16().double())  # every stored value a bf16 value
    assert torch.equal(bf16, science.lorenz_run(starts, 3, "bfloat16", "sr", SEED))
    assert not torch.equal(bf16, science.lorenz_run(starts, 3, "bfloat16", "sr", SEED + 1))
    fp16 = science.lorenz_run(starts, 3, "float16", "rne", SEED)
    assert torch.equal(fp16, fp16.half().double())
    assert torch.equal(fp16, science.lorenz_run(starts, 3, "float16", "rne", SEED + 5))
    reference = science.lorenz_run(starts, 3, None, "rne", SEED)
    assert torch.equal(reference[0], starts)
    assert torch.equal(reference[1], science.rk4_step(starts, science.DT))


def test_mca_trace_points_at_the_cancelling_line(tmp_path):
    """The worst site is the naive formula's subtraction.  Its digits: the p log10 2 = 7.22
    digits of 24 bits less the log10(mean(x^2) / variance) = 4.47 the subtraction cancels;
    the estimate's spread with 16 runs is about 1 / sqrt(2 * 15) of the std, 0.08 digits,
    so +-1 digit is over 12 of those.  16 runs, as the quick experiment: the sum of squares
    rounds a tie at 24 bits (away with probability 1/2), which carries the cancelled
    digits, and all runs round it alike with probability 2**-15 (with 8 runs, 2**-7: one
    seed in 128 shows no spread at all)."""
    key, tables, result = science.profile(16, SEED, tmp_path)
    line = science.cancelling_line()
    assert science.PROGRAM.splitlines()[line - 1].strip().startswith("return (squares - total")
    assert key["mca_worst_site_line"] == line
    assert result.sites[0].site == f"{tmp_path / science.PROGRAM_NAME}:{line} naive_variance"
    assert tables[1].rows[0][0] == str(line)
    # the values k / 32 of 64 consecutive k: variance n (n + 1) / 12 / 32^2 = 65 / 192
    assert key["mca_exact_variance"] == 65 / 192
    expected = 24 * math.log10(2) - key["mca_expected_digits_lost"]
    assert key["mca_naive_digits"] == pytest.approx(expected, abs=1)
    assert key["mca_two_pass_digits"] > key["mca_naive_digits"] + 3
    again, _, _ = science.profile(16, SEED, tmp_path)
    assert again == key  # reproducible from the seed


def test_stream_seeds_wrap_at_two_to_the_64():
    assert science.stream_seed(SEED, 7) == SEED + 7
    assert science.stream_seed(2**64 - 1, 7) == 6
