"""Tests for stochround.packing: 4-bit codes two a byte, 6-bit codes four in three bytes."""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround import packing


def test_public_names():
    assert sr.pack is packing.pack and sr.unpack is packing.unpack


@pytest.mark.parametrize("bits", [4, 6])
def test_pack_unpack_round_trip(bits):
    generator = torch.Generator().manual_seed(bits)
    for shape in [(4,), (3, 8), (2, 5, 12), (0,)]:
        codes = torch.randint(0, 2**bits, shape, generator=generator, dtype=torch.uint8)
        packed = packing.pack(codes, bits)
        assert packed.dtype == torch.uint8
        assert packed.shape == (*shape[:-1], shape[-1] * bits // 8)
        unpacked = packing.unpack(packed, bits)
        assert unpacked.dtype == torch.uint8
        assert torch.equal(unpacked, codes)
    every = torch.arange(2**bits, dtype=torch.int64)
    assert torch.equal(packing.unpack(packing.pack(every, bits), bits), every.to(torch.uint8))
    # every byte string unpacks to codes that pack back to it
    group_bytes = {4: 1, 6: 3}[bits]
    raw = torch.randint(0, 256, (64 * group_bytes,), generator=generator, dtype=torch.uint8)
    assert torch.equal(packing.pack(packing.unpack(raw, bits), bits), raw)


def test_pack_4_bit_layout():
    codes = torch.tensor([0x1, 0x2, 0xA, 0xB, 0xF, 0x0, 0x0, 0xC], dtype=torch.uint8)
    packed = packing.pack(codes, 4)
    assert packed.tolist() == [0x21, 0xBA, 0x0F, 0xC0]
    packed_bytes = torch.tensor([0x21, 0xBA, 0x0F, 0xC0], dtype=torch.uint8)
    assert packing.unpack(packed_bytes, 4).tolist() == [0x1, 0x2, 0xA, 0xB, 0xF, 0x0, 0x0, 0xC]
    two_rows = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
    assert packing.pack(two_rows, 4).tolist() == [[0x21], [0x43]]


def test_pack_6_bit_layout():
    # word = c0 | c1 << 6 | c2 << 12 | c3 << 18, stored little-endian in three bytes
    # [1, 2, 3, 4]: 1 + 128 + 12288 + 1048576 = 0x103081
    codes = [1, 2, 3, 4, 0x3F, 0, 0, 0, 0, 0, 0, 0x3F, 0, 0x3F, 0, 0]
    codes = torch.tensor(codes, dtype=torch.uint8)
    expected = [0x81, 0x30, 0x10, 0x3F, 0x00, 0x00, 0x00, 0x00, 0xFC, 0xC0, 0x0F, 0x00]
    assert packing.pack(codes, 6).tolist() == expected
    assert packing.unpack(torch.tensor(expected, dtype=torch.uint8), 6).tolist() == codes.tolist()
    all_ones = torch.full((4,), 0x3F, dtype=torch.uint8)
    assert packing.pack(all_ones, 6).tolist() == [0xFF, 0xFF, 0xFF]


def test_pack_unpack_reject_bad_input():
    with pytest.raises(ValueError, match="bits"):
        packing.pack(torch.zeros(4, dtype=torch.uint8), 5)
    with pytest.raises(ValueError, match="bits"):
        packing.unpack(torch.zeros(4, dtype=torch.uint8), 8)
    with pytest.raises(ValueError, match="codes must be in"):
        packing.pack(torch.tensor([16, 0], dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="codes must be in"):
        packing.pack(torch.tensor([64, 0, 0, 0], dtype=torch.int64), 6)
    with pytest.raises(ValueError, match="codes must be in"):
        packing.pack(torch.tensor([-1, 0], dtype=torch.int64), 4)
    with pytest.raises(TypeError, match="integer"):
        packing.pack(torch.zeros(2), 4)
    with pytest.raises(TypeError, match="integer"):
        packing.pack([1, 2], 4)
    with pytest.raises(ValueError, match="multiple of 2"):
        packing.pack(torch.zeros(3, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        packing.pack(torch.zeros(6, dtype=torch.uint8), 6)
    with pytest.raises(TypeError, match="uint8"):
        packing.unpack(torch.zeros(3, dtype=torch.int16), 6)
    with pytest.raises(ValueError, match="multiple of 3"):
        packing.unpack(torch.zeros(4, dtype=torch.uint8), 6)


@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0,)])
def test_pack_unpack_tensors_without_elements(bits, shape):
    """No elements to infer a size from: the shapes come out spelled (a shard of no rows)."""
    codes = torch.zeros(shape, dtype=torch.uint8)
    packed = packing.pack(codes, bits)
    assert packed.shape == (*shape[:-1], shape[-1] * bits // 8)
    assert packing.unpack(packed, bits).shape == codes.shape
