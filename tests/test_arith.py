"""SR arithmetic (`arith.py`) against the scalar reference applied to exact results."""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import pytest
import torch
from conftest import assert_same_values

import stochround as sr
from stochround import arith, reference

FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1")
DETERMINISTIC_MODES = ("rne", "rna", "rz", "ru", "rd", "ro")
# (rbits, variant): every variant with a few bits, and exact SR (32-bit words)
SR_CASES = ((1, "a"), (4, "b"), (4, "c"), (4, "odd"), (8, "c"), (None, "c"), (None, "a"))
OPS = ("add", "sub", "mul", "div", "fma", "sqrt")
ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "fma": 3, "sqrt": 1}
SQRT_SCALE_BITS = 256  # sqrt computed to 2**-256: far below every ulp and SR bit used here


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
        exact = Fraction(x) + Fraction(y)  # a * b: exact in float64 for fp32 inputs
        return _zero_sum(x, y, mode) if exact == 0 else exact
    if op == "mul":
        return Fraction(a) * Fraction(b) if a * b != 0 else a * b
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a) * math.copysign(1, b)
    return Fraction(a) / Fraction(b) if a != 0 else math.copysign(0.0, a) * math.copysign(1, b)


def _expected(op, inputs, fmt, mode, sat="none", rbits=None, variant="c", rand=None):
    columns = [t.to(torch.float64).flatten().tolist() for t in inputs]
    words = rand.flatten().tolist() if rand is not None else None
    n = reference.check_rbits(rbits)
    out = []
    for i, args in enumerate(zip(*columns, strict=True)):
        value = _exact(op, args, mode)
        r = words[i] if words is not None else None
        out.append(reference.round_checked(value, fmt, mode, n, variant, sat, r))
    return out


def _call(op, inputs, fmt, mode, **options):
    return getattr(arith, op)(*inputs, fmt, mode, **options)


def _fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


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
    wide = torch.tensor([1.0], dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="float64"):
        arith.mul(wide, wide, "bf16")
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
