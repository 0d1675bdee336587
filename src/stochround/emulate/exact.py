"""The exact result of a float64 op as an unevaluated sum ``hi + lo`` (error-free
transformations: TwoSum, Dekker's TwoProd), and stochastic rounding of that pair, so that
Monte Carlo arithmetic at float64's own 53 bits sees each op's true residual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import random as streams
from .. import rounding
from ..formats import Format
from .ops import aten

# Veltkamp's splitting constant for float64, 2**27 + 1: a * _SPLITTER splits a's 53 bits
# into two halves of 26 bits that multiply exactly
_SPLITTER = 134217729.0

_WORD = 2.0**32


def two_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Knuth's TwoSum: ``s = fl(a + b)`` and ``e`` with ``a + b = s + e`` exactly (float64,
    no overflow)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a: Tensor) -> tuple[Tensor, Tensor]:
    """Veltkamp's split: ``a = high + low`` with 26 significant bits in each."""
    c = _SPLITTER * a
    high = c - (c - a)
    return high, a - high


def two_prod(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Dekker's TwoProd: ``p = fl(a b)`` and ``e`` with ``a b = p + e`` exactly (float64,
    no overflow or underflow of the partial products)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _quotient(hi: Tensor, lo: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(hi + lo) / b`` as ``q + r``: ``q = fl(hi / b)``, ``r = ((hi - q b) + lo) / b``
    with ``hi - q b`` exact (TwoProd), so r is the residual to within 2**-53 relative."""
    q = hi / b
    p, e = two_prod(q, b)
    return q, (((hi - p) - e) + lo) / b


def _sqrt(a: Tensor) -> tuple[Tensor, Tensor]:
    """``sqrt(a) = s + r``: ``r = (a - s^2) / (2 s)``, ``a - s^2`` exact (TwoProd); r is
    the residual to within about 2**-52 relative (the first-order term of the series)."""
    s = torch.sqrt(a)
    p, e = two_prod(s, s)
    return s, torch.where(s > 0, ((a - p) - e) / (2 * s), torch.zeros_like(s))


def _sum(x: Tensor, dim: Any, keepdim: bool) -> tuple[Tensor, Tensor]:
    """sum over ``dim`` (None or []: every dim) pairwise, each addition by TwoSum and the
    errors summed beside it: ``hi + lo`` within about log2(n) 2**-106 sum |x| of the sum."""
    dims = sorted(d % max(x.ndim, 1) for d in dim) if dim else list(range(x.ndim))
    kept = [d for d in range(x.ndim) if d not in dims]
    hi = x.permute([*kept, *dims]).reshape(*(x.shape[d] for d in kept), -1)
    lo = torch.zeros_like(hi)
    while hi.shape[-1] > 1:
        if hi.shape[-1] % 2:
            pad = torch.zeros_like(hi[..., :1])
            hi, lo = torch.cat([hi, pad], -1), torch.cat([lo, pad], -1)
        s, e = two_sum(hi[..., 0::2], hi[..., 1::2])
        hi, lo = s, lo[..., 0::2] + lo[..., 1::2] + e
    if hi.shape[-1] == 0:
        hi = lo = torch.zeros_like(hi[..., :1])
    hi, lo = hi[..., 0], lo[..., 0]
    if keepdim:
        shape = [1 if d in dims else size for d, size in enumerate(x.shape)]
        hi, lo = hi.reshape(shape), lo.reshape(shape)
    return hi, lo


def _reduced(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
    if func is aten.sum.default:
        dim, keepdim = None, False
    hi, lo = _sum(x, dim, keepdim)
    if func.overloadpacket is aten.mean:
        count = x.numel() // max(hi.numel(), 1)
        return _quotient(hi, lo, torch.full_like(hi, float(count)))
    return hi, lo


def _tensor(value: object, like: Tensor) -> Tensor:
    return value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=like.dtype)


def _binary(rule: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], swap: bool = False) -> Any:
    def pair(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
        if kwargs.get("alpha", 1) != 1 or kwargs.get("rounding_mode") is not None:
            return None
        first = args[0]
        a, b = first, _tensor(args[1], first)
        return rule(b, a) if swap else rule(a, b)

    return pair


def _square(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
    """``x ** 2`` by TwoProd; None for another exponent."""
    exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
    return two_prod(args[0], args[0]) if exponent == 2 else None


def _difference(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return two_sum(a, -b)


def _division(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return _quotient(a, torch.zeros_like(a), b)


# the ops whose float64 result's residual is known, by ATen overload: (args, kwargs) ->
# (hi, lo), or None where these arguments are not covered (alpha != 1, a rounding_mode)
_PAIRS: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], tuple[Tensor, Tensor] | None]] = {
    aten.add.Tensor: _binary(two_sum),
    aten.add.Scalar: _binary(two_sum),
    aten.sub.Tensor: _binary(_difference),
    aten.sub.Scalar: _binary(_difference),
    aten.rsub.Tensor: _binary(_difference, swap=True),
    aten.rsub.Scalar: _binary(_difference, swap=True),
    aten.mul.Tensor: _binary(two_prod),
    aten.mul.Scalar: _binary(two_prod),
    aten.div.Tensor: _binary(_division),
    aten.div.Scalar: _binary(_division),
    aten.pow.Tensor_Scalar: _square,
    aten.reciprocal.default: lambda args, kwargs: _division(torch.ones_like(args[0]), args[0]),
    aten.sqrt.default: lambda args, kwargs: _sqrt(args[0]),
    aten.sum.default: lambda args, kwargs: _reduced(aten.sum.default, args, kwargs),
    aten.sum.dim_IntList: lambda args, kwargs: _reduced(aten.sum.dim_IntList, args, kwargs),
    aten.mean.default: lambda args, kwargs: _reduced(aten.mean.default, args, kwargs),
    aten.mean.dim: lambda args, kwargs: _reduced(aten.mean.dim, args, kwargs),
}

# ops whose float64 result is exact (no residual): moving, selecting, negating values
EXACT_OPS = frozenset(
    {
        aten.neg.default,
        aten.abs.default,
        aten.clone.default,
        aten.cat.default,
        aten.stack.default,
        aten.where.self,
        aten.maximum.default,
        aten.minimum.default,
        aten.relu.default,
        aten.index.Tensor,
        aten.gather.default,
        aten.fill.Scalar,
        aten.full.default,
        aten.full_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.copy.default,
        aten.lift_fresh_copy.default,
        aten.zeros.default,
        aten.ones.default,
        aten.scalar_tensor.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.fill_.Scalar,
        aten.zero_.default,
        aten.masked_fill.Scalar,
        aten.masked_fill_.Scalar,
    }
)


def exact_pair(
    func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Tensor, Tensor] | None:
    """The op's exact result as ``(hi, lo)``, ``hi + lo`` the exact value (for +, -, *
    and sums to the pairwise bound; for /, sqrt and mean lo to within 2**-52 relative),
    from float64 arguments (Python numbers taken as float64), for an in-place op (add_,
    ...) as its functional op; None for an op it does not cover (`EXACT_OPS`' results are
    exact as computed: lo = 0)."""
    rule = _PAIRS.get(func)
    name = func.overloadpacket.__name__
    if rule is None and name.endswith("_") and not name.startswith("_"):
        # an in-place op (add_, mul_, ...): its functional op's rule, from the arguments
        # as they were before the op overwrote the first
        functional = getattr(getattr(aten, name[:-1], None), func._overloadname, None)
        rule = _PAIRS.get(functional)
    if rule is None:
        return None
    with torch.no_grad():
        pair = rule(args, kwargs)
        if pair is None:
            return None
        hi, lo = pair
        # a residual that overflowed or is NaN (inputs near the range's end, inf, NaN)
        return hi, torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))


def sr_pair(hi: Tensor, lo: Tensor, target: Format, key: int, offset: int) -> Tensor:
    """`sr_pair_words` with the words of ``(key, offset)`` at hi's flat indices."""
    return sr_pair_words(hi, lo, target, streams.random_words_like(hi, key, offset))


def sr_pair_words(hi: Tensor, lo: Tensor, target: Format, words: Tensor) -> Tensor:
    """``hi + lo`` (float64, |lo| at most half an ulp of hi after renormalisation) rounded
    stochastically to ``target`` with the rounding contract's exact SR (32-bit words,
    variant c): with z and a the neighbours of |hi + lo| toward and away from zero and
    ``nu = (|hi + lo| - z) / (a - z)``, the result is a iff ``round_half_even(nu 2**32)
    + r >= 2**32``, r the element's word in ``words`` (int64 in [0, 2**32), hi's shape;
    `sr_pair`: those of ``(key, offset, flat index)``).  nu is computed in float64
    (relative error at most 2**-52): the probability is exact SR's to within that.
    Infinite and NaN ``hi`` are kept; beyond the format's largest finite value, hi is
    rounded as `stochround.rounding.round` rounds it (mode "sr", the same words)."""
    s = hi + lo
    lo = lo - (s - hi)  # FastTwoSum: |hi| >= |lo| after the op's own rounding
    hi = s
    sign = torch.where(hi < 0, -1.0, 1.0).to(hi.dtype)
    magnitude, tail = hi.abs(), lo * sign
    toward = rounding.round(magnitude, target, "rz")
    below = torch.nextafter(magnitude, torch.zeros_like(magnitude))
    on_grid_below = (toward == magnitude) & (tail < 0)
    toward = torch.where(on_grid_below, rounding.round(below, target, "rz"), toward)
    step = torch.nextafter(toward, torch.full_like(toward, torch.inf))
    away = rounding.round(step, target, "ru")
    nu = ((magnitude - toward) + tail) / (away - toward)
    count = torch.round(nu.clamp(0, 1) * _WORD)
    rounded = torch.where(count + words.to(hi.dtype) >= _WORD, away, toward) * sign
    # beyond the format's largest finite value (no finite neighbour away from zero): the
    # core's SR, which overflows there by the rounding contract, with the same words
    overflow = rounding.round(hi, target, "sr", rand=words)
    rounded = torch.where(torch.isinf(away), overflow, rounded)
    return torch.where(torch.isfinite(hi) & ((hi != 0) | (lo != 0)), rounded, hi)


__all__ = ["EXACT_OPS", "exact_pair", "sr_pair", "sr_pair_words", "two_prod", "two_sum"]
