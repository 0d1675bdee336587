"""`QuantizedLinear`: an `nn.Linear` whose three GEMMs take quantized operands.

With ``x`` the input as a matrix of tokens ``(T, in_features)``, ``W`` ``(out, in)`` and
``dy`` the output's gradient ``(T, out)``, and Q each role's `QuantSpec` applied with the
blocks along the GEMM's contraction axis (`stochround.nn.recipes`)::

    fprop   y  = Q(x) Q(W)^T        x, W blocked along in_features
    dgrad   dx = Q(dy) Q(W)         dy, W blocked along out_features
    wgrad   dW = Q(dy)^T Q(x)       dy, x blocked along the tokens (the RHT runs here)

The GEMMs are emulated as a block-scaled tensor core computes them
(`stochround.blocks.scaled_mm`): each operand quantized to its elements times their block
scales (`stochround.blocks.GemmOperand`: exact in bf16 for NVFP4, MXFP4 and the int8
grids, else fp32), the products accumulated in fp32, then the result multiplied by the
tensor scales (and whole-row scales) and cast to x's dtype (W's for dW).  Results agree
with a tensor core's up to the order of accumulation.  Two operands rotated alike (the
same RHT size and sign policy: the wgrad operands of the NVFP4 and MXFP4 recipes) are
multiplied in the rotated basis, where the rotations cancel, as Transformer Engine does;
an operand rotated alone is rotated back first (in fp32).

A call runs, and checks against its blocks, only the GEMMs it needs: fprop always, dgrad
if x needs a gradient, wgrad if W does (under grad mode), so inference and frozen weights
take any token count.  wgrad's operands are blocked (and rotated) along the tokens; a token
count that fits no block is padded with zero tokens to the plan's `token_multiple`
(`pad_tokens`): bit for bit the same step on a batch padded with zero rows, whose products
add nothing to dW.

Random bits: the operand of ``role`` at step ``s`` of layer ``l`` draws
``random_words(index, key, stream_offset(s, l, slot))`` (`stream_offset`), ``index`` its
row-major element index with the contraction axis last and ``key = stream_key(seed,
StreamDomain.RECIPE)`` the recipe's seed in the recipes' own domain (`stochround.random`),
so an optimizer or a rounding call given the same seed draws other words.  Under data
parallelism a layer given its data-parallel rank (``data_parallel_rank``, `quantize_`'s
keyword; torchtitan's converter sets it) draws the words of x and dy under that rank's
key (`stochround.nn.streams.data_rank_key`), the weight's under the layer's key on every
rank (`stochround.nn.streams` says why).  The step is a
buffer (in the ``state_dict``): it advances by one at each forward under grad mode, so a
run is a pure function of the recipe's seed and resumes bit-exactly from a checkpoint;
torch's global generator is never drawn from.

`stochround.nn.layer_plan` holds the recipe resolved for a layer (`Plan`),
`stochround.nn.matmul` the autograd function that runs the GEMMs.
"""

from __future__ import annotations

import typing
from collections import deque
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.torch_version import TorchVersion

from ..shards import is_dtensor
from .amax_history import empty_history, forget_windows, history_width, register_history
from .delayed_ops import DelayedMatmul
from .delayed_steps import EagerDelayedMatmul, delayed_kept
from .layer_plan import (
    Plan,
    check_operand_shapes,
    make_plan,
    pad_tokens,
    running_gemms,
    shares_rotation,
    token_multiple,
)
from .matmul import QuantizedMatmul, check_native, gemm_operands, rotation_signs
from .opaque_matmul import (
    GraphedMatmul,
    graphed_step,
    keeps_operands,
    quantized_linear,
    register_plan,
)
from .recipes import Recipe
from .recompute import read_step, recomputing
from .step_plan import StepPlan, StepPlans, StepSignature, make_step_plan, step_signature
from .streams import (
    MAX_LAYERS,
    ROLE_SLOTS,
    SIGN_SLOTS,
    SLOTS_PER_LAYER,
    bases_column,
    check_data_parallel_rank,
    layer_bases,
    slot_bases,
    slot_offsets,
    step_column,
    stream_offset,
)
from .tensor_parallel import local_call, rank_key

# the most input signatures a layer keeps a `StepPlan` for (a model's layers see a few:
# training and evaluation batches, a last partial batch)
STEP_PLANS = 8

# the releases whose compiled backward of `QuantizedMatmul` is tested to equal eager's
COMPILES = TorchVersion(torch.__version__) >= "2.11"


def next_layer_index(model: torch.nn.Module, kind: type) -> int:
    """The first layer index after those the ``kind`` modules of ``model`` hold (their
    ``layer_index``; 0 where there are none): a later `quantize_` or `gaussws_` call numbers
    its layers from it, so that they do not share an earlier call's random streams."""
    indices = [
        typing.cast(int, each.layer_index) for each in model.modules() if isinstance(each, kind)
    ]
    return 1 + max(indices, default=-1)


class QuantizedLinear(nn.Linear):
    """A drop-in `nn.Linear` whose fprop, dgrad and wgrad GEMMs take the operands
    quantized by ``recipe`` (module docstring).

    Args:
        in_features, out_features, bias, device, dtype: as `nn.Linear`.
        recipe: the `Recipe` (keyword).
        layer_index: the layer's number in its model, in [0, 2**28): its random streams
            (`stream_offset`); `stochround.nn.quantize_` numbers the layers it replaces.
        data_parallel_rank: the layer's rank among the processes that hold other tokens
            (data parallel, and context parallel), in [0, 2**32) (keyword): the words of x
            and dy are keyed by it, the weight's are not (`Plan.key_of`); 0 by default, the
            layer's own key.

    The buffer ``step`` (a 0-d int64 tensor, saved in ``state_dict``) counts the forward
    calls made under grad mode; a state dict without it (an `nn.Linear`'s) loads and keeps
    the layer's step.  Under ``torch.no_grad`` the step does not advance.  An activation
    checkpoint's recomputation reads its forward's step again (`stochround.nn.recompute`).

    A recipe with delayed tensor scales (``tensor_scale="delayed"``) adds the buffers
    ``amax_history`` (fp32) and ``amax_history_steps`` (int64), each ``(6, H + 1)`` for
    the longest history ``H`` of its roles (`stochround.nn.amax_history`), saved in
    ``state_dict``: the amaxes its training steps recorded, which later steps' tensor
    scales come from.  A state dict without them (an `nn.Linear`'s, or a layer's under
    current scaling) loads and keeps the layer's history; a layer without delayed roles
    ignores a state dict's.
    """

    step: Tensor
    amax_history: Tensor | None
    amax_history_steps: Tensor | None
    layer_index: int
    recipe: Recipe
    plan: Plan
    data_parallel_rank: int = 0

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        recipe: Recipe,
        layer_index: int = 0,
        data_parallel_rank: int = 0,
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))
        self.step_reads: deque[Tensor] = deque()  # for recomputations (`read_step`)
        self.data_parallel_rank = check_data_parallel_rank(data_parallel_rank)
        self.set_recipe(recipe, layer_index)

    def set_data_parallel_rank(self, rank: int) -> None:
        """Key the words of x and dy by data-parallel rank ``rank`` (the class docstring;
        TypeError/ValueError for a rank that is not an int in [0, 2**32)); the recipe,
        the layer's number and its step stay."""
        self.data_parallel_rank = check_data_parallel_rank(rank)
        self.set_recipe(self.recipe)

    def set_recipe(self, recipe: Recipe, layer_index: int | None = None) -> None:
        """Switch the layer to ``recipe`` (and ``layer_index``, if given); the step stays."""
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a stochround.nn.Recipe, got {type(recipe).__name__}")
        layer = self.layer_index if layer_index is None else layer_index
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer_index must be an int, got {type(layer).__name__}")
        if not 0 <= layer < MAX_LAYERS:
            raise ValueError(f"layer_index must be in [0, 2**28), got {layer}")
        self.recipe = recipe
        self.layer_index = layer
        self.plan = self.layer_plan(recipe, layer)
        width = history_width(entry.spec for entry in self.plan.operands.values())
        self.place_amax_history(width, self.weight_device())
        # each eager call signature's resolved choices (`prepare_step`), made again for
        # the new plan
        self.step_plans = StepPlans()
        forget_windows(self.amax_history)  # the roles the host's copy knows may change
        self.plan_index = register_plan(self.plan)  # the compiled step's ops take it
        # the layer's number as its steps read it (`offsets_column`): a tensor, which a
        # compiled graph takes as an input, where an int attribute would be a constant of
        # the graph and each layer a graph of its own; a plain attribute, not a buffer
        # (derived: nothing to save, shard or distribute), moved by `_apply`
        self.stream_bases = layer_bases(layer, self.weight_device())
        # 2-D weight tiles and the weight's blocks are known now; the tokens at each call
        check_operand_shapes(self.plan, 0, self.in_features, self.out_features)

    def layer_plan(self, recipe: Recipe, layer: int) -> Plan:
        """The layer's `Plan` of ``recipe`` as layer number ``layer`` (`make_plan`; a
        subclass that keys its streams otherwise does it here, before the plan is
        registered for the compiled step's ops)."""
        return make_plan(recipe, layer, self.data_parallel_rank)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        recipe: Recipe,
        layer_index: int = 0,
        *,
        data_parallel_rank: int = 0,
    ) -> QuantizedLinear:
        """A `QuantizedLinear` sharing ``linear``'s weight and bias (the same Parameter
        objects: an optimizer built on ``linear`` keeps working), with its hooks dropped;
        ``data_parallel_rank`` as the class takes it."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if parametrize.is_parametrized(linear, "weight"):
            parametrizations = linear.parametrizations["weight"]  # type: ignore[index, union-attr]
            names = ", ".join(type(each).__name__ for each in parametrizations)
            raise ValueError(
                f"the layer's weight is parametrized ({names}), which the swap would drop: "
                "quantize first, then parametrize (gaussws_ parametrizes QuantizedLinear "
                "layers too), or remove the parametrization (stochround.nn.unquantize_ "
                "removes GaussWS)"
            )
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=False,
            device="meta",
            recipe=recipe,
            layer_index=layer_index,
            data_parallel_rank=data_parallel_rank,
        )
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer.step = torch.zeros((), dtype=torch.int64, device=linear.weight.device)
        if layer.amax_history is not None:
            layer.place_amax_history(layer.amax_history.shape[1], linear.weight.device)
        layer.place_stream_bases(linear.weight.device)
        forget_windows(layer.amax_history)  # a new step counter
        layer.train(linear.training)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        weight: Tensor = self.weight
        bias: Tensor | None = self.bias
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        compiling = torch.compiler.is_compiling()
        if compiling and not COMPILES:
            raise RuntimeError(
                "QuantizedLinear compiles with torch >= 2.11 (on older releases the "
                f"compiled backward was seen to give zero weight gradients); torch "
                f"{torch.__version__} runs it eagerly: leave the model uncompiled"
            )
        plan, wrap, rank = self.plan, None, -1
        if is_dtensor(weight) or is_dtensor(x):  # tensor parallelism: the local GEMMs
            call = local_call(x, weight, bias)
            x, weight, bias, wrap = call.x, call.weight, call.bias, call.wrap
            plan, rank = plan._replace(seed=rank_key(plan.seed, call.rank)), call.rank
        gemms = running_gemms(x, weight)
        prepared = None
        if compiling or wrap is not None:  # traced, or a rank's shard: checked each call
            self.check_call(x, weight, plan, gemms, wrap is not None)
        else:  # eagerly, the call's choices resolved once per signature (`StepPlan`)
            signature = step_signature(x, weight, bias, gemms)
            prepared = self.step_plans.get(signature)
            if prepared is None:
                prepared = self.prepare_step(x, weight, signature)
        out_features = weight.shape[0]
        lead = x.shape[:-1]
        matrix = x.dim() == 2  # a matrix of tokens already: no reshape either way
        tokens = x if matrix else x.reshape(-1, weight.shape[1])
        # parallelize_module replicates the buffers: the counter is the local tensor
        counter = self.step.to_local() if is_dtensor(self.step) else self.step
        # one step a training forward, which a checkpoint's recomputation reads again:
        # the step's offsets column, made from the counter before it advances (one add;
        # the column, not the step, kept for a recomputation)
        column = read_step(counter, self.step_reads, self.training, self.offsets_column)
        record = column is not None  # a training step records its amaxes
        if column is None:  # no training forward: the counter read, not advanced
            column = self.offsets_column(counter)
        graphed = not compiling and wrap is None and graphed_step(tokens, weight, plan)
        wgrad, dgrad = "wgrad" in gemms, "dgrad" in gemms
        if compiling:  # two opaque ops: eager's host cost, eager's bits
            # (y, and the operands the backward reuses, which autograd keeps, where the
            # step graphs will not serve the step: decided as it is traced)
            keep = keeps_operands(tokens, weight, plan)
            args = (tokens, weight, bias, column, self.plan_index, rank)
            kept = (wgrad and keep, dgrad and keep)
            if self.amax_history is None or self.amax_history_steps is None:
                out = quantized_linear(*args, *kept)[0]
            else:  # the history's buffers given to both ops, which write them in place,
                # the operands kept whether or not the step graphs serve (`delayed_kept`)
                self.check_delayed_route(wrap is not None)
                buffers = (self.amax_history, self.amax_history_steps)
                out = DelayedMatmul.apply(*args, *delayed_kept(gemms), *buffers, record)
        elif self.amax_history is not None and self.amax_history_steps is not None:
            # the delayed step's calls (`delayed_steps`): the host decides, then the step
            # functions run or replay their graphs (the operands kept either way:
            # `delayed_kept`)
            self.check_delayed_route(wrap is not None)
            register_history(self.amax_history)  # (a buffer swapped behind the layer)
            buffers = (self.amax_history, self.amax_history_steps)
            phase = "recomputed" if recomputing() else "forward"
            args = (tokens, weight, bias, column, self.plan_index, rank)
            out = EagerDelayedMatmul.apply(*args, *delayed_kept(gemms), *buffers, record, phase)
        elif graphed:  # the steps as CUDA graphs
            # nothing kept for the backward (`keeps_operands`)
            out = GraphedMatmul.apply(
                tokens, weight, bias, column, self.plan_index, rank, False, False
            )
        else:
            out = QuantizedMatmul.apply(tokens, weight, bias, column, plan, wgrad, dgrad, prepared)
        out = typing.cast(Tensor, out)
        # a tensor of its own, as nn.Linear returns for a matrix (reshape would return a
        # view of the 2-D result, on whose in-place use FSDP2 warns at every forward)
        y = out if matrix else torch.ops.aten._unsafe_view(out, (*lead, out_features))
        return y if wrap is None else wrap(y)

    def check_delayed_route(self, sharded: bool) -> None:
        """NotImplementedError, naming what is missing, for a delayed layer's step under
        tensor parallelism (``sharded``); nothing for a layer without delayed roles."""
        if self.amax_history is not None and sharded:
            raise NotImplementedError(
                "tensor_scale='delayed' is not built under tensor parallelism yet: it runs "
                "eagerly, under torch.compile and with the step graphs "
                "(docs/guide/recipes.md, 'Delayed tensor scales'); use tensor_scale='amax' "
                "there"
            )

    def place_amax_history(self, width: int, device: torch.device) -> None:
        """The history buffers of ``width`` columns on ``device`` (`history_width`; none
        for 0): kept where they have that shape and device (a recipe switched mid-run keeps
        its amaxes), else new and empty."""
        if width == 0:
            self.register_buffer("amax_history", None)
            self.register_buffer("amax_history_steps", None)
            return
        current = getattr(self, "amax_history", None)
        if current is not None and current.shape[1] == width and current.device == device:
            return
        amaxes, steps = empty_history(width, device)
        self.register_buffer("amax_history", amaxes)
        self.register_buffer("amax_history_steps", steps)
        register_history(amaxes)  # the compiled ops find the host's copy by the buffer

    def offsets_column(self, step: Tensor) -> Tensor:
        """The stream offsets of the layer's slots at ``step`` (a 0-d int64 tensor), a new
        ``(SLOTS_PER_LAYER, 1)`` column (`streams.step_column`'s), by one add from the
        layer's `stream_bases` (eager and compiled alike: compiled, a tensor input of the
        graph, which the layer's own number would not be)."""
        return bases_column(step, self.stream_bases)

    def check_call(
        self, x: Tensor, weight: Tensor, plan: Plan, gemms: tuple[str, ...], sharded: bool
    ) -> None:
        """ValueError unless x's last axis has the weight's in_features and every operand
        of ``gemms`` fits its blocks (`check_operand_shapes`; ``sharded``: the local shapes
        of a rank under tensor parallelism), and for ``gemm="native"`` x lies on a GPU
        with FP8 tensor cores (`check_native`)."""
        in_features, out_features = weight.shape[1], weight.shape[0]
        if x.dim() == 0 or x.shape[-1] != in_features:
            raise ValueError(
                f"x must have in_features={in_features} values along its last axis; "
                f"got an input of shape {tuple(x.shape)}"
            )
        if plan.native:
            check_native(x)
        tokens = x.shape[:-1].numel()
        try:
            check_operand_shapes(plan, tokens, in_features, out_features, gemms)
        except ValueError as error:
            if not sharded:
                raise
            raise ValueError(
                f"{error} (under tensor parallelism each rank quantizes its shard: the "
                "blocks must divide the local shapes)"
            ) from None

    def prepare_step(self, x: Tensor, weight: Tensor, signature: StepSignature) -> StepPlan:
        """The `StepPlan` of an eager call of ``signature``, checked (`check_call`) and
        kept in ``step_plans`` (the oldest dropped beyond `STEP_PLANS`)."""
        self.check_call(x, weight, self.plan, signature.gemms, False)
        prepared = make_step_plan(self.plan, signature, weight.shape[1], weight.shape[0])
        if len(self.step_plans) >= STEP_PLANS:
            del self.step_plans[next(iter(self.step_plans))]
        self.step_plans[signature] = prepared
        return prepared

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # an nn.Linear's state dict has no step: loading one keeps this layer's
        forget_windows(self.amax_history)  # made again from the loaded buffers
        key = prefix + "step"
        if key not in state_dict:
            state_dict[key] = self.step.detach().clone()
        for name in ("amax_history", "amax_history_steps"):
            own = getattr(self, name)
            if own is None:  # no delayed role: a saved history has no use here
                state_dict.pop(prefix + name, None)
            elif prefix + name not in state_dict:
                state_dict[prefix + name] = own.detach().clone()
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _apply(self, fn: Any, recurse: bool = True) -> QuantizedLinear:
        # `stream_bases` follows the weight wherever the layer moves (``to``, ``to_empty``
        # after a model built on ``meta``)
        super()._apply(fn, recurse)
        self.place_stream_bases(self.weight_device())
        register_history(self.amax_history)  # a moved buffer: new memory
        return self

    def place_stream_bases(self, device: torch.device) -> None:
        """`stream_bases` on ``device`` (made again only where it lies elsewhere)."""
        if self.stream_bases.device != device:
            self.stream_bases = layer_bases(self.layer_index, device)

    def weight_device(self) -> torch.device:
        """The weight's device, read from the stored parameter (a parametrized weight, such
        as GaussWS's, is not computed for it: that would draw a sample)."""
        if parametrize.is_parametrized(self, "weight"):
            parametrizations = typing.cast(nn.ModuleDict, self.parametrizations)
            return typing.cast(Tensor, parametrizations["weight"].original).device
        return typing.cast(Tensor, self.weight).device

    def extra_repr(self) -> str:
        rank = self.data_parallel_rank
        ranked = f", data_parallel_rank={rank}" if rank else ""
        return (
            f"{super().extra_repr()}, recipe={self.recipe.name}, "
            f"layer_index={self.layer_index}{ranked}"
        )


__all__ = [
    "MAX_LAYERS",
    "ROLE_SLOTS",
    "SIGN_SLOTS",
    "SLOTS_PER_LAYER",
    "STEP_PLANS",
    "Plan",
    "QuantizedLinear",
    "QuantizedMatmul",
    "gemm_operands",
    "make_plan",
    "next_layer_index",
    "pad_tokens",
    "rotation_signs",
    "running_gemms",
    "shares_rotation",
    "slot_bases",
    "slot_offsets",
    "step_column",
    "stream_offset",
    "token_multiple",
]
