"""`QuantizedMatmul` under torch.compile as two opaque ops, the forward and the backward of
a quantized layer each one node of the traced graph, run by the eager code
(docs/guide/recipes.md, "torch.compile").

Traced op by op, a layer's step became some fifteen opaque kernel ops and a dozen of
inductor's small kernels, each with its host cost, and compiled steps were slower than
eager ones.  As two ops a compiled step does what an eager step does: the forward op
computes ``y`` (the fprop GEMM's operands and GEMM) and returns besides it the operands the
eager forward keeps for the backward (`KEPT`) where the layer tells it to keep them: Q(W),
which dgrad reads transposed where the recipe allows (`Plan.weight_transposes`, or
per-tensor Q(W)^T), and x's wgrad operand, written with fprop's in one read
(`stochround.nn.orientations`); an operand not kept is an empty placeholder
(`placeholder`).  The layer keeps them for the GEMMs the backward will run (``wgrad``,
``dgrad``: what requires a gradient under grad mode; an inference forward keeps nothing and
quantizes x once, as eagerly), and only where the step graphs will not serve the step
(`keeps_operands`: a graph's outputs are copied out at each replay, which a kept operand
costs more than quantizing it again).  The autograd context saves ``x``, ``W``, the step's
stream offsets and the kept operands; the backward op takes them and quantizes ``dy`` (in
both orientations at once) and only what the forward did not keep, then runs dgrad and
wgrad: where both were kept, the eager step's launches; its bits either way.

Each op's fake (which torch.compile calls while it traces, with fake tensors) also runs the
op once on zeros of the same layouts (`warm_up`; sizes that are symbolic, under dynamic
shapes, at their hints): the eager route makes its per-shape state at its first call
(prepared launches with their ticket counters and amax outputs, the layer's key tensor),
and made inside the compiled step's first run that state would sit in the pool of
torch.compile's CUDA graphs (``mode="reduce-overhead"``), which refuses any tensor that
outlives its warm-up run.  The forward's warm-up also tells its fake what the op keeps
(`kept_layouts`): which operands, their dtypes and shapes, the tokens symbolic where x's
are.

An op takes the layer's `Plan` by its key in a registry (`register_plan`: a plan holds
dicts, which no op argument can; one key for the layers of one recipe, the same in every
process, `plan_fingerprint`), its step's stream offsets column (`streams.bases_column`:
the layer's number is in it), and a tensor-parallel rank (or -1) whose Philox key
`tensor_parallel.rank_key` derives inside the op (a key is a 64-bit unsigned integer,
beyond an op's int64 argument).
"""

from __future__ import annotations

import functools
import hashlib
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..blocks.tensor import gemm_factor
from .amax_history import AmaxHistory, warming_up
from .graph_notes import kept_by_graphs
from .layer_plan import Plan
from .matmul import QuantizedMatmul
from .step_graphs import STEP_GRAPHS
from .step_plan import StepPlan, StepSignature, make_step_plan, step_signature
from .tensor_parallel import rank_key

_R = TypeVar("_R")

# every registered plan, by its key (`plan_fingerprint`); kept alive, so that a key names
# one plan for good
_PLANS: dict[int, Plan] = {}


def register_plan(plan: Plan) -> int:
    """``plan``'s key for the ops (`plan_fingerprint`), the same for plans equal but for
    their layer number (a layer registers its plan when it is set, outside any trace).  The
    ops never read the layer's number: a layer's streams reach them as its step's offsets
    column (the layer's `stream_bases`), so that the layers of a model's blocks, compiled
    one block at a time as torchtitan does, share one compiled graph instead of a graph
    each (an op's int argument is a constant of the graph)."""
    shared = plan._replace(layer=0)
    key = plan_fingerprint(shared)
    if _PLANS.setdefault(key, shared) != shared:
        raise RuntimeError(f"two plans share the key {key}: {_PLANS[key]} and {shared}")
    return key


def plan_fingerprint(plan: Plan) -> int:
    """A digest of ``plan`` (its printed form, its set of roles sorted) as a non-negative
    int64: the same in every process.  A compiled graph holds it as a constant, and
    inductor's on-disk cache keys the graph by it; an index in the order plans were
    registered would name another plan in another process, whose kept operands
    (`kept_layouts`) the cached graph would take for this one's."""
    text = repr((plan._replace(tensor_transposes=frozenset()), sorted(plan.tensor_transposes)))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def registered_plan(index: int, rank: int) -> Plan:
    """The plan of key ``index``, with rank ``rank``'s key under tensor parallelism (-1:
    none)."""
    plan = _PLANS[index]
    return plan if rank < 0 else plan._replace(seed=rank_key(plan.seed, rank))


def warm_up(run: Callable[..., _R], tensors: tuple[Tensor | None, ...], *rest: object) -> _R:
    """``run`` called once on real zeros laid out as the fake ``tensors`` (None stays None),
    then ``rest``, and its result: the eager route's per-shape state made at compile time,
    outside any CUDA graph pool (module docstring); a delayed layer's host copy of its
    history neither read nor written (`stochround.nn.amax_history.warming_up`).  A
    symbolic size (dynamic shapes) is taken at its hint, the size of the call being
    traced."""
    with unset_fake_temporarily(), warming_up():
        real = [None if each is None else zeros_laid_out_as(each) for each in tensors]
        return run(*real, *rest)


def zeros_laid_out_as(tensor: Tensor) -> Tensor:
    """Real zeros of ``tensor``'s dtype, device, sizes and strides (symbolic ones at their
    hints): the op's route can depend on x's layout (a strided x has no two-orientation
    pair)."""
    sizes = [size_hint(size) for size in tensor.shape]
    strides = [size_hint(stride) for stride in tensor.stride()]
    extent = 1 + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
    storage = torch.zeros(extent if all(sizes) else 0, dtype=tensor.dtype, device=tensor.device)
    return storage.as_strided(sizes, strides)


def size_hint(value: int | torch.SymInt) -> int:
    """A size or stride as an int: a symbolic one at its hint, the traced call's value,
    read without a guard (``SymNode.hint``, which every supported torch has; the
    ``optimization_hint`` function is torch 2.13's only)."""
    if isinstance(value, torch.SymInt):
        return int(value.node.hint)
    return int(value)


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


# the operands the forward keeps for the backward, as `QuantizedMatmul.forward` saves them
# after x, W and the offsets column: Q(W)'s values and tensor scale (dgrad's, read
# transposed, or per-tensor Q(W)^T) and x's wgrad operand's
KEPT = ("weight_values", "weight_scale", "input_t_values", "input_t_scale")


class _Saved:
    """What `QuantizedMatmul`'s forward and backward read and write on their ``ctx``, for
    calling them outside autograd: the forward's saved tensors are kept (the forward op
    returns those the backward reuses, `KEPT`)."""

    history: AmaxHistory | None = None

    def __init__(
        self,
        plan: Plan,
        saved: tuple[Tensor | None, ...] = (),
        needs: tuple[bool, ...] = (),
        bias_dtype: torch.dtype | None = None,
        prepared: StepPlan | None = None,
    ) -> None:
        self.plan, self.saved_tensors, self.needs_input_grad = plan, saved, needs
        self.bias_dtype, self.factor, self.prepared = bias_dtype, kept_factor(plan), prepared

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        self.saved_tensors = tensors


def kept_factor(plan: Plan) -> float:
    """The factor of a kept Q(W) (`stochround.blocks.GemmOperand.factor`), which the
    backward op reads with its values: that of fprop's weight format where dgrad reuses
    Q(W) (`Plan.weight_transposes`: a block format), else 1.0 (per-tensor operands)."""
    fmt = plan.operands["fprop_weight"].fmt
    return gemm_factor(fmt) if plan.weight_transposes and fmt is not None else 1.0


def placeholder(x: Tensor) -> Tensor:
    """An operand not kept, as an op's output must be a tensor: empty, 1-D (a kept value is
    2-D, a kept scale 0-d; `present`)."""
    return x.new_empty(0)


def present(tensor: Tensor) -> Tensor | None:
    """A kept operand, or None for a `placeholder`."""
    return None if tensor.dim() == 1 else tensor


def step_work(x: Tensor, weight: Tensor) -> int:
    """tokens * in * out of a step (`step_graphs.GRAPHED_MAX_WORK` reads it)."""
    return x.shape[0] * weight.shape[0] * weight.shape[1]


def graph_terms(x: Tensor, weight: Tensor, plan: Plan) -> tuple[int, bool]:
    """What the step graphs weigh a step by (`step_graphs.StepGraphs.serves`): its work
    (`step_work`) and whether it is host-bound at any size (FP8 tensor-core GEMMs,
    ``plan.native``)."""
    return step_work(x, weight), plan.native


def _forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    column: Tensor,
    plan_index: int,
    rank: int,
    wgrad: bool,
    dgrad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`forward_step` replayed from its CUDA graph where one is captured
    (`stochround.nn.step_graphs`), else run."""
    tensors = (x, weight, bias, column)
    rest = (plan_index, rank, wgrad, dgrad)
    terms = graph_terms(x, weight, _PLANS[plan_index])  # (the rank keys words only)
    outputs = STEP_GRAPHS.run(forward_step, tensors, rest, *terms, layer=weight)
    return typing.cast(tuple[Tensor, Tensor, Tensor, Tensor, Tensor], tuple(outputs))


def forward_step(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    column: Tensor,
    plan_index: int,
    rank: int,
    wgrad: bool,
    dgrad: bool,
    *,
    history: AmaxHistory | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``y = Q(x) Q(W)^T + b`` by `QuantizedMatmul.forward`, and the operands it keeps for
    the backward (`KEPT`; ``wgrad``: x's wgrad operand, written with fprop's where the pair
    serves x; ``dgrad``: Q(W) where dgrad reuses it; the layer sets each where its GEMM
    will run and `keeps_operands` says so), a `placeholder` for each other.  ``history``:
    the layer's amax history at the step, which delayed roles read and record in."""
    plan = registered_plan(plan_index, rank)
    # x's pair, where wgrad runs, is the step plan's; dy's is the backward op's
    gemms = ("fprop", "wgrad") if wgrad else ("fprop",)
    prepared = op_step_plan(plan_index, rank, x, weight, bias, gemms)
    ctx = _Saved(plan)
    out = QuantizedMatmul.forward(
        ctx,  # type: ignore[arg-type]
        x, weight, bias, column, plan, wgrad, dgrad, prepared, history,
    )  # fmt: skip
    values, scale, x_t_values, x_t_scale = ctx.saved_tensors[3:]
    kept = (values, scale) if dgrad else (None, None)
    w_values, w_scale, t_values, t_scale = (
        placeholder(x) if each is None else op_output(each)
        for each in (*kept, x_t_values, x_t_scale)
    )
    return typing.cast(Tensor, out), w_values, w_scale, t_values, t_scale


def op_output(tensor: Tensor) -> Tensor:
    """``tensor`` as an op output the fake's declared layout describes: itself where it is
    contiguous at the start of its storage, else a contiguous copy.  A kept operand can be
    a view into a larger buffer (a scale beside its values), and Inductor's CUDA code
    asserts each op output's 16-byte alignment and its sizes and strides (the fake declares
    fresh contiguous tensors, `kept_layouts`)."""
    if tensor.storage_offset() == 0 and tensor.is_contiguous():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def kept_layouts(
    x: Tensor, weight: Tensor, real: tuple[Tensor, ...], token_multiple: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward op's fake outputs: ``y`` (tokens, out) and the kept operands in the
    dtypes and sizes of the warm-up's real outputs ``real``, but for the tokens of x's
    wgrad values (features, tokens padded to ``token_multiple``), symbolic where x's are."""
    tokens = x.shape[0]
    padded = -(-tokens // token_multiple) * token_multiple
    shapes: list[Any] = [each.shape for each in real[1:]]
    if real[3].dim() == 2:  # x's wgrad values (features, padded tokens)
        shapes[2] = (real[3].shape[0], padded)
    dtypes = [each.dtype for each in real[1:]]
    kept = [x.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    return (x.new_empty((tokens, weight.shape[0])), *kept)  # type: ignore[return-value]


quantized_linear = torch.library.custom_op(
    "stochround::quantized_linear", _forward, mutates_args=()
)


@quantized_linear.register_fake
def _(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    column: Tensor,
    plan_index: int,
    rank: int,
    wgrad: bool,
    dgrad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    real = warm_up(forward_step, (x, weight, bias, column), plan_index, rank, wgrad, dgrad)
    return kept_layouts(x, weight, real, _PLANS[plan_index].token_multiple)


def _backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    weight_values: Tensor | None,
    weight_scale: Tensor | None,
    x_t_values: Tensor | None,
    x_t_scale: Tensor | None,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
) -> list[Tensor]:
    """`backward_step` replayed from its CUDA graph where one is captured
    (`stochround.nn.step_graphs`), else run."""
    tensors = (grad, x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    rest = (plan_index, rank, needs, bias_dtype)
    terms = graph_terms(x, weight, _PLANS[plan_index])
    grads = STEP_GRAPHS.run(backward_step, tensors, rest, *terms, layer=weight)
    return typing.cast(list[Tensor], grads)


def backward_step(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    column: Tensor,
    weight_values: Tensor | None,
    weight_scale: Tensor | None,
    x_t_values: Tensor | None,
    x_t_scale: Tensor | None,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
    *,
    history: AmaxHistory | None = None,
) -> list[Tensor]:
    """(dx, dW, db) by `QuantizedMatmul.backward` from the forward's kept operands (None:
    not kept, quantized here), each an empty tensor where ``needs`` (of x, W, b) says it is
    not wanted.  ``history``: a delayed layer's amax history at the forward's step, which
    its delayed roles read and record in."""
    plan = registered_plan(plan_index, rank)
    saved = (x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    gemms = tuple(name for name, need in zip(("dgrad", "wgrad"), needs, strict=False) if need)
    prepared = op_step_plan(plan_index, rank, x, weight, None, gemms) if gemms else None
    ctx = _Saved(plan, saved, tuple(needs), bias_dtype, prepared)
    ctx.history = history
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
    weight_values: Tensor | None,
    weight_scale: Tensor | None,
    x_t_values: Tensor | None,
    x_t_scale: Tensor | None,
    plan_index: int,
    rank: int,
    needs: list[bool],
    bias_dtype: torch.dtype | None,
) -> list[Tensor]:
    tensors = (grad, x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale)
    warm_up(backward_step, tensors, plan_index, rank, needs, bias_dtype)
    return gradient_layouts(x, weight, needs, bias_dtype)


def gradient_layouts(
    x: Tensor, weight: Tensor, needs: list[bool], bias_dtype: torch.dtype | None
) -> list[Tensor]:
    """The backward ops' fake outputs: dx, dW and db in x's, W's and the bias's dtypes and
    shapes, each empty where ``needs`` says it is not wanted (`backward_step`)."""
    shapes = (x.shape, weight.shape, (weight.shape[0],))
    dtypes = (x.dtype, weight.dtype, bias_dtype or x.dtype)
    return [
        x.new_empty(shape if need else (0,), dtype=dtype)
        for shape, dtype, need in zip(shapes, dtypes, needs, strict=True)
    ]


def save_step(ctx: Any, inputs: tuple[Any, ...], kept: tuple[Tensor, ...]) -> None:
    """What the backward op reads on ``ctx``: x, W, the offsets column and the forward's
    ``kept`` operands (None for a placeholder) saved, the plan's index, the rank and the
    bias's dtype."""
    x, weight, bias, column, plan_index, rank = inputs[:6]
    ctx.save_for_backward(x, weight, column, *(present(each) for each in kept))
    ctx.plan_index, ctx.rank = plan_index, rank
    ctx.bias_dtype = None if bias is None else bias.dtype


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zeros made for the kept operands' gradients
    save_step(ctx, inputs, output[1:])


def gradient_needs(ctx: Any) -> list[bool]:
    """Which of dx, dW and db the backward op computes: those autograd wants (db only where
    there is a bias)."""
    needs = [bool(each) for each in ctx.needs_input_grad[:3]]
    needs[2] = needs[2] and ctx.bias_dtype is not None
    return needs


def wanted(grads: Sequence[Tensor], needs: list[bool]) -> tuple[Tensor | None, ...]:
    """The backward op's (dx, dW, db) as autograd takes them: None where not wanted (the op
    gives an empty tensor there)."""
    return tuple(each if need else None for each, need in zip(grads, needs, strict=True))


def _autograd_backward(
    ctx: Any,
    grad: Tensor,
    *kept_grads: object,
    run: Callable[..., list[Tensor]] = quantized_linear_backward,
) -> tuple[Tensor | None, ...]:
    needs = gradient_needs(ctx)
    grads = run(grad, *ctx.saved_tensors, ctx.plan_index, ctx.rank, needs, ctx.bias_dtype)
    return (*wanted(grads, needs), None, None, None, None, None)


quantized_linear.register_autograd(_autograd_backward, setup_context=_setup_context)


class GraphedMatmul(torch.autograd.Function):
    """The eager step by the ops' two functions, each replayed from its CUDA graph
    (`stochround.nn.step_graphs`), without the ops' dispatch: what `QuantizedLinear` runs
    eagerly on CUDA where `graphed_step` says so, keeping nothing for the backward
    (``wgrad`` and ``dgrad`` False: `keeps_operands`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        column: Tensor,
        plan_index: int,
        rank: int,
        wgrad: bool,
        dgrad: bool,
    ) -> Tensor:
        outputs = _forward(x, weight, bias, column, plan_index, rank, wgrad, dgrad)
        # the kept operands saved, not returned: y alone is the function's output
        save_step(ctx, (x, weight, bias, column, plan_index, rank), outputs[1:])
        return outputs[0]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return _autograd_backward(ctx, grad, run=_backward)


def graphed_step(x: Tensor, weight: Tensor, plan: Plan) -> bool:
    """Whether an eager step of ``x`` and ``weight`` under ``plan`` runs as `GraphedMatmul`:
    where the step graphs serve its forward (`step_graphs.StepGraphs.serves`; a plan of
    FP8 tensor-core GEMMs is host-bound at any size).  It keeps nothing for its backward
    (`keeps_operands`)."""
    return STEP_GRAPHS.serves((x, weight), *graph_terms(x, weight, plan))


def keeps_operands(x: Tensor, weight: Tensor, plan: Plan) -> bool:
    """Whether a compiled step of ``x`` and ``weight`` under ``plan`` keeps the operands its
    backward reuses (the forward op's ``wgrad`` and ``dgrad``): where the step graphs will
    not serve it (`step_graphs.StepGraphs.serves_layouts`: off, CPU tensors, above the work
    bound unless host-bound).  A graph's outputs lie in the graphs' shared pool and each
    replay copies them out (`graph_copies.fresh_copies`): a kept operand is one output more
    to copy and graph memory more to hold, which costs more than the backward's graph
    quantizing x and W again; run as they are, the functions keep them, and the backward
    quantizes dy alone.  The layer asks once per call while torch.compile traces it, so the
    forward's fake declares what the op returns (the switch `use_step_graphs`, and symbolic
    tokens, guarded).  The stream is read at run time alone: a step captured whole
    (``mode="reduce-overhead"``, a user's CUDA graph) keeps nothing and its backward
    quantizes again, and a step kept at trace time and graphed at run time copies its kept
    operands out; eager's bits either way."""
    return not STEP_GRAPHS.serves_layouts((x, weight), *graph_terms(x, weight, plan))


__all__ = [
    "KEPT",
    "GraphedMatmul",
    "backward_step",
    "forward_step",
    "gradient_layouts",
    "gradient_needs",
    "graphed_step",
    "keeps_operands",
    "kept_factor",
    "kept_layouts",
    "op_step_plan",
    "placeholder",
    "plan_fingerprint",
    "present",
    "quantized_linear",
    "quantized_linear_backward",
    "register_plan",
    "registered_plan",
    "save_step",
    "wanted",
    "warm_up",
    "zeros_laid_out_as",
]
