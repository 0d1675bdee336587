"""One fused Triton launch per optimizer step: AdamW, SGD and Lion over many tensors.

The launch covers every parameter in a list (multi-tensor): a table holds, per parameter,
where the parameter, its gradient and its states start (in elements from the first
parameter, gradient and state, which the kernel receives as typed pointers), its element
count and its global parameter index; a second table, cached by the parameters' sizes,
maps each program to (parameter, block).  Each
program loads a block of ``ROWS x 4`` elements, computes the update in float32 exactly as
`stochround.optim.updates` computes it on tensors (one rounding per operation: no fused
multiply-adds, correctly rounded division and square root), and stores the parameter and
each state rounded to its dtype: to nearest even ("rne"), or stochastically ("sr") with
the words of stream ``(key, step * 2**32 + index * 4 + slot)`` at the element indices,
with ``key`` the optimizer's seed in its stream domain (`stochround.random.stream_key`,
`stochround.optim.streams`), as `stochround.cast(value, dtype, "sr", seed=key, offset=...)`
does: the indices in the whole parameter, so a rank's shard of a sharded parameter (a
DTensor's local tensor) draws its elements' words from its first element's global index
(the table's first Philox block).  Bit-identical to the PyTorch path given the key.
"""

from __future__ import annotations

import functools
import struct
from functools import reduce
from itertools import chain
from operator import or_

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..formats import format_of_dtype
from .availability import INTERPRETED, current_device
from .common import (
    as_int64,
    bf16_sr,
    format_constants,
    narrow_to_16_bits,
    overflow_bits,
    rounded_fp32_bits,
    tile_words,
)
from .grid import cdiv
from .runtime import Launch

ALGORITHMS = ("adamw", "sgd", "lion")
# a program updates BLOCKS blocks of ROWS x 4 elements (one Philox block a row) with WARPS
# warps, loading each block while it updates the one before: the fastest shape of a sweep
# over block shapes (benchmarks/RESULTS.md).  The interpreter runs programs one after another,
# so there large blocks cost far less; 2 blocks of 1024 rows a program make its tests
# (20000 values) cover every branch: whole programs, a partial one, a block past the end
_ROWS = 1024 if INTERPRETED else 64
WARPS = 2
BLOCKS = 2 if INTERPRETED else 4
# table row: 4 tensor offsets, numel, index, step offset, the shard's first Philox block
COLUMNS = tl.constexpr(8)
SCALARS = tl.constexpr(8)  # float32 scalars per parameter

_FP16 = {
    **format_constants(format_of_dtype(torch.float16)),
    **overflow_bits(format_of_dtype(torch.float16), "sr", "none"),
}
FP16_MBITS = tl.constexpr(_FP16["MBITS"])
FP16_EMIN = tl.constexpr(_FP16["EMIN"])
FP16_BIAS = tl.constexpr(_FP16["BIAS"])
FP16_MAX_BITS = tl.constexpr(_FP16["MAX_BITS"])
FP16_NEGATIVE_LIMIT_BITS = tl.constexpr(_FP16["NEGATIVE_LIMIT_BITS"])
FP16_MIN_NORMAL_BITS = tl.constexpr(_FP16["MIN_NORMAL_BITS"])
FP16_OVERFLOW_POSITIVE = tl.constexpr(_FP16["OVERFLOW_POSITIVE"])
FP16_OVERFLOW_NEGATIVE = tl.constexpr(_FP16["OVERFLOW_NEGATIVE"])
FP16_INFINITY_POSITIVE = tl.constexpr(_FP16["INFINITY_POSITIVE"])
FP16_INFINITY_NEGATIVE = tl.constexpr(_FP16["INFINITY_NEGATIVE"])
SR_MODE = tl.constexpr("sr")
EXACT_VARIANT = tl.constexpr("c")
# per-tensor reads of the host path, each mapped over a whole list at C speed (unbound: a
# subclass's __torch_function__ still sees them, as it sees a bound call)
DATA_PTR = Tensor.data_ptr
NUMEL = Tensor.numel


class MisalignedError(ValueError):
    """The tensors of a fused step do not all start on a multiple of 16 bytes (raised before
    anything is launched or changed)."""


@triton.jit
def _store(pointer, value, mask, seed, offset, group, lane, SR: tl.constexpr):
    """Store float32 ``value`` rounded to the pointer's dtype: as is (float32), to nearest
    even, or stochastically with the words of stream ``(seed, offset)`` (exact SR)."""
    dtype: tl.constexpr = pointer.dtype.element_ty
    if dtype == tl.float32:
        tl.store(pointer, value, mask=mask)
    elif not SR:  # integer narrowing: the interpreter's own bf16 cast truncates
        bits = value.to(tl.int32, bitcast=True)
        nan: tl.constexpr = 0x7FC0 if dtype == tl.bfloat16 else 0x7E00
        tl.store(pointer, narrow_to_16_bits(bits, dtype, nan), mask=mask)
    else:
        word = tile_words(seed, offset, group, lane)
        bits = value.to(tl.uint32, bitcast=True)
        if dtype == tl.bfloat16:
            tl.store(pointer, bf16_sr(bits, word, 32, "none"), mask=mask)
        else:
            result = rounded_fp32_bits(
                bits.to(tl.int32, bitcast=True),
                word.to(tl.int64),
                FP16_MBITS,
                FP16_EMIN,
                FP16_BIAS,
                True,
                True,
                FP16_MAX_BITS,
                FP16_NEGATIVE_LIMIT_BITS,
                FP16_MIN_NORMAL_BITS,
                FP16_OVERFLOW_POSITIVE,
                FP16_OVERFLOW_NEGATIVE,
                FP16_INFINITY_POSITIVE,
                FP16_INFINITY_NEGATIVE,
                SR_MODE,
                EXACT_VARIANT,
                32,
            )
            tl.store(pointer, narrow_to_16_bits(result, tl.float16, 0x7E00), mask=mask)


@triton.jit
def _bias_power(squares_ptr, step):
    """``beta ** step`` in float64 as `stochround.optim.updates.bias_power` computes it: the
    product of ``squares[k]`` over the set bits of ``step``, as the same pairwise tree."""
    k = tl.arange(0, 32)
    factors = tl.where(((step >> k) & 1) != 0, tl.load(squares_ptr + k), 1.0)
    left, right = tl.split(tl.reshape(factors, (16, 2)))
    left, right = tl.split(tl.reshape(left * right, (8, 2)))
    left, right = tl.split(tl.reshape(left * right, (4, 2)))
    left, right = tl.split(tl.reshape(left * right, (2, 2)))
    left, right = tl.split(tl.reshape(left * right, (1, 2)))
    return tl.sum(left * right, axis=0)


@triton.jit(do_not_specialize=["lr_bits"])
def _scalars_kernel(
    step_base,
    table_ptr,
    lr_ptr,
    lr_bits,
    constants_ptr,
    scalars_ptr,
    ALGORITHM: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Advance parameter ``program``'s step count and write its row of float32 scalars:
    `stochround.optim.updates`' ``*_scalars`` in float64 from the step, ``lr`` (at
    ``lr_ptr`` with LR_TENSOR, else the float64 of bits ``lr_bits``) and the group's
    constants (AdamW and Adam: b1, b2, eps, decoupled wd, the 32 ``power_squares``
    of b1 and of b2, L2 wd; SGD momentum, dampening, wd; Lion b1, b2, wd).  DEPENDENT: the
    step kernel is a programmatic dependent launch, which may start at once (it waits for
    this grid's writes before it reads them)."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
    tensor = tl.program_id(0)
    step_ptr = step_base + tl.load(table_ptr + tensor * COLUMNS + 6)
    step = tl.load(step_ptr) + 1
    tl.store(step_ptr, step)
    if LR_TENSOR:
        lr = tl.load(lr_ptr).to(tl.float64)
    else:
        lr = lr_bits.to(tl.int64).to(tl.float64, bitcast=True)
    row = scalars_ptr + tensor * SCALARS
    first = tl.load(constants_ptr)
    second = tl.load(constants_ptr + 1)
    third = tl.load(constants_ptr + 2)
    if ALGORITHM == "adamw":
        power1 = _bias_power(constants_ptr + 4, step)
        power2 = _bias_power(constants_ptr + 36, step)
        tl.store(row, (1 - lr * tl.load(constants_ptr + 3)).to(tl.float32))
        tl.store(row + 1, (1 - first).to(tl.float32))
        tl.store(row + 2, second.to(tl.float32))
        tl.store(row + 3, (1 - second).to(tl.float32))
        tl.store(row + 4, (1 / tl.sqrt(1 - power2)).to(tl.float32))
        tl.store(row + 5, third.to(tl.float32))
        tl.store(row + 6, (lr / (1 - power1)).to(tl.float32))
        tl.store(row + 7, tl.load(constants_ptr + 68).to(tl.float32))
    elif ALGORITHM == "sgd":
        tl.store(row, lr.to(tl.float32))
        tl.store(row + 1, first.to(tl.float32))
        tl.store(row + 2, (1 - second).to(tl.float32))
        tl.store(row + 3, third.to(tl.float32))
    else:
        tl.static_assert(ALGORITHM == "lion", "ALGORITHM must be adamw, sgd or lion")
        tl.store(row, (1 - lr * third).to(tl.float32))
        tl.store(row + 1, first.to(tl.float32))
        tl.store(row + 2, (1 - first).to(tl.float32))
        tl.store(row + 3, second.to(tl.float32))
        tl.store(row + 4, (1 - second).to(tl.float32))
        tl.store(row + 5, lr.to(tl.float32))


@triton.jit(do_not_specialize=["seed"])
def _step_kernel(
    param_base,
    grad_base,
    state_base,
    step_base,
    table_ptr,
    blocks_ptr,
    scalars_ptr,
    seed,
    ALGORITHM: tl.constexpr,
    SR: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    DECAY: tl.constexpr,
    MOMENTUM: tl.constexpr,
    FIRST_STEP: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCKS: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Update blocks ``b .. b + BLOCKS - 1`` of ``ROWS x 4`` elements of parameter t, for
    ``blocks[program]`` = (t, b) (the table's scalars are read once for them; DEPENDENT: a
    programmatic dependent launch, which waits for `_scalars_kernel` before reading them).
    The table's row t: element offsets of the parameter, gradient and two states from
    ``param_base``, ``grad_base`` and ``state_base`` (multiples of 16 bytes, which
    `fused_step` checks: a thread then loads a row of four elements as one vector and
    draws its Philox block once), the element count, the global parameter index, the
    offset of its step count from ``step_base`` and the Philox block of the tensor's first
    element: its global index over 4 (a rank's shard of a sharded parameter starts at a
    multiple of 4 elements into the whole; a whole parameter, at 0).

    Scalars (float32, row t of ``scalars``, written by `_scalars_kernel`), by ALGORITHM:
    AdamW and Adam (decay, 1 - b1, b2, 1 - b2, 1 / sqrt(1 - b2^t), eps, lr / (1 - b1^t), L2
    wd) with DECAY for Adam's L2 decay; SGD (lr, momentum, 1 - dampening, weight_decay)
    with MOMENTUM "none", "momentum" or "nesterov" (FIRST_STEP: the buffer's first step,
    buffer = gradient), and DECAY when weight_decay != 0; Lion (decay, b1, 1 - b1, b2,
    1 - b2, lr)."""
    program = tl.program_id(0)
    tensor = tl.load(blocks_ptr + 2 * program)
    first_block = tl.load(blocks_ptr + 2 * program + 1).to(tl.int64)
    row_ptr = table_ptr + tensor * COLUMNS
    numel = tl.load(row_ptr + 4)
    param_base += tl.multiple_of(tl.load(row_ptr), 4)
    grad_base += tl.multiple_of(tl.load(row_ptr + 1), 4)
    first_base = state_base + tl.multiple_of(tl.load(row_ptr + 2), 4)
    second_base = state_base + tl.multiple_of(tl.load(row_ptr + 3), 4)
    bases = (param_base, grad_base, first_base, second_base)
    base, scalars = _parameter_scalars(step_base, row_ptr, scalars_ptr, tensor, DEPENDENT)
    first_group = tl.load(row_ptr + 7)
    if (first_block + BLOCKS) * (ROWS * 4) <= numel:
        # every block full: load the next block while this one is updated (two blocks in
        # flight a thread; the last prefetch is masked off as a whole)
        loaded = _load_block(
            bases, first_block * (ROWS * 4), None, ALGORITHM, MOMENTUM, FIRST_STEP, ROWS
        )
        for i in range(BLOCKS):  # a constexpr trip count: the interpreter's numpy needs one
            block = first_block + i
            following = _load_block(bases, (block + 1) * (ROWS * 4), i + 1 < BLOCKS, ALGORITHM,
                                    MOMENTUM, FIRST_STEP, ROWS)  # fmt: skip
            _update_block(bases, scalars, loaded, block * (ROWS * 4), None, seed, base,
                          first_group + block * ROWS, ALGORITHM, SR, MAXIMIZE, DECAY, MOMENTUM,
                          FIRST_STEP, ROWS)  # fmt: skip
            loaded = following
    else:
        for i in range(BLOCKS):
            block = first_block + i
            start = block * (ROWS * 4)
            if start < numel:
                mask = _block_position(start, ROWS) < numel
                loaded = _load_block(bases, start, mask, ALGORITHM, MOMENTUM, FIRST_STEP, ROWS)
                _update_block(bases, scalars, loaded, start, mask, seed, base,
                              first_group + block * ROWS, ALGORITHM, SR, MAXIMIZE, DECAY,
                              MOMENTUM, FIRST_STEP, ROWS)  # fmt: skip


@triton.jit
def _parameter_scalars(step_base, row_ptr, scalars_ptr, tensor, DEPENDENT: tl.constexpr):
    """What `_scalars_kernel` wrote for parameter ``tensor`` (waiting for it to finish when
    this is a dependent launch): the stream offset of its slot 0 and its eight scalars."""
    if DEPENDENT:
        tl.extra.cuda.gdc_wait()
    step = tl.load(step_base + tl.load(row_ptr + 6))
    base = (step << 32) + tl.load(row_ptr + 5) * 4
    scalar_ptr = scalars_ptr + tensor * SCALARS
    scalars = (
        tl.load(scalar_ptr),
        tl.load(scalar_ptr + 1),
        tl.load(scalar_ptr + 2),
        tl.load(scalar_ptr + 3),
        tl.load(scalar_ptr + 4),
        tl.load(scalar_ptr + 5),
        tl.load(scalar_ptr + 6),
        tl.load(scalar_ptr + 7),
    )
    return base, scalars


@triton.jit
def _block_position(start, ROWS: tl.constexpr):
    """Element indices of the ``ROWS x 4`` block from ``start`` (a row: one Philox block)."""
    return start + tl.arange(0, ROWS)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _load_block(
    bases,
    start,
    mask,
    ALGORITHM: tl.constexpr,
    MOMENTUM: tl.constexpr,
    FIRST_STEP: tl.constexpr,
    ROWS: tl.constexpr,
):
    """What the update of the ``ROWS x 4`` elements from ``start`` reads, as stored: the
    gradient, the parameter and the states it uses (the gradient stands in for the others)."""
    position = _block_position(start, ROWS)
    grad = tl.load(bases[1] + position, mask=mask)
    value = tl.load(bases[0] + position, mask=mask)
    first = grad
    second = grad
    if ALGORITHM != "sgd" or (MOMENTUM != "none" and not FIRST_STEP):  # SGD: its buffer only
        first = tl.load(bases[2] + position, mask=mask)
    if ALGORITHM == "adamw":
        second = tl.load(bases[3] + position, mask=mask)
    return grad, value, first, second


@triton.jit
def _update_block(
    bases,
    scalars,
    loaded,
    start,
    mask,
    seed,
    base,
    first_row_group,
    ALGORITHM: tl.constexpr,
    SR: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    DECAY: tl.constexpr,
    MOMENTUM: tl.constexpr,
    FIRST_STEP: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Update the ``ROWS x 4`` elements from ``start`` of one parameter from what
    `_load_block` read of them (``bases``: its parameter, gradient and state pointers;
    ``mask`` None for a full block; ``first_row_group``: the Philox block of its first row
    of four, in the whole parameter)."""
    scalar0, scalar1, scalar2, scalar3, scalar4, scalar5, scalar6, scalar7 = scalars
    lane = tl.arange(0, 4)[None, :]
    position = _block_position(start, ROWS)
    group = first_row_group + tl.arange(0, ROWS)  # Philox block of each row
    param_ptr = bases[0] + position
    first_ptr = bases[2] + position
    grad, value, first, second = loaded
    grad = grad.to(tl.float32)
    if MAXIMIZE:
        grad = -grad
    value = value.to(tl.float32)
    if ALGORITHM == "adamw":
        if DECAY:  # Adam's L2 decay
            grad = grad + value * scalar7
        second_ptr = bases[3] + position
        exp_avg = first.to(tl.float32)
        exp_avg_sq = second.to(tl.float32)
        value = value * scalar0
        exp_avg = exp_avg + (grad - exp_avg) * scalar1
        exp_avg_sq = exp_avg_sq * scalar2 + (scalar3 * grad) * grad
        denom = tl.sqrt_rn(exp_avg_sq) * scalar4 + scalar5
        value = value - scalar6 * tl.div_rn(exp_avg, denom)
        _store(first_ptr, exp_avg, mask, seed, base + 1, group, lane, SR)
        _store(second_ptr, exp_avg_sq, mask, seed, base + 2, group, lane, SR)
    elif ALGORITHM == "sgd":
        if DECAY:
            grad = grad + scalar3 * value
        if MOMENTUM != "none":
            if FIRST_STEP:
                buffer = grad
            else:
                buffer = first.to(tl.float32)
                buffer = buffer * scalar1 + scalar2 * grad
            if MOMENTUM == "nesterov":
                grad = grad + scalar1 * buffer
            else:
                grad = buffer
            _store(first_ptr, buffer, mask, seed, base + 1, group, lane, SR)
        value = value - scalar0 * grad
    else:
        tl.static_assert(ALGORITHM == "lion", "ALGORITHM must be adamw, sgd or lion")
        exp_avg = first.to(tl.float32)
        value = value * scalar0
        direction = exp_avg * scalar1 + scalar2 * grad
        # torch.sign: +0 for zeros and NaN
        update = (direction > 0).to(tl.float32) - (direction < 0).to(tl.float32)
        value = value - scalar5 * update
        exp_avg = exp_avg * scalar3 + scalar4 * grad
        _store(first_ptr, exp_avg, mask, seed, base + 1, group, lane, SR)
    _store(param_ptr, value, mask, seed, base, group, lane, SR)


@functools.lru_cache(maxsize=16)
def _block_table(numels: tuple[int, ...], rows: int, blocks: int, device: torch.device) -> Tensor:
    """int32 (parameter, first block) pairs, one per program of ``blocks`` blocks of
    ``rows x 4`` elements, parameter by parameter (cached: the parameters' sizes stay the
    same from step to step)."""
    per_program = rows * 4 * blocks
    counts = torch.tensor([cdiv(n, per_program) for n in numels], dtype=torch.int64)
    tensor = torch.repeat_interleave(torch.arange(len(numels)), counts)
    starts = torch.cumsum(counts, 0) - counts
    program = torch.arange(int(counts.sum())) - torch.repeat_interleave(starts, counts)
    pairs = torch.stack([tensor, program * blocks], dim=1)
    return pairs.to(device=device, dtype=torch.int32)


@functools.lru_cache(maxsize=16)
def _tensor_table(
    addresses: tuple[tuple[int, ...], ...],
    sizes: tuple[int, ...],
    numels: tuple[int, ...],
    indices: tuple[int, ...],
    first_groups: tuple[int, ...],
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """int64 rows (`_step_kernel`'s table) from the columns' data pointers: parameter,
    gradient, the two states (both counted from the first state) and the step count, in
    elements of ``sizes`` from each column's first tensor (`MisalignedError` unless the
    first four columns' pointers are multiples of 16 bytes), with each tensor's element
    count, global parameter index and first Philox block (``first_groups``); and the float32 rows of
    scalars that `_scalars_kernel` writes for them and `_step_kernel` reads.  Cached by
    the pointers, so a step over the same tensors copies nothing to the device and
    allocates nothing (CUDA graphs can capture it); the scalars can be shared by every
    step over these tensors because the step kernel has read them before the next step's
    scalars kernel, which the stream orders after it, writes them again (a CUDA graph's
    capture takes scalars of its own)."""
    if reduce(or_, chain.from_iterable(addresses[:4])) % 16:  # checked once for these tensors
        raise MisalignedError(
            "the fused step needs parameters, gradients and states that start on a multiple "
            "of 16 bytes (torch's allocators give that; these tensors come from elsewhere)"
        )
    bases = (addresses[0][0], addresses[1][0], addresses[2][0], addresses[2][0], addresses[4][0])
    offsets = [
        [(address - base) // size for address in column]
        for column, base, size in zip(addresses, bases, sizes, strict=True)
    ]
    rows = [*offsets[:4], list(numels), list(indices), offsets[4], list(first_groups)]
    table = torch.tensor(rows, dtype=torch.int64).T.contiguous().to(device)
    scalars = torch.empty((len(numels), SCALARS), dtype=torch.float32, device=device)
    return table, scalars


@functools.lru_cache(maxsize=16)
def _constants(constants: tuple[float, ...], device: torch.device) -> Tensor:
    """The float64 tensor of ``constants`` on ``device``, cached by value (so a step copies
    nothing to the device once the hyperparameters are known)."""
    return torch.tensor(constants, dtype=torch.float64).to(device)


def fused_step(
    algorithm: str,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[list[Tensor]],
    steps: list[Tensor],
    indices: list[int],
    lr: float | Tensor,
    constants: list[float],
    *,
    seed: int,
    sr: bool,
    maximize: bool,
    decay: bool = False,
    momentum: str = "none",
    first_step: bool = False,
    first_indices: list[int] | None = None,
) -> None:
    """Advance the int64 step counts ``steps`` and update ``params`` and their ``states``
    (one list per state slot, each as long as ``params``) in place: two launches, the
    scalars then the update, through the custom op ``stochround::fused_step`` (opaque to
    ``torch.compile``).  Same dtypes across each list, contiguous tensors on one device.
    ``constants`` (`_scalars_kernel`'s): AdamW and Adam (b1, b2, eps, decoupled wd, the 32
    ``power_squares`` of b1 and of b2, L2 wd), SGD (momentum, dampening, wd), Lion (b1,
    b2, wd);
    ``lr`` a float or a one-element tensor (a float is a constant to a compiled graph);
    ``decay``: Adam's L2 or SGD's weight decay applied to the gradient; ``momentum`` (SGD):
    "none", "momentum" or "nesterov", ``first_step`` its buffer's first step;
    ``first_indices``: where each tensor starts in the parameter it is a shard of (the
    global row-major index of its first element, a multiple of 4: `stochround.shards.
    first_index`), its elements drawing the words of their global indices; None: every
    tensor is a whole parameter (0)."""
    if not params:
        return
    if first_indices is None:
        first_groups = [0] * len(params)
    else:
        if any(start % 4 for start in first_indices):
            raise ValueError(
                f"first_indices must be multiples of 4 (a Philox block of four words); got "
                f"{first_indices}"
            )
        first_groups = [start // 4 for start in first_indices]
    device = params[0].device
    lr_tensor, lr_value = None, 0.0
    if isinstance(lr, Tensor):
        # asked only for an lr off the device (torch.compile cannot trace the question)
        if lr.device != device and device.type == "cuda" and _capturing():
            raise ValueError(
                f"lr must be a tensor on {device} to capture a step in a CUDA graph (a copy "
                f"from {lr.device} cannot be captured); got an lr tensor on {lr.device}"
            )
        lr_tensor = lr.reshape(()).to(device)
    else:  # a kernel argument: no tensor to fill on the device each step
        lr_value = float(lr)
    # the custom op is the boundary torch.compile sees; eagerly its dispatch (version
    # counters of every tensor) would cost more host time than the launches
    launch = _fused_step_op if torch.compiler.is_compiling() else _fused_step_impl
    launch(
        params,
        grads,
        list(chain.from_iterable(states)),
        steps,
        lr_tensor,
        lr_value,
        algorithm,
        indices,
        constants,
        as_int64(seed),
        sr,
        maximize,
        decay,
        momentum,
        first_step,
        first_groups,
    )


def _fused_step_impl(
    params: list[Tensor],
    grads: list[Tensor],
    states: list[Tensor],
    steps: list[Tensor],
    lr_tensor: Tensor | None,
    lr_value: float,
    algorithm: str,
    indices: list[int],
    constants: list[float],
    seed: int,
    sr: bool,
    maximize: bool,
    decay: bool,
    momentum: str,
    first_step: bool,
    first_groups: list[int],
) -> None:
    """`fused_step` with the states flattened slot by slot, the lr a 0-d tensor or, with
    none, ``lr_value``, and each tensor's first Philox block (``first_groups``)."""
    count = len(params)
    slots = [states[i : i + count] for i in range(0, len(states), count)]
    state_lists = slots + [params] * (2 - len(slots))  # SGD without momentum: unused
    columns = (params, grads, *state_lists, steps)
    addresses = tuple(tuple(map(DATA_PTR, column)) for column in columns)
    device = params[0].device
    numels = tuple(map(NUMEL, params))
    table, scalars = _tensor_table(
        addresses,
        tuple(column[0].element_size() for column in columns),
        numels,
        tuple(indices),
        tuple(first_groups),
        device,
    )
    blocks = _block_table(numels, _ROWS, BLOCKS, device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # a graph keeps the pointers it captured: its scalars are its own (in its pool)
        scalars = torch.empty_like(scalars)
    # the step kernel starts while the scalars kernel runs (it waits before reading the
    # step counts and scalars): the launch gap between the two is hidden
    dependent = _dependent_launch(device)
    step_options = (algorithm, sr, maximize, decay, momentum, first_step, dependent)
    launches = (
        _scalars_launch(algorithm, lr_tensor is not None, dependent),
        _step_launch(*step_options),
    )
    # without an lr tensor the kernel reads the bits; the table stands in for the pointer
    arguments = (
        (steps[0], table, table if lr_tensor is None else lr_tensor, _float64_bits(lr_value),
         _constants(tuple(constants), device), scalars),
        (params[0], grads[0], state_lists[0][0], steps[0], table, blocks, scalars, seed),
    )  # fmt: skip
    index = params[0].get_device()  # -1 on the CPU (the interpreter)
    # Triton launches on the current device, which must be the parameters' (a device
    # switch costs more host time than the launches: made only when needed)
    if index >= 0 and current_device() != index:
        with torch.cuda.device(index):
            _launch(launches, index, (count, blocks.shape[0]), arguments)
    else:
        _launch(launches, index, (count, blocks.shape[0]), arguments)


def _launch(
    launches: tuple[Launch, Launch],
    device: int,
    programs: tuple[int, int],
    arguments: tuple[tuple[object, ...], tuple[object, ...]],
) -> None:
    """Launch the scalars kernel then the step kernel (``launches``) on the current stream
    of ``device`` (the current device, or -1 on the CPU) with their ``programs`` and
    runtime ``arguments``."""
    for launch, count, args in zip(launches, programs, arguments, strict=True):
        launch(device, count, *args)


@functools.cache
def _scalars_launch(algorithm: str, lr_tensor: bool, dependent: bool) -> Launch:
    """`_scalars_kernel` bound to its constexprs (ALGORITHM, LR_TENSOR, DEPENDENT)."""
    constants = {"ALGORITHM": algorithm, "LR_TENSOR": lr_tensor, "DEPENDENT": dependent}
    return Launch(_scalars_kernel, constants)


@functools.cache
def _step_launch(
    algorithm: str,
    sr: bool,
    maximize: bool,
    decay: bool,
    momentum: str,
    first_step: bool,
    dependent: bool,
) -> Launch:
    """`_step_kernel` bound to its constexprs (`fused_step`'s options, the block shape and
    DEPENDENT) and its launch options: WARPS warps, no fused multiply-adds (one rounding
    per operation, as the PyTorch path), a programmatic dependent launch when DEPENDENT."""
    constants = {
        "ALGORITHM": algorithm,
        "SR": sr,
        "MAXIMIZE": maximize,
        "DECAY": decay,
        "MOMENTUM": momentum,
        "FIRST_STEP": first_step,
        "ROWS": _ROWS,
        "BLOCKS": BLOCKS,
        "DEPENDENT": dependent,
        "num_warps": WARPS,
        "enable_fp_fusion": False,
        "launch_pdl": dependent,
    }
    return Launch(_step_kernel, constants)


_fused_step_op = torch.library.custom_op(
    "stochround::fused_step", _fused_step_impl, mutates_args=("params", "states", "steps")
)


@_fused_step_op.register_fake
def _(params, grads, states, steps, lr_tensor, lr_value, algorithm, indices, constants, seed,
      sr, maximize, decay, momentum, first_step, first_groups) -> None:  # fmt: skip
    return None


@functools.lru_cache(maxsize=8)
def _dependent_launch(device: torch.device) -> bool:
    """Whether the step kernel can be a programmatic dependent launch (Hopper and later;
    the interpreter has no such launch)."""
    return (
        device.type == "cuda"
        and not INTERPRETED
        and torch.cuda.get_device_capability(device) >= (9, 0)
    )


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never while compiling)."""
    return not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing()


def _float64_bits(value: float) -> int:
    """The IEEE binary64 bits of ``value`` as a signed 64-bit integer."""
    return struct.unpack("<q", struct.pack("<d", value))[0]
