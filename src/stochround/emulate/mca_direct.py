"""The ops a batched MCA run (`stochround.emulate.mca_batched`) runs directly on the
samples' stacked ``(n, *shape)`` values, without `torch.func.vmap`: pointwise ops (ATen's
``torch.Tag.pointwise``) and the sums and means the exact pairs cover.

With the sample dimension leading, a pointwise op on stacked values is the op of each
sample: a sample tensor of fewer dims than the op's largest is viewed as ``(n, 1, ...,
1, *shape)`` so that broadcasting aligns its trailing dims as one sample's op aligns them,
and a tensor shared by every sample is viewed as ``(n, *shape)`` (``expand``: no copy).
A sum or mean over dims ``d`` of one sample is the stacked sum over ``d + 1`` (every dim:
``1 .. ndim``), which is vmap's own rule for them.  The one difference the leading dim can
make is the result's dtype: PyTorch promotes a 0-d tensor's dtype below a tensor of dims,
and stacking gives a 0-d value a dim; an op whose dtypes stacking would change (found once
per form of the call, on meta tensors) is left to vmap.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from enum import Enum
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .ops import OpKind, aten

# a sum or mean of one sample, and the stacked op over explicit dims that computes it
_REDUCTIONS = {
    aten.sum.default: aten.sum.dim_IntList,
    aten.sum.dim_IntList: aten.sum.dim_IntList,
    aten.mean.default: aten.mean.dim,
    aten.mean.dim: aten.mean.dim,
}

# the argument types a pointwise op's direct run takes: tensors and numbers (no lists)
_ARGUMENT_TYPES = (
    torch.TensorType,
    torch.NumberType,
    torch.FloatType,
    torch.IntType,
    torch.BoolType,
    torch.StringType,
)


class Direct(Enum):
    """How an op overload runs on the stacked samples: pointwise, a reduction, or not at
    all (vmap's general path)."""

    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    NONE = "none"


# ops that lay values out and run per element on stacked samples as on one: a conversion
# (its options are keywords: a dtype, a device, a memory format)
_CONVERSIONS = frozenset({aten._to_copy.default})


def _takes(argument: torch.Argument) -> bool:
    kind = argument.type
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, _ARGUMENT_TYPES)


def direct_kind(func: torch._ops.OpOverload, kind: OpKind) -> Direct:
    """How ``func`` runs on stacked samples, read from its schema (once an overload): a
    pointwise op with one tensor result, fresh or its first argument written in place,
    arguments tensors and numbers, or a conversion (``_to_copy``); a sum or mean the exact
    pairs cover; else NONE."""
    if func in _REDUCTIONS:
        return Direct.REDUCTION
    if func in _CONVERSIONS:
        return Direct.POINTWISE
    schema = func._schema
    pointwise = (
        torch.Tag.pointwise in func.tags
        and not kind.aliases_only
        and not kind.lays_out
        and not kind.seeded
        and kind.mutated_positions in ((), (0,))
        and len(schema.returns) == 1
        and isinstance(schema.returns[0].type, torch.TensorType)
        and all(_takes(argument) for argument in schema.arguments)
    )
    return Direct.POINTWISE if pointwise else Direct.NONE


class CallSpec(Protocol):
    """How a call's flat values make its ``(args, kwargs)`` again (pytree's `TreeSpec`
    is one)."""

    def unflatten(self, leaves: Iterable[Any]) -> Any: ...


class _FlatSpec(NamedTuple):
    """The structure of a call whose arguments hold no list, tuple or dict (an ATen op's
    usual call): its positional count and keyword names."""

    positional: int
    names: tuple[str, ...]

    def unflatten(self, leaves: Iterable[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        values = list(leaves)
        split = self.positional
        return tuple(values[:split]), dict(zip(self.names, values[split:], strict=True))


def flat_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], CallSpec]:
    """A call's values in order (args, then kwargs' values) and how to rebuild it: pytree's
    flattening where a value is a container, else a flat spec (pytree's walk costs more
    than most ops' own host time)."""
    values = [*args, *kwargs.values()]
    if any(isinstance(v, list | tuple | dict) for v in values):
        return pytree.tree_flatten((args, kwargs))
    return values, _FlatSpec(len(args), tuple(kwargs))


class StackedCall(NamedTuple):
    """An op as it runs on the stacked samples: the overload, its arguments (every tensor
    ``(n, ...)``), its keyword arguments."""

    func: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def stacked_pointwise(
    func: torch._ops.OpOverload,
    leaves: list[Any],
    samples: list[Tensor | None],
    n: int,
) -> list[Any]:
    """A pointwise op's flat arguments on the stacked samples: a sample tensor's values
    (``samples[i]``, ``(n, *shape)``) given the op's largest dims, ``(n, 1, .., 1,
    *shape)``; a shared tensor so too, expanded over the samples (a view); any other value
    as it is."""
    ndim = max((v.ndim for v in leaves if isinstance(v, Tensor)), default=0)
    stacked: list[Any] = []
    for value, values in zip(leaves, samples, strict=True):
        if values is not None:
            if value.ndim < ndim:
                values = values.reshape(n, *(1,) * (ndim - value.ndim), *value.shape)
            stacked.append(values)
        elif isinstance(value, Tensor):
            padded = value[(None,) * (ndim - value.ndim + 1)]
            stacked.append(padded.expand(n, *padded.shape[1:]))
        else:
            stacked.append(value)
    return stacked


def stacked_reduction(
    func: torch._ops.OpOverload,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    values: Tensor,
) -> StackedCall | None:
    """A sum or mean of one sample of ``args[0]`` as the stacked op over the shifted dims
    (``values``: its ``(n, *shape)`` samples); None for a 0-d sample (no dim to shift:
    vmap's path) or a ``dim`` given as names."""
    ndim = values.ndim - 1
    if ndim == 0:
        return None
    if func in (aten.sum.default, aten.mean.default):
        dim, keepdim = None, False
    else:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
    if dim is not None and not all(isinstance(d, int) for d in dim):
        return None
    dims = [d % ndim + 1 for d in dim] if dim else list(range(1, ndim + 1))
    rest = {name: value for name, value in kwargs.items() if name not in ("dim", "keepdim")}
    return StackedCall(_REDUCTIONS[func], (values, dims, keepdim), rest)


# the binary ops one kernel computes whole on CUDA (`stochround.kernels.sample_pair`),
# by the name it takes
BINARY_KERNEL_OPS = {
    aten.add.Tensor: "add",
    aten.add.Scalar: "add",
    aten.sub.Tensor: "sub",
    aten.sub.Scalar: "sub",
    aten.rsub.Tensor: "rsub",
    aten.rsub.Scalar: "rsub",
    aten.mul.Tensor: "mul",
    aten.mul.Scalar: "mul",
    aten.div.Tensor: "div",
    aten.div.Scalar: "div",
}


class BinaryCall(NamedTuple):
    """A binary op on stacked samples as the kernel takes it: its name, a and b of one
    shape (b a float: a Python number as the op's float64 arithmetic holds it), the
    dtype of a, b and the result."""

    op: str
    a: Tensor
    b: Tensor | float
    dtype: torch.dtype


def binary_call(stacked: StackedCall) -> BinaryCall | None:
    """The stacked call as a `BinaryCall`, or None: not one of the ops, ``alpha`` other
    than 1, operands not float32 or float64 of one dtype and device, a number that is a
    bool or an int beyond 2**53.  A float taken with float32 tensors is first rounded to
    float32, as the emulation's float64 computation takes it (the native op's)."""
    op = BINARY_KERNEL_OPS.get(stacked.func)
    args, kwargs = stacked.args, stacked.kwargs
    if op is None or len(args) not in (2, 3) or not set(kwargs) <= {"alpha"}:
        return None
    alpha = args[2] if len(args) == 3 else kwargs.get("alpha", 1)
    a, b = args[0], args[1]
    if alpha != 1 or not isinstance(a, Tensor) or a.dtype not in (torch.float32, torch.float64):
        return None
    if isinstance(b, Tensor):
        if b.dtype != a.dtype or b.device != a.device:
            return None
        if a.shape != b.shape:
            a, b = torch.broadcast_tensors(a, b)
        return BinaryCall(op, a, b, a.dtype)
    number = scalar_operand(b, a.dtype)
    return None if number is None else BinaryCall(op, a, number, a.dtype)


def scalar_operand(b: object, dtype: torch.dtype) -> float | None:
    """A Python number ``b`` taken with tensors of ``dtype`` (float32 or float64) as the
    kernel takes it: a float rounded to float32 with float32 tensors (as the emulation's
    float64 computation takes it: the native op's), an int up to 2**53 as a float; None
    for a bool, a larger int or any other value."""
    if isinstance(b, bool) or not isinstance(b, int | float):
        return None
    if isinstance(b, int):
        return float(b) if abs(b) <= 2**53 else None
    return _as_float32(b) if dtype == torch.float32 else b


def _as_float32(value: float) -> float:
    """value rounded to float32 (to nearest, as ``torch.tensor(value, dtype=float32)``)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:  # beyond float32's range: torch's conversion gives infinity
        return float(torch.tensor(value, dtype=torch.float32))


def _meta(value: Any) -> Any:
    if isinstance(value, Tensor):
        return torch.empty((1,) * value.ndim, dtype=value.dtype, device="meta")
    return value


def _dtypes(out: Any) -> tuple[torch.dtype, ...]:
    return tuple(t.dtype for t in ([out] if isinstance(out, Tensor) else out))


def same_dtypes(
    func: torch._ops.OpOverload,
    leaves: list[Any],
    stacked: StackedCall,
    unflatten: Any,
) -> bool:
    """Whether ``func`` on one sample's arguments (``leaves``, unflattened by
    ``unflatten``) and the stacked call give results of the same dtypes (run on meta
    tensors); False where either cannot run there."""
    try:
        args, kwargs = unflatten([_meta(v) for v in leaves])
        one = func(*args, **kwargs)
        many = stacked.func(
            *[_meta(v) for v in stacked.args], **{k: _meta(v) for k, v in stacked.kwargs.items()}
        )
    except Exception:  # an op that has no meta kernel, or these arguments none: vmap's path
        return False
    return _dtypes(one) == _dtypes(many)


def signature(leaves: list[Any], batched: list[bool]) -> tuple[Any, ...] | None:
    """What a call's result dtypes depend on: each tensor's dtype, whether it is a sample
    tensor and whether it is 0-d, each number's type, any other value itself; None where
    a value cannot be a key (a call then asks the meta tensors itself)."""
    key: list[Any] = []
    for value, sample in zip(leaves, batched, strict=True):
        if isinstance(value, Tensor):
            key.append((value.dtype, sample, value.ndim == 0, value.layout))
        elif isinstance(value, bool | int | float | complex):
            key.append(type(value))
        else:
            try:
                hash(value)
            except TypeError:
                return None
            key.append(value)
    return tuple(key)


__all__ = [
    "BINARY_KERNEL_OPS",
    "BinaryCall",
    "CallSpec",
    "Direct",
    "StackedCall",
    "binary_call",
    "direct_kind",
    "flat_call",
    "same_dtypes",
    "scalar_operand",
    "signature",
    "stacked_pointwise",
    "stacked_reduction",
]
