"""`stochround.kernels.block_math.fast_round`'s SR variant c (32-bit integer arithmetic)
against the exact definition, floor((rne(|x| 2**(n - q)) + r) / 2**n) computed with
Python's integers, on the grids where its decisions change: the n-bit grid's points and
ties, their fp32 neighbours, the element's subnormals, fp32's subnormals and the saturation,
each with the random words at and beside the threshold of its rounding up."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from stochround.formats import format as find_format
from stochround.kernels.availability import INTERPRETED

pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

if INTERPRETED or torch.cuda.is_available():
    import triton
    import triton.language as tl

    from stochround.kernels.block_math import element_format, element_rounding, fast_round

    @triton.jit
    def _fast_round_kernel(
        bits_ptr, r_ptr, code_ptr, value_ptr, count, ROUNDING: tl.constexpr,
        ELEMENT: tl.constexpr, SIZE: tl.constexpr,
    ):  # fmt: skip
        offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
        mask = offsets < count
        bits = tl.load(bits_ptr + offsets, mask=mask, other=0)
        r = tl.load(r_ptr + offsets, mask=mask, other=0)
        code, value = fast_round(bits, r, ROUNDING, ELEMENT)
        tl.store(code_ptr + offsets, code, mask=mask)
        tl.store(value_ptr + offsets, value, mask=mask)


def exact_total(x: float, mbits: int, emin: int, largest: float, n: int, r: int) -> tuple[int, int]:
    """(kept + away, q) of SR variant c for |x|, clamped to the element's max."""
    magnitude = Fraction(min(abs(x), largest))
    q = max(math.floor(math.log2(magnitude)) if magnitude else emin, emin) - mbits
    v = magnitude * Fraction(2) ** (n - q)
    floor = v.numerator // v.denominator
    rest = v - floor
    count = floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)
    return (count + r) >> n, q


def grid_values(mbits: int, emin: int, largest: float, n: int) -> list[float]:
    """fp32 magnitudes: the n-bit grid's points and ties around a few kept values of each
    binade from the element's subnormals up (and their fp32 neighbours), fp32 subnormals,
    0, the max and beyond."""
    points: set[float] = {0.0, 2.0**-149, 3 * 2.0**-149, 2.0**-127, 1e-30, largest, 2 * largest}
    top = math.floor(math.log2(largest))
    for exponent in range(emin - 3, top + 1):
        q = max(exponent, emin) - mbits
        kept_values = {2**mbits, 2**mbits + 1, 2 ** (mbits + 1) - 1} if exponent >= emin else {0, 1}
        for kept in kept_values:
            for j in {0, 1, 2 ** (n - 1), 2**n - 1}:
                for twice in (2 * j, 2 * j + 1):  # the point and the tie above it
                    points.add(float(Fraction(kept * 2 ** (n + 1) + twice, 2 ** (n + 1)) * 2.0**q))
    values = torch.tensor(sorted(points), dtype=torch.float64).to(torch.float32)
    values = values[values.isfinite()]
    neighbours = [
        torch.nextafter(values, torch.tensor(s, dtype=torch.float32)) for s in (0.0, math.inf)
    ]
    everything = torch.cat([values, *neighbours]).unique()
    return everything[everything.isfinite() & (everything >= 0)].tolist()


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e2m1", "e2m3", "e3m2"])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13, 16, 20, 21, 23, 24, 25, 31, 32])
def test_sr_variant_c_is_the_exact_definition_at_every_threshold(name: str, n: int) -> None:
    fmt = find_format(name)
    xs: list[float] = []
    rs: list[int] = []
    for x in grid_values(fmt.mbits, fmt.emin, fmt.max, n):
        # the words at and beside the threshold 2**n - rem of rounding up, and the ends
        _, q = exact_total(x, fmt.mbits, fmt.emin, fmt.max, n, 0)
        v = Fraction(min(x, fmt.max)) * Fraction(2) ** (n - q)
        rem_floor = (v.numerator // v.denominator) % 2**n
        for r in {0, 2**n - 1, 2**n - rem_floor, 2**n - rem_floor - 1, 2**n - rem_floor + 1}:
            if 0 <= r < 2**n:
                for sign in (1.0, -1.0):
                    xs.append(sign * x)
                    rs.append(r)
    x = torch.tensor(xs, dtype=torch.float32)
    r = torch.tensor(rs, dtype=torch.int64)
    codes = torch.empty(x.numel(), dtype=torch.int32, device=DEVICE)
    values = torch.empty(x.numel(), dtype=torch.float32, device=DEVICE)
    element = element_format(fmt, "sr")
    rounding = element_rounding(fmt, "sr", n, "c")
    assert n == rounding.FAST_BITS
    size = 1024
    _fast_round_kernel[(triton.cdiv(x.numel(), size),)](
        x.view(torch.int32).to(DEVICE), r.to(DEVICE), codes, values, x.numel(),
        ROUNDING=rounding, ELEMENT=element, SIZE=size,
    )  # fmt: skip
    expected = []
    for xi, ri in zip(xs, rs, strict=True):
        total, q = exact_total(xi, fmt.mbits, fmt.emin, fmt.max, n, ri)
        expected.append(math.copysign(float(total * Fraction(2) ** q), xi))
    want = torch.tensor(expected, dtype=torch.float32)
    got = values.cpu()
    wrong = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten()[:5].tolist()
    assert not wrong, [(xs[i], rs[i], got[i].item(), want[i].item()) for i in wrong]
    # the code of each value: the element's code of the magnitude, its sign bit
    table = {float(fmt.magnitude_value(c)): c for c in range(fmt.max_magnitude_code + 1)}
    sign_code = 1 << (fmt.ebits + fmt.mbits)
    codes_expected = [
        table[abs(v)] | (sign_code if math.copysign(1.0, v) < 0 else 0) for v in expected
    ]
    assert codes.cpu().tolist() == codes_expected
