"""The PyTorch path (`rounding.py`) against the scalar reference, bit for bit."""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from helpers import TEST_FORMATS, all_bit_patterns, assert_same_values

import stochround as sr
from stochround import cpu_path, reference
from stochround.formats import FORMATS
from stochround.rounding import CAST_DTYPES, round_float64

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


# --- torch.compile: changing ints, every entry point, no warnings ------------------------


def _compile_counted(call, **options):
    """call compiled with fullgraph=True through a backend that counts the graphs it gets
    (and runs them eagerly, as aot_eager would)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    return torch.compile(call, fullgraph=True, backend=counter, **options), counter


@pytest.mark.parametrize("options", [{}, {"dynamic": True}], ids=["default", "dynamic"])
@pytest.mark.parametrize("argument", ["offset", "seed", "index_offset"])
def test_a_changing_int_compiles_at_most_twice_and_equals_eager(options, argument) -> None:
    """A step counter as the seed, offset or index_offset: 20 calls with 20 values compile
    at most twice (once with dynamic=True), every result equals eager bit for bit, and the
    results differ from step to step (the counter is not frozen into the graph)."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(20)) * 3

    def call(x, step):
        return sr.round(x, "e4m3fn", "sr", **{"seed": 7, argument: step})

    compiled, counter = _compile_counted(call, **options)
    results = [compiled(x, step) for step in range(20)]
    assert counter.frame_count == (1 if options else 2)
    for step, result in enumerate(results):
        assert torch.equal(result, call(x, step)), step
    assert len({tuple(r.tolist()) for r in results}) == 20


def test_seeds_and_offsets_beyond_int64_compile_and_equal_eager() -> None:
    """Seeds and offsets span [0, 2**64): the op takes their 64 bits as a signed int."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(21))
    for seed, offset in ((2**64 - 1, 2**63), (2**63, 2**64 - 1), (0, 2**63 - 1)):

        def call(x, seed=seed, offset=offset):
            return sr.encode(x, "e5m2", "sr", seed=seed, offset=offset)

        compiled, _ = _compile_counted(call)
        assert torch.equal(compiled(x), call(x)), (seed, offset)


def test_compiled_calls_warn_nothing_from_stochround() -> None:
    """No warning names stochround or its cached routing function under compile (Dynamo
    warned at every compiled call that it traced through an lru_cache wrapper)."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(22))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            torch.compile(
                lambda x, step: sr.cast(x, torch.float8_e4m3fn, "sr", seed=1, offset=step),
                fullgraph=True,
                backend="aot_eager",
            )(x, step)
    ours = [
        str(w.message)
        for w in caught
        if "lru_cache" in str(w.message)
        or "stochround" in str(w.message)
        or "stochround" in w.filename
    ]
    assert ours == []


def test_every_entry_point_traces_with_fullgraph() -> None:
    """seed=None, explicit rand, rand="data", hardware presets (round, cast and encode),
    a Stream and a dtype as the format: each traces as one graph and gives the eager bits
    (seed=None draws the same seed: aot_eager runs torch's generator as eager does)."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(23)) * 3
    rand = torch.randint(0, 2**8, (8, 16), generator=torch.Generator().manual_seed(24))
    calls = {
        "seed=None": lambda x: sr.round(x, "e4m3fn", "sr"),
        "rand": lambda x: sr.round(x, "e4m3fn", "sr", rbits=8, rand=rand),
        "rand=data": lambda x: sr.round(x, "e2m1", "sr", rand="data", sat="finite"),
        "hardware": lambda x: sr.round(x, hardware="amd-mi300-fp8", seed=3),
        "hardware rand": lambda x: sr.round(x, hardware="nvidia-cvt-rs-e4m3", rand=rand),
        "hardware cast": lambda x: sr.cast(
            x, torch.float8_e4m3fn, hardware="nvidia-cvt-rs-e4m3", seed=2
        ),
        "hardware encode": lambda x: sr.encode(x, None, hardware="graphcore-ipu-fp16", seed=2),
        "dtype format": lambda x: sr.round(x, torch.float8_e5m2, "sr", seed=2),
    }
    for name, call in calls.items():
        torch._dynamo.reset()
        torch.manual_seed(0)
        compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(x)
        torch.manual_seed(0)
        eager = call(x)
        assert torch.equal(compiled.view(torch.uint8), eager.view(torch.uint8)), name


def test_seed_none_under_inductor_draws_a_fresh_seed_per_call() -> None:
    """seed=None traced by inductor: one graph, and each call draws its own seed."""
    x = torch.full((256,), 1.3)
    compiled = torch.compile(lambda x: sr.round(x, "e4m3fn", "sr"), fullgraph=True)
    first, second = compiled(x), compiled(x)
    assert set(first.unique().tolist()) == {1.25, 1.375}
    assert not torch.equal(first, second)


def test_compiled_rand_is_checked_when_the_op_runs() -> None:
    x = torch.ones(4)
    bad = torch.tensor([0, 1, 5, 2])
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x: sr.round(x, "e4m3fn", "sr", rbits=2, rand=bad),
        fullgraph=True,
        backend="aot_eager",
    )
    with pytest.raises(ValueError, match=r"rand must hold integers in \[0, 2\*\*2\)"):
        compiled(x)


# --- gradients ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [d for d in CAST_DTYPES if d != torch.float4_e2m1fn_x2])
def test_cast_passes_the_gradient_x_to_passes(dtype: torch.dtype) -> None:
    """cast's gradient is x.to(dtype)'s (straight through, the upstream gradient arriving in
    the result's dtype, 8-bit floats included), in every mode."""
    generator = torch.Generator().manual_seed(30)
    x = (torch.rand(64, generator=generator) * 4 + 0.5).requires_grad_()
    weights = torch.randn(64, generator=generator)
    for mode, options in (("rne", {}), ("sr", {"seed": 1})):
        x.grad = None
        (sr.cast(x, dtype, mode, **options).to(torch.float32) * weights).sum().backward()
        reference_x = x.detach().clone().requires_grad_()
        (reference_x.to(dtype).to(torch.float32) * weights).sum().backward()
        assert x.grad is not None and torch.equal(x.grad, reference_x.grad), mode


def test_hardware_rounding_passes_the_gradient_straight_through() -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(31)).requires_grad_()
    for call in (
        lambda x: sr.round(x, hardware="amd-mi300-fp8", seed=1),
        lambda x: sr.round(x, "e5m2fnuz", hardware="amd-mi300", seed=1),
        lambda x: sr.cast(x, torch.bfloat16, hardware="nvidia-cvt-rs-bf16", seed=1).float(),
        lambda x: sr.hardware.round_hardware(x, "graphcore-ipu-fp16", seed=1),
    ):
        x.grad = None
        (call(x) * 3).sum().backward()
        assert x.grad is not None and torch.equal(x.grad, torch.full_like(x, 3.0))


def test_packed_and_integer_codes_do_not_require_grad() -> None:
    """Codes carry no gradient: the results do not pretend to (no grad_fn)."""
    x = torch.randn(4, 8, requires_grad=True)
    for result in (
        sr.cast(x, torch.float4_e2m1fn_x2, sat="finite"),
        sr.encode(x, "e4m3fn"),
        sr.encode(x, "bf16", "sr", seed=1),
        sr.encode(x, "e2m1", sat="finite", packed=True),
    ):
        assert not result.requires_grad and result.grad_fn is None


# --- cast: the drop-in promise of x.to(dtype) ----------------------------------------------


def _cast_inputs() -> dict[str, torch.Tensor]:
    """Every bf16 and fp16 bit pattern, and fp32 and fp64 values across every range with
    the midpoints of the 8-bit formats and the specials."""
    generator = torch.Generator().manual_seed(32)
    exponents = torch.randint(-150, 129, (20000,), generator=generator).to(torch.float32)
    fp32 = torch.randn(20000, generator=generator) * torch.exp2(exponents)
    midpoints = [
        _midpoints_and_neighbours(sr.format(name), generator)
        for name in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "bf16", "fp16")
    ]
    specials = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 448.0, 464.0, 480.0, 1e5, 65520.0]
    )
    fp32 = torch.cat([fp32, *midpoints, specials, -specials])
    return {
        "bf16": all_bit_patterns(torch.bfloat16),
        "fp16": all_bit_patterns(torch.float16),
        "fp32": fp32,
        "fp64": fp32.to(torch.float64) * (1 + 2**-40),
    }


def _assert_same_bits_or_both_nan(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    width = got.element_size()
    both_nan = torch.isnan(got.to(torch.float64)) & torch.isnan(expected.to(torch.float64))
    same = (got.view(integer[width]) == expected.view(integer[width])) | both_nan
    bad = (~same).nonzero().flatten()[:4].tolist()
    assert not bad, f"{what}: {int((~same).sum())} differ, e.g. " + ", ".join(
        f"{float(got[i].to(torch.float64))} vs {float(expected[i].to(torch.float64))}" for i in bad
    )


@pytest.mark.parametrize(
    "dtype", [d for d in CAST_DTYPES if d not in (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)]
)
def test_cast_rne_equals_torch_to_bit_for_bit(dtype: torch.dtype) -> None:
    """cast(x, dtype) with the default sat=None is x.to(dtype): every value, overflow,
    infinity and zero gives the same bits, NaN gives NaN (torch's NaN sign and payload
    differ between its own casts); float64 inputs to narrower dtypes aside, which torch
    rounds twice (through float32: its result is off where that double rounding errs)."""
    for name, x in _cast_inputs().items():
        if name == "fp64" and dtype not in (torch.float64, torch.float32):
            x = x.to(torch.float32).to(torch.float64)  # where both round once
        expected = x.to(dtype)
        _assert_same_bits_or_both_nan(sr.cast(x, dtype), expected, f"{name} -> {dtype}")
        _assert_same_bits_or_both_nan(sr.cast(x, dtype, "rne"), expected, f"{name} -> {dtype}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_cast_rounds_float64_once_where_torch_rounds_twice(dtype: torch.dtype) -> None:
    """The one exception to the drop-in promise, where cast is the correctly rounded one:
    torch rounds float64 to float32 first, then to the narrower dtype."""
    fmt = sr.formats.format_of_dtype(dtype)
    x = torch.tensor([1 + fmt.eps / 2 + 2**-40], dtype=torch.float64)  # just above a tie
    assert sr.cast(x, dtype).to(torch.float64).item() == 1 + fmt.eps  # the nearer neighbour
    assert x.to(dtype).to(torch.float64).item() == 1.0  # float32 first: the tie, then to even


def test_cast_to_e8m0_equals_torch_in_its_domain() -> None:
    """torch's float8_e8m0fnu cast rounds to nearest with ties up: cast's "rna", bit for bit
    on non-negative inputs outside fp32's subnormals, which torch rounds as if normal
    (negative inputs: torch takes their magnitude; e8m0 has no negative values: NaN)."""
    dtype = torch.float8_e8m0fnu
    for name, x in _cast_inputs().items():
        x = x[~torch.signbit(x) & ~((x > 0) & (x < 2.0**-126))]
        expected = x.to(dtype)
        _assert_same_bits_or_both_nan(sr.cast(x, dtype, "rna"), expected, f"{name} -> e8m0")
    assert sr.cast(torch.tensor([-4.0]), dtype).float().isnan().all()
    assert torch.tensor([-4.0]).to(dtype).float().item() == 4.0


def test_cast_keeps_the_p3109_saturations_as_arguments() -> None:
    x = torch.tensor([1e5, -1e5, math.inf, 300.0])
    e4m3fn = torch.float8_e4m3fn
    # torch's (2.13 saturates e4m3fn; older releases, as the GPU machine's, give NaN)
    _assert_same_bits_or_both_nan(sr.cast(x, e4m3fn), x.to(e4m3fn), "e4m3fn's default")
    assert sr.cast(x, e4m3fn, sat="finite").float().tolist() == [448.0, -448.0, 448.0, 288.0]
    assert sr.cast(x, e4m3fn, sat="none").float()[:3].isnan().all()
    propagate = sr.cast(x, e4m3fn, sat="propagate").float()
    assert propagate[:2].tolist() == [448.0, -448.0] and propagate[2].isnan()
    assert sr.cast(x, torch.float8_e5m2).float().tolist()[:3] == [math.inf, -math.inf, math.inf]
    assert sr.cast(x, torch.float8_e5m2, sat="finite").float().tolist()[:2] == [57344.0, -57344.0]
    with pytest.raises(ValueError, match="sat must be one of"):
        sr.cast(x, e4m3fn, sat="torch")


# --- saturation in x's dtype ------------------------------------------------------------


def test_saturated_values_stay_within_the_format_in_x_dtype() -> None:
    """sat="finite" never returns a value above the format's max: where x's dtype cannot
    hold the max, the largest value of x's dtype below it (the issue's bf16 -> fp16 gave
    65536, fp32 -> int32 gave 2**31); "propagate" keeps infinities infinite."""
    big = [1e9, -1e9, math.inf, -math.inf]
    bf16 = torch.tensor(big, dtype=torch.bfloat16)
    assert sr.round(bf16, "fp16", sat="finite").tolist() == [65280.0, -65280.0] * 2
    assert sr.round(bf16, "fp16", sat="propagate").tolist() == [65280.0, -65280.0, *big[2:]]
    assert sr.round(bf16, "fp16").tolist() == [math.inf, -math.inf] * 2  # sat="none"
    int32 = sr.Format.integer(32)
    fp32 = torch.tensor([1e10, -1e10, math.inf, -(2.0**31)])
    assert sr.round(fp32, int32, sat="finite").tolist() == [
        2**31 - 128,
        -(2.0**31),
        2**31 - 128,
        -(2.0**31),
    ]
    fp16 = torch.tensor([math.inf, -math.inf, 1.0], dtype=torch.float16)
    assert sr.round(fp16, "bf16", sat="finite").tolist() == [65504.0, -65504.0, 1.0]
    assert sr.round(fp16, "bf16", "sr", seed=1, sat="finite").tolist() == [65504.0, -65504.0, 1.0]
    # formats x's dtype holds are untouched
    assert sr.round(bf16, "e4m3fn", sat="finite").tolist() == [448.0, -448.0] * 2


@pytest.mark.parametrize("mode", ["rz", "rd", "ru"])
def test_directed_modes_stay_within_the_format_in_x_dtype(mode: str) -> None:
    """A directed mode keeps an overflow at the format's max on its side whatever ``sat``
    says; where x's dtype cannot hold that max (bf16 and fp16's 65504), the result is the
    largest value of x's dtype inside the format, as for sat="finite" (narrowing to
    nearest would give 65536, a value fp16 does not have)."""
    bf16 = torch.tensor([1e9, -1e9, 65280.0, 1.0], dtype=torch.bfloat16)
    inward = {"rz": [65280.0, -65280.0], "rd": [65280.0, -math.inf], "ru": [math.inf, -65280.0]}
    assert sr.round(bf16, "fp16", mode).tolist() == [*inward[mode], 65280.0, 1.0]


# --- stream= ------------------------------------------------------------------------------


def test_stream_calls_draw_consecutive_offsets() -> None:
    """Each SR call with stream= rounds as seed=stream's seed, offset=its next offset."""
    x = torch.randn(300, generator=torch.Generator().manual_seed(40)) * 3
    stream = sr.Stream(9, offset=4)
    results = [
        sr.round(x, "e4m3fn", "sr", stream=stream),
        sr.cast(x, torch.float8_e5m2, "sr", stream=stream),
        sr.encode(x, "e2m1", "sr", sat="finite", stream=stream),
        sr.round(x, "bf16", "rne", stream=stream),  # no words drawn: not advanced
        sr.round(x, hardware="amd-mi300-fp8", stream=stream),
    ]
    expected = [
        sr.round(x, "e4m3fn", "sr", seed=9, offset=4),
        sr.cast(x, torch.float8_e5m2, "sr", seed=9, offset=5),
        sr.encode(x, "e2m1", "sr", sat="finite", seed=9, offset=6),
        sr.round(x, "bf16", "rne"),
        sr.round(x, hardware="amd-mi300-fp8", seed=9, offset=7),
    ]
    for result, wanted in zip(results, expected, strict=True):
        assert torch.equal(result.view(torch.uint8), wanted.view(torch.uint8))
    assert stream.offset == 8


def test_a_stream_in_a_loop_averages_out() -> None:
    """The issue's loop: 1 + 0.001 added 1000 times in bf16.  A fixed (seed, offset) gives
    each element the same threshold at every step (means far from 2); a stream draws fresh
    bits at every call, and the mean is 2 within SR's noise."""

    def accumulate(**randomness) -> torch.Tensor:
        total = torch.ones(2048, dtype=torch.bfloat16)
        for _ in range(1000):
            total = sr.cast(total.float() + 1e-3, torch.bfloat16, "sr", **randomness)
        return total.float()

    frozen = accumulate(seed=0, offset=0)  # elements stuck at 1.0, others far above 2
    assert frozen.min().item() == 1.0 and frozen.max().item() >= 8.0
    fresh = accumulate(stream=sr.Stream(0))
    # each element: unbiased, with a standard deviation below 0.1 (the mean's: 0.002)
    assert abs(fresh.mean().item() - 2.0) < 0.01
    assert fresh.min().item() > 1.5 and fresh.max().item() < 2.5


def test_stream_refuses_seed_offset_and_rand() -> None:
    x, stream = torch.ones(4), sr.Stream(1)
    zeros = torch.zeros(4, dtype=torch.int64)
    for extra in ({"seed": 1}, {"offset": 0}, {"rand": "data"}, {"rand": zeros}):
        with pytest.raises(ValueError, match="not both"):
            sr.round(x, "bf16", "sr", stream=stream, **extra)
    with pytest.raises(TypeError, match=r"stream must be a stochround\.Stream"):
        sr.round(x, "bf16", "sr", stream=3)
    with pytest.raises(ValueError, match="mode must be one of"):
        sr.round(x, "bf16", "stochastic", stream=stream)
    assert stream.offset == 0  # refused calls take nothing


def test_a_stream_compiles_once_and_equals_eager() -> None:
    """A stream held by a module (an attribute Dynamo would specialize were it an int)
    compiles once for 12 steps, each step equal to eager's and different from the last."""

    class Rounder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stream = sr.Stream(5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sr.round(x, "e4m3fn", "sr", stream=self.stream)

    x = torch.randn(64, generator=torch.Generator().manual_seed(41)) * 3
    module = Rounder()
    compiled, counter = _compile_counted(module)
    results = [compiled(x) for _ in range(12)]
    assert counter.frame_count == 1 and module.stream.offset == 12
    eager = Rounder()
    assert all(torch.equal(r, eager(x)) for r in results)
    assert len({tuple(r.tolist()) for r in results}) == 12


def test_a_module_int_counter_compiles_twice_with_torchs_switch() -> None:
    """An int step counter kept as a module attribute: Dynamo specializes it (torch's rule
    for int attributes of an nn.Module, which recompiles at every step); with
    ``torch._dynamo.config.allow_unspec_int_on_nn_module`` it is a dynamic int, and the op
    takes it as one: two compiles for 10 steps, each equal to eager's."""

    class Counted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.step += 1
            return sr.round(x, "e4m3fn", "sr", seed=0, offset=self.step)

    x = torch.randn(64, generator=torch.Generator().manual_seed(42)) * 3
    for switch, compiles in ((False, 5), (True, 2)):
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=switch):
            compiled, counter = _compile_counted(Counted())
            results = [compiled(x) for _ in range(5 if not switch else 10)]
        assert counter.frame_count == compiles, switch
        for step, result in enumerate(results, start=1):
            assert torch.equal(result, sr.round(x, "e4m3fn", "sr", seed=0, offset=step))


# --- what the entry points accept ---------------------------------------------------------


def test_hardware_presets_cast_and_encode() -> None:
    """hardware= in cast and encode: the preset's rounding (round's), as the dtype's values
    or the format's codes; the preset's format must be the dtype's (or fmt's)."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(50)) * 100
    rand = torch.randint(0, 2**16, x.shape, generator=torch.Generator().manual_seed(51))
    for name, dtype in (
        ("nvidia-cvt-rs-e4m3", torch.float8_e4m3fn),
        ("amd-mi300-fp8", torch.float8_e4m3fnuz),
        ("nvidia-cvt-rs-bf16", torch.bfloat16),
        ("graphcore-ipu-fp16", torch.float16),
    ):
        values = sr.round(x, hardware=name, rand=rand)
        cast = sr.cast(x, dtype, hardware=name, rand=rand)
        assert cast.dtype == dtype and torch.equal(cast.to(torch.float32), values), name
        fmt = sr.formats.format_of_dtype(dtype)
        assert torch.equal(sr.encode(x, None, hardware=name, rand=rand), sr.encode(values, fmt))
        assert torch.equal(sr.encode(x, fmt, hardware=name, rand=rand), sr.encode(values, fmt))
    assert torch.equal(  # a family's member picked by the dtype
        sr.cast(x, torch.float8_e5m2fnuz, hardware="amd-mi300", seed=3).float(),
        sr.round(x, "e5m2fnuz", hardware="amd-mi300", seed=3),
    )
    e2m1 = sr.cast(x, torch.float4_e2m1fn_x2, hardware="nvidia-cvt-rs-e2m1", seed=3)
    assert torch.equal(e2m1.view(torch.uint8), sr.pack(sr.encode(
        sr.round(x, hardware="nvidia-cvt-rs-e2m1", seed=3), "e2m1"), 4))  # fmt: skip
    with pytest.raises(ValueError, match="rounds to e4m3fn, not to fmt=e5m2"):
        sr.cast(x, torch.float8_e5m2, hardware="nvidia-cvt-rs-e4m3")
    with pytest.raises(ValueError, match="sets the mode, rbits, variant and sat"):
        sr.cast(x, torch.float8_e4m3fn, hardware="nvidia-cvt-rs-e4m3", sat="finite")
    with pytest.raises(ValueError, match="backend='triton' cannot"):
        sr.encode(x, None, hardware="nvidia-cvt-rs-e4m3", backend="triton")


def _narrowed(
    values: torch.Tensor, fmt: sr.Format, dtype: torch.dtype, saturating: bool
) -> torch.Tensor:
    """float64 values of fmt in x's dtype as round documents: to nearest, a saturating
    call's finite results that narrow beyond the format's range stepped one value of the
    dtype back toward zero (a code one lower in magnitude)."""
    narrowed = values.to(dtype)
    if not saturating:
        return narrowed
    beyond = torch.isfinite(values) & (narrowed.to(torch.float64).abs() > fmt.max)
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[narrowed.element_size()]
    inward = (narrowed.view(integer) - 1).view(dtype)
    return torch.where(beyond, inward, narrowed)


def test_hardware_through_the_api_equals_the_presets_float64_rounding() -> None:
    """round(hardware=) rounds on the PyTorch path as round_preset does in float64: the
    operand, the contract's SR, the flush (Graphcore's), in every input dtype."""
    from stochround.rounding import preset_operand, round_preset

    generator = torch.Generator().manual_seed(52)
    x = torch.randn(4096, generator=generator) * torch.exp2(
        torch.randint(-30, 20, (4096,), generator=generator).float()
    )
    for name in sr.hardware.PRESETS:
        unit = sr.hardware.preset(name)
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            xd = x.to(dtype)
            exact = round_preset(preset_operand(xd, unit), unit, 5, 2, None)
            expected = _narrowed(exact, unit.target, dtype, unit.sat != "none")
            got = sr.round(xd, hardware=name, seed=5, offset=2)
            _assert_same_bits_or_both_nan(got, expected, f"{name} {dtype}")


def test_a_torch_dtype_names_its_format() -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(53))
    for dtype, name in ((torch.float8_e4m3fn, "e4m3fn"), (torch.bfloat16, "bf16"),
                        (torch.int8, "int8"), (torch.float8_e8m0fnu, "e8m0")):  # fmt: skip
        assert sr.format(dtype) is sr.format(name)
        by_dtype, by_name = sr.round(x, dtype, "sr", seed=1), sr.round(x, name, "sr", seed=1)
        assert torch.equal(by_dtype.view(torch.int32), by_name.view(torch.int32))
        assert torch.equal(sr.encode(x, dtype, sat="finite"), sr.encode(x, name, sat="finite"))
    with pytest.raises(ValueError, match=r"dtype torch\.complex64 has no matching"):
        sr.round(x, torch.complex64)


def test_numpy_integers_are_ints() -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(54))
    expected = sr.round(x, "e4m3fn", "sr", rbits=4, seed=2**64 - 1, offset=3, index_offset=5)
    got = sr.round(
        x,
        "e4m3fn",
        "sr",
        rbits=np.int8(4),
        seed=np.uint64(2**64 - 1),
        offset=np.int32(3),
        index_offset=np.int64(5),
    )
    assert torch.equal(got, expected)
    assert sr.Format(ebits=np.int64(4), mbits=np.int32(3)) == sr.Format(ebits=4, mbits=3)
    assert sr.Format.p3109(np.int64(8), np.uint8(4)) == sr.Format.p3109(8, 4)
    assert sr.Format.integer(np.int16(8)) == sr.Format.integer(8)
    assert sr.Format.cfloat8(np.int8(4), np.int8(3), np.int8(20)) == sr.Format.cfloat8(4, 3, 20)
    with pytest.raises(ValueError, match="rbits must be"):
        sr.round(x, "e4m3fn", "sr", rbits=np.float32(4))


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("torch.sparse_coo", lambda x: sr.round(x.to_sparse(), "bf16")),
        ("torch.sparse_csr", lambda x: sr.cast(x.to_sparse_csr(), torch.bfloat16)),
        ("meta", lambda x: sr.encode(torch.empty(4, device="meta"), "e4m3fn")),
        ("torch.func", lambda x: torch.func.vmap(lambda r: sr.round(r, "bf16", "sr", seed=1))(x)),
        ("torch.func", lambda x: torch.func.grad(lambda r: sr.round(r, "bf16").sum())(x)),
        ("torch.jit.trace", lambda x: torch.jit.trace(lambda r: sr.round(r, "bf16"), (x,))),
    ],
)
def test_unsupported_inputs_raise_one_clear_error(what: str, call) -> None:
    with pytest.raises(TypeError, match=f"stochround does not support {what}"):
        call(torch.randn(4, 4))


def test_the_custom_op_passes_torch_opcheck() -> None:
    """The op's schema (named, typed arguments), shape function and autograd agree with its
    body (torch.library.opcheck), for values with a gradient and for 8-bit float codes."""
    from stochround.rounding.op import FormatFields

    fields = FormatFields.of(sr.format("e4m3fn")).to_op()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(60))

    def arguments(x: torch.Tensor, offset_tensor: torch.Tensor | None, **values: object) -> tuple:
        return (x, None, offset_tensor, None, *values.values())

    value_call = arguments(
        x.requires_grad_(), None, seed=3, offset=-5, rbits=32, index_offset=7,
        check_rand=False, mode="sr", sat="none", variant="c", source="stream", nan="raise",
        backend="auto", output="value", format_fields=fields, format_name="e4m3fn",
        operand_fields=[], out_dtype=torch.float32, flush_below=None,
    )  # fmt: skip
    codes_call = arguments(
        x.detach(), torch.tensor([2]), seed=2**63 - 1, offset=0, rbits=32, index_offset=0,
        check_rand=False, mode="rne", sat="finite", variant="c", source="stream",
        nan="raise", backend="torch", output="codes", format_fields=fields,
        format_name="e4m3fn", operand_fields=[], out_dtype=torch.float8_e4m3fn,
        flush_below=None,
    )  # fmt: skip
    for args in (value_call, codes_call):
        results = torch.library.opcheck(torch.ops.stochround.round.default, args)
        assert set(results.values()) == {"SUCCESS"}, results


def test_the_custom_op_takes_named_typed_arguments() -> None:
    """No argument of the op is a bundle of positions: each choice, int and flag has its
    own name and type; a format's fields travel as one typed record's int list."""
    schema = str(torch.ops.stochround.round.default._schema)
    for argument in (
        "SymInt seed", "SymInt offset", "SymInt rbits", "SymInt index_offset",
        "bool check_rand", "str mode", "str sat", "str variant", "str source", "str nan",
        "str backend", "str output", "SymInt[] format_fields", "SymInt[] operand_fields",
    ):  # fmt: skip
        assert argument in schema, (argument, schema)
    assert "ints" not in schema and "choices" not in schema


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_format_travels_through_the_op_as_its_fields(name: str) -> None:
    from stochround.rounding.op import FormatFields

    fmt = sr.format(name)
    fields = FormatFields.of(fmt)
    assert FormatFields.from_op(fields.to_op()) == fields
    assert fields.format(fmt.name) == fmt


def test_format_fields_of_the_wrong_length_are_refused() -> None:
    from stochround.rounding.op import FormatFields

    with pytest.raises(ValueError, match="a format travels as 8 ints; got 7"):
        FormatFields.from_op([1] * 7)


COMPILED_CPU = pytest.mark.skipif(
    cpu_path.compile_refusal() is not None, reason="no C++ compiler for the compiled CPU path"
)


def test_the_compiled_cpu_path_says_why_it_does_not_take_a_call() -> None:
    """Its refusal is a reason (None where it takes the call), and a route takes the path
    exactly where there is none."""
    from stochround.rounding.route import _cpu_path_refusal, call_route

    bf16, fp32 = sr.format("bf16"), torch.float32
    assert _cpu_path_refusal(bf16, "sr", "stream", "value", torch.bfloat16, fp32, 32, "c") is None
    assert _cpu_path_refusal(bf16, "rne", "stream", "value", fp32, fp32, 32, "c") == (
        "the compiled CPU path computes SR from the random stream only"
    )
    assert _cpu_path_refusal(sr.format("fp16"), "sr", "stream", "value", fp32, fp32, 32, "c") == (
        "the compiled CPU path computes bfloat16 values only"
    )
    choices = ("bf16", "sr", None, "c", "none", "raise", "stream", "auto", "value", None)
    assert call_route(choices, fp32, False, False).cpu
    assert not call_route((*choices[:6], "data", *choices[7:]), fp32, False, False).cpu


@COMPILED_CPU
@pytest.mark.compiles
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_large_cpu_bf16_sr_casts_take_the_compiled_path_with_the_same_bits(monkeypatch) -> None:
    calls = []
    original = cpu_path.bf16_sr_cpu
    monkeypatch.setattr(
        cpu_path, "bf16_sr_cpu", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    x = torch.randn(cpu_path.MIN_COMPILED_ELEMENTS + 3, generator=torch.Generator().manual_seed(0))
    for options in (
        {"seed": 1},
        {"seed": 2, "offset": torch.tensor(5), "rbits": 7, "variant": "a", "sat": "finite"},
    ):
        auto = sr.cast(x, torch.bfloat16, "sr", **options)
        torch_path = sr.cast(x, torch.bfloat16, "sr", backend="torch", **options)
        assert torch.equal(auto.view(torch.int16), torch_path.view(torch.int16))
        values = sr.round(x, "bf16", "sr", **options)  # fp32 values of bf16
        assert values.dtype == torch.float32 and torch.equal(values, torch_path.float())
    assert len(calls) == 4
    sr.cast(x[:100], torch.bfloat16, "sr", seed=1)  # small: the PyTorch path
    sr.cast(x, torch.bfloat16, "sr", seed=1, backend="torch")
    sr.cast(x, torch.bfloat16, "sr", rbits=8, variant="c", seed=1)  # not a variant it takes
    assert len(calls) == 4
