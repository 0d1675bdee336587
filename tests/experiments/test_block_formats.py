"""Tests for the experiment ``block-formats`` (stochround.experiments.block_formats): its
quick run's tables, key numbers and figures, the statistics it reports, and its helpers on
inputs whose answers are exact."""

import math

import pytest
import torch

from stochround.blocks.formats import BLOCK_FORMATS
from stochround.experiments import DEFAULT_SEED, EXPERIMENTS, block_formats
from stochround.experiments.block_formats import (
    CASES,
    DATA,
    QUICK,
    Case,
    error_and_bias,
    key_name,
    long_sums,
    quantization_offset,
    rht_size,
    sample,
)
from stochround.experiments.report import NoProgress

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """The quick run with the default seed (once per module)."""
    out = tmp_path_factory.mktemp("block-formats")
    return block_formats.run(True, DEFAULT_SEED, out, NoProgress()), out


def test_the_experiment_is_registered_as_block_formats():
    assert EXPERIMENTS["block-formats"] is block_formats


def test_every_named_block_format_and_mxfp4_floor_3_4_is_a_case():
    assert [case.name for case in CASES[: len(BLOCK_FORMATS)]] == list(BLOCK_FORMATS)
    assert CASES[-1] == Case("mxfp4 floor-3/4", "mxfp4", {"scale_rule": "floor-3/4"})


def test_rht_groups_are_the_block_or_32_for_a_whole_row():
    assert rht_size(BLOCK_FORMATS["nvfp4"]) == 16
    assert rht_size(BLOCK_FORMATS["mxfp4"]) == 32
    assert rht_size(BLOCK_FORMATS["int8_rowwise"]) == 32


def test_the_tables_have_a_row_per_case_data_and_rht_and_the_figures_are_pngs(result):
    experiment, out = result
    errors, sums = experiment.tables
    assert len(errors.rows) == len(CASES) * 2 * len(DATA)
    assert len(sums.rows) == len(CASES) * 2
    assert [row[0] for row in sums.rows[:2]] == ["mxfp8_e4m3", "mxfp8_e4m3 rht"]
    assert errors.rows[0][:2] == ["mxfp8_e4m3", "gaussian"]
    assert [figure.name for figure in experiment.figures] == [
        "block_formats_error.png",
        "block_formats_sums.png",
    ]
    for figure in experiment.figures:
        assert (out / figure.name).read_bytes()[:8] == PNG
    assert experiment.settings["copies"] == QUICK.copies


def test_rne_has_one_copy_so_its_bias_is_its_error(result):
    key = result[0].key_numbers
    for case in CASES:
        for rht in ("", "_rht"):
            for kind in DATA:
                name = f"{key_name(case.label)}{rht}_{key_name(kind)}_rne"
                assert key[f"{name}_bias"] == key[f"{name}_error"] > 0


def test_sr_error_exceeds_rne_error_by_about_sqrt_2(result):
    """Per element, SR's mean squared error is nu (1 - nu) ulp^2 and rne's min(nu, 1 - nu)^2
    ulp^2 (nu: the position between the two neighbours), never more; for nu uniform the
    means are 1/6 and 1/12, an RMS ratio of sqrt(2).  Clamped elements err alike in both
    modes and lower the ratio.  Measured 1.24 .. 1.47 over the quick run's rows; band
    [1.1, 1.6]."""
    key = result[0].key_numbers
    for case in CASES:
        for rht in ("", "_rht"):
            for kind in DATA:
                name = f"{key_name(case.label)}{rht}_{key_name(kind)}"
                ratio = key[f"{name}_sr_error"] / key[f"{name}_rne_error"]
                assert 1.1 <= ratio <= 1.6, (name, ratio)


def test_sr_with_floor_3_4_is_unbiased_per_element(result):
    """floor-3/4 scales so that no element can round past the element's max: SR is then
    exactly unbiased, E[b_i] = 0, E[b_i^2] = Var_i / copies, and z^2 = sum_i b_i^2 /
    (sum of squared errors / copies) has mean ~1.  Its relative spread is sqrt(2 / N_eff),
    N_eff = (sum Var_i)^2 / sum Var_i^2 the effective number of elements (4096 elements;
    N_eff >= ~100 with Student-t's unequal block scales): +-0.14 at one sigma, so the band
    [0.6, 1.4] is about 3 sigma (measured 0.91 .. 1.02)."""
    key = result[0].key_numbers
    for rht in ("", "_rht"):
        for kind in DATA:
            z = key[f"mxfp4_floor_3_4{rht}_{key_name(kind)}_sr_z"]
            assert 0.6 <= z <= 1.4, (rht, kind, z)


def test_sr_with_the_floor_rule_clamps_and_is_biased_on_heavy_tails(result):
    """The OCP floor rule lands a block's amax in [2^emax, 2^(emax+1)) after scaling, past
    e2m1's 6 and e4m3's 448: SR's step above the max clamps, a bias z far above the
    unbiased ~1 (band above: 1.4).  Measured on Student-t: mxfp4 2.53, mxfp8_e4m3 3.44."""
    key = result[0].key_numbers
    assert key["mxfp4_student_t_sr_z"] > 2.0
    assert key["mxfp8_e4m3_student_t_sr_z"] > 2.0


def test_long_sums_sr_with_floor_3_4_is_unbiased_and_rne_is_not(result):
    """64 sums: under unbiased SR the mean relative error over the sums over its standard
    error is a t statistic with 63 degrees of freedom, |t| < 4 but for odds ~2e-4
    (measured 0.89 and 0.24).  rne's products err the same way over and over on
    nonnegative data: its mean error lies > 10 of SR's standard errors from zero
    (measured 20 and 14)."""
    key = result[0].key_numbers
    for rht in ("", "_rht"):
        sr_bias = key[f"sum_mxfp4_floor_3_4{rht}_sr_bias"]
        se = key[f"sum_mxfp4_floor_3_4{rht}_sr_standard_error"]
        assert abs(sr_bias) < 4 * se
        assert abs(key[f"sum_mxfp4_floor_3_4{rht}_rne_bias"]) > 10 * se


def test_values_on_the_block_grid_quantize_exactly_in_every_mode():
    """A block of e2m1 values whose amax is 4: the floor scale is 2^(2 - 2) = 1, so every
    value is on the grid and both modes return it, with no error and no bias."""
    x = torch.tensor([4.0, 2, 1, 0.5, -3, 1.5, 0, -4] * 4).reshape(1, 32)
    case = Case("mxfp4", "mxfp4")
    for mode in ("rne", "sr"):
        found = error_and_bias(x, case, mode, 8, seed=0, offset=0, signs=None)
        assert (found.error, found.bias, found.z) == (0.0, 0.0, 0.0)


def test_the_helpers_are_deterministic_and_offsets_give_other_bits():
    generator = torch.Generator().manual_seed(5)
    x = sample("student-t", (4, 64), generator)
    assert torch.equal(x, sample("student-t", (4, 64), torch.Generator().manual_seed(5)))
    case = Case("nvfp4", "nvfp4")
    first = error_and_bias(
        x, case, "sr", 4, seed=3, offset=quantization_offset(0, 1, False), signs=None
    )
    again = error_and_bias(
        x, case, "sr", 4, seed=3, offset=quantization_offset(0, 1, False), signs=None
    )
    other = error_and_bias(
        x, case, "sr", 4, seed=3, offset=quantization_offset(0, 1, True), signs=None
    )
    assert first == again
    assert first != other


def test_stream_offsets_are_distinct_for_every_quantization():
    offsets = [
        quantization_offset(case, data, rht, operand)
        for case in range(len(CASES))
        for data in range(len(DATA) + 1)  # the data kinds, then the long sums
        for rht in (False, True)
        for operand in (0, 1)
    ]
    assert len(set(offsets)) == len(offsets)


def test_a_long_sum_of_grid_values_is_exact():
    """a and b on mxfp4's grid (amax 4 per block, floor scale 1): every product is exact,
    so the relative error of each sum is 0 in both modes."""
    a = torch.tensor([4.0, 2, 1, 0.5, 3, 1.5, 0, 4] * 8).reshape(2, 32)
    b = torch.tensor([1.0, 4, 0.5, 2, 4, 3, 6 / 4, 0] * 8).reshape(2, 32)
    case = Case("mxfp4", "mxfp4")
    for mode in ("rne", "sr"):
        found = long_sums(a, b, case, mode, seed=0, offsets=(0, 1), signs=None)
        assert (found.bias, found.rms) == (0.0, 0.0)
        assert found.standard_error == 0.0


def test_key_names_are_lower_case_words_joined_by_underscores():
    assert key_name("mxfp4 floor-3/4") == "mxfp4_floor_3_4"
    assert key_name("student-t") == "student_t"


def test_sample_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of gaussian, student-t"):
        sample("cauchy", (2,), torch.Generator())


def test_student_t_has_heavier_tails_than_the_gaussian():
    """Kurtosis: 3 for the Gaussian, infinite for Student-t with 3 degrees of freedom; on
    2^16 samples the Gaussian's sample kurtosis is 3 +- 0.02 (its standard error
    sqrt(24 / n)), while the t's exceeds 6 (measured 3.02 and 373 for this seed)."""
    generator = torch.Generator().manual_seed(0)
    gaussian = sample("gaussian", (1 << 16,), generator).double()
    student = sample("student-t", (1 << 16,), generator).double()

    def kurtosis(v):
        centred = v - v.mean()
        return float(centred.pow(4).mean() / centred.square().mean().square())

    assert math.isclose(kurtosis(gaussian), 3, abs_tol=0.1)
    assert kurtosis(student) > 6
