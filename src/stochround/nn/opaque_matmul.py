"""`QuantizedMatmul` under torch.compile as two opaque ops, the forward and the backward of
a quantized layer each one node of the traced graph, run by the eager code
(docs/guide/recipes.md, "torch.compile").

Traced op by op, a layer's step became some fifteen opaque kernel ops and a dozen of
inductor's small kernels, each with its host cost, and compiled steps were slower than
eager ones.  As two ops a compiled step costs what an eager step costs: the forward op
computes ``y`` (the fprop GEMM's operands and GEMM) and saves ``x``, ``W`` and the step's
stream offsets,
as ``nn.Linear`` saves its inputs; the backward op quantizes ``dy`` and ``x^T`` (and
``W^T`` where dgrad does not reuse fprop's) and runs dgrad and wgrad.  The eager step
writes the wgrad operand of ``x`` with fprop's in one read and keeps it; the backward op
writes it again from ``x``: the same bits (the two-orientation quantizer equals the two
separate quantizations, tested), one more read of ``x``.

Each op's fake (which torch.compile calls while it traces, with fake tensors) also runs the
op once on zeros of the same shapes (`warm_up`): the eager route makes its per-shape state
at its first call (prepared launches with their ticket counters and amax outputs, the
layer's key tensor), and made inside the compiled step's first run that state would sit
in the pool of torch.compile's CUDA graphs (``mode="reduce-overhead"``), which refuses any
tensor that outlives its warm-up run.

An op takes the layer's `Plan` by its index in a registry (`register_plan`: a plan holds
dicts, which no op argument can; one index for the layers of one recipe), its step's
stream offsets column (`streams.bases_column`: the layer's number is in it), and a
tensor-parallel rank (or -1) whose Philox key
`tensor_parallel.rank_key` derives inside the op (a key is a 64-bit unsigned integer,
beyond an op's int64 argument).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .layer_plan import Plan
from .matmul import QuantizedMatmul
from .step_graphs import STEP_GRAPHS, kept_by_graphs
from .step_plan import StepPlan, StepSignature, make_step_plan, step_signature
from .tensor_parallel import rank_key

# every registered plan, by index; kept alive, so that an index names one plan for good
_PLANS: list[Plan] = []


def register_plan(plan: Plan) -> int:
    """``plan``'s index for the ops, the same for plans equal but for their layer number
    (a layer registers its plan when it is set, outside any trace).  The ops never read
    the layer's number: a layer's streams reach them as its step's offsets column (the
    layer's `stream_bases`), so that the layers of a model's blocks, compiled one block at
    a time as torchtitan does, share one compiled graph instead of a graph each (an op's
    int argument is a constant of the graph)."""
    shared = plan._replace(layer=0)
    for index, each in enumerate(_PLANS):
        if each == shared:
            return index
    _PLANS.append(shared)
    return len(_PLANS) - 1


def registered_plan(index: int, rank: int) -> Plan:
    """The plan of ``index``, with rank ``rank``'s key under tensor parallelism (-1: none)."""
    plan = _PLANS[index]
    return plan if rank < 0 else plan._replace(seed=rank_key(plan.seed, rank))


def warm_up(run: Callable[..., object], tensors: tuple[Tensor | None, ...], *rest: object) -> None:
    """``run`` called once on real zeros shaped as the fake ``tensors`` (None stays None),
    then ``rest``: the eager route's per-shape state made at compile time, outside any CUDA
    graph pool (module docstring).  Nothing where a shape is symbolic (dynamic shapes)."""
    shapes = [() if each is None else tuple(each.shape) for each in tensors]
    if not all(isinstance(size, int) for shape in shapes for size in shape):
        return
    with unset_fake_temporarily():
        real = [
            None if each is None else torch.zeros(shape, dtype=each.dtype, device=each.device)
            for each, shape in zip(tensors, shapes, strict=True)
        ]
        run(*real, *rest)


@kept_by_graphs
@functools.lru_cache(maxsize=256)
def _step_plan(plan_index: int, signature: StepSignature, shape: tuple[int, int]) -> StepPlan:
    """The `StepPlan` of the registered plan for a call of ``signature`` on a weight of
    ``shape`` (out, in): made once, as a layer keeps its own eagerly."""
    return make_step_plan(_PLANS[plan_index], signature, shape[1], shape[0])


def op_step_plan(
    plan_index: int,
    rank: int,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    gemms: tuple[str, ...],
) -> StepPlan | None:
    """The step plan an op runs by (the eager step's choices, resolved once per signature),
    or None under tensor parallelism (``rank`` >= 0), whose calls take the per-call route
    as they do eagerly."""
    if rank >= 0:
        return None
    signature = step_signature(x, weight, bias, gemms)
    return _step_plan(plan_index, signature, (weight.shape[0], weight.shape[1]))


class _Saved:
    """What `QuantizedMatmul`'s forward and backward read and write on their ``ctx``, for
    calling them outside autograd: the forward's saved tensors are dropped (the backward
    op recomputes what it needs from ``x`` and ``W``)."""

    def __init__(
        self,
        plan: Plan,
        saved: tuple[Tensor | None, ...] = (),
        needs: tuple[bool, ...] = (),
        bias_dtype: torch.dtype | None = None,
        prepared: StepPlan | None = None,
    ) -> None:
        self.plan, self.saved_tensors, self.needs_input_grad = plan, saved, needs
        self.bias_dtype, self.factor, self.prepared = bias_dtype, 1.0, prepared

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        pass


def step_work(x: Tensor, weight: Tensor) -> int:
    """tokens * in * out of a step (`step_graphs.GRAPHED_MAX_WORK` reads it)."""
    return x.shape[0] * weight.shape[0] * weight.shape[1]


def graph_terms(x: Tensor, weight: Tensor, plan: Plan) -> tuple[int, bool]:
    """What the step graphs weigh a step by (`step_graphs.StepGraphs.serves`): its work
    (`step_work`) and whether it is host-bound at any size (FP8 tensor-core GEMMs,
    ``plan.native``)."""
    return step_work(x, weight), plan.native


def _forward(
    x: Tensor, weight: Tensor, bias: Tensor | None, column: Tensor, plan_index: int, rank: int
) -> Tensor:
    """`forward_step` replayed from its CUDA graph where one is captured
    (`stochround.nn.step_graphs`), else run."""
    tensors = (x, weight, bias, column)
    terms = graph_terms(x, weight, _PLANS[plan_index])  # (the rank keys words only)
    return typing.cast(Tensor, STEP_GRAPHS.run(forward_step, tensors, (plan_index, rank), *terms))


def forward_step(
    x: Tensor, weight: Tensor, bias: Tensor | None, column: Tensor, plan_index: int, rank: int
) -> Tensor:
    """``y = Q(x) Q(W)^T + b`` by `QuantizedMatmul.forward`, without the backward's
    operands (wgrad and dgrad off: no pair, no kept transposes)."""
    plan = registered_plan(plan_index, rank)
    prepared = op_step_plan(plan_index, rank, x, weight, bias, ("fprop",))
    ctx = _Saved(plan)
    out = QuantizedMatmul.forward(ctx, x, weight, bias, column, plan, False, False, prepared)  # type: ignore[arg-type]
    return typing.cast(Tensor, out)


quantized_linear = torch.library.custom_op(
    "stochround::quantized_linear", _forward, mutates_args=()
)


@quantized_linear.register_fake
def _(
    x: Tensor, weight: Tensor, bias: Tensor | None, column: Tensor, plan_index: int, rank: int
) -> Tensor:
    warm_up(forward_step, (x, weight, bias, column), plan_index, rank)
    return x.new_empty((x.shape[0], weight.shape[0]))


def _backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
) -> list[Tensor]:
    """`backward_step` replayed from its CUDA graph where one is captured
    (`stochround.nn.step_graphs`), else run."""
    tensors = (grad, x, weight, column)
    rest = (plan_index, rank, needs, bias_dtype)
    terms = graph_terms(x, weight, _PLANS[plan_index])
    return typing.cast(list[Tensor], STEP_GRAPHS.run(backward_step, tensors, rest, *terms))


def backward_step(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
) -> list[Tensor]:
    """(dx, dW, db) by `QuantizedMatmul.backward`, each an empty tensor where ``needs``
    (of x, W, b) says it is not wanted."""
    plan = registered_plan(plan_index, rank)
    saved = (x, weight, column, None, None, None, None)
    gemms = tuple(name for name, need in zip(("dgrad", "wgrad"), needs, strict=False) if need)
    prepared = op_step_plan(plan_index, rank, x, weight, None, gemms) if gemms else None
    ctx = _Saved(plan, saved, tuple(needs), bias_dtype, prepared)
    grads = QuantizedMatmul.backward(ctx, grad)[:3]
    # the placeholders in the dtypes the op's fake declares
    dtypes = (x.dtype, weight.dtype, bias_dtype or x.dtype)
    return [
        x.new_empty(0, dtype=dtype) if each is None else each
        for each, dtype in zip(grads, dtypes, strict=True)
    ]


quantized_linear_backward = torch.library.custom_op(
    "stochround::quantized_linear_backward", _backward, mutates_args=()
)


@quantized_linear_backward.register_fake
def _(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
) -> list[Tensor]:
    warm_up(backward_step, (grad, x, weight, column), plan_index, rank, needs, bias_dtype)
    shapes = (x.shape, weight.shape, (weight.shape[0],))
    dtypes = (x.dtype, weight.dtype, bias_dtype or x.dtype)
    return [
        x.new_empty(shape if need else (0,), dtype=dtype)
        for shape, dtype, need in zip(shapes, dtypes, needs, strict=True)
    ]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias, column, plan_index, rank = inputs
    ctx.save_for_backward(x, weight, column)
    ctx.plan_index, ctx.rank = plan_index, rank
    ctx.bias_dtype = None if bias is None else bias.dtype


def _autograd_backward(
    ctx: Any, grad: Tensor, run: Callable[..., list[Tensor]] = quantized_linear_backward
) -> tuple[Tensor | None, ...]:
    x, weight, column = ctx.saved_tensors
    needs = [bool(each) for each in ctx.needs_input_grad[:3]]
    needs[2] = needs[2] and ctx.bias_dtype is not None
    grads = run(grad, x, weight, column, ctx.plan_index, ctx.rank, needs, ctx.bias_dtype)
    kept = [each if need else None for each, need in zip(grads, needs, strict=True)]
    return (*kept, None, None, None)


quantized_linear.register_autograd(_autograd_backward, setup_context=_setup_context)


class GraphedMatmul(torch.autograd.Function):
    """The eager step by the ops' two functions, each replayed from its CUDA graph
    (`stochround.nn.step_graphs`), without the ops' dispatch: what `QuantizedLinear` runs
    eagerly on CUDA where `graphed_step` says so."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        column: Tensor,
        plan_index: int,
        rank: int,
    ) -> Tensor:
        _setup_context(ctx, (x, weight, bias, column, plan_index, rank), None)  # type: ignore[arg-type]
        return _forward(x, weight, bias, column, plan_index, rank)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return _autograd_backward(ctx, grad, _backward)


def graphed_step(x: Tensor, weight: Tensor, plan: Plan) -> bool:
    """Whether an eager step of ``x`` and ``weight`` under ``plan`` runs as `GraphedMatmul`:
    where the step graphs serve its forward (`step_graphs.StepGraphs.serves`; a plan of
    FP8 tensor-core GEMMs is host-bound at any size)."""
    return STEP_GRAPHS.serves((x, weight), *graph_terms(x, weight, plan))


__all__ = [
    "GraphedMatmul",
    "backward_step",
    "forward_step",
    "graphed_step",
    "op_step_plan",
    "quantized_linear",
    "quantized_linear_backward",
    "register_plan",
    "registered_plan",
    "warm_up",
]
