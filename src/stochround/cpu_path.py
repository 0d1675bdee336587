"""A compiled CPU path for fp32 -> bf16 stochastic rounding from the counter-based stream.

It computes the bits of the Triton kernel's ``bf16_sr`` (`stochround.kernels.common`), and
so of the PyTorch path (`stochround.torch_path`), with integer tensor operations that
`torch.compile` turns into C++ loops (inductor's CPU code generation): the PyTorch path
makes dozens of passes over memory per element, this makes two.

Exactly 16 bits of an fp32 pattern are discarded on the way to bf16 (the formats share
their exponent range), so SR with ``n >= 16`` random bits (any variant) or variant "a"
with fewer is: add the random bits just below bit 16, then truncate::

    noise   = word >> 16                          (n >= 16)
            = (word >> (32 - n)) << (16 - n)      (variant a, n < 16)
    rounded = (bits + noise) >> 16

with ``word`` the element's 32-bit word of stream ``(seed, offset)``
(`stochround.random`), ``sat`` "propagate" or "finite" stepping a finite value (or, for
"finite", an infinity too) that reached the infinity pattern back to the largest finite
one, and NaN giving the canonical quiet NaN ``0x7FC0``.

Two compiled kernels, each a loop over blocks of four elements (one Philox block):

- the noise kernel (`sr_noise_groups`, vectorized) runs Philox4x32-10 once a block and
  stream and packs the four elements' noise into one int64 (element ``j`` of a block in
  bits ``16 j``), with the stream's own rounds (`stochround.random.philox_rounds`: one
  int64 multiply a product, which the compiler vectorizes);
- the cast's loop (`cast_groups`, vectorized) adds each element's noise to its fp32
  pattern, truncates, and writes the four bf16 results of a block as one int64 (viewed as
  bf16 afterwards: inductor vectorizes no 16-bit integer type).  The optimizers' fused
  steps (`stochround.optim.cpu_adamw`) add the noise to their own results instead.

Both are compiled at their first use in a process (a C++ build, cached on disk by
inductor): sizes are dynamic and every per-call value (seed, offset, first block, noise
shifts, saturation) is a tensor, so no later call compiles them again.  `compile_refusal`
says why they cannot be built here (None where they can); `worth_compiling` is the
dispatch's rule of which calls take this path.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

from .random import (
    MASK32,
    check_index_offset,
    check_seed,
    philox_rounds,
)
from .reference import SATURATIONS, VARIANTS, WORD_BITS, check_choice, check_rbits

__all__ = [
    "INPUT_DTYPES",
    "LANES",
    "MASK32",
    "MIN_COMPILED_ELEMENTS",
    "bf16_sr_bits",
    "bf16_sr_cpu",
    "cast_groups",
    "compile_refusal",
    "compiled",
    "lane_noise",
    "noise_shifts",
    "normal_mode",
    "saturation_limit",
    "sr_noise",
    "sr_noise_groups",
    "stream_row",
    "supports",
    "worth_compiling",
]

# the patterns the rounding reads: magnitude mask, +infinity, the canonical bf16 NaN
MAGNITUDE_MASK = 0x7FFFFFFF
INFINITY_BITS = 0x7F800000
BF16_INFINITY = 0x7F80
BF16_NAN = 0x7FC0
BF16_MASK = 0xFFFF
BF16_SHIFT = 16  # fp32 bits discarded on the way to bf16
LANES = 4  # elements per Philox block
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# a finite magnitude below the limit that reaches the infinity pattern steps back to max:
# none for "none", the finite ones for "propagate", infinities too for "finite"
SATURATION_LIMITS = {"none": 0, "propagate": INFINITY_BITS, "finite": INFINITY_BITS + 1}
# Below this many elements the dispatch keeps a call on the PyTorch path (`worth_compiling`):
# it rounds them in little time beside the compilation a process's first compiled call costs.
MIN_COMPILED_ELEMENTS = 1 << 16


# --------------------------------------------------------------------------------------
# the traced functions (integer tensor operations; run eagerly or compiled)
# --------------------------------------------------------------------------------------


def bf16_sr_bits(bits: Tensor, noise: Tensor, limit: Tensor | int) -> Tensor:
    """bf16 patterns (int64 in ``[0, 2**16)``) of fp32 patterns ``bits`` (int64 in
    ``[0, 2**32)``) rounded by adding ``noise`` (below ``2**16``) and truncating; a finite
    value reaching infinity with a magnitude below ``limit`` (`saturation_limit`) steps
    back to the largest finite value; NaN gives ``0x7FC0``."""
    rounded = (bits + noise) >> BF16_SHIFT
    magnitude = bits & MAGNITUDE_MASK
    overflowed = ((rounded & 0x7FFF) == BF16_INFINITY) & (magnitude < limit)
    rounded = rounded - overflowed.to(torch.int64)
    return torch.where(magnitude > INFINITY_BITS, BF16_NAN, rounded) & BF16_MASK


def _blocks(first_group: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The counter halves ``(g mod 2**32, g >> 32)`` of blocks ``first_group + 0 .. count-1``."""
    group = torch.arange(count, dtype=torch.int64, device=first_group.device) + first_group
    return group & MASK32, group >> 32


def sr_noise_groups(streams: Tensor, shared: Tensor, like: Tensor) -> Tensor:
    """The noise kernel: SR's 16-bit noise ``(word >> right) << left`` of the elements of
    ``like.shape[0]`` blocks of four, in each of ``streams.shape[0]`` streams: int64
    ``(streams, blocks)``, four values a block (element ``j`` in bits ``16 j``).

    ``streams``: int64 rows ``(key0, key1, counter2, counter3)``, a stream's key and upper
    counter halves (`stream_row`); ``shared``: int64 ``(first_group, right, left)``, the
    first block's index and the noise shifts (`noise_shifts`); ``like``: any tensor with
    one row per block, read for its size only."""
    first_group, right, left = shared.unbind()
    low, high = _blocks(first_group, like.shape[0])
    key0, key1, counter2, counter3 = (streams[:, column, None] for column in range(4))
    words = philox_rounds(low, high, counter2, counter3, key0, key1)
    packed = torch.zeros_like(words[0])
    for lane in range(LANES):
        packed = packed | (((words[lane] >> right) << left) << (BF16_SHIFT * lane))
    return packed


def lane_noise(noise: Tensor, lane: int) -> Tensor:
    """The noise of element ``lane`` of each block, from `sr_noise_groups`' packed words."""
    return (noise >> (BF16_SHIFT * lane)) & BF16_MASK


def cast_groups(bits: Tensor, noise: Tensor, limit: Tensor) -> Tensor:
    """The cast's loop: ``bits``, the int32 fp32 patterns of blocks of four elements
    (``(blocks, 4)``), rounded to bf16 (``(blocks, 4)``) by the blocks' packed ``noise``
    (`sr_noise_groups`), with the saturation ``limit`` (a one-element int64 tensor,
    `saturation_limit`)."""
    packed = torch.zeros_like(noise)
    for lane in range(LANES):
        pattern = bits[:, lane].to(torch.int64) & MASK32
        rounded = bf16_sr_bits(pattern, lane_noise(noise, lane), limit[0])
        packed = packed | (rounded << (BF16_SHIFT * lane))
    return packed


# --------------------------------------------------------------------------------------
# compilation
# --------------------------------------------------------------------------------------


@functools.cache
def compile_refusal() -> str | None:
    """Why `torch.compile` cannot build the CPU kernels here (None if it can): no C++
    compiler that inductor would use (``$CXX``, else ``g++``; ``clang++`` on macOS), or
    `torch.compile` unsupported on this Python."""
    if sys.platform == "win32":
        return "the compiled CPU path is not built on Windows"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version"
    default = "clang++" if sys.platform == "darwin" else "g++"
    compiler = os.environ.get("CXX", default)
    if shutil.which(compiler) is None:
        return f"no C++ compiler for torch.compile's CPU code generation ({compiler} not found)"
    return None


# per-kernel inductor options: the cast and the noise are vectorized integer loops; a loop
# that moves values between float and integer types is left scalar, because inductor
# vectorizes such a bit cast through memory, one element at a time (slower than no vectors)
VECTOR_OPTIONS: dict[str, str | int | bool] = {}
SCALAR_OPTIONS: dict[str, str | int | bool] = {"cpp.vec_isa_ok": False}


Params = ParamSpec("Params")
Result = TypeVar("Result")


@functools.cache
def compiled(function: Callable[Params, Result], scalar: bool = False) -> Callable[Params, Result]:
    """``function`` compiled by `torch.compile` with dynamic sizes, once per process and
    ``scalar`` (leave its loop unvectorized: `SCALAR_OPTIONS`).  The C++ is built at the
    first call (and cached on disk by inductor).  Calls run under `torch.no_grad`, so a
    caller's grad mode never compiles it again."""
    options = SCALAR_OPTIONS if scalar else VECTOR_OPTIONS
    kernel = torch.compile(function, dynamic=True, options=dict(options))

    @functools.wraps(function)
    def run(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        with torch.no_grad():
            return kernel(*args, **kwargs)

    return run


def normal_mode(function: Callable[Params, Result]) -> Callable[Params, Result]:
    """``function`` run outside `torch.inference_mode`: the tensors it makes for a compiled
    kernel are then normal tensors in every call (the kernels are compiled for those; an
    inference tensor would compile them again)."""

    @functools.wraps(function)
    def run(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        with torch.inference_mode(False):
            return function(*args, **kwargs)

    return run


# --------------------------------------------------------------------------------------
# the host side
# --------------------------------------------------------------------------------------


def noise_shifts(n: int, variant: str) -> tuple[int, int]:
    """``(right, left)``: SR's noise is ``(word >> right) << left`` (module docstring) —
    ``(16, 0)`` for ``n >= 16`` (any variant), ``(32 - n, 16 - n)`` for variant "a" with
    fewer bits; ValueError for the other variants with ``n < 16`` (their count of the
    discarded fraction rounds, which adding and truncating cannot do)."""
    n = check_rbits(n)
    check_choice("variant", variant, VARIANTS)
    if n >= BF16_SHIFT:
        return BF16_SHIFT, 0
    if variant != "a":
        raise ValueError(
            f"the CPU bf16 path takes n >= 16 random bits or variant 'a'; got n={n}, "
            f"variant={variant!r}"
        )
    return WORD_BITS - n, BF16_SHIFT - n


def saturation_limit(sat: str) -> int:
    """The magnitude below which a result reaching the infinity pattern saturates to max
    (`bf16_sr_bits`): 0 for "none", +infinity's pattern for "propagate", one more for
    "finite"."""
    return SATURATION_LIMITS[check_choice("sat", sat, SATURATIONS)]


def supports(x_dtype: torch.dtype, n: int, variant: str) -> bool:
    """Whether `bf16_sr_cpu` rounds x of ``x_dtype`` with ``n`` random bits of ``variant``."""
    return x_dtype in INPUT_DTYPES and (n >= BF16_SHIFT or variant == "a")


def worth_compiling(count: int) -> bool:
    """Whether a call of ``count`` elements is worth the compiled path: at least
    `MIN_COMPILED_ELEMENTS` (the dispatch's rule; smaller calls take the PyTorch path)."""
    return count >= MIN_COMPILED_ELEMENTS


def _halves(value: int | Tensor, name: str) -> tuple[int | Tensor, int | Tensor]:
    """The 32-bit halves ``(low, high)`` of a checked seed or offset: ints from an int,
    0-d int64 CPU tensors from a tensor (two's complement above ``2**63``, so the
    arithmetic shift's sign bits are masked off)."""
    value = check_seed(value, name)
    if isinstance(value, Tensor):
        value = value.reshape(()).to("cpu")
        return value & MASK32, (value >> 32) & MASK32
    return value & MASK32, value >> 32


def _int64_vector(values: list[int | Tensor]) -> Tensor:
    """A CPU int64 vector of ints and 0-d tensors (one tensor from ints: the common case)."""
    if all(isinstance(v, int) for v in values):
        return torch.tensor(values, dtype=torch.int64)
    return torch.stack([torch.as_tensor(v, dtype=torch.int64) for v in values])


def stream_row(seed: int | Tensor, offset: int | Tensor) -> list[int | Tensor]:
    """``[key0, key1, counter2, counter3]``: the key and upper counter halves of stream
    ``(seed, offset)`` (ints or 0-d tensors), a row of `sr_noise_groups`' streams."""
    key0, key1 = _halves(seed, "seed")
    counter2, counter3 = _halves(offset, "offset")
    return [key0, key1, counter2, counter3]


@normal_mode
def sr_noise(
    streams: Sequence[tuple[int | Tensor, int | Tensor]],
    first_group: int,
    blocks: int,
    shifts: tuple[int, int] = (BF16_SHIFT, 0),
    *,
    eager: bool = False,
) -> Tensor:
    """`sr_noise_groups` of ``streams`` (pairs ``(seed, offset)``, ints or one-element
    int64 tensors) for ``blocks`` blocks of four from block ``first_group``: int64
    ``(len(streams), blocks)``, one packed word a block and stream.  ``shifts``: the noise
    shifts (`noise_shifts`; the default is exact SR's); ``eager``: run the same function
    uncompiled (by default the compiled kernel runs; the first call in a process builds
    it, and a call with another count of streams may build it once more: at most three
    builds, one of them for a single stream)."""
    rows = torch.stack([_int64_vector(stream_row(seed, offset)) for seed, offset in streams])
    shared = torch.tensor([first_group, *shifts], dtype=torch.int64)
    kernel = sr_noise_groups if eager else compiled(sr_noise_groups)
    # the size travels as a tensor's (a shape without data): the compiled kernel would
    # specialize on an int argument, as on a size of one block (a second block is drawn)
    return kernel(rows, shared, torch.empty((max(blocks, 2), 0)))[:, :blocks]


@normal_mode
def bf16_sr_cpu(
    x: Tensor,
    seed: int | Tensor,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    n: int = WORD_BITS,
    variant: str = "c",
    sat: str = "none",
    *,
    eager: bool = False,
) -> Tensor:
    """``x`` (fp32, bf16 or fp16, on the CPU) rounded stochastically to bf16 by stream
    ``(seed, offset)``: the bits of ``stochround.cast(x, torch.bfloat16, "sr", rbits=n,
    variant=variant, sat=sat, seed=seed, offset=offset, index_offset=index_offset)``.

    ``seed``, ``offset``: ints in ``[0, 2**64)`` or one-element int64 tensors;
    ``index_offset``: the global index of x's first element (row-major), in
    ``[0, 2**63 - x.numel()]``; ``n``: random bits, at least 16, or any from 1 with
    ``variant`` "a" (`noise_shifts`); ``sat``: "none", "propagate" or "finite";
    ``eager``: run the same functions uncompiled (by default the compiled kernels run;
    the first call in a process builds them).  Returns a bf16 tensor shaped like x (a
    view of the kernel's output)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be on the CPU, got a tensor on {x.device}")
    shifts = noise_shifts(n, variant)
    limit = torch.tensor([saturation_limit(sat)], dtype=torch.int64)
    count = x.numel()
    index_offset = check_index_offset(index_offset, count)
    check_seed(seed, "seed")
    check_seed(offset, "offset")
    if count == 0:
        return torch.empty(x.shape, dtype=torch.bfloat16)
    flat = x.detach().reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.float()  # exact: fp32 holds every bf16 and fp16 value
    start = index_offset % LANES
    blocks = (start + count + LANES - 1) // LANES
    bits = flat.view(torch.int32)
    if start or count % LANES or blocks < 2:
        # blocks with elements outside x (and a second block: a single one would make
        # the compiled kernels specialize on its size) are padded with zeros
        blocks = max(blocks, 2)
        padded = bits.new_zeros(blocks * LANES)
        padded[start : start + count] = bits
        bits = padded
    bits = bits.view(blocks, LANES)
    noise = sr_noise([(seed, offset)], index_offset // LANES, blocks, shifts, eager=eager)
    loop = cast_groups if eager else compiled(cast_groups)
    packed = loop(bits, noise[0], limit)
    return packed.view(torch.bfloat16)[start : start + count].view(x.shape)
