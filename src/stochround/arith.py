"""SR arithmetic emulation: the exact result of an operation, rounded once to a format.

Each operation computes its exact result v as an unevaluated float64 pair ``hi + lo``
with error-free transformations, then `round_pair` rounds the pair once (DESIGN.md's
rounding contract, every mode, limited-bit SR included) on the public PyTorch path.

Exactness, per operation (inputs fp32/bf16/fp16, so every input has at most 24
significand bits and an exponent in [-149, 127]; every intermediate below is a normal
float64, far from overflow and underflow):

- ``add``, ``sub``: TwoSum (Knuth): ``hi = fl(a + b)``, ``lo = (a + b) - hi`` exactly.
  fp64 inputs are supported too: TwoSum is exact for all finite doubles; a sum beyond
  the doubles is replaced by ``±DBL_MAX`` with a nonzero ``lo``, which every mode rounds
  as the finite overflow it is (formats whose max is below 2**1023).
- ``mul``: the product of two 24-bit significands has at most 48 bits: ``hi = a * b``
  exactly, ``lo = 0``.
- ``fma``: ``p = a * b`` exactly (as ``mul``), then TwoSum(p, c).
- ``div``: ``hi = fl(a / b)``; Dekker's TwoProduct gives ``hi * b = P + e`` exactly;
  ``a - P`` is exact (Sterbenz: P is within a factor 2 of a), so ``r = fl((a - P) - e)``
  is one rounding of the exact remainder ``a - hi b`` and has its sign (zero only when
  the remainder is zero).  ``lo = r / b`` has the sign of ``a/b - hi``.
- ``sqrt``: ``hi = fl(sqrt(a))``; TwoProduct gives ``hi*hi = P + e``; ``r = fl((a - P) - e)``
  has the sign of ``a - hi**2``, hence of ``sqrt(a) - hi``; ``lo = r / (2 hi)``.

For div and sqrt ``lo`` is an approximation whose sign and zeroness are exact; that is
all `round_pair` reads.  mul, div, fma and sqrt of fp64 inputs raise NotImplementedError
(Dekker's products can underflow or overflow there).

Special values follow IEEE 754: the float64 operation gives infinities, NaN and signed
zeros; an exact zero sum (add, sub, fma) is +0, or -0 in ``rd`` (IEEE 754 6.3), and -0 in
every mode when both terms are -0.  Random integers for ``mode="sr"`` come from the same
stream as `stochround.round` on a tensor of the broadcast shape (``seed``, ``offset``,
``rand`` behave identically); ``rand="data"`` hashes the float64 value `round_pair` rounds.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
    """Dekker's TwoProduct: p = fl(a b) and e with p + e = a b exactly (no fma; valid while
    |a|, |b| < 2**995 and the partial products do not underflow)."""
    product = a * b
    a_high, a_low = _split(a)
    b_high, b_low = _split(b)
    error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    return product, error


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
    float64 neighbour in the direction of lo (true when hi = fl(v), and for hi = fl(v) of
    div and sqrt).  Only sign(lo) and whether lo == 0 are read.

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
            f"{operation} of float64 inputs: the exact result needs Dekker products that can "
            "underflow or overflow there; pass fp32/bf16/fp16 inputs"
        )
    return [tensor.to(torch.float64).expand(shape) for tensor in tensors], dtype


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
    """x * y exactly (48-bit significand products are exact in float64), rounded once."""
    fmt = _check_common(fmt, mode)
    (a, b), dtype = _operands("mul", ("x", "y"), (x, y), wide_ok=False)
    hi = a * b
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, torch.zeros_like(hi), dtype, fmt, mode, options)


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
    (a, b), dtype = _operands("div", ("x", "y"), (x, y), wide_ok=False)
    hi = a / b
    regular = torch.isfinite(hi) & (hi != 0) & torch.isfinite(b)
    safe_b = torch.where(regular, b, 1.0)
    safe_hi = torch.where(regular, hi, 1.0)
    product, error = _two_product(safe_hi, safe_b)
    remainder = (torch.where(regular, a, 1.0) - product) - error
    lo = torch.where(regular, remainder / safe_b, 0.0)
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
    """x * y + z exactly (exact product, then TwoSum), rounded once to ``fmt``."""
    fmt = _check_common(fmt, mode)
    (a, b, c), dtype = _operands("fma", ("x", "y", "z"), (x, y, z), wide_ok=False)
    hi, lo = _sum_pair(a * b, c, mode, fmt)
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
    (a,), dtype = _operands("sqrt", ("x",), (x,), wide_ok=False)
    hi = torch.sqrt(a)
    regular = torch.isfinite(hi) & (hi > 0)
    safe_hi = torch.where(regular, hi, 1.0)
    product, error = _two_product(safe_hi, safe_hi)
    remainder = (torch.where(regular, a, 1.0) - product) - error
    lo = torch.where(regular, remainder / (2 * safe_hi), 0.0)
    options = dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand)
    return _rounded(hi, lo, dtype, fmt, mode, options)
