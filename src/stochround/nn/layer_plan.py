"""A `QuantizedLinear`'s recipe resolved for its layer (`Plan`): each role's `Operand`, the
Philox key of its streams, the token multiple its wgrad operands pad to and which
operands the backward reuses transposed; and the checks of a call's shapes against it
(`check_operand_shapes`) and the GEMMs a call runs (`running_gemms`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import functional

from ..blocks.request import check_blocks
from ..random import StreamDomain, stream_key
from .operands import Operand, tensor_transposes
from .quant_spec import TENSOR_FORMATS, QuantSpec
from .recipes import GEMMS, ROLES, Recipe
from .streams import DATA_ROLES, check_data_parallel_rank, data_rank_key, stream_offset


class Plan(NamedTuple):
    """What a layer's GEMMs need: the six operands, the Philox key of its streams (the
    recipe's seed in `StreamDomain.RECIPE`: `stochround.random.stream_key`), the layer's
    index, the multiple the wgrad GEMM pads its token count to (`token_multiple`) and
    whether dgrad's weight operand is fprop's transposed (`weight_transposes`), and
    whether the GEMMs run on the FP8 tensor cores (``native``, `Recipe.gemm`), the
    per-tensor roles whose operand is another's transposed (`tensor_transposes`), and the
    layer's data-parallel rank, which keys the words of x and dy (`key_of`)."""

    operands: dict[str, Operand]
    seed: int
    layer: int
    token_multiple: int
    weight_transposes: bool
    native: bool = False
    tensor_transposes: frozenset[str] = frozenset()
    data_parallel_rank: int = 0

    def key_of(self, role: str) -> int:
        """The Philox key of ``role``'s words: the plan's ``seed``, folded with its
        data-parallel rank (`stochround.nn.streams.data_rank_key`) for the operands of x
        and dy (`DATA_ROLES`), which differ by rank; the weight's on every rank."""
        if role in DATA_ROLES and self.data_parallel_rank:
            return data_rank_key(self.seed, self.data_parallel_rank)
        return self.seed


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


def make_plan(recipe: Recipe, layer: int, data_parallel_rank: int = 0) -> Plan:
    """The `Plan` of ``recipe`` for layer number ``layer`` on data-parallel rank
    ``data_parallel_rank`` (`Plan.key_of`)."""
    operands = {}
    for role in ROLES:
        spec = recipe.spec(role)
        fmt = spec.block_format() if spec.quantized else None
        operands[role] = Operand(role, spec, fmt)
    stream_offset(0, layer, 0)  # checks the layer index
    check_data_parallel_rank(data_parallel_rank)
    key = int(stream_key(recipe.seed, StreamDomain.RECIPE))
    native = recipe.gemm == "native"
    reuse, multiple = weight_transposes(operands), token_multiple(operands)
    transposes = tensor_transposes(operands, multiple)
    return Plan(operands, key, layer, multiple, reuse, native, transposes, data_parallel_rank)


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


__all__ = [
    "Plan",
    "check_operand_shapes",
    "make_plan",
    "pad_tokens",
    "running_gemms",
    "shares_rotation",
    "token_multiple",
    "weight_transposes",
]
