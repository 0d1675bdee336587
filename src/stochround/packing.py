"""Packing of narrow codes into bytes: two 4-bit codes a byte, four 6-bit codes in three.

Codes are packed along the last dimension, little-endian: 4-bit code ``2i`` in the low
nibble of byte ``i`` and code ``2i + 1`` in its high nibble; 6-bit codes ``4i .. 4i + 3``
at bits ``6j .. 6j + 5`` of the 24-bit little-endian group of bytes ``3i .. 3i + 2``.
"""

from __future__ import annotations

import torch
from torch import Tensor

# the packed outputs by code width: (output, codes a group of whole bytes holds)
PACKINGS = {4: ("fp4x2", 2), 6: ("fp6x4", 4)}

PACK_GROUPS = dict(PACKINGS.values())


def pack(codes: Tensor, bits: int) -> Tensor:
    """Pack 4-bit codes two per byte (first in the low nibble) or 6-bit codes four per three
    bytes (little-endian 24-bit groups: code i at bits 6i..6i+5), along the last dimension."""
    codes = _check_codes(codes, bits)
    group = PACKINGS[bits][1]
    if codes.shape[-1] % group:
        raise ValueError(
            f"the last dimension must be a multiple of {group} to pack {bits}-bit codes"
        )
    return pack_codes(codes, bits)


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """`pack` of codes known to be in range (an encoder's), whose last dimension is a
    multiple of the group: no checks, so no read of the values (a traced call)."""
    group = PACKINGS[bits][1]
    # sizes spelled out, not -1: a tensor with no elements has no size to infer
    groups = codes.shape[-1] // group
    grouped = codes.to(torch.int64).reshape(*codes.shape[:-1], groups, group)
    shifts = torch.arange(group, device=codes.device) * bits
    word = (grouped << shifts).sum(-1)
    nbytes = group * bits // 8
    byte_shifts = torch.arange(nbytes, device=codes.device) * 8
    packed = (word.unsqueeze(-1) >> byte_shifts) & 0xFF
    return packed.reshape(*codes.shape[:-1], groups * nbytes).to(torch.uint8)


def unpack(packed: Tensor, bits: int) -> Tensor:
    """Inverse of `pack`: uint8 codes, the last dimension grown back."""
    if not isinstance(packed, Tensor) or packed.dtype != torch.uint8:
        raise TypeError("packed must be a uint8 torch.Tensor")
    check_bits(bits)
    group = PACKINGS[bits][1]
    nbytes = group * bits // 8
    if packed.shape[-1] % nbytes:
        raise ValueError(f"the last dimension must be a multiple of {nbytes} to unpack")
    groups = packed.shape[-1] // nbytes  # spelled out: -1 fails for no elements
    grouped = packed.to(torch.int64).reshape(*packed.shape[:-1], groups, nbytes)
    word = (grouped << (torch.arange(nbytes, device=packed.device) * 8)).sum(-1)
    shifts = torch.arange(group, device=packed.device) * bits
    codes = (word.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], groups * group).to(torch.uint8)


def check_bits(bits: int) -> int:
    """bits, if it is a code width that packs (4 or 6); ValueError otherwise."""
    if bits not in PACKINGS:
        raise ValueError(f"bits must be 4 or 6; got {bits!r}")
    return bits


def _check_codes(codes: Tensor, bits: int) -> Tensor:
    """codes, if it is an integer tensor of values in [0, 2**bits)."""
    check_bits(bits)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**bits):
        raise ValueError(f"codes must be in [0, 2**{bits})")
    return codes


__all__ = ["PACKINGS", "PACK_GROUPS", "check_bits", "pack", "pack_codes", "unpack"]
