"""The stochastic rounding of n samples' exact results ``hi + lo`` in one launch, each
sample drawing its own stream's words: the kernel twin of
``stochround.emulate.exact.sr_pair_words(hi, lo, fmt, sample_words(...))``, which a
batched MCA run (`stochround.emulate.mca_batched`) calls once an op.

The PyTorch path makes its random words (a launch), then some thirty passes over the
values, four of them full roundings (toward zero twice, upward, SR for the overflow); here
each element's word, its neighbours in the format and the decision are computed in
registers.  The neighbours of a magnitude m >= 0 on the grid of an IEEE-like format
(``sample_pair_refusal`` of `stochround.emulate.mca_samples` says which): its quantum
``u = 2**(max(e, emin) - mbits)`` (e m's float64 exponent), toward zero ``floor(m / u)
u`` (at most the format's max), upward ``ceil(m / u) u`` (infinity above the max);
``m / u`` is exact (a power of two scales it).
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..formats import Format
from .availability import current_device
from .grid import cdiv
from .philox import random_word
from .runtime import bound_launch

_BLOCK = 512
_WORD = tl.constexpr(4294967296.0)  # 2**32: the words' range


@triton.jit
def _pow2(q):
    """2.0**q in float64 from its bits, q an int64 tensor in [-1074, 1024] (1024: inf)."""
    normal = (q + 1023) << 52
    subnormal = tl.full(q.shape, 1, tl.int64) << tl.maximum(q + 1074, 0)
    return tl.where(q >= -1022, normal, subnormal).to(tl.float64, bitcast=True)


@triton.jit
def _quantum(m, EMIN: tl.constexpr, MBITS: tl.constexpr):
    """The format's quantum at m >= 0: 2**(max(e, emin) - mbits), e m's exponent."""
    exponent = ((m.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    return _pow2(tl.maximum(exponent, EMIN) - MBITS)


@triton.jit
def _toward_zero(m, top, EMIN: tl.constexpr, MBITS: tl.constexpr):
    """m >= 0 rounded toward zero to the format (the max above it: rz's overflow)."""
    u = _quantum(m, EMIN, MBITS)
    return tl.minimum(tl.floor(m / u) * u, top)


@triton.jit
def _half_even(x):
    """x >= 0 rounded to the nearest integer, ties to even (exact in float64)."""
    f = tl.floor(x)
    d = x - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    return f + tl.where(d > 0.5, 1.0, tl.where(d == 0.5, odd, 0.0))


@triton.jit
def _sample_word(bases_ptr, seed_ptr, offset, count, positions, mask):
    """The word of each flat position of ``(n, count)`` values: element ``positions mod
    count`` of its sample j's stream ``(seed, bases[j] + offset)``, as a float64."""
    sample = positions // count
    index = positions - sample * count
    start = tl.load(bases_ptr + sample, mask=mask, other=0) + offset
    return random_word(tl.load(seed_ptr), start, index).to(tl.int64).to(tl.float64)


@triton.jit
def _sr_pair(hi0, lo0, word, EMIN: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr):
    """``hi0 + lo0`` rounded as ``sr_pair_words`` rounds it, with these words."""
    # the format's max, (2 - 2**-mbits) 2**emax, exact as a difference of powers of two
    emax = tl.full(hi0.shape, EMAX, tl.int64)
    top = _pow2(emax + 1) - _pow2(emax - MBITS)
    # FastTwoSum: |hi| >= |lo| after the op's own rounding
    hi = hi0 + lo0
    lo = lo0 - (hi - hi0)
    sign = tl.where(hi < 0, -1.0, 1.0)
    magnitude = tl.abs(hi)
    tail = lo * sign
    toward = _toward_zero(magnitude, top, EMIN, MBITS)
    # nextafter(m, 0) for m >= 0: one code down (0 stays 0)
    below = tl.where(
        magnitude > 0, (magnitude.to(tl.int64, bitcast=True) - 1).to(tl.float64, bitcast=True), 0.0
    )
    toward = tl.where(
        (toward == magnitude) & (tail < 0), _toward_zero(below, top, EMIN, MBITS), toward
    )
    # nextafter(toward, inf) for finite toward >= 0: one code up; then rounded upward
    step = (toward.to(tl.int64, bitcast=True) + 1).to(tl.float64, bitcast=True)
    u = _quantum(step, EMIN, MBITS)
    kept = tl.floor(step / u)
    away = (kept + tl.where(step / u > kept, 1.0, 0.0)) * u
    away = tl.where(away > top, float("inf"), away)
    nu = ((magnitude - toward) + tail) / (away - toward)
    counted = _half_even(tl.minimum(tl.maximum(nu, 0.0), 1.0) * _WORD)
    rounded = tl.where(counted + word >= _WORD, away, toward) * sign
    # beyond the max (no finite neighbour away from zero): SR of hi with the same word
    # (variant c, 32 bits), overflowing to infinity as the rounding contract says
    u = _quantum(magnitude, EMIN, MBITS)
    scaled = magnitude / u
    whole = tl.floor(scaled)
    decided = tl.floor((_half_even((scaled - whole) * _WORD) + word) * (1.0 / _WORD))
    overflow = (whole + decided) * u
    overflow = tl.where(overflow > top, float("inf"), overflow) * sign
    rounded = tl.where(away == float("inf"), overflow, rounded)
    keep = (magnitude < float("inf")) & ((hi != 0) | (lo != 0))
    return tl.where(keep, rounded, hi)


@triton.jit(do_not_specialize=["offset", "count", "total"])
def _sample_pair_kernel(
    out_ptr,
    hi_ptr,
    lo_ptr,
    bases_ptr,
    seed_ptr,
    offset,
    count,
    total,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MBITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    positions = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = positions < total
    word = _sample_word(bases_ptr, seed_ptr, offset, count, positions, mask)
    hi = tl.load(hi_ptr + positions, mask=mask, other=0.0)
    lo = tl.load(lo_ptr + positions, mask=mask, other=0.0)
    tl.store(out_ptr + positions, _sr_pair(hi, lo, word, EMIN, EMAX, MBITS), mask=mask)


@triton.jit
def _two_sum(a, b):
    """Knuth's TwoSum, as `stochround.emulate.exact.two_sum` (no contraction)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@triton.jit
def _split(a):
    """Veltkamp's split by 2**27 + 1, as `stochround.emulate.exact`'s."""
    splitter = _pow2(tl.full(a.shape, 27, tl.int64)) + 1.0  # 2**27 + 1: not an fp32 literal
    c = splitter * a
    high = c - (c - a)
    return high, a - high


@triton.jit
def _two_prod(a, b):
    """Dekker's TwoProd, as `stochround.emulate.exact.two_prod`, its sums in its order."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@triton.jit(do_not_specialize=["b_bits", "offset", "count", "total"])
def _sample_binary_kernel(
    out_ptr,
    a_ptr,
    b_ptr,
    b_bits,
    bases_ptr,
    seed_ptr,
    offset,
    count,
    total,
    OP: tl.constexpr,
    B_SCALAR: tl.constexpr,
    EMIN: tl.constexpr,
    EMAX: tl.constexpr,
    MBITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    positions = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = positions < total
    word = _sample_word(bases_ptr, seed_ptr, offset, count, positions, mask)
    a = tl.load(a_ptr + positions, mask=mask, other=0.0).to(tl.float64)
    if B_SCALAR:  # a Python number, its float64 bits
        b = tl.full([BLOCK], b_bits, tl.int64).to(tl.float64, bitcast=True)
    else:
        b = tl.load(b_ptr + positions, mask=mask, other=1.0).to(tl.float64)
    # the exact result hi + lo of `stochround.emulate.exact`'s rule for the op
    if OP == 0:  # a + b
        hi, lo = _two_sum(a, b)
    elif OP == 1:  # a - b
        hi, lo = _two_sum(a, -b)
    elif OP == 2:  # b - a (rsub)
        hi, lo = _two_sum(b, -a)
    elif OP == 3:  # a b
        hi, lo = _two_prod(a, b)
    else:  # a / b: the quotient and its residual ((a - q b) + 0) / b, q b by TwoProd
        hi = a / b
        p, e = _two_prod(hi, b)
        lo = (((a - p) - e) + 0.0) / b
    lo = tl.where(tl.abs(lo) < float("inf"), lo, 0.0)  # an overflowed or NaN residual
    rounded = _sr_pair(hi, lo, word, EMIN, EMAX, MBITS)
    tl.store(out_ptr + positions, rounded.to(out_ptr.dtype.element_ty), mask=mask)


def _constants(fmt: Format, *extra: tuple[str, object]) -> tuple[tuple[str, object], ...]:
    # every product rounded, as the PyTorch path's (TwoProd's residual needs it)
    options = (("num_warps", 4), ("enable_fp_fusion", False))
    grid = (("EMIN", fmt.emin), ("EMAX", fmt.emax), ("MBITS", fmt.mbits), ("BLOCK", _BLOCK))
    return (*extra, *grid, *options)


def sample_pair_triton(
    hi: Tensor, lo: Tensor, fmt: Format, seed: Tensor, bases: Tensor, offset: int
) -> Tensor:
    """``hi + lo`` (float64, ``(n, *shape)``) rounded stochastically to ``fmt`` (exact SR,
    32-bit words, variant c), element i of sample j with the word of index i in stream
    ``(key, bases[j] + offset)``: the bits of ``sr_pair_words(hi, lo, fmt,
    sample_words(shape, key, bases, offset))``.  ``seed``: the key as
    `stochround.random.seed_tensor` gives it on the device (made once by the caller);
    ``fmt`` passes ``sample_pair_refusal``; ``bases[j] + offset`` below 2**63."""
    hi, lo = hi.contiguous(), lo.contiguous()
    out = torch.empty_like(hi)
    total = hi.numel()
    if total == 0:
        return out
    count = total // hi.shape[0]
    launch = bound_launch(_sample_pair_kernel, _constants(fmt))
    launch(
        current_device() if hi.is_cuda else 0,
        cdiv(total, _BLOCK),
        out,
        hi,
        lo,
        bases,
        seed,
        offset,
        count,
        total,
    )
    return out


# the ops of `sample_binary_triton`, by their kernel code
BINARY_OPS = {"add": 0, "sub": 1, "rsub": 2, "mul": 3, "div": 4}


def sample_binary_triton(
    op: str,
    a: Tensor,
    b: Tensor | float,
    out_dtype: torch.dtype,
    fmt: Format,
    seed: Tensor,
    bases: Tensor,
    offset: int,
) -> Tensor:
    """``op`` (one of `BINARY_OPS`) of a and b (``(n, *shape)`` tensors of one shape, or b
    a float: a Python number as the op's float64 arithmetic takes it), computed in
    float64 with its exact residual, rounded as `sample_pair_triton` rounds, stored in
    ``out_dtype`` (float32 or float64): the bits of ``sr_pair_words(*exact_pair(op,
    a.double(), b), fmt, sample_words(...)).to(out_dtype)``, one launch; ``seed`` as
    `sample_pair_triton` takes it."""
    a = a.contiguous()
    scalar = not isinstance(b, Tensor)
    if isinstance(b, Tensor):
        bits, other = 0, b.contiguous()
    else:
        bits = struct.unpack("<q", struct.pack("<d", float(b)))[0]
        other = a
    # like a (contiguous): no shape or device to parse, host time every op saves
    out = torch.empty_like(a, dtype=out_dtype, memory_format=torch.contiguous_format)
    total = a.numel()
    if total == 0:
        return out
    constants = _constants(fmt, ("OP", BINARY_OPS[op]), ("B_SCALAR", scalar))
    launch = bound_launch(_sample_binary_kernel, constants)
    device = current_device() if a.is_cuda else 0
    count = total // a.shape[0]
    launch(device, cdiv(total, _BLOCK), out, a, other, bits, bases, seed, offset, count, total)
    return out


__all__ = ["BINARY_OPS", "sample_binary_triton", "sample_pair_triton"]
