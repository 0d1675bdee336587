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
so an optimizer or a rounding call given the same seed draws other words.  The step is a
buffer (in the ``state_dict``): it advances by one at each forward under grad mode, so a
run is a pure function of the recipe's seed and resumes bit-exactly from a checkpoint;
torch's global generator is never drawn from.
"""

from __future__ import annotations

import functools
import math
import typing
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional
from torch.nn.utils import parametrize
from torch.torch_version import TorchVersion

from ..blocks.gemm import native_fp8_mm, scaled_mm
from ..blocks.hadamard import random_signs
from ..blocks.request import RHT_SEED, check_blocks
from ..blocks.tensor import GemmOperand
from ..kernels.availability import triton_missing
from ..random import StreamDomain, seed_tensor, stream_key
from ..shards import is_dtensor
from .operands import TRANSPOSE_TARGETS, Operand, quantize_operand, tensor_transposes
from .orientations import both_orientations, pair_refusal
from .recipes import GEMMS, ROLES, TENSOR_FORMATS, QuantSpec, Recipe
from .recompute import read_step
from .step_ops import autocast_off, bias_gradient, draw_signs, transposed
from .streams import (
    MAX_LAYERS,
    ROLE_SLOTS,
    SIGN_SLOTS,
    SLOTS_PER_LAYER,
    slot_bases,
    slot_offsets,
    step_column,
    stream_offset,
)
from .tensor_parallel import local_call, rank_key

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


class Plan(NamedTuple):
    """What a layer's GEMMs need: the six operands, the Philox key of its streams (the
    recipe's seed in `StreamDomain.RECIPE`: `stochround.random.stream_key`), the layer's
    index, the multiple the wgrad GEMM pads its token count to (`token_multiple`) and
    whether dgrad's weight operand is fprop's transposed (`weight_transposes`), and
    whether the GEMMs run on the FP8 tensor cores (``native``, `Recipe.gemm`), and the
    per-tensor roles whose operand is another's transposed (`tensor_transposes`)."""

    operands: dict[str, Operand]
    seed: int
    layer: int
    token_multiple: int
    weight_transposes: bool
    native: bool = False
    tensor_transposes: frozenset[str] = frozenset()


def token_multiple(operands: dict[str, Operand]) -> int:
    """The multiple of tokens the wgrad operands need along their contraction axis (the
    tokens): the lcm of their blocks' lengths along it, their RHT sizes and 2 for 4-bit
    codes (which pack two per byte); 1 where nothing blocks the tokens."""
    multiple = 1
    for role in GEMMS["wgrad"]:
        entry = operands[role]
        if entry.fmt is None or entry.spec.format in TENSOR_FORMATS:
            continue
        block = entry.fmt.block
        length = block[1] if isinstance(block, tuple) else (block or 1)
        packing = 2 if entry.fmt.element.bits == 4 else 1
        multiple = math.lcm(multiple, length, entry.spec.rht or 1, packing)
    return multiple


def make_plan(recipe: Recipe, layer: int) -> Plan:
    """The `Plan` of ``recipe`` for layer number ``layer``."""
    operands = {}
    for role in ROLES:
        spec = recipe.spec(role)
        fmt = spec.block_format() if spec.quantized else None
        operands[role] = Operand(role, spec, fmt)
    stream_offset(0, layer, 0)  # checks the layer index
    key = int(stream_key(recipe.seed, StreamDomain.RECIPE))
    native = recipe.gemm == "native"
    reuse, multiple = weight_transposes(operands), token_multiple(operands)
    transposes = tensor_transposes(operands, multiple)
    return Plan(operands, key, layer, multiple, reuse, native, transposes)


def weight_transposes(operands: dict[str, Operand]) -> bool:
    """Whether dgrad's weight operand Q(W^T) is fprop's Q(W) transposed, bit for bit, so
    that the backward reuses it: both roles quantized alike in square 2-D tiles (a tile of
    W^T is the transpose of a tile of W, with its amax and scale), without random bits, an
    RHT or a hardware preset (NVFP4's 16x16 weights, as Transformer Engine reuses them)."""
    forward, backward = operands["fprop_weight"], operands["dgrad_weight"]
    spec, fmt = forward.spec, forward.fmt
    if fmt is None or spec != backward.spec or spec.format in TENSOR_FORMATS:
        return False
    square = isinstance(fmt.block, tuple) and fmt.block[0] == fmt.block[1]
    alike = spec.mode != "sr" and spec.rht is None and spec.hardware is None
    return square and alike and spec.noise == "element"


def pad_tokens(operand: Tensor, multiple: int) -> Tensor:
    """A wgrad operand ``(features, T)`` with zero columns appended up to a multiple of
    ``multiple`` tokens: the operand of a batch padded with zero tokens, whose products
    add nothing to dW's sums (itself where T is a multiple already)."""
    missing = -operand.shape[1] % multiple
    return operand if missing == 0 else functional.pad(operand, (0, missing))


def shares_rotation(left: QuantSpec, right: QuantSpec) -> bool:
    """Whether a GEMM's two operands are rotated alike (the same RHT size and sign policy,
    so the same signs), so that it can multiply them in the rotated basis."""
    return left.rht is not None and (left.rht, left.rht_signs) == (right.rht, right.rht_signs)


def rotation_signs(
    plan: Plan, gemm: str, spec: QuantSpec, offsets: Sequence[Tensor], device: torch.device
) -> Tensor | None:
    """The RHT signs of ``spec``'s operand in ``gemm``: per-step signs from the GEMM's own
    stream (`SIGN_SLOTS`, so that both operands draw the same rotation), fixed signs
    ``random_signs(size, RHT_SEED)``.  Eagerly the fixed signs are None (the block
    quantizer's cached copy); under torch.compile both are drawn by `draw_signs`."""
    size = typing.cast(int, spec.rht)
    per_step = spec.rht_signs == "per_step"
    if not torch.compiler.is_compiling():
        if not per_step:
            return None
        return random_signs(size, plan.seed, offset=offsets[SIGN_SLOTS[gemm]], device=device)
    if per_step:
        seed, offset = seed_tensor(plan.seed, "seed", device), offsets[SIGN_SLOTS[gemm]]
    else:
        seed = offset = torch.full((), RHT_SEED, dtype=torch.int64, device=device)
    return typing.cast(Tensor, draw_signs(size, seed, offset))


def gemm_operands(
    plan: Plan,
    gemm: str,
    left: Tensor | GemmOperand,
    right: Tensor | GemmOperand,
    offsets: Sequence[Tensor],
    reuse: frozenset[str] = frozenset(),
) -> tuple[GemmOperand, GemmOperand, dict[str, GemmOperand]]:
    """Q(left), Q(right) of ``gemm`` (both with the contraction axis last), each drawing
    from its role's stream at the step whose slots' offsets (`slot_offsets`) are ``offsets``,
    rotated by `rotation_signs` where its spec has an RHT; an operand already quantized is
    taken as it is.  And by role, the operands of the roles in ``reuse`` (of the plan's
    `tensor_transposes`) that are one of these transposed, written with it."""
    left_role, right_role = GEMMS[gemm]
    reused: dict[str, GemmOperand] = {}
    rotated = shares_rotation(plan.operands[left_role].spec, plan.operands[right_role].spec)
    results = []
    drawn: dict[tuple[int, str], Tensor | None] = {}  # the GEMM's signs, drawn once
    for role, operand in ((left_role, left), (right_role, right)):
        if isinstance(operand, GemmOperand):
            results.append(operand)
            continue
        entry = plan.operands[role]
        signs = None
        if entry.spec.rht is not None:
            key = (entry.spec.rht, entry.spec.rht_signs)
            if key not in drawn:
                drawn[key] = rotation_signs(plan, gemm, entry.spec, offsets, operand.device)
            signs = drawn[key]
        offset = offsets[ROLE_SLOTS[role]]
        target = TRANSPOSE_TARGETS.get(role)
        transposes: list[GemmOperand] | None = [] if target in reuse else None
        quantized = quantize_operand(
            operand.contiguous(), entry, plan.seed, offset, signs, rotated, native=plan.native,
            transposes=transposes,
        )  # fmt: skip
        if transposes and target is not None:
            reused[target] = transposes[0]
        results.append(quantized)
    return results[0], results[1], reused


def quantized_pair(
    plan: Plan, tensor: Tensor, name: str, offsets: Sequence[Tensor]
) -> tuple[GemmOperand, GemmOperand] | None:
    """Both operands of x (``name`` "input": fprop's and wgrad's) or dy ("grad_output":
    dgrad's and wgrad's) from one read (`stochround.nn.orientations.both_orientations`),
    each from its role's stream, wgrad's padded to `token_multiple` tokens and rotated
    with wgrad's signs; None where the pair is not served (the caller quantizes each)."""
    row_role = ("fprop_" if name == "input" else "dgrad_") + name
    row, column = plan.operands[row_role], plan.operands["wgrad_" + name]
    wgrad_specs = (plan.operands[role].spec for role in GEMMS["wgrad"])
    rotated = shares_rotation(*wgrad_specs)
    if plan.native or torch.compiler.is_compiling() or pair_refusal(row, column, rotated):
        return None
    signs = None
    if column.spec.rht is not None and column.spec.rht_signs == "per_step":
        signs = rotation_signs(plan, "wgrad", column.spec, offsets, tensor.device)
    multiple = plan.token_multiple
    padded = -(-tensor.shape[0] // multiple) * multiple
    row_offset, column_offset = offsets[ROLE_SLOTS[row_role]], offsets[ROLE_SLOTS[column.role]]
    return both_orientations(
        tensor, row, column, rotated, padded, plan.seed, row_offset, column_offset, signs
    )


def gemm_of(plan: Plan) -> Callable[..., Tensor]:
    """The plan's GEMM: the exact emulation (`stochround.blocks.scaled_mm`) or the FP8
    tensor cores (`stochround.blocks.gemm.native_fp8_mm`)."""
    return native_fp8_mm if plan.native else scaled_mm


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, asked once (a forward reads it every step)."""
    return torch.cuda.get_device_capability(device)


def check_native(x: Tensor) -> None:
    """ValueError unless x lies on a GPU with FP8 tensor cores (compute capability 8.9 or
    higher), which ``gemm="native"`` runs its GEMMs on."""
    if not x.is_cuda:
        raise ValueError(
            f"gemm='native' runs FP8 tensor-core GEMMs, on CUDA; got a tensor on {x.device} "
            "(the default gemm='emulated' runs anywhere)"
        )
    capability = _capability(x.device)
    if capability < (8, 9):
        name = torch.cuda.get_device_name(x.device)
        raise ValueError(
            f"gemm='native' needs FP8 tensor cores (compute capability 8.9 or higher); {name} "
            f"has {capability[0]}.{capability[1]} (the default gemm='emulated' runs anywhere)"
        )


class QuantizedMatmul(torch.autograd.Function):
    """``x W^T + b`` with the three GEMMs on quantized operands (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        step: Tensor,
        plan: Plan,
        wgrad: bool = False,
        dgrad: bool = False,
    ) -> Tensor:
        with autocast_off(x.device.type):
            column = step_column(step, plan.layer)
            offsets = slot_offsets(column)
            # where wgrad runs, x read once for both of its operands: wgrad's kept for the
            # backward instead of transposing and quantizing x again there
            pair = quantized_pair(plan, x, "input", offsets) if wgrad else None
            left = x if pair is None else pair[0]
            # per-tensor: Q(W)^T and Q(x)^T for the backward, written with Q(W) and Q(x)
            runs = {"dgrad_weight": dgrad, "wgrad_input": wgrad}
            reuse = frozenset(role for role in plan.tensor_transposes if runs.get(role))
            qx, qw, reused = gemm_operands(plan, "fprop", left, weight, offsets, reuse)
            out = gemm_of(plan)(qx, qw, bias=bias, out_dtype=x.dtype)
        # dgrad's Q(W^T) is Q(W)^T: kept for the backward (a transposed view, which the
        # GEMM reads as it is) instead of quantizing W^T again (per-tensor: contiguous)
        kept = plan.weight_transposes and qw.row_scale is None
        values, scale = (qw.values, qw.tensor_scale) if kept else (None, None)
        if "dgrad_weight" in reused:
            values, scale = reused["dgrad_weight"][:2]
        x_t_values, x_t_scale = (None, None) if pair is None else pair[1][:2]
        if "wgrad_input" in reused:  # Q(x^T) is Q(x)^T
            x_t_values, x_t_scale = reused["wgrad_input"][:2]
        ctx.save_for_backward(x, weight, column, values, scale, x_t_values, x_t_scale)
        ctx.factor = qw.factor
        ctx.plan = plan
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale = ctx.saved_tensors
        offsets = slot_offsets(column)
        plan: Plan = ctx.plan
        grad_x = grad_weight = grad_bias = None
        dgrad, wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with autocast_off(grad.device.type):
            # dy read once for both of its operands where both GEMMs run
            pair = None
            if dgrad and wgrad:
                pair = quantized_pair(plan, grad.contiguous(), "grad_output", offsets)
            if dgrad:
                right: Tensor | GemmOperand
                if weight_values is not None:
                    right = GemmOperand(weight_values, weight_scale, None, ctx.factor)
                    if "dgrad_weight" not in plan.tensor_transposes:  # per-tensor: W^T's
                        right = right._replace(values=weight_values.T)
                else:
                    right = transposed(weight)
                left = grad if pair is None else pair[0]
                # Q(dy^T) is Q(dy)^T (per-tensor), written with Q(dy)
                reuse = plan.tensor_transposes & {"wgrad_grad_output"} if wgrad else frozenset()
                qdy, qw, reused = gemm_operands(plan, "dgrad", left, right, offsets, reuse)
                grad_x = gemm_of(plan)(qdy, qw, out_dtype=x.dtype)
                if "wgrad_grad_output" in reused:
                    pair = (qdy, reused["wgrad_grad_output"])
            if wgrad:
                multiple = plan.token_multiple
                grad_t: Tensor | GemmOperand
                x_t: Tensor | GemmOperand
                if pair is not None:
                    grad_t = pair[1]
                else:
                    grad_t = pad_tokens(transposed(grad.contiguous()), multiple)
                if x_t_values is not None:
                    x_t = GemmOperand(x_t_values, x_t_scale, None, 1.0)
                else:
                    x_t = pad_tokens(transposed(x.contiguous()), multiple)
                qdy, qx, _ = gemm_operands(plan, "wgrad", grad_t, x_t, offsets)
                grad_weight = gemm_of(plan)(qdy, qx, out_dtype=weight.dtype)
            if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
                grad_bias = bias_gradient(grad).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None


def check_operand_shapes(
    plan: Plan,
    tokens: int,
    in_features: int,
    out_features: int,
    gemms: tuple[str, ...] = tuple(GEMMS),
) -> None:
    """ValueError, naming the role, unless every quantized operand of ``gemms`` has blocks
    (and RHT) dividing its shape with the contraction axis last: x ``(T, in)`` and W
    ``(out, in)`` in fprop, dy ``(T, out)`` and W^T ``(in, out)`` in dgrad, dy^T ``(out,
    T')`` and x^T ``(in, T')`` in wgrad, with ``T'`` the tokens padded to the plan's
    `token_multiple` (`pad_tokens`)."""
    padded = -(-tokens // plan.token_multiple) * plan.token_multiple
    shapes = {
        "fprop_input": (tokens, in_features),
        "fprop_weight": (out_features, in_features),
        "dgrad_grad_output": (tokens, out_features),
        "dgrad_weight": (in_features, out_features),
        "wgrad_grad_output": (out_features, padded),
        "wgrad_input": (in_features, padded),
    }
    for role in (role for gemm in gemms for role in GEMMS[gemm]):
        entry = plan.operands[role]
        if entry.fmt is None or entry.spec.format in TENSOR_FORMATS:
            continue
        shape = torch.Size(shapes[role])
        try:
            check_blocks(entry.fmt, shape, 1)
            rht = entry.spec.rht
            if rht is not None and shape[1] % rht:
                raise ValueError(f"rht={rht} must divide the contraction length {shape[1]}")
        except ValueError as error:
            raise ValueError(
                f"{role}: the operand {tuple(shape)} (contraction axis last) does not fit "
                f"its blocks: {error}"
            ) from None


def running_gemms(x: Tensor, weight: Tensor) -> tuple[str, ...]:
    """The GEMMs a call will run: fprop always; dgrad if x needs a gradient, wgrad if the
    weight does (under grad mode)."""
    grad_mode = torch.is_grad_enabled()
    dgrad = ("dgrad",) if grad_mode and x.requires_grad else ()
    wgrad = ("wgrad",) if grad_mode and weight.requires_grad else ()
    return ("fprop", *dgrad, *wgrad)


class QuantizedLinear(nn.Linear):
    """A drop-in `nn.Linear` whose fprop, dgrad and wgrad GEMMs take the operands
    quantized by ``recipe`` (module docstring).

    Args:
        in_features, out_features, bias, device, dtype: as `nn.Linear`.
        recipe: the `Recipe` (keyword).
        layer_index: the layer's number in its model, in [0, 2**28): its random streams
            (`stream_offset`); `stochround.nn.quantize_` numbers the layers it replaces.

    The buffer ``step`` (a 0-d int64 tensor, saved in ``state_dict``) counts the forward
    calls made under grad mode; a state dict without it (an `nn.Linear`'s) loads and keeps
    the layer's step.  Under ``torch.no_grad`` the step does not advance.  An activation
    checkpoint's recomputation reads its forward's step again (`stochround.nn.recompute`).
    """

    step: Tensor
    layer_index: int
    recipe: Recipe
    plan: Plan

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
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))
        self.step_reads: deque[Tensor] = deque()  # for recomputations (`read_step`)
        self.set_recipe(recipe, layer_index)

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
        self.plan = make_plan(recipe, layer)
        # asked now, before any trace: first asked inside the traced autograd function, the
        # answer's caching would be a side effect there, which breaks the trace
        triton_missing()
        # 2-D weight tiles and the weight's blocks are known now; the tokens at each call
        check_operand_shapes(self.plan, 0, self.in_features, self.out_features)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, recipe: Recipe, layer_index: int = 0
    ) -> QuantizedLinear:
        """A `QuantizedLinear` sharing ``linear``'s weight and bias (the same Parameter
        objects: an optimizer built on ``linear`` keeps working), with its hooks dropped."""
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
        )
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer.step = torch.zeros((), dtype=torch.int64, device=linear.weight.device)
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
        if torch.compiler.is_compiling() and not COMPILES:
            raise RuntimeError(
                "QuantizedLinear compiles with torch >= 2.11 (on older releases the "
                f"compiled backward was seen to give zero weight gradients); torch "
                f"{torch.__version__} runs it eagerly: leave the model uncompiled"
            )
        plan, wrap = self.plan, None
        if is_dtensor(weight) or is_dtensor(x):  # tensor parallelism: the local GEMMs
            call = local_call(x, weight, bias)
            x, weight, bias, wrap = call.x, call.weight, call.bias, call.wrap
            plan = plan._replace(seed=rank_key(plan.seed, call.rank))
        in_features, out_features = weight.shape[1], weight.shape[0]
        if x.dim() == 0 or x.shape[-1] != in_features:
            raise ValueError(
                f"x must have in_features={in_features} values along its last axis; "
                f"got an input of shape {tuple(x.shape)}"
            )
        if plan.native:
            check_native(x)
        lead = x.shape[:-1]
        matrix = x.dim() == 2  # a matrix of tokens already: no reshape either way
        tokens = x if matrix else x.reshape(-1, in_features)
        gemms = running_gemms(x, weight)
        try:
            check_operand_shapes(plan, tokens.shape[0], in_features, out_features, gemms)
        except ValueError as error:
            if wrap is None:
                raise
            raise ValueError(
                f"{error} (under tensor parallelism each rank quantizes its shard: the "
                "blocks must divide the local shapes)"
            ) from None
        # parallelize_module replicates the buffers: the counter is the local tensor
        counter = self.step.to_local() if is_dtensor(self.step) else self.step
        # one step a training forward, which a checkpoint's recomputation reads again
        read = read_step(counter, self.step_reads, self.training)
        step = counter.clone() if read is None else read
        wgrad, dgrad = "wgrad" in gemms, "dgrad" in gemms
        out = QuantizedMatmul.apply(tokens, weight, bias, step, plan, wgrad, dgrad)
        out = typing.cast(Tensor, out)
        # a tensor of its own, as nn.Linear returns for a matrix (reshape would return a
        # view of the 2-D result, on whose in-place use FSDP2 warns at every forward)
        y = out if matrix else torch.ops.aten._unsafe_view(out, (*lead, out_features))
        return y if wrap is None else wrap(y)

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
        key = prefix + "step"
        if key not in state_dict:
            state_dict[key] = self.step.detach().clone()
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, layer_index={self.layer_index}"


__all__ = [
    "MAX_LAYERS",
    "ROLE_SLOTS",
    "SIGN_SLOTS",
    "SLOTS_PER_LAYER",
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
