"""The compiled CPU path (`stochround.cpu_path`) gives the PyTorch path's bits.

Most tests run the path's functions eagerly (``eager=True``: the same functions
`torch.compile` compiles, run as PyTorch operations) over every class of fp32 input bf16
rounding distinguishes, every variant and number of random bits the path takes, every
saturation, seeds and offsets at the ends of their ranges and every alignment of
``index_offset``.  One test compiles the two kernels (the noise and the cast's loop: a
C++ build on a machine's first run, cached on disk by inductor afterwards) and checks
the compiled kernels on the same inputs, and that no call compiles them again.
"""

from __future__ import annotations

import pytest
import torch
from helpers import all_bit_patterns
from torch import Tensor

import stochround as sr
from stochround import cpu_path
from stochround.random import philox4x32, philox_rounds, random_words

# (rbits, variant) the path takes: n >= 16 with every variant, and variant a with fewer
VARIANTS = [
    (None, "c"),
    (32, "a"),
    (16, "b"),
    (16, "odd"),
    (17, "odd"),
    (20, "c"),
    (23, "b"),
    *((n, "a") for n in range(1, 16)),
]
SATURATIONS = ("none", "propagate", "finite")
# (seed, offset): the ends of their ranges, and one-element tensors (two's complement)
STREAMS = [
    (0, 0),
    (2**64 - 1, 2**64 - 1),
    (12345, 2**63 + 7),
    (torch.tensor(-1), torch.tensor(2**40 + 3)),
]


def _fp32(patterns: list[int]) -> Tensor:
    """fp32 values of unsigned 32-bit patterns."""
    signed = [p - 2**32 if p >= 2**31 else p for p in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def _input_classes() -> Tensor:
    """Every class of fp32 input rounding to bf16 distinguishes, both signs of each: zeros,
    infinities, NaNs (quiet, signalling, with payloads), the largest finite values and
    those that round to infinity, the smallest normal, subnormals (the smallest, at the
    rounding boundaries, the largest), discarded halves at and around the boundaries
    (0, 1, half - 1, half, half + 1, all ones) under kept halves whose last bit is even,
    odd or all ones (a carry into the exponent), then random patterns."""
    magnitudes = [
        0,
        0x7F800000,
        0x7FC00000,
        0x7F800001,
        0x7FBFFFFF,
        0x7FFFFFFF,
        0x7F7FFFFF,
        0x7F7F8000,
        0x7F7F0001,
        0x7F7EFFFF,
        0x00800000,
        0x00000001,
        0x00007FFF,
        0x00008000,
        0x0000FFFF,
        0x00010000,
        0x007FFFFF,
        0x007F8000,
    ]
    for kept in (0x3F80, 0x3F81, 0x3FFF, 0x0001, 0x0080, 0x7F7E, 0x4B7F):
        for discarded in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF):
            magnitudes.append(kept << 16 | discarded)
    patterns = magnitudes + [m | 0x80000000 for m in magnitudes]
    generator = torch.Generator().manual_seed(29)
    random = torch.randint(-(2**31), 2**31, (4096,), dtype=torch.int32, generator=generator)
    return torch.cat([_fp32(patterns), random.view(torch.float32)])


def _torch_path(x: Tensor, rbits: int | None, variant: str, sat: str, **stream: object) -> Tensor:
    return sr.cast(
        x, torch.bfloat16, "sr", rbits=rbits, variant=variant, sat=sat, backend="torch", **stream
    )


def _bits(x: Tensor) -> Tensor:
    return x.view(torch.int16)


def _cpu_path(
    x: Tensor, rbits: int | None, variant: str, sat: str, eager: bool, **stream: object
) -> Tensor:
    n = 32 if rbits is None else rbits
    return cpu_path.bf16_sr_cpu(x, n=n, variant=variant, sat=sat, eager=eager, **stream)


def _two_multiply_philox(words: torch.Tensor) -> list[torch.Tensor]:
    """Philox4x32-10 with each product's halves from two 16-bit-split multiplies (every
    intermediate below 2**49): an independent check of the one-multiply product the
    stream's rounds use."""
    c0, c1, c2, c3, k0, k1 = words

    def mulhilo(constant: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        high = x * (constant >> 16)
        partial = x * (constant & 0xFFFF) + ((high & 0xFFFF) << 16)
        return (partial >> 32) + (high >> 16), partial & 0xFFFFFFFF

    for _ in range(10):
        hi_b, lo_b = mulhilo(0xCD9E8D57, c2)
        hi_a, lo_a = mulhilo(0xD2511F53, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return [c0, c1, c2, c3]


def test_philox_rounds_are_the_streams_generator() -> None:
    """The rounds the compiled path traces are the stream's generator (one function), and
    its one-multiply products equal a two-multiply computation on extreme and random words."""
    generator = torch.Generator().manual_seed(3)
    words = torch.randint(0, 2**32, (6, 1000), dtype=torch.int64, generator=generator)
    words[:, :4] = torch.tensor([0, 1, 2**32 - 1, 2**31]).expand(6, 4)
    assert cpu_path.philox_rounds is philox_rounds
    assert all(
        torch.equal(mine, theirs)
        for mine, theirs in zip(philox4x32(*words), _two_multiply_philox(words), strict=True)
    )


@pytest.mark.parametrize(("seed", "offset"), STREAMS[:3])
def test_noise_is_the_top_half_of_each_elements_word(seed: int, offset: int) -> None:
    """Packed noise of blocks ``first .. first + 9``: word >> 16 of each element, element j
    of a block in bits 16 j; variant a with 5 bits: the word's top 5 bits at bit 11."""
    first = 2**61 - 20
    index = torch.arange(4 * first, 4 * first + 40, dtype=torch.int64)
    words = random_words(index, seed, offset).reshape(10, 4)
    for shifts, expected in (((16, 0), words >> 16), ((27, 11), (words >> 27) << 11)):
        packed = cpu_path.sr_noise([(seed, offset)], first, 10, shifts, eager=True)[0]
        lanes = torch.stack([cpu_path.lane_noise(packed, lane) for lane in range(4)], dim=1)
        assert torch.equal(lanes, expected), shifts


@pytest.mark.parametrize("sat", SATURATIONS)
def test_every_input_class_every_variant_and_rbits(sat: str) -> None:
    x = _input_classes()
    for rbits, variant in VARIANTS:
        expected = _torch_path(x, rbits, variant, sat, seed=7, offset=11)
        actual = _cpu_path(x, rbits, variant, sat, True, seed=7, offset=11)
        assert torch.equal(_bits(actual), _bits(expected)), (rbits, variant)


@pytest.mark.parametrize(("seed", "offset"), STREAMS)
def test_streams_at_the_ends_of_their_ranges_and_every_index_alignment(
    seed: int | Tensor, offset: int | Tensor
) -> None:
    x = _input_classes()[:1003]
    for index_offset in (0, 1, 2, 3, 2**40 + 5, 2**63 - x.numel()):
        stream = {"seed": seed, "offset": offset, "index_offset": index_offset}
        expected = _torch_path(x, None, "c", "none", **stream)
        actual = _cpu_path(x, None, "c", "none", True, **stream)
        assert torch.equal(_bits(actual), _bits(expected)), index_offset


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16_bit_input_pattern(dtype: torch.dtype) -> None:
    x = all_bit_patterns(dtype)
    for rbits, variant, sat in ((None, "c", "none"), (6, "a", "finite"), (16, "b", "propagate")):
        expected = _torch_path(x, rbits, variant, sat, seed=5)
        actual = _cpu_path(x, rbits, variant, sat, True, seed=5)
        assert torch.equal(_bits(actual), _bits(expected)), (rbits, variant, sat)


def test_shapes_sizes_and_strides_follow_the_logical_row_major_index() -> None:
    values = _input_classes()[:240]
    for x in (
        values[:0],
        values[:1],
        values[:3],
        values[:6].reshape(2, 3),
        values.reshape(12, 20).t(),
        values.reshape(2, 3, 40)[:, 1:, ::3],
    ):
        actual = _cpu_path(x, None, "c", "none", True, seed=1, index_offset=2)
        assert actual.shape == x.shape and actual.dtype == torch.bfloat16
        assert torch.equal(
            _bits(actual), _bits(_torch_path(x, None, "c", "none", seed=1, index_offset=2))
        )


def test_arguments_the_path_cannot_take_are_refused_by_name() -> None:
    x = torch.ones(8)
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16"):
        cpu_path.bf16_sr_cpu(x.double(), 1, eager=True)
    with pytest.raises(ValueError, match="variant 'a'"):
        cpu_path.bf16_sr_cpu(x, 1, n=8, variant="c", eager=True)
    with pytest.raises(ValueError, match="sat must be one of"):
        cpu_path.bf16_sr_cpu(x, 1, sat="clamp", eager=True)
    with pytest.raises(ValueError, match="index_offset must be in"):
        cpu_path.bf16_sr_cpu(x, 1, index_offset=2**63 - 4, eager=True)
    with pytest.raises(ValueError, match="seed must be in"):
        cpu_path.bf16_sr_cpu(x, 2**64, eager=True)
    with pytest.raises(ValueError, match="x must be on the CPU"):
        cpu_path.bf16_sr_cpu(x.to("meta"), 1, eager=True)


def test_what_the_path_supports_and_the_dispatch_rule() -> None:
    assert cpu_path.noise_shifts(32, "c") == (16, 0)
    assert cpu_path.noise_shifts(16, "odd") == (16, 0)
    assert cpu_path.noise_shifts(5, "a") == (27, 11)
    assert cpu_path.supports(torch.float16, 16, "b")
    assert cpu_path.supports(torch.float32, 1, "a")
    assert not cpu_path.supports(torch.float32, 15, "c")
    assert not cpu_path.supports(torch.float64, 32, "c")
    assert cpu_path.worth_compiling(cpu_path.MIN_COMPILED_ELEMENTS)
    assert not cpu_path.worth_compiling(cpu_path.MIN_COMPILED_ELEMENTS - 1)
    assert [cpu_path.saturation_limit(s) for s in SATURATIONS] == [0, 0x7F800000, 0x7F800001]


@pytest.mark.skipif(cpu_path.compile_refusal() is not None, reason="no compiled CPU path here")
# importing inductor imports torch's TorchScript modules, which warn about themselves
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_kernels_give_the_same_bits_and_compile_once() -> None:
    """Compiles the noise kernel and the cast's loop (once per process); then calls of
    other sizes, alignments, streams (tensor seeds included), choices, input dtypes and
    grad or inference modes compile nothing more."""
    from torch._dynamo.utils import counters

    x = _input_classes()
    calls = [
        (x, None, "c", "none", {"seed": 7, "offset": 11}),
        (x[1:], 8, "a", "finite", {"seed": 2**64 - 1, "offset": 3, "index_offset": 3}),
        (x[:4101], 16, "b", "propagate", {"seed": 5, "index_offset": 2**40 + 1}),
        (x[:5], None, "c", "none", {"seed": torch.tensor(-1), "offset": torch.tensor(9)}),
        (x[:3].reshape(3, 1), 1, "a", "none", {"seed": 4, "index_offset": 1}),
        (all_bit_patterns(torch.bfloat16), None, "c", "finite", {"seed": 6}),
        (all_bit_patterns(torch.float16), 20, "odd", "none", {"seed": 6}),
    ]
    for number, (values, rbits, variant, sat, stream) in enumerate(calls):
        if number == 1:
            compiled_graphs = counters["stats"]["unique_graphs"]
        expected = _torch_path(values, rbits, variant, sat, **stream)
        actual = _cpu_path(values, rbits, variant, sat, False, **stream)
        assert torch.equal(_bits(actual), _bits(expected)), number
    with torch.inference_mode():
        actual = _cpu_path(x, None, "c", "none", False, seed=1)
    assert torch.equal(_bits(actual), _bits(_torch_path(x, None, "c", "none", seed=1)))
    assert counters["stats"]["unique_graphs"] == compiled_graphs
