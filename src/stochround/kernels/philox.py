"""Triton twins of :mod:`stochround.random`: bit-identical random words inside kernels.

Device functions for rounding kernels (all words are uint32):

- ``random_word(seed, offset, index)``: the word of each global element index;
- ``four_words(seed, offset, group)``: the four words of elements ``4*group .. 4*group+3``
  from one Philox call (the efficient form: one call serves four elements);
- ``data_word(bits, index)``: the data-derived word of :func:`stochround.random.data_words`;
- ``philox4x32_10(c0, c1, c2, c3, k0, k1)``: the generator itself, ``tl.philox``'s function
  computed with one 32 x 32 -> 64-bit multiply per product, where ``tl.philox`` issues a
  separate high and low multiply for each.

The mapping is the one in :mod:`stochround.random`: counter ``(g mod 2**32, g >> 32,
offset mod 2**32, offset >> 32)`` with ``g = index >> 2``, key ``(seed mod 2**32,
seed >> 32)``, word = output ``index & 3`` of Philox4x32-10 (as ``tl.philox`` computes
it). ``seed`` and ``offset`` may be any integer scalars holding values in ``[0, 2**64)``
(int32, uint32, int64 or uint64, a kernel argument or a value loaded from a device
tensor); ``index`` and ``group`` are integer tensors (read as unsigned 64-bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language import core as triton_core  # to_tensor; a global so the interpreter patches it

from .. import random as _random
from ..random import bit_pattern, check_index, seed_tensor
from .grid import cdiv

__all__ = [
    "data_word",
    "data_words_triton",
    "four_words",
    "philox4x32_10",
    "random_word",
    "random_words_triton",
]


@triton.jit
def to_u64(value):
    """``value`` as uint64 (a value cast, not a bitcast: same-width casts keep the bits, and
    the interpreter stores kernel arguments in [2**31, 2**32) as uint32 data typed int64,
    which a bitcast rejects). Signed inputs are meaningful only when non-negative or 64-bit.
    """
    return triton_core.to_tensor(value).to(tl.uint64)


# the generator's constants, as constexprs a kernel can read
ROUND_A = tl.constexpr(_random.PHILOX_ROUND_A)
ROUND_B = tl.constexpr(_random.PHILOX_ROUND_B)
KEY_A = tl.constexpr(_random.PHILOX_KEY_A)
KEY_B = tl.constexpr(_random.PHILOX_KEY_B)


@triton.jit
def _mul_high_low(word, FACTOR: tl.constexpr):
    """High and low uint32 halves of the exact 64-bit product ``word * FACTOR`` (uint32
    ``word``): one 32 x 32 -> 64-bit multiply."""
    product = word.to(tl.uint64) * FACTOR
    return (product >> 32).to(tl.uint32), product.to(tl.uint32)


@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of uint32 counter ``(c0, c1, c2, c3)`` and uint32 key ``(k0, k1)``, the
    rounds of `stochround.random.philox4x32` (and of ``tl.philox``), bit for bit."""
    for _ in tl.static_range(10):
        high_b, low_b = _mul_high_low(c2, ROUND_B)
        high_a, low_a = _mul_high_low(c0, ROUND_A)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0 = tl.add(k0, KEY_A, sanitize_overflow=False)
        k1 = tl.add(k1, KEY_B, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def four_words(seed, offset, group):
    """The four uint32 words of elements ``4*group + lane`` (lane 0..3) in stream
    ``(seed, offset)``: ``philox4x32_10((group mod 2**32, group >> 32, offset mod 2**32,
    offset >> 32), (seed mod 2**32, seed >> 32))``."""
    seed = to_u64(seed)
    offset = to_u64(offset)
    group = to_u64(group)
    group_low = group.to(tl.uint32)
    group_high = (group >> 32).to(tl.uint32)
    offset_low = offset.to(tl.uint32)
    offset_high = (offset >> 32).to(tl.uint32)
    # broadcast the scalar counters to the block so all four counters share one shape
    zero = group_low * 0
    key_low = seed.to(tl.uint32)
    key_high = (seed >> 32).to(tl.uint32)
    return philox4x32_10(
        group_low, group_high, zero + offset_low, zero + offset_high, key_low, key_high
    )


@triton.jit
def random_word(seed, offset, index):
    """The uint32 word of each global element ``index`` in stream ``(seed, offset)``:
    output ``index & 3`` of ``four_words(seed, offset, index >> 2)``."""
    index = to_u64(index)
    word0, word1, word2, word3 = four_words(seed, offset, index >> 2)
    lane = (index & 3).to(tl.uint32)
    return tl.where(lane == 0, word0, tl.where(lane == 1, word1, tl.where(lane == 2, word2, word3)))


@triton.jit
def _fmix32(h):
    """murmur3's 32-bit finalizer on uint32 (multiplications wrap modulo 2**32)."""
    h = h ^ (h >> 16)
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h = h ^ (h >> 13)
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    return h ^ (h >> 16)


@triton.jit
def _fold_halves(value):
    """``low ^ (high * 0x27D4EB2F)`` over the 32-bit halves of an unsigned pattern, as uint32;
    the high half is statically zero for types of at most 32 bits."""
    value = triton_core.to_tensor(value)
    width: tl.constexpr = value.dtype.primitive_bitwidth
    # floats are bitcast; integers get a same-width value cast, which keeps the bits
    bitcast: tl.constexpr = value.dtype.is_floating()
    if width == 8:
        value = value.to(tl.uint8, bitcast=bitcast)
    elif width == 16:
        value = value.to(tl.uint16, bitcast=bitcast)
    elif width == 32:
        value = value.to(tl.uint32, bitcast=bitcast)
    else:
        value = value.to(tl.uint64, bitcast=bitcast)
    if width == 64:
        low = value.to(tl.uint32)
        high = (value >> 32).to(tl.uint32)
        return low ^ tl.mul(high, 0x27D4EB2F, sanitize_overflow=False)
    else:
        return value.to(tl.uint32)


@triton.jit
def data_word(bits, index):
    """Data-derived uint32 word of value ``bits`` (raw pattern: an integer type read as
    unsigned of its width, or a floating type reinterpreted) at global ``index``::

        u    = fmix32(i_lo ^ (i_hi * 0x27D4EB2F) ^ 0x9E3779B9)
        word = fmix32(fmix32(b_lo ^ (b_hi * 0x27D4EB2F) ^ u) ^ u)
    """
    index_hash = _fmix32(_fold_halves(index) ^ 0x9E3779B9)
    mixed = _fmix32(_fold_halves(bits) ^ index_hash)
    return _fmix32(mixed ^ index_hash)


# --------------------------------------------------------------------------------------
# launchers (used by tests to compare with the PyTorch path)
# --------------------------------------------------------------------------------------


@triton.jit
def _random_words_kernel(index_ptr, out_ptr, seed_ptr, offset_ptr, count, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    positions = start + tl.arange(0, BLOCK)
    in_range = positions < count
    index = tl.load(index_ptr + positions, mask=in_range, other=0)
    seed = tl.load(seed_ptr)
    offset = tl.load(offset_ptr)
    word = random_word(seed, offset, index)
    tl.store(out_ptr + positions, word.to(tl.int64), mask=in_range)


@triton.jit
def _data_words_kernel(bits_ptr, index_ptr, out_ptr, count, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    positions = start + tl.arange(0, BLOCK)
    in_range = positions < count
    bits = tl.load(bits_ptr + positions, mask=in_range, other=0)
    index = tl.load(index_ptr + positions, mask=in_range, other=0)
    tl.store(out_ptr + positions, data_word(bits, index).to(tl.int64), mask=in_range)


def random_words_triton(
    index: Tensor, seed: int | Tensor, offset: int | Tensor = 0, block: int = 1024
) -> Tensor:
    """``stochround.random.random_words(index, seed, offset)`` computed by a Triton kernel.

    Returns an int64 tensor shaped like ``index`` with values in ``[0, 2**32)``; ``block``
    is the number of elements each program computes (a power of two).
    """
    index = check_index(index)
    seed_value = seed_tensor(seed, "seed", index.device)
    offset_value = seed_tensor(offset, "offset", index.device)
    flat = index.contiguous().reshape(-1)
    out = torch.empty_like(flat)
    count = flat.numel()
    if count:
        grid = (cdiv(count, block),)
        _random_words_kernel[grid](flat, out, seed_value, offset_value, count, BLOCK=block)
    return out.reshape(index.shape)


def data_words_triton(bits: Tensor, index: Tensor, block: int = 1024) -> Tensor:
    """``stochround.random.data_words(bits, index)`` computed by a Triton kernel.

    ``bits`` keeps its dtype on the way in (the kernel reads the raw pattern itself);
    ``block`` is the number of elements each program computes (a power of two).
    """
    bit_pattern(bits)  # same argument checks as the PyTorch path
    index = check_index(index)
    bits, index = torch.broadcast_tensors(bits, index)
    bits = bits.contiguous().reshape(-1)
    flat_index = index.contiguous().reshape(-1)
    out = torch.empty_like(flat_index)
    count = flat_index.numel()
    if count:
        grid = (cdiv(count, block),)
        _data_words_kernel[grid](bits, flat_index, out, count, BLOCK=block)
    return out.reshape(index.shape)
