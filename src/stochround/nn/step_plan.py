"""A `QuantizedLinear` call's choices resolved once per input signature (`StepPlan`): the
eager step on the kernels' route re-decides nothing that the layer's recipe, the input's
shape, dtype and device, grad mode and the routing switches fix.

`step_signature` is the key a layer caches its plans under (`QuantizedLinear.step_plans`);
`make_step_plan` checks the call's shapes against the recipe's blocks once (the checks a
call would repeat) and resolves the routes: whether x's and dy's two orientations come
from one read (the prepared pair, `stochround.nn.orientations.PreparedPair`, or None for
the separate path), and, at each GEMM's first call, its prepared GEMM
(`stochround.blocks.gemm.PreparedScaledMm`).  Traced calls (torch.compile), tensor
parallelism and the FP8 tensor cores keep the per-call route (`QuantizedMatmul` given no
step plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from ..blocks.gemm import PreparedScaledMm
from ..blocks.tensor import GemmOperand
from ..kernels.availability import on_kernel_device
from . import orientations
from .layer_plan import Plan, check_operand_shapes, shares_rotation
from .orientations import PreparedPair
from .recipes import GEMMS
from .streams import ROLE_SLOTS


class StepSignature(NamedTuple):
    """What a call's choices depend on besides the layer's recipe: x's shape, dtype,
    device and contiguity, the weight's and bias's dtypes, the GEMMs the call runs, the
    autocast dtype (None: off), whether x lies where "auto" routes to the kernels
    (`stochround.kernels.availability.on_kernel_device`) and whether steps take the pair
    (`stochround.nn.orientations.SERVES_STEPS`)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    contiguous: bool
    weight_dtype: torch.dtype
    bias_dtype: torch.dtype | None
    gemms: tuple[str, ...]
    autocast: torch.dtype | None
    kernels: bool
    pairs: bool


def step_signature(
    x: Tensor, weight: Tensor, bias: Tensor | None, gemms: tuple[str, ...]
) -> StepSignature:
    """The `StepSignature` of a call (x, weight and bias as the GEMMs take them)."""
    device_type = x.device.type
    autocast = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    )
    return StepSignature(
        x.shape, x.dtype, x.device, x.is_contiguous(), weight.dtype,
        None if bias is None else bias.dtype, gemms, autocast, on_kernel_device(x),
        orientations.SERVES_STEPS,
    )  # fmt: skip


class PairRoute(NamedTuple):
    """The prepared pair of x (or dy) and where its stream offsets lie: the slot of the
    row-wise and of the column-wise role (`ROLE_SLOTS`), and whether the column-wise
    role's rotation draws per-step signs."""

    pair: PreparedPair
    row_slot: int
    column_slot: int
    signs_per_step: bool


@dataclass(frozen=True)
class StepPlan:
    """A call's choices for one `StepSignature` of one layer (module docstring): the
    layer's `Plan`, the signature, the tokens, the pair routes of x ("input") and dy
    ("grad_output", None: each orientation on its own) and each GEMM's prepared GEMM,
    made at its first call (``gemms``, by GEMM name)."""

    plan: Plan
    signature: StepSignature
    tokens: int
    input_pair: PairRoute | None
    grad_pair: PairRoute | None
    gemms: dict[str, PreparedScaledMm] = field(default_factory=dict)

    def gemm(
        self,
        name: str,
        a: GemmOperand,
        b: GemmOperand,
        bias: Tensor | None,
        out_dtype: torch.dtype,
        transposed: bool = False,
    ) -> Tensor:
        """``gemm``'s scaled product (`stochround.blocks.scaled_mm`'s bits) by its prepared
        GEMM, made at the first call.  ``transposed``: b's values given as their transpose
        (`PreparedScaledMm`)."""
        prepared = self.gemms.get(name)
        if prepared is None:
            example = b.transposed_values() if transposed else b
            prepared = self.gemms[name] = PreparedScaledMm(a, example, bias, out_dtype)
        return prepared(a, b, bias, out_dtype, transposed)


class StepPlans(dict[StepSignature, StepPlan]):
    """A layer's step plans by signature: a cache, which a copy or a pickle of the layer
    leaves empty (its prepared launches hold example tensors and the kernels' compiled
    state, made again at the copy's first call)."""

    def __deepcopy__(self, memo: dict[int, object]) -> StepPlans:
        return StepPlans()

    def __reduce__(self) -> tuple[type[StepPlans], tuple[()]]:
        return (StepPlans, ())


def pair_route(
    plan: Plan, name: str, shape: torch.Size, dtype: torch.dtype, device: torch.device
) -> PairRoute | None:
    """The pair route of x (``name`` "input") or dy ("grad_output") of ``shape`` (tokens,
    features), or None where `stochround.nn.orientations.both_orientations` would not
    serve it (the same refusals, asked once)."""
    row_role = ("fprop_" if name == "input" else "dgrad_") + name
    row, column = plan.operands[row_role], plan.operands["wgrad_" + name]
    rotated = shares_rotation(*(plan.operands[role].spec for role in GEMMS["wgrad"]))
    if plan.native:
        return None
    multiple = plan.token_multiple
    padded = -(-shape[0] // multiple) * multiple
    # the matrix of tokens: contiguous, or made so (x.reshape, dy.contiguous())
    pair = orientations.served_pair(row, column, rotated, shape, dtype, device, True, padded)
    if pair is None:
        return None
    per_step = column.spec.rht is not None and column.spec.rht_signs == "per_step"
    return PairRoute(pair, ROLE_SLOTS[row_role], ROLE_SLOTS[column.role], per_step)


def make_step_plan(
    plan: Plan, signature: StepSignature, in_features: int, out_features: int
) -> StepPlan:
    """The `StepPlan` of a call of this signature (x's tokens along its leading axes): the
    shapes checked against the recipe's blocks (`check_operand_shapes`'s ValueError) and
    the pair routes resolved (x's on its matrix of tokens)."""
    tokens = signature.shape[:-1].numel()
    check_operand_shapes(plan, tokens, in_features, out_features, signature.gemms)
    wgrad = "wgrad" in signature.gemms
    x_pair = dy_pair = None
    # x's pair writes fprop's operand and wgrad's: none for a call without fprop (the
    # compiled layer's backward op)
    if wgrad and "fprop" in signature.gemms and signature.contiguous:
        shape = torch.Size((tokens, in_features))
        x_pair = pair_route(plan, "input", shape, signature.dtype, signature.device)
    if wgrad and "dgrad" in signature.gemms:
        dy_shape = torch.Size((tokens, out_features))
        dy_pair = pair_route(plan, "grad_output", dy_shape, signature.dtype, signature.device)
    return StepPlan(plan, signature, tokens, x_pair, dy_pair)


__all__ = [
    "PairRoute",
    "StepPlan",
    "StepPlans",
    "StepSignature",
    "make_step_plan",
    "pair_route",
    "step_signature",
]
