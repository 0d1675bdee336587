"""The noise of Gaussian weight sampling (GaussWS, Ahn & Yoo, arXiv 2505.11170) on the
PyTorch path: the rounded Gaussian's exact tables, the target format's spacing and
`sample_weight_torch`, the executable definition that the Triton kernel
`stochround.kernels.gaussws.gaussws_blocks` computes bit for bit.

The sampled weight is ``w~ = cast_to_w_dtype(fp32(w) + fp32(R) * u(w))``,
``R ~ round(N(0, 1) / 2)``, step by step:

1. Blocks of ``block`` consecutive elements along the last axis; a block's ``amax = max
   |w|`` in fp32.  A block whose amax is 0 or not finite is returned unchanged.
2. The block scale ``s = 2**e``, ``e = floor(log2 amax) - emax`` (OCP MX's "floor" rule,
   ``emax`` the target's largest exponent), clamped to [-126, 127].
3. ``a = |w| / s``; ``u = 2**(ex - mbits) * s`` with ``ex = min(floor(log2 a), emax)`` where
   ``a >= 2**emin`` and ``ex = emin`` below, ``mbits`` the target's mantissa bits: a power
   of two built from integer exponents (0 below fp32's smallest subnormal ``2**-149``).
4. ``R = -3 + #{j : x >= T_j}``, ``x`` the top ``noise_bits`` bits of the element's Philox
   word (`stochround.random.random_words` of its row-major index plus ``index_offset``)
   and ``T_j`` the six cumulative counts of `gaussian_counts`: ``c_k = c_-k =
   round(2**n p_k)`` for ``k = 1, 2, 3``, ``p_k = Phi(2k+1) - Phi(2k-1)``, ``c_0`` the
   rest, so ``P(R = k) = c_k / 2**n`` exactly and ``E[R] = 0``.
5. The sum in fp32 (round to nearest even), then one cast to w's dtype (nearest even).

The Gaussian weight sampling guide (docs/guide/gaussws.md) states the distribution's
error bounds, when ``E[w~] = w`` exactly, and the decisions with their reasons.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from typing import NamedTuple

import torch
from torch import Tensor

from ..blocks.formats import BlockFormat
from ..blocks.quantize import fake_quantize
from ..blocks.scales import quotient
from ..formats import Format
from ..formats import format as find_format
from ..random import check_index_offset, check_seed, random_words_like
from ..reference import WORD_BITS, check_choice
from .gaussws_graph import MAX_ROUNDED, count_thresholds, gaussws_draws

NOISES = ("gaussws", "diffq", "sr")
_SAMPLED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# the fp32 exponent field and the block scale's clamp (the spec's [-126, 127])
_FP32_MANTISSA_BITS = 23
_FP32_BIAS = 127
_FP32_SUBNORMAL_EXPONENT = -149
_SCALE_MIN_EXPONENT = -126
_SCALE_MAX_EXPONENT = 127

# Box-Muller's uniforms take the top 24 bits of a word: exact in fp32
_UNIFORM_BITS = 24


def normal_probability(k: int) -> float:
    """``p_k = Phi(2k+1) - Phi(2k-1)``: the probability that ``N(0,1)/2`` rounds (to nearest)
    to ``k``, in float64 from `math.erf`."""

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    return phi(2 * k + 1) - phi(2 * k - 1)


def _check_noise_bits(noise_bits: object) -> int:
    """``noise_bits`` checked: an int in 1..32 (TypeError/ValueError naming it)."""
    if isinstance(noise_bits, bool) or not isinstance(noise_bits, numbers.Integral):
        raise TypeError(f"noise_bits must be an int in 1..32, got {type(noise_bits).__name__}")
    if not 1 <= int(noise_bits) <= WORD_BITS:
        raise ValueError(f"noise_bits must be in 1..32, got {noise_bits}")
    return int(noise_bits)


def gaussian_counts(noise_bits: int) -> tuple[int, ...]:
    """The counts ``(c_-3, ..., c_3)`` of the ``2**noise_bits`` values of ``x`` that give
    ``R = -3 .. 3``: ``c_k = c_-k = round(2**n p_k)`` for ``k = 1, 2, 3`` (`normal_probability`)
    and ``c_0 = 2**n - 2 (c_1 + c_2 + c_3)`` (module docstring).  ``noise_bits``: an int in
    1..32."""
    return _count_table(_check_noise_bits(noise_bits))


def gaussian_thresholds(noise_bits: int) -> tuple[int, ...]:
    """The six thresholds ``T_1 .. T_6`` of the table lookup ``R = -3 + #{j : x >= T_j}``
    (``x`` in ``[0, 2**noise_bits)``): the cumulative counts ``T_j = c_-3 + ... + c_(j-4)``
    (`gaussian_counts`), so that ``P(R = k) = c_k / 2**noise_bits`` exactly.  ``noise_bits``:
    an int in 1..32."""
    return _threshold_table(_check_noise_bits(noise_bits))


@functools.cache  # of checked ints only: a bool or float argument would share a cache entry
def _count_table(noise_bits: int) -> tuple[int, ...]:
    """`gaussian_counts` of a checked ``noise_bits``."""
    # floor(v + 1/2): p_k is irrational, so 2**n p_k is never a tie
    scale = 2**noise_bits
    tails = [math.floor(scale * normal_probability(k) + 0.5) for k in range(1, MAX_ROUNDED + 1)]
    middle = scale - 2 * sum(tails)
    return (*tails[::-1], middle, *tails)


@functools.cache
def _threshold_table(noise_bits: int) -> tuple[int, ...]:
    """`gaussian_thresholds` of a checked ``noise_bits``."""
    return tuple(itertools.accumulate(_count_table(noise_bits)[:-1]))


def rounded_gaussian(words: Tensor, noise_bits: int) -> Tensor:
    """``R = -3 + #{j : x >= T_j}`` (int8, in -3..3) for ``words`` holding ``x``: random
    integers in ``[0, 2**noise_bits)`` (a word already shifted, ``word >> (32 -
    noise_bits)``), an integer tensor; the thresholds are `gaussian_thresholds`'."""
    if not isinstance(words, Tensor):
        raise TypeError(f"words must be an integer tensor, got {type(words).__name__}")
    if words.dtype == torch.bool or words.dtype.is_floating_point or words.dtype.is_complex:
        raise TypeError(f"words must be an integer tensor, got a {words.dtype} tensor")
    thresholds = gaussian_thresholds(_check_noise_bits(noise_bits))
    return count_thresholds(words, thresholds)


class Target(NamedTuple):
    """The target element format's numbers the sampling reads, as plain ints (a `Format`'s
    cached properties take a lock that torch.compile cannot trace)."""

    format: Format
    emin: int
    emax: int
    mbits: int
    bits: int


def _resolve_target(fmt: object) -> Target:
    """The `Target` of ``fmt``: a `stochround.Format`, a registered format's name or a
    torch dtype (the format its values have, as `stochround.format` reads it: TypeError
    otherwise; an unknown name or dtype gives `stochround.format`'s ValueError)."""
    if isinstance(fmt, str | torch.dtype):
        fmt = find_format(fmt)
    if not isinstance(fmt, Format):
        raise TypeError(
            f"fmt must be a stochround.Format, a format name (e.g. 'e3m2') or a torch "
            f"dtype (e.g. torch.float8_e4m3fn), got {type(fmt).__name__}"
        )
    return Target(fmt, int(fmt.emin), int(fmt.emax), int(fmt.mbits), int(fmt.bits))


def check_weight(w: object) -> Tensor:
    """``w`` checked: a float32, bfloat16 or float16 tensor of at least one dimension."""
    if not isinstance(w, Tensor):
        raise TypeError(f"w must be a tensor, got {type(w).__name__}")
    if w.dtype not in _SAMPLED_DTYPES:
        raise TypeError(f"w must be a float32, bfloat16 or float16 tensor, got {w.dtype}")
    if w.dim() < 1:
        raise ValueError("w must have at least one dimension (blocks run along the last)")
    return w


def _check_noise_block(block: object) -> int | None:
    """``block`` checked: a positive int, or None (the whole last axis)."""
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, numbers.Integral):
        raise TypeError(f"block must be a positive int or None, got {type(block).__name__}")
    if block < 1:
        raise ValueError(f"block must be a positive int or None, got {block}")
    return int(block)


def block_length(w: Tensor, block: int | None) -> int:
    """The block length for ``w``'s last axis (``block``, or the axis for None); ValueError
    unless it divides the axis."""
    cols = w.shape[-1]
    length = cols if block is None else block
    if cols == 0 or cols % length:
        raise ValueError(f"block={block} must divide w's last dimension {cols}")
    return length


def floor_log2_bits(magnitude: Tensor) -> Tensor:
    """``floor(log2 x)`` (int32) of non-negative finite fp32 ``magnitude``, exactly, from the
    exponent field: ``field - 127`` for normals; for subnormals (field 0) the exponent of
    the mantissa integer ``m`` (exact in fp32) minus 149, as ``x = m * 2**-149``.  Zero
    gives -276 (the subnormal formula read at ``m = 0``): callers mask zeros."""
    bits = magnitude.view(torch.int32)
    field = bits >> _FP32_MANTISSA_BITS
    mantissa = bits & ((1 << _FP32_MANTISSA_BITS) - 1)
    mantissa_field = mantissa.to(torch.float32).view(torch.int32) >> _FP32_MANTISSA_BITS
    subnormal = mantissa_field - _FP32_BIAS + _FP32_SUBNORMAL_EXPONENT
    return torch.where(field == 0, subnormal, field - _FP32_BIAS)


def power_of_two(exponent: Tensor) -> Tensor:
    """``2**k`` in fp32 for int32 exponents ``k <= 127``, built from bits: normal for ``k >=
    -126``, subnormal for ``-149 <= k < -126``, 0 below (fp32 holds no smaller power)."""
    normal = ((exponent + _FP32_BIAS).clamp(min=1) << _FP32_MANTISSA_BITS).view(torch.float32)
    shift = (exponent - _FP32_SUBNORMAL_EXPONENT).clamp(0, _FP32_MANTISSA_BITS - 1)
    subnormal = (torch.ones_like(exponent) << shift).view(torch.float32)
    small = torch.where(exponent >= _FP32_SUBNORMAL_EXPONENT, subnormal, torch.zeros_like(normal))
    return torch.where(exponent >= 1 - _FP32_BIAS, normal, small)


def _block_view(w32: Tensor, length: int) -> Tensor:
    """``w32`` (fp32) as ``(..., blocks, length)``."""
    return w32.reshape(*w32.shape[:-1], w32.shape[-1] // length, length)


def _spacing_of_blocks(blocks: Tensor, target: Target) -> tuple[Tensor, Tensor]:
    """``(u, kept)`` for fp32 ``blocks`` shaped ``(..., blocks, length)``: the spacing ``u``
    (fp32, steps 1-3 of the module docstring; 0 in kept blocks) and the per-block mask of
    the blocks left unchanged (amax 0 or not finite), shaped ``(..., blocks, 1)``."""
    magnitude = blocks.abs()
    amax = magnitude.amax(dim=-1, keepdim=True)
    kept = ~(torch.isfinite(amax) & (amax > 0))
    safe_amax = torch.where(kept, torch.ones_like(amax), amax)
    scale = (floor_log2_bits(safe_amax) - target.emax).clamp(
        _SCALE_MIN_EXPONENT, _SCALE_MAX_EXPONENT
    )
    safe_magnitude = torch.where(kept, torch.ones_like(magnitude), magnitude)
    # floor(log2 a) = floor(log2 |w|) - e: s is a power of two
    exponent = floor_log2_bits(safe_magnitude) - scale
    normal = (safe_magnitude > 0) & (exponent >= target.emin)
    element = torch.where(normal, exponent.clamp(max=target.emax), target.emin)
    u = power_of_two(element - target.mbits + scale)
    return torch.where(kept, torch.zeros_like(u), u), kept


def noise_spacing(w: Tensor, fmt: str | Format, block: int | None = 32) -> Tensor:
    """The spacing ``u`` (fp32, shaped like ``w``) of the target format ``fmt`` at each
    element of ``w``: ``u = 2**(ex - mbits + e)`` with the block scale ``2**e`` (module
    docstring, steps 1-3), 0 in blocks left unchanged (amax 0 or not finite).  ``w``: a
    float32/bfloat16/float16 tensor, blocks along its last axis; ``fmt``: a `Format` or
    its name; ``block``: the block length (dividing the last axis) or None (the axis)."""
    w = check_weight(w)
    target = _resolve_target(fmt)
    length = block_length(w, _check_noise_block(block))
    u, _ = _spacing_of_blocks(_block_view(w.to(torch.float32), length), target)
    return u.reshape(w.shape)


class Sampler(NamedTuple):
    """A checked sampling configuration, made once (`make_sampler`) so that a layer's
    forward builds no format: the target, block, noise, its bits, the thresholds and, for
    ``noise="sr"``, the block format fake quantization uses (None otherwise)."""

    target: Target
    block: int | None
    noise: str
    noise_bits: int
    thresholds: tuple[int, ...]
    block_format: BlockFormat | None


def make_sampler(fmt: str | Format, block: int | None, noise: str, noise_bits: int) -> Sampler:
    """The `Sampler` of the arguments, each checked (ValueError/TypeError naming it)."""
    target = _resolve_target(fmt)
    block = _check_noise_block(block)
    check_choice("noise", noise, NOISES)
    bits = _check_noise_bits(noise_bits)
    block_format = None
    if noise == "sr":
        block_format = BlockFormat(
            name=f"gaussws_sr_{target.format.name}",
            element=target.format,
            block=block,
            scale=find_format("e8m0"),
            scale_rule="floor",
        )
    return Sampler(target, block, noise, bits, gaussian_thresholds(bits), block_format)


def _gaussws_noise(blocks: Tensor, sampler: Sampler, rounded: Tensor) -> tuple[Tensor, Tensor]:
    """``(R * u, kept)`` for fp32 ``blocks`` ``(..., blocks, length)`` and their R."""
    u, kept = _spacing_of_blocks(blocks, sampler.target)
    return rounded.reshape(blocks.shape).to(torch.float32) * u, kept


def _rounded_draws(
    w32: Tensor, sampler: Sampler, seed: int | Tensor, offset: int | Tensor, index_offset: int
) -> Tensor:
    """R (int8, shaped like ``w32``) of each element's word (module docstring, step 4).
    Traced by torch.compile with an int seed, a tensor offset and index offset 0 (a
    `GaussWS` layer's draw), the one op `stochround.nn.gaussws_graph.gaussws_draws`, which
    Inductor computes inside the sampled weight's kernel (that module's docstring); the
    same values, bit for bit."""
    compact = index_offset == 0 and torch.compiler.is_compiling()
    if compact and isinstance(seed, int) and isinstance(offset, Tensor):
        return gaussws_draws(w32, seed, offset, sampler.noise_bits, sampler.thresholds)
    words = random_words_like(w32, seed, offset, index_offset)
    return count_thresholds(words >> (WORD_BITS - sampler.noise_bits), sampler.thresholds)


def _diffq_noise(blocks: Tensor, sampler: Sampler, words: Tensor) -> tuple[Tensor, Tensor]:
    """``((N / 2) * (max - min) / (2**b - 1), kept)`` per block, ``N`` by Box-Muller from
    each element's two words (``words`` shaped ``(*blocks.shape, 2)``):
    ``N = sqrt(-2 ln U1) cos(2 pi U2)``, ``U1 = (top24(w1) + 1) / 2**24`` in (0, 1],
    ``U2 = top24(w2) / 2**24`` in [0, 1), both exact in fp32.  The fp32 log, cos and sqrt
    are the device's own, so results agree across devices only up to their last bits."""
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    kept = ~(torch.isfinite(amax) & (amax > 0))
    span = blocks.amax(dim=-1, keepdim=True) - blocks.amin(dim=-1, keepdim=True)
    # a correctly rounded quotient on every device (CUDA divides by a Python number as a
    # product with its reciprocal)
    step = quotient(span, float(2**sampler.target.bits - 1), span)
    top = (words >> (WORD_BITS - _UNIFORM_BITS)).to(torch.float32)
    first = (top[..., 0] + 1.0) * 2.0**-_UNIFORM_BITS
    second = top[..., 1] * 2.0**-_UNIFORM_BITS
    normal = torch.sqrt(-2.0 * torch.log(first)) * torch.cos((2.0 * math.pi) * second)
    noise = (normal * 0.5) * step
    return torch.where(kept, torch.zeros_like(noise), noise), kept


def sample_resolved(
    w: Tensor, sampler: Sampler, seed: int | Tensor, offset: int | Tensor, index_offset: int
) -> Tensor:
    """The PyTorch path of `sample_weight_torch` for a checked `Sampler` (no gradient)."""
    length = block_length(w, sampler.block)
    if sampler.noise == "sr":
        assert sampler.block_format is not None  # made with noise "sr"
        return fake_quantize(
            w.detach(),
            sampler.block_format,
            "sr",
            seed=seed,
            offset=offset,
            index_offset=index_offset,
            backend="torch",
        )
    w32 = w.detach().to(torch.float32)
    blocks = _block_view(w32, length)
    if sampler.noise == "gaussws":
        rounded = _rounded_draws(w32, sampler, seed, offset, index_offset)
        noise, kept = _gaussws_noise(blocks, sampler, rounded)
    else:
        # element i draws the words of indices 2i and 2i + 1 (a view shaped for them)
        pairs = w32.unsqueeze(-1).expand(*w32.shape, 2)
        words = random_words_like(pairs, seed, offset, 2 * index_offset)
        noise, kept = _diffq_noise(blocks, sampler, words.reshape(*blocks.shape, 2))
    sampled = (blocks + noise).to(w.dtype)
    # kept blocks unchanged bit for bit (-0 + 0 would give +0)
    return torch.where(kept, _block_view(w.detach(), length), sampled).reshape(w.shape)


def check_stream(seed: object, offset: object, index_offset: object) -> int:
    """Checks the stream's arguments (`stochround.random.check_seed`); the index offset."""
    check_seed(seed, "seed")
    check_seed(offset, "offset")
    return check_index_offset(index_offset)


def sample_weight_torch(
    w: Tensor,
    fmt: str | Format,
    *,
    block: int | None = 32,
    noise: str = "gaussws",
    noise_bits: int = 32,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int = 0,
) -> Tensor:
    """The sampled weight ``w~ = cast_to_w_dtype(fp32(w) + fp32(R) * u)`` on the PyTorch path
    (the executable definition; module docstring), no gradient.

    Args:
        w: a float32, bfloat16 or float16 tensor (>= 1 dim), blocks along its last axis.
        fmt: the target element format (`stochround.Format` or its name: "e3m2", "e2m3",
            "e4m3fn", "e5m2", "e2m1", ...).
        block: the block length, dividing w's last dimension; None: the whole axis.
        noise: "gaussws" (rounded Gaussian at the target's spacing), "diffq" (DiffQ's
            unrounded Gaussian at the block's (max - min) / (2**bits - 1)) or "sr" (SR
            fake quantization to the block format).
        noise_bits: 1..32: the random bits of R's table lookup ("gaussws" only).
        seed, offset: the stream, ints in [0, 2**64) or 0-d int64 tensors.
        index_offset: the global index of w's first element (a shard's start).

    Returns a tensor of w's shape and dtype.
    """
    w = check_weight(w)
    index_offset = check_stream(seed, offset, index_offset)
    sampler = make_sampler(fmt, block, noise, noise_bits)
    return sample_resolved(w, sampler, seed, offset, index_offset)


__all__ = [
    "Sampler",
    "block_length",
    "check_stream",
    "check_weight",
    "make_sampler",
    "sample_resolved",
]
