"""A tensor's amax in one read (`tensor_amax`), its 2-D tiles' amaxes in the same read
(`tile_amax`), and NVFP4's tensor scales from it in the same launch (`nvfp4_tensor_scale`:
the program that finishes last reduces the programs' partial maxima), on the device,
without host synchronization.

The last program is found by a ticket counter (`kernels.tensor_scales`, which states the
rule for sharing one: a prepared object owns its own and serves one stream; an unprepared
call takes a fresh one)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..block_constants import NVFP4_FLAVOURS
from ..reference import check_choice
from .availability import INTERPRETED, current_device
from .block_rotation import Rotation, checked_rotation, rotated, rotation_rounded
from .common import INPUT_DTYPES, NAN16_BITS, fp32_bits_of
from .grid import cdiv, next_power_of_2
from .runtime import Launch, PartialLaunch, Varying, bound_launch, check_prepared
from .tensor_scales import (
    PartialsTiling,
    Tickets,
    last_program_scales,
    own_tickets,
    partials_tiling,
    ticket_counter,
)


class AmaxTiling(NamedTuple):
    """An amax program's work: STEPS chunks of CHUNK consecutive elements (a power of two),
    read one after another and kept as an elementwise max, under WARPS warps."""

    CHUNK: int
    STEPS: int
    WARPS: int


# a GPU program reads a 16-byte vector of a bf16 chunk a thread (8 warps x 32 threads x 8)
# and several chunks before its one reduction, so that loads stay in flight; the
# interpreter runs programs one after another and each operation costs host time, so there
# one large chunk costs less
AMAX_TILING = AmaxTiling(2**14, 1, 4) if INTERPRETED else AmaxTiling(2**11, 4, 8)
# elements an amax program reads (with the default tiling)
AMAX_BLOCK = AMAX_TILING.CHUNK * AMAX_TILING.STEPS
# elements a tile-amax program reads a step (a power of two), and its warps
TILE_AMAX_ELEMENTS = 2**14 if INTERPRETED else 2**13
_TILE_AMAX_WARPS = 8


class TileShape(NamedTuple):
    """A tile-amax program's tiles: ROWS x COLS tiles (padded to powers of two: COLS_P2
    lanes, ROW_CHUNK rows a step over STEPS steps), TILES consecutive tiles of one row of
    tiles; WIDE: positions beyond int32."""

    ROWS: int
    COLS: int
    COLS_P2: int
    ROW_CHUNK: int
    STEPS: int
    TILES: int
    WIDE: bool


@triton.jit
def partial_amax(
    x_ptr,
    signs_ptr,
    program,
    count,
    TILING: tl.constexpr,
    ROTATION: tl.constexpr,
    NAN16: tl.constexpr,
):
    """Program ``program``'s max |x| over TILING.STEPS chunks of TILING.CHUNK consecutive
    elements from ``program * TILING.CHUNK * TILING.STEPS`` (of x rotated as the quantize
    kernel rotates it, with ROTATION.SIZE > 0), as fp32 bits (int32): an integer max of the
    magnitudes' bits, so a NaN anywhere gives a NaN pattern.  ``program`` int64 where
    positions pass int32."""
    CHUNK: tl.constexpr = TILING.CHUNK
    start = program * (CHUNK * TILING.STEPS)
    if ROTATION.SIZE > 0:  # the rotation's [TILE, GROUPS, 4] tile
        offsets = tl.arange(0, CHUNK // 4)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    else:  # one contiguous run: vector loads
        offsets = tl.arange(0, CHUNK)
    best = tl.zeros_like(offsets)  # int32, as the magnitudes' bits
    STEPS: tl.constexpr = TILING.STEPS  # a field of a constexpr record is no constexpr itself
    for step in tl.static_range(STEPS):
        position = start + step * CHUNK + offsets
        x = tl.load(x_ptr + position, mask=position < count, other=0.0)
        bits = fp32_bits_of(x)
        if ROTATION.SIZE > 0:
            value = rotated(
                bits.to(tl.float32, bitcast=True), signs_ptr, position, ROTATION, INVERSE=False
            )
            value = rotation_rounded(value, NAN16, x.dtype, ROTATION)
            bits = value.to(tl.int32, bitcast=True)
        best = tl.maximum(best, bits & 0x7FFFFFFF)
    if ROTATION.SIZE > 0:
        largest = tl.max(tl.max(tl.max(best, axis=2), axis=1), axis=0)
    else:
        largest = tl.max(best, axis=0)
    return largest


@triton.jit
def _amax_kernel(
    x_ptr,
    partial_ptr,
    signs_ptr,
    count,
    programs,
    counter_ptr,
    amax_ptr,
    scale_ptr,
    TILING: tl.constexpr,
    WIDE: tl.constexpr,
    ROTATION: tl.constexpr,
    NAN16: tl.constexpr,
    FLAVOUR: tl.constexpr,
    PARTIALS: tl.constexpr,
):
    """Each program's partial maximum (`partial_amax`) at ``partial_ptr + program``.  With
    a FLAVOUR (one of NVFP4_FLAVOURS; "" none), the last program to finish also writes x's
    amax and NVFP4's tensor scales (`last_program_scales`)."""
    program = tl.program_id(0)
    if WIDE:
        program = program.to(tl.int64)
    largest = partial_amax(x_ptr, signs_ptr, program, count, TILING, ROTATION, NAN16)
    tl.store(partial_ptr + program, largest)
    if FLAVOUR != "":
        last_program_scales(
            partial_ptr, programs, counter_ptr, amax_ptr, scale_ptr, FLAVOUR, PARTIALS
        )


@triton.jit
def _tile_amax_kernel(
    x_ptr,
    partial_ptr,
    amax_ptr,
    tiles_per_row,
    chunks,
    programs,
    counter_ptr,
    tensor_amax_ptr,
    scale_ptr,
    TILE: tl.constexpr,
    FLAVOUR: tl.constexpr,
    PARTIALS: tl.constexpr,
):
    """The amax of TILE.TILES consecutive ROWS x COLS tiles of a contiguous [rows,
    tiles_per_row * COLS] x, of its row of tiles ``program // chunks``, from tile
    ``(program % chunks) * TILES``: an integer max of the magnitudes' fp32 bits (a NaN in
    a tile gives a NaN pattern), stored as fp32 once for each of the tile's rows (one value
    a 1-D block of COLS elements, the layout the quantize kernel reads), and with a FLAVOUR
    (one of NVFP4_FLAVOURS; "" none) the max over the program's tiles (int32 bits) at
    ``partial_ptr + program``, a partial maximum of x's amax, from which the last program to
    finish writes x's amax and NVFP4's tensor scales (`last_program_scales`)."""
    ROWS: tl.constexpr = TILE.ROWS
    COLS: tl.constexpr = TILE.COLS
    ROW_CHUNK: tl.constexpr = TILE.ROW_CHUNK
    # a constexpr record's fields are plain ints: constexprs of their own for Triton
    TILES: tl.constexpr = TILE.TILES
    COLS_P2: tl.constexpr = TILE.COLS_P2
    STEPS: tl.constexpr = TILE.STEPS
    WIDE: tl.constexpr = TILE.WIDE
    program = tl.program_id(0)
    if WIDE:
        program = program.to(tl.int64)
    tile_row = program // chunks
    tile = (program % chunks) * TILES + tl.arange(0, TILES)
    lane = tl.arange(0, COLS_P2)
    row = tl.arange(0, ROW_CHUNK)
    columns = tiles_per_row * COLS
    inside = (tile < tiles_per_row)[None, :, None] & (lane < COLS)[None, None, :]
    column = tile[None, :, None] * COLS + lane[None, None, :]
    best = tl.zeros((TILES,), dtype=tl.int32)
    for step in range(STEPS):  # a loop, not unrolled: tall tiles take many steps
        rows = step * ROW_CHUNK + row
        position = (tile_row * ROWS + rows)[:, None, None] * columns + column
        mask = (rows < ROWS)[:, None, None] & inside
        x = tl.load(x_ptr + position, mask=mask, other=0.0)
        magnitude = fp32_bits_of(x) & 0x7FFFFFFF
        best = tl.maximum(best, tl.max(tl.max(magnitude, axis=2), axis=0))
    if FLAVOUR != "":
        tl.store(partial_ptr + program, tl.max(best, axis=0))
        last_program_scales(
            partial_ptr, programs, counter_ptr, tensor_amax_ptr, scale_ptr, FLAVOUR, PARTIALS
        )
    amax = tl.broadcast_to(best.to(tl.float32, bitcast=True)[None, :], (ROW_CHUNK, TILES))
    for step in range(STEPS):
        rows = step * ROW_CHUNK + row
        index = (tile_row * ROWS + rows)[:, None] * tiles_per_row + tile[None, :]
        store_mask = (rows < ROWS)[:, None] & (tile < tiles_per_row)[None, :]
        tl.store(amax_ptr + index, amax, mask=store_mask)


def _device(x: Tensor) -> int:
    """x's CUDA device index (the current one), -1 on the CPU (the interpreter)."""
    return x.device.index if x.is_cuda else -1


def _checked_x(x: object) -> Tensor:
    """x, or ValueError unless it is a contiguous fp32, bf16 or fp16 tensor."""
    if not isinstance(x, Tensor) or x.dtype not in INPUT_DTYPES or not x.is_contiguous():
        raise ValueError("x must be a contiguous float32, bfloat16 or float16 tensor")
    return x


def checked_amax_tiling(tiling: AmaxTiling | None) -> AmaxTiling:
    """The tiling (`AMAX_TILING` for None), or ValueError unless its chunk is a power of
    two of at least 4 and its steps and warps positive (warps a power of two)."""
    if tiling is None:
        return AMAX_TILING
    chunk, steps, warps = tiling
    if (
        not isinstance(tiling, AmaxTiling)
        or chunk < 4
        or chunk & (chunk - 1)
        or steps < 1
        or warps < 1
        or warps & (warps - 1)
    ):
        raise ValueError(
            "tiling must be an AmaxTiling of a power-of-two CHUNK >= 4, STEPS >= 1 and a "
            f"power-of-two WARPS; got {tiling!r}"
        )
    return tiling


def amax_programs(count: int, tiling: AmaxTiling) -> int:
    """`_amax_kernel`'s programs for ``count`` elements: one at least (an empty x's one
    program reads nothing and gives the partial maximum 0)."""
    return max(1, cdiv(count, tiling.CHUNK * tiling.STEPS))


def _partial_maxima(
    x: Tensor,
    rht: int | None,
    rht_signs: Tensor | None,
    rht_bf16: bool,
    tiling: AmaxTiling | None = None,
) -> Tensor:
    """Each `_amax_kernel` program's max |x| (rotated with ``rht``), fp32 bits as int32
    (one 0 for an empty x)."""
    x = _checked_x(x)
    tiling = checked_amax_tiling(tiling)
    signs, rotation = checked_rotation(x, rht, rht_signs, rht_bf16, tiling.CHUNK)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return _partial_maxima(x, rht, rht_signs, rht_bf16, tiling)
    count = x.numel()
    programs = amax_programs(count, tiling)
    partial = x.new_empty(programs, dtype=torch.int32)
    launch = _amax_launch(x, rotation, tiling, "", programs)
    launch(_device(x), programs, x, partial, signs, count, programs, None, None, None)
    return partial


def _amax_launch(
    x: Tensor, rotation: Rotation, tiling: AmaxTiling, flavour: str, programs: int
) -> Launch:
    """`_amax_kernel` bound for x's size and dtype, the rotation, the tiling and the
    flavour of the tensor scales its last program writes ("": none) from ``programs``
    partial maxima."""
    block = tiling.CHUNK * tiling.STEPS
    constants: dict[str, int | bool | str | Rotation | AmaxTiling | PartialsTiling] = {
        "TILING": tiling,
        "WIDE": x.numel() + block >= 2**31,
        "ROTATION": rotation,
        "NAN16": NAN16_BITS.get(x.dtype, 0),
        "FLAVOUR": flavour,
        "PARTIALS": partials_tiling(programs),
        "num_warps": tiling.WARPS,
        "enable_fp_fusion": False,
    }
    return bound_launch(_amax_kernel, tuple(constants.items()))


def _tile_shape(x: Tensor, tile: tuple[int, int]) -> tuple[TileShape, int, int]:
    """The `TileShape` of x's tiles (ValueError naming ``tile`` unless it is two positive
    ints dividing x's last two axes, x of at least 2 dims), the tiles along a row and the
    programs' count."""
    if (
        not isinstance(tile, tuple)
        or len(tile) != 2
        or any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in tile)
    ):
        raise ValueError(f"tile must be a pair of positive ints (rows, columns); got {tile!r}")
    rows, cols = tile
    if x.dim() < 2 or x.shape[-2] % rows or x.shape[-1] % cols:
        raise ValueError(f"tile {tile} must divide x's last two axes; got shape {tuple(x.shape)}")
    tiles_per_row = x.shape[-1] // cols
    if x.numel() == 0:  # no programs
        return TileShape(rows, cols, 1, 1, 1, 1, False), tiles_per_row, 0
    cols_p2 = next_power_of_2(cols)
    row_chunk = min(next_power_of_2(rows), max(1, TILE_AMAX_ELEMENTS // cols_p2))
    tiles = min(max(1, TILE_AMAX_ELEMENTS // (row_chunk * cols_p2)), next_power_of_2(tiles_per_row))
    steps = cdiv(rows, row_chunk)
    chunks = cdiv(tiles_per_row, tiles)
    programs = x.numel() // (rows * x.shape[-1]) * chunks
    # the farthest position a program forms (masked lanes included) within int32?
    reach = x.numel() + (steps * row_chunk + 1) * x.shape[-1] + tiles * cols_p2
    shape = TileShape(
        ROWS=rows,
        COLS=cols,
        COLS_P2=cols_p2,
        ROW_CHUNK=row_chunk,
        STEPS=steps,
        TILES=tiles,
        WIDE=reach + programs >= 2**31,
    )
    return shape, tiles_per_row, programs


class TileAmax(NamedTuple):
    """`tile_amax`'s result: each tile's amax (fp32, repeated for each of its rows: one
    value a 1-D block of a tile's row, [rows of x's 2-D view, tiles along a row]) and,
    where a flavour was given, NVFP4's tensor scales S_dec and S_enc of x (2-element fp32),
    else None."""

    amax: Tensor
    scales: Tensor | None


def _tile_launch(shape: TileShape, flavour: str, programs: int) -> Launch:
    """`_tile_amax_kernel` bound for the tile shape and the flavour of the tensor scales
    its last program writes ("": none, and no partial maxima) from ``programs`` partial
    maxima."""
    constants: dict[str, TileShape | PartialsTiling | str | int] = {
        "TILE": shape,
        "FLAVOUR": flavour,
        "PARTIALS": partials_tiling(programs),
        "num_warps": _TILE_AMAX_WARPS,
    }
    return bound_launch(_tile_amax_kernel, tuple(constants.items()))


def tile_amax(x: Tensor, tile: tuple[int, int], flavour: str | None = None) -> TileAmax:
    """The amax of each ``tile = (rows, columns)`` tile of the last two axes of a contiguous
    fp32, bf16 or fp16 x (of at least 2 dims; the tile dividing them), in fp32 (NaN where
    the tile holds a NaN), repeated for each of the tile's rows: equal to
    ``x.reshape(-1, rows, C // columns, columns).abs().amax(dim=(1, 3), keepdim=True)``
    broadcast over the tile's rows, as [numel / C, C / columns] (C = x.shape[-1]); one read
    of x and no host synchronization.  With ``flavour`` (one of NVFP4_FLAVOURS), also NVFP4's
    tensor scales of x from the same read and launch (the max of the tiles' maxima is x's
    amax), as `nvfp4_tensor_scale` gives them, with a fresh `ticket_counter`."""
    if flavour is not None:
        check_choice("flavour", flavour, NVFP4_FLAVOURS)
    counter = None if flavour is None else ticket_counter(x.device)
    return PreparedTileAmax(x, tile, flavour, counter=counter)(x)


class PreparedTileAmax:
    """`tile_amax` for one shape, dtype and device, tile and flavour (or None), checked and
    bound once (a training layer's operand): a call issues the launch alone, with the same
    bits.  With a flavour, its launches take tickets from ``counter`` (a zeroed
    one-element int32 tensor on x's device, as `ticket_counter` gives) or, for None, from
    a counter of its own: then its calls must not run on two streams at once.  The tiles'
    amaxes are written to a buffer of the object's own (made once: the quantize launch
    that follows reads them, and nothing after it), which the next call overwrites; the
    tensor scales are a new tensor a call (a GEMM operand keeps them)."""

    def __init__(
        self,
        x: Tensor,
        tile: tuple[int, int],
        flavour: str | None,
        *,
        counter: Tensor | None = None,
    ) -> None:
        x = _checked_x(x)
        if flavour is not None:
            check_choice("flavour", flavour, NVFP4_FLAVOURS)
        shape, self.tiles_per_row, self.programs = _tile_shape(x, tile)
        self.chunks = cdiv(self.tiles_per_row, shape.TILES)
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.flavour = flavour
        self.device_index = _device(x)
        self.amax_shape = (math.prod(x.shape[:-1]), self.tiles_per_row)
        self.launch = _tile_launch(shape, flavour or "", self.programs)
        self.tickets: Tickets | None = None
        if flavour is not None and self.programs:
            self.tickets = (
                own_tickets(x, self.programs)
                if counter is None
                else Tickets(x.new_empty(self.programs, dtype=torch.int32), counter)
            )
        self.sink = x.new_empty((), dtype=torch.float32)  # the tensor's amax: no caller reads it
        self.amax = x.new_empty(self.amax_shape, dtype=torch.float32)

    def __call__(self, x: Tensor) -> TileAmax:
        """The tiles' amax of x (the prepared shape, dtype and device, contiguous; the
        object's buffer, valid until its next call) and, with a flavour, its tensor
        scales."""
        check_prepared(x, "x", self.shape, self.dtype, self.device)
        if x.is_cuda and x.device.index != current_device():
            with torch.cuda.device(x.device):
                return self(x)
        amax = self.amax
        if self.programs == 0:  # no elements: no tiles, and the tensor's amax is 0
            scales = None
            if self.flavour is not None:
                scales = nvfp4_tensor_scale(x, self.flavour)[0]
            return TileAmax(amax, scales)
        tiles = (self.tiles_per_row, self.chunks, self.programs)
        if self.tickets is None:
            self.launch(self.device_index, self.programs, x, None, amax, *tiles, None, None, None)
            return TileAmax(amax, None)
        scales = x.new_empty(2, dtype=torch.float32)
        partial, counter = self.tickets
        self.launch(
            self.device_index, self.programs, x, partial, amax, *tiles, counter, self.sink, scales
        )
        return TileAmax(amax, scales)


def tensor_amax(
    x: Tensor,
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    tiling: AmaxTiling | None = None,
) -> Tensor:
    """max |x| of a contiguous fp32, bf16 or fp16 tensor as a 0-d fp32 tensor on x's
    device (NaN if x holds NaN, 0 for an empty x), equal to ``x.abs().amax()`` in fp32:
    one read of x (partial maxima of the magnitudes' bits, then their max), no
    temporary |x| and no host synchronization.  With ``rht``, ``rht_signs`` and
    ``rht_bf16`` (as `quantize_blocks` takes them): the max of x rotated along its last
    axis, as `quantize_blocks` rotates it.  `nvfp4_tensor_scale` also gives NVFP4's
    tensor scale from it, in the same launch.  ``tiling``: the programs' work
    (`AmaxTiling`; None: `AMAX_TILING`), which changes no bit."""
    return _partial_maxima(x, rht, rht_signs, rht_bf16, tiling).amax().view(torch.float32)


def nvfp4_tensor_scale(
    x: Tensor,
    flavour: str = "te",
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
    tiling: AmaxTiling | None = None,
) -> tuple[Tensor, Tensor]:
    """NVFP4's tensor scales of x, S_dec and S_enc (a 2-element fp32 tensor), and x's amax
    (0-d fp32), on x's device, in one launch and one read of x (no host synchronization):
    `tensor_amax`'s partial maxima, which the last program to finish reduces to the
    flavour's scales (with a fresh `ticket_counter`), equal to the `decode`
    and `encode` of ``stochround.blocks.scales.nvfp4_tensor_scales(x.abs().amax(),
    flavour)``.  ``flavour`` one of NVFP4_FLAVOURS; the rotation and ``tiling`` as
    `tensor_amax` takes them.  Returns (scales, amax): `quantize_blocks` takes the scales
    as its ``tensor_scale``.  Both outputs and the counter are allocated a call: a tensor
    kept across calls would be made inside torch.compile's CUDA graphs
    (`tensor_scales.ticket_counter`)."""
    check_choice("flavour", flavour, NVFP4_FLAVOURS)
    x = _checked_x(x)
    tiling = checked_amax_tiling(tiling)
    signs, rotation = checked_rotation(x, rht, rht_signs, rht_bf16, tiling.CHUNK)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return nvfp4_tensor_scale(
                x,
                flavour,
                rht=rht,
                rht_signs=rht_signs,
                rht_bf16=rht_bf16,
                tiling=tiling,
            )
    count = x.numel()
    programs = amax_programs(count, tiling)
    partial = x.new_empty(programs, dtype=torch.int32)
    amax = x.new_empty((), dtype=torch.float32)
    scale = x.new_empty(2, dtype=torch.float32)
    launch = _amax_launch(x, rotation, tiling, flavour, programs)
    counter = ticket_counter(x.device)
    launch(_device(x), programs, x, partial, signs, count, programs, counter, amax, scale)
    return scale, amax


class PreparedTensorScale:
    """`nvfp4_tensor_scale` for one shape, dtype and device, flavour and rotation size,
    checked and bound once (a training layer's operand): a call issues the one launch
    alone, with the same bits.  The rotation's signs come with each call; ``tiling`` as
    `tensor_amax` takes it.  Its launches take tickets from a counter of its own (and
    write their partial maxima to a buffer of its own): its calls must not run on two
    streams at once."""

    def __init__(
        self,
        x: Tensor,
        flavour: str,
        *,
        rht: int | None = None,
        rht_signs: Tensor | None = None,
        rht_bf16: bool = False,
        tiling: AmaxTiling | None = None,
    ) -> None:
        check_choice("flavour", flavour, NVFP4_FLAVOURS)
        x = _checked_x(x)
        if x.numel() == 0:
            raise ValueError("x must hold elements")
        tiling = checked_amax_tiling(tiling)
        _, rotation = checked_rotation(x, rht, rht_signs, rht_bf16, tiling.CHUNK)
        self.count = x.numel()
        self.programs = amax_programs(self.count, tiling)
        self.launch = _amax_launch(x, rotation, tiling, flavour, self.programs)
        self.tickets = own_tickets(x, self.programs)
        self.device, self.device_index = x.device, _device(x)
        self.amax = x.new_empty((), dtype=torch.float32)  # the tensor's amax: no caller reads it

    def __call__(self, x: Tensor, rht_signs: Tensor | None) -> Tensor:
        """S_dec and S_enc of x (the prepared size, on the prepared device, current), a
        2-element fp32 tensor, as `nvfp4_tensor_scale` gives them."""
        scale = x.new_empty(2, dtype=torch.float32)
        partial, counter = self.tickets
        self.launch(
            self.device_index, self.programs, x, partial, rht_signs, self.count, self.programs,
            counter, self.amax, scale,
        )  # fmt: skip
        return scale

    def partial_launch(self, rht_signs: Tensor | None) -> PartialLaunch:
        """This launch with the rotation's signs, the count and the programs fixed, taking
        x, the partial maxima, the counter, the amax and the tensor scales (a caller's
        scratch, such as a stream's, in place of this one's own tickets)."""
        x, partial, counter, amax, scale = map(Varying, range(5))
        return self.launch.partial(
            (x, partial, rht_signs, self.count, self.programs, counter, amax, scale)
        )


__all__ = [
    "AMAX_BLOCK",
    "AMAX_TILING",
    "AmaxTiling",
    "PreparedTensorScale",
    "PreparedTileAmax",
    "TileAmax",
    "TileShape",
    "amax_programs",
    "checked_amax_tiling",
    "nvfp4_tensor_scale",
    "partial_amax",
    "tensor_amax",
    "tile_amax",
]
