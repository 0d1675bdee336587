"""SR arithmetic emulation: the exact result of an operation, rounded once to a format.

Each operation computes its exact result v as an unevaluated float64 pair ``hi + lo``
with error-free transformations, then `round_pair` rounds the pair once (DESIGN.md's
rounding contract, every mode, limited-bit SR included) on the public PyTorch path.
``hi`` is a faithful rounding of v to 53 bits and ``lo`` has the sign of v - hi (zero only
when v = hi); that is all `round_pair` reads.  Inputs of every floating dtype, float64
included:

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
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from . import random as streams
from . import rounding
from .formats import Format
from .formats import format as find_format
from .reference import MODES, SATURATIONS, VARIANTS, check_choice, check_rbits

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
    """
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    n = check_rbits(rbits)
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
    return rounding.round_float64(
        z, fmt, mode, rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand
    )


def _operands(
    operation: str, names: tuple[str, ...], values: tuple[object, ...], wide_ok: bool
) -> tuple[list[Tensor], torch.dtype]:
    """Checked operands as float64 tensors of the broadcast shape, and the result dtype."""
    shape, dtype = _check_operands(operation, names, values, wide_ok)
    tensors: list[Tensor] = list(values)  # type: ignore[arg-type]
    return [tensor.to(torch.float64).expand(shape) for tensor in tensors], dtype


def _check_operands(
    operation: str, names: tuple[str, ...], values: tuple[object, ...], wide_ok: bool
) -> tuple[torch.Size, torch.dtype]:
    """The broadcast shape and the result dtype of checked operands (TypeError, ValueError
    naming them; NotImplementedError for float64 where ``wide_ok`` is False)."""
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in rounding.FLOAT_DTYPES:
            allowed = ", ".join(str(dtype) for dtype in rounding.FLOAT_DTYPES)
            raise TypeError(f"{name} must have a floating dtype ({allowed}); got {value.dtype}")
    tensors: list[Tensor] = list(values)  # type: ignore[arg-type]
    devices = {tensor.device for tensor in tensors}
    if len(devices) > 1:
        raise ValueError(
            f"{', '.join(names)} must be on one device; got {sorted(map(str, devices))}"
        )
    try:
        shape = torch.broadcast_shapes(*(tensor.shape for tensor in tensors))
    except RuntimeError:
        shapes = ", ".join(f"{n}{tuple(t.shape)}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"the shapes of {shapes} do not broadcast") from None
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    if not wide_ok and any(tensor.dtype == torch.float64 for tensor in tensors):
        raise NotImplementedError(
            f"{operation} of float64 inputs: it forms products as fl(a b), exact only for "
            "inputs of at most 26 significand bits; pass fp32/bf16/fp16 inputs"
        )
    return shape, dtype


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


def _finish(values: Tensor, dtype: torch.dtype) -> Tensor:
    """Rounded float64 values in the result dtype, NaN canonical (as `stochround.round`)."""
    narrowed = values.to(dtype)
    nan = torch.isnan(values)
    if bool(nan.any()):
        narrowed = torch.where(nan, rounding.canonical_nan(dtype, values.device), narrowed)
    return narrowed


def _rounded(
    hi: Tensor, lo: Tensor, dtype: torch.dtype, fmt: Format, mode: str, options: dict
) -> Tensor:
    return _finish(round_pair(hi, lo, fmt, mode, **options), dtype)


def _check_common(fmt: Format | str, mode: str) -> Format:
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    return fmt


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
    fmt = _check_common(fmt, mode)
    (a, b), dtype = _operands("add", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _sum_pair(a, b, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


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
    fmt = _check_common(fmt, mode)
    (a, b), dtype = _operands("sub", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _sum_pair(a, -b, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


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
    fmt = _check_common(fmt, mode)
    (a, b), dtype = _operands("mul", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _product_pair(a, b, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


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
    fmt = _check_common(fmt, mode)
    (a, b), dtype = _operands("div", ("x", "y"), (x, y), wide_ok=True)
    hi, lo = _quotient_pair(a, b, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


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
    fmt = _check_common(fmt, mode)
    (a, b, c), dtype = _operands("fma", ("x", "y", "z"), (x, y, z), wide_ok=True)
    hi, lo = _fused_pair(a, b, c, mode, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


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
    fmt = _check_common(fmt, mode)
    (a,), dtype = _operands("sqrt", ("x",), (x,), wide_ok=True)
    hi, lo = _root_pair(a, fmt)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)


# --------------------------------------------------------------------------------------
# reductions: sum, dot and matmul with a chosen accumulator format, and Monte Carlo
# arithmetic
# --------------------------------------------------------------------------------------
#
# A reduction is a sequence of *steps*; step t rounds one tensor of partial sums, shaped
# (*batch, w_t), once to ``fmt`` (one `add`/`sub`, or the initial rounding of inputs into
# the accumulator).  Random bits: step t draws the words of stream
# (seed, (offset + t) mod 2**64, flat row-major index in that (*batch, w_t) tensor), so
# every (seed, offset + t, index) triple is used once and a call consumes offsets
# offset .. offset + steps - 1 (`reduction_rand_shape` gives steps).  With explicit
# ``rand`` (shape (steps, *batch, width)) step t reads rand[t, ..., :w_t].

ORDERS = ("recursive", "pairwise", "blocked", "compensated")
_TWO_POW_64 = 1 << 64

__all__ += ["ORDERS", "MonteCarloResult", "dot", "matmul", "monte_carlo"]
__all__ += ["reduction_rand_shape", "sum"]


def _check_order(order: str, block: int) -> None:
    check_choice("order", order, ORDERS)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1; got {block!r}")


def _steps_and_width(length: int, order: str, block: int) -> tuple[int, int]:
    """(number of rounding steps, widest partial-sum tensor) of one reduction."""
    if order == "recursive":
        return length, 1
    if order == "pairwise":
        return 1 + (length - 1).bit_length(), length  # 1 + ceil(log2 length)
    if order == "blocked":
        blocks = -(-length // block)
        return min(block, length) + blocks - 1, blocks
    return 1 + 4 * (length - 1), 1  # compensated: 4 roundings per Kahan step


def reduction_rand_shape(
    batch_shape: tuple[int, ...] | torch.Size,
    length: int,
    order: str = "recursive",
    block: int = 32,
) -> tuple[int, ...]:
    """The shape (steps, *batch_shape, width) of ``rand`` for `sum` of ``length`` terms;
    steps is also the number of stream offsets a `sum` consumes (`dot`: one more)."""
    _check_order(order, block)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1; got {length!r}")
    steps, width = _steps_and_width(length, order, block)
    return (steps, *tuple(batch_shape), width)


def _check_dim(dim: int, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"dim must be an int in [{-ndim}, {ndim}) for {ndim}-d input; got {dim!r}")
    return dim % ndim


def _check_reduction_rand(
    rand: object, batch: tuple[int, ...], length: int, order: str, block: int, name: str
) -> Tensor | str | None:
    if rand is None or isinstance(rand, str):
        return rand
    if not isinstance(rand, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, 'data' or None")
    shape = reduction_rand_shape(batch, length, order, block)
    try:
        return torch.broadcast_to(rand, shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(rand.shape)} does not broadcast to (steps, *batch, width) "
            f"= {shape} (order={order!r}, length={length})"
        ) from None


class _Stepper:
    """Rounds step t's partial sums with step t's random bits (see the section comment)."""

    def __init__(self, fmt: Format, mode: str, options: dict, rand: Tensor | str | None):
        self.fmt, self.mode, self.options, self.rand = fmt, mode, options, rand

    def _options(self, t: int, width: int) -> dict:
        options = dict(self.options)
        offset = options["offset"]
        options["offset"] = offset + t if isinstance(offset, Tensor) else (offset + t) % _TWO_POW_64
        if isinstance(self.rand, Tensor):
            options["rand"] = self.rand[t, ..., :width]
        else:
            options["rand"] = self.rand
        return options

    def round(self, values: Tensor, t: int) -> Tensor:
        options = self._options(t, values.shape[-1])
        return rounding.round_float64(values, self.fmt, self.mode, **options)

    def add(self, a: Tensor, b: Tensor, t: int) -> Tensor:
        return add(a, b, self.fmt, self.mode, **self._options(t, a.shape[-1]))

    def sub(self, a: Tensor, b: Tensor, t: int) -> Tensor:
        return sub(a, b, self.fmt, self.mode, **self._options(t, a.shape[-1]))


def _reduce(values: Tensor, order: str, block: int, step: _Stepper) -> Tensor:
    """Reduce float64 ``values`` (*batch, n) over the last dim; float64 (*batch,)."""
    n = values.shape[-1]
    if order == "recursive":
        total = step.round(values[..., 0:1], 0)
        for i in range(1, n):
            total = step.add(total, values[..., i : i + 1], i)
        return total[..., 0]
    if order == "pairwise":
        level = step.round(values, 0)
        t = 1
        while level.shape[-1] > 1:
            width = level.shape[-1]
            pairs = width // 2
            sums = step.add(level[..., 0 : 2 * pairs : 2], level[..., 1 : 2 * pairs : 2], t)
            level = torch.cat([sums, level[..., -1:]], dim=-1) if width % 2 else sums
            t += 1
        return level[..., 0]
    if order == "blocked":
        blocks = -(-n // block)
        inner = min(block, n)
        padded = torch.nn.functional.pad(values, (0, blocks * block - n))
        terms = padded.reshape(*values.shape[:-1], blocks, block)
        starts = torch.arange(blocks, device=values.device) * block
        partial = step.round(terms[..., 0], 0)
        for j in range(1, inner):
            # lanes past the end of the last block keep their sum (their bits are unused)
            partial = torch.where(starts + j < n, step.add(partial, terms[..., j], j), partial)
        total = partial[..., 0:1]
        for u in range(1, blocks):
            total = step.add(total, partial[..., u : u + 1], inner + u - 1)
        return total[..., 0]
    # compensated (Kahan): y = x_i - c; t = s + y; c = (t - s) - y; s = t
    total = step.round(values[..., 0:1], 0)
    compensation = torch.zeros_like(total)
    for i in range(1, n):
        base = 1 + 4 * (i - 1)
        corrected = step.sub(values[..., i : i + 1], compensation, base)
        new_total = step.add(total, corrected, base + 1)
        compensation = step.sub(step.sub(new_total, total, base + 2), corrected, base + 3)
        total = new_total
    return total[..., 0]


def _sum_options(mode, rbits, variant, sat, seed, offset) -> dict:
    check_choice("mode", mode, MODES)
    if mode == "sr" and seed is None:
        seed = streams.default_seed()  # one seed for the whole reduction
    if mode == "sr":
        streams.check_seed(seed, "seed")
    streams.check_seed(offset, "offset")
    return dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset)


def sum(  # noqa: A001 - the name DESIGN.md gives
    x: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    dim: int = -1,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """Sum ``x`` over ``dim`` with an accumulator in ``fmt``, every addition one `add` (the
    exact sum rounded once); vectorized over the other dims.  Result in x's dtype (exact
    when fmt's values fit it; pass float32/float64 x for accumulators wider than x).

    Orders, for terms x_1..x_n (step 0 rounds the inputs into fmt; a no-op when they are
    fmt values):

    - ``recursive``: s = round(x_1); s = round(s + x_i) for i = 2..n.  n steps.
    - ``pairwise``: leaves round(x_i); each level adds adjacent pairs, round(a + b), an odd
      last element carried to the next level.  1 + ceil(log2 n) steps.
    - ``blocked``: recursive inside blocks of ``block`` terms (all blocks at once), then
      recursive over the block sums.  min(block, n) + ceil(n / block) - 1 steps.
    - ``compensated``: Kahan, s and c both held in fmt: y = round(x_i - c),
      t = round(s + y), c = round(round(t - s) - y), s = t.  1 + 4 (n - 1) steps.

    Random bits (``mode="sr"``): step t rounds a (*batch, w_t) tensor with stream
    (seed, offset + t), element indices row-major in that tensor; seed None draws one seed
    for the whole call.  ``rand``: integers of shape `reduction_rand_shape` (steps, *batch,
    width), step t reading rand[t, ..., :w_t] (w_t = 1 for recursive and compensated, the
    number of pair sums or of blocks otherwise), or ``"data"`` (hashed per step).
    """
    rounding.check_input(x)
    fmt = find_format(fmt)
    _check_order(order, block)
    dim = _check_dim(dim, x.ndim) if x.ndim else None
    values = x.to(torch.float64)
    values = values.reshape(1) if dim is None else values.movedim(dim, -1)
    if values.shape[-1] == 0:
        raise ValueError(f"x has no elements along dim {dim}: nothing to sum")
    options = _sum_options(mode, rbits, variant, sat, seed, offset)
    rand = _check_reduction_rand(
        rand, tuple(values.shape[:-1]), values.shape[-1], order, block, "rand"
    )
    total = _reduce(values, order, block, _Stepper(fmt, mode, options, rand))
    return _finish(total, x.dtype)


def _split_rand(rand: object) -> tuple[object, object]:
    """dot's ``rand`` as (product rand, sum rand)."""
    if isinstance(rand, str) or rand is None:
        return rand, rand
    if isinstance(rand, tuple) and len(rand) == 2:
        return rand
    raise TypeError("rand must be None, 'data' or a pair (product_rand, sum_rand)")


def dot(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    product_fmt: Format | str | None = None,
    dim: int = -1,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: tuple[Tensor | None, Tensor | None] | str | None = None,
) -> Tensor:
    """sum_i x_i y_i over ``dim`` (x, y broadcast): each product is `mul`, the exact product
    rounded once to ``product_fmt`` (None: ``fmt``; ``"exact"``: not rounded, so every
    step is a fused multiply-add of the exact product), then `sum` in ``fmt`` with
    ``order``.  Result in the promoted dtype.

    Random bits: the products, a tensor of the broadcast shape, use stream offset
    ``offset``; the sum uses ``offset + 1 ..`` as `sum` describes.  ``rand``: a pair
    (product integers of the broadcast shape or None, sum integers of `sum`'s rand shape),
    or ``"data"``.
    """
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    _check_order(order, block)
    (a, b), dtype = _operands("dot", ("x", "y"), (x, y), wide_ok=False)
    dim = _check_dim(dim, max(a.ndim, 1))
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    product_rand, sum_rand = _split_rand(rand)
    options = _sum_options(mode, rbits, variant, sat, seed, offset)
    products = a * b  # exact: at most 48 significand bits
    if product_fmt != "exact":
        pfmt = fmt if product_fmt is None else find_format(product_fmt)
        product_options = dict(options, rand=product_rand)
        products = round_pair(products, torch.zeros_like(products), pfmt, mode, **product_options)
    elif product_rand is not None and not isinstance(product_rand, str):
        raise ValueError("product_fmt='exact' rounds no products: pass rand=(None, sum_rand)")
    products = products.movedim(dim, -1)
    if products.shape[-1] == 0:
        raise ValueError(f"x and y have no elements along dim {dim}: nothing to sum")
    sum_rand = _check_reduction_rand(
        sum_rand, tuple(products.shape[:-1]), products.shape[-1], order, block, "rand[1]"
    )
    offset = options["offset"]
    options["offset"] = offset + 1 if isinstance(offset, Tensor) else (offset + 1) % _TWO_POW_64
    total = _reduce(products, order, block, _Stepper(fmt, mode, options, sum_rand))
    return _finish(total, dtype)


def matmul(
    a: Tensor,
    b: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    product_fmt: Format | str | None = None,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: tuple[Tensor | None, Tensor | None] | str | None = None,
    backend: str = "auto",
) -> Tensor:
    """C[..., i, j] = dot(A[..., i, :], B[..., :, j]) with per-operation rounding, as a
    multiply-accumulate unit with a ``fmt`` accumulator computes it; batch dims broadcast.

    Exactly ``dot(a[..., :, None, :], b.mT[..., None, :, :], dim=-1)``: products form a
    (..., M, N, K) tensor (memory M N K doubles), and ``rand`` is a pair of (..., M, N, K)
    product integers and (steps, ..., M, N, width) sum integers.

    ``backend``: ``"torch"`` computes that definition; ``"triton"`` computes the same bits
    with `stochround.kernels.matmul` (no M N K tensor), and raises ValueError naming what it
    cannot do (pairwise order, explicit ``rand``, formats wider than fp32, float64 inputs;
    CPU tensors only under TRITON_INTERPRET=1); ``"auto"`` uses the kernel for CUDA tensors
    where it can and the PyTorch path otherwise.
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dims; got shape {tuple(value.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"the shapes of a{tuple(a.shape)} and b{tuple(b.shape)} do not match for matmul: "
            f"a.shape[-1] = {a.shape[-1]} != b.shape[-2] = {b.shape[-2]}"
        )
    check_choice("backend", backend, rounding.BACKENDS)
    x, y = a.unsqueeze(-2), b.mT.unsqueeze(-3)
    arguments = dict(product_fmt=product_fmt, dim=-1, order=order, block=block, rbits=rbits)
    arguments.update(variant=variant, sat=sat, offset=offset, rand=rand)
    # K = 0 goes to `dot` on every backend, for its error
    if backend == "torch" or (backend == "auto" and not a.is_cuda) or a.shape[-1] == 0:
        return dot(x, y, fmt, mode, seed=seed, **arguments)
    # Check the arguments as `dot` does, in its order, and draw the default seed once: a
    # fallback to `dot` then gives the bits and errors it gives on its own.
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    _check_order(order, block)
    _check_operands("dot", ("x", "y"), (x, y), wide_ok=True)
    _split_rand(rand)
    seed = _sum_options(mode, rbits, variant, sat, seed, offset)["seed"]
    exact_products = isinstance(product_fmt, str) and product_fmt == "exact"
    pfmt = None if exact_products else find_format(fmt if product_fmt is None else product_fmt)
    request = rounding.check_request(
        a.new_empty(0), fmt, mode, rbits, variant, sat, seed, offset, None, 0
    )
    reason = _matmul_triton_unsupported(a, b, fmt, pfmt, order, mode, request.n, rand)
    if reason is None:
        from .kernels.matmul import matmul_triton

        return matmul_triton(
            a,
            b,
            fmt,
            pfmt,
            mode,
            order=order,
            block=block,
            n=request.n,
            variant=variant,
            sat=sat,
            seed=seed,
            offset=offset,
        )
    if backend == "triton":
        raise ValueError(f"backend='triton' cannot compute this matmul: {reason}")
    return dot(x, y, fmt, mode, seed=seed, **arguments)


def _matmul_triton_unsupported(
    a: Tensor,
    b: Tensor,
    fmt: Format,
    product_fmt: Format | None,
    order: str,
    mode: str,
    n: int,
    rand: object,
) -> str | None:
    """Why the Triton kernel cannot compute this matmul (None if it can)."""
    try:
        from .kernels import matmul as kernels
    except ImportError as error:  # triton not installed
        return f"triton is not importable ({error})"
    if not (a.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return "a is not a CUDA tensor (set TRITON_INTERPRET=1 to run kernels on the CPU)"
    return kernels.unsupported((a.dtype, b.dtype), fmt, product_fmt, order, mode, n, rand)


@dataclass(frozen=True)
class MonteCarloResult:
    """n results of a computation under random rounding (float64, shape (n, *result)) and,
    elementwise, their mean, sample std (n - 1) and significant decimal digits."""

    samples: Tensor
    mean: Tensor
    std: Tensor
    digits: Tensor


def monte_carlo(
    fn: Callable[..., object],
    *args: object,
    n: int = 32,
    fmt: Format | str,
    mode: str = "sr",
    seed: int = 0,
    **kwargs: object,
) -> MonteCarloResult:
    """Monte Carlo arithmetic (Parker 1997; as PyTracer and verificarlo use it): run
    ``fn(*args, rounding=rounding, **kwargs)`` n times, where ``rounding(t)`` is
    ``stochround.round(t, fmt, mode, seed=seed, offset=k)`` and k counts the calls over all
    n runs (0, 1, 2, ...), so every call draws fresh bits and the whole is reproducible.

    digits = -log10(std / |mean|), clamped to [0, p log10 2] with p = fmt.mbits + 1 the
    format's precision: std == 0 (every sample agrees, e.g. a deterministic mode) gives the
    format's p log10 2 digits, mean == 0 with std > 0 gives 0; NaN samples give NaN.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (a std needs two samples); got {n!r}")
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    streams.check_seed(seed, "seed")
    calls = 0

    def round_once(t: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        return rounding.round(t, fmt, mode, seed=seed, offset=calls - 1)

    results = [
        torch.as_tensor(fn(*args, rounding=round_once, **kwargs)).to(torch.float64)
        for _ in range(n)
    ]
    samples = torch.stack(results)
    mean = samples.mean(dim=0)
    std = samples.std(dim=0, correction=1)
    max_digits = (fmt.mbits + 1) * math.log10(2)
    with torch.no_grad():
        ratio = std / mean.abs()
        digits = torch.where(std == 0, max_digits, (-torch.log10(ratio)).clamp(0, max_digits))
    return MonteCarloResult(samples, mean, std, digits)
