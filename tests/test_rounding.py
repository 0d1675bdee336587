"""The PyTorch path (`rounding.py`) against the scalar reference, bit for bit."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from helpers import TEST_FORMATS, all_bit_patterns, assert_same_values

import stochround as sr
from stochround import reference
from stochround.rounding import round_float64

DETERMINISTIC_MODES = ("rne", "rna", "rz", "ru", "rd", "ro")


def _reference_values(values: list[float], fmt: sr.Format, mode: str, sat: str) -> list[float]:
    """The reference for deterministic modes, with the argument checks done once."""
    return [reference.round_checked(v, fmt, mode, 32, "c", sat, None) for v in values]


def _check_all_modes_and_sats(x: torch.Tensor, fmt_name: str) -> None:
    """Every deterministic mode with every sat, against the reference.

    sat acts only on values outside the format's range (and infinities), so the reference
    is evaluated with every sat on those inputs and with sat='none' on the rest.
    """
    fmt = sr.format(fmt_name)
    values = x.to(torch.float64).tolist()
    outside = [
        i
        for i, v in enumerate(values)
        if math.isinf(v) or v > fmt.max or v < fmt.lowest or (not fmt.signed and v < 0)
    ]
    for mode in DETERMINISTIC_MODES:
        expected_none = _reference_values(values, fmt, mode, "none")
        for sat in reference.SATURATIONS:
            expected = list(expected_none)
            if sat != "none":
                outside_values = [values[i] for i in outside]
                for i, value in zip(
                    outside, _reference_values(outside_values, fmt, mode, sat), strict=True
                ):
                    expected[i] = value
            actual = round_float64(x, fmt_name, mode, sat=sat)
            assert_same_values(actual, expected, f"{fmt_name} {mode} sat={sat} {x.dtype}")


@pytest.mark.parametrize("fmt_name", TEST_FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16_bit_pattern_matches_reference(dtype: torch.dtype, fmt_name: str) -> None:
    _check_all_modes_and_sats(all_bit_patterns(dtype), fmt_name)


def _spanning_fp32(fmt: sr.Format, count: int, generator: torch.Generator) -> torch.Tensor:
    """Log-uniform magnitudes from a quarter of the smallest value to 4x the largest (clipped
    to fp32), both signs: the subnormal, normal and overflow ranges of the target."""
    low = max(math.log2(fmt.min_subnormal) - 2, -149)
    high = min(math.log2(fmt.max) + 2, 127.9)
    exponents = torch.rand(count, generator=generator, dtype=torch.float64) * (high - low) + low
    signs = torch.where(torch.rand(count, generator=generator) < 0.5, -1.0, 1.0)
    return (signs * torch.exp2(exponents)).to(torch.float32)


def _midpoints_and_neighbours(fmt: sr.Format, generator: torch.Generator) -> torch.Tensor:
    """Exact midpoints between adjacent finite values (all of them for formats of at most
    8 bits, a sample otherwise) and their fp32 neighbours on both sides."""
    if fmt.bits <= 8:
        grid = sorted({v for _, v in reference.all_values(fmt) if math.isfinite(v)})
        pairs = torch.tensor(list(itertools.pairwise(grid)), dtype=torch.float64)
    else:
        low = _spanning_fp32(fmt, 2048, generator).abs().to(torch.float64)
        low = torch.tensor([reference.round_value(v, fmt, "rd") for v in low.tolist()])
        high = torch.tensor(
            [
                reference.round_value(v, fmt, "ru")
                for v in low.nextafter(torch.tensor(math.inf, dtype=torch.float64)).tolist()
            ]
        )
        pairs = torch.stack([low, high], dim=1)
    pairs = pairs[torch.isfinite(pairs).all(dim=1)]
    middle = (pairs[:, 0] + pairs[:, 1]) / 2
    middle = middle[middle.to(torch.float32).to(torch.float64) == middle].to(torch.float32)
    up = middle.nextafter(torch.tensor(math.inf))
    down = middle.nextafter(torch.tensor(-math.inf))
    points = torch.cat([middle, up, down])
    return torch.cat([points, -points])


@pytest.mark.parametrize("fmt_name", TEST_FORMATS)
def test_fp32_inputs_across_ranges_and_midpoints(fmt_name: str) -> None:
    fmt = sr.format(fmt_name)
    generator = torch.Generator().manual_seed(2)
    x = torch.cat([_spanning_fp32(fmt, 4096, generator), _midpoints_and_neighbours(fmt, generator)])
    x = torch.cat([x, torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])])
    _check_all_modes_and_sats(x, fmt_name)


@pytest.mark.parametrize("fmt_name", ["binary32", "tf32", "bfloat16", "e4m3fn", "p3109_k8p3ue"])
def test_fp64_inputs_match_reference(fmt_name: str) -> None:
    fmt = sr.format(fmt_name)
    generator = torch.Generator().manual_seed(3)
    exponents = torch.rand(3000, generator=generator, dtype=torch.float64) * 2400 - 1200
    x = torch.randn(3000, generator=generator, dtype=torch.float64) * torch.exp2(
        exponents.clamp(-1074, 1023)
    )
    x = torch.cat([x, _spanning_fp32(fmt, 2000, generator).to(torch.float64) * (1 + 2**-40)])
    _check_all_modes_and_sats(x, fmt_name)


# --- stochastic rounding ------------------------------------------------------------------


def _sr_inputs(fmt: sr.Format) -> list[float]:
    """Values whose discarded fraction covers ties, tiny and near-one fractions, subnormals."""
    ulp = fmt.eps
    values = [1 + k * ulp / 64 for k in range(64)] + [1 + ulp / 3, 1 + ulp * (1 - 2**-20)]
    values += [fmt.min_subnormal * f for f in (0.25, 0.5, 0.75, 1.5, 2.5)]
    return values + [-v for v in values]


@pytest.mark.parametrize("fmt_name", ["bfloat16", "e4m3fn", "e2m1", "p3109_k8p1se", "int8"])
@pytest.mark.parametrize("rbits", range(1, 11))
def test_sr_enumerating_every_random_integer(fmt_name: str, rbits: int) -> None:
    """For each variant, the number of r in [0, 2**n) that round away is exactly the
    closed form of DESIGN.md, and every single result matches the reference."""
    fmt = sr.format(fmt_name)
    values = _sr_inputs(fmt)
    x = torch.tensor(values, dtype=torch.float64).unsqueeze(1)
    rand = torch.arange(2**rbits).unsqueeze(0)
    for variant in reference.VARIANTS:
        result = round_float64(
            x.expand(-1, 2**rbits), fmt, "sr", rbits=rbits, variant=variant, rand=rand
        )
        for row, value in enumerate(values):
            low, high = reference.neighbours(value, fmt)
            away = high if value >= 0 else low
            toward = low if value >= 0 else high
            row_values = result[row]
            assert bool(((row_values == away) | (row_values == toward)).all()), (value, variant)
            nu = reference.discarded_fraction(value, fmt)
            expected = reference.away_probability(nu, rbits, variant) * 2**rbits
            count = int((row_values == away).sum()) if away != toward else 0
            assert count == (expected if away != toward else 0), (value, variant, count, expected)
        expected_all = [
            reference.round_value(v, fmt, "sr", rbits=rbits, variant=variant, rand=r)
            for v in values
            for r in range(2**rbits)
        ]
        assert_same_values(result, expected_all, f"{fmt_name} {variant} rbits={rbits}")


def test_closed_forms_of_the_variants() -> None:
    """The table of DESIGN.md: a floors, b rounds half up, c half to even, odd half to odd."""
    n = 3
    cases = {  # nu * 2**n -> count per variant (a, b, c, odd)
        Fraction(5, 2): (2, 3, 2, 3),
        Fraction(7, 2): (3, 4, 4, 3),
        Fraction(13, 4): (3, 3, 3, 3),
        Fraction(11, 4): (2, 3, 3, 3),
        Fraction(0): (0, 0, 0, 0),
    }
    for scaled, counts in cases.items():
        for variant, count in zip(reference.VARIANTS, counts, strict=True):
            assert reference.away_probability(scaled / 2**n, n, variant) == Fraction(count, 2**n)


@pytest.mark.parametrize("fmt_name", ["bfloat16", "binary16", "e4m3fn", "e5m2", "e2m1", "e8m0"])
def test_exact_sr_with_explicit_words_matches_reference(fmt_name: str) -> None:
    generator = torch.Generator().manual_seed(5)
    fmt = sr.format(fmt_name)
    x = torch.cat([_spanning_fp32(fmt, 3000, generator), _midpoints_and_neighbours(fmt, generator)])
    words = torch.randint(0, 2**32, x.shape, generator=generator, dtype=torch.int64)
    words[:8] = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32 - 2, 2**16, 2**24])
    values = x.tolist()
    for variant in reference.VARIANTS:
        for sat in ("none", "finite"):
            actual = round_float64(x, fmt, "sr", variant=variant, sat=sat, rand=words)
            expected = [
                reference.round_value(v, fmt, "sr", variant=variant, sat=sat, rand=r)
                for v, r in zip(values, words.tolist(), strict=True)
            ]
            assert_same_values(actual, expected, f"{fmt_name} sr {variant} sat={sat}")


@pytest.mark.parametrize("fmt_name", ["bfloat16", "e4m3fn", "e5m2fnuz", "e3m2", "p3109_k8p1se"])
def test_representable_values_never_move(fmt_name: str) -> None:
    fmt = sr.format(fmt_name)
    if fmt.bits <= 8:
        codes = torch.arange(fmt.num_codes)
    else:
        codes = torch.randint(0, fmt.num_codes, (4096,), generator=torch.Generator().manual_seed(6))
    values = sr.decode(codes, fmt, torch.float64)
    values = values[torch.isfinite(values)]
    for rbits in (None, 1, 5):
        for variant in reference.VARIANTS:
            result = round_float64(values, fmt, "sr", rbits=rbits, variant=variant, seed=11)
            assert torch.equal(result, values)


def test_sr_with_the_stream_is_reproducible_and_varies_with_seed_and_offset() -> None:
    x = torch.rand(4096, generator=torch.Generator().manual_seed(7)) + 1
    first = sr.round(x, "bf16", "sr", seed=1)
    assert torch.equal(first, sr.round(x, "bf16", "sr", seed=1))
    assert not torch.equal(first, sr.round(x, "bf16", "sr", seed=2))
    assert not torch.equal(first, sr.round(x, "bf16", "sr", seed=1, offset=1))
    torch.manual_seed(0)
    drawn = sr.round(x, "bf16", "sr")
    torch.manual_seed(0)
    assert torch.equal(drawn, sr.round(x, "bf16", "sr"))


def test_sr_is_unbiased_within_the_variance_band() -> None:
    """Exact SR of v = 1 + 0.3 ulp to bf16: the mean over N draws is v, within 5 standard
    errors (each draw is 1 or 1 + ulp, so the std of one draw is ulp sqrt(p (1 - p)))."""
    ulp, p, n = 2.0**-7, 0.3, 2**18
    value = 1 + p * ulp
    draws = sr.round(torch.full((n,), value, dtype=torch.float64), "bf16", "sr", seed=3)
    assert set(draws.unique().tolist()) == {1.0, 1 + ulp}
    tolerance = 5 * ulp * math.sqrt(p * (1 - p) / n)
    assert abs(draws.mean().item() - value) < tolerance


def test_random_index_is_the_logical_row_major_index() -> None:
    x = torch.rand(64, 48, generator=torch.Generator().manual_seed(8)) + 1
    transposed = x.t()
    assert not transposed.is_contiguous()
    assert torch.equal(
        sr.round(transposed, "e4m3fn", "sr", seed=4),
        sr.round(transposed.contiguous(), "e4m3fn", "sr", seed=4),
    )


# --- output dtype, shapes, cast, encode ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_round_keeps_dtype_and_shape(dtype: torch.dtype) -> None:
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(9)).to(dtype)
    out = sr.round(x, "e4m3fn", "rne")
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, round_float64(x, "e4m3fn", "rne").to(dtype))
    assert sr.round(torch.empty(0, 3, dtype=dtype), "e2m1").shape == (0, 3)
    assert sr.round(torch.tensor(1.3, dtype=dtype), "e2m1").shape == ()


@pytest.mark.parametrize(
    "dtype_name",
    ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"],
)
def test_cast_holds_the_rounded_values(dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(10)) * 30
    for mode, options in (
        ("rne", {}),
        ("rz", {}),
        ("sr", {"seed": 5}),
        ("sr", {"rbits": 4, "seed": 6}),
    ):
        cast = sr.cast(x, dtype, mode, **options)
        assert cast.dtype == dtype
        fmt = sr.formats.format_of_dtype(dtype)
        expected = round_float64(x, fmt, mode, **options)
        assert_same_values(cast.to(torch.float64), expected.tolist(), f"{dtype_name} {mode}")


def test_cast_to_float4_packs_pairs_low_nibble_first() -> None:
    x = torch.tensor([[0.5, 6.0, -1.0, 2.9]])
    packed = sr.cast(x, torch.float4_e2m1fn_x2)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (1, 2)
    codes = sr.encode(x, "e2m1")
    assert codes.tolist() == [[0b0001, 0b0111, 0b1010, 0b0101]]
    assert packed.view(torch.uint8).tolist() == [[0x71, 0x5A]]
    with pytest.raises(ValueError, match=r"packed 2 together .* multiple of 2; got shape \(3,\)"):
        sr.cast(torch.ones(3), torch.float4_e2m1fn_x2)


def test_encode_matches_torch_views_and_reference() -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(12)) * 1000
    assert torch.equal(sr.encode(x, "bf16"), x.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(sr.encode(x, "fp32"), x.view(torch.int32))
    small = x[:300] / 100
    for fmt_name in ("e4m3fn", "e5m2", "e3m2", "e8m0", "int8", "p3109_k8p4se", "uint4"):
        codes = sr.encode(small, fmt_name, sat="finite")
        assert codes.dtype == torch.uint8
        rounded = round_float64(small, fmt_name, sat="finite").tolist()
        assert codes.tolist() == [reference.encode_value(v, fmt_name) for v in rounded]


def test_encode_packed_packs_the_codes() -> None:
    x = torch.tensor([[0.5, 6.0, -1.0, 2.9, 0.0, -0.25, 3.0, -6.0]])
    # e2m1 codes 1, 7, 10, 5 | 0, 8 (-0.25 ties to the even -0.0), 5, 15: low nibble first
    assert sr.encode(x, "e2m1", packed=True).tolist() == [[0x71, 0x5A, 0x80, 0xF5]]
    y = torch.randn(6, 16, generator=torch.Generator().manual_seed(5)) * 8
    for fmt_name in ("e2m1", "int4", "uint4", "e2m3", "e3m2", "p3109_k6p3se"):
        bits = sr.format(fmt_name).bits
        packed = sr.encode(y, fmt_name, "sr", sat="finite", seed=2, packed=True)
        codes = sr.encode(y, fmt_name, "sr", sat="finite", seed=2)
        assert packed.shape == (6, 16 * bits // 8) and torch.equal(packed, sr.pack(codes, bits))
    with pytest.raises(ValueError, match="packed=True packs formats of 4 or 6 bits; e4m3fn"):
        sr.encode(y, "e4m3fn", packed=True)
    with pytest.raises(ValueError, match="multiple of 4; got shape \\(6, 6\\)"):
        sr.encode(y[:, :6], "e3m2", packed=True)
    with pytest.raises(ValueError, match="multiple of 2; got shape \\(\\)"):
        sr.encode(torch.tensor(1.0), "e2m1", packed=True)
    with pytest.raises(TypeError, match="packed must be a bool"):
        sr.encode(y, "e2m1", packed=1)


def test_every_output_traces_as_one_op_under_torch_compile() -> None:
    """fullgraph=True: values, codes, packed fp4 and packed fp6 each trace through the
    custom op (its shape function included) and give the eager bits."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(6)) * 4
    calls = {
        "value": lambda x: sr.round(x, "e4m3fn", "sr", seed=3),
        "codes": lambda x: sr.encode(x, "e5m2", "sr", seed=3),
        "fp4x2": lambda x: sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=3, sat="finite"),
        "fp6x4": lambda x: sr.encode(x, "e3m2", "sr", seed=3, sat="finite", packed=True),
    }
    for output, call in calls.items():
        compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(x)
        eager = call(x)
        assert compiled.dtype == eager.dtype and compiled.shape == eager.shape, output
        assert torch.equal(compiled.view(torch.uint8), eager.view(torch.uint8)), output


def test_compiled_code_reads_the_results_dtype() -> None:
    """The op's shape function gives the result's dtype (16-bit codes are int16, cast's
    fp8 codes float8), so code compiled around the op reads the bits eager code reads."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(7))
    calls = {
        "int16 codes": lambda x: sr.encode(x, "bf16", "sr", seed=3).to(torch.int32) + 1,
        "float8 codes": lambda x: sr.cast(x, torch.float8_e4m3fn, "sr", seed=3).float() * 2,
    }
    for name, call in calls.items():
        assert torch.equal(torch.compile(call, fullgraph=True)(x), call(x)), name


def test_encode_without_a_nan_code_refuses_nan() -> None:
    with pytest.raises(ValueError, match="no NaN code"):
        sr.encode(torch.tensor([1.0, 100.0]), "e2m1")
    assert sr.encode(torch.tensor([1.0, 100.0]), "e2m1", sat="finite").tolist() == [2, 7]


def test_nan_zero_stores_code_zero_only_where_the_format_has_no_nan_code() -> None:
    x = torch.tensor([1.0, math.nan, -math.nan, 100.0, -100.0, -0.0, math.inf, -1.5])
    # e2m1: NaN inputs and (sat="none") overflows and infinities are NaN results -> code 0
    assert sr.encode(x, "e2m1", nan="zero").tolist() == [2, 0, 0, 0, 0, 8, 0, 11]
    assert sr.encode(x, "e2m1", sat="finite", nan="zero").tolist() == [2, 0, 0, 7, 15, 8, 7, 11]
    finite = x[[0, 5, 7]]
    assert torch.equal(sr.encode(finite, "e2m1", nan="zero"), sr.encode(finite, "e2m1"))
    # a format with a NaN code keeps it
    nan_code = reference.encode_value(math.nan, "e4m3fn")
    assert sr.encode(x, "e4m3fn", nan="zero")[1] == nan_code
    with pytest.raises(ValueError, match="nan must be one of"):
        sr.encode(x, "e2m1", nan="ignore")
    with pytest.raises(ValueError, match="nan must be one of"):
        sr.cast(x, torch.float4_e2m1fn_x2, nan=None)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"fmt": "e4m4"}, ValueError, "unknown format 'e4m4'.*e4m3"),
        ({"mode": "nearest"}, ValueError, "mode must be one of 'rne'"),
        ({"mode": "sr", "variant": "d"}, ValueError, "variant must be one of 'a'"),
        ({"mode": "sr", "rbits": 0}, ValueError, "rbits must be None .* 1..32"),
        ({"mode": "sr", "rbits": 33}, ValueError, "rbits must be"),
        ({"mode": "sr", "rbits": 2.0}, ValueError, "rbits must be"),
        ({"sat": "clamp"}, ValueError, "sat must be one of 'finite'"),
        ({"mode": ["sr"]}, ValueError, "mode must be one of 'rne'"),  # unhashable
        ({"backend": "cuda"}, ValueError, "backend must be one of 'auto'"),
        ({"mode": "rne", "rbits": 4}, ValueError, "apply to mode='sr' only"),
        (
            {"mode": "sr", "rbits": 2, "rand": torch.tensor([0, 4, 1])},
            ValueError,
            r"rand must hold integers in \[0, 2\*\*2\)",
        ),
        ({"mode": "sr", "rand": torch.tensor([-1, 0, 0])}, ValueError, "rand must hold"),
        (
            {"mode": "sr", "rand": torch.zeros(2, dtype=torch.int64)},
            ValueError,
            "does not broadcast",
        ),
        ({"mode": "sr", "rand": torch.zeros(3)}, TypeError, "integer dtype"),
        ({"mode": "sr", "rand": [0, 1, 2]}, TypeError, "rand must be an integer torch.Tensor"),
        ({"fmt": 3}, TypeError, "format must be a name"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs: dict, error: type, pattern: str) -> None:
    fmt = kwargs.pop("fmt", "e4m3fn")
    with pytest.raises(error, match=pattern):
        sr.round(torch.ones(3), fmt, **kwargs)


def test_checked_choices_are_cached_by_type() -> None:
    """The cache of checked choices tells rbits=True from rbits=1 (equal and of equal hash),
    so a bool is refused after the int was accepted."""
    x = torch.ones(3)
    sr.round(x, "e4m3fn", "sr", rbits=1, seed=0)
    with pytest.raises(ValueError, match="rbits must be"):
        sr.round(x, "e4m3fn", "sr", rbits=True, seed=0)


@pytest.mark.parametrize(
    "x", [torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.bool), [1.0, 2.0]]
)
def test_non_float_input_raises_type_error(x: object) -> None:
    with pytest.raises(TypeError, match="x must"):
        sr.round(x, "bf16")  # type: ignore[arg-type]


def test_bad_cast_and_decode_arguments() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        sr.cast(torch.ones(2), torch.int8)
    with pytest.raises(ValueError, match=r"does not fit in torch\.float32"):
        sr.decode(torch.zeros(2, dtype=torch.int64), "binary64")
    with pytest.raises(TypeError, match="codes must be an integer"):
        sr.decode(torch.zeros(2), "e4m3fn")
