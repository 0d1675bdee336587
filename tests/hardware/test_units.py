"""Hardware presets (`hardware.py`) against bit-level models of the documented units.

Each unit is modelled here a second time, directly from its documented algorithm, on the
input's integer bit pattern: add the random integer to the dropped bits, keep the bits
above (AMD, NVIDIA, Intel fp32 -> fp16); mask the random number to the bits dropped and
add it to the fp32 significand, flushing below 2**-25 (Graphcore); add the bias byte to
the fp16 bit pattern and keep its upper byte (Intel fp16 -> bf8); Transformer Engine's
software e2m1 SR as its fp32 code computes it. The presets must equal
these models bit for bit, and equal `sr.round`'s contract wherever DESIGN.md's variant a
describes the unit, for every random integer where the count allows it (rbits <= 16, and
one subnormal AMD case with all 2**20), and at the decision threshold and its neighbours
plus a random sample otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
import torch

import stochround as sr
from stochround import hardware, reference
from stochround.formats import Format

EXPECTED_PRESETS = {
    "amd-mi300-fp8": ("binary32", "e4m3fnuz", 20, "none"),
    "amd-mi300-bf8": ("binary32", "e5m2fnuz", 21, "none"),
    "amd-mi350-fp8": ("binary32", "e4m3fn", 20, "none"),
    "amd-mi350-bf8": ("binary32", "e5m2", 21, "none"),
    "nvidia-cvt-rs-fp16": ("binary32", "binary16", 13, "none"),
    "nvidia-cvt-rs-bf16": ("binary32", "bfloat16", 16, "none"),
    "nvidia-cvt-rs-e4m3": ("binary32", "e4m3fn", 16, "finite"),
    "nvidia-cvt-rs-e5m2": ("binary32", "e5m2", 16, "finite"),
    "nvidia-cvt-rs-e2m3": ("binary32", "e2m3", 16, "finite"),
    "nvidia-cvt-rs-e3m2": ("binary32", "e3m2", 16, "finite"),
    "nvidia-cvt-rs-e2m1": ("binary32", "e2m1", 16, "finite"),
    "graphcore-ipu-fp16": ("binary32", "binary16", 24, "propagate"),
    "intel-fp16": ("binary32", "binary16", 13, "none"),
    "intel-e5m2": ("binary16", "e5m2", 8, "none"),
    "transformer-engine-sr-e2m1": ("binary32", "e2m1", 8, "finite"),
}
ADD_AND_TRUNCATE = [name for name in EXPECTED_PRESETS if name.startswith(("amd", "nvidia"))]
ADD_AND_TRUNCATE.append("intel-fp16")
# Every random integer for every interesting input (13 bits), for two of them (16 bits:
# one destination per distinct width of the dropped field), and around the decision
# threshold for the rest: 2**16 evaluations per input is the runtime budget's limit.
EVERY_INTEGER = ["nvidia-cvt-rs-fp16", "intel-fp16", "nvidia-cvt-rs-bf16", "nvidia-cvt-rs-e4m3"]
AT_THRESHOLD = [name for name in ADD_AND_TRUNCATE if name not in EVERY_INTEGER]
GRAPHCORE_FLUSH = 2.0**-25


# --- comparison helpers ------------------------------------------------------------------


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, context: str) -> None:
    """Equal float64 bit patterns (zeros by sign); NaN matches NaN."""
    a = actual.to(torch.float64).reshape(-1)
    b = expected.to(torch.float64).reshape(-1)
    same = (a.view(torch.int64) == b.view(torch.int64)) | (torch.isnan(a) & torch.isnan(b))
    if not bool(same.all()):
        bad = torch.nonzero(~same).flatten()[:5].tolist()
        detail = ", ".join(f"#{i}: got {a[i].item()!r} want {b[i].item()!r}" for i in bad)
        raise AssertionError(f"{context}: {int((~same).sum())} mismatches; {detail}")


def contract(x: torch.Tensor, name: str, rand: torch.Tensor) -> torch.Tensor:
    """sr.round with the preset's contract arguments, on x in its source format."""
    p = hardware.preset(name)
    return sr.round(
        x, p.target_format, "sr", rbits=p.rbits, variant=p.variant, sat=p.sat, rand=rand
    )


def grid(x: torch.Tensor, rand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (value, random integer) pair, as two flat tensors."""
    xs = x.reshape(-1, 1).expand(-1, rand.numel()).reshape(-1)
    rs = rand.reshape(1, -1).expand(x.numel(), -1).reshape(-1)
    return xs, rs


# --- bit-level models of the documented units ----------------------------------------------


def _special_or(x: torch.Tensor, value: torch.Tensor, fmt: Format, sat: str) -> torch.Tensor:
    """Zeros, infinities and NaN of fp32 input x, and overflow of the rounded magnitude
    `value` (>= 0), with the sign restored: the parts the units handle beside the carry."""
    xd = x.to(torch.float64)
    negative = torch.signbit(xd)
    inf_value = math.inf if fmt.inf else math.nan
    overflow = fmt.max if sat in ("finite", "propagate") else inf_value
    infinite = fmt.max if sat == "finite" else inf_value
    value = torch.where(value > fmt.max, overflow, value)
    value = torch.where(torch.isinf(xd), infinite, value)
    value = torch.where(negative, -value, value)
    if not fmt.has_negative_zero:
        value = torch.where(value == 0, 0.0, value)
    return torch.where(torch.isnan(xd), math.nan, value)


def _fp32_fields(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(significand with its implicit bit, exponent of its leading bit) of fp32 x: the value
    is significand * 2**(exponent - 23)."""
    bits = x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    biased = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    significand = torch.where(biased > 0, mantissa | (1 << 23), mantissa)
    exponent = torch.where(biased > 0, biased - 127, torch.full_like(biased, -126))
    return significand, exponent


def add_and_truncate_model(x: torch.Tensor, r: torch.Tensor, name: str) -> torch.Tensor:
    """AMD V_CVT_SR_*, NVIDIA cvt.rs, Intel fp32 -> fp16: shift the fp32 significand so the
    target ulp sits at bit 23 - m (a subnormal result shifts k more bits out, with no
    sticky bit), keep the n dropped bits just below it, add r, keep what is above."""
    p = hardware.preset(name)
    fmt = p.target
    significand, e = _fp32_fields(x)
    k = torch.clamp(fmt.emin - e, min=0, max=40)
    dropped_normal = 23 - fmt.mbits
    aligned = significand >> k
    kept = ((aligned >> (dropped_normal - p.rbits)) + r) >> p.rbits
    q = torch.maximum(e, torch.full_like(e, fmt.emin)) - fmt.mbits
    value = torch.ldexp(kept.to(torch.float64), q.to(torch.float64))
    return _special_or(x, value, fmt, p.sat)


def graphcore_model(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Graphcore fp32 -> fp16: the random number is the top d bits of a 24-bit r, d = 13
    for a normal result plus one per binade below 2**-14; added to the fp32 significand,
    carry kept; |x| < 2**-25 (exponent below -25) flushes to a signed zero."""
    fmt = sr.format("binary16")
    significand, e = _fp32_fields(x)
    dropped = 13 + torch.clamp(-14 - e, min=0)
    flushed = e < -25
    dropped = torch.where(flushed, torch.full_like(dropped, 24), dropped)
    kept = (significand + (r >> (24 - dropped))) >> dropped
    kept = torch.where(flushed, torch.zeros_like(kept), kept)
    q = torch.maximum(e, torch.full_like(e, -14)) - 10
    value = torch.ldexp(kept.to(torch.float64), q.to(torch.float64))
    return _special_or(x, value, fmt, "propagate")


def intel_e5m2_model(x16: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Intel fp16 -> bf8 with bias: bf8 is fp16's upper byte, so add the bias byte to the
    fp16 bit pattern as an integer and keep the upper byte (shifted back, it is the fp16
    pattern of the bf8 value). Infinity and NaN bypass the add."""
    pattern = x16.view(torch.int16).to(torch.int64) & 0xFFFF
    special = (pattern & 0x7C00) == 0x7C00
    rounded = ((pattern + r) >> 8) << 8
    rounded = torch.where(special, pattern, rounded)
    return rounded.to(torch.int16).view(torch.float16).to(torch.float64)


def model(x: torch.Tensor, r: torch.Tensor, name: str) -> torch.Tensor:
    if name == "graphcore-ipu-fp16":
        return graphcore_model(x, r)
    if name == "intel-e5m2":
        return intel_e5m2_model(x, r)
    return add_and_truncate_model(x, r, name)


# --- inputs --------------------------------------------------------------------------------


def interesting_inputs(name: str) -> torch.Tensor:
    """fp32 values for a preset's target: normal results off the grid (both signs), a
    subnormal result one binade down, one deep in the subnormals with many dropped bits,
    one below the smallest subnormal, and one between the largest value and the overflow
    threshold."""
    fmt = hardware.preset(name).target
    values = [
        fmt.min_normal * 1.6180339887,
        -fmt.max * 0.3183098862,
        fmt.min_normal * 0.7071067812,
        -fmt.min_subnormal * 2.7182818285,
        fmt.min_subnormal * 0.4142135624,
        fmt.max * (1 + 2.0 ** -(fmt.mbits + 2)),
    ]
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def away_count(x: float, fmt: Format, n: int) -> int:
    """floor(nu 2**n): how many of the 2**n random integers round |x| away (variant a)."""
    nu = reference.discarded_fraction(Fraction(x), fmt)
    return math.floor(nu * 2**n)


# --- registry and errors -------------------------------------------------------------------


def test_registry_holds_the_documented_presets() -> None:
    assert set(hardware.PRESETS) == set(EXPECTED_PRESETS)
    for name, (source, target, rbits, sat) in EXPECTED_PRESETS.items():
        p = hardware.preset(name)
        assert (p.name, p.source_format, p.target_format, p.rbits, p.sat) == (
            name,
            source,
            target,
            rbits,
            sat,
        )
        assert p.variant == "a"
        assert p.description and p.source and p.exact_domain and p.decisions
        assert hardware.preset(name.upper()) is p
        assert hardware.preset(p) is p
    assert hardware.preset("graphcore-ipu-fp16").flush_below == GRAPHCORE_FLUSH
    assert all(
        p.flush_below is None for p in hardware.PRESETS.values() if p.name != "graphcore-ipu-fp16"
    )


def test_bad_names_raise_with_close_names() -> None:
    with pytest.raises(ValueError, match="amd-mi300-fp8"):
        hardware.preset("amd-mi300-fp9")
    with pytest.raises(ValueError, match="nvidia-cvt-rs-e4m3"):
        hardware.round_hardware(torch.ones(2), "nvidia-cvt-rs-e4m2", seed=1)
    with pytest.raises(ValueError, match="known: "):
        hardware.bias_against_exact("zzzzzz", torch.ones(2))
    with pytest.raises(TypeError, match="preset must be"):
        hardware.preset(3)  # type: ignore[arg-type]


def test_bad_arguments_raise() -> None:
    with pytest.raises(TypeError, match="x must"):
        hardware.round_hardware([1.0], "intel-fp16", seed=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"2\*\*13"):
        hardware.round_hardware(torch.ones(2), "intel-fp16", rand=torch.tensor([0, 8192]))
    with pytest.raises(ValueError, match="broadcast"):
        hardware.round_hardware(torch.ones(2), "intel-fp16", rand=torch.zeros(3, dtype=torch.int64))
    base = hardware.preset("intel-fp16")
    with pytest.raises(ValueError, match="variant"):
        dataclasses.replace(base, variant="z")
    with pytest.raises(ValueError, match="sat"):
        dataclasses.replace(base, sat="clip")
    with pytest.raises(ValueError, match="rbits"):
        dataclasses.replace(base, rbits=40)
    with pytest.raises(ValueError, match="flush_below"):
        dataclasses.replace(base, flush_below=-1.0)
    with pytest.raises(ValueError, match="unknown format"):
        dataclasses.replace(base, target_format="fp7")


# --- every random integer ------------------------------------------------------------------


@pytest.mark.parametrize("name", EVERY_INTEGER)
def test_every_random_integer_matches_model_and_contract(name: str) -> None:
    """Normal and subnormal results (1 and several binades down, and below the smallest
    subnormal) and the overflow threshold, each with all 2**rbits integers."""
    p = hardware.preset(name)
    inputs = interesting_inputs(name)
    if p.rbits > 13:
        inputs = inputs[[0, 3]]  # a normal and a deep subnormal result
    x, r = grid(inputs, torch.arange(2**p.rbits))
    actual = hardware.round_hardware(x, name, rand=r)
    assert actual.dtype == torch.float32
    assert_bitwise(actual, model(x, r, name).to(torch.float32), f"{name} vs its unit")
    assert_bitwise(actual, contract(x, name, r), f"{name} vs sr.round")


@pytest.mark.parametrize("name", ADD_AND_TRUNCATE)
def test_specials_match_model(name: str) -> None:
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 3.0e38, -3.0e38])
    for r_value in (0, 2 ** hardware.preset(name).rbits - 1):
        r = torch.full(x.shape, r_value)
        actual = hardware.round_hardware(x, name, rand=r)
        assert_bitwise(actual, model(x, r, name).to(torch.float32), f"{name} r={r_value}")
        assert_bitwise(actual, contract(x, name, r), f"{name} r={r_value} vs sr.round")


def test_nvidia_x4_destinations_drop_the_low_bits_of_the_fraction() -> None:
    """16 of e4m3's 20 dropped bits: P(up) = floor(frac20 / 16) / 2**16 (the measurement
    the preset follows), so a value whose dropped bits are all below the top 16 never
    rounds up, while exact SR would."""
    fmt = sr.format("e4m3fn")
    x = torch.tensor([1.0 + 15 * 2.0**-23], dtype=torch.float32)  # frac20 = 15
    r = torch.arange(2**16)
    xs, rs = grid(x, r)
    assert bool((hardware.round_hardware(xs, "nvidia-cvt-rs-e4m3", rand=rs) == 1.0).all())
    assert away_count(float(x), fmt, 16) == 0
    assert away_count(float(x), fmt, 20) == 15


# --- around the decision threshold -----------------------------------------------------------


def _threshold_integers(x: float, fmt: Format, n: int, generator: torch.Generator) -> list[int]:
    """The integers around the variant-a decision threshold 2**n - floor(nu 2**n), the two
    ends, and a random sample."""
    threshold = 2**n - away_count(x, fmt, n)
    chosen = {0, 1, 2**n - 1, threshold - 2, threshold - 1, threshold, threshold + 1}
    chosen.update(torch.randint(0, 2**n, (256,), generator=generator).tolist())
    return sorted(v for v in chosen if 0 <= v < 2**n)


@pytest.mark.parametrize("name", AT_THRESHOLD)
def test_at_threshold_matches_model_and_contract(name: str) -> None:
    """Variant a rounds away exactly for r >= 2**n - floor(nu 2**n): the integers around
    that threshold, both ends and a sample, for every interesting input."""
    p = hardware.preset(name)
    generator = torch.Generator().manual_seed(20)
    for value in interesting_inputs(name).tolist():
        r = torch.tensor(_threshold_integers(value, p.target, p.rbits, generator))
        x = torch.full(r.shape, value, dtype=torch.float32)
        actual = hardware.round_hardware(x, name, rand=r)
        assert_bitwise(actual, model(x, r, name).to(torch.float32), f"{name} x={value}")
        assert_bitwise(actual, contract(x, name, r), f"{name} x={value} vs sr.round")


def test_amd_subnormal_results_truncate_the_extra_dropped_bits() -> None:
    """2**-9 (1 + 0x266667 * 2**-23) is two binades below e4m3fnuz's normal range: 22 bits
    are dropped, the seed covers the top 20, and the lowest two (0b11) are truncated, so
    the unit rounds away for floor(nu 2**20) seeds where exact SR needs nu 2**20: the
    limit of the equivalence with exact SR (and the preset's variant a reproduces it)."""
    name = "amd-mi300-fp8"
    fmt = hardware.preset(name).target
    value = 2.0**-9 * (1 + 0x266667 * 2.0**-23)
    nu = reference.discarded_fraction(Fraction(value), fmt)
    assert nu * 2**22 % 4 == 3
    threshold = 2**20 - math.floor(nu * 2**20)
    r = torch.tensor([threshold - 1, threshold])
    x = torch.full(r.shape, value, dtype=torch.float32)
    actual = hardware.round_hardware(x, name, rand=r)
    assert actual.tolist() == [2.0**-9, 2.0**-9 + 2.0**-10]
    assert_bitwise(actual, model(x, r, name).to(torch.float32), "amd subnormal vs unit")
    expected = hardware.expected_value(x[:1], name).item()
    chance = Fraction(math.floor(nu * 2**20), 2**20)
    assert Fraction(expected) == Fraction(2) ** -9 + chance * Fraction(2) ** -10
    assert chance < nu


def test_graphcore_uses_the_top_bits_of_r_as_the_mask_grows() -> None:
    """For d <= 15 dropped bits (normal results and two subnormal binades) every value of
    the d bits the unit uses, with the unused low bits all zero and all ones."""
    name = "graphcore-ipu-fp16"
    values = [1.0 + 2.0**-12 + 2.0**-20, 2.0**-15 * 1.37, -(2.0**-16) * 1.91]
    for value in values:
        _, e = _fp32_fields(torch.tensor([value]))
        dropped = 13 + max(0, -14 - int(e))
        top = torch.arange(2**dropped) << (24 - dropped)
        for low in (0, 2 ** (24 - dropped) - 1):
            r = top | low
            x = torch.full(r.shape, value, dtype=torch.float32)
            actual = hardware.round_hardware(x, name, rand=r)
            assert_bitwise(actual, graphcore_model(x, r).to(torch.float32), f"x={value}")
            assert_bitwise(actual, contract(x, name, r), f"x={value} vs sr.round")


def test_graphcore_flushes_below_half_the_smallest_subnormal() -> None:
    """Below 2**-25 the contract still rounds up for the top floor(nu 2**24) integers; the
    unit gives a signed zero for every r. At 2**-25 itself nothing is flushed."""
    name = "graphcore-ipu-fp16"
    fmt = sr.format("binary16")
    for value in (2.0**-26, -(2.0**-25) * 0.75, 2.0**-30 * 1.5, -(2.0**-40), 2.0**-48):
        count = away_count(value, fmt, 24)
        assert count >= 1
        r = torch.tensor([0, 2**24 - count - 1, 2**24 - count, 2**24 - 1])
        x = torch.full(r.shape, value, dtype=torch.float32)
        actual = hardware.round_hardware(x, name, rand=r)
        zero = math.copysign(0.0, value)
        assert_bitwise(actual, torch.full(r.shape, zero), f"flush {value}")
        wanted = [zero, zero, math.copysign(2.0**-24, value), math.copysign(2.0**-24, value)]
        assert_bitwise(contract(x, name, r), torch.tensor(wanted), f"contract {value}")
        assert_bitwise(actual, graphcore_model(x, r).to(torch.float32), f"unit {value}")
    r = torch.tensor([2**23 - 1, 2**23])
    x = torch.full(r.shape, GRAPHCORE_FLUSH, dtype=torch.float32)
    assert_bitwise(hardware.round_hardware(x, name, rand=r), torch.tensor([0.0, 2.0**-24]), "")


# --- Intel fp16 -> bf8: every fp16 bit pattern ---------------------------------------------


def test_intel_e5m2_every_fp16_pattern_matches_the_byte_add() -> None:
    name = "intel-e5m2"
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    for r_value in (0, 255):
        r = torch.full(patterns.shape, r_value)
        actual = hardware.round_hardware(patterns, name, rand=r)
        assert actual.dtype == torch.float16
        assert_bitwise(actual, intel_e5m2_model(patterns, r), f"r={r_value}")
        assert_bitwise(actual, contract(patterns, name, r), f"r={r_value} vs sr.round")
    generator = torch.Generator().manual_seed(8)
    some = patterns[torch.randint(0, 65536, (96,), generator=generator)]
    edges = torch.tensor([1.0, 2.0**-24, 2.0**-14 * 1.7, 65504.0, 57344.0, 61440.0 - 16])
    x, r = grid(
        torch.cat([some, edges.to(torch.float16), -edges.to(torch.float16)]), torch.arange(256)
    )
    actual = hardware.round_hardware(x, name, rand=r)
    assert_bitwise(actual, intel_e5m2_model(x, r), "every bias byte")
    assert_bitwise(actual, contract(x, name, r), "every bias byte vs sr.round")


# --- random words, operand rounding, dtypes ------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_seeded_words_match_sr_round(name: str) -> None:
    """With a seed, element i's integer is the top rbits bits of its word, as in sr.round."""
    p = hardware.preset(name)
    generator = torch.Generator().manual_seed(3)
    fmt = p.target
    magnitude = torch.exp2(
        torch.rand(512, generator=generator, dtype=torch.float64)
        * (math.log2(fmt.max) - math.log2(fmt.min_subnormal) + 1)
        + math.log2(fmt.min_subnormal)
    )
    sign = torch.where(torch.rand(512, generator=generator) < 0.5, -1.0, 1.0)
    x = (sign * magnitude).to(p.operand.torch_dtype)
    if p.flush_below is not None:
        x = x[x.abs() >= p.flush_below]
    actual = hardware.round_hardware(x, name, seed=1234, offset=7)
    wanted = sr.round(x, **p.contract_arguments(), seed=1234, offset=7)
    assert_bitwise(actual, wanted, name)


def test_wider_inputs_are_rounded_to_the_operand_format_first() -> None:
    # fp64 1 + 2**-11 - 2**-40 is fp32 1 + 2**-11: a tie for fp16, which r = 2**23 carries.
    value = 1.0 + 2.0**-11 - 2.0**-40
    x = torch.tensor([value], dtype=torch.float64)
    r = torch.tensor([2**23])
    assert hardware.round_hardware(x, "graphcore-ipu-fp16", rand=r).item() == 1.0 + 2.0**-10
    assert contract(x, "graphcore-ipu-fp16", r).item() == 1.0  # the fp64 value falls short
    # fp32 1 + 2**-11 + 2**-20 is fp16 1 + 2**-10 (nearest), which bf8 then rounds from.
    x32 = torch.tensor([1.0 + 2.0**-11 + 2.0**-20], dtype=torch.float32)
    r8 = torch.tensor([255])
    assert hardware.round_hardware(x32, "intel-e5m2", rand=r8).item() == 1.25
    assert hardware.round_hardware(x32, "intel-e5m2", rand=torch.tensor([191])).item() == 1.0
    assert hardware.operand_values(x32, "intel-e5m2").dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_result_has_the_input_dtype(dtype: torch.dtype) -> None:
    x = torch.tensor([0.3, -1.7, 5e-5], dtype=dtype)
    for name in ("amd-mi300-fp8", "nvidia-cvt-rs-bf16", "intel-e5m2"):
        result = hardware.round_hardware(x, name, seed=5)
        assert result.dtype == dtype and result.shape == x.shape
        assert_bitwise(result, hardware.round_hardware_float64(x, name, seed=5).to(dtype), name)


def test_rand_broadcasts() -> None:
    x = torch.tensor([[0.3, 0.7], [1.1, -2.5]])
    one = hardware.round_hardware(x, "intel-fp16", rand=torch.tensor([4095]))
    full = hardware.round_hardware(x, "intel-fp16", rand=torch.full(x.shape, 4095))
    assert_bitwise(one, full, "broadcast rand")


# --- bias ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["intel-e5m2", "intel-fp16", "nvidia-cvt-rs-fp16"])
def test_expected_value_enumeration_equals_closed_form(name: str) -> None:
    p = hardware.preset(name)
    x = torch.cat(
        [interesting_inputs(name), torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])]
    )
    operand = hardware.operand_values(x, p)
    assert_bitwise(
        hardware.units._expected_by_enumeration(p, operand),
        hardware.units._expected_by_closed_form(p, operand),
        name,
    )


def test_bias_is_zero_where_the_unit_is_exact_sr() -> None:
    generator = torch.Generator().manual_seed(11)
    fp16 = torch.randn(256, generator=generator).to(torch.float16) * 100
    assert bool((hardware.bias_against_exact("intel-e5m2", fp16) == 0).all())
    normal = (torch.rand(16, generator=generator) + 0.01) * 100
    for name in ("amd-mi300-fp8", "amd-mi300-bf8", "nvidia-cvt-rs-fp16", "graphcore-ipu-fp16"):
        assert bool((hardware.bias_against_exact(name, normal) == 0).all()), name
    deep = torch.tensor([2.0**-20 * 1.2345, -(2.0**-25) * 1.5, 2.0**-25])
    assert bool((hardware.bias_against_exact("graphcore-ipu-fp16", deep) == 0).all())


def test_bias_equals_the_truncated_fraction() -> None:
    """Variant a with n bits: E - x = (floor(nu 2**n) / 2**n - nu) ulp, toward zero."""
    cases = [
        ("nvidia-cvt-rs-e4m3", [1.0 + 15 * 2.0**-23, -3.3, 300.0]),
        ("amd-mi300-fp8", [2.0**-9 * 1.2345, -(2.0**-12) * 1.777]),  # subnormal results
        ("intel-fp16", [2.0**-20 * 1.2345, 0.1]),
    ]
    for name, values in cases:
        p = hardware.preset(name)
        x = torch.tensor(values, dtype=torch.float32)
        bias = hardware.bias_against_exact(name, x)
        for i, value in enumerate(x.tolist()):
            nu = reference.discarded_fraction(Fraction(value), p.target)
            truncated = Fraction(math.floor(nu * 2**p.rbits), 2**p.rbits)
            wanted = float((truncated - nu) * (1 if value > 0 else -1))
            assert bias[i].item() == wanted, (name, value)


def test_bias_shows_flushing_and_saturation() -> None:
    bias = hardware.bias_against_exact("graphcore-ipu-fp16", torch.tensor([2.0**-26, -(2.0**-27)]))
    assert bias.tolist() == [-0.25, 0.125]
    saturated = hardware.bias_against_exact("nvidia-cvt-rs-e4m3", torch.tensor([1000.0]))
    assert saturated.item() == (448.0 - 1000.0) / 64.0
    assert math.isnan(hardware.bias_against_exact("amd-mi300-fp8", torch.tensor([1e6])).item())
    assert math.isinf(hardware.bias_against_exact("intel-fp16", torch.tensor([65520.0])).item())


def test_round_takes_a_hardware_preset_by_name() -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(3)) * 10
    assert torch.equal(
        sr.round(x, hardware="amd-mi300-fp8", seed=5),
        hardware.round_hardware(x, "amd-mi300-fp8", seed=5),
    )
    # a format that agrees with the preset's target is accepted, by name or alias
    assert torch.equal(
        sr.round(x, "fp8_e4m3fnuz", hardware="amd-mi300-fp8", seed=5),
        hardware.round_hardware(x, "amd-mi300-fp8", seed=5),
    )
    with pytest.raises(ValueError, match="rounds to e4m3fnuz, not to fmt=e4m3fn"):
        sr.round(x, "e4m3fn", hardware="amd-mi300-fp8")
    with pytest.raises(ValueError, match="sets the mode, rbits, variant and sat"):
        sr.round(x, hardware="amd-mi300-fp8", rbits=8)
    with pytest.raises(ValueError, match="PyTorch path"):
        sr.round(x, hardware="amd-mi300-fp8", backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        sr.round(x, hardware="amd-mi300-fp8", backend="gpu")
    with pytest.raises(ValueError, match="unknown hardware preset"):
        sr.round(x, hardware="amd-mi999")
    with pytest.raises(ValueError, match="fmt is required"):
        sr.round(x)


def test_families_pick_their_unit_by_target_format() -> None:
    """A family's name with the unit's format finds the unit (the issue's
    ``sr.round(x, hardware="amd-mi300", ...)``); a family of one unit needs no format."""
    assert hardware.FAMILIES.keys() == {
        "amd-mi300",
        "amd-mi350",
        "nvidia-cvt-rs",
        "graphcore-ipu",
        "intel",
        "transformer-engine-sr",
    }
    for family, members in hardware.FAMILIES.items():
        for member in members:
            assert hardware.family(member.name) == family
            assert hardware.preset(family.upper(), member.target_format) is member
            assert hardware.preset(member.name, member.target) is member
    assert sum(map(len, hardware.FAMILIES.values())) == len(hardware.PRESETS)
    assert hardware.preset("graphcore-ipu").name == "graphcore-ipu-fp16"
    assert hardware.preset("nvidia-cvt-rs", "fp8_e4m3fn").name == "nvidia-cvt-rs-e4m3"
    x = torch.randn(4096, generator=torch.Generator().manual_seed(4)) * 10
    assert torch.equal(
        sr.round(x, "e5m2fnuz", hardware="amd-mi300", seed=2),
        hardware.round_hardware(x, "amd-mi300-bf8", seed=2),
    )
    with pytest.raises(ValueError, match=r"has 2 units.*'e4m3fnuz' \(amd-mi300-fp8\)"):
        sr.round(x, hardware="amd-mi300", seed=2)
    with pytest.raises(ValueError, match="no unit rounding to e4m3fn; its units"):
        hardware.preset("amd-mi300", "e4m3fn")
    with pytest.raises(ValueError, match="unknown format"):
        hardware.preset("amd-mi300", "fp7")
    with pytest.raises(ValueError, match="rounds to binary16, not to fmt=e5m2"):
        hardware.preset(hardware.preset("intel-fp16"), "e5m2")


def test_round_with_a_preset_draws_the_words_of_global_indices() -> None:
    """index_offset: a tensor rounded in shards equals it rounded whole."""
    x = torch.randn(999, generator=torch.Generator().manual_seed(5)) * 4
    whole = sr.round(x, hardware="intel-fp16", seed=9)
    shards = [
        sr.round(x[start:stop], hardware="intel-fp16", seed=9, index_offset=start)
        for start, stop in ((0, 101), (101, 500), (500, 999))
    ]
    assert torch.equal(torch.cat(shards), whole)
    assert not torch.equal(sr.round(x[101:500], hardware="intel-fp16", seed=9), shards[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_presets_round_cuda_tensors_as_cpu_ones(dtype: torch.dtype) -> None:
    """The presets' PyTorch path gives the same bits on CUDA as on the CPU, for the
    counter-based words and for explicit ones."""
    x = (torch.randn(3001, generator=torch.Generator().manual_seed(6)) * 8).to(dtype)
    rand = torch.randint(0, 2**8, (3001,), generator=torch.Generator().manual_seed(7))
    for name in hardware.PRESETS:
        on_gpu = sr.round(x.cuda(), hardware=name, seed=4, index_offset=5).cpu()
        assert torch.equal(on_gpu, sr.round(x, hardware=name, seed=4, index_offset=5)), name
        on_gpu = sr.round(x.cuda(), hardware=name, rand=rand.cuda()).cpu()
        assert torch.equal(on_gpu, sr.round(x, hardware=name, rand=rand)), name


# --- Transformer Engine's software SR to e2m1 ----------------------------------------------

TE_NAME = "transformer-engine-sr-e2m1"


def _e2m1_step(a: torch.Tensor) -> torch.Tensor:
    """The e2m1 grid step at magnitude a: 0.5 below 2, 1 in [2, 4), 2 from 4."""
    return torch.where(a >= 4, 2.0, torch.where(a >= 2, 1.0, 0.5)).to(torch.float64)


def transformer_engine_model(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """TE's ptx::stochastic_round_fp4_e2m1 on fp32 x with 8-bit r, in float64 tensors:
    u = r / 256, s = step(|x|), t = fmaf(u, s, |x|) (one rounding to fp32), q =
    min(floor(t / step(t)) * step(t), 6), with x's sign; NaN gives +6. The float64 sum
    |x| + u s is exact where |x| >= 2**-28 or |x| = 0 (|x| has 24 significant bits, u s is
    a multiple of 2**-9 below 8), so converting it to fp32 is fmaf's single rounding:
    callers pass only such x."""
    xd = x.to(torch.float32).to(torch.float64)
    a = xd.abs()
    exact_sum = a + r.to(torch.float64) / 256 * _e2m1_step(a)
    t = exact_sum.to(torch.float32).to(torch.float64)
    step_t = _e2m1_step(t)
    q = torch.clamp(torch.floor(t / step_t) * step_t, max=6.0)
    q = torch.where(torch.isnan(xd), 6.0, torch.copysign(q, xd))
    return q


def te_inputs() -> torch.Tensor:
    """fp32 inputs for TE's e2m1 SR: every bf16 pattern with magnitude in [2**-28, 16]
    (every grid point, midpoint and the values between at bf16 resolution), random fp32
    values with full 24-bit significands over the same range, both signs, zeros, values
    beyond 6, infinities, and values just under multiples of 2**-9 whose sum with u s
    fmaf rounds onto 0.5 (and one just outside that band)."""
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bf16 = patterns.to(torch.float32)
    bf16 = bf16[(bf16.abs() >= 2.0**-28) & (bf16.abs() <= 16)]
    generator = torch.Generator().manual_seed(30)
    magnitude = torch.exp2(torch.rand(4096, generator=generator, dtype=torch.float64) * 32 - 28)
    sign = torch.where(torch.rand(4096, generator=generator) < 0.5, -1.0, 1.0)
    fp32 = (magnitude * sign).to(torch.float32)
    specials = torch.tensor([0.0, -0.0, 6.0, -6.0, 7.0, 1e30, -3e38, math.inf, -math.inf])
    near = [2.0**-9 - 2.0**-26, 2.0**-9 - 2.0**-33, 2.0**-8 - 2.0**-32, 0.25 - 2.0**-26]
    outside = [2.0**-9 - 2.0**-25]
    carried = torch.tensor(near + [-v for v in near] + outside, dtype=torch.float32)
    return torch.cat([bf16, fp32, specials, carried])


def test_transformer_engine_preset_equals_gfloat_stochastic_fastest() -> None:
    """The preset is gfloat's round_ndarray(e2m1, x, StochasticFastest, sat=True,
    srbits=r, srnumbits=8) bit for bit, for every r in [0, 256) on every test input."""
    from gfloat import RoundMode, round_ndarray
    from gfloat import formats as gf

    x, r = grid(te_inputs(), torch.arange(256))
    actual = hardware.round_hardware(x, TE_NAME, rand=r)
    expected = round_ndarray(
        gf.format_info_ocp_e2m1,
        x.to(torch.float64).numpy(),
        RoundMode.StochasticFastest,
        True,
        r.numpy(),
        8,
    )
    assert_bitwise(actual, torch.from_numpy(expected), "TE preset vs gfloat StochasticFastest")
    assert_bitwise(actual, contract(x, TE_NAME, r), "TE preset vs sr.round")


def test_transformer_engine_preset_follows_tes_fp32_code_except_where_documented() -> None:
    """Against TE's fp32 function for every r: equal everywhere except (1) where fmaf's
    rounding carries |x| + u s from [0.5 - 2**-26, 0.5) onto 0.5 (ties go to 0.5, whose
    significand is even), which rounds up where the exact rule does not, and (2) NaN,
    which TE turns into +6. Both are the preset's documented decisions; the inputs hold cases of
    (1), so the difference is shown, not assumed."""
    x, r = grid(te_inputs(), torch.arange(256))
    actual = hardware.round_hardware(x, TE_NAME, rand=r).to(torch.float64)
    te = transformer_engine_model(x, r)
    exact_sum = x.to(torch.float64).abs() + r.to(torch.float64) / 512
    carried = (exact_sum >= 0.5 - 2.0**-26) & (exact_sum < 0.5)
    same = actual.view(torch.int64) == te.view(torch.int64)
    assert bool(same[~carried].all())
    assert int(carried.sum()) > 0 and bool((actual[carried] == 0).all())
    assert bool((te[carried] == 0.5 * torch.sign(x[carried])).all())
    # the rare inputs where the rounding happens, explicitly
    cases = torch.tensor([2.0**-9 - 2.0**-26, 2.0**-9 - 2.0**-33, 0.25 - 2.0**-26])
    rs = torch.tensor([255, 255, 128])
    assert hardware.round_hardware(cases, TE_NAME, rand=rs).tolist() == [0.0, 0.0, 0.0]
    assert transformer_engine_model(cases, rs).tolist() == [0.5, 0.5, 0.5]
    nan = torch.tensor([math.nan])
    assert transformer_engine_model(nan, torch.tensor([3])).item() == 6.0
    assert math.isnan(hardware.round_hardware(nan, TE_NAME, rand=torch.tensor([3])).item())


def test_transformer_engine_preset_takes_the_top_byte_of_each_elements_word() -> None:
    """With a seed, element i's 8 bits are the top 8 bits of random_words(i, seed, offset):
    one word per element, not TE's four bytes of a shared word."""
    from stochround import random as streams

    x = torch.randn(1000, generator=torch.Generator().manual_seed(31)) * 3
    words = streams.random_words(torch.arange(1000), 12, 3)
    assert torch.equal(
        sr.round(x, hardware=TE_NAME, seed=12, offset=3),
        hardware.round_hardware(x, TE_NAME, rand=words >> 24),
    )
    assert hardware.preset("transformer-engine-sr", "e2m1").name == TE_NAME


def test_the_two_e2m1_presets_differ_in_their_random_bits() -> None:
    """nvidia-cvt-rs-e2m1 (16 bits per value) and transformer-engine-sr-e2m1 (8 bits):
    the bias against exact SR is the truncated fraction at 2**-16 and 2**-8 resolution."""
    x = torch.tensor([1.0 + 2.0**-10], dtype=torch.float32)  # nu = 2**-9: below 2**-8
    assert hardware.bias_against_exact(TE_NAME, x).item() == -(2.0**-9)
    assert hardware.bias_against_exact("nvidia-cvt-rs-e2m1", x).item() == 0.0
