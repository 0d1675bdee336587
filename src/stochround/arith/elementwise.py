"""Elementwise SR arithmetic: the exact result of an operation, rounded once to a format.

Each operation computes its exact result v as an unevaluated float64 pair ``hi + lo``
with error-free transformations, then `round_pair` rounds the pair once on the public
PyTorch path: the rounding contract of `stochround.round` (every mode, limited-bit SR
included) applied to v itself.  ``hi`` is a faithful rounding of v to 53 bits and ``lo``
has the sign of v - hi (zero only when v = hi); that is all `round_pair` reads.  Inputs of
every floating dtype, float64 included:

- ``add``, ``sub``: TwoSum (Knuth): ``hi = fl(a + b)``, ``lo = (a + b) - hi`` exactly, for all
  finite doubles; a sum beyond the doubles is replaced by ``±DBL_MAX`` with a nonzero ``lo``,
  which every mode rounds as the finite overflow it is (formats whose max is below 2**1023).
- ``mul``, ``div``, ``sqrt``, ``fma`` work on significands: frexp writes a = m_a 2**e_a with
  |m_a| in [0.5, 1) (subnormal a too), so Dekker's TwoProduct (Veltkamp's split, no fma)
  runs on numbers below 2 whose partial products neither overflow nor underflow.  Each
  gives v = (h + l') 2**E: h a double, faithful for v 2**-E, and a double l of the sign of
  l' (zero only where l' is):

  - ``mul``: E = e_a + e_b; TwoProduct(m_a, m_b) = h + l exactly.
  - ``div``: E = e_a - e_b, h = fl(m_a / m_b); TwoProduct(h, m_b) = P + e; m_a - P is exact
    (Sterbenz), so r = fl((m_a - P) - e) is one rounding of the remainder m_a - h m_b, and
    l = r / m_b has the sign of m_a / m_b - h.
  - ``sqrt``: m = m_a (or m_a / 2, making e_a even) in [0.25, 1), E = e_a / 2, h = fl(sqrt m);
    TwoProduct(h, h) = P + e and l = fl((m - P) - e) has the sign of m - h**2.
  - ``fma``: TwoProduct(m_a, m_b) = p + e (|p| in [1/4, 1), |e| <= 2**-54, e a multiple of
    2**-106), E = e_a + e_b, c 2**-E = m_c 2**d.  For -120 <= d <= 60, with c' = m_c 2**d:
    TwoSum(p, c') = s + t, TwoSum(t, e) = u + w, TwoSum(s, u) = h + r, so p + e + c' =
    h + r + w exactly, and l = fl(r + w).  h is faithful: t != 0 only when |s| >= 1/8, so
    |w| <= 2**-53 |u| < 2**-50 ulp(s) lies below half of h's gap.  For d > 60: h = m_c,
    E = e_c, l = p (|ab| 2**-e_c < 2**-60 is below half of m_c's gap).  For d < -120:
    h = p, l = e, or c where e = 0 (|c'| < 2**-121 is below half of p's gap and below
    e's unit).

  Then ``hi = h 2**E`` (exact) and ``lo = sign(l)`` where hi is a finite normal double of
  at least 2**-1021, or where h 2**E is a double and l = 0.  Elsewhere v lies beyond the
  doubles and a stand-in that rounds identically takes its place: ``±2**-1022`` for
  |v| < 2**-1021 when the format's ulp at emin is at least 2**-988 (both have a discarded
  fraction nu < 2**-33, where every mode, SR with up to 32 bits included, decides alike);
  ``±2**1023`` for |v| >= 2**1023 when the format's emax is at most 1022 (every mode rounds
  both to at least 2**1023, beyond the max).  Other formats (binary64, custom formats
  reaching that far) raise NotImplementedError for such results; `round_pair` itself
  refuses inexact pairs whose target needs more than 52 bits (binary64; exact SR to fp32).

Special values follow IEEE 754: the float64 operation gives infinities, NaN and signed
zeros (fma: fl(sign(a b) + c) where a b is finite and nonzero, as fl(a b) may overflow); a
nonzero result keeps its sign however small; an exact zero sum (add, sub, fma) is +0, or
-0 in ``rd`` (IEEE 754 6.3), and -0 in every mode when both terms are -0.  Random integers
for ``mode="sr"`` come from the same stream as `stochround.round` on a tensor of the
broadcast shape (``seed``, ``offset``, ``rand`` behave identically); ``rand="data"`` hashes
the float64 value `round_pair` rounds (a stand-in, where one replaces v).

Gradients (`stochround.arith.gradients`): each operation's result carries the exact
operation's derivative, the rounding taken as the identity (d add/dx = 1, d mul/dx = y,
d fma/dz = 1, ...), as torch computes it on the inputs converted to the result dtype;
`round_pair`'s is that of hi + lo.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import rounding
from ..formats import Format
from ..reference import SATURATIONS, VARIANTS, check_choice, check_rbits
from ..torch_path import canonical_nan
from .checks import eager_only, format_and_mode, operands
from .gradients import with_exact_gradient

__all__ = ["add", "div", "fma", "mul", "round_pair", "sqrt", "sub"]

# float64 has 53 significand bits; Veltkamp's split constant 2**27 + 1 cuts one into two
# halves of at most 26 bits each (the lower one signed), whose products are exact.
_DOUBLE_PRECISION = 53
_VELTKAMP = float(2**27 + 1)
_DOUBLE_MAX = torch.finfo(torch.float64).max


def _two_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Knuth's TwoSum: hi = fl(a + b) and lo with hi + lo = a + b exactly (finite, no overflow)."""
    hi = a + b
    b_virtual = hi - a
    a_virtual = hi - b_virtual
    return hi, (a - a_virtual) + (b - b_virtual)


def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    """Veltkamp: x = high + low, each of at most 26 significand bits."""
    scaled = _VELTKAMP * x
    high = scaled - (scaled - x)
    return high, x - high


def _two_product(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Dekker's TwoProduct: p = fl(a b) and e with p + e = a b exactly (no fma; called on
    significands below 2 in magnitude, where nothing overflows or underflows)."""
    product = a * b
    a_high, a_low = _split(a)
    b_high, b_low = _split(b)
    error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    return product, error


# Scaled results (h + l) 2**E become pairs where hi = h 2**E is a normal double of at least
# 2**-1021 (its frexp exponent `top` in [-1020, 1024]); beyond, stand-ins replace v (module
# docstring): every |v| < 2**-1021 has nu < 2**-33 in a format whose ulp at emin is at
# least 2**-988, and every |v| >= 2**1023 overflows a format with emax <= 1022.
_LOWEST_TOP, _HIGHEST_TOP = -1020, 1024
_TINY_STAND_IN, _HUGE_STAND_IN = 2.0**-1022, 2.0**1023
_LOWEST_ULP_EXPONENT, _HIGHEST_EMAX = -988, 1022
# fma: c's exponent relative to the product's, outside which one side only decides lo
_FMA_BELOW, _FMA_ABOVE = -120, 60


def _power_of_two(exponent: Tensor) -> Tensor:
    """2**exponent as float64, built from its bits (int64 exponents in [-1022, 1023])."""
    return ((exponent + 1023) << 52).view(torch.float64)


def _significand(x: Tensor) -> tuple[Tensor, Tensor]:
    """frexp: x = m 2**e with |m| in [0.5, 1) for finite nonzero x (subnormals too); int64 e."""
    mantissa, exponent = torch.frexp(x)
    return mantissa, exponent.to(torch.int64)


def _ldexp(mantissa: Tensor, exponent: Tensor) -> Tensor:
    """mantissa 2**exponent rounded once to float64 (|mantissa| in [0.5, 1) or 0): the first
    factor keeps it normal and exact, the second rounds (to a subnormal, 0 or inf)."""
    exponent = exponent.clamp(-1100, 1100)
    first = exponent.clamp(-1000, 1000)
    return mantissa * _power_of_two(first) * _power_of_two(exponent - first)


def _unscaled(
    high: Tensor, low: Tensor, exponent: Tensor, fmt: Format, operation: str
) -> tuple[Tensor, Tensor]:
    """The pair (hi, lo) `round_pair` reads for v = (high + low) 2**exponent, where high is
    faithful at 53 bits and low has the sign of the rest; stand-ins where v leaves the
    doubles (module docstring), NotImplementedError where ``fmt`` resolves values there."""
    mantissa, shift = _significand(high)
    top = shift + exponent  # |hi| in [2**(top - 1), 2**top)
    hi = _ldexp(mantissa, top)
    back_mantissa, back_top = _significand(hi)
    is_double = (high == 0) | ((back_mantissa == mantissa) & (back_top == top))
    exact = (low == 0) & is_double
    tiny = ~exact & (top < _LOWEST_TOP)
    huge = ~exact & (top > _HIGHEST_TOP)
    _check_stand_ins(tiny, huge, fmt, operation)
    sign = torch.sign(high)
    hi = torch.where(tiny, sign * _TINY_STAND_IN, torch.where(huge, sign * _HUGE_STAND_IN, hi))
    return hi, torch.where(tiny | huge, 0.0, torch.sign(low))


def _check_stand_ins(tiny: Tensor, huge: Tensor, fmt: Format, operation: str) -> None:
    """NotImplementedError where a result beyond the doubles meets a format that tells apart
    values there (its ulp at emin below 2**-988, or its emax above 1022)."""
    ulp_exponent = fmt.emin - fmt.mbits
    if ulp_exponent < _LOWEST_ULP_EXPONENT and bool(tiny.any()):
        raise NotImplementedError(
            f"{operation} of float64 inputs has a result below 2**-1021 that is no double, and "
            f"{fmt.name} (ulp 2**{ulp_exponent} at emin) resolves values there: cannot round it"
        )
    if fmt.emax > _HIGHEST_EMAX and bool(huge.any()):
        raise NotImplementedError(
            f"{operation} of float64 inputs has a result beyond the doubles, and {fmt.name} "
            f"(emax {fmt.emax} > 1022) need not overflow there: cannot round it"
        )


@eager_only
def round_pair(
    hi: Tensor,
    lo: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """Round the exact value v = hi + lo (float64 tensors) once to ``fmt``; float64 result.

    Requires: where lo != 0, hi is finite and normal and v lies strictly between hi and its
    float64 neighbour in the direction of lo (true for every faithful hi, as the operations
    here give).  Only sign(lo) and whether lo == 0 are read.

    Method: z = round-to-odd(v) at 53 bits, i.e. hi where v = hi or hi's last significand
    bit is 1, else hi's neighbour toward lo (which is odd).  v and z lie in the same open
    interval between consecutive multiples of 2**(E - 52) (E = floor(log2 v)), whose
    points every decision of the contract is constant between, as long as the target ulp
    2**q >= 2**(E - 52 + k) with k = 2 (nearest modes: the half bit, then the sticky bit
    z carries) or k = n + 2 for SR with n bits (floor(nu 2**(n+1)) and whether nu 2**(n+1)
    is an integer decide every variant).  With q >= E - mbits that holds when
    mbits + k <= 52; subnormal and integer grids only make 2**q larger.  Then z is
    rounded with `rounding.round_float64`, drawing the random bits `stochround.round`
    would.  Where the condition fails and some lo != 0 (exact SR to fp32: 23 + 34 > 52),
    NotImplementedError names the case instead of returning wrong bits.

    Gradient: that of hi + lo (1 to each), straight through the rounding.
    """
    fmt, mode = format_and_mode(fmt, mode)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    n = check_rbits(rbits)
    exact_hi, exact_lo = hi, lo
    hi, lo = hi.detach(), lo.detach()  # rounded outside autograd; the gradient is attached
    inexact = (lo != 0) & torch.isfinite(hi)
    guard_bits = 2 + (n if mode == "sr" else 0)
    if fmt.mbits + guard_bits > _DOUBLE_PRECISION - 1 and bool(inexact.any()):
        raise NotImplementedError(
            f"round_pair rounds inexact float64 pairs to {fmt.name} (mbits={fmt.mbits}) with "
            f"mode={mode!r}" + (f" and {n} random bits" if mode == "sr" else "") + ": that "
            f"needs mbits + {guard_bits} <= 52 bits below the double's leading bit"
            + ("; pass rbits <= " + str(50 - fmt.mbits) if mode == "sr" else "")
        )
    hi_is_odd = (hi.view(torch.int64) & 1) == 1
    toward = torch.where(lo > 0, torch.inf, -torch.inf).to(hi.dtype)
    z = torch.where(inexact & ~hi_is_odd, torch.nextafter(hi, toward), hi)
    rounded = rounding.round_float64(
        z, fmt, mode, rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand
    )
    return with_exact_gradient(rounded, torch.add, exact_hi, exact_lo)


def _fused(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    """x * y + z with torch: the exact operation whose gradient `fma` carries."""
    return x * y + z


def _exact_zero_sign(hi: Tensor, a: Tensor, b: Tensor, mode: str) -> Tensor:
    """IEEE 754 6.3 for an exact zero sum a + b: +0 (fl's sign already: -0 only when both
    are -0), and in rd -0 unless both terms are +0."""
    if mode != "rd":
        return hi
    both_positive_zero = (a == 0) & (b == 0) & ~torch.signbit(a) & ~torch.signbit(b)
    return torch.where((hi == 0) & ~both_positive_zero, -0.0, hi)


def _sum_pair(a: Tensor, b: Tensor, mode: str, fmt: Format) -> tuple[Tensor, Tensor]:
    """(hi, lo) of a + b by TwoSum; infinities and NaN pass through hi with lo = 0."""
    hi, lo = _two_sum(a, b)
    finite_inputs = torch.isfinite(a) & torch.isfinite(b)
    overflow = finite_inputs & torch.isinf(hi)
    lo = torch.where(torch.isfinite(hi), lo, 0.0)
    if bool(overflow.any()):  # only float64 inputs: |a + b| beyond every double
        if fmt.max >= 2.0**1023:
            raise NotImplementedError(
                f"a float64 sum overflows, and {fmt.name} reaches 2**1023: cannot round it"
            )
        lo = torch.where(overflow, torch.sign(hi), lo)
        hi = torch.where(overflow, torch.copysign(hi.new_tensor(_DOUBLE_MAX), hi), hi)
    return _exact_zero_sign(hi, a, b, mode), lo


def finish(values: Tensor, dtype: torch.dtype) -> Tensor:
    """Rounded float64 values in the result dtype, NaN canonical (as `stochround.round`).

    Every operation of the package returns its result this way: the reductions too."""
    narrowed = values.to(dtype)
    nan = torch.isnan(values)
    if bool(nan.any()):
        narrowed = torch.where(nan, canonical_nan(dtype, values.device), narrowed)
    return narrowed


def _rounded(
    hi: Tensor, lo: Tensor, dtype: torch.dtype, fmt: Format, mode: str, options: dict
) -> Tensor:
    return finish(round_pair(hi, lo, fmt, mode, **options), dtype)


@eager_only
def add(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """x + y exactly, rounded once to ``fmt`` (TwoSum); result in the promoted dtype."""
    fmt, mode = format_and_mode(fmt, mode)
    (a, b), dtype = operands("add", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _sum_pair(a, b, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, torch.add, x, y)


@eager_only
def sub(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """x - y exactly (= x + (-y), IEEE 754), rounded once to ``fmt``."""
    fmt, mode = format_and_mode(fmt, mode)
    (a, b), dtype = operands("sub", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _sum_pair(a, -b, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, torch.sub, x, y)


def _nonzero_finite(x: Tensor) -> Tensor:
    return torch.isfinite(x) & (x != 0)


def _product_pair(a: Tensor, b: Tensor, fmt: Format) -> tuple[Tensor, Tensor]:
    """(hi, lo) of a * b: TwoProduct of the significands; IEEE 754 specials from fl(a b)."""
    regular = _nonzero_finite(a) & _nonzero_finite(b)
    a_mantissa, a_exponent = _significand(torch.where(regular, a, 1.0))
    b_mantissa, b_exponent = _significand(torch.where(regular, b, 1.0))
    product, error = _two_product(a_mantissa, b_mantissa)
    hi, lo = _unscaled(product, error, a_exponent + b_exponent, fmt, "mul")
    return torch.where(regular, hi, a * b), torch.where(regular, lo, 0.0)


def _quotient_pair(a: Tensor, b: Tensor, fmt: Format) -> tuple[Tensor, Tensor]:
    """(hi, lo) of a / b: hi = fl(m_a / m_b), lo from the exact remainder m_a - hi m_b."""
    regular = _nonzero_finite(a) & _nonzero_finite(b)
    a_mantissa, a_exponent = _significand(torch.where(regular, a, 1.0))
    b_mantissa, b_exponent = _significand(torch.where(regular, b, 1.0))
    quotient = a_mantissa / b_mantissa
    product, error = _two_product(quotient, b_mantissa)
    remainder = (a_mantissa - product) - error
    hi, lo = _unscaled(quotient, remainder / b_mantissa, a_exponent - b_exponent, fmt, "div")
    return torch.where(regular, hi, a / b), torch.where(regular, lo, 0.0)


def _root_pair(a: Tensor, fmt: Format) -> tuple[Tensor, Tensor]:
    """(hi, lo) of sqrt(a): m in [1/4, 1) with an even exponent, hi = fl(sqrt m), lo from
    the exact m - hi**2."""
    regular = torch.isfinite(a) & (a > 0)
    mantissa, exponent = _significand(torch.where(regular, a, 1.0))
    odd = (exponent & 1) == 1
    mantissa = torch.where(odd, mantissa * 0.5, mantissa)
    root = torch.sqrt(mantissa)
    product, error = _two_product(root, root)
    remainder = (mantissa - product) - error
    hi, lo = _unscaled(root, remainder, (exponent + odd.long()) // 2, fmt, "sqrt")
    return torch.where(regular, hi, torch.sqrt(a)), torch.where(regular, lo, 0.0)


def _three_sum(product: Tensor, error: Tensor, addend: Tensor) -> tuple[Tensor, Tensor]:
    """(h, l) with h faithful for product + error + addend and l of the sign of the rest
    (the middle case of fma in the module docstring)."""
    high, low = _two_sum(product, addend)
    middle, last = _two_sum(low, error)
    hi, rest = _two_sum(high, middle)
    return hi, rest + last


def _fused_scaled(a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(h, l, E) with a * b + c = (h + l') 2**E, h faithful and l of the sign of l', for
    finite a, b, c with a b != 0 (the fma cases of the module docstring)."""
    a_mantissa, a_exponent = _significand(a)
    b_mantissa, b_exponent = _significand(b)
    c_mantissa, c_exponent = _significand(c)
    product, error = _two_product(a_mantissa, b_mantissa)
    exponent = a_exponent + b_exponent
    distance = torch.where(c_mantissa == 0, 0, c_exponent - exponent)
    window = distance.clamp(_FMA_BELOW, _FMA_ABOVE)
    high, low = _three_sum(product, error, c_mantissa * _power_of_two(window))
    below, above = distance < _FMA_BELOW, distance > _FMA_ABOVE
    high = torch.where(below, product, torch.where(above, c_mantissa, high))
    low = torch.where(below, torch.where(error != 0, error, c_mantissa), low)
    low = torch.where(above, product, low)
    return high, low, torch.where(above, c_exponent, exponent)


def _fused_pair(a: Tensor, b: Tensor, c: Tensor, mode: str, fmt: Format) -> tuple[Tensor, Tensor]:
    """(hi, lo) of a * b + c; IEEE 754 specials and signed zeros from fl(sign(a b) + c), the
    sign standing in for a finite nonzero product (whose fl(a b) could overflow)."""
    nonzero_product = _nonzero_finite(a) & _nonzero_finite(b)
    regular = nonzero_product & torch.isfinite(c)
    high, low, exponent = _fused_scaled(
        torch.where(regular, a, 1.0), torch.where(regular, b, 1.0), torch.where(regular, c, 0.0)
    )
    hi, lo = _unscaled(high, low, exponent, fmt, "fma")
    product = torch.where(nonzero_product, torch.sign(a) * torch.sign(b), a * b)
    hi = torch.where(regular, hi, product + c)  # an exact zero sum of regular terms is +0
    return _exact_zero_sign(hi, product, c, mode), torch.where(regular, lo, 0.0)


@eager_only
def mul(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """x * y exactly (TwoProduct of the significands), rounded once to ``fmt``."""
    fmt, mode = format_and_mode(fmt, mode)
    (a, b), dtype = operands("mul", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _product_pair(a, b, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, torch.mul, x, y)


@eager_only
def div(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """x / y exactly, rounded once: hi = fl(x/y), lo from the exact remainder x - hi y."""
    fmt, mode = format_and_mode(fmt, mode)
    (a, b), dtype = operands("div", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _quotient_pair(a, b, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, torch.div, x, y)


@eager_only
def fma(
    x: Tensor,
    y: Tensor,
    z: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """x * y + z exactly (TwoProduct of the significands plus z), rounded once to ``fmt``."""
    fmt, mode = format_and_mode(fmt, mode)
    (a, b, c), dtype = operands("fma", ("x", "y", "z"), (x, y, z), wide_ok=True)
    hi, lo = _fused_pair(a, b, c, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, _fused, x, y, z)


@eager_only
def sqrt(
    x: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """sqrt(x) exactly, rounded once: hi = fl(sqrt x), lo from the exact x - hi**2.
    sqrt(-0) = -0, sqrt of a negative number is NaN (IEEE 754)."""
    fmt, mode = format_and_mode(fmt, mode)
    (a,), dtype = operands("sqrt", ("x",), (x,), wide_ok=True)
    hi, lo = _root_pair(a, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    rounded = _rounded(hi, lo, dtype, fmt, mode, options)
    return with_exact_gradient(rounded, torch.sqrt, x)
