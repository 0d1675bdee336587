"""Elementwise SR arithmetic (`arith/elementwise.py`) against the scalar reference applied
to exact results."""

from __future__ import annotations

import math
import random
import struct
import zlib
from collections.abc import Iterable
from fractions import Fraction

import pytest
import torch
from helpers import assert_same_values
from hypothesis import given, settings
from hypothesis import strategies as st

import stochround as sr
from stochround import arith, reference
from stochround.formats import floor_log2

FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1")
DETERMINISTIC_MODES = ("rne", "rna", "rz", "ru", "rd", "ro")
# (rbits, variant): every variant with a few bits, and exact SR (32-bit words)
SR_CASES = ((1, "a"), (4, "b"), (4, "c"), (4, "odd"), (8, "c"), (None, "c"), (None, "a"))
OPS = ("add", "sub", "mul", "div", "fma", "sqrt")
ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "fma": 3, "sqrt": 1}
# sqrt computed to 2**-1200: far below every ulp and SR bit used here (float64 inputs too,
# whose roots reach down to 2**-537 and whose targets have ulps of 2**-185 and more)
SQRT_SCALE_BITS = 1200


def _sqrt_odd(x: float) -> Fraction:
    """sqrt(x) for x > 0 exactly when it is a dyadic rational, else the midpoint of the
    2**-K interval that holds it (integer isqrt).  No decision of the contract changes
    inside that open interval (K far exceeds q + n + 2), so both round identically."""
    num, den = x.as_integer_ratio()  # den is a power of two
    scaled = (num << (2 * SQRT_SCALE_BITS)) // den
    root = math.isqrt(scaled)
    if root * root == scaled and (num << (2 * SQRT_SCALE_BITS)) % den == 0:
        return Fraction(root, 1 << SQRT_SCALE_BITS)
    return Fraction(2 * root + 1, 1 << (SQRT_SCALE_BITS + 1))


def _zero_sum(x: float, y: float, mode: str) -> float:
    """IEEE 754 6.3: an exact zero sum is -0 when both terms are -0, or in rd unless both
    are +0; +0 otherwise."""
    both_negative = math.copysign(1, x) < 0 and math.copysign(1, y) < 0 and x == 0 == y
    both_positive = math.copysign(1, x) > 0 and math.copysign(1, y) > 0 and x == 0 == y
    negative = both_negative or (mode == "rd" and not both_positive)
    return -0.0 if negative else 0.0


def _exact(op: str, args: tuple[float, ...], mode: str) -> float | Fraction:
    """The exact result of op on finite inputs (a float for zeros, to carry the sign)."""
    a = args[0]
    if op == "sqrt":
        if a < 0:
            return math.nan
        return a if a == 0 else _sqrt_odd(a)
    b = args[1]
    if op in ("add", "sub", "fma"):
        x, y = (a, -b) if op == "sub" else (a, b) if op == "add" else (a * b, args[2])
        # fl(a * b) only for the sign of a zero product; the sum takes the exact one
        exact = (Fraction(a) * Fraction(b) if op == "fma" else Fraction(x)) + Fraction(y)
        return _zero_sum(x, y, mode) if exact == 0 else exact
    if op == "mul":
        return Fraction(a) * Fraction(b) if a != 0 and b != 0 else a * b
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a) * math.copysign(1, b)
    return Fraction(a) / Fraction(b) if a != 0 else math.copysign(0.0, a) * math.copysign(1, b)


def _exact_values(op: str, inputs: list[torch.Tensor], mode: str) -> list[float | Fraction]:
    columns = [t.to(torch.float64).flatten().tolist() for t in inputs]
    return [_exact(op, args, mode) for args in zip(*columns, strict=True)]


def _reference(values, fmt, mode, sat="none", rbits=None, variant="c", rand=None):
    """The scalar reference's rounding of exact values (rand: a tensor of the integers)."""
    words = rand.flatten().tolist() if rand is not None else [None] * len(values)
    n = reference.check_rbits(rbits)
    return [
        reference.round_checked(value, fmt, mode, n, variant, sat, r)
        for value, r in zip(values, words, strict=True)
    ]


def _expected(op, inputs, fmt, mode, sat="none", rbits=None, variant="c", rand=None):
    return _reference(_exact_values(op, inputs, mode), fmt, mode, sat, rbits, variant, rand)


def _call(op, inputs, fmt, mode, **options):
    return getattr(arith, op)(*inputs, fmt, mode, **options)


def _fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def _wide_tensor(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _as_operands(cases: Iterable[tuple[float, ...]]) -> list[torch.Tensor]:
    """float64 operand tensors from a sequence of cases (one tuple of operands each)."""
    return [torch.tensor(column, dtype=torch.float64) for column in zip(*cases, strict=True)]


def _grid(fmt: sr.Format, count: int, generator: torch.Generator) -> torch.Tensor:
    """Random values of the format (both signs, subnormal to max), as float64."""
    codes = torch.randint(0, 2 ** (fmt.bits - 1), (count,), generator=generator)
    values = torch.tensor([reference.decode_code(int(c), fmt) for c in codes], dtype=torch.float64)
    values = torch.nan_to_num(values, nan=1.0, posinf=fmt.max)
    signs = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
    return values * signs


def _log_uniform(fmt: sr.Format, count: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 magnitudes spanning below the format's smallest value to above its max."""
    low = fmt.emin - fmt.mbits - 3
    high = min(fmt.emax + 3, 126)
    exponents = torch.rand(count, generator=generator, dtype=torch.float64) * (high - low) + low
    signs = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
    return (signs * torch.exp2(exponents)).to(torch.float32)


def _inputs(op: str, fmt_name: str, count: int = 160) -> list[torch.Tensor]:
    """`_operands`, every value finite (operations on infinities: `test_specials_follow_ieee`)."""
    return [torch.nan_to_num(t, posinf=3e38, neginf=-3e38) for t in _operands(op, fmt_name, count)]


def _operands(op: str, fmt_name: str, count: int) -> list[torch.Tensor]:
    """Random and adversarial fp32 operands for op: ties and near-ties of the target,
    exponent gaps of 2**±100, cancellation, overflow and underflow of the target."""
    fmt = sr.format(fmt_name)
    generator = torch.Generator().manual_seed(zlib.crc32(f"{op} {fmt_name}".encode()))
    arity = ARITY[op]
    columns = [_log_uniform(fmt, count, generator) for _ in range(arity)]
    grid = _grid(fmt, count, generator)
    ulp = torch.exp2(
        torch.floor(torch.log2(grid.abs().clamp(min=float(fmt.ulp_at_emin)))) - fmt.mbits
    )
    ulp = torch.maximum(ulp, torch.tensor(float(fmt.ulp_at_emin)))
    half = ulp / 2
    nudges = torch.tensor([0.0, 2.0**-20, -(2.0**-20), 2.0**-23, -(2.0**-23)], dtype=torch.float64)
    nudge = nudges[torch.randint(0, len(nudges), (count,), generator=generator)]
    if op == "sqrt":
        roots = _grid(fmt, count, generator).abs().to(torch.float32).to(torch.float64)
        squares = (roots * roots).clamp(max=3.4e38).to(torch.float32)
        tiny = torch.nextafter(squares, torch.tensor(math.inf, dtype=torch.float32))
        below = torch.nextafter(squares, torch.tensor(0.0, dtype=torch.float32))
        special = _fp32([0.0, -0.0, -1.0, 1e-45, 3.4e38, 2.0, 0.25, 4.0 * 448**2])
        return [torch.cat([columns[0].abs(), squares, tiny, below, special])]
    if op in ("add", "sub", "fma"):
        # a grid value plus half its ulp (a tie), nudged; gaps of 2**100; near-cancellation
        tie = [grid.to(torch.float32), (half * (1 + nudge)).to(torch.float32)]
        gap = [_fp32([1e30, -1e30, 1.0, 448.0, 6.0, 1.0]), _fp32([1e-30, 1e-30, 2.0**-100] * 2)]
        cancel = [columns[0], -columns[0] * (1 + 2.0**-20)]
        big = _fp32([fmt.max, -fmt.max, fmt.max, 3e38, -3e38, min(fmt.max * 2, 3.4e38)])
        over = [big, _fp32([fmt.max / 8, -fmt.max / 16, float(half.max()), 3e38, -3e38, 1.0])]
        parts = [tie, gap, cancel, over]
        if op == "sub":
            parts = [[p[0], -p[1]] for p in parts]
        pieces = [torch.cat([c, *(p[k] for p in parts)]) for k, c in enumerate(columns[:2])]
        if op == "fma":  # x * 1 + z reaches the same cases; plus genuine products
            total = pieces[0].numel() - count
            ones = torch.ones(total, dtype=torch.float32)
            pieces = [
                torch.cat([columns[0], pieces[0][count:]]),
                torch.cat([columns[1], ones]),
                torch.cat([columns[2], pieces[1][count:]]),
            ]
        return pieces
    # mul, div: ties of the target as (grid + half ulp) * 2**k with a power-of-two factor
    tie_value = ((grid.abs() + half) * (1 + nudge)).to(torch.float32)
    power = torch.exp2(torch.randint(-10, 10, (count,), generator=generator).to(torch.float64))
    power = power.to(torch.float32)
    if op == "mul":
        first = torch.cat([columns[0], tie_value / power, _fp32([1e30, 1e-30, 3e38, 0.0, -0.0])])
        second = torch.cat([columns[1], power, _fp32([1e30, 1e-30, -(2.0**-149), -5.0, -5.0])])
    else:
        first = torch.cat([columns[0], tie_value * power, _fp32([1e30, 1e-30, 1.0, 0.0, -0.0])])
        second = torch.cat([columns[1], power, _fp32([1e-30, 1e30, 3.0, -5.0, -5.0])])
    return [first, second]


@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.parametrize("op", OPS)
def test_deterministic_modes_match_reference(op: str, fmt_name: str) -> None:
    fmt = sr.format(fmt_name)
    inputs = _inputs(op, fmt_name)
    for mode in DETERMINISTIC_MODES:
        actual = _call(op, inputs, fmt_name, mode)
        assert actual.dtype == torch.float32
        assert_same_values(actual, _expected(op, inputs, fmt, mode), f"{op} {fmt_name} {mode}")


@pytest.mark.parametrize("sat", ["finite", "propagate"])
@pytest.mark.parametrize("op", OPS)
def test_saturation_matches_reference(op: str, sat: str) -> None:
    fmt = sr.format("e4m3fn")
    inputs = _inputs(op, "e4m3fn", count=40)
    for mode in ("rne", "ru", "rd"):
        actual = _call(op, inputs, "e4m3fn", mode, sat=sat)
        assert_same_values(actual, _expected(op, inputs, fmt, mode, sat), f"{op} {mode} {sat}")


@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.parametrize("op", OPS)
def test_sr_with_explicit_rand_matches_reference(op: str, fmt_name: str) -> None:
    fmt = sr.format(fmt_name)
    inputs = _inputs(op, fmt_name, count=80)
    shape = torch.broadcast_shapes(*(t.shape for t in inputs))
    generator = torch.Generator().manual_seed(7)
    for rbits, variant in SR_CASES:
        n = reference.check_rbits(rbits)
        rand = torch.randint(0, 2**n, shape, generator=generator, dtype=torch.int64)
        actual = _call(op, inputs, fmt_name, "sr", rbits=rbits, variant=variant, rand=rand)
        expected = _expected(op, inputs, fmt, "sr", rbits=rbits, variant=variant, rand=rand)
        assert_same_values(actual, expected, f"{op} {fmt_name} sr rbits={rbits} {variant}")


def test_sr_stream_is_the_stream_of_round() -> None:
    """With a seed, the random words are those `sr.round` draws for the broadcast shape:
    bf16 operands have exact float64 sums, so round(a + b) is the reference."""
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(64, 1, generator=generator).to(torch.bfloat16)
    b = torch.randn(1, 33, generator=generator).to(torch.bfloat16)
    exact = a.to(torch.float64) + b.to(torch.float64)
    for rbits in (3, None):
        actual = arith.add(a, b, "e4m3fn", "sr", rbits=rbits, seed=11, offset=5)
        expected = sr.round(exact, "e4m3fn", "sr", rbits=rbits, seed=11, offset=5)
        assert actual.dtype == torch.bfloat16
        assert torch.equal(actual.to(torch.float64), expected)


def test_specials_follow_ieee() -> None:
    inf, nan = math.inf, math.nan
    x = _fp32([inf, inf, -inf, nan, 1.0, 0.0, -0.0, -0.0])
    y = _fp32([1.0, -inf, -inf, 1.0, inf, -0.0, -0.0, 0.0])
    added = arith.add(x, y, "bf16").tolist()
    assert added[0] == inf and math.isnan(added[1]) and added[2] == -inf and math.isnan(added[3])
    assert added[4] == inf
    assert [math.copysign(1, v) for v in added[5:]] == [1, -1, 1]
    in_rd = arith.add(x[5:], y[5:], "bf16", "rd").tolist()
    assert [math.copysign(1, v) for v in in_rd] == [-1, -1, -1]
    divided = arith.div(
        _fp32([1.0, -1.0, 0.0, inf, 1.0]), _fp32([0.0, 0.0, 0.0, inf, -inf]), "bf16"
    )
    assert divided[0] == inf and divided[1] == -inf and bool(divided[2:4].isnan().all())
    assert math.copysign(1, float(divided[4])) == -1
    roots = arith.sqrt(_fp32([-0.0, -1.0, inf]), "e4m3fn").tolist()
    assert math.copysign(1, roots[0]) == -1 and math.isnan(roots[1]) and math.isnan(roots[2])
    assert arith.mul(_fp32([inf]), _fp32([0.0]), "bf16").isnan().all()
    # e4m3fn has no infinity: an infinite exact result is NaN (sat='none') or max (finite)
    assert arith.add(_fp32([inf]), _fp32([1.0]), "e4m3fn", sat="finite").item() == 448.0


def test_float64_add_and_sub_are_exact() -> None:
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(200, generator=generator, dtype=torch.float64) * 2.0 ** torch.randint(
        -60, 60, (200,), generator=generator
    )
    b = torch.randn(200, generator=generator, dtype=torch.float64)
    a = torch.cat([a, torch.tensor([1e308, -1e308, 1.0, 2.0**-1074], dtype=torch.float64)])
    b = torch.cat([b, torch.tensor([1e308, -1e308, 2.0**-80, 2.0**-1074], dtype=torch.float64)])
    fmt = sr.format("bf16")
    for op in ("add", "sub"):
        for mode in ("rne", "rz", "ru", "ro"):
            actual = _call(op, [a, b], "bf16", mode)
            assert actual.dtype == torch.float64
            assert_same_values(actual, _expected(op, [a, b], fmt, mode), f"fp64 {op} {mode}")
    saturated = arith.add(a[-4:-2], b[-4:-2], "bf16", sat="propagate")
    assert saturated.tolist() == [fmt.max, fmt.lowest]


def test_mixed_dtypes_promote_and_broadcast() -> None:
    a = torch.tensor([[1.5], [2.5]], dtype=torch.bfloat16)
    b = torch.tensor([0.25, 3.0, -1.0], dtype=torch.float16)
    result = arith.mul(a, b, "e4m3fn")
    assert result.dtype == torch.float32 and result.shape == (2, 3)
    assert result.tolist() == [[0.375, 4.5, -1.5], [0.625, 7.5, -2.5]]


def test_unsupported_cases_raise_not_implemented() -> None:
    wide = _wide_tensor
    with pytest.raises(NotImplementedError, match="float64"):  # dot forms fl(a b)
        arith.dot(wide(1.0), wide(1.0), "bf16")
    # binary64 takes float64 results that are doubles only (exact, in its range)
    with pytest.raises(NotImplementedError, match="52"):
        arith.mul(wide(1 / 3), wide(3.0), "binary64")
    with pytest.raises(NotImplementedError, match=r"below 2\*\*-1021.*binary64"):
        arith.mul(wide(2.0**-600), wide(2.0**-600), "binary64", "rz")
    with pytest.raises(NotImplementedError, match=r"beyond the doubles.*binary64"):
        arith.fma(wide(2.0**600), wide(2.0**600), wide(1.0), "binary64", "rz")
    one, small = _fp32([1.0]), _fp32([2.0**-60])
    with pytest.raises(NotImplementedError, match="rbits"):
        arith.add(one, small, "fp32", "sr", rand=torch.tensor([0]))
    # exact pairs round fine even there; and enough guard bits with fewer random bits
    assert arith.add(one, one, "fp32", "sr", rand=torch.tensor([0])).item() == 2.0
    word = 2**27 - 1
    expected = reference.round_value(1 + Fraction(2.0**-60), "fp32", "sr", rbits=27, rand=word)
    actual = arith.add(one, small, "fp32", "sr", rbits=27, rand=torch.tensor([word]))
    assert actual.item() == expected


def test_bad_inputs_name_the_argument() -> None:
    x = torch.ones(3)
    with pytest.raises(ValueError, match="broadcast"):
        arith.add(x, torch.ones(4), "bf16")
    with pytest.raises(TypeError, match="y must"):
        arith.mul(x, torch.ones(3, dtype=torch.int32), "bf16")
    with pytest.raises(TypeError, match="z must"):
        arith.fma(x, x, [1.0, 2.0, 3.0], "bf16")
    with pytest.raises(TypeError, match="x must"):
        arith.sqrt(torch.ones(3, dtype=torch.int64), "bf16")
    with pytest.raises(ValueError, match="mode"):
        arith.div(x, x, "bf16", "nearest")
    with pytest.raises(ValueError, match="sat"):
        arith.sub(x, x, "bf16", sat="clamp")
    with pytest.raises(ValueError, match="rbits"):
        arith.add(x, x, "bf16", "sr", rbits=0)
    with pytest.raises((ValueError, KeyError), match="fp7"):
        arith.add(x, x, "fp7")


def _near_breakpoints(op: str, count: int = 2**20) -> list[torch.Tensor]:
    """fp32 operands whose float64 result hi has 12 trailing zero bits (a point of bf16's
    exact-SR decision grid, 8 + 33 bits) while the exact result differs from hi: only the
    remainder's sign rounds these right."""
    generator = torch.Generator().manual_seed(17)
    a = torch.rand(count, generator=generator, dtype=torch.float64).add(0.5).to(torch.float32)
    b = torch.rand(count, generator=generator, dtype=torch.float64).add(0.5).to(torch.float32)
    hi = torch.sqrt(a.double()) if op == "sqrt" else a.double() / b.double()
    on_grid = (hi.view(torch.int64) & 0xFFF) == 0
    if op == "sqrt":
        inexact = on_grid & (hi * hi != a.double())  # hi * hi: 106 bits; a test, not exact
        return [a[inexact]]
    return [a[on_grid], b[on_grid]]


@pytest.mark.parametrize("op", ["div", "sqrt"])
def test_remainder_decides_exact_sr_at_breakpoints(op: str) -> None:
    """The random words sit at the decision's edge: r = 2**32 - floor(nu(hi) 2**32) + delta,
    so one unit of the count (set by the remainder's sign) flips the result."""
    inputs = _near_breakpoints(op)
    assert inputs[0].numel() >= 50
    fmt = sr.format("bf16")
    hi = inputs[0].double().sqrt() if op == "sqrt" else inputs[0].double() / inputs[1].double()
    counts = [math.floor(reference.discarded_fraction(h, fmt) * 2**32) for h in hi.tolist()]
    for variant in ("a", "b", "c", "odd"):
        for delta in (-1, 0, 1):
            words = torch.tensor([min(max(2**32 - c + delta, 0), 2**32 - 1) for c in counts])
            actual = _call(op, inputs, "bf16", "sr", variant=variant, rand=words)
            expected = _expected(op, inputs, fmt, "sr", variant=variant, rand=words)
            assert_same_values(actual, expected, f"{op} exact SR {variant} {delta} at breakpoints")


# --------------------------------------------------------------------------------------
# float64 inputs: mul, div, fma and sqrt on significands, results beyond the doubles
# --------------------------------------------------------------------------------------

WIDE_FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2", "p3109_k8p3se", "fp32")
WIDE_OPS = ("mul", "div", "fma", "sqrt")
WIDE_SATURATING = ("rne", "ru", "rd")


def _double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _any_double(rng: random.Random) -> float:
    """A random finite double anywhere: exponent field, fraction (with random trailing zeros
    at times) and sign drawn as bits; one in ten subnormal."""
    field = 0 if rng.random() < 0.1 else rng.randrange(1, 2047)
    zeros = rng.choice((0, 0, rng.randrange(53)))
    fraction = max((rng.getrandbits(52) >> zeros) << zeros, int(field == 0))
    return _double(rng.getrandbits(1) << 63 | field << 52 | fraction)


def _near_power(rng: random.Random, exponent: int) -> float:
    """A random 53-bit double in [2**exponent, 2**(exponent + 1)) (normal exponents)."""
    return math.ldexp(rng.getrandbits(52) | 1 << 52, exponent - 52)


def _delicate(rng: random.Random, fmt: sr.Format) -> float:
    """A positive value where rounding to ``fmt`` is delicate: a value of the grid, a tie
    (grid + half ulp, the overflow tie max + half ulp among them), the smallest subnormal or
    its half, or a random value from 2**-36 of the smallest subnormal to 8 times the max."""
    low, high = fmt.emin - fmt.mbits - 36, fmt.emax + 3
    code = rng.randrange(2 ** (fmt.bits - 1))
    grid = Fraction(reference.decode_code(code, fmt)) if code <= fmt.max_magnitude_code else 0
    e = max(floor_log2(grid) if grid else fmt.emin, fmt.emin)
    choices = (
        _near_power(rng, rng.randrange(low, high)),
        float(grid) or fmt.min_subnormal,
        float(grid + Fraction(2) ** (e - fmt.mbits - 1)),
        fmt.max + float(Fraction(2) ** (fmt.emax - fmt.mbits - 1)),
        fmt.min_subnormal / 2,
    )
    return rng.choice(choices)


def _odd_part(value: float) -> tuple[int, int]:
    """value = odd * 2**shift for a positive double."""
    num, den = value.as_integer_ratio()
    shift = -(den.bit_length() - 1)
    while num % 2 == 0:
        num, shift = num // 2, shift + 1
    return num, shift


def _split_exactly(rng: random.Random, target: float) -> tuple[float, float]:
    """(a, b) with a * b = target > 0 exactly, far apart in size: a small odd divisor of
    target's odd part goes to a, with a random power of two."""
    odd, shift = _odd_part(target)
    divisor = rng.choice([d for d in (1, 3, 5, 7, 9, 15, 21, 27) if odd % d == 0])
    low, high = max(-1070, shift + odd.bit_length() - 1020), min(1010, shift + 1070)
    power = rng.randrange(low, high)
    return math.ldexp(divisor, power), math.ldexp(odd // divisor, shift - power)


def _divide_exactly(rng: random.Random, target: float) -> tuple[float, float]:
    """(x, y) with x / y = target > 0 exactly: y = m 2**j with m = 1 or a small odd factor
    that keeps target m within 53 bits."""
    odd, shift = _odd_part(target)
    m = rng.choice([m for m in (1, 3, 5, 7, 11, 13) if (odd * m).bit_length() <= 53])
    low, high = max(-1070, -1070 - shift), min(1010, 1010 - (odd * m).bit_length() - shift)
    j = rng.randrange(low, high)
    return math.ldexp(odd * m, shift + j), math.ldexp(m, j)


def _nudged(rng: random.Random, value: float) -> float:
    """value, or one of its float64 neighbours."""
    return rng.choice((value, math.nextafter(value, math.inf), math.nextafter(value, -math.inf)))


def _signed(rng: random.Random, values: tuple[float, ...]) -> tuple[float, ...]:
    """values with random signs (the product's and the quotient's sign with them)."""
    return tuple(rng.choice((-1.0, 1.0)) * v for v in values)


def _wide_case(op: str, rng: random.Random, fmt: sr.Format) -> tuple[float, ...]:
    """Operands of one float64 case: the exact result a delicate value of the target (exact,
    or within an ulp of float64), sparse operands near the target's scale, or a result
    anywhere, beyond the doubles included."""
    kind = rng.randrange(5)
    target = _delicate(rng, fmt)
    if kind == 3:
        return _any_case(op, rng)
    if kind == 4:
        return _sparse_case(op, rng, math.frexp(target)[1])
    if op == "sqrt":
        square = float(Fraction(target) ** 2)
        return (_nudged(rng, square) if kind else square,)
    if op == "fma":
        return _fma_case(rng, rng.choice((-1, 1)) * target, kind)
    if op == "mul":
        a, b = _split_exactly(rng, target)
        b = _nudged(rng, float(Fraction(target) / Fraction(a))) if kind else b
    else:
        a, b = _divide_exactly(rng, target)
        a = _nudged(rng, float(Fraction(target) * Fraction(b))) if kind else a
    return _signed(rng, (a, b))


def _any_case(op: str, rng: random.Random) -> tuple[float, ...]:
    if op == "sqrt":
        return (abs(_any_double(rng)),)
    operands = [_any_double(rng) for _ in range(3 if op == "fma" else 2)]
    if op == "fma" and rng.random() < 0.3:
        operands[2] = rng.choice((0.0, -0.0))
    return tuple(operands)


def _fma_case(rng: random.Random, target: float, kind: int) -> tuple[float, ...]:
    """fma operands: a 12-bit product within 2**±70 of target plus c = fl(target - a b), so
    that the result is target exactly or nearly (kind 0); c far above or below a product,
    across the window edges of the implementation (kind 1); c cancelling an exact or an
    inexact product exactly or nearly (kind 2)."""
    if kind == 0:
        odd = rng.getrandbits(12) | 1
        product = math.ldexp(odd, math.frexp(target)[1] + rng.randrange(-80, 60))
        a, b = _signed(rng, _split_exactly(rng, product))
        return a, b, float(Fraction(target) - Fraction(a) * Fraction(b))
    a, b = _signed(rng, _split_exactly(rng, _near_power(rng, rng.randrange(-900, 900))))
    if rng.random() < 0.5:  # a product of more than 53 bits
        b = _nudged(rng, b * 3)
    if kind == 2:
        return a, b, -_nudged(rng, a * b)
    c = rng.choice((-1, 1)) * _near_power(rng, math.frexp(a * b)[1] + _fma_gap(rng))
    return a, b, c


def _fma_gap(rng: random.Random) -> int:
    """c's exponent relative to the product's: anywhere in [-140, 80), or at the edges of
    the window [-120, 60] of the implementation."""
    return rng.choice((rng.randrange(-140, 80), rng.randrange(-123, -117), rng.randrange(57, 63)))


def _sparse(rng: random.Random, exponent: int) -> float:
    """±(1 ± 2**-i) 2**exponent, i in 1..60: a product of two has a few bits on the grids of
    the targets and, where i + j > 53, an error term far below them."""
    offset = rng.choice((-1, 1)) * 2.0 ** -rng.randrange(1, 61)
    return rng.choice((-1, 1)) * math.ldexp(1 + offset, exponent)


def _sparse_case(op: str, rng: random.Random, exponent: int) -> tuple[float, ...]:
    """Sparse operands whose result is near 2**exponent (fma: plus a sparse c at a gap)."""
    if op == "sqrt":
        return (abs(_sparse(rng, 2 * exponent)),)
    first = rng.randrange(max(-1000, exponent - 1000), min(1000, exponent + 1000))
    a = _sparse(rng, first)
    b = _sparse(rng, exponent - first if op != "div" else first - exponent)
    return (a, b, _sparse(rng, exponent + _fma_gap(rng))) if op == "fma" else (a, b)


def _wide_operands(op: str, fmt_name: str, count: int) -> list[torch.Tensor]:
    fmt = sr.format(fmt_name)
    rng = random.Random(f"{op} {fmt_name}")
    return _as_operands(_wide_case(op, rng, fmt) for _ in range(count))


def _edge_words(values: list, fmt: sr.Format, n: int, variant: str) -> torch.Tensor:
    """Random integers at the edge of each SR decision: r = 2**n - count rounds away and
    r - 1 does not (count = P(away) 2**n, the variant's integer from nu 2**n of the exact
    value); alternate elements take each."""
    words = []
    for i, value in enumerate(values):
        nu = reference.discarded_fraction(value, fmt) if isinstance(value, Fraction) else 0
        count = reference.away_probability(Fraction(nu), n, variant) * 2**n
        words.append(min(max(2**n - int(count) - i % 2, 0), 2**n - 1))
    return torch.tensor(words, dtype=torch.int64)


def _wide_sr_cases(fmt: sr.Format) -> list[tuple[int | None, str]]:
    """Few-bit SR, and every variant with the most random bits round_pair supports for
    fmt (exact SR where mbits + 34 <= 52)."""
    most = None if fmt.mbits + 34 <= 52 else 50 - fmt.mbits
    return [(1, "a"), (3, "b"), (4, "c"), (5, "odd")] + [(most, v) for v in reference.VARIANTS]


@pytest.mark.parametrize("fmt_name", WIDE_FORMATS)
@pytest.mark.parametrize("op", WIDE_OPS)
def test_float64_inputs_match_reference(op: str, fmt_name: str) -> None:
    """Every mode, saturation and SR variant, bit-exact against the reference on float64
    operands whose exact results are ties, grid values, thresholds of the target (exactly
    or within a float64 ulp), or anywhere, beyond the doubles included."""
    fmt = sr.format(fmt_name)
    inputs = _wide_operands(op, fmt_name, 300)
    exact = {mode: _exact_values(op, inputs, mode) for mode in ("rne", "rd")}
    for mode in DETERMINISTIC_MODES:
        actual = _call(op, inputs, fmt_name, mode)
        assert actual.dtype == torch.float64
        expected = _reference(exact["rd" if mode == "rd" else "rne"], fmt, mode)
        assert_same_values(actual, expected, f"fp64 {op} {fmt_name} {mode}")
    for sat in ("finite", "propagate"):
        for mode in WIDE_SATURATING:
            actual = _call(op, inputs, fmt_name, mode, sat=sat)
            expected = _reference(exact["rd" if mode == "rd" else "rne"], fmt, mode, sat)
            assert_same_values(actual, expected, f"fp64 {op} {fmt_name} {mode} {sat}")
    generator = torch.Generator().manual_seed(zlib.crc32(f"{op} {fmt_name}".encode()))
    for rbits, variant in _wide_sr_cases(fmt):
        n = reference.check_rbits(rbits)
        uniform = torch.randint(0, 2**n, inputs[0].shape, generator=generator)
        for rand in (uniform, _edge_words(exact["rne"], fmt, n, variant)):
            options = dict(rbits=rbits, variant=variant, rand=rand)
            actual = _call(op, inputs, fmt_name, "sr", **options)
            expected = _reference(exact["rne"], fmt, "sr", **options)
            assert_same_values(actual, expected, f"fp64 {op} {fmt_name} sr {rbits} {variant}")


# Formats at the limits of the stand-ins for results beyond the doubles: ulp 2**-988 at emin
# (the least with which every |v| < 2**-1021 rounds as 2**-1022: nu < 2**-33) and emax 1022
# (the most with which every |v| >= 2**1023 overflows); one step beyond each raises.
TINY_LIMIT = sr.Format(ebits=10, mbits=3, bias=986)
HUGE_LIMIT = sr.Format(ebits=10, mbits=3, bias=0)
LIMIT_CASES = ((TINY_LIMIT, range(-1030, -1015)), (HUGE_LIMIT, range(1019, 1032)))


def _limit_case(op: str, rng: random.Random, exponents: range) -> tuple[float, ...]:
    """Operands whose exact result is near ±s 2**k, k in exponents: s = 1, 1 -+ 2**-53 or
    random, exactly (powers of two) or within a float64 ulp of the operands."""
    significand = rng.choice((1, 1 - Fraction(1, 2**53), 1 + Fraction(1, 2**52), rng.random() + 1))
    exponent = rng.choice(exponents)
    result = rng.choice((-1, 1)) * Fraction(significand) * Fraction(2) ** exponent
    shift = rng.randrange(400, 600) * (1 if abs(result) > 1 else -1)
    if op == "div":  # result * divisor is half way to 1
        divisor = rng.choice((2.0**-shift, _near_power(rng, -shift)))
        return _nudged(rng, float(result * Fraction(divisor))), divisor
    first = rng.choice((2.0**shift, _near_power(rng, shift)))
    second = _nudged(rng, float(result / Fraction(first)))
    if op == "mul":
        return first, second
    nearby = math.ldexp(rng.choice((-1, 1)) * (rng.random() + 1), min(exponent, 1000) - 8)
    addend = rng.choice((0.0, -first * second, nearby))
    return first, second, addend if math.isfinite(addend) else 0.0


def _limit_inputs(op: str, rng: random.Random, exponents: range, count: int) -> list[torch.Tensor]:
    return _as_operands(_limit_case(op, rng, exponents) for _ in range(count))


@pytest.mark.parametrize("op", ["mul", "div", "fma"])
def test_float64_results_beyond_the_doubles_at_the_format_limits(op: str) -> None:
    """Results around 2**-1021 (stand-in 2**-1022 below) and 2**1024 (stand-in 2**1023 above)
    rounded to formats at the stand-ins' limits; exact SR at the decision's edge tells a
    fraction of 2**-33 from 0, and a format one step beyond a limit raises."""
    rng = random.Random(op)
    for fmt, exponents in LIMIT_CASES:
        inputs = _limit_inputs(op, rng, exponents, 150)
        exact = {mode: _exact_values(op, inputs, mode) for mode in ("rne", "rd")}
        for mode in DETERMINISTIC_MODES:
            expected = _reference(exact["rd" if mode == "rd" else "rne"], fmt, mode)
            assert_same_values(_call(op, inputs, fmt, mode), expected, f"{op} {fmt} {mode}")
        for variant in reference.VARIANTS:
            rand = _edge_words(exact["rne"], fmt, 32, variant)
            actual = _call(op, inputs, fmt, "sr", variant=variant, rand=rand)
            expected = _reference(exact["rne"], fmt, "sr", variant=variant, rand=rand)
            assert_same_values(actual, expected, f"{op} {fmt} exact sr {variant}")
        beyond = sr.Format(ebits=10, mbits=3, bias=fmt.bias + (1 if fmt is TINY_LIMIT else -1))
        with pytest.raises(NotImplementedError, match=beyond.name):
            _call(op, _limit_inputs(op, rng, exponents, 20), beyond, "rne")


def _exact_double_case(op: str, rng: random.Random) -> tuple[float, ...]:
    """Operands whose exact result is a double of at most 20 bits anywhere, subnormal ones
    (and the extremes 2**-1074, 2**1023) included."""
    odd = rng.getrandbits(20) | 1
    result = math.ldexp(odd, rng.randrange(-1074, 1000))
    if op == "sqrt":
        root = math.ldexp(odd >> 10 | 1, rng.randrange(-537, 500))
        return (root * root,)
    if op == "div":
        return _divide_exactly(rng, result)
    if op == "mul":
        return _split_exactly(rng, rng.choice((result, 2.0**-1074, 2.0**1023)))
    shift = rng.randrange(-1074, 980)  # the terms' last bits 2**±12 apart: at most 53 bits
    product = math.ldexp(odd, shift)
    addend = math.ldexp(rng.getrandbits(20) | 1, max(shift + rng.randrange(-12, 12), -1074))
    return *_signed(rng, _split_exactly(rng, product)), rng.choice((-1.0, 1.0)) * addend


@pytest.mark.parametrize("op", WIDE_OPS)
def test_float64_exact_results_round_in_binary64(op: str) -> None:
    """binary64 takes results that are doubles (exact pairs need no guard bits), subnormal
    ones included, in every mode."""
    rng = random.Random(f"binary64 {op}")
    inputs = _as_operands(_exact_double_case(op, rng) for _ in range(100))
    fmt = sr.format("binary64")
    for mode in (*DETERMINISTIC_MODES, "sr"):
        rand = torch.randint(0, 256, inputs[0].shape) if mode == "sr" else None
        options = dict(rbits=8, rand=rand) if mode == "sr" else {}
        expected = _expected(op, inputs, fmt, mode, **options)
        assert_same_values(_call(op, inputs, fmt, mode, **options), expected, f"{op} {mode}")


def test_float64_specials_follow_ieee() -> None:
    inf, nan, big, tiny, least = math.inf, math.nan, 1e300, 1e-300, 5e-324
    wide = _wide_tensor
    a = wide(big, big, inf, 0.0, -0.0, big, tiny, 2.0, -2.0, nan, inf)
    b = wide(big, -big, 0.0, -1.0, 5.0, big, -tiny, 3.0, 3.0, 1.0, 1.0)
    c = wide(-inf, inf, 1.0, -0.0, 0.0, -big, 0.0, -6.0, 6.0, 1.0, -inf)
    bf16 = sr.format("bf16")
    fused = [-inf, inf, nan, -0.0, 0.0, inf, -0.0, 0.0, 0.0, nan, nan]
    assert_same_values(arith.fma(a, b, c, bf16), fused, "fma rne")
    fused = [-inf, inf, nan, -0.0, -0.0, bf16.max, -bf16.min_subnormal, -0.0, -0.0, nan, nan]
    assert_same_values(arith.fma(a, b, c, bf16, "rd"), fused, "fma rd")
    a, b = wide(big, tiny, inf, inf, -0.0, least), wide(big, -tiny, 0.0, -2.0, 3.0, 0.5)
    assert_same_values(arith.mul(a, b, bf16), [inf, -0.0, nan, -inf, -0.0, 0.0], "mul rne")
    up = [inf, -0.0, nan, -inf, -0.0, bf16.min_subnormal]
    assert_same_values(arith.mul(a, b, bf16, "ru"), up, "mul ru")
    a = wide(1.0, -1.0, 0.0, inf, 1.0, big, tiny)
    b = wide(0.0, 0.0, 0.0, inf, -inf, tiny, big)
    assert_same_values(arith.div(a, b, bf16), [inf, -inf, nan, nan, -0.0, inf, 0.0], "div")
    roots = arith.sqrt(wide(-0.0, -1.0, inf, nan, least, 1.7e308), bf16)
    assert_same_values(roots, [-0.0, nan, inf, nan, 0.0, inf], "sqrt")


def test_float64_fma_with_c_between_the_product_and_its_error() -> None:
    """(1 + 2**-i)(1 + 2**-j) has a few bits on the grid of exact SR to bf16 (2**-40) or of
    27-bit SR to fp32 (2**-51) and an error term 2**-(i+j) far below; c = ±2**-m from above
    that error to below it, across the window edges, decides the sign of the rest."""
    pairs = ((20, 40), (27, 40), (40, 40), (50, 50), (50, 51), (51, 51))
    inputs = _as_operands(
        (1 + 2.0**-i, (1 + 2.0**-j) * sign, 2.0**-m * side)
        for i, j in pairs
        for m in range(40, 135)
        for sign in (-1, 1)
        for side in (-1, 1)
    )
    exact = _exact_values("fma", inputs, "rne")
    for fmt, rbits in ((sr.format("bf16"), None), (sr.format("fp32"), 27)):
        for mode in ("rne", "rz", "ru"):
            expected = _reference(exact, fmt, mode)
            assert_same_values(_call("fma", inputs, fmt, mode), expected, f"{fmt.name} {mode}")
        for variant in reference.VARIANTS:
            rand = _edge_words(exact, fmt, reference.check_rbits(rbits), variant)
            options = dict(rbits=rbits, variant=variant, rand=rand)
            expected = _reference(exact, fmt, "sr", **options)
            actual = _call("fma", inputs, fmt, "sr", **options)
            assert_same_values(actual, expected, f"{fmt.name} sr {variant}")


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(WIDE_OPS),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3),
    st.sampled_from(WIDE_FORMATS),
    st.sampled_from((*DETERMINISTIC_MODES, "sr")),
    st.sampled_from(reference.VARIANTS),
    st.integers(0, 2**32 - 1),
)
def test_float64_operations_on_any_doubles(
    op: str, operands: list[float], fmt_name: str, mode: str, variant: str, word: int
) -> None:
    """Hypothesis's doubles (zeros, subnormals, powers of two, the extremes) in every mode;
    SR with the most random bits round_pair supports for the format."""
    fmt = sr.format(fmt_name)
    inputs = [torch.tensor([x], dtype=torch.float64) for x in operands[: ARITY[op]]]
    rbits = None if fmt.mbits + 34 <= 52 else 50 - fmt.mbits
    n = reference.check_rbits(rbits)
    options = dict(rbits=rbits, variant=variant, rand=torch.tensor([word >> (32 - n)]))
    options = options if mode == "sr" else {}
    expected = _expected(op, inputs, fmt, mode, **options)
    assert_same_values(_call(op, inputs, fmt, mode, **options), expected, f"{op} {operands}")
