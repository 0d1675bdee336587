"""One read of a matrix, both GEMM orientations: the NVFP4 operands of x ``(T, F)`` blocked
along its rows (``F``, the row-wise operand) and of x^T ``(F, T')`` blocked along the tokens
(the column-wise operand, after an optional RHT along the tokens, ``T'`` the tokens padded
with zero tokens), written by one launch, with the tensor amax of both (the column copy's
after its rotation) and both tensor scales from one more read (its last program computes
the scales).
Bit-identical to `gemm_blocks` of x and of the padded contiguous x^T, each with its own
stream, rounding and tensor scales.

A program reads a TOKENS x FEATURES tile of x from memory once, as its row-wise blocks (16
features of a token, one thread a block, vector loads), then gathers the same tile as its
column-wise blocks (16 tokens of a feature, one thread a block), which the cache serves;
each orientation's blocks are rotated (the column-wise ones, along the tokens), quantized
and stored in its operand's layout as `quantize_blocks_kernel` does for a tile of blocks.
Each thread holding whole blocks keeps the rotation, the block amax and the stream's groups
of four within a thread: no transpose through shared memory, no shuffles (a transpose in
registers, `tl.trans` of the tile, made Triton compute the rotation twice, once in each of
two layouts, with shared-memory conversions between them).

Each orientation's operand leaves as a matrix of the tile (`STAGED_STORES`), which Triton
stores coalesced through shared memory: stored from the threads' own blocks, each store
instruction wrote a quarter of each 32-byte sector it touched (benchmarks/pair_resources.py
prints the stores' widths).

The kernel is specialised for NVFP4's operands (each instruction is spent once an element
and orientation; benchmarks/pair_resources.py counts them): e2m1
rounded by `e2m1_operand.e2m1_value` (rne, SR variants a and c), each product stored as the
bf16 that holds it exactly (its high half; under the "pow2" flavour times the power-of-two
tensor scale, which the GEMM then need not apply), a NaN block's by one integer minimum, the
rotated values rounded to bf16 by the hardware's conversion, x's features a constant (each
element's offset an immediate) and, where x's tokens and features fill whole tiles, no
masks.  The stream contract is unchanged: the words of each element as
`common.block_tile_words` draws them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import INTERPRETED, current_device
from .block_kernel import raise_record
from .block_math import (
    fast_round,
    general_round,
    nvfp4_scale,
)
from .block_rotation import NO_ROTATION, Rotation, checked_rotation, rotation_rounded
from .e2m1_operand import e2m1_value, exact_bf16
from .grid import cdiv, next_power_of_2
from .pair_records import Orientation, PairOperands, PairScales, pair_scales
from .pair_tiles import PairTiling, column_blocks, row_blocks, tile_start
from .philox import four_words
from .runtime import Launch, bound_launch, check_prepared, multiprocessors
from .tensor_scales import (
    PartialsTiling,
    last_program_scales,
    own_tickets,
    partials_tiling,
)

# NVFP4's block: 16 elements along the contraction axis of each orientation
PAIR_BLOCK = 16
# a tile's sides (powers of two, multiples of the block; the tokens' side at least the
# rotation's size): compiled for sm_90, 32 x 64 with 4 warps (16 elements a thread) takes
# the fewest instructions an element at few registers; smaller tiles repeat a thread's
# fixed work over fewer elements, larger ones (32 elements a thread) more than double the
# registers (benchmarks/pair_resources.py prints them; benchmarks/bench_pair.py times
# others).  The interpreter runs programs one after another, so there a larger tile
# costs less
TILE_TOKENS = 128 if INTERPRETED else 32
TILE_FEATURES = 128 if INTERPRETED else 64
_NUM_WARPS = 4
# the amax launch's tiles take this many times the quantize launch's tokens: its thread's
# fixed work (the tile's reduction) is then spread over twice the elements, at 32 elements
# a thread and few registers (it holds no operands)
AMAX_TOKENS = 2
# the amax launch's programs: about this many a multiprocessor (resident at once at its
# registers), each taking up to AMAX_MAX_STEPS tiles where x has more (`amax_steps`), so
# that a program's fixed work (the reduction over its threads, the ticket) is paid once
# for all of its tiles; the interpreter, which runs programs one after another, takes
# INTERPRETED_AMAX_PROGRAMS (a tensor of a few tiles then loops, as tests want)
AMAX_PROGRAMS_PER_SM = 8
AMAX_MAX_STEPS = 8
INTERPRETED_AMAX_PROGRAMS = 2
# the operands stored as tile matrices, which Triton stores coalesced (through shared
# memory), rather than from each thread's blocks: a thread's block is one 32-byte sector
# of bf16, which its vector stores fill a quarter at a time, so each store instruction
# sends the L2 a partial write per thread
STAGED_STORES = True


@triton.jit
def _tile_operand(
    bits,
    position,
    mask,
    out_ptr,
    scale_ptr,
    record_ptr,
    seed,
    offset_ptr,
    first_line,
    first,
    lines,
    stride,
    CHOICE: tl.constexpr,
    EVEN: tl.constexpr,
    WIDE: tl.constexpr,
    LINES: tl.constexpr,
    LENGTH: tl.constexpr,
    STAGED: tl.constexpr,
):
    """Quantize a [blocks, 4, 4] tile of fp32 bits (int32; each row one block of 16) as
    `quantize_blocks_kernel` does for NVFP4's rule and the "gemm" output, and store each
    element times its block scale in bf16 at ``position`` (the global row-major index in
    the operand's own layout, which SR's words are drawn for; ``mask``: whether it lies in
    the operand, every element where EVEN).  The product is NaN exactly where the block's
    E4M3 scale is: an element's scaled value is NaN only where it is NaN (then the block's
    amax and scale are) or the block's multiplier is (then its scale is: the tensor
    scales `store_tensor_scales` makes are finite and positive, so a finite E4M3 scale
    gives a positive finite multiplier), and an element of e2m1 is finite: a block's
    scaled values are taken as magnitudes (the multiplier is positive), an element's NaN
    left to its scale's.  Both factors' NaNs are fp32's canonical NaN (0x7FC00000) and a
    GPU's product of a NaN is 0x7FFFFFFF: a product's NaN has its sign bit clear, which
    `exact_bf16` makes bf16's canonical NaN; bf16 holds every other product exactly.
    CHOICE.RECORD: the tile's amax raised into ``record_ptr``.  STAGED: stored instead as
    the LINES x LENGTH matrix the blocks tile (blocks of 16 along its lines, in order),
    its first line and element ``first_line``, ``first``, in the operand of ``lines`` lines
    of ``stride`` elements (contiguous: its stride is its lines' length)."""
    SCALE: tl.constexpr = CHOICE.SCALE
    ROUNDING: tl.constexpr = CHOICE.ROUNDING
    ELEMENT: tl.constexpr = CHOICE.ELEMENT
    magnitude = bits & 0x7FFFFFFF
    amax_bits = tl.max(tl.max(magnitude, axis=2), axis=1)
    if CHOICE.RECORD:
        raise_record(record_ptr, amax_bits)
    amax = amax_bits.to(tl.float32, bitcast=True)
    _, block_value, _, multiplier = nvfp4_scale(amax, scale_ptr, SCALE)
    if ROUNDING.MODE == "sr":
        offset = tl.load(offset_ptr)
        lane = tl.arange(0, 4)[None, None, :]
        # the indices made to depend on x's bits (as the block kernel does): the words
        # then take the layout of the tile
        index = position + (magnitude >> 31)
        if not WIDE:  # non-negative int32 places: unsigned, Philox's high counter word is 0
            index = index.to(tl.uint32)
        word = _tile_words(seed, offset, index, lane)
        r = (word >> (32 - ROUNDING.NBITS)).to(tl.int64)
    else:
        r = bits.to(tl.int64) * 0
    if CHOICE.FAST_E2M1:  # |x| times the multiplier: the scaled value's magnitude
        scaled = magnitude.to(tl.float32, bitcast=True) * multiplier[:, None, None]
        element = e2m1_value(scaled, bits, r, ROUNDING)
    else:
        scaled = bits.to(tl.float32, bitcast=True) * multiplier[:, None, None]
        scaled_bits = scaled.to(tl.int32, bitcast=True)
        if ROUNDING.FAST_BITS >= 0:
            _, element = fast_round(scaled_bits, r, ROUNDING, ELEMENT)
        else:
            _, element = general_round(scaled_bits, r, ROUNDING, ELEMENT)
    narrow = exact_bf16(element * block_value[:, None, None])
    if STAGED:
        # the tile stored as a LINES x LENGTH matrix: Triton gives the store its coalesced
        # layout (neighbouring threads neighbouring 16 bytes) through shared memory, where a
        # thread's own block would write a quarter of each sector an instruction
        line = first_line + tl.arange(0, LINES)[:, None]
        place = first + tl.arange(0, LENGTH)[None, :]
        narrow = tl.reshape(narrow, (LINES, LENGTH))
        if EVEN:
            tl.store(out_ptr + line * stride + place, narrow)
        else:
            inside = (line < lines) & (place < stride)
            tl.store(out_ptr + line * stride + place, narrow, mask=inside)
    elif EVEN:
        tl.store(out_ptr + position, narrow)
    else:
        tl.store(out_ptr + position, narrow, mask=mask)


@triton.jit
def _tile_words(seed, offset, index, lane):
    """The uint32 stream word of each element of a [blocks, 4, 4] tile whose groups of four
    lanes are Philox blocks (``index``: the global indices, lane 0's a multiple of 4), as
    `common.block_tile_words` draws them: the block's number taken from lane 0's index (a
    sum over the lanes of a select on the lane, which the compiler resolves in registers,
    where a maximum over the lanes costs an addition and a comparison a lane)."""
    group = tl.sum(tl.where(lane == 0, index, 0), axis=2) >> 2
    word0, word1, word2, word3 = four_words(seed, offset, group)
    word = tl.where(lane == 0, word0[:, :, None], word1[:, :, None])
    word = tl.where(lane == 2, word2[:, :, None], word)
    return tl.where(lane == 3, word3[:, :, None], word)


@triton.jit(do_not_specialize=["tokens"])
def two_orientation_kernel(
    x_ptr,
    row_out_ptr,
    column_out_ptr,
    scale_ptr,
    record_ptr,
    signs_ptr,
    seed_ptr,
    row_offset_ptr,
    column_offset_ptr,
    tokens,
    padded,
    TILING: tl.constexpr,
    ROW: tl.constexpr,
    COLUMN: tl.constexpr,
    ROTATION: tl.constexpr,
    NAN16: tl.constexpr,
):
    """Quantize a TOKENS x FEATURES tile of a contiguous x ``(tokens, X_FEATURES)`` both
    ways: the blocks of 16 features of each token into ``row_out`` ``(tokens,
    X_FEATURES)``, and (rotated along the tokens by ROTATION) the blocks of 16 tokens of
    each feature into ``column_out`` ``(X_FEATURES, padded)``, the tokens from ``tokens``
    to ``padded`` zero.  ``scale``: the row-wise operand's tensor scales S_dec, S_enc then
    the column-wise one's (4 fp32; None without tensor scales); ``record``: each one's
    amax (2 fp32, raised by atomic maxima) where they record.  ``padded`` and
    X_FEATURES are multiples of 16, which Triton's specialization sees (``padded`` is not
    in do_not_specialize): the row-wise loads and both stores are vector accesses."""
    first_token, first_feature = tile_start(tl.program_id(0), TILING)
    seed = tl.load(seed_ptr)
    bits, position, inside = row_blocks(x_ptr, first_token, first_feature, tokens, TILING)
    _tile_operand(
        bits, position, inside, row_out_ptr, scale_ptr, record_ptr, seed, row_offset_ptr,
        first_token, first_feature, tokens, TILING.X_FEATURES, ROW,
        TILING.EVEN, TILING.WIDE, TILING.TOKENS, TILING.FEATURES, TILING.STAGED,
    )  # fmt: skip
    column_record_ptr = record_ptr  # None where the orientations record nothing
    if COLUMN.RECORD:
        column_record_ptr = record_ptr + 1
    _, bits, position, inside = column_blocks(
        x_ptr, signs_ptr, first_token, first_feature, tokens, padded, TILING, ROTATION, NAN16,
        True,
    )  # fmt: skip
    _tile_operand(
        bits, position, inside, column_out_ptr, scale_ptr + 2, column_record_ptr, seed,
        column_offset_ptr, first_feature, first_token, TILING.X_FEATURES, padded,
        COLUMN, TILING.EVEN, TILING.WIDE, TILING.FEATURES, TILING.TOKENS, TILING.STAGED,
    )  # fmt: skip


@triton.jit(do_not_specialize=["tokens", "programs", "tiles"])
def two_orientation_amax_kernel(
    x_ptr,
    partial_ptr,
    signs_ptr,
    tokens,
    padded,
    programs,
    tiles,
    counter_ptr,
    amax_ptr,
    scale_ptr,
    TILING: tl.constexpr,
    ROTATION: tl.constexpr,
    BUTTERFLY: tl.constexpr,
    NAN16: tl.constexpr,
    PARTIALS: tl.constexpr,
    FLAVOUR: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Each program's max |x| over its tiles (``partial[program]``) and max |RHT(x^T)| over
    the tiles' transposes rotated along the tokens as the quantize kernels rotate them
    (``partial[programs + program]``), as fp32 bits (int32): integer maxima of the
    magnitudes' bits, so a NaN anywhere gives a NaN pattern.  A program takes STEPS of the
    ``tiles`` tiles, ``programs`` apart (the last tile again where they run out: a max is
    the same twice), each thread's blocks' maxima kept across them and reduced over the
    program once.  BUTTERFLY: ROTATION without its normalization, which a block's maximum
    takes instead of each element (a product by a positive constant is monotone: the
    largest product is the largest magnitude's).  The program that finishes last
    (`last_program_scales`: a ticket from ``counter``) reduces both orientations' partial
    maxima to their amaxes (``amax[0]``, ``amax[1]``) and NVFP4's tensor scales of the
    FLAVOUR (``scale``: S_dec, S_enc of x's, then of the rotated x^T's)."""
    program = tl.program_id(0)
    # each thread's blocks' maxima (magnitudes' bits: 0 is the least)
    BLOCKS: tl.constexpr = TILING.TOKENS * TILING.FEATURES // 16
    row = tl.zeros((BLOCKS,), dtype=tl.int32)
    column = tl.zeros((BLOCKS,), dtype=tl.int32)
    # a loop the compiler keeps (not unrolled: unrolled, every tile's loads were held at
    # once, in several times the registers)
    for step in range(STEPS):
        more_row, more_column = _tile_maxima(
            x_ptr, signs_ptr, program + step * programs, tiles, tokens, padded, TILING,
            ROTATION, BUTTERFLY, NAN16,
        )  # fmt: skip
        row = tl.maximum(row, more_row)
        column = tl.maximum(column, more_column)
    tl.store(partial_ptr + program, tl.max(row, axis=0))
    tl.store(partial_ptr + programs + program, tl.max(column, axis=0))
    last_program_scales(
        partial_ptr, programs, counter_ptr, amax_ptr, scale_ptr, FLAVOUR, PARTIALS, 2
    )


@triton.jit
def _tile_maxima(
    x_ptr, signs_ptr, tile, tiles, tokens, padded, TILING: tl.constexpr,
    ROTATION: tl.constexpr, BUTTERFLY: tl.constexpr, NAN16: tl.constexpr,
):  # fmt: skip
    """The blocks' maxima of tile ``tile`` (the last of ``tiles`` beyond them): each
    block's max |x| and max |RHT(x^T)| (`two_orientation_amax_kernel`) as fp32 bits
    (int32, [blocks] each), reduced within each thread's own blocks only."""
    first_token, first_feature = tile_start(tl.minimum(tile, tiles - 1), TILING)
    if ROTATION.SIZE > 0:
        # one read, the column-wise blocks' gather: x's maximum does not depend on the
        # blocks' layout
        raw, column, _, _ = column_blocks(
            x_ptr, signs_ptr, first_token, first_feature, tokens, padded, TILING, BUTTERFLY,
            NAN16, False,
        )  # fmt: skip
        row = tl.max(tl.max(raw & 0x7FFFFFFF, axis=2), axis=1)
        # the rounding to x's dtype (and bf16) is monotone and odd, so the largest rounded
        # magnitude is the largest magnitude rounded (a NaN too: the canonical NaN): a
        # block's maximum is rounded, not each element
        block_max = tl.max(tl.max(column & 0x7FFFFFFF, axis=2), axis=1)
        normalized = block_max.to(tl.float32, bitcast=True) * ROTATION.NORM
        rounded = rotation_rounded(normalized, NAN16, x_ptr.dtype.element_ty, ROTATION)
        column_max = rounded.to(tl.int32, bitcast=True)
    else:  # x^T's values are x's
        bits, _, _ = row_blocks(x_ptr, first_token, first_feature, tokens, TILING)
        row = tl.max(tl.max(bits & 0x7FFFFFFF, axis=2), axis=1)
        column_max = row
    return row, column_max


class PreparedTwoOrientations:
    """Both NVFP4 orientations of x ``(tokens, features)`` (contiguous, fp32, bf16 or
    fp16) for one shape, dtype, device and padded token count, and one pair of
    `Orientation` choices and rotation, checked and bound once: a call issues the amax
    launch (both orientations' amaxes and tensor scales, where the operands have tensor
    scales) and the quantize launch.  The kernels are compiled for each feature count (a
    constant of theirs: `PairTiling`) and each token count's evenness, not for each token
    count.  The amax launches take tickets from a counter of the object's own
    (`stochround.kernels.tensor_scales.own_tickets`), with partial maxima of its own: its
    calls must not run on two streams at once.  ``transient``: each call's operands are
    read before the next call's launches run (dy's, used within one backward): the tensor
    scales and their S_dec views are then the object's own, made once and rewritten by
    each call, else new a call (x's, which the backward reads after later forwards).  A
    call given its tensor scales (delayed ones) issues the quantize launch alone."""

    def __init__(
        self,
        x: Tensor,
        padded: int,
        row: Orientation,
        column: Orientation,
        *,
        rht: int | None = None,
        rht_signs: Tensor | None = None,
        rht_bf16: bool = False,
        transient: bool = False,
    ) -> None:
        if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0:
            raise ValueError(f"x must be a contiguous 2-D tensor with elements; got {x.shape}")
        tokens, features = x.shape
        if features % PAIR_BLOCK or padded % PAIR_BLOCK or padded < tokens:
            raise ValueError(
                f"features ({features}) and padded ({padded}, at least the {tokens} tokens) "
                f"must be multiples of {PAIR_BLOCK}"
            )
        if row.SCALE.TENSOR_SCALE != column.SCALE.TENSOR_SCALE:
            raise ValueError("both orientations have tensor scales or neither has")
        if row.RECORD != column.RECORD:
            raise ValueError("both orientations record their amax or neither does")
        if row.SCALE.FLAVOUR != column.SCALE.FLAVOUR:
            raise ValueError("both orientations take one flavour of tensor scales")
        self.record = row.RECORD
        # "pow2": the operands' values hold their tensor scales (no decodes for the GEMM)
        self.folded = row.SCALE.FLAVOUR == "pow2"
        side = max(TILE_TOKENS, rht or 1)
        probe = x.new_empty((features, padded))  # the column operand's shape, for the check
        _, self.rotation = checked_rotation(probe, rht, rht_signs, rht_bf16, side)
        if rht is None:
            self.rotation = NO_ROTATION
        tiling, self.programs = pair_tiling(tokens, features, padded, side)
        nan16 = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}.get(x.dtype, 0)
        self.quantize = _quantize_launch(tiling, row, column, self.rotation, nan16)
        # the launch for a call that records nothing (its amaxes had from `amaxes`)
        self.unrecorded = self.quantize
        if self.record:
            bare = (row._replace(RECORD=False), column._replace(RECORD=False))
            self.unrecorded = _quantize_launch(tiling, *bare, self.rotation, nan16)
        self.tensor_scales = row.SCALE.TENSOR_SCALE > 0
        if self.tensor_scales:
            # the amax launch's tiles: AMAX_TOKENS times the quantize launch's tokens
            amax_tiling, self.amax_tiles = pair_tiling(tokens, features, padded, side * AMAX_TOKENS)
            steps = amax_steps(self.amax_tiles, x.device)
            self.amax_programs = cdiv(self.amax_tiles, steps)
            self.amax = _amax_launch(
                amax_tiling,
                self.rotation,
                nan16,
                partials_tiling(self.amax_programs),
                row.SCALE.FLAVOUR,
                steps,
            )
            # both orientations' partial maxima and the counter, made once
            self.tickets = own_tickets(x, 2 * self.amax_programs)
            # both amaxes, which no caller reads: written by every launch; and the tensor
            # scales of a launch wanted for its amaxes alone (`amaxes`), read by no one
            self.amax_sink = x.new_empty(2, dtype=torch.float32)
            self.scale_sink = x.new_empty(4, dtype=torch.float32)
        self.own_scales: PairScales | None = None
        if self.tensor_scales and transient:
            self.own_scales = pair_scales(x)
        self.shape, self.dtype, self.device, self.padded = x.shape, x.dtype, x.device, padded
        self.device_index = x.device.index if x.is_cuda else -1

    def check(self, x: Tensor) -> None:
        """ValueError unless x is a contiguous tensor of the prepared shape, dtype and
        device (`check_prepared`)."""
        check_prepared(x, "x", self.shape, self.dtype, self.device)

    def __call__(
        self,
        x: Tensor,
        seed: Tensor,
        row_offset: Tensor,
        column_offset: Tensor,
        rht_signs: Tensor | None,
        scales: Tensor | None = None,
        record: Tensor | None = None,
    ) -> PairOperands:
        """Both operands of x with this stream (one-element int64 tensors: the seed, each
        orientation's offset) and the rotation's signs (fp32, on x's device); ``scales``:
        the tensor scales given (4 fp32 as `PairOperands.scales`; None: computed);
        ``record``: where the orientations record, 2 fp32 raised to their amaxes, or None
        for a call with given scales that records nothing (a caller that had the amaxes
        from `amaxes`: no atomic maxima in the launch)."""
        self.check(x)
        if self.device_index >= 0 and current_device() != self.device_index:
            with torch.cuda.device(self.device):
                return self(x, seed, row_offset, column_offset, rht_signs, scales, record)
        recorded = record is not None
        if (recorded and not self.record) or (scales is not None and not self.tensor_scales):
            raise ValueError("record (scales) given where the orientations record (have them)")
        if self.record and not recorded and scales is None:
            raise ValueError("orientations that record take a record unless scales are given")
        tokens, features = x.shape
        decodes = None
        if scales is not None:
            row_decode, _, column_decode, _ = scales.unbind(0)
            decodes = (row_decode, column_decode)
        elif self.tensor_scales:
            scales, decodes = self.own_scales or pair_scales(x)
            self.launch_amax(x, rht_signs, self.amax_sink, scales)
        row = x.new_empty((tokens, features), dtype=torch.bfloat16)
        column = x.new_empty((features, self.padded), dtype=torch.bfloat16)
        quantize = self.quantize if recorded or not self.record else self.unrecorded
        quantize(
            self.device_index, self.programs, x, row, column, scales, record, rht_signs, seed,
            row_offset, column_offset, tokens, self.padded,
        )  # fmt: skip
        return PairOperands(row, column, scales, None if self.folded else decodes)

    def amaxes(self, x: Tensor, rht_signs: Tensor | None) -> Tensor:
        """Both orientations' current amaxes (2 fp32: x's, then the rotated and padded
        x^T's, each rounded as the quantize launch rounds the rotated values) by the amax
        launch alone: what a delayed tensor scale records, and takes where its window is
        empty.  ValueError where the orientations have no tensor scales (no amax
        launch)."""
        self.check(x)
        if not self.tensor_scales:
            raise ValueError("amaxes of orientations without tensor scales (no amax launch)")
        if self.device_index >= 0 and current_device() != self.device_index:
            with torch.cuda.device(self.device):
                return self.amaxes(x, rht_signs)
        amax = x.new_empty(2, dtype=torch.float32)
        self.launch_amax(x, rht_signs, amax, self.scale_sink)
        return amax

    def launch_amax(
        self, x: Tensor, rht_signs: Tensor | None, amax: Tensor, scales: Tensor
    ) -> None:
        """The amax launch: both orientations' amaxes into ``amax`` (2 fp32) and their
        tensor scales into ``scales`` (4 fp32)."""
        partial, counter = self.tickets
        programs = self.amax_programs
        self.amax(
            self.device_index, programs, x, partial, rht_signs, x.shape[0], self.padded,
            programs, self.amax_tiles, counter, amax, scales,
        )  # fmt: skip


def pair_tiling(tokens: int, features: int, padded: int, side: int) -> tuple[PairTiling, int]:
    """The `PairTiling` of tiles of ``side`` tokens (a multiple of the rotation's size) and
    TILE_FEATURES features over x ``(tokens, features)`` padded to ``padded`` tokens, and
    its programs."""
    feature_tiles = cdiv(features, TILE_FEATURES)
    programs = cdiv(padded, side) * feature_tiles
    # the tiles' extents bound every place either orientation computes (masked or not)
    extent = cdiv(padded, side) * side * feature_tiles * TILE_FEATURES
    even = tokens == padded and tokens % side == 0 and features % TILE_FEATURES == 0
    tiling = PairTiling(
        TOKENS=side,
        FEATURES=TILE_FEATURES,
        WIDE=extent + side >= 2**31,
        X_FEATURES=features,
        EVEN=even,
        STAGED=STAGED_STORES,
    )
    return tiling, programs


def amax_steps(tiles: int, device: torch.device) -> int:
    """The tiles a program of the amax launch takes (a power of two, at most
    AMAX_MAX_STEPS) for ``tiles`` tiles on ``device``: enough that the programs number
    about AMAX_PROGRAMS_PER_SM a multiprocessor (INTERPRETED_AMAX_PROGRAMS in all under
    the interpreter), one where the tiles are fewer."""
    if device.type == "cuda":
        at_once = AMAX_PROGRAMS_PER_SM * multiprocessors(device)
    else:
        at_once = INTERPRETED_AMAX_PROGRAMS
    return min(next_power_of_2(cdiv(tiles, at_once)), AMAX_MAX_STEPS)


def _quantize_launch(
    tiling: PairTiling, row: Orientation, column: Orientation, rotation: Rotation, nan16: int
) -> Launch:
    """`two_orientation_kernel` bound for these choices."""
    constants = {
        "TILING": tiling,
        "ROW": row,
        "COLUMN": column,
        "ROTATION": rotation,
        "NAN16": nan16,
        "num_warps": _NUM_WARPS,
        # no multiply-add contraction: every product rounded as the PyTorch path rounds it
        "enable_fp_fusion": False,
    }
    return bound_launch(two_orientation_kernel, tuple(constants.items()))


def _amax_launch(
    tiling: PairTiling,
    rotation: Rotation,
    nan16: int,
    partials: PartialsTiling,
    flavour: str,
    steps: int,
) -> Launch:
    """`two_orientation_amax_kernel` bound for these choices, its last program's reading of
    the partial maxima into the flavour's tensor scales and ``steps`` tiles a program."""
    constants = {
        "STEPS": steps,
        "TILING": tiling,
        "ROTATION": rotation,
        "BUTTERFLY": rotation._replace(NORM=1.0),
        "NAN16": nan16,
        "PARTIALS": partials,
        "FLAVOUR": flavour,
        "num_warps": _NUM_WARPS,
        "enable_fp_fusion": False,
    }
    return bound_launch(two_orientation_amax_kernel, tuple(constants.items()))


__all__ = [
    "AMAX_TOKENS",
    "PAIR_BLOCK",
    "TILE_FEATURES",
    "TILE_TOKENS",
    "PreparedTwoOrientations",
    "pair_tiling",
    "two_orientation_amax_kernel",
    "two_orientation_kernel",
]
