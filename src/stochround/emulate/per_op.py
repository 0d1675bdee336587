"""``accumulate="per_op"``: an op of `PER_OP_OPS` computed by `stochround.arith`, every
product and every addition of its accumulation rounded to the format with the emulation's
mode, each at its own offset of the emulation's counter (the emulation guide states the
offsets)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .. import arith
from ..formats import Format
from .ops import PER_OP_OPS, aten, cannot_compute_per_op

# the rounding options of an arith call that consumes ``steps`` offsets, from the
# emulation's counter, which it advances past them (`Emulation._arith_options`)
Options = Callable[[int], dict[str, Any]]


def per_op_result(
    func: torch._ops.OpOverload,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    formats: Mapping[torch.dtype, Format],
    mode: str,
    options: Options,
) -> Tensor | None:
    """``func`` computed per operation, or None for an op that does not accumulate (rounded
    once, as under "once") or whose result has no format (``formats``: each dtype's).
    ValueError naming the op for an accumulating op it cannot compute
    (`cannot_compute_per_op`)."""
    if func not in PER_OP_OPS:
        if cannot_compute_per_op(func):
            raise ValueError(
                f"accumulate='per_op' cannot compute {func} per operation (it computes "
                f"{', '.join(sorted(str(op) for op in PER_OP_OPS))}); run it under "
                "accumulate='once' or leave it out with an ops filter"
            )
        return None
    first = args[0]
    dtype = kwargs.get("dtype") or first.dtype
    target = formats.get(dtype)
    if target is None:
        return None
    if func.overloadpacket in (aten.sum, aten.mean):
        return _sum(func, first.to(dtype), args[1:], kwargs, target, mode, options)
    return _product(func, args, kwargs, target, mode, options)


def _sum(
    func: torch._ops.OpOverload,
    x: Tensor,
    rest: tuple[Any, ...],
    kwargs: dict[str, Any],
    target: Format,
    mode: str,
    options: Options,
) -> Tensor:
    """sum/mean over ``dim`` (None or []: every dim): the reduced dims moved last and
    flattened row-major, `arith.sum` in recursive order (offsets k .. k + n - 1 for n
    terms); mean divides that sum by n with `arith.div`, the next offset, k + n."""
    dim = rest[0] if rest else kwargs.get("dim")
    keepdim = bool(rest[1]) if len(rest) > 1 else bool(kwargs.get("keepdim", False))
    dims = sorted(d % max(x.ndim, 1) for d in dim) if dim else list(range(x.ndim))
    kept = [d for d in range(x.ndim) if d not in dims]
    terms = x.detach().permute([*kept, *dims]).reshape(*(x.shape[d] for d in kept), -1)
    count = terms.shape[-1]
    if count == 0:
        raise ValueError(f"accumulate='per_op' cannot compute {func} of no elements")
    total = arith.sum(terms, target, mode, dim=-1, **options(count))
    if func.overloadpacket is aten.mean:
        divisor = torch.full_like(total, float(count))
        total = arith.div(total, divisor, target, mode, **options(1))
    if keepdim:
        shape = [1 if d in dims else size for d, size in enumerate(x.shape)]
        total = total.reshape(shape)
    return total


def _product(
    func: torch._ops.OpOverload,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    target: Format,
    mode: str,
    options: Options,
) -> Tensor:
    """mm, bmm, mv, dot, addmm: `arith.matmul` (`arith.dot` for dot), products rounded
    to the format and summed in recursive order, offsets k (the products) and
    k + 1 .. k + K (the K steps of the sum); addmm adds its ``input`` with `arith.add`
    at offset k + K + 1 (beta = alpha = 1 only)."""
    if func is aten.addmm.default:
        bias, a, b = args[0], args[1], args[2]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        if beta != 1 or alpha != 1:
            raise ValueError(
                f"accumulate='per_op' computes {func} with beta = alpha = 1 only; got "
                f"beta={beta!r}, alpha={alpha!r}"
            )
    else:
        bias, a, b = None, args[0], args[1]
    a, b = a.detach(), b.detach()
    count = a.shape[-1]
    if func is aten.dot.default:
        return arith.dot(a, b, target, mode, **options(count + 1))
    if func is aten.mv.default:
        column = arith.matmul(a, b.unsqueeze(-1), target, mode, **options(count + 1))
        return column.squeeze(-1)
    out = arith.matmul(a, b, target, mode, **options(count + 1))
    if bias is not None:
        out = arith.add(bias.detach(), out, target, mode, **options(1))
    return out


__all__ = ["Options", "per_op_result"]
