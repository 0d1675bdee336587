"""The step functions of a layer with delayed tensor scales, and their calls (eager,
graphed and a compiled op's body alike): docs/guide/recipes.md, "Delayed tensor scales".

A delayed step's host decisions (which roles' windows hold a recorded amax, the step the
host knows, whether the step records) are taken before its step function, from the
layer's host copy (`stochround.nn.amax_history.host_step`), and passed to it as a frozen
set of roles among its hashable arguments; the function reads the step on the device
(from the offsets column) and the history's buffers as tensors, and launches the window's
scales, the quantizations with given scales and the records: no host read and no host
state changed, so the step graphs capture it (`stochround.nn.step_graphs`), a graph per
decision (after the first steps, always "every window recorded").  The roles it records
come back as notes (`stochround.nn.amax_history.Recorded`, replayed with a graph), which
the caller marks in the host copy after the call, as the eager step did at quantization
time.  The buffers are written in place (``mutates``: their positions among the call's
tensors): a graph that reads the call's tensors in place writes them where they lie, and
the key's graph of copies (which serves every layer of the key, wherever its tensors lie)
writes its copies of them, copied back into the layer's buffers after each replay.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .amax_history import HostStep, Phase, history_at, host_step
from .graph_notes import noting
from .opaque_matmul import (
    backward_step,
    forward_step,
    gradient_needs,
    graph_terms,
    registered_plan,
    save_step,
    wanted,
)
from .step_graphs import STEP_GRAPHS

Outputs = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]

# the positions of the history's buffers (amaxes, steps) among each step function's
# tensors, which it writes in place (`StepGraphs.run`'s ``mutates``)
FORWARD_WRITES = (4, 5)
BACKWARD_WRITES = (8, 9)


@functools.lru_cache(maxsize=256)
def delayed_windows(plan_index: int) -> tuple[tuple[str, int], ...]:
    """Each delayed role of the registered plan with its window's length (its spec's
    ``amax_history``): the windows a call's host decisions are taken over."""
    plan = registered_plan(plan_index, -1)
    return tuple(
        (role, entry.spec.amax_history)
        for role, entry in plan.operands.items()
        if entry.spec.tensor_scale == "delayed"
    )


def delayed_kept(gemms: tuple[str, ...]) -> tuple[bool, bool]:
    """What a delayed layer's forward keeps for its backward (``wgrad``: x's wgrad operand,
    ``dgrad``: Q(W)): those of the GEMMs that will run (``gemms``), whether or not the step
    graphs serve the step, where a layer without delayed roles keeps none when they do
    (`stochround.nn.opaque_matmul.keeps_operands`).  A backward that quantizes W again does
    so as ``dgrad_weight``, a role of its own, which then records in the history: the
    buffers (a state dict) would depend on whether the graphs served the step, and where
    steps they did not serve left its window empty, its scale would be W's current amax's
    instead of fprop's window's (other bits than a run without the graphs)."""
    return "wgrad" in gemms, "dgrad" in gemms


def host_decisions(
    amaxes: Tensor, steps: Tensor, column: Tensor, record: bool, phase: Phase, plan_index: int
) -> tuple[HostStep | None, frozenset[str] | None]:
    """The host's side of a call (`host_step`; None where the device decides) and the
    decisions the step function takes (the roles whose window is recorded; None: the
    device's)."""
    host = host_step(amaxes, steps, column, record, phase)
    return host, None if host is None else host.decided(delayed_windows(plan_index))


def delayed_forward_step(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    column: Tensor,
    amaxes: Tensor,
    steps: Tensor,
    plan_index: int,
    rank: int,
    wgrad: bool,
    dgrad: bool,
    record: bool,
    windows: frozenset[str] | None,
) -> Outputs:
    """`forward_step` with the history of buffers ``amaxes`` and ``steps`` at the column's
    step (read on the device), recording where ``record``, with the host's decisions
    ``windows`` (`stochround.nn.amax_history.history_at`)."""
    history = history_at(amaxes, steps, column, record, windows)
    options = (plan_index, rank, wgrad, dgrad)
    return forward_step(x, weight, bias, column, *options, history=history)


def delayed_backward_step(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    weight_values: Tensor | None,
    weight_scale: Tensor | None,
    x_t_values: Tensor | None,
    x_t_scale: Tensor | None,
    amaxes: Tensor,
    steps: Tensor,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
    record: bool,
    windows: frozenset[str] | None,
) -> list[Tensor]:
    """`backward_step` with the history at the forward's step, as `delayed_forward_step`
    reads it."""
    history = history_at(amaxes, steps, column, record, windows)
    saved = (x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    return backward_step(grad, *saved, plan_index, rank, needs, bias_dtype, history=history)


def run_decided(
    function: Callable[..., Any],
    tensors: tuple[Tensor | None, ...],
    options: tuple[object, ...],
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    plan_index: int,
    record: bool,
    phase: Phase,
    writes: tuple[int, ...],
) -> Any:
    """``function(*tensors, plan_index, *options, record, windows)`` (a delayed step
    function, its history's buffers at ``writes`` among ``tensors``): the host's decisions
    taken first (``windows``: `host_decisions` at the step of the offsets ``column``,
    ``phase``), replayed from its step graph where one serves it (the buffers written in
    place, or copied back), and the roles it recorded marked in the host copy."""
    amaxes, steps = (typing.cast(Tensor, tensors[at]) for at in writes)
    host, windows = host_decisions(amaxes, steps, column, record, phase, plan_index)
    terms = graph_terms(x, weight, registered_plan(plan_index, -1))
    rest = (plan_index, *options, record, windows)
    with noting() as notes:
        outputs = STEP_GRAPHS.run(function, tensors, rest, *terms, mutates=writes, layer=weight)
    if host is not None:
        host.mark(notes)
    return outputs


def run_delayed_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    column: Tensor,
    plan_index: int,
    rank: int,
    wgrad: bool,
    dgrad: bool,
    amaxes: Tensor,
    steps: Tensor,
    record: bool,
    phase: Phase,
) -> Outputs:
    """`delayed_forward_step`, its host decisions taken first (``phase``: a forward, or one
    recomputed in the backward), replayed from its step graph where one serves it (the
    buffers written in place, or copied back: `FORWARD_WRITES`), and the roles it recorded
    marked in the host copy."""
    tensors = (x, weight, bias, column, amaxes, steps)
    outputs = run_decided(
        delayed_forward_step, tensors, (rank, wgrad, dgrad), x, weight, column, plan_index,
        record, phase, FORWARD_WRITES,
    )  # fmt: skip
    return typing.cast(Outputs, tuple(outputs))


def run_delayed_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    weight_values: Tensor | None,
    weight_scale: Tensor | None,
    x_t_values: Tensor | None,
    x_t_scale: Tensor | None,
    amaxes: Tensor,
    steps: Tensor,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
    record: bool,
) -> list[Tensor]:
    """`delayed_backward_step` as `run_delayed_forward` runs the forward: the decisions
    taken at the backward's call (a backward of an earlier step may have recorded since
    its forward), the forward's step found by its column."""
    saved = (x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    tensors = (grad, *saved, amaxes, steps)
    grads = run_decided(
        delayed_backward_step, tensors, (rank, needs, bias_dtype), x, weight, column,
        plan_index, record, "backward", BACKWARD_WRITES,
    )  # fmt: skip
    return typing.cast(list[Tensor], list(grads))


class EagerDelayedMatmul(torch.autograd.Function):
    """An eager step of a layer with delayed tensor scales: `run_delayed_forward` and
    `run_delayed_backward` without the compiled ops' dispatch (`GraphedMatmul`'s twin),
    keeping for the backward the operands ``wgrad`` and ``dgrad`` say (`delayed_kept`,
    graphed or not)."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> Tensor:  # type: ignore[override]
        """``inputs``: x, W, b, the column, the plan's key, the rank, wgrad, dgrad, the two
        buffers, record and the phase (`run_delayed_forward`'s arguments)."""
        outputs = run_delayed_forward(*inputs)
        save_step(ctx, inputs[:6], outputs[1:])
        # attributes, not saved tensors: later steps write them in place
        ctx.history = inputs[8:11]
        return outputs[0]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        needs = gradient_needs(ctx)
        amaxes, steps, record = ctx.history
        x, weight, column, values, scale, x_t_values, x_t_scale = ctx.saved_tensors
        grads = run_delayed_backward(
            grad, x, weight, column, values, scale, x_t_values, x_t_scale, amaxes, steps,
            ctx.plan_index, ctx.rank, needs, ctx.bias_dtype, record,
        )  # fmt: skip
        return (*wanted(grads, needs), *(None,) * 9)


__all__ = [
    "BACKWARD_WRITES",
    "FORWARD_WRITES",
    "EagerDelayedMatmul",
    "Outputs",
    "delayed_backward_step",
    "delayed_forward_step",
    "delayed_kept",
    "delayed_windows",
    "host_decisions",
    "run_decided",
    "run_delayed_backward",
    "run_delayed_forward",
]
