"""Delayed tensor scales: a `QuantizedLinear`'s amax history, the executable spec of
``tensor_scale="delayed"`` (docs/guide/recipes.md, "Delayed tensor scales").

A role with a delayed tensor scale (`stochround.nn.recipes.QuantSpec`) takes NVFP4's
tensor scale at step ``s`` from ``A = max(a(t) : s - H <= t < s, a(t) recorded)``, the
largest amax recorded for the role over its ``H = amax_history`` previous steps, by the
rule that "amax" applies to the current amax (`stochround.blocks.scales.nvfp4_tensor_scales`
in TE's order, ``S_enc = min(2688 / A, FLT_MAX)`` and ``S_dec = 1 / S_enc``), so that an
amax that does not change gives current scaling's bits; where no step of the window is
recorded (the layer's first step), from the current amax ``a(s)``, as "amax".  Each
training step records its current amax ``a(s)`` (the amax "amax" would take: after the
RHT, `operand_amax`) for the steps after it.

The history is two buffers of the layer, each ``(len(ROLES), width)`` with ``width =
H_max + 1``: the amaxes (fp32) and the step each was recorded at (int64, `EMPTY` where
none).  Step ``s`` records in column ``s mod width``, which its own window (steps ``s -
H .. s - 1``, the other columns) never reads: a step's scale is a function of the history
and the step, not of the order its roles are quantized in, and an activation checkpoint's
recomputation of step ``s`` finds the scale its original forward found.  A step's amax is
recorded once, by the role's first quantization at that step (a recomputation finds it
there and keeps it).  All of it runs on the device: the host reads no value.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal, NamedTuple

import torch
from torch import Tensor

from ..blocks.hadamard import hadamard_fp32
from ..blocks.reference import absolute_max, rht_rotated
from ..blocks.request import default_signs
from ..blocks.scales import TensorScale, nvfp4_tensor_scales
from ..kernels.availability import on_kernel_device
from .graph_notes import host_note
from .quant_spec import QuantSpec
from .recipes import ROLES
from .streams import column_step as device_column_step

if TYPE_CHECKING:  # the kernel module imports Triton: only its type here
    from ..kernels.delayed_scales import HistoryRoles

# a history column no step has recorded in
EMPTY = -1
# each role's row of the history buffers
ROLE_ROWS = {role: row for row, role in enumerate(ROLES)}


# the most recomputable columns a layer's `HostWindows` remembers the step of (a forward's
# columns wait in a checkpoint's keeping until their recomputation; beyond: one sync each)
HOST_COLUMNS = 256


class HostWindows:
    """The host's copy of a layer's history, which the kernels' route decides from without
    reading the device: the layer's step (its counter's value) and, by role, the steps the
    role recorded at (the latest ``width``: those the buffers hold).  Made from the buffers
    (`from_buffers`: one synchronization, at a layer's first kernels' step and after a
    state dict loads), then kept as the layer's steps advance and record (`HostCopy`
    holds it, for the eager step and the compiled ops alike); a recomputed forward's step,
    and a compiled backward's, is found by its column (`column_step`), which its original
    forward registered (`take_step`)."""

    def __init__(self, step: int, recorded: dict[str, list[int]], width: int) -> None:
        self.step = step
        self.recorded = {
            role: deque(sorted(recorded.get(role, [])), maxlen=width) for role in ROLES
        }
        self.columns: dict[int, tuple[weakref.ref[Tensor], int]] = {}

    @classmethod
    def from_buffers(cls, counter: Tensor | int, steps: Tensor) -> HostWindows:
        """The host's copy of the counter (the next training forward's step) and the
        ``steps`` buffer (one synchronization)."""
        rows = steps.tolist()
        recorded = {
            role: [step for step in rows[row] if step >= 0] for role, row in ROLE_ROWS.items()
        }
        return cls(int(counter), recorded, steps.shape[1])

    def take_step(self, column: Tensor) -> int:
        """A training forward's step (the counter's value before it advanced), the counter's
        copy advanced, and ``column`` (its offsets) registered as this step's."""
        step = self.step
        self.step += 1
        if len(self.columns) >= HOST_COLUMNS:
            self.columns.clear()
        self.columns[column.data_ptr()] = (weakref.ref(column), step)
        return step

    def column_step(self, column: Tensor) -> int:
        """The step of a column a recomputation or a compiled backward reads again:
        registered by its forward (`take_step`), else read from the device (one
        synchronization).  Found by its memory, not its Python object (AOT autograd may
        hand a compiled backward another tensor of the same memory): a column registered
        and still alive at that address is this one (no other tensor can hold its memory
        meanwhile; a column is never written in place)."""
        known = self.columns.get(column.data_ptr())
        if known is not None:
            registered = known[0]()
            if registered is not None and registered.data_ptr() == column.data_ptr():
                return known[1]
        return int(device_column_step(column))

    def window_recorded(self, role: str, step: int, length: int) -> bool:
        """Whether ``role`` recorded an amax at one of the steps ``step - length .. step -
        1`` (`window_amax` finds one there)."""
        return any(step - length <= each < step for each in self.recorded[role])

    def mark(self, role: str, step: int) -> None:
        """``role`` recorded at ``step`` (once: a recomputation's record is the same one)."""
        if step not in self.recorded[role]:
            self.recorded[role].append(step)


class HostCopy:
    """What the host keeps of one history (`HOST_COPIES`, by the memory of its ``amaxes``
    buffer): its `HostWindows` (None: made from the buffers at the next step that can make
    it) and whether a CUDA-graph capture has recorded a step of it (``captured``: its
    replays write the buffers with no Python running, so the host's copy would fall
    behind them: the device's decisions from then on, for good)."""

    def __init__(self, amaxes: Tensor) -> None:
        self.buffer = weakref.ref(amaxes)
        self.windows: HostWindows | None = None
        self.captured = False

    def holds(self, amaxes: Tensor) -> bool:
        """Whether ``amaxes`` is this copy's buffer or a tensor of its memory (a buffer
        alive at an address is the only tensor memory there, but for its aliases)."""
        buffer = self.buffer()
        return buffer is not None and buffer.data_ptr() == amaxes.data_ptr()


# every layer's host copy of its history, by the address of its ``amaxes`` buffer: the
# compiled ops are given the buffers (the same memory, not always the same Python object:
# AOT autograd hands the backward another tensor of it), never the layer; weakly held, so
# a dropped layer frees its buffers, and a copy whose buffer died is dropped when found
HOST_COPIES: dict[int, HostCopy] = {}


class HostRoute:
    """Whether any history may take the host's decisions: off for the rest of the process
    once a compiled delayed op was given a history buffer no layer registered (a copy of
    it, where the compiler did not write a mutated argument in place, or a buffer swapped
    without its layer's knowledge): its writes would leave that layer's copy behind.
    ``warming``: the compiled ops' warm-up runs (`warming_up`)."""

    on = True
    warming = False


@contextlib.contextmanager
def warming_up() -> Iterator[None]:
    """The compiled ops' warm-up (`stochround.nn.opaque_matmul.warm_up`: their bodies run
    at trace time on zeros, no layer's buffers): `host_step` takes the device's
    decisions and leaves every host copy and `HostRoute` as they are."""
    before = HostRoute.warming
    HostRoute.warming = True
    try:
        yield
    finally:
        HostRoute.warming = before


def register_history(amaxes: Tensor | None) -> None:
    """Register a layer's ``amaxes`` buffer for the host's copy (`HOST_COPIES`; no copy
    made yet): where a layer makes or moves its buffers, so that the compiled ops find its
    copy by the buffer they are given.  Nothing for no buffer or one without memory
    (``meta``); a buffer registered already keeps its copy."""
    if amaxes is None or amaxes.device.type == "meta" or host_copy(amaxes) is not None:
        return
    for address in [each for each, copy in HOST_COPIES.items() if copy.buffer() is None]:
        del HOST_COPIES[address]
    HOST_COPIES[amaxes.data_ptr()] = HostCopy(amaxes)


def host_copy(amaxes: Tensor) -> HostCopy | None:
    """The registered copy of the history whose ``amaxes`` buffer this is (or a tensor of
    its memory), or None."""
    copy = HOST_COPIES.get(amaxes.data_ptr())
    return copy if copy is not None and copy.holds(amaxes) else None


def forget_windows(amaxes: Tensor | None) -> None:
    """The host's windows of this history made again from the buffers at its next step (a
    state dict loaded into them, a new step counter, another recipe)."""
    copy = None if amaxes is None else host_copy(amaxes)
    if copy is not None:
        copy.windows = None


def stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph (torch.compile's
    ``mode="reduce-overhead"`` records a step so; never on a machine without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# which call of a compiled delayed layer's ops reads the history: the forward op as the
# training or evaluation forward, the forward op recomputed in the backward (activation
# checkpointing), the backward op
Phase = Literal["forward", "recomputed", "backward"]


class Recorded(NamedTuple):
    """A step function's note (`stochround.nn.graph_notes.host_note`) that ``roles`` recorded
    their amaxes at the call's step on the kernels' route: the caller marks them in the
    host's copy (`HostStep.mark`), after the call, run or replayed."""

    roles: tuple[str, ...]


class HostStep(NamedTuple):
    """The host's side of one call of a delayed layer's step functions: the layer's
    `HostWindows` and the call's step as the host knows it.  The host decides before the
    call (`decided`) and marks what the call recorded after it (`mark`), so that the step
    function itself reads and changes no host state (a step graph can capture it)."""

    windows: HostWindows
    step: int

    def decided(self, lengths: Iterable[tuple[str, int]]) -> frozenset[str]:
        """The roles, of ``lengths`` (each delayed role with its window's length), whose
        window at the step holds a recorded amax (`HostWindows.window_recorded`): what
        the step function's `AmaxHistory` carries as its ``windows``."""
        return frozenset(
            role
            for role, length in lengths
            if self.windows.window_recorded(role, self.step, length)
        )

    def mark(self, notes: Iterable[object]) -> None:
        """The roles a call's `Recorded` notes name marked as recorded at the step."""
        for each in notes:
            if isinstance(each, Recorded):
                for role in each.roles:
                    self.windows.mark(role, self.step)


def host_step(
    amaxes: Tensor, steps: Tensor, column: Tensor, record: bool, phase: Phase
) -> HostStep | None:
    """The host's side of a delayed layer's call at the step of the offsets ``column``
    (eager, graphed or a compiled op's body alike), or None where the device decides
    (the spec's route): off the kernels' device, in the compiled ops' warm-up
    (`warming_up`: no copy looked up), with no registered copy (the host route turned off:
    `HostRoute`), inside a CUDA-graph capture (the copy marked ``captured``: `HostCopy`)
    or once the copy is captured.  A forward makes the windows where there are none (from
    the buffers and the column's step: one synchronization); a recomputed forward or a
    backward without them takes the device's decisions, whose records the next forward's
    copy reads.  A training forward takes the next step (`HostWindows.take_step`), an
    evaluation forward the next one unadvanced, and a call that reads a forward's step
    again (a recomputation, a backward) finds it by its column
    (`HostWindows.column_step`)."""
    if HostRoute.warming or not on_kernel_device(amaxes):  # (the CPU: the spec's)
        return None
    copy = host_copy(amaxes)
    if copy is None:
        turn_host_route_off()
        return None
    if stream_capturing():
        copy.captured = True
    if copy.captured or not HostRoute.on:
        return None
    windows = copy.windows
    if windows is None:
        if phase != "forward":
            return None
        windows = copy.windows = HostWindows.from_buffers(device_column_step(column), steps)
    if phase != "forward":
        return HostStep(windows, windows.column_step(column))
    if record:
        return HostStep(windows, windows.take_step(column))
    return HostStep(windows, windows.step)


def turn_host_route_off() -> None:
    """`HostRoute` off for the rest of the process, with a warning the first time: every
    delayed step then takes the device's decisions (an amax pass per delayed operand, no
    two-orientation pair), the same bits."""
    if HostRoute.on:
        warnings.warn(
            "a compiled delayed layer's op was given an amax history buffer that no "
            "QuantizedLinear registered (a copy of it, or a buffer swapped behind the "
            "layer): delayed tensor scales take the device's decisions from now on (the same "
            "bits, an amax pass per delayed operand)",
            RuntimeWarning,
            stacklevel=2,
        )
    HostRoute.on = False


class AmaxHistory(NamedTuple):
    """A layer's amax history as one step reads it: the buffers ``amaxes`` (fp32) and
    ``steps`` (int64), the step (a 0-d int64 tensor) and whether the step records its
    amaxes (a training step; an evaluation forward only reads); on the kernels' route,
    ``windows``: the delayed roles whose window the host knows recorded (`HostStep.decided`,
    taken before the step function and passed to it, so that the step graphs key a graph
    per decision); None: every decision on the device (the spec's route)."""

    amaxes: Tensor
    steps: Tensor
    step: Tensor
    record: bool
    windows: frozenset[str] | None = None


def history_at(
    amaxes: Tensor,
    steps: Tensor,
    column: Tensor,
    record: bool,
    windows: frozenset[str] | None = None,
) -> AmaxHistory:
    """The history of buffers ``amaxes`` and ``steps`` at the step of the stream offsets
    ``column`` (`stochround.nn.streams.column_step`: read on the device), recording where
    ``record``, with the host's decisions ``windows`` (None: every decision on the device,
    the spec's route).  What a delayed layer's step functions read, which take the buffers
    as tensors (`stochround.nn.delayed_steps`)."""
    return AmaxHistory(amaxes, steps, device_column_step(column), record, windows)


def history_width(specs: Iterable[QuantSpec]) -> int:
    """The columns of a layer's history buffers: one more than the longest
    ``amax_history`` of its delayed roles (a step's own column besides its window), 0
    where no role is delayed (the layer has no history)."""
    lengths = [spec.amax_history for spec in specs if spec.tensor_scale == "delayed"]
    return 1 + max(lengths) if lengths else 0


def empty_history(width: int, device: torch.device | str | None) -> tuple[Tensor, Tensor]:
    """New history buffers of ``width`` columns on ``device``: amaxes 0, steps `EMPTY`."""
    shape = (len(ROLES), width)
    amaxes = torch.zeros(shape, dtype=torch.float32, device=device)
    return amaxes, torch.full(shape, EMPTY, dtype=torch.int64, device=device)


def window_amax(history: AmaxHistory, role: str, length: int) -> Tensor:
    """The largest amax recorded for ``role`` at steps ``s - length .. s - 1`` (0-d fp32;
    NaN where one of them is NaN), or -1 where none of them is recorded."""
    row = ROLE_ROWS[role]
    steps, step = history.steps[row], history.step
    inside = (steps >= 0) & (steps >= step - length) & (steps < step)
    return torch.where(inside, history.amaxes[row], -1.0).amax()


def operand_amax(operand: Tensor, spec: QuantSpec, signs: Tensor | None) -> Tensor:
    """max |x| of the values NVFP4's tensor scale is computed from (0-d fp32), the amax
    "amax" takes: the 2-D operand rotated along its last axis by the spec's RHT (``signs``:
    per-step signs, None: the fixed ones), as `rht_rotated` rotates it (in fp32, rounded to
    nearest-even to a bf16 or fp16 operand's dtype, then to bf16 with ``rht_bf16``), in
    fp32.  Each rounding is applied to the amax instead of to every rotated value:
    rounding to nearest is monotonic and odd, so the rounded values' largest magnitude is
    the rounded largest magnitude (the same bits, NaN kept), and a cast rounds an fp32 to
    nearest-even as the core's rounding does (never traced: eager steps and the compiled
    layer's opaque ops run it).  So no rounding kernel runs, whose per-stream scratch, made
    in torch.compile's CUDA-graph warm-up (``mode="reduce-overhead"``), would stay in the
    graphs' pool, and nothing reads the device (`hadamard_fp32` is unchecked), which a
    CUDA-graph capture refuses.  A float64 operand is rotated in float64 (`rht_rotated`)."""
    if spec.rht is None:
        return absolute_max(operand)
    if operand.dtype == torch.float64:
        rotated, _ = rht_rotated(operand, spec.rht, signs, -1, spec.rht_bf16)
        return absolute_max(rotated)
    if signs is None:
        signs = default_signs(spec.rht, operand.device)
    amax = absolute_max(hadamard_fp32(operand.float(), spec.rht, signs))
    if operand.dtype != torch.float32:  # bf16 or fp16: the rotation rounded back to it
        amax = amax.to(operand.dtype)
    if spec.rht_bf16:
        amax = amax.to(torch.bfloat16)
    return amax.to(torch.float32)


def delayed_tensor_scale(
    history: AmaxHistory, role: str, length: int, current: Tensor
) -> TensorScale:
    """NVFP4's tensor scales (TE's order) of ``role`` at the history's step: from the
    window's largest recorded amax (`window_amax`), or the ``current`` one where none is
    recorded."""
    recorded = window_amax(history, role, length)
    return nvfp4_tensor_scales(torch.where(recorded < 0, current, recorded), "te")


def record_amax(history: AmaxHistory, role: str, current: Tensor) -> None:
    """Record ``current`` as ``role``'s amax at the history's step, in column ``step mod
    width``, unless the step records nothing or the column holds this step's amax already
    (a recomputation's: the first quantization's is kept)."""
    if not history.record:
        return
    row = ROLE_ROWS[role]
    amaxes, steps = history.amaxes[row], history.steps[row]
    column = (history.step % steps.shape[0]).reshape(1)
    step = history.step.reshape(1)
    recorded = steps.index_select(0, column) == step
    kept = torch.where(recorded, amaxes.index_select(0, column), current.reshape(1))
    amaxes.index_copy_(0, column, kept)
    steps.index_copy_(0, column, step)


class KernelScale(NamedTuple):
    """What a kernel quantizing a delayed role's operand takes: the tensor scales S_dec,
    S_enc (2 fp32 on the device) from the window's amax, or None where the host knows the
    window empty (`HostWindows.window_recorded`: the kernels compute the current amax's,
    current scaling's route), and the zeroed fp32 the launch raises to the current amax
    (`stochround.kernels.block_kernel.record_amax`)."""

    scales: Tensor | None
    record: Tensor


def kernel_scale(history: AmaxHistory, role: str, length: int) -> KernelScale:
    """`KernelScale` of ``role`` at the history's step: the window's scales computed on the
    device from the buffers (no synchronization) where the host knows a recorded step in
    it (the history's ``windows``), else None."""
    if history.windows is None:
        raise ValueError("the kernels' route of a delayed scale needs the host's decisions")
    if role not in history.windows:
        return KernelScale(None, history.amaxes.new_zeros(1))
    out = launched_window_scales(history, ((role, length),))
    return KernelScale(out[:2], out[2:])


def window_scales(history: AmaxHistory, role: str, length: int) -> Tensor:
    """NVFP4's tensor scales S_dec, S_enc (2 fp32, TE's order) of the largest amax in
    ``role``'s window (`window_amax`), computed on the device: what a kernel takes as a
    delayed role's given scales where the host knows the window recorded.  The spec of
    `launched_window_scales`."""
    return torch.stack(tuple(nvfp4_tensor_scales(window_amax(history, role, length), "te")))


@functools.lru_cache(maxsize=64)
def history_roles(windows: tuple[tuple[str, int], ...]) -> HistoryRoles:
    """The `stochround.kernels.delayed_scales.HistoryRoles` of roles with their window
    lengths ``windows`` (made once for each)."""
    from ..kernels.delayed_scales import HistoryRoles  # the kernel module imports Triton

    rows = tuple(ROLE_ROWS[role] for role, _ in windows)
    return HistoryRoles(rows, tuple(length for _, length in windows))


def launched_window_scales(history: AmaxHistory, windows: tuple[tuple[str, int], ...]) -> Tensor:
    """`window_scales` of each role with its window length in ``windows`` (S_dec, S_enc of
    each, in order), then a zeroed fp32 for each (its record), in one launch
    (`stochround.kernels.delayed_scales.window_tensor_scales`): the kernels' route, where a
    dozen small operations a role were the host's time of a delayed step."""
    from ..kernels.delayed_scales import window_tensor_scales  # imports Triton

    roles = history_roles(windows)
    return window_tensor_scales(history.amaxes, history.steps, history.step, roles)


def device_decided_scales(
    history: AmaxHistory, windows: tuple[tuple[str, int], ...], current: Tensor
) -> tuple[Tensor, Tensor]:
    """Each role's tensor scales at the history's step as `delayed_tensor_scale` gives
    them (its window's, or its ``current`` amax's where the window is empty: ``current``,
    one fp32 a role in ``windows``' order, from a launch of magnitudes), each current amax
    recorded where the history records (`record_amax`), in one launch
    (`stochround.kernels.delayed_scales.window_tensor_scales` given the current amaxes):
    a delayed step's scales decided on the device, where the spec's route takes a dozen
    small operations a role.  On the kernels' route (the host's decisions given) the
    recorded roles are noted for the host's copy (`Recorded`).  The scales (2 fp32 a
    role, in the launch's order) and a zeroed record for each role, which no one reads."""
    from ..kernels.delayed_scales import window_tensor_scales  # imports Triton

    roles = history_roles(windows)
    out = window_tensor_scales(
        history.amaxes, history.steps, history.step, roles, current, history.record
    )
    if history.record and history.windows is not None:  # the host's copy told, as
        host_note(Recorded(tuple(role for role, _ in windows)))  # `record_kernel_amaxes`
    return out[: 2 * len(windows)], out[2 * len(windows) :]


def record_kernel_amaxes(history: AmaxHistory, roles: tuple[str, ...], record: Tensor) -> None:
    """`record_amax` of each role in ``roles`` with the amax a launch raised ``record[i]``
    to: on the kernels' route (the host's decisions given) in one launch
    (`stochround.kernels.delayed_scales.record_amaxes`), the roles noted for the host's
    copy (`Recorded`: the caller marks them), else by `record_amax`."""
    if not history.record:
        return
    if history.windows is None:
        for role, amax in zip(roles, record.reshape(-1).unbind(), strict=True):
            record_amax(history, role, amax)
        return
    from ..kernels.delayed_scales import record_amaxes  # imports Triton

    windows = tuple((role, 0) for role in roles)
    record_amaxes(history.amaxes, history.steps, history.step, history_roles(windows), record)
    host_note(Recorded(roles))


def checked_history(role: str, history: AmaxHistory | None) -> AmaxHistory:
    """``history``; ValueError naming ``role`` where there is none (a delayed tensor scale
    needs its layer's: no silent fall back to current scaling)."""
    if history is None:
        raise ValueError(
            f"{role} has tensor_scale='delayed', which needs its layer's amax history; none "
            "was given (stochround.nn.QuantizedLinear passes its own)"
        )
    return history


def delayed_operand_scale(
    operand: Tensor,
    role: str,
    spec: QuantSpec,
    signs: Tensor | None,
    history: AmaxHistory | None,
) -> TensorScale:
    """The tensor scales a delayed role's operand is quantized with at the history's step
    (`delayed_tensor_scale`), its current amax recorded (`record_kernel_amaxes`).  ValueError
    without a history (no silent fall back to current scaling).  The spec's route: the amax
    a pass of its own (on a CUDA tensor, the PyTorch path's ops, where no prepared kernel
    serves the operand)."""
    history = checked_history(role, history)
    current = operand_amax(operand, spec, signs)
    scale = delayed_tensor_scale(history, role, spec.amax_history, current)
    record_kernel_amaxes(history, (role,), current)
    return scale


__all__ = [
    "EMPTY",
    "HOST_COLUMNS",
    "HOST_COPIES",
    "ROLE_ROWS",
    "AmaxHistory",
    "HostCopy",
    "HostRoute",
    "HostStep",
    "HostWindows",
    "KernelScale",
    "Phase",
    "Recorded",
    "checked_history",
    "delayed_operand_scale",
    "delayed_tensor_scale",
    "device_decided_scales",
    "empty_history",
    "forget_windows",
    "history_at",
    "history_roles",
    "history_width",
    "host_copy",
    "host_step",
    "kernel_scale",
    "launched_window_scales",
    "operand_amax",
    "record_amax",
    "record_kernel_amaxes",
    "register_history",
    "stream_capturing",
    "turn_host_route_off",
    "warming_up",
    "window_amax",
    "window_scales",
]
