"""A one-pass Triton kernel for Gaussian weight sampling (GaussWS, Ahn & Yoo, arXiv
2505.11170), bit-identical to the PyTorch path `stochround.nn.gaussws_noise.sample_weight_torch`.

`gaussws_blocks` reads w once and writes the sampled weight

    w~ = round_to_w_dtype_RNE( fp32(w) + fp32(R) * u )

for every element, the sum rounded once in fp32 (round to nearest even), then once to w's
dtype.  Each program loads a tile of whole blocks (1-D blocks of ``block`` consecutive
elements along the rows of a contiguous [rows, cols] view) and computes, per block and
element:

- amax = max |w| over the block: an integer max of the magnitudes' fp32 bits (which orders
  finite values, infinity and NaN as their values do).  A block whose amax is 0 or not
  finite has no scale and is stored unchanged (NaN and infinities pass through).
- The block's power-of-two scale 2**e with e = floor(log2 amax) - emax, clamped to
  [-126, 127] (the OCP MX "floor" rule), and each element's spacing in the target format
  at |w| / 2**e: u = 2**(ex - mbits + e) with ex = clamp(floor(log2 |w|) - e, emin, emax)
  (the subnormal binade's spacing below 2**emin, zero included).  Every floor(log2 .) is
  read from fp32 bits: the exponent field minus 127 for normal values, and for fp32
  subnormals (m 2**-149, integer m < 2**23) 149 less than the exponent field of fp32(m),
  which is exact; u is built from its exponent's bits (fp32 normal from 2**-126 up,
  subnormal from 2**-127 down to 2**-149, and 0 below, as an fp32 ldexp rounds 2**-150 and
  less).  No transcendental function and no float division.
- The rounded Gaussian R in {-3, ..., 3} by an exact inverse-CDF table lookup on the
  element's Philox word: with n = ``noise_bits`` and r = word >> (32 - n) (the core stream's
  word of the element's global row-major index, ``index_offset`` + its flat position, as
  `stochround.random.random_words` gives it), R = -3 + #{j : r >= T_j} for six integer
  thresholds T_1 <= ... <= T_6 (`stochround.nn.gaussws_noise.gaussian_thresholds`), compile-time
  constants: six integer comparisons and no arithmetic on floats.

The distribution of R is exact for the table: r is uniform on [0, 2**n), so
P(R = k) = c_k / 2**n with c_k = T_{k+4} - T_{k+3} (T_0 = 0, T_7 = 2**n) the table's counts.
The thresholds put c_k = round(2**n p_k) for k = +-1, +-2, +-3, with p_k = Phi(2k+1) -
Phi(2k-1) the probability that N(0, 1)/2 rounds to k, and the rest of the 2**n words on 0:
|P(R = k) - p_k| <= 2**-(n+1) for k != 0, and P(R = 0) carries the opposite of their
errors plus the mass of |round(N(0, 1)/2)| >= 4, 2 (1 - Phi(7)), which is less than half of
one word's probability even at n = 32 (so R's support -3..3 loses no count to it).  The
table is symmetric (c_{-k} = c_k), so E[R] = 0 exactly.

Where the positions allow (``index_offset`` and ``block`` multiples of 4), one Philox call
serves four consecutive elements (`stochround.kernels.philox.four_words`); elsewhere each
element computes its own word.  The kernel is compiled without multiply-add contraction:
R u is exact anyway (a small integer times a power of two), and the sum is rounded once,
as the PyTorch path rounds it.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..formats import Format
from ..formats import format as find_format
from ..random import check_index_offset, check_seed, seed_tensor
from .availability import INTERPRETED, current_device, kernels_refusal
from .common import (
    INPUT_DTYPES,
    NAN16_BITS,
    as_int64,
    block_tile_words,
    fp32_bits_of,
    narrow_to_16_bits,
    seed_and_offset,
    store_block_tile,
)
from .grid import cdiv, next_power_of_2
from .runtime import Launch, bound_launch, check_prepared

# elements a program handles (a power of two; a program takes at least one whole block):
# enough to hide the memory latency; the interpreter runs programs one after another, so
# there a larger tile costs less
_TILE_ELEMENTS = 2**14 if INTERPRETED else 2**12
# warps a program runs; a program whose one block outgrows the tile gets more warps, so that
# each thread's share of the block stays in registers
_NUM_WARPS = 4
WIDE_BLOCK_WARPS = 8
# the number of thresholds of the table of R in {-3, ..., 3}
THRESHOLDS = 6


@triton.jit
def _floor_log2_bits(magnitude):
    """floor(log2 |x|) of fp32 magnitudes given as bits (int32, positive finite or zero):
    the exponent field minus 127 for normal values; for subnormals m 2**-149 (m < 2**23, an
    integer that fp32 holds exactly) floor(log2 m) - 149, read from fp32(m)'s exponent
    field.  Zero gives -276, below every exponent the kernel compares it with."""
    field = magnitude >> 23
    significand = (magnitude & 0x7FFFFF).to(tl.float32).to(tl.int32, bitcast=True)
    subnormal = (significand >> 23) - 127 - 149
    return tl.where(field > 0, field - 127, subnormal)


@triton.jit
def _power_of_two(exponent):
    """fp32 2**exponent for integer exponents up to 127, built from its bits: normal from
    2**-126 up, subnormal down to 2**-149, and 0 below (fp32's ldexp rounds 2**-150 to even,
    0, and anything smaller to 0 too)."""
    normal = (tl.maximum(exponent, -126) + 127) << 23
    shift = tl.minimum(tl.maximum(exponent + 149, 0), 22)
    subnormal = tl.where(exponent >= -149, 1 << shift, 0)
    bits = tl.where(exponent >= -126, normal, subnormal)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rounded_gaussian(
    word,
    NBITS: tl.constexpr,
    T1: tl.constexpr,
    T2: tl.constexpr,
    T3: tl.constexpr,
    T4: tl.constexpr,
    T5: tl.constexpr,
    T6: tl.constexpr,
):
    """R = -3 + #{j : r >= T_j} (int32) with r = word >> (32 - NBITS), the top NBITS bits
    of each uint32 word: the inverse CDF of the table of R (module docstring), compared in
    int64, where every threshold up to 2**32 fits."""
    r = (word >> (32 - NBITS)).to(tl.int64)
    count = (r >= T1).to(tl.int32) + (r >= T2).to(tl.int32) + (r >= T3).to(tl.int32)
    count = count + (r >= T4).to(tl.int32) + (r >= T5).to(tl.int32) + (r >= T6).to(tl.int32)
    return count - 3


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def _gaussws_kernel(
    w_ptr,
    out_ptr,
    seed_ptr,
    offset_ptr,
    seed_value,
    offset_value,
    blocks,
    index_offset,
    FROM_TENSORS: tl.constexpr,
    ALIGNED: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUPS: tl.constexpr,
    TILE: tl.constexpr,
    EMAX: tl.constexpr,
    EMIN: tl.constexpr,
    MBITS: tl.constexpr,
    NBITS: tl.constexpr,
    T1: tl.constexpr,
    T2: tl.constexpr,
    T3: tl.constexpr,
    T4: tl.constexpr,
    T5: tl.constexpr,
    T6: tl.constexpr,
    NAN16: tl.constexpr,
):
    """Sample TILE blocks of BLOCK elements (module docstring), each cut into GROUPS groups
    of four consecutive elements; NAN16: the canonical NaN of a 16-bit w (0: fp32 w)."""
    program = tl.program_id(0)
    if WIDE:  # positions beyond int32
        program = program.to(tl.int64)
    block_id = program * TILE + tl.arange(0, TILE)
    group = tl.arange(0, GROUPS)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    column = group * 4 + lane
    position = block_id[:, None, None] * BLOCK + column
    mask = (block_id[:, None, None] < blocks) & (column < BLOCK)
    w = tl.load(w_ptr + position, mask=mask, other=0.0)
    bits = fp32_bits_of(w)
    magnitude = bits & 0x7FFFFFFF

    # the block's scale exponent e and each element's spacing u = 2**(ex - mbits + e)
    amax_bits = tl.max(tl.max(magnitude, axis=2), axis=1)
    unchanged = (amax_bits == 0) | (amax_bits >= 0x7F800000)
    block_exponent = _floor_log2_bits(amax_bits) - EMAX
    block_exponent = tl.minimum(tl.maximum(block_exponent, -126), 127)[:, None, None]
    element_exponent = _floor_log2_bits(magnitude) - block_exponent
    element_exponent = tl.minimum(tl.maximum(element_exponent, EMIN), EMAX)
    spacing = _power_of_two(element_exponent - MBITS + block_exponent)

    seed, offset = seed_and_offset(seed_ptr, offset_ptr, seed_value, offset_value, FROM_TENSORS)
    # the indices made to depend on w's bits (magnitude >> 31 is 0), so that they, the
    # group numbers reduced from them and the words take the layout of w's load
    index = position + index_offset + (magnitude >> 31)
    word = block_tile_words(seed, offset, index, lane, ALIGNED)
    noise = _rounded_gaussian(word, NBITS, T1, T2, T3, T4, T5, T6)

    sampled = bits.to(tl.float32, bitcast=True) + noise.to(tl.float32) * spacing
    if NAN16 == 0:
        result = sampled
    else:
        result = narrow_to_16_bits(sampled.to(tl.int32, bitcast=True), w.dtype, NAN16)
    result = tl.where(unchanged[:, None, None], w, result)
    store_block_tile(out_ptr, result, position, mask, program, blocks, BLOCK, GROUPS, TILE)


def check_thresholds(thresholds: Sequence[int], noise_bits: int) -> tuple[int, ...]:
    """The six thresholds T_1 <= ... <= T_6 of R's table as a tuple of ints in
    [0, 2**noise_bits] (``noise_bits`` an int in 1..32); ValueError/TypeError naming the
    argument otherwise."""
    if isinstance(noise_bits, bool) or not isinstance(noise_bits, numbers.Integral):
        raise TypeError(f"noise_bits must be an int in 1..32; got {noise_bits!r}")
    if not 1 <= noise_bits <= 32:
        raise ValueError(f"noise_bits must be an int in 1..32; got {noise_bits!r}")
    if isinstance(thresholds, (str, bytes)) or not isinstance(thresholds, Sequence):
        raise TypeError(f"thresholds must be a sequence of {THRESHOLDS} ints; got {thresholds!r}")
    values = tuple(thresholds)
    if len(values) != THRESHOLDS or any(
        isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in values
    ):
        raise ValueError(f"thresholds must be {THRESHOLDS} ints; got {thresholds!r}")
    values = tuple(int(t) for t in values)
    bounds = (0, *values, 2**noise_bits)
    if any(low > high for low, high in itertools.pairwise(bounds)):
        raise ValueError(
            f"thresholds must be nondecreasing ints in [0, 2**noise_bits] = [0, "
            f"{2**noise_bits}]; got {values}"
        )
    return values


def _check_call(
    w: Tensor, fmt: Format | str, block: int | None, index_offset: int
) -> tuple[Format, int]:
    """The target format and the block length; ValueError/TypeError naming any argument
    the kernel cannot take."""
    if not isinstance(w, Tensor) or w.dim() != 2 or not w.is_contiguous():
        shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
        raise ValueError(f"w must be a contiguous 2-D tensor; got {shape}")
    if w.dtype not in INPUT_DTYPES:
        raise TypeError(f"w must be float32, bfloat16 or float16; got {w.dtype}")
    refusal = kernels_refusal("w", w.is_cuda)
    if refusal is not None:
        raise ValueError(f"the GaussWS kernel cannot run: {refusal}")
    cols = w.shape[1]
    if block is None:
        block = cols
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or cols % block:
        raise ValueError(
            f"block must be None (the whole row) or a positive int dividing w's last "
            f"dimension {cols}; got {block!r}"
        )
    check_index_offset(index_offset, w.numel())
    return find_format(fmt), block


def gaussws_blocks(
    w: Tensor,
    fmt: Format | str,
    block: int | None,
    thresholds: Sequence[int],
    noise_bits: int,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int = 0,
) -> Tensor:
    """The GaussWS sample of a contiguous 2-D ``w`` (fp32, bf16 or fp16) in one pass
    (module docstring): w~ = rne_to_w_dtype(fp32(w) + fp32(R) u), u the spacing of the
    target format at each element relative to its block's power-of-two scale, R the rounded
    Gaussian of the element's stream word; blocks of amax 0 or not finite unchanged.  Equal,
    bit for bit, to `stochround.nn.gaussws_noise.sample_weight_torch` with noise "gaussws".

    Arguments: ``fmt`` the target element format (a `Format` or its name: e3m2, e2m3,
    e4m3fn, e5m2, e2m1, ...), whose emin, emax and mbits set the spacing; ``block`` the
    block length along the rows, dividing w's last dimension, or None for the whole row;
    ``thresholds`` the six thresholds T_1 <= ... <= T_6 of R's table, ints in
    [0, 2**noise_bits] (`stochround.nn.gaussws_noise.gaussian_thresholds(noise_bits)`);
    ``noise_bits`` n in 1..32, the top bits of each word the table reads; ``seed`` and
    ``offset`` the stream (ints in [0, 2**64) or single-element int64 tensors, read on the
    device with no host synchronization); ``index_offset`` the global row-major index of
    w's first element (element i draws the word of index ``index_offset + i``).  w must lie
    on a CUDA device, or anywhere under Triton's interpreter (ValueError otherwise).

    Under torch.compile the launch is one opaque op (``stochround::gaussws_blocks``), so a
    compiled graph holds it whole and computes the eager bits.

    Returns a new tensor shaped like w, in w's dtype, on its device.
    """
    fmt, block = _check_call(w, fmt, block, index_offset)
    table = check_thresholds(thresholds, noise_bits)
    streams = (check_seed(seed, "seed"), check_seed(offset, "offset"))
    exponents = (fmt.emin, fmt.emax, fmt.mbits)
    if torch.compiler.is_compiling():
        seed_pointer, seed_value = _stream_arguments(streams[0])
        offset_pointer, offset_value = _stream_arguments(streams[1])
        ints = [block, int(noise_bits), seed_value, offset_value, int(index_offset)]
        return _gaussws_op(w, seed_pointer, offset_pointer, [*ints, *exponents, *table])
    return _sample(w, exponents, block, table, int(noise_bits), *streams, int(index_offset))


def _stream_arguments(value: int | Tensor) -> tuple[Tensor | None, int]:
    """A seed or offset as the op takes it: a tensor, or an int as a signed 64-bit int."""
    if isinstance(value, Tensor):
        return value, 0
    return None, as_int64(value)


def _sample(
    w: Tensor,
    exponents: tuple[int, int, int],
    block: int,
    table: tuple[int, ...],
    noise_bits: int,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int,
) -> Tensor:
    """`gaussws_blocks` for checked arguments: the target's (emin, emax, mbits), the block
    length, the six thresholds, n, the stream and the index offset."""
    seed_pointer: Tensor | None = None
    offset_pointer: Tensor | None = None
    seed_value = offset_value = 0
    from_tensors = isinstance(seed, Tensor) or isinstance(offset, Tensor)
    if from_tensors:
        seed_pointer = seed_tensor(seed, "seed", w.device)
        offset_pointer = seed_tensor(offset, "offset", w.device)
    else:  # two's complement above 2**63: the kernel reads seeds as unsigned 64-bit
        seed_value, offset_value = as_int64(int(seed)), as_int64(int(offset))
    out = torch.empty_like(w)
    count = w.numel()
    if count == 0:
        return out
    if w.is_cuda and w.device.index != current_device():
        # Triton launches on the current device
        with torch.cuda.device(w.device):
            return _sample(w, exponents, block, table, noise_bits, seed, offset, index_offset)
    launch, programs, blocks = _launch_plan(
        w, exponents, block, table, noise_bits, from_tensors, index_offset
    )
    device = w.device.index if w.is_cuda else -1
    launch(
        device,
        programs,
        w,
        out,
        seed_pointer,
        offset_pointer,
        seed_value,
        offset_value,
        blocks,
        index_offset,
    )
    return out


def _launch_plan(
    w: Tensor,
    exponents: tuple[int, int, int],
    block: int,
    table: tuple[int, ...],
    noise_bits: int,
    from_tensors: bool,
    index_offset: int,
) -> tuple[Launch, int, int]:
    """The bound launch of w's sample (its constexprs), its number of programs and of
    blocks."""
    emin, emax, mbits = exponents
    count = w.numel()
    groups = next_power_of_2(cdiv(block, 4))
    tile = max(1, _TILE_ELEMENTS // (groups * 4))
    blocks = count // block
    constants = {
        "FROM_TENSORS": from_tensors,
        "ALIGNED": index_offset % 4 == 0 and block % 4 == 0,
        "WIDE": count + index_offset + tile * groups * 4 >= 2**31,
        "BLOCK": block,
        "GROUPS": groups,
        "TILE": tile,
        "EMAX": emax,
        "EMIN": emin,
        "MBITS": mbits,
        "NBITS": noise_bits,
        **{f"T{j + 1}": t for j, t in enumerate(table)},
        "NAN16": NAN16_BITS.get(w.dtype, 0),
        "num_warps": _NUM_WARPS if groups * 4 <= _TILE_ELEMENTS else WIDE_BLOCK_WARPS,
        # no multiply-add contraction: the sum is rounded once, as the PyTorch path rounds it
        "enable_fp_fusion": False,
    }
    return bound_launch(_gaussws_kernel, tuple(constants.items())), cdiv(blocks, tile), blocks


class PreparedSample:
    """`gaussws_blocks` prepared for one weight, for a hot path that samples it at every
    step: the checks and the launch's constants made once for w's shape, dtype and
    device, the target ``fmt``, ``block``, ``thresholds`` and ``noise_bits``; a call takes
    the weight and the stream's seed and offset as single-element int64 tensors on its
    device (what `stochround.random.seed_tensor` makes) and launches the kernel: the bits
    of ``gaussws_blocks(w, fmt, block, thresholds, noise_bits, seed, offset)``."""

    def __init__(
        self,
        w: Tensor,
        fmt: Format | str,
        block: int | None,
        thresholds: Sequence[int],
        noise_bits: int,
    ) -> None:
        target, length = _check_call(w, fmt, block, 0)
        table = check_thresholds(thresholds, noise_bits)
        exponents = (target.emin, target.emax, target.mbits)
        self.shape, self.dtype, self.device = w.shape, w.dtype, w.device
        self.launch, self.programs, self.blocks = _launch_plan(
            w, exponents, length, table, int(noise_bits), True, 0
        )

    def matches(self, w: Tensor) -> bool:
        """Whether ``w`` is a weight this launch was prepared for."""
        return (
            w.shape == self.shape
            and w.dtype == self.dtype
            and w.device == self.device
            and w.is_contiguous()
        )

    def __call__(self, w: Tensor, seed: Tensor, offset: Tensor) -> Tensor:
        """The sampled weight (a new tensor); ``w`` must `match`, ``seed`` and ``offset``
        be one-element int64 tensors on w's device (ValueError otherwise)."""
        check_prepared(w, "w", self.shape, self.dtype, self.device)
        for name, value in (("seed", seed), ("offset", offset)):
            if value.dtype != torch.int64 or value.numel() != 1 or value.device != w.device:
                raise ValueError(f"{name} must be a one-element int64 tensor on w's device")
        if w.is_cuda and w.device.index != current_device():
            with torch.cuda.device(w.device):
                return self(w, seed, offset)
        out = torch.empty_like(w)
        device = w.device.index if w.is_cuda else -1
        self.launch(device, self.programs, w, out, seed, offset, 0, 0, self.blocks, 0)
        return out


def _run_gaussws_op(
    w: Tensor, seed_tensor: Tensor | None, offset_tensor: Tensor | None, ints: list[int]
) -> Tensor:
    """The kernel's launch as an op, so that torch.compile traces a call as one opaque node
    with the eager bits.  ``ints``: block, noise bits, seed and offset (signed 64-bit; 0
    where a tensor gives them), index offset, the target's emin, emax and mbits, the six
    thresholds (all checked by `gaussws_blocks`)."""
    block, noise_bits, seed, offset, index_offset, emin, emax, mbits, *table = ints
    seed_value = seed_tensor if seed_tensor is not None else seed % 2**64
    offset_value = offset_tensor if offset_tensor is not None else offset % 2**64
    exponents = (emin, emax, mbits)
    return _sample(
        w, exponents, block, tuple(table), noise_bits, seed_value, offset_value, index_offset
    )


_gaussws_op = torch.library.custom_op(
    "stochround::gaussws_blocks", _run_gaussws_op, mutates_args=()
)


@_gaussws_op.register_fake
def _(
    w: Tensor, seed_tensor: Tensor | None, offset_tensor: Tensor | None, ints: list[int]
) -> Tensor:
    return torch.empty_like(w)


__all__ = [
    "THRESHOLDS",
    "PreparedSample",
    "check_thresholds",
    "gaussws_blocks",
]
