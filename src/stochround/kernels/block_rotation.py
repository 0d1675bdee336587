"""The block kernels' random Hadamard transform of a tile in registers (`@triton.jit`), the
fp32 butterfly of `stochround.blocks.hadamard`, and its checked host description
(`Rotation`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..block_constants import HADAMARD_SIZES, SQRT2_FP32
from .block_math import narrowed_value


class Rotation(NamedTuple):
    """A rotation as the kernels apply it: SIZE values a transform (0: none), LOG its log2,
    NORM its fp32 normalization (`rht_normalization`), BF16 whether the rotated values
    are rounded to bf16."""

    SIZE: int
    LOG: int
    NORM: float
    BF16: bool


NO_ROTATION = Rotation(SIZE=0, LOG=0, NORM=1.0, BF16=False)


def rht_normalization(size: int) -> float:
    """The fp32 normalization of a Hadamard transform of ``size`` values, as
    `stochround.blocks.hadamard.NORMALIZATION` holds it: 2**(-log2(size)/2), exact for even
    log2(size), else fp32(sqrt(2)) times a power of two."""
    log_size = size.bit_length() - 1
    if log_size % 2 == 0:
        return math.ldexp(1.0, -log_size // 2)
    return math.ldexp(SQRT2_FP32, -(log_size + 1) // 2)


def checked_rotation(
    x: Tensor, rht: int | None, signs: Tensor | None, rht_bf16: bool, tile: int
) -> tuple[Tensor | None, Rotation]:
    """The signs pointer and `Rotation` of a rotation of ``rht`` values (None: none), its
    arguments checked (ValueError naming them): ``rht`` one of `HADAMARD_SIZES` dividing
    x's rows and a kernel tile of ``tile`` elements, ``signs`` its fp32 ±1 signs on x's
    device."""
    if rht is None:
        if signs is not None or rht_bf16:
            raise ValueError("rht_signs and rht_bf16 apply with rht= (the Hadamard size)")
        return None, NO_ROTATION
    if rht not in HADAMARD_SIZES:
        raise ValueError(f"rht must be one of {', '.join(map(str, HADAMARD_SIZES))}; got {rht!r}")
    if x.shape[-1] % rht or tile % rht:
        raise ValueError(f"rht={rht} must divide x's rows ({x.shape[-1]}) and the kernel's tile")
    if (
        not isinstance(signs, Tensor)
        or signs.dtype != torch.float32
        or tuple(signs.shape) != (rht,)
        or signs.device != x.device
    ):
        raise ValueError(f"rht_signs must be a float32 tensor of {rht} signs on x's device")
    rotation = Rotation(
        SIZE=rht, LOG=rht.bit_length() - 1, NORM=rht_normalization(rht), BF16=bool(rht_bf16)
    )
    return signs, rotation


@triton.jit
def _butterfly_stage(v, H: tl.constexpr, N: tl.constexpr):
    """One butterfly stage on the flat fp32 tile ``v`` (N values): in each run of 2H
    consecutive values, the pair (a, b) = (v[j], v[j + H]) becomes (a + b, a - b)."""
    pairs = tl.permute(tl.reshape(v, (N // (2 * H), 2, H)), (0, 2, 1))
    a, b = tl.split(pairs)
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (N,))


@triton.jit
def _butterfly(v, LOG_SIZE: tl.constexpr, N: tl.constexpr):
    """The unnormalized fast Walsh-Hadamard transform of each run of 2**LOG_SIZE (16 ..
    256) consecutive values of the flat fp32 tile ``v`` (N values): stages h = 1, 2, 4, ...
    in order (`_butterfly_stage`), as `stochround.blocks.hadamard.hadamard_fp32` computes
    it (fp32 additions, no products)."""
    v = _butterfly_stage(v, 1, N)
    v = _butterfly_stage(v, 2, N)
    v = _butterfly_stage(v, 4, N)
    v = _butterfly_stage(v, 8, N)
    if LOG_SIZE > 4:
        v = _butterfly_stage(v, 16, N)
    if LOG_SIZE > 5:
        v = _butterfly_stage(v, 32, N)
    if LOG_SIZE > 6:
        v = _butterfly_stage(v, 64, N)
    if LOG_SIZE > 7:
        v = _butterfly_stage(v, 128, N)
    return v


@triton.jit
def rotated(value, signs_ptr, position, ROTATION: tl.constexpr, INVERSE: tl.constexpr):
    """The random Hadamard transform of each ROTATION.SIZE consecutive values of a [TILE,
    GROUPS, 4] fp32 tile of consecutive values of x (GROUPS * 4 a power of two, the size
    dividing the tile's size and x's rows): the signs (of flat ``position`` mod the size),
    the butterfly, the normalization; INVERSE: the butterfly, the normalization, then the
    signs."""
    shape: tl.constexpr = value.shape
    count: tl.constexpr = shape[0] * shape[1] * shape[2]
    LOG: tl.constexpr = ROTATION.LOG
    signs = tl.load(signs_ptr + position % ROTATION.SIZE)
    if not INVERSE:
        value = value * signs
    flat = _butterfly(tl.reshape(value, (count,)), LOG, count) * ROTATION.NORM
    value = tl.reshape(flat, (shape[0], shape[1], shape[2]))
    if INVERSE:
        value = value * signs
    return value


@triton.jit
def rotation_rounded(value, NAN16: tl.constexpr, X_DTYPE: tl.constexpr, ROTATION: tl.constexpr):
    """The rotated fp32 values as `stochround.blocks.reference` holds them: rounded to x's
    dtype (16-bit x: NAN16 its NaN), then to bf16 with ROTATION.BF16."""
    if NAN16 != 0:
        value = narrowed_value(value, X_DTYPE, NAN16)
    if ROTATION.BF16:
        value = narrowed_value(value, tl.bfloat16, 0x7FC0)
    return value


__all__ = [
    "NO_ROTATION",
    "Rotation",
    "checked_rotation",
    "rht_normalization",
    "rotated",
    "rotation_rounded",
]
