"""The compiled ops of a layer with delayed tensor scales (docs/guide/recipes.md, "Delayed
tensor scales", "Under torch.compile"): the forward op `quantized_linear_delayed` and the
backward op `quantized_linear_delayed_backward`, `stochround.nn.opaque_matmul`'s two ops
with the layer's amax history buffers as required arguments declared mutated, and
`DelayedMatmul`, which differentiates them.

The buffers are arguments, so that the traced graph sees their writes (functionalization
writes them back; Inductor orders the ops that read and write them); the ops' bodies read
the history at the step of the offsets column (`stochround.nn.amax_history.op_history`):
with the layer's host copy of its windows where their Python runs at every call (the eager
kernels' route: no amax pass after the first step, the two-orientation pair), with every
decision on the device once a CUDA-graph capture has recorded a step of it (the spec's
route: exact at every replay of a step captured whole, ``mode="reduce-overhead"``).  The
shared ops of every other compiled layer take no buffers: a mutated argument that is
optional or defaulted is dropped from the positions torch 2.11's version bump reads.
"""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import Tensor

from .amax_history import Phase, op_history
from .opaque_matmul import (
    backward_step,
    forward_step,
    gradient_layouts,
    gradient_needs,
    graph_terms,
    kept_layouts,
    registered_plan,
    save_step,
    wanted,
    warm_up,
)
from .recompute import in_backward
from .step_graphs import STEP_GRAPHS

# the delayed backward op's (dx, dW, db): a tuple, not a list (a mutating op's list output
# is refused by functionalization as if it aliased an input)
Grads = tuple[Tensor, Tensor, Tensor]


def _delayed_forward(
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`forward_step` of a layer with delayed tensor scales: its amax history's buffers
    ``amaxes`` and ``steps`` read at the column's step and, where ``record`` (a training
    forward), written in place (x's and W's roles record); never graphed
    (`check_ungraphed`).  The history read with the layer's host copy where the host
    decides (`stochround.nn.amax_history.op_history`: the eager kernels' route), a forward
    run again in the backward (activation checkpointing) as a recomputation of its step."""
    plan = registered_plan(plan_index, -1)
    check_ungraphed((x, weight, bias, column), *graph_terms(x, weight, plan))
    phase: Phase = "recomputed" if in_backward() else "forward"
    history = op_history(amaxes, steps, column, record, phase)
    return forward_step(x, weight, bias, column, plan_index, rank, wgrad, dgrad, history=history)


# A layer with delayed tensor scales: the forward op writes the history in place (declared,
# so that the graph orders it and functionalization writes the buffers back), and so takes
# no autograd formula of its own (torch.library refuses one for a mutating op):
# `DelayedMatmul` differentiates it (docs/guide/recipes.md, "Delayed tensor scales")
quantized_linear_delayed = torch.library.custom_op(
    "stochround::quantized_linear_delayed", _delayed_forward, mutates_args=("amaxes", "steps")
)


@quantized_linear_delayed.register_fake
def _(
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    def body(*tensors: Tensor) -> tuple[Tensor, ...]:  # the op's body, its tensors first
        x, weight, bias, column, amaxes, steps = tensors
        options = (plan_index, rank, wgrad, dgrad)
        return _delayed_forward(x, weight, bias, column, *options, amaxes, steps, record)

    real = warm_up(body, (x, weight, bias, column, amaxes, steps))
    return kept_layouts(x, weight, real, registered_plan(plan_index, -1).token_multiple)


def check_ungraphed(tensors: tuple[Tensor | None, ...], work: int, host_bound: bool) -> None:
    """NotImplementedError where the step graphs would serve a call of a layer with delayed
    tensor scales: a graph of copies would record its amaxes in its own static copy of the
    history, not in the layer's buffers, and the route under the step graphs is not built
    (docs/guide/recipes.md, "Delayed tensor scales")."""
    if STEP_GRAPHS.serves(tensors, work, host_bound):
        raise NotImplementedError(
            "tensor_scale='delayed' is not built under the step graphs (CUDA graphs of "
            "eager steps) yet: turn them off (stochround.nn.use_step_graphs(False), or "
            "STOCHROUND_STEP_GRAPHS=0), or use tensor_scale='amax'"
        )


def _delayed_backward(
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
) -> Grads:
    """`backward_step` of a layer with delayed tensor scales: its amax history's buffers
    ``amaxes`` and ``steps`` read at the column's step and, where its forward recorded
    (``record``: a training forward), written in place (dy's roles record); never graphed
    (`check_ungraphed`), with the layer's host copy where the host decides (`op_history`,
    the forward's step found by its column)."""
    tensors = (grad, x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    check_ungraphed(tensors, *graph_terms(x, weight, registered_plan(plan_index, -1)))
    history = op_history(amaxes, steps, column, record, "backward")
    dx, dw, db = backward_step(*tensors, plan_index, rank, needs, bias_dtype, history=history)
    return dx, dw, db


# A layer with delayed tensor scales has a backward op of its own, which takes the history's
# buffers as required arguments and writes them in place (declared, so that the graph orders
# the writes and functionalization writes the buffers back; AOT autograd keeps a forward
# input's data mutation in the backward graph where the input needs no gradient, a buffer,
# after the forward op's mutation of it).  The shared backward op stays as it is: a layer
# without delayed roles never sees the buffers (a mutated argument that is optional or
# defaulted is dropped from the positions torch 2.11's version bump reads).
quantized_linear_delayed_backward = torch.library.custom_op(
    "stochround::quantized_linear_delayed_backward",
    _delayed_backward,
    mutates_args=("amaxes", "steps"),
)


@quantized_linear_delayed_backward.register_fake
def _(
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
) -> Grads:
    tensors = (grad, x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    rest = (plan_index, rank, needs, bias_dtype, record)
    warm_up(_delayed_backward, (*tensors, amaxes, steps), *rest)
    dx, dw, db = gradient_layouts(x, weight, needs, bias_dtype)
    return dx, dw, db


class DelayedMatmul(torch.autograd.Function):
    """A compiled step of a layer with delayed tensor scales: the forward op
    `quantized_linear_delayed` and the backward op `quantized_linear_delayed_backward`,
    each reading and writing the layer's amax history buffers, which both take as required
    arguments declared mutated (the graph sees the writes: functionalization writes them
    back, and Inductor orders the ops that read and write them); y alone is the function's
    output, the kept operands saved as the registered formula saves them."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> Tensor:  # type: ignore[override]
        """``inputs``: `quantized_linear_delayed`'s arguments (x, W, b, the column, the
        plan's key, the rank, wgrad, dgrad, the two buffers, record)."""
        outputs = quantized_linear_delayed(*inputs)
        save_step(ctx, inputs[:6], outputs[1:])
        # attributes, not saved tensors: the forward op and later forwards write them in
        # place, which a saved tensor's version check would refuse
        ctx.history = inputs[8:]
        return typing.cast(Tensor, outputs[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        needs = gradient_needs(ctx)
        amaxes, steps, record = ctx.history
        grads = quantized_linear_delayed_backward(
            grad, *ctx.saved_tensors, amaxes, steps, ctx.plan_index, ctx.rank, needs,
            ctx.bias_dtype, record,
        )  # fmt: skip
        return (*wanted(grads, needs), *(None,) * 8)


__all__ = [
    "DelayedMatmul",
    "Grads",
    "check_ungraphed",
    "quantized_linear_delayed",
    "quantized_linear_delayed_backward",
]
