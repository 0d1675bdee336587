"""Which ATen ops a compiled emulation lets Inductor compute, and an opaque stand-in for
the others, so that every op's result is the one the eager ATen kernel gives.

Inductor computes an op with code of its own (a decomposition, a fused reduction, its
own ``exp``) whose last bits may differ from the ATen kernel's, and one bit of difference
before a rounding can change the rounded result.  An op of `EXACT_PACKETS` gives the same
bits however it is computed (an exactly rounded elementwise operation, a data movement, a
comparison) or is lowered by Inductor to a call of the ATen kernel itself (the products:
`KEPT_DECOMPOSITIONS` lists them so that they are not decomposed).  Any other op with a
floating output runs through `opaque_op`: a custom op that calls the ATen op, which
Inductor calls as it is, so the compiled program computes it as the eager one does.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from .ops import LAYOUT_OPS, aten

# ops whose result is the same bits however a compiler computes them
EXACT_PACKETS = frozenset(
    {
        aten.add,
        aten.sub,
        aten.rsub,
        aten.mul,
        aten.div,
        aten.neg,
        aten.abs,
        aten.relu,
        aten.threshold_backward,
        aten.maximum,
        aten.minimum,
        aten.clamp,
        aten.clamp_min,
        aten.clamp_max,
        aten.where,
        aten.masked_fill,
        aten.sign,
        aten.floor,
        aten.ceil,
        aten.trunc,
        aten._to_copy,
        aten.clone,
        aten._unsafe_view,
        aten.copy,
        aten.fill,
        aten.full,
        aten.full_like,
        aten.zeros,
        aten.zeros_like,
        aten.ones,
        aten.ones_like,
        aten.scalar_tensor,
        aten.cat,
        aten.stack,
        aten.constant_pad_nd,
        aten.index_select,
        aten.gather,
        aten.amax,
        aten.amin,
        aten.mm,
        aten.bmm,
        aten.addmm,
    }
)

# the products: Inductor lowers them to the ATen kernel's call (without max-autotune), but
# its decomposition table would rewrite some shapes as elementwise products and a sum
KEPT_DECOMPOSITIONS = frozenset({aten.mm.default, aten.bmm.default, aten.addmm.default})

_LIBRARY_NAME = "stochround_emulate"
_library = torch.library.Library(_LIBRARY_NAME, "FRAGMENT")

# each opaque op made so far and the ATen op it calls
_WRAPPED: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}


def needs_opaque(func: torch._ops.OpOverload, outputs: Any) -> bool:
    """Whether ``func`` must run as the ATen kernel (`opaque_op`): it returns a floating
    tensor and is not one of `EXACT_PACKETS` or `LAYOUT_OPS` (which only move values)."""
    if func.overloadpacket in EXACT_PACKETS or func.overloadpacket in LAYOUT_OPS:
        return False
    return any(
        isinstance(t, torch.Tensor) and t.is_floating_point()
        for t in torch.utils._pytree.tree_leaves(outputs)
    )


@functools.cache
def opaque_op(func: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """A custom op ``stochround_emulate::<name>`` with ``func``'s schema (no aliasing: a
    functional op) whose body calls ``func``: Inductor neither decomposes nor lowers it."""
    schema = str(func._schema)
    name = re.sub(r"\W", "_", f"{func._schema.name}_{func._overloadname}".split("::")[-1])
    signature = schema[schema.index("(") :]
    _library.define(f"{name}{signature}")

    def body(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    _library.impl(name, body, "CompositeExplicitAutograd")
    opaque = getattr(getattr(torch.ops, _LIBRARY_NAME), name).default
    _WRAPPED[opaque] = func
    return opaque


def register_lowerings() -> None:
    """Registers, for each opaque op made so far, Inductor's lowering that calls the ATen
    op it wraps: the compiled program calls the ATen kernel directly, not through the
    custom op's Python body (a few microseconds of host time a call)."""
    from torch._inductor.lowering import fallback_handler, lowerings
    from torch._inductor.lowering import register_lowering as register

    for opaque, func in _WRAPPED.items():
        if opaque not in lowerings:
            register(opaque, type_promotion_kind=None)(fallback_handler(func, False))


__all__ = [
    "EXACT_PACKETS",
    "KEPT_DECOMPOSITIONS",
    "needs_opaque",
    "opaque_op",
    "register_lowerings",
]
