"""A delayed layer's tensor scales and its amax record on the device, one launch each for
one or two roles: the window's NVFP4 tensor scales from the layer's amax history
(`window_tensor_scales`; with the step's current amaxes, taken where a window is empty and
recorded, all decided on the device), and the record of the amaxes a step's quantize
launches raised (`record_amaxes`).  The spec is `stochround.nn.amax_history`'s PyTorch route
(``window_amax`` then ``nvfp4_tensor_scales``; ``record_amax``), which takes a dozen small
operations a role for each; these take one launch for all of a call's roles
(docs/guide/recipes.md, "Delayed scaling").

The history: ``amaxes`` (fp32) and ``steps`` (int64), each of shape (roles, width),
contiguous; the step a 0-d int64 tensor on the same device.  Row ``r`` of a role holds
its amax of step ``steps[r, c]`` in column ``c = step mod width``."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import current_device
from .grid import next_power_of_2
from .runtime import Launch, bound_launch
from .tensor_scales import tensor_scales_of

_CANONICAL_NAN_BITS = tl.constexpr(0x7FC00000)


class HistoryRoles(NamedTuple):
    """The roles one launch serves (a constexpr): each one's row of the history and its
    window's length (``amax_history``, steps ``s - length .. s - 1``), in the order of the
    launch's outputs."""

    ROWS: tuple[int, ...]
    LENGTHS: tuple[int, ...]


@triton.jit
def _window_scales_kernel(
    amaxes_ptr,
    steps_ptr,
    step_ptr,
    out_ptr,
    current_ptr,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    ROLES: tl.constexpr,
    CURRENT: tl.constexpr,
    RECORD: tl.constexpr,
):
    """One program: for each role ``i`` of ROLES, the largest amax recorded at steps
    ``step - length .. step - 1`` (-1 where none is; NaN where one is NaN), its NVFP4
    tensor scales ("te") at ``out[2 i]`` (S_dec) and ``out[2 i + 1]`` (S_enc), and a 0 at
    ``out[2 n + i]`` (n roles): the record the step's quantize launch raises to its amax.
    CURRENT: ``current[i]`` (fp32, the role's amax at the step: a NaN's sign bit clear)
    taken where the window's amax is below 0 (none recorded); RECORD: then recorded
    (`_record_role`)."""
    step = tl.load(step_ptr)
    columns = tl.arange(0, BLOCK)
    inside_row = columns < WIDTH
    ROWS: tl.constexpr = ROLES.ROWS
    LENGTHS: tl.constexpr = ROLES.LENGTHS
    for i in tl.static_range(len(ROWS)):
        row = ROWS[i]
        steps = tl.load(steps_ptr + row * WIDTH + columns, mask=inside_row, other=-1)
        amaxes = tl.load(amaxes_ptr + row * WIDTH + columns, mask=inside_row, other=0.0)
        inside = inside_row & (steps >= 0) & (steps >= step - LENGTHS[i]) & (steps < step)
        values = tl.where(inside, amaxes, -1.0)
        has_nan = tl.max((values != values).to(tl.int32), axis=0) > 0
        best = tl.max(tl.where(values != values, -1.0, values), axis=0)
        bits = best.to(tl.int32, bitcast=True)
        # the bits `tensor_scales_of` reads its zero and NaN from: either zero as 0, a NaN
        # positive (torch.amax gives NaN where one value is NaN)
        bits = tl.where(best == 0.0, 0, bits)
        bits = tl.where(has_nan, _CANONICAL_NAN_BITS, bits)
        if CURRENT:
            current = tl.load(current_ptr + i)
            # the spec's test, ``recorded < 0``: no amax in the window (-1), or a negative
            # one recorded
            below = (best < 0.0) & (has_nan == 0)
            bits = tl.where(below, current.to(tl.int32, bitcast=True), bits)
        scale, encode = tensor_scales_of(bits, "te")
        tl.store(out_ptr + 2 * i, scale)
        tl.store(out_ptr + 2 * i + 1, encode)
        tl.store(out_ptr + 2 * len(ROWS) + i, 0.0)
        if RECORD:
            _record_role(amaxes_ptr, steps_ptr, step, row, current, WIDTH)


@triton.jit
def _record_role(amaxes_ptr, steps_ptr, step, row, current, WIDTH: tl.constexpr):
    """``current`` stored as row ``row``'s amax at ``step``, in column ``step mod WIDTH``,
    with the step, unless the column holds this step's amax already (a recomputation's
    record: the first one is kept)."""
    column = ((step % WIDTH) + WIDTH) % WIDTH  # the floor modulo PyTorch's ``%`` takes
    where = row * WIDTH + column
    recorded = tl.load(steps_ptr + where) == step
    kept = tl.where(recorded, tl.load(amaxes_ptr + where), current)
    tl.store(amaxes_ptr + where, kept)
    tl.store(steps_ptr + where, step)


@triton.jit
def _record_kernel(
    amaxes_ptr, steps_ptr, step_ptr, record_ptr, WIDTH: tl.constexpr, ROLES: tl.constexpr
):
    """One program: for each role ``i`` of ROLES, ``record[i]`` recorded as its amax at
    the step (`_record_role`)."""
    step = tl.load(step_ptr)
    ROWS: tl.constexpr = ROLES.ROWS
    for i in tl.static_range(len(ROWS)):
        _record_role(amaxes_ptr, steps_ptr, step, ROWS[i], tl.load(record_ptr + i), WIDTH)


def _launch_one(launch: Launch, amaxes: Tensor, *args: Tensor | None) -> None:
    """One program of ``launch`` over the history ``amaxes`` and ``args``, on the history's
    device (made current for the launch where it is not: Triton launches on the current
    one; device 0 off CUDA, the interpreter's)."""
    device = amaxes.device.index if amaxes.is_cuda else 0
    if amaxes.is_cuda and device != current_device():
        with torch.cuda.device(device):
            launch(device, 1, amaxes, *args)
    else:
        launch(device, 1, amaxes, *args)


@functools.cache
def _window_launch(width: int, roles: HistoryRoles, current: bool, record: bool) -> Launch:
    """`_window_scales_kernel` bound for ``width`` columns, ``roles``, whether it takes the
    current amaxes and whether it records them (once for each)."""
    constants = {
        "WIDTH": width,
        "BLOCK": next_power_of_2(width),
        "ROLES": roles,
        "CURRENT": current,
        "RECORD": record,
    }
    return bound_launch(_window_scales_kernel, tuple(constants.items()))


@functools.cache
def _record_launch(width: int, roles: HistoryRoles) -> Launch:
    """`_record_kernel` bound for ``width`` columns and ``roles`` (once for each)."""
    return bound_launch(_record_kernel, (("WIDTH", width), ("ROLES", roles)))


def _checked(amaxes: Tensor, steps: Tensor, step: Tensor) -> None:
    """ValueError unless the history and the step are as the module docstring says."""
    if amaxes.dtype != torch.float32 or steps.dtype != torch.int64 or step.dtype != torch.int64:
        raise ValueError("the history takes fp32 amaxes, int64 steps and an int64 step")
    if amaxes.shape != steps.shape or amaxes.dim() != 2 or step.numel() != 1:
        raise ValueError(
            f"amaxes and steps must be (roles, width) alike and the step one value; got "
            f"{tuple(amaxes.shape)}, {tuple(steps.shape)} and {step.numel()} values"
        )
    if not (amaxes.is_contiguous() and steps.is_contiguous()):
        raise ValueError("the history's amaxes and steps must be contiguous")


def window_tensor_scales(
    amaxes: Tensor,
    steps: Tensor,
    step: Tensor,
    roles: HistoryRoles,
    current: Tensor | None = None,
    record: bool = False,
) -> Tensor:
    """Each role's window tensor scales, S_dec and S_enc (2 n fp32 for n roles, in the
    roles' order), then n zeroed fp32 (each role's record for the step's quantize launch),
    in one launch (`_window_scales_kernel`; `stochround.nn.amax_history.window_scales` is
    its spec).  ``current`` (n fp32, each role's amax at the step, from a launch of
    magnitudes): taken where a role's window is empty and, where ``record``, recorded in
    the history, in the same launch (`stochround.nn.amax_history.delayed_tensor_scale`
    then `record_amax` of each role is the spec): a delayed step's scales decided on the
    device."""
    _checked(amaxes, steps, step)
    n = len(roles.ROWS)
    if current is not None and (
        current.dtype != torch.float32 or current.numel() != n or not current.is_contiguous()
    ):
        raise ValueError(f"current must hold {n} contiguous fp32 values")
    if record and current is None:
        raise ValueError("record needs the current amaxes")
    launch = _window_launch(amaxes.shape[1], roles, current is not None, record)
    out = torch.empty(3 * n, dtype=torch.float32, device=amaxes.device)
    _launch_one(launch, amaxes, steps, step, out, current)
    return out


def record_amaxes(
    amaxes: Tensor, steps: Tensor, step: Tensor, roles: HistoryRoles, record: Tensor
) -> None:
    """Records ``record[i]`` (fp32, one a role) as role ``i``'s amax at the step, in place,
    in one launch (`_record_kernel`; `stochround.nn.amax_history.record_amax` is its
    spec)."""
    _checked(amaxes, steps, step)
    if record.dtype != torch.float32 or record.numel() < len(roles.ROWS):
        raise ValueError(f"record must hold {len(roles.ROWS)} fp32 values")
    launch = _record_launch(amaxes.shape[1], roles)
    _launch_one(launch, amaxes, steps, step, record)


__all__ = ["HistoryRoles", "record_amaxes", "window_tensor_scales"]
