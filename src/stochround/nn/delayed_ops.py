"""The compiled ops of a layer with delayed tensor scales (docs/guide/recipes.md, "Delayed
tensor scales", "Under torch.compile"): the forward op `quantized_linear_delayed` and the
backward op `quantized_linear_delayed_backward`, `stochround.nn.opaque_matmul`'s two ops
with the layer's amax history buffers as required arguments declared mutated, and
`DelayedMatmul`, which differentiates them.

The buffers are arguments, so that the traced graph sees their writes (functionalization
writes them back; Inductor orders the ops that read and write them); the ops' bodies run
the eager step's calls (`stochround.nn.delayed_steps`): the history read at the step of
the offsets column, with the decisions of the layer's host copy where their Python runs at
every call (the eager kernels' route: no amax pass after the first step, the
two-orientation pair; the step function replayed from its step graph where one serves it),
with every decision on the device once a CUDA-graph capture has recorded a step of it
(the spec's route: exact at every replay of a step captured whole,
``mode="reduce-overhead"``).  The
shared ops of every other compiled layer take no buffers: a mutated argument that is
optional or defaulted is dropped from the positions torch 2.11's version bump reads.
"""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import Tensor

from .amax_history import Phase
from .delayed_steps import (
    delayed_backward_step,
    delayed_forward_step,
    run_delayed_backward,
    run_delayed_forward,
)
from .opaque_matmul import (
    gradient_layouts,
    gradient_needs,
    kept_layouts,
    registered_plan,
    save_step,
    wanted,
    warm_up,
)
from .recompute import in_backward

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
    forward), written in place (x's and W's roles record), by `run_delayed_forward`: the
    host's decisions taken from the layer's host copy where the host decides (the eager
    kernels' route), then the step function, replayed from its step graph where one serves
    it; a forward run again in the backward (activation checkpointing) as a recomputation
    of its step."""
    phase: Phase = "recomputed" if in_backward() else "forward"
    options = (plan_index, rank, wgrad, dgrad)
    return run_delayed_forward(x, weight, bias, column, *options, amaxes, steps, record, phase)


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
    # the step function on zeros, the device's decisions (no host copy, no step graph)
    options = (plan_index, rank, wgrad, dgrad, record, None)
    real = warm_up(delayed_forward_step, (x, weight, bias, column, amaxes, steps), *options)
    return kept_layouts(x, weight, real, registered_plan(plan_index, -1).token_multiple)


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
    (``record``: a training forward), written in place (dy's roles record), by
    `run_delayed_backward` (the forward's step found by its column)."""
    tensors = (grad, x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    options = (plan_index, rank, needs, bias_dtype, record)
    dx, dw, db = run_delayed_backward(*tensors, amaxes, steps, *options)
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
    rest = (plan_index, rank, needs, bias_dtype, record, None)
    warm_up(delayed_backward_step, (*tensors, amaxes, steps), *rest)
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
    "quantized_linear_delayed",
    "quantized_linear_delayed_backward",
]
