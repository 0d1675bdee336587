"""Gaussian weight sampling (GaussWS): pseudo-quantization training with rounded-Gaussian
noise at the target format's resolution (Ahn & Yoo, "Gaussian Weight Sampling for
Scalable, Efficient and Stable Pseudo-Quantization Training", arXiv 2505.11170).

Each training forward uses, instead of the high-precision weight ``w`` (a bf16 parameter:
2 bytes), a sampled weight::

    w~ = cast_to_w_dtype( fp32(w) + fp32(R) * u(w) )        R ~ round(N(0, 1) / 2)

where ``u(w)`` is the spacing (ulp) of the target element format (e3m2, e2m3, e4m3fn, e2m1,
...) at ``w``, the format's range taken relative to a power-of-two scale per block, and the
backward pass is straight through (dL/dw := dL/dw~).  The noise has the scale of the
target's rounding error and mean zero, so the model learns weights that tolerate the
target's resolution while the parameter itself keeps full bf16 precision; the paper calls
the effect of the noise, large for large weights and small for small ones, "stochastic
precision annealing".

The method, step by step (`sample_weight_torch`, the executable definition; the Triton
kernel `stochround.kernels.gaussws.gaussws_blocks` computes the same bits):

1. Blocks of ``block`` consecutive elements along the last axis (an `nn.Linear` weight's
   ``in_features``, the GEMM's contraction axis, as MX formats block it).  A block's
   ``amax = max |w|`` in fp32; a block whose amax is 0 or not finite is returned unchanged
   (no scale can be formed; NaN and infinities pass through, and zeros keep their sign).
2. The block scale ``s = 2**e``, ``e = floor(log2 amax) - emax`` (OCP MX's "floor" rule,
   ``emax`` the target's largest exponent), clamped to [-126, 127].
3. ``a = |w| / s``; ``u = 2**(ex - mbits) * s`` with ``ex = min(floor(log2 a), emax)`` where
   ``a >= 2**emin`` and ``ex = emin`` below (the target's subnormal spacing), ``mbits`` the
   target's mantissa bits.  ``u`` is a power of two, built from integer exponents (the fp32
   exponent field, subnormals included), never from a floating-point log; where ``2**k``
   lies below fp32's smallest subnormal ``2**-149`` it is 0 (no noise).
4. ``R`` from one 32-bit Philox word per element (`stochround.random.random_words` of the
   row-major element index plus ``index_offset``): its top ``noise_bits`` bits ``x`` (``word
   >> (32 - noise_bits)``) are compared with six integer thresholds (`gaussian_thresholds`),
   ``R = -3 + #{j : x >= T_j}``: an inverse-CDF table lookup, no transcendental function.
5. The sum ``fp32(w) + fp32(R) * u`` in fp32 (round to nearest even), then one cast to w's
   dtype (round to nearest even): bf16 parameters give bf16 sampled weights.

The distribution of R, exactly: with ``n = noise_bits``, ``p_k = Phi(2k+1) - Phi(2k-1)`` (the
probability that ``N(0,1)/2`` rounds to ``k``), the counts ``c_k = round(2**n p_k)`` for
``k = 1, 2, 3``, ``c_-k = c_k`` and ``c_0 = 2**n - 2 (c_1 + c_2 + c_3)``, the thresholds are
the cumulative counts from ``k = -3``, and ``P(R = k) = c_k / 2**n`` exactly for every
``k`` in -3..3 (an equal share of the ``2**n`` values of ``x`` for each count).  So
``|P(R = k) - p_k| <= 2**-(n+1)`` for ``k != 0``, ``|P(R = 0) - p_0| <= 3 * 2**-n + P(|R| >= 4)``
(``c_0`` takes every rounding error and the tail), and ``P(R = k) = P(R = -k)``: ``E[R] = 0``
exactly.  ``R``'s support is -3..3: ``P(|round(N/2)| >= 4) = 2 (1 - Phi(7))`` is below half
a count even at ``n = 32`` (``2**32 * 2 (1 - Phi(7)) < 1/2``), so a table could not hold it;
``c_0`` absorbs it.  Fewer bits lose the rare values first: ``c_3 = 0`` for ``n < 21``,
``c_2 = 0`` for ``n < 9``, and at ``n = 1`` R is always 0.

Unbiasedness: ``E[w~] = w`` exactly wherever every ``w + k u`` with ``c_k > 0`` is
representable in w's dtype (then the fp32 sum and the cast are exact, and ``E[R] = 0``).
For a target with at most as many mantissa bits as w's dtype (every fp8, fp6 and fp4
format for bf16 weights), ``u`` is a multiple of w's ulp: ``u = 2**(floor(log2 |w|) -
mbits)`` in the target's normal range, more in its subnormal range.  So every ``w + k u`` is
a multiple of w's ulp, and it fails to be representable, leaving ``E[w~]`` off by rounding
errors, only where (a) ``|w + k u|`` reaches a higher binade of w's dtype at an odd
multiple of w's ulp (a tie there, rounded to even), (b) ``w + k u`` overflows w's dtype,
(c) the sum needs more bits than fp32 or w's dtype holds (an element far below ``u`` in the
target's subnormal range, whose fp32 sum rounds first; fp16 subnormals), or (d) ``u``
underflows to 0 in fp32 (no noise: ``w~ = w``, unbiased trivially).

The decisions, where the paper's text leaves a detail open, and why:

* ``u`` is the ulp of the target format at ``w`` (the grid's spacing, a power of two), so
  ``R u`` moves ``w`` by whole grid steps of the target: the paper scales a rounded Gaussian
  to the format's resolution so that "one addition and a floating-point cast" apply it;
  a power-of-two ``u`` makes ``R u`` exact in fp32 and the sum exact in most cases.
* A power-of-two scale per block of 32 (OCP MX's rule and block size), so that FP6 and FP4
  targets, whose range is tiny, describe the spacing of a block-scaled MX tensor; ``block``
  is a parameter (None: one scale per row).
* The sum in fp32, one cast to w's dtype: the paper's BF16 operators take the sampled
  weight in bf16, and one rounding of the exact-in-fp32 sum keeps it unbiased (above).
* ``noise_bits = 32`` by default (one Philox word, the finest table); fewer bits are a
  parameter (the paper speaks of "up to 9-bit noise" with BF16 operators); the table's
  exactness at every ``n`` is stated above.
* Blocks whose amax is 0 or not finite pass through unchanged, as a quantizer cannot scale
  them: NaN and infinities stay, and an all-zero block stays zero (not noise).
* The backward pass is straight through: the sampled weight stands for the weight.
* Inference uses the weights themselves: `GaussWS` returns ``w`` unchanged in eval mode and
  under ``torch.no_grad``: the noise is a training device, ``w`` is the sampled weights'
  mean, and a deployed model quantizes its weights by a rounding of its own.
* Random bits: `GaussWS` draws with the key ``stream_key(seed, StreamDomain.GAUSSWS)``
  (`stochround.random`: GaussWS's own domain, so a layer both quantized and sampled, or an
  optimizer given the same seed, draws distinct words) at the stream offset
  ``stochround.nn.linear.stream_offset(step, layer_index, GAUSSWS_SLOT)`` from the layer's
  ``step`` buffer and ``layer_index``, so each step draws fresh words; torch's global
  generator is never used.  The functions (`sample_weight`, `sample_weight_torch`) take
  the stream ``(seed, offset)`` as given, as `stochround.round` does.

Two other ``noise=`` choices, so that experiments compare them (PyTorch path only unless
said): ``"diffq"`` (DiffQ, Défossez et al.: unrounded Gaussian noise ``w + (N(0,1)/2) *
(max - min) / (2**b - 1)`` per block, ``b`` the target's bits; ``N`` by Box-Muller from the
words of indices ``2i`` and ``2i + 1``, element ``i``'s global index; reproducible on one
device, its log and cos the device's own) and ``"sr"`` (SR fake
quantization: `stochround.blocks.fake_quantize` into blocks of ``block`` target elements
with an E8M0 scale, rule "floor", mode "sr", the same stream; the Triton kernel serves it
where `fake_quantize`'s routing takes it).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ..blocks.formats import BlockFormat
from ..blocks.quantize import fake_quantize
from ..blocks.scales import quotient
from ..formats import Format
from ..formats import format as find_format
from ..kernels.availability import check_backend, kernels_refusal
from ..random import (
    StreamDomain,
    check_index_offset,
    check_seed,
    random_words_like,
    seed_tensor,
    stream_key,
)
from ..reference import WORD_BITS, check_choice
from .linear import (
    MAX_LAYERS,
    advance_step,
    advance_step_eagerly,
    next_layer_index,
    stream_offset,
)

NOISES = ("gaussws", "diffq", "sr")
SAMPLED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# the stream slot of the sampled weight (`stream_offset`); the domain (`StreamDomain.GAUSSWS`)
# is what keeps its words apart from QuantizedLinear's, the slot only keeps the offsets of
# earlier releases
GAUSSWS_SLOT = 12

MAX_ROUNDED = 3  # R's support is -3..3: |round(N/2)| >= 4 has less than one count at n = 32

# the fp32 exponent field and the block scale's clamp (the spec's [-126, 127])
FP32_MANTISSA_BITS = 23
FP32_BIAS = 127
FP32_SUBNORMAL_EXPONENT = -149
SCALE_MIN_EXPONENT = -126
SCALE_MAX_EXPONENT = 127

# Box-Muller's uniforms take the top 24 bits of a word: exact in fp32
UNIFORM_BITS = 24


def normal_probability(k: int) -> float:
    """``p_k = Phi(2k+1) - Phi(2k-1)``: the probability that ``N(0,1)/2`` rounds (to nearest)
    to ``k``, in float64 from `math.erf`."""

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    return phi(2 * k + 1) - phi(2 * k - 1)


def check_noise_bits(noise_bits: object) -> int:
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
    return count_table(check_noise_bits(noise_bits))


def gaussian_thresholds(noise_bits: int) -> tuple[int, ...]:
    """The six thresholds ``T_1 .. T_6`` of the table lookup ``R = -3 + #{j : x >= T_j}``
    (``x`` in ``[0, 2**noise_bits)``): the cumulative counts ``T_j = c_-3 + ... + c_(j-4)``
    (`gaussian_counts`), so that ``P(R = k) = c_k / 2**noise_bits`` exactly.  ``noise_bits``:
    an int in 1..32."""
    return threshold_table(check_noise_bits(noise_bits))


@functools.cache  # of checked ints only: a bool or float argument would share a cache entry
def count_table(noise_bits: int) -> tuple[int, ...]:
    """`gaussian_counts` of a checked ``noise_bits``."""
    # floor(v + 1/2): p_k is irrational, so 2**n p_k is never a tie
    scale = 2**noise_bits
    tails = [math.floor(scale * normal_probability(k) + 0.5) for k in range(1, MAX_ROUNDED + 1)]
    middle = scale - 2 * sum(tails)
    return (*tails[::-1], middle, *tails)


@functools.cache
def threshold_table(noise_bits: int) -> tuple[int, ...]:
    """`gaussian_thresholds` of a checked ``noise_bits``."""
    return tuple(itertools.accumulate(count_table(noise_bits)[:-1]))


def rounded_gaussian(words: Tensor, noise_bits: int) -> Tensor:
    """``R = -3 + #{j : x >= T_j}`` (int8, in -3..3) for ``words`` holding ``x``: random
    integers in ``[0, 2**noise_bits)`` (a word already shifted, ``word >> (32 -
    noise_bits)``), an integer tensor; the thresholds are `gaussian_thresholds`'."""
    if not isinstance(words, Tensor):
        raise TypeError(f"words must be an integer tensor, got {type(words).__name__}")
    if words.dtype == torch.bool or words.dtype.is_floating_point or words.dtype.is_complex:
        raise TypeError(f"words must be an integer tensor, got a {words.dtype} tensor")
    thresholds = gaussian_thresholds(check_noise_bits(noise_bits))
    return count_thresholds(words, thresholds)


def count_thresholds(words: Tensor, thresholds: tuple[int, ...]) -> Tensor:
    """``-3 + #{j : words >= thresholds[j]}`` as int8 (no checks)."""
    rounded = torch.full(words.shape, -MAX_ROUNDED, dtype=torch.int8, device=words.device)
    for threshold in thresholds:
        rounded = rounded + (words >= threshold).to(torch.int8)
    return rounded


class Target(NamedTuple):
    """The target element format's numbers the sampling reads, as plain ints (a `Format`'s
    cached properties take a lock that torch.compile cannot trace)."""

    format: Format
    emin: int
    emax: int
    mbits: int
    bits: int


def resolve_target(fmt: object) -> Target:
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
    if w.dtype not in SAMPLED_DTYPES:
        raise TypeError(f"w must be a float32, bfloat16 or float16 tensor, got {w.dtype}")
    if w.dim() < 1:
        raise ValueError("w must have at least one dimension (blocks run along the last)")
    return w


def check_noise_block(block: object) -> int | None:
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
    field = bits >> FP32_MANTISSA_BITS
    mantissa = bits & ((1 << FP32_MANTISSA_BITS) - 1)
    mantissa_field = mantissa.to(torch.float32).view(torch.int32) >> FP32_MANTISSA_BITS
    subnormal = mantissa_field - FP32_BIAS + FP32_SUBNORMAL_EXPONENT
    return torch.where(field == 0, subnormal, field - FP32_BIAS)


def power_of_two(exponent: Tensor) -> Tensor:
    """``2**k`` in fp32 for int32 exponents ``k <= 127``, built from bits: normal for ``k >=
    -126``, subnormal for ``-149 <= k < -126``, 0 below (fp32 holds no smaller power)."""
    normal = ((exponent + FP32_BIAS).clamp(min=1) << FP32_MANTISSA_BITS).view(torch.float32)
    shift = (exponent - FP32_SUBNORMAL_EXPONENT).clamp(0, FP32_MANTISSA_BITS - 1)
    subnormal = (torch.ones_like(exponent) << shift).view(torch.float32)
    small = torch.where(exponent >= FP32_SUBNORMAL_EXPONENT, subnormal, torch.zeros_like(normal))
    return torch.where(exponent >= 1 - FP32_BIAS, normal, small)


def block_view(w32: Tensor, length: int) -> Tensor:
    """``w32`` (fp32) as ``(..., blocks, length)``."""
    return w32.reshape(*w32.shape[:-1], w32.shape[-1] // length, length)


def spacing_of_blocks(blocks: Tensor, target: Target) -> tuple[Tensor, Tensor]:
    """``(u, kept)`` for fp32 ``blocks`` shaped ``(..., blocks, length)``: the spacing ``u``
    (fp32, steps 1-3 of the module docstring; 0 in kept blocks) and the per-block mask of
    the blocks left unchanged (amax 0 or not finite), shaped ``(..., blocks, 1)``."""
    magnitude = blocks.abs()
    amax = magnitude.amax(dim=-1, keepdim=True)
    kept = ~(torch.isfinite(amax) & (amax > 0))
    safe_amax = torch.where(kept, torch.ones_like(amax), amax)
    scale = (floor_log2_bits(safe_amax) - target.emax).clamp(SCALE_MIN_EXPONENT, SCALE_MAX_EXPONENT)
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
    target = resolve_target(fmt)
    length = block_length(w, check_noise_block(block))
    u, _ = spacing_of_blocks(block_view(w.to(torch.float32), length), target)
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
    target = resolve_target(fmt)
    block = check_noise_block(block)
    check_choice("noise", noise, NOISES)
    bits = check_noise_bits(noise_bits)
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


def gaussws_noise(blocks: Tensor, sampler: Sampler, words: Tensor) -> tuple[Tensor, Tensor]:
    """``(R * u, kept)`` for fp32 ``blocks`` ``(..., blocks, length)`` and their words."""
    u, kept = spacing_of_blocks(blocks, sampler.target)
    shifted = words >> (WORD_BITS - sampler.noise_bits)
    rounded = count_thresholds(shifted.reshape(blocks.shape), sampler.thresholds)
    return rounded.to(torch.float32) * u, kept


def diffq_noise(blocks: Tensor, sampler: Sampler, words: Tensor) -> tuple[Tensor, Tensor]:
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
    top = (words >> (WORD_BITS - UNIFORM_BITS)).to(torch.float32)
    first = (top[..., 0] + 1.0) * 2.0**-UNIFORM_BITS
    second = top[..., 1] * 2.0**-UNIFORM_BITS
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
    blocks = block_view(w32, length)
    if sampler.noise == "gaussws":
        words = random_words_like(w32, seed, offset, index_offset)
        noise, kept = gaussws_noise(blocks, sampler, words)
    else:
        # element i draws the words of indices 2i and 2i + 1 (a view shaped for them)
        pairs = w32.unsqueeze(-1).expand(*w32.shape, 2)
        words = random_words_like(pairs, seed, offset, 2 * index_offset)
        noise, kept = diffq_noise(blocks, sampler, words.reshape(*blocks.shape, 2))
    sampled = (blocks + noise).to(w.dtype)
    # kept blocks unchanged bit for bit (-0 + 0 would give +0)
    return torch.where(kept, block_view(w.detach(), length), sampled).reshape(w.shape)


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


def kernel_refusal(w: Tensor, sampler: Sampler) -> str | None:
    """Why the GaussWS Triton kernel cannot serve a call (None if it can)."""
    if sampler.noise != "gaussws":
        return f"noise={sampler.noise!r} runs on the PyTorch path (the kernel draws 'gaussws')"
    return kernels_refusal("w", w.is_cuda)


def sample_with_backend(
    w: Tensor,
    sampler: Sampler,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int,
    backend: str,
) -> Tensor:
    """`sample_resolved` or the Triton kernel, as ``backend`` routes it: "auto" takes the
    kernel for CUDA tensors it serves where Triton runs, "triton" takes it or raises
    ValueError saying why not, "torch" never."""
    if sampler.noise == "sr":  # fake_quantize routes its own kernel
        assert sampler.block_format is not None
        return fake_quantize(
            w.detach(),
            sampler.block_format,
            "sr",
            seed=seed,
            offset=offset,
            index_offset=index_offset,
            backend=backend,
        )
    if backend == "torch" or (backend == "auto" and not w.is_cuda):
        return sample_resolved(w, sampler, seed, offset, index_offset)
    refusal = kernel_refusal(w, sampler)
    if backend == "auto" and refusal is not None:
        return sample_resolved(w, sampler, seed, offset, index_offset)
    if refusal is not None:
        raise ValueError(f"backend='triton' cannot run: {refusal}; use backend='torch' or 'auto'")
    from ..kernels.gaussws import gaussws_blocks  # the kernel module imports Triton

    length = block_length(w, sampler.block)
    rows = w.detach().reshape(-1, w.shape[-1]).contiguous()
    sampled = gaussws_blocks(
        rows,
        sampler.target.format,
        length,
        sampler.thresholds,
        sampler.noise_bits,
        seed,
        offset,
        index_offset,
    )
    return typing.cast(Tensor, sampled).reshape(w.shape)


class StraightThroughSample(torch.autograd.Function):
    """The sampled weight forward, the identity backward (d w~ / d w := 1)."""

    @staticmethod
    def forward(
        ctx: Any,
        w: Tensor,
        sampler: Sampler,
        seed: int | Tensor,
        offset: int | Tensor,
        index_offset: int,
        backend: str,
    ) -> Tensor:
        return sample_with_backend(w, sampler, seed, offset, index_offset, backend)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None, None, None, None, None


class PreparedStraightThrough(torch.autograd.Function):
    """A prepared kernel launch's sample with a straight-through gradient (`GaussWS`'s
    eager kernel path)."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, prepared: Any, seed: Tensor, offset: Tensor) -> Tensor:
        return typing.cast(Tensor, prepared(w, seed, offset))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None, None, None


def sample_weight(
    w: Tensor,
    fmt: str | Format,
    *,
    block: int | None = 32,
    noise: str = "gaussws",
    noise_bits: int = 32,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int = 0,
    backend: str = "auto",
) -> Tensor:
    """`sample_weight_torch`'s sampled weight with a straight-through gradient (dL/dw :=
    dL/dw~), computed by the Triton kernel (`stochround.kernels.gaussws`) or the PyTorch
    path, bit for bit alike.  The arguments as in `sample_weight_torch`; ``backend``:
    "auto" (the kernel for CUDA tensors with ``noise="gaussws"``, where Triton runs),
    "torch" or "triton" (the kernel, or ValueError saying why it cannot run).  ``noise="sr"``
    passes ``backend`` to `stochround.blocks.fake_quantize`."""
    w = check_weight(w)
    index_offset = check_stream(seed, offset, index_offset)
    check_backend(backend)
    sampler = make_sampler(fmt, block, noise, noise_bits)
    block_length(w, sampler.block)
    out = StraightThroughSample.apply(w, sampler, seed, offset, index_offset, backend)
    return typing.cast(Tensor, out)


class GaussWS(nn.Module):
    """A parametrization (`torch.nn.utils.parametrize`) that samples a weight at every
    training forward: ``w -> sample_weight(w, fmt, ..., seed=key, offset=...)`` with the key
    ``stream_key(seed, StreamDomain.GAUSSWS)`` and the stream offset
    ``stream_offset(step, layer_index, GAUSSWS_SLOT)`` (module docstring).

    Args:
        fmt: the target element format (`stochround.Format` or its name), default "e3m2".
        block: the block length along the weight's last axis (None: the whole axis).
        noise: "gaussws", "diffq" or "sr" (`sample_weight_torch`).
        noise_bits: 1..32, R's random bits.
        seed: the stream's seed, an int in [0, 2**64).
        layer_index: the layer's number in its model, in [0, 2**28): its stream.
        backend: "auto", "torch" or "triton" (`sample_weight`).

    The buffer ``step`` (0-d int64, in the ``state_dict``) counts the training forwards
    made under grad mode and advances by one at each, so every step draws fresh words and a
    run resumes bit-exactly from a checkpoint.  In eval mode or under ``torch.no_grad`` the
    weight is returned unchanged and the step stays: inference uses the weights themselves.
    """

    step: Tensor
    sampler: Sampler
    seed: int
    key: int
    layer_index: int
    backend: str

    def __init__(
        self,
        fmt: str | Format = "e3m2",
        block: int | None = 32,
        noise: str = "gaussws",
        noise_bits: int = 32,
        seed: int = 0,
        layer_index: int = 0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.sampler = make_sampler(fmt, block, noise, noise_bits)
        if isinstance(seed, Tensor):
            raise TypeError("seed must be an int in [0, 2**64), got a tensor")
        self.seed = int(check_seed(seed, "seed"))
        # the Philox key the samples draw with (the seed in GaussWS's domain), mixed once
        self.key = int(stream_key(self.seed, StreamDomain.GAUSSWS))
        if isinstance(layer_index, bool) or not isinstance(layer_index, numbers.Integral):
            raise TypeError(f"layer_index must be an int, got {type(layer_index).__name__}")
        if not 0 <= layer_index < MAX_LAYERS:
            raise ValueError(f"layer_index must be in [0, 2**28), got {layer_index}")
        self.layer_index = int(layer_index)
        self.backend = check_backend(backend)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        # the eager kernel path's launch and seed tensors (not state: remade on demand)
        self.prepared: Any = None
        self.seeds: dict[torch.device, Tensor] = {}

    def settings(self) -> tuple[Sampler, int, str]:
        """What the sampling draws, all but the layer's stream: the `Sampler` (target,
        block, noise, its bits), the seed and the backend; `gaussws_` compares them."""
        return self.sampler, self.seed, self.backend

    def check_weight(self, w: Tensor) -> None:
        """ValueError/TypeError unless ``w`` can be sampled (dtype, blocks fitting)."""
        block_length(check_weight(w), self.sampler.block)

    def forward(self, w: Tensor) -> Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return w
        if torch.compiler.is_compiling():
            # one op reads and advances the step, so that the compiled graphs read it once
            step = advance_step(self.step)
        else:
            step = advance_step_eagerly(self.step)
        offset = stream_offset(step, self.layer_index, GAUSSWS_SLOT)
        prepared = None if torch.compiler.is_compiling() else self.prepared_for(w)
        if prepared is not None:
            seed = self.seed_on(w.device)
            out = PreparedStraightThrough.apply(w, prepared, seed, typing.cast(Tensor, offset))
        else:
            out = StraightThroughSample.apply(w, self.sampler, self.key, offset, 0, self.backend)
        return typing.cast(Tensor, out)

    def prepared_for(self, w: Tensor) -> Any:
        """The kernel's launch prepared for ``w`` (`stochround.kernels.gaussws.
        PreparedSample`, made at the first call and again when w's shape, dtype or device
        changes), where an eager call takes the kernel: noise "gaussws", a contiguous 2-D
        weight, on CUDA with backend "auto" or "triton" (or on the CPU under Triton's
        interpreter with "triton"); else None.  It skips the functional path's checks and
        launch set-up, a host cost every sampled layer would pay at every step; the bits
        are the same."""
        if self.sampler.noise != "gaussws" or w.dim() != 2 or not w.is_contiguous():
            return None
        cuda = w.is_cuda and self.backend in ("auto", "triton")
        if not (cuda or self.backend == "triton") or kernel_refusal(w, self.sampler):
            return None
        if self.prepared is None or not self.prepared.matches(w):
            from ..kernels.gaussws import PreparedSample  # the kernel module imports Triton

            sampler = self.sampler
            block = w.shape[-1] if sampler.block is None else sampler.block
            self.prepared = PreparedSample(
                w, sampler.target.format, block, sampler.thresholds, sampler.noise_bits
            )
        return self.prepared

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the prepared launch and seed tensors (remade on
        demand): copies and pickles carry no compiled kernel."""
        state = dict(self.__dict__)
        state["prepared"] = None
        state["seeds"] = {}
        return state

    def seed_on(self, device: torch.device) -> Tensor:
        """The key (`GaussWS.key`) as the one-element int64 tensor the kernel reads, made
        once a device."""
        if device not in self.seeds:
            self.seeds[device] = seed_tensor(self.key, "seed", device)
        return self.seeds[device]

    def extra_repr(self) -> str:
        sampler = self.sampler
        return (
            f"fmt={sampler.target.format.name}, block={sampler.block}, noise={sampler.noise}, "
            f"noise_bits={sampler.noise_bits}, seed={self.seed}, layer_index={self.layer_index}"
        )


def sampling_of(module: nn.Module) -> GaussWS | None:
    """The `GaussWS` parametrization of ``module``'s weight, or None."""
    if not parametrize.is_parametrized(module, "weight"):
        return None
    parametrizations = module.parametrizations["weight"]  # type: ignore[index, union-attr]
    found = [each for each in parametrizations if isinstance(each, GaussWS)]
    return found[0] if found else None


def check_resampling(path: str, module: nn.Module, wanted: tuple[Sampler, int, str]) -> None:
    """ValueError if ``module``'s weight is sampled by a `GaussWS` whose settings are not
    ``wanted`` (a second `gaussws_` call asking for other ones), or has a parametrization
    of another kind (which sampling would silently skip or stack on)."""
    sampling = sampling_of(module)
    if sampling is None:
        kinds = [type(each).__name__ for each in module.parametrizations["weight"]]  # type: ignore[index, union-attr]
        raise ValueError(
            f"gaussws_: {path or 'model'}'s weight has another parametrization "
            f"({', '.join(kinds)}); GaussWS samples plain weights: remove it first, or leave "
            "the layer out with filter_fn"
        )
    if sampling.settings() == wanted:
        return
    sampler, seed, backend = wanted
    asked = (
        f"fmt={sampler.target.format.name}, block={sampler.block}, noise={sampler.noise}, "
        f"noise_bits={sampler.noise_bits}, seed={seed}, backend={backend}"
    )
    raise ValueError(
        f"gaussws_: {path or 'model'} is already sampled by GaussWS({sampling.extra_repr()}, "
        f"backend={sampling.backend}), not the {asked} asked for; remove it first "
        "(stochround.nn.unquantize_) to sample with other settings"
    )


def gaussws_(
    model: nn.Module,
    fmt: str | Format = "e3m2",
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    block: int | None = 32,
    noise: str = "gaussws",
    noise_bits: int = 32,
    seed: int = 0,
    backend: str = "auto",
) -> nn.Module:
    """Register, in place, a `GaussWS` parametrization on the ``weight`` of each `nn.Linear`
    of ``model`` (`QuantizedLinear` included) that ``filter_fn`` keeps.

    Args:
        model: the model (an `nn.Linear` itself is parametrized too).
        fmt, block, noise, noise_bits, seed, backend: as `GaussWS`.
        filter_fn: torchao's filter, ``filter_fn(module, fqn) -> bool``; False leaves the
            layer as it is (None: every layer).

    The parametrized layers are numbered 0, 1, ... in ``model.named_modules()`` order (their
    ``layer_index``, which gives each its own stream), after those an earlier call
    numbered.  A layer already sampled by a
    `GaussWS` of the same settings (target, block, noise, noise bits, seed, backend) is
    left alone, so that a second call is harmless; one sampled with other settings raises
    ValueError naming both (`unquantize_` removes the first, to start again).  A layer whose
    weight has another parametrization raises ValueError naming it (``filter_fn`` can leave
    it out).  The ``out_proj`` of
    ``nn.MultiheadAttention``, whose weight the attention reads without calling the layer,
    is sampled all the same: a parametrization runs when the weight is read.  Every layer
    is checked (its weight's dtype and blocks) before the first is parametrized, so a layer
    that does not fit leaves the model untouched.  Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    wanted = GaussWS(fmt, block, noise, noise_bits, seed, 0, backend).settings()
    chosen = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if filter_fn is not None and not filter_fn(module, path):
            continue
        if parametrize.is_parametrized(module, "weight"):
            check_resampling(path, module, wanted)
            continue
        chosen.append((path, module))
    # numbered after the layers an earlier call sampled, whose streams they must not share
    first = next_layer_index(model, GaussWS)
    parametrizations = []
    for index, (path, module) in enumerate(chosen, start=first):
        sampling = GaussWS(fmt, block, noise, noise_bits, seed, index, backend)
        try:
            sampling.check_weight(module.weight)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{path or 'model'}: {error}") from None
        parametrizations.append((module, sampling.to(module.weight.device)))
    # registration evaluates the parametrization once: under no_grad it neither samples nor
    # advances the step
    with torch.no_grad():
        for module, sampling in parametrizations:
            parametrize.register_parametrization(module, "weight", sampling)
    return model


__all__ = [
    "GAUSSWS_SLOT",
    "NOISES",
    "GaussWS",
    "Sampler",
    "StraightThroughSample",
    "Target",
    "check_resampling",
    "check_weight",
    "gaussian_counts",
    "gaussian_thresholds",
    "gaussws_",
    "make_sampler",
    "noise_spacing",
    "normal_probability",
    "resolve_target",
    "rounded_gaussian",
    "sample_resolved",
    "sample_weight",
    "sample_weight_torch",
    "sampling_of",
]
