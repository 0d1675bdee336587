"""`QuantizedMatmul`: the autograd function of a `QuantizedLinear` call, ``x W^T + b`` with
its fprop, dgrad and wgrad GEMMs on the operands its `stochround.nn.layer_plan.Plan`
quantizes (`stochround.nn.linear`'s docstring states the GEMMs and the streams), and the
pieces it runs: each GEMM's operands (`gemm_operands`), both orientations of x or dy from
one read (`quantized_pair`), the RHT signs (`rotation_signs`) and the GEMM itself
(`gemm_of`)."""

from __future__ import annotations

import contextlib
import functools
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..blocks.gemm import native_fp8_mm, scaled_mm
from ..blocks.hadamard import random_signs
from ..blocks.tensor import GemmOperand
from .amax_history import AmaxHistory
from .layer_plan import Plan, pad_tokens, shares_rotation
from .operands import TRANSPOSE_TARGETS, quantize_operand
from .orientations import both_orientations, pair_refusal
from .quant_spec import QuantSpec
from .recipes import GEMMS
from .step_ops import autocast_off, bias_gradient, transposed
from .step_plan import StepPlan
from .streams import ROLE_SLOTS, SIGN_SLOTS, slot_offsets


def rotation_signs(
    plan: Plan, gemm: str, spec: QuantSpec, offsets: Sequence[Tensor], device: torch.device
) -> Tensor | None:
    """The RHT signs of ``spec``'s operand in ``gemm``: per-step signs from the GEMM's own
    stream (`SIGN_SLOTS`, so that both operands draw the same rotation), fixed signs
    ``random_signs(size, RHT_SEED)``, are None (the block quantizer's cached copy).  Never
    traced: a compiled layer runs this code inside its opaque ops
    (`stochround.nn.opaque_matmul`)."""
    if spec.rht_signs != "per_step":
        return None
    size = typing.cast(int, spec.rht)
    return random_signs(size, plan.seed, offset=offsets[SIGN_SLOTS[gemm]], device=device)


def gemm_operands(
    plan: Plan,
    gemm: str,
    left: Tensor | GemmOperand,
    right: Tensor | GemmOperand,
    offsets: Sequence[Tensor],
    reuse: frozenset[str] = frozenset(),
    history: AmaxHistory | None = None,
) -> tuple[GemmOperand, GemmOperand, dict[str, GemmOperand]]:
    """Q(left), Q(right) of ``gemm`` (both with the contraction axis last), each drawing
    from its role's stream at the step whose slots' offsets (`slot_offsets`) are ``offsets``,
    rotated by `rotation_signs` where its spec has an RHT; an operand already quantized is
    taken as it is.  And by role, the operands of the roles in ``reuse`` (of the plan's
    `tensor_transposes`) that are one of these transposed, written with it.  ``history``:
    the layer's amax history at the step, for delayed tensor scales (`quantize_operand`)."""
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
            operand.contiguous(), entry, plan.key_of(role), offset, signs, rotated,
            native=plan.native, transposes=transposes, history=history,
        )  # fmt: skip
        if transposes and target is not None:
            reused[target] = transposes[0]
        results.append(quantized)
    return results[0], results[1], reused


def quantized_pair(
    plan: Plan,
    tensor: Tensor,
    name: str,
    offsets: Sequence[Tensor],
    history: AmaxHistory | None = None,
) -> tuple[GemmOperand, GemmOperand] | None:
    """Both operands of x (``name`` "input": fprop's and wgrad's) or dy ("grad_output":
    dgrad's and wgrad's) from one read (`stochround.nn.orientations.both_orientations`),
    each from its role's stream, wgrad's padded to `token_multiple` tokens and rotated
    with wgrad's signs, delayed roles reading and recording in ``history``; None where the
    pair is not served (the caller quantizes each)."""
    row_role = ("fprop_" if name == "input" else "dgrad_") + name
    row, column = plan.operands[row_role], plan.operands["wgrad_" + name]
    wgrad_specs = (plan.operands[role].spec for role in GEMMS["wgrad"])
    rotated = shares_rotation(*wgrad_specs)
    if plan.native or pair_refusal(row, column, rotated):
        return None
    signs = None
    if column.spec.rht is not None and column.spec.rht_signs == "per_step":
        signs = rotation_signs(plan, "wgrad", column.spec, offsets, tensor.device)
    multiple = plan.token_multiple
    padded = -(-tensor.shape[0] // multiple) * multiple
    row_offset, column_offset = offsets[ROLE_SLOTS[row_role]], offsets[ROLE_SLOTS[column.role]]
    key = plan.key_of(row_role)  # x or dy: both roles a data role (`DATA_ROLES`)
    return both_orientations(
        tensor, row, column, rotated, padded, key, row_offset, column_offset, signs, history
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


def unautocast(device_type: str) -> contextlib.AbstractContextManager[None]:
    """`autocast_off` where autocast is on for ``device_type``, else a context that does
    nothing (entering torch.autocast costs a step host time it need not pay)."""
    if torch.is_autocast_enabled(device_type):
        return autocast_off(device_type)
    return contextlib.nullcontext()


def pair_of(
    prepared: StepPlan | None,
    plan: Plan,
    tensor: Tensor,
    name: str,
    offsets: Sequence[Tensor],
    history: AmaxHistory | None = None,
) -> tuple[GemmOperand, GemmOperand] | None:
    """`quantized_pair`'s operands, by the step plan's pair route where it has one (the
    refusals asked when it was made; None where it has none: each orientation on its own),
    else asked now; delayed roles read and record in ``history`` (None where the pair
    refuses their step: `stochround.nn.orientations.PreparedPair`)."""
    if prepared is None:
        return quantized_pair(plan, tensor, name, offsets, history)
    route = prepared.input_pair if name == "input" else prepared.grad_pair
    if route is None:
        return None
    if tensor.dtype != prepared.signature.dtype:  # a gradient of another dtype: ask now
        return quantized_pair(plan, tensor, name, offsets, history)
    signs = None
    if route.signs_per_step:
        spec = plan.operands["wgrad_" + name].spec
        signs = rotation_signs(plan, "wgrad", spec, offsets, tensor.device)
    row_offset, column_offset = offsets[route.row_slot], offsets[route.column_slot]
    key = plan.key_of("wgrad_" + name)  # x or dy: both roles a data role
    return route.pair(tensor, key, row_offset, column_offset, signs, history)


def run_gemm(
    prepared: StepPlan | None,
    plan: Plan,
    name: str,
    a: GemmOperand,
    b: GemmOperand,
    bias: Tensor | None,
    out_dtype: torch.dtype,
    transposed: bool = False,
) -> Tensor:
    """The GEMM ``name`` of the plan (`gemm_of`): the emulated one by the step plan's
    prepared GEMM where there is a step plan.  ``transposed``: b's values given as their
    transpose (K, N), which the prepared GEMM reads as they are (other routes take the
    transposed view)."""
    if prepared is None or plan.native:
        if transposed:
            b = b.transposed_values()
        return gemm_of(plan)(a, b, bias=bias, out_dtype=out_dtype)
    return prepared.gemm(name, a, b, bias, out_dtype, transposed)


class QuantizedMatmul(torch.autograd.Function):
    """``x W^T + b`` with the three GEMMs on quantized operands (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        column: Tensor,
        plan: Plan,
        wgrad: bool = False,
        dgrad: bool = False,
        prepared: StepPlan | None = None,
        history: AmaxHistory | None = None,
    ) -> Tensor:
        with unautocast(x.device.type):
            offsets = slot_offsets(column)
            # where wgrad runs, x read once for both of its operands: wgrad's kept for the
            # backward instead of transposing and quantizing x again there
            pair = pair_of(prepared, plan, x, "input", offsets, history) if wgrad else None
            left = x if pair is None else pair[0]
            # per-tensor: Q(W)^T and Q(x)^T for the backward, written with Q(W) and Q(x)
            runs = {"dgrad_weight": dgrad, "wgrad_input": wgrad}
            reuse = frozenset(role for role in plan.tensor_transposes if runs.get(role))
            qx, qw, reused = gemm_operands(plan, "fprop", left, weight, offsets, reuse, history)
            out = run_gemm(prepared, plan, "fprop", qx, qw, bias, x.dtype)
        # dgrad's Q(W^T) is Q(W)^T: Q(W) kept for the backward (which dgrad's GEMM reads
        # transposed, `run_gemm`'s ``transposed``) instead of quantizing W^T again
        # (per-tensor: W^T's own contiguous values)
        kept = plan.weight_transposes and qw.row_scale is None
        values, scale = (qw.values, qw.tensor_scale) if kept else (None, None)
        if "dgrad_weight" in reused:
            values, scale = reused["dgrad_weight"][:2]
        x_t_values, x_t_scale = (None, None) if pair is None else pair[1][:2]
        if "wgrad_input" in reused:  # Q(x^T) is Q(x)^T
            x_t_values, x_t_scale = reused["wgrad_input"][:2]
        ctx.save_for_backward(x, weight, column, values, scale, x_t_values, x_t_scale)
        # the slots' offsets (views of the saved column, int64, outside autograd) kept for
        # the backward instead of splitting the column again there
        ctx.offsets = offsets
        ctx.factor = qw.factor
        ctx.plan = plan
        ctx.prepared = prepared
        ctx.history = history  # the backward's delayed roles read and record at the same step
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, column, weight_values, weight_scale, x_t_values, x_t_scale = ctx.saved_tensors
        # the forward's offsets, or (the compiled layer's backward op: no forward of this
        # ctx) the saved column's
        offsets = getattr(ctx, "offsets", None) or slot_offsets(column)
        plan: Plan = ctx.plan
        prepared: StepPlan | None = ctx.prepared
        history: AmaxHistory | None = getattr(ctx, "history", None)
        grad_x = grad_weight = grad_bias = None
        dgrad, wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with unautocast(grad.device.type):
            # dy read once for both of its operands where both GEMMs run
            pair = None
            if dgrad and wgrad:
                dy = grad.contiguous()
                pair = pair_of(prepared, plan, dy, "grad_output", offsets, history)
            if dgrad:
                right: Tensor | GemmOperand
                # Q(W) kept (not per-tensor, whose kept values are W^T's own): dgrad's b
                # given as its transpose, which the GEMM reads as it is (no view)
                kept_w = weight_values is not None and "dgrad_weight" not in plan.tensor_transposes
                if weight_values is not None:
                    right = GemmOperand(weight_values, weight_scale, None, ctx.factor)
                else:
                    right = transposed(weight)
                left = grad if pair is None else pair[0]
                # Q(dy^T) is Q(dy)^T (per-tensor), written with Q(dy)
                reuse = plan.tensor_transposes & {"wgrad_grad_output"} if wgrad else frozenset()
                qdy, qw, reused = gemm_operands(plan, "dgrad", left, right, offsets, reuse, history)
                grad_x = run_gemm(prepared, plan, "dgrad", qdy, qw, None, x.dtype, kept_w)
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
                qdy, qx, _ = gemm_operands(
                    plan, "wgrad", grad_t, x_t, offsets, frozenset(), history
                )
                grad_weight = run_gemm(prepared, plan, "wgrad", qdy, qx, None, weight.dtype)
            if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
                grad_bias = bias_gradient(grad).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None


__all__ = [
    "QuantizedMatmul",
    "check_native",
    "gemm_of",
    "gemm_operands",
    "pair_of",
    "quantized_pair",
    "rotation_signs",
    "run_gemm",
    "unautocast",
]
