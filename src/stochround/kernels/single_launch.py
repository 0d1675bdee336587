"""NVFP4 with its tensor scales computed from x's amax, in one launch (issue 42): A amax
programs and Q quantization programs in one grid (`single_launch_kernel`), where the
prepared call otherwise launches the ticket-taking amax kernel (`kernels.block_amax`),
then the quantize kernel (`kernels.block_kernel`).  The same device functions compute
the same bits: `partial_amax`, `last_program_scales`, `quantize_tile`.

The protocol, on three int32 counters of the stream's scratch (`stream_scratch`), 0
before and after a launch:

- ticket (counter 0): each program draws one at its start (an atomic add), its role and
  index from it, not from its program id: tickets below A compute the partial maximum of
  slice ``ticket``, the others quantize tile ``ticket - A``.  The program that draws the
  launch's last ticket resets it to 0.
- amax done (counter 1): `last_program_scales`' counter; the last amax program to finish
  writes the tensor scales and amax, resets it, then sets the ready flag (a release).
- ready (counter 2): a quantization program spins on it (volatile loads) until it is
  set, then adds 1 to it (acquire-release: it reads the tensor scales after); the last of
  the Q to arrive resets it to 0.

A program waits only on amax programs, which drew earlier tickets and so have started:
whatever the occupancy, they are resident or done, and they wait on nothing, so the
launch cannot deadlock (the argument of CUB's single-pass scan, whose tiles take a
dynamic id likewise).  It assumes that a started program keeps running while others
spin (CUDA's forward progress for resident blocks).  Triton's interpreter runs programs
one after another in program-id order: tickets equal program ids there, the flag is set
before the first quantization program looks, and CI runs this same code path (its tests
make a look that finds the flag unset fail there, where it would spin forever).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import INTERPRETED
from .block_amax import (
    AMAX_TILING,
    AmaxTiling,
    amax_programs,
    checked_amax_tiling,
    partial_amax,
)
from .block_kernel import quantize_tile
from .block_launch import BlockCall, block_constants, stream_template
from .block_rotation import checked_rotation
from .runtime import Launch, PartialLaunch, Varying, bound_launch
from .tensor_scales import last_program_scales, partials_tiling

# The largest x (in bytes) that takes the single launch.  Its quantization programs read
# x again right after the amax programs read it; up to this size x stays in the L2 of
# the GPUs this library targets (A100's 40 MiB and more), so that second read costs
# little, and the launch saved is a large share of the call.  Above it the call is
# bound by memory, the two launches each run at bandwidth, and the quantization
# programs that would spin while the amax runs would only hold SMs.
SINGLE_LAUNCH_MAX_BYTES = 2**24

# the launch's counters in its stream scratch: ticket, amax done, ready
SINGLE_LAUNCH_COUNTERS = 3

# The amax programs' work in the single launch: the quantization's chunk of 2**11 elements
# under its warps, two chunks in flight.  A kernel takes the registers of its hungrier
# role: the amax kernel's own tiling (four chunks, eight warps) gave the single launch
# more than the quantize kernel's, so fewer programs a multiprocessor; this one keeps the
# quantize kernel's (benchmarks/single_launch_resources.py, tests/kernels/
# test_kernel_resources.py).  The interpreter's: the amax kernel's one large chunk.
SINGLE_LAUNCH_AMAX_TILING = AMAX_TILING if INTERPRETED else AmaxTiling(2**11, 2, 4)


def takes_single_launch(x: Tensor) -> bool:
    """Whether NVFP4's quantization of x with computed tensor scales takes the single
    launch by default (`SINGLE_LAUNCH_MAX_BYTES`)."""
    return x.numel() * x.element_size() <= SINGLE_LAUNCH_MAX_BYTES


@triton.jit
def _wait_for_scales(ready_ptr, quantizers):
    """Spin until the ready flag is set (volatile loads: from L2, each a fresh read), then
    arrive (an acquire-release add: the tensor scales' loads that follow see the last amax
    program's stores; each arrival releases to the next, so the order holds whichever
    reads the flag first); the last of ``quantizers`` to arrive resets the flag to 0."""
    ready = tl.load(ready_ptr, volatile=True)
    while ready == 0:
        ready = tl.load(ready_ptr, volatile=True)
    arrived = tl.atomic_add(ready_ptr, 1, sem="acq_rel")
    if arrived == quantizers:  # the flag's 1 and every other program's arrival
        tl.store(ready_ptr, 0)


@triton.jit(do_not_specialize=["seed_value", "offset_value", "index_offset"])
def single_launch_kernel(
    x_ptr, codes_ptr, scales_ptr, tensor_scale_ptr, signs_ptr, seed_ptr, offset_ptr,
    seed_value, offset_value, blocks, index_offset,
    partial_ptr, count, amax_count, programs, counter_ptr, amax_ptr,
    TILING: tl.constexpr, STREAM: tl.constexpr, SCALE: tl.constexpr, ELEMENT: tl.constexpr,
    ROUNDING: tl.constexpr, ROTATION: tl.constexpr, OUTPUT: tl.constexpr,
    AMAX: tl.constexpr, AMAX_WIDE: tl.constexpr, PARTIALS: tl.constexpr,
):  # fmt: skip
    """``amax_count`` amax programs, then quantization programs, ``programs`` in all, by
    the tickets they draw (module docstring): an amax program stores the partial maximum
    of its slice (`partial_amax`, AMAX's tiling), the last of them the tensor scales S_dec
    and S_enc at ``tensor_scale_ptr`` (`last_program_scales`) before it sets the flag; a
    quantization program waits for the flag (`_wait_for_scales`), then quantizes its tile
    as `quantize_blocks_kernel` does (`quantize_tile`, codes and scales, SCALE.TENSOR_SCALE
    2), reading those scales."""
    # a field of a constexpr record is no constexpr itself: bound as one to pass it on
    FLAVOUR: tl.constexpr = SCALE.FLAVOUR
    NAN16: tl.constexpr = OUTPUT.NAN16
    ticket = tl.atomic_add(counter_ptr, 1, sem="relaxed")
    if ticket == programs - 1:  # every ticket drawn: the next launch starts from 0
        tl.store(counter_ptr, 0)
    if ticket < amax_count:
        piece = ticket
        if AMAX_WIDE:
            piece = piece.to(tl.int64)
        largest = partial_amax(x_ptr, signs_ptr, piece, count, AMAX, ROTATION, NAN16)
        tl.store(partial_ptr + piece, largest)
        last = last_program_scales(
            partial_ptr, amax_count, counter_ptr + 1, amax_ptr, tensor_scale_ptr, FLAVOUR, PARTIALS
        )
        if last:
            tl.debug_barrier()  # every thread's scale stores before the release
            tl.atomic_xchg(counter_ptr + 2, 1, sem="release")
    else:
        _wait_for_scales(counter_ptr + 2, programs - amax_count)
        quantize_tile(
            ticket - amax_count, x_ptr, codes_ptr, scales_ptr, None, tensor_scale_ptr,
            signs_ptr, None, None, seed_ptr, offset_ptr, seed_value, offset_value, blocks,
            index_offset, TILING, STREAM, SCALE, ELEMENT, ROUNDING, ROTATION, OUTPUT,
        )  # fmt: skip


class SingleLaunchGrid(NamedTuple):
    """The single launch of a call: the bound kernel, its programs in all, its amax
    programs (A, the partial maxima), its blocks, the checked signs of its rotation, and
    the kernel with every argument fixed that the call fixes (`_single_launch_partial`)."""

    launch: Launch
    programs: int
    amax_programs: int
    blocks: int
    signs: Tensor | None
    partial: PartialLaunch


def single_launch_grid(
    x: Tensor, call: BlockCall, from_tensors: bool, amax_tiling: AmaxTiling | None = None
) -> SingleLaunchGrid:
    """The single launch of a checked NVFP4 call on the 2-D x that quantizes to codes and
    scales with two tensor scales (S_dec, S_enc) computed in the launch; ``amax_tiling``
    the amax programs' work (None: `SINGLE_LAUNCH_AMAX_TILING`; its WARPS unread: the
    launch runs under the quantization's), which fixes A and changes no bit."""
    if call.scale_rule != "nvfp4" or call.output not in ("codes", "fp4x2"):
        raise ValueError(f"the single launch quantizes NVFP4 to codes; got {call.scale_rule!r}")
    tiling = checked_amax_tiling(amax_tiling or SINGLE_LAUNCH_AMAX_TILING)
    checked_rotation(x, call.rht, call.rht_signs, call.rht_bf16, tiling.CHUNK)
    bound = block_constants(x, torch.uint8, call, from_tensors)
    count = x.numel()
    amax_count = amax_programs(count, tiling)
    constants = dict(bound.constants)
    options = {key: constants.pop(key) for key in ("num_warps", "enable_fp_fusion")}
    constants |= {
        "AMAX": tiling,
        "AMAX_WIDE": count + tiling.CHUNK * tiling.STEPS >= 2**31,
        "PARTIALS": partials_tiling(amax_count),
        **options,
    }
    launch = bound_launch(single_launch_kernel, tuple(constants.items()))
    programs = amax_count + bound.programs
    partial = _single_launch_partial(
        launch, from_tensors, bound.signs, bound.blocks, call.index_offset, count, amax_count,
        programs,
    )  # fmt: skip
    return SingleLaunchGrid(launch, programs, amax_count, bound.blocks, bound.signs, partial)


def _single_launch_partial(
    launch: Launch,
    from_tensors: bool,
    signs: Tensor | None,
    blocks: int,
    index_offset: int,
    count: int,
    amax_count: int,
    programs: int,
) -> PartialLaunch:
    """The single launch with what a call fixes fixed (the signs, the stream's other two
    arguments, the blocks, the index offset, x's count, the amax programs and the programs
    in all), taking x, the codes, the scales, the tensor scales, the seed, the offset and
    the stream scratch's partial maxima, counters and amax."""
    x, codes, scales, tensor_scale, seed, offset, partial, counters, amax = map(Varying, range(9))
    stream = stream_template(from_tensors, seed, offset)
    return launch.partial(
        (x, codes, scales, tensor_scale, signs, *stream, blocks, index_offset, partial, count,
         amax_count, programs, counters, amax)
    )  # fmt: skip


__all__ = [
    "SINGLE_LAUNCH_AMAX_TILING",
    "SINGLE_LAUNCH_COUNTERS",
    "SINGLE_LAUNCH_MAX_BYTES",
    "SingleLaunchGrid",
    "single_launch_grid",
    "single_launch_kernel",
    "takes_single_launch",
]
