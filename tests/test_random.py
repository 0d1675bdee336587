"""Tests for stochround.random (Philox stream, data-derived words) and its Triton twin."""

import os

import torch

if not torch.cuda.is_available():
    # must be set before triton is imported (jit decides interpreted vs compiled at decoration)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stochround.random import (
    PHILOX_KEY_A,
    PHILOX_KEY_B,
    PHILOX_ROUND_A,
    PHILOX_ROUND_B,
    Stream,
    _mulhilo32,
    _mullo32,
    as_signed64,
    as_unsigned64,
    data_words,
    default_seed,
    default_seed_tensor,
    philox4x32,
    random_words,
    random_words_like,
)

try:
    import triton
    import triton.language as tl

    from stochround.kernels.philox import (
        data_words_triton,
        four_words,
        philox4x32_10,
        random_word,
        random_words_triton,
    )

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is optional for the PyTorch path
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MASK32 = 0xFFFFFFFF
U32 = st.integers(0, MASK32)
U64 = st.integers(0, 2**64 - 1)

# Random123 kat_vectors, philox4x32 with 10 rounds: (counter, key, expected output)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (MASK32, MASK32, MASK32, MASK32),
        (MASK32, MASK32),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

SEEDS = [0, 1, 0xDEADBEEF, 2**32, 2**32 + 12345, 2**63 - 1, 2**63, 2**64 - 1]
OFFSETS = [0, 1, 7, 2**32 - 1, 2**32, 2**40 + 3, 2**64 - 1]


# --------------------------------------------------------------------------------------
# an independent scalar reference, in Python ints
# --------------------------------------------------------------------------------------


def reference_philox(counter, key, rounds=10):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        product_a = PHILOX_ROUND_A * c0
        product_b = PHILOX_ROUND_B * c2
        c0, c1, c2, c3 = (
            (product_b >> 32) ^ c1 ^ k0,
            product_b & MASK32,
            (product_a >> 32) ^ c3 ^ k1,
            product_a & MASK32,
        )
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def reference_word(index, seed, offset):
    group = index >> 2
    counter = (group & MASK32, group >> 32, offset & MASK32, offset >> 32)
    return reference_philox(counter, (seed & MASK32, seed >> 32))[index & 3]


def as_int64(value):
    """A uint64 value as the int64 with the same bits."""
    return value - 2**64 if value >= 2**63 else value


def boundary_indices():
    """Indices around the interesting boundaries, an odd count of them."""
    parts = [
        torch.arange(0, 1003),
        torch.arange(2**32 - 9, 2**32 + 8),
        torch.arange(2**34 - 5, 2**34 + 6),
        torch.tensor([2**40 + 1, 2**62 + 3, 2**63 - 1]),
    ]
    return torch.cat(parts)


# --------------------------------------------------------------------------------------
# Philox4x32 itself
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    words = philox4x32(*(torch.tensor(c) for c in counter), *key)
    assert tuple(int(w) for w in words) == expected
    assert reference_philox(counter, key) == expected


def test_philox_known_answers_batched_and_broadcast():
    counters = torch.tensor([c for c, _, _ in KNOWN_ANSWERS]).T
    keys = torch.tensor([k for _, k, _ in KNOWN_ANSWERS]).T
    words = torch.stack(philox4x32(*counters, *keys), dim=-1)
    assert words.tolist() == [list(e) for _, _, e in KNOWN_ANSWERS]
    # a scalar counter word broadcast against a vector one gives full-shape outputs
    outputs = philox4x32(torch.tensor([0, 0]), 0, 0, 0, 0, 0, rounds=1)
    assert all(o.shape == (2,) for o in outputs)


def test_mulhilo_is_exact_at_the_extremes():
    values = torch.tensor([0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, MASK32 - 1, MASK32])
    for constant in (PHILOX_ROUND_A, PHILOX_ROUND_B, MASK32, 1, 0x10001):
        hi, lo = _mulhilo32(constant, values)
        for value, h, low in zip(values.tolist(), hi.tolist(), lo.tolist(), strict=True):
            assert (h, low) == divmod(constant * value, 2**32)
        assert _mullo32(values, constant).tolist() == [(constant * v) & MASK32 for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(U32, min_size=4, max_size=4), st.lists(U32, min_size=2, max_size=2), U32, U32)
def test_philox_matches_scalar_reference(counter, key, value, constant):
    words = philox4x32(*(torch.tensor([c]) for c in counter), *key)
    assert tuple(int(w) for w in words) == reference_philox(counter, key)
    hi, lo = _mulhilo32(constant, torch.tensor([value]))
    assert (int(hi), int(lo)) == divmod(constant * value, 2**32)


@pytest.mark.parametrize("rounds", [0, 1, 7])
def test_philox_round_count(rounds):
    counter, key = (1, 2, 3, 4), (5, 6)
    words = philox4x32(*counter, *key, rounds=rounds)
    assert tuple(int(w) for w in words) == reference_philox(counter, key, rounds)


# --------------------------------------------------------------------------------------
# the mapping
# --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(U64, U64, st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=9))
def test_random_words_match_scalar_mapping(seed, offset, indices):
    words = random_words(torch.tensor(indices), seed, offset)
    assert words.tolist() == [reference_word(i, seed, offset) for i in indices]


def test_random_words_shape_dtype_range():
    index = torch.arange(24).reshape(2, 3, 4)
    words = random_words(index, 5, 6)
    assert words.shape == index.shape and words.dtype == torch.int64
    assert int(words.min()) >= 0 and int(words.max()) < 2**32
    # one Philox block serves four consecutive elements
    block = philox4x32(1, 0, 6, 0, 5, 0)
    assert words.reshape(-1)[4:8].tolist() == [int(w) for w in block]


@pytest.mark.parametrize("seed", [3, 2**63 + 11])
@pytest.mark.parametrize("offset", [0, 2**33 + 1, 2**64 - 2])
def test_tensor_seed_and_offset_equal_ints(seed, offset):
    index = boundary_indices().to(DEVICE)
    expected = random_words(index, seed, offset)
    seed_tensor = torch.tensor(as_int64(seed), device=DEVICE)
    offset_tensor = torch.tensor([as_int64(offset)], device=DEVICE)
    assert torch.equal(random_words(index, seed_tensor, offset_tensor), expected)
    x = torch.empty(5, 7, device=DEVICE)
    assert torch.equal(
        random_words_like(x, seed_tensor, offset_tensor, index_offset=9),
        random_words_like(x, seed, offset, index_offset=9),
    )


def test_same_inputs_same_words_and_any_change_changes_them():
    index = boundary_indices()
    words = random_words(index, 42, 3)
    assert torch.equal(words, random_words(index, 42, 3))
    count = index.numel()
    for seed, offset in [(43, 3), (42, 4), (42 + 2**32, 3), (42, 3 + 2**32)]:
        other = random_words(index, seed, offset)
        # equal words are chance coincidences at rate 2**-32
        assert int((other == words).sum()) <= 1, (seed, offset, count)
    # and a different element index gives a different word, also across the 2**32 boundary
    shifted = random_words(index + 2**34, 42, 3)
    assert int((shifted == words).sum()) <= 1


@pytest.mark.parametrize("index_offset", [0, 1, 3, 4, 2**32 - 2, 2**40 + 1])
def test_random_words_like_equals_random_words_of_its_indices(index_offset):
    x = torch.empty(3, 11)
    expected = random_words(index_offset + torch.arange(33).reshape(3, 11), 7, 8)
    assert torch.equal(random_words_like(x, 7, 8, index_offset=index_offset), expected)


@pytest.mark.parametrize("start", [0, 5, 2**33 + 2])
def test_shards_concatenate_to_the_whole(start):
    whole = random_words_like(torch.empty(1001), 99, 2**35, index_offset=start)
    cuts = [0, 333, 334, 1001]  # uneven shards: 333, 1, 667 elements
    shards = [
        random_words_like(torch.empty(hi - lo), 99, 2**35, index_offset=start + lo)
        for lo, hi in itertools.pairwise(cuts)
    ]
    assert torch.equal(torch.cat(shards), whole)


def test_random_words_like_empty():
    words = random_words_like(torch.empty(0, 3), 1)
    assert words.shape == (0, 3) and words.dtype == torch.int64


def test_default_seed_is_reproducible():
    torch.manual_seed(1234)
    first = [default_seed() for _ in range(4)]
    torch.manual_seed(1234)
    assert [default_seed() for _ in range(4)] == first
    assert all(0 <= s < 2**64 for s in first) and len(set(first)) == 4
    assert any(s >= 2**32 for s in first)


def test_default_seed_tensor_draws_what_default_seed_draws():
    torch.manual_seed(99)
    ints = [default_seed() for _ in range(8)]
    torch.manual_seed(99)
    tensors = [default_seed_tensor() for _ in range(8)]
    assert all(t.shape == (1,) and t.dtype == torch.int64 for t in tensors)
    assert [as_unsigned64(int(t)) for t in tensors] == ints


@pytest.mark.parametrize("value", [0, 1, 2**63 - 1, 2**63, 2**64 - 1])
def test_signed64_round_trips(value):
    signed = as_signed64(value)
    assert -(2**63) <= signed < 2**63
    assert torch.tensor(signed, dtype=torch.int64).item() == signed
    assert as_unsigned64(signed) == value


# --------------------------------------------------------------------------------------
# Stream: a stateful (seed, offset)
# --------------------------------------------------------------------------------------


def test_stream_takes_consecutive_offsets_and_wraps():
    stream = Stream(7, offset=5)
    assert [stream.take() for _ in range(3)] == [(7, 5), (7, 6), (7, 7)]
    assert stream.offset == 8 and stream.state_dict() == {"seed": 7, "offset": 8}
    last = Stream(2**64 - 1, offset=2**64 - 2)
    assert [last.take() for _ in range(3)] == [(2**64 - 1, 2**64 - 2), (2**64 - 1, 2**64 - 1),
                                              (2**64 - 1, 0)]  # fmt: skip
    assert repr(Stream(3, offset=1)) == "Stream(seed=3, offset=1)"


def test_stream_state_dict_round_trips():
    stream = Stream(11)
    for _ in range(4):
        stream.take()
    saved = stream.state_dict()
    later = [stream.take() for _ in range(3)]
    restored = Stream(0)
    restored.load_state_dict(saved)
    assert [restored.take() for _ in range(3)] == later
    with pytest.raises(ValueError, match="keys 'seed' and 'offset'"):
        restored.load_state_dict({"seed": 1})
    with pytest.raises(ValueError, match="offset must be in"):
        restored.load_state_dict({"seed": 1, "offset": -1})


def test_stream_seed_none_draws_from_torchs_generator():
    torch.manual_seed(5)
    drawn = default_seed()
    torch.manual_seed(5)
    assert Stream().seed == drawn


def test_stream_takes_numpy_ints_and_refuses_the_rest():
    assert Stream(np.uint64(2**64 - 1), offset=np.int32(3)).take() == (2**64 - 1, 3)
    with pytest.raises(TypeError, match="seed must be an int"):
        Stream(torch.tensor(1))
    with pytest.raises(TypeError, match="seed"):
        Stream(1.5)
    with pytest.raises(ValueError, match="offset must be in"):
        Stream(1, offset=2**64)


def test_a_device_stream_hands_out_tensors():
    """A stream on the CUDA device gives its offset as a device tensor (no host read; a
    CUDA graph captures it); a CPU stream gives ints outside torch.compile."""
    stream = Stream(3, offset=2**63 - 1, device=DEVICE)
    assert stream.device.type == torch.device(DEVICE).type
    seed, offset = stream.take()
    assert seed == 3 and stream.offset == 2**63
    if DEVICE == "cpu":
        assert offset == 2**63 - 1 and type(offset) is int
    else:
        assert offset.device == stream.device and as_unsigned64(int(offset)) == 2**63 - 1


# --------------------------------------------------------------------------------------
# bad arguments
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed", "offset"])
@pytest.mark.parametrize("value", [-1, 2**64, 2**70])
def test_out_of_range_seed_or_offset_raise_value_error(name, value):
    arguments = {"seed": 1, "offset": 0, name: value}
    with pytest.raises(ValueError, match=name):
        random_words(torch.arange(4), **arguments)
    with pytest.raises(ValueError, match=name):
        random_words_like(torch.empty(4), **arguments)


@pytest.mark.parametrize("name", ["seed", "offset"])
@pytest.mark.parametrize(
    "value", [1.0, "1", None, True, torch.tensor(1.0), torch.tensor(1, dtype=torch.int32)]
)
def test_non_integer_seed_or_offset_raise_type_error(name, value):
    arguments = {"seed": 1, "offset": 0, name: value}
    with pytest.raises(TypeError, match=name):
        random_words(torch.arange(4), **arguments)


@pytest.mark.parametrize("name", ["seed", "offset"])
def test_multi_element_tensor_seed_raises_value_error(name):
    arguments = {"seed": 1, "offset": 0, name: torch.tensor([1, 2])}
    with pytest.raises(ValueError, match=name):
        random_words(torch.arange(4), **arguments)


def test_other_bad_arguments():
    with pytest.raises(TypeError, match="index"):
        random_words(torch.arange(4.0), 1)
    with pytest.raises(ValueError, match="index_offset"):
        random_words_like(torch.empty(4), 1, index_offset=-1)
    with pytest.raises(ValueError, match="index_offset"):
        random_words_like(torch.empty(4), 1, index_offset=2**63 - 2)
    with pytest.raises(TypeError, match="index_offset"):
        random_words_like(torch.empty(4), 1, index_offset=1.0)
    with pytest.raises(TypeError, match="bits"):
        data_words(torch.tensor([True]), torch.arange(1))


# --------------------------------------------------------------------------------------
# data-derived words
# --------------------------------------------------------------------------------------


def reference_fmix32(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def reference_data_word(bits, index):
    def fold(v):
        return (v & MASK32) ^ (((v >> 32) * 0x27D4EB2F) & MASK32)

    index_hash = reference_fmix32(fold(index) ^ 0x9E3779B9)
    return reference_fmix32(reference_fmix32(fold(bits) ^ index_hash) ^ index_hash)


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**63 - 1))
def test_data_words_match_scalar_formula(bits, index):
    word = data_words(torch.tensor([bits]), torch.tensor([index]))
    assert int(word) == reference_data_word(bits % 2**64, index)


def test_data_words_read_raw_patterns():
    x = torch.tensor([1.0, -2.5, 0.0, -0.0, float("inf")])
    index = torch.arange(5)
    pattern = x.view(torch.int32).to(torch.int64) & MASK32
    assert torch.equal(data_words(x, index), data_words(pattern, index))
    assert torch.equal(data_words(x.view(torch.int32), index), data_words(pattern, index))
    half = x.to(torch.bfloat16)
    assert torch.equal(
        data_words(half, index), data_words(half.view(torch.int16).to(torch.int64) & 0xFFFF, index)
    )
    # +0.0 and -0.0 differ in bits, so their words differ
    assert int(data_words(x[2:3], index[:1])) != int(data_words(x[3:4], index[:1]))


def test_data_words_are_injective_in_the_value_for_a_fixed_index():
    patterns = torch.arange(2**20, dtype=torch.int64) * 4093 % 2**32
    words = data_words(patterns, torch.full_like(patterns, 77))
    assert torch.unique(words).numel() == patterns.numel()


# --------------------------------------------------------------------------------------
# PyTorch path == Triton path, bit for bit
# --------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _philox_kernel(
        counter_ptr, key_ptr, out_ptr, count, BLOCK: tl.constexpr, OURS: tl.constexpr
    ):
        positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_range = positions < count
        c0 = tl.load(counter_ptr + 4 * positions + 0, mask=in_range).to(tl.uint32)
        c1 = tl.load(counter_ptr + 4 * positions + 1, mask=in_range).to(tl.uint32)
        c2 = tl.load(counter_ptr + 4 * positions + 2, mask=in_range).to(tl.uint32)
        c3 = tl.load(counter_ptr + 4 * positions + 3, mask=in_range).to(tl.uint32)
        seed = tl.load(key_ptr)  # int64: k0 | k1 << 32
        if OURS:
            key0 = seed.to(tl.uint32)
            key1 = (seed >> 32).to(tl.uint32)
            r0, r1, r2, r3 = philox4x32_10(c0, c1, c2, c3, key0, key1)
        else:
            r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
        tl.store(out_ptr + 4 * positions + 0, r0.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 1, r1.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 2, r2.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 3, r3.to(tl.int64), mask=in_range)

    @triton.jit
    def _four_words_kernel(group_ptr, out_ptr, seed, offset, count, BLOCK: tl.constexpr):
        positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_range = positions < count
        group = tl.load(group_ptr + positions, mask=in_range, other=0)
        w0, w1, w2, w3 = four_words(seed, offset, group)
        tl.store(out_ptr + 4 * positions + 0, w0.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 1, w1.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 2, w2.to(tl.int64), mask=in_range)
        tl.store(out_ptr + 4 * positions + 3, w3.to(tl.int64), mask=in_range)

    @triton.jit
    def _scalar_argument_kernel(out_ptr, seed, offset, start, count, BLOCK: tl.constexpr):
        # int32 positions, seed/offset as plain kernel arguments: how rounding kernels call it
        positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_range = positions < count
        word = random_word(seed, offset, start + positions)
        tl.store(out_ptr + positions, word.to(tl.int64), mask=in_range)


@needs_triton
@pytest.mark.parametrize("ours", [False, True], ids=["tl.philox", "philox4x32_10"])
@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_triton_philox_known_answers(counter, key, expected, ours):
    counters = torch.tensor([counter], device=DEVICE)
    seed = torch.tensor([as_int64(key[0] | key[1] << 32)], device=DEVICE)
    out = torch.empty_like(counters)
    _philox_kernel[(1,)](counters, seed, out, 1, BLOCK=16, OURS=ours)
    assert tuple(out[0].tolist()) == expected


@needs_triton
@pytest.mark.parametrize("seed", SEEDS)
def test_triton_random_words_equal_pytorch(seed):
    index = boundary_indices().to(DEVICE)
    for offset in OFFSETS:
        expected = random_words(index, seed, offset)
        assert torch.equal(random_words_triton(index, seed, offset), expected), (seed, offset)
    # tensor seed/offset, one shuffled odd-length index set
    permuted = index[torch.randperm(index.numel(), generator=torch.Generator().manual_seed(0))]
    seed_tensor = torch.tensor(as_int64(seed), device=DEVICE)
    offset_tensor = torch.tensor(as_int64(2**33 + 5), device=DEVICE)
    assert torch.equal(
        random_words_triton(permuted[:-2], seed_tensor, offset_tensor),
        random_words(permuted[:-2], seed, 2**33 + 5),
    )


@needs_triton
@pytest.mark.parametrize("seed", [0, 2**31 + 5, 2**32 + 1, 2**63 + 7])
@pytest.mark.parametrize("offset", [3, 2**31, 2**40 + 9, 2**64 - 1])
def test_triton_four_words_and_scalar_arguments(seed, offset):
    groups = torch.tensor([0, 1, 2, 2**30 + 1, 2**32 - 1, 2**32, 2**40 + 5], device=DEVICE)
    out = torch.empty(groups.numel(), 4, dtype=torch.int64, device=DEVICE)
    _four_words_kernel[(1,)](groups, out, seed, offset, groups.numel(), BLOCK=8)
    lanes = torch.arange(4, device=DEVICE)
    assert torch.equal(out, random_words(4 * groups[:, None] + lanes, seed, offset))

    count, start = 1001, 2**31 - 2000  # int32 indices that stay below 2**31
    words = torch.empty(count, dtype=torch.int64, device=DEVICE)
    _scalar_argument_kernel[(triton.cdiv(count, 512),)](
        words, seed, offset, start, count, BLOCK=512
    )
    expected = random_words_like(words, seed, offset, index_offset=start)
    assert torch.equal(words, expected)


@needs_triton
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64]
)
def test_triton_data_words_equal_pytorch(dtype):
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(1001, generator=generator, dtype=torch.float64) * 1e3
    if dtype.is_floating_point:
        bits = values.to(dtype)
    else:
        bits = torch.randint(-(2**31), 2**31, (1001,), generator=generator).to(dtype)
        if dtype == torch.int64:
            bits = bits * 0x1234567 + 2**62
    index = torch.cat([torch.arange(500), torch.arange(2**35, 2**35 + 501)])
    bits, index = bits.to(DEVICE), index.to(DEVICE)
    assert torch.equal(data_words_triton(bits, index), data_words(bits, index))


# --------------------------------------------------------------------------------------
# statistical quality (tolerances from the variances; seeds are fixed, so deterministic)
# --------------------------------------------------------------------------------------

WORD_COUNT = 2**20
SIGMAS = 5.0


def chi_square_tail_ok(statistic, dof):
    """Both tails of chi-square(dof) beyond 5 sigma-equivalent (p < 5.7e-7) fail."""
    try:
        from scipy.stats import chi2

        return 5.7e-7 < chi2.sf(statistic, dof) < 1 - 5.7e-7
    except ImportError:  # Wilson-Hilferty: (X/k)^(1/3) ~ N(1 - 2/(9k), 2/(9k))
        z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        return abs(z) < SIGMAS


def assert_words_look_random(words):
    words = words.reshape(-1).cpu()
    count = words.numel()
    # each bit is Binomial(count, 1/2): mean count/2, standard deviation sqrt(count)/2
    for bit in range(32):
        ones = int(((words >> bit) & 1).sum())
        assert abs(ones - count / 2) < SIGMAS * math.sqrt(count) / 2, bit
    # byte histogram: 4*count bytes in 256 cells, chi-square with 255 degrees of freedom
    byte_values = torch.cat([(words >> shift) & 0xFF for shift in (0, 8, 16, 24)])
    histogram = torch.bincount(byte_values, minlength=256).double()
    expected = byte_values.numel() / 256
    statistic = float(((histogram - expected) ** 2 / expected).sum())
    assert chi_square_tail_ok(statistic, 255), statistic
    # lag-1 serial correlation of uniforms: approximately N(0, 1/count)
    uniforms = words.double().numpy() / 2**32
    correlation = np.corrcoef(uniforms[:-1], uniforms[1:])[0, 1]
    assert abs(correlation) < SIGMAS / math.sqrt(count), correlation


@pytest.mark.parametrize(("seed", "offset"), [(1, 0), (2**40 + 17, 2**33 + 1)])
def test_stream_quality(seed, offset):
    assert_words_look_random(random_words_like(torch.empty(WORD_COUNT), seed, offset))


def pairs_of(words):
    """Consecutive words as 64-bit values (two's-complement int64)."""
    return (words[0::2] << 32 | words[1::2]).numpy()


def test_neighbouring_streams_do_not_overlap():
    x = torch.empty(WORD_COUNT)
    base = pairs_of(random_words_like(x, 2024, 10))
    assert np.unique(base).size == base.size
    for seed, offset in [(2024, 11), (2024, 9), (2025, 10)]:
        other = pairs_of(random_words_like(x, seed, offset))
        # ~2**38 / 2**64 expected chance coincidences: any equal pair means overlap
        assert np.intersect1d(base, other).size == 0, (seed, offset)


def test_data_words_quality():
    index = torch.arange(WORD_COUNT)
    # one value at every index (e.g. a constant tensor)
    assert_words_look_random(data_words(torch.ones(WORD_COUNT), index))
    # consecutive fp32 patterns from 1.0 at one index (e.g. one parameter over many steps)
    patterns = torch.arange(WORD_COUNT, dtype=torch.int64) + 0x3F800000
    assert_words_look_random(data_words(patterns, torch.full_like(patterns, 12345)))
