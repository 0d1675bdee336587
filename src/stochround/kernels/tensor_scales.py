"""NVFP4's tensor scales from an amax kernel's partial maxima, on the device: the math
(`store_tensor_scales`), in the amax launch itself (`last_program_scales`: the program that
finishes last computes them, found by a ticket counter) or in a launch of its own
(`tensor_scale_launch`), and the buffers those launches take.

The ticket: each program of an amax launch stores its partial maximum, then takes a ticket
from an int32 counter (an atomic add, acquire-release); the one that draws ``programs - 1``
reads every partial maximum, writes the scales and resets the counter to 0 for the next
launch (no memset launch; a CUDA graph's replay finds it 0).  A counter serves one launch
at a time: launches in flight together (on two streams) need two counters.  The rule: a
prepared caller owns its counter and partial maxima (`own_tickets`; no launch reads them
after it ends), so it serves one stream; an unprepared call takes a fresh zeroed counter
(`ticket_counter`), so that no tensor it allocates outlives it: under torch.compile's CUDA
graphs (``mode="reduce-overhead"``) every allocation of a warm-up or recording run must be
the graph's output or freed when it ends (docs/guide/recipes.md, "CUDA graphs").  An eager
prepared call that keeps no tensor of its own (`sr.blocks.quantize`'s plans, never made
under torch.compile) takes its stream's counter, partial maxima and amax, kept here
(`stream_scratch`): no allocation and no fill a call."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..block_constants import FLT_MAX, POW2_LEAST_EXPONENT
from .grid import next_power_of_2
from .runtime import Launch, bound_launch, current_stream_key

_FLT_MAX = tl.constexpr(FLT_MAX)
_POW2_LEAST_EXPONENT = tl.constexpr(POW2_LEAST_EXPONENT)


class PartialsTiling(NamedTuple):
    """How one program reads a launch's partial maxima: STEPS x BLOCK of them (BLOCK a
    power of two, at most 1024; STEPS a power of two) cover the count.  A constexpr, as the
    interpreter takes no loop over a runtime count."""

    BLOCK: int
    STEPS: int


def partials_tiling(partials: int) -> PartialsTiling:
    """The `PartialsTiling` of ``partials`` partial maxima (one at least)."""
    block = min(next_power_of_2(partials), 1024)
    return PartialsTiling(block, next_power_of_2(-(-partials // block)))


@triton.jit
def partials_max(partial_ptr, count, PARTIALS: tl.constexpr):
    """The max of ``count`` partial maxima (fp32 bits, int32), read PARTIALS.BLOCK at a time
    (from L2: ``.cg``, as other programs wrote them) in a loop that is not unrolled: a
    kernel calling it from its last program sizes every program's registers for it, and
    unrolled, its loads held at once took more registers than the amax's own work."""
    BLOCK: tl.constexpr = PARTIALS.BLOCK
    best = tl.zeros((BLOCK,), dtype=tl.int32)
    STEPS: tl.constexpr = PARTIALS.STEPS  # a field of a constexpr record is no constexpr itself
    for step in range(STEPS):
        position = step * BLOCK + tl.arange(0, BLOCK)
        partial = tl.load(
            partial_ptr + position, mask=position < count, other=0, cache_modifier=".cg"
        )
        best = tl.maximum(best, partial)
    return tl.max(best, axis=0)


@triton.jit
def store_tensor_scales(amax_bits, amax_ptr, scale_ptr, FLAVOUR: tl.constexpr):
    """Stores the amax (given as its fp32 bits, int32) and NVFP4's tensor scales from it,
    S_dec then S_enc (`tensor_scales_of`)."""
    scale, encode = tensor_scales_of(amax_bits, FLAVOUR)
    tl.store(amax_ptr, amax_bits.to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale)
    tl.store(scale_ptr + 1, encode)


@triton.jit
def tensor_scales_of(amax_bits, FLAVOUR: tl.constexpr):
    """NVFP4's tensor scales S_dec, S_enc of the amax given as its fp32 bits (int32; a
    NaN's sign bit clear, 0 for either zero) (`stochround.blocks.scales.nvfp4_tensor_scales`):
    "te" S_enc = min(2688 / amax, FLT_MAX), 1 where amax is 0 or not finite (or S_enc is
    0), and S_dec = 1 / S_enc; "torchao" S_dec = amax / 2688, 1 where amax is 0 or not
    finite, and S_enc = 1 / S_dec; "pow2" S_dec = 2**max(ceil(log2(amax / 2688)), -118), 1
    where amax is 0 or not finite, and S_enc = 2**-e, both made from their exponent bits."""
    amax = amax_bits.to(tl.float32, bitcast=True)
    bad = (amax_bits == 0) | (amax_bits >= 0x7F800000)
    if FLAVOUR == "pow2":
        wanted = tl.math.div_rn(amax, 2688.0).to(tl.int32, bitcast=True)
        # ceil(log2) of a positive fp32: its binade, one up unless its fraction is 0; a
        # subnormal or zero quotient lies below the least exponent, which it then takes
        exponent = (wanted >> 23) - 127 + ((wanted & 0x7FFFFF) != 0).to(tl.int32)
        exponent = tl.where(exponent < _POW2_LEAST_EXPONENT, _POW2_LEAST_EXPONENT, exponent)
        exponent = tl.where(bad, 0, exponent)
        scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
        encode = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    elif FLAVOUR == "te":
        encode = tl.math.div_rn(2688.0, amax)
        encode = tl.where(encode > _FLT_MAX, _FLT_MAX, encode)
        encode = tl.where(bad | (encode == 0.0), 1.0, encode)
        scale = tl.math.div_rn(1.0, encode)
    else:
        tl.static_assert(FLAVOUR == "torchao", "FLAVOUR must be te, torchao or pow2")
        scale = tl.where(bad, 1.0, tl.math.div_rn(amax, 2688.0))
        encode = tl.math.div_rn(1.0, scale)
    return scale, encode


@triton.jit
def last_program_scales(
    partial_ptr,
    programs,
    counter_ptr,
    amax_ptr,
    scale_ptr,
    FLAVOUR: tl.constexpr,
    PARTIALS: tl.constexpr,
    TENSORS: tl.constexpr = 1,
):
    """Called by every one of the launch's ``programs`` programs (its 1-D grid; given, as
    the interpreter's ``tl.num_programs`` is no scalar) after it stored its partial
    maxima: the program that takes the last ticket from the counter reduces all
    programs' partial maxima (`partials_max`) of each of TENSORS tensors (tensor ``t``'s
    at ``partial + t * programs``), stores each one's amax (``amax[t]``) and tensor
    scales (`store_tensor_scales`, ``scale[2 t]``, ``scale[2 t + 1]``) and resets the
    counter to 0; returns whether this program was that one.  The max of bits is
    order-free, so the result is the same whichever program is last.  On a GPU: the
    barrier orders the program's partial store (whichever thread made it) before the
    atomic, whose release publishes it at GPU scope; the last program's acquire (then
    the barrier Triton places to broadcast the ticket) orders its loads after every
    other program's release.  The interpreter runs programs
    one after another, so there the last one sees all stores anyway."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    last = ticket == programs - 1
    if last:
        for tensor in tl.static_range(TENSORS):
            amax_bits = partials_max(partial_ptr + tensor * programs, programs, PARTIALS)
            store_tensor_scales(amax_bits, amax_ptr + tensor, scale_ptr + 2 * tensor, FLAVOUR)
        tl.store(counter_ptr, 0)  # all tickets taken: the next launch starts from 0
    return last


@triton.jit
def _tensor_scale_kernel(
    partial_ptr,
    amax_ptr,
    scale_ptr,
    count,
    PARTIALS: tl.constexpr,
    FLAVOUR: tl.constexpr,
):
    """One program: the max of ``count`` partial maxima (fp32 bits, int32), stored as the
    tensor's amax, and NVFP4's tensor scales from it (`store_tensor_scales`): the second
    launch for an amax kernel that does not take tickets."""
    store_tensor_scales(partials_max(partial_ptr, count, PARTIALS), amax_ptr, scale_ptr, FLAVOUR)


def tensor_scale_launch(partials: int, flavour: str) -> tuple[Launch, int]:
    """`_tensor_scale_kernel` bound for ``partials`` partial maxima and the flavour: the
    second launch of an amax kernel that takes no tickets."""
    constants: dict[str, PartialsTiling | str | bool] = {
        "PARTIALS": partials_tiling(partials),
        "FLAVOUR": flavour,
        "enable_fp_fusion": False,
    }
    return bound_launch(_tensor_scale_kernel, tuple(constants.items())), partials


def ticket_counter(device: torch.device) -> Tensor:
    """A fresh ticket counter (a one-element int32 tensor, 0) on ``device`` for one
    unprepared launch: an allocation and a fill a call.  Not cached: a counter kept across
    calls would be made inside the first call, which under torch.compile's CUDA graphs is
    a warm-up or recording run whose pool must hold no tensor after it ends."""
    return torch.zeros(1, dtype=torch.int32, device=device)


class Tickets(NamedTuple):
    """A launch's partial maxima (int32, one a program) and its ticket counter."""

    partial: Tensor
    counter: Tensor


def own_tickets(x: Tensor, programs: int) -> Tickets:
    """Partial maxima and a counter (zeroed) for a prepared object's launches alone: one
    allocation and one fill, once (`fresh_scratch`'s); no launch reads them after it ends,
    so the next call's launch (on the same stream) reuses them."""
    scratch = fresh_scratch(x.device, programs)
    return Tickets(scratch.partial, scratch.counter)


class LaunchScratch(NamedTuple):
    """What a ticket-taking amax launch writes besides its results: its partial maxima
    (int32, one a program), its ticket counters (int32 words, one for an amax launch,
    `kernels.single_launch`'s three for its single launch; 0 before and after the launch)
    and the tensor's amax (fp32, 0-d), which a caller that wants the tensor scales alone
    does not read."""

    partial: Tensor
    counter: Tensor
    amax: Tensor


def fresh_scratch(device: torch.device, programs: int, counters: int = 1) -> LaunchScratch:
    """A `LaunchScratch` for ``programs`` partial maxima and ``counters`` counters on
    ``device``: one allocation and one fill, the counters zeroed."""
    work = torch.zeros(programs + counters + 1, dtype=torch.int32, device=device)
    amax = work[-1].view(torch.float32)
    return LaunchScratch(work[:programs], work[programs : programs + counters], amax)


# `stream_scratch`'s sets by (stream key, programs, counters), and the most it keeps
_STREAM_SCRATCH: dict[tuple[object, int, int], LaunchScratch] = {}
_MAX_STREAM_SCRATCH = 64


def stream_scratch(
    device: torch.device, device_index: int, programs: int, counters: int = 1
) -> LaunchScratch:
    """The `LaunchScratch` of ``programs`` partial maxima and ``counters`` counters for the
    current stream of ``device`` (``device_index``: its CUDA index, -1 for the CPU), made
    once per stream and size and kept by this module, not by the caller: a call then costs
    no allocation and no fill.  Its launches leave it clean (the last program to use each
    counter resets it; each program writes its partial maximum before it takes a ticket,
    and nothing reads the amax), and a stream runs its launches in order, so each finds
    the counters at 0; launches on two streams take two sets.  Under CUDA-graph capture a
    call gets a fresh set (`fresh_scratch`), which the graph's pool keeps for its
    replays."""
    stream = current_stream_key(device_index)
    if stream is None:
        return fresh_scratch(device, programs, counters)
    key = (stream, programs, counters)
    scratch = _STREAM_SCRATCH.get(key)
    if scratch is None:
        if len(_STREAM_SCRATCH) >= _MAX_STREAM_SCRATCH:  # many sizes: start again
            _STREAM_SCRATCH.clear()
        scratch = _STREAM_SCRATCH[key] = fresh_scratch(device, programs, counters)
    return scratch


__all__ = [
    "LaunchScratch",
    "PartialsTiling",
    "Tickets",
    "fresh_scratch",
    "last_program_scales",
    "own_tickets",
    "partials_max",
    "partials_tiling",
    "store_tensor_scales",
    "stream_scratch",
    "tensor_scale_launch",
    "tensor_scales_of",
    "ticket_counter",
]
