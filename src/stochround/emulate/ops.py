"""Which ATen ops and dtypes an emulation rounds, and how: the op tables (`MATMUL_OPS`,
`PER_OP_OPS`), each op's schema read once (`OpKind`), and the format each floating dtype's
results take (`target_formats`, `cast_formats`); an op's outputs walked (`each_output`) and
the dtype its Python floats take (`scalar_dtype`); the ``ops`` argument checked
(`check_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

from ..formats import Format, format_of_dtype
from ..formats import format as find_format
from ..reference import check_choice
from ..torch_path import FLOAT_DTYPES
from .supported import plain

OPS = ("all", "matmul")
COMPUTES = ("native", "float64")
ACCUMULATES = ("once", "per_op")

aten = torch.ops.aten

# the ATen ops `ops="matmul"` rounds: the products, and the convolutions (forward and
# backward); `matmul`, `linear` and `conv2d` reach the dispatcher as these
MATMUL_OPS = frozenset(
    {
        aten.mm,
        aten.bmm,
        aten.addmm,
        aten.baddbmm,
        aten.addbmm,
        aten.mv,
        aten.addmv,
        aten.dot,
        aten.addr,
        aten._addmm_activation,
        aten.convolution,
        aten.convolution_backward,
        aten._convolution,
    }
)

# the overloads `accumulate="per_op"` computes with `stochround.arith`, every addition of the
# accumulation rounded (`stochround.emulate.per_op`)
PER_OP_OPS = frozenset(
    {
        aten.mm.default,
        aten.bmm.default,
        aten.mv.default,
        aten.dot.default,
        aten.addmm.default,
        aten.sum.default,
        aten.sum.dim_IntList,
        aten.mean.default,
        aten.mean.dim,
    }
)

# ops that accumulate but that `accumulate="per_op"` cannot compute per operation: it
# raises for them (and for the other overloads of `PER_OP_OPS`' packets) rather than
# rounding their result once
_ACCUMULATING = frozenset(
    {
        aten.baddbmm,
        aten.addbmm,
        aten.addmv,
        aten._addmm_activation,
        aten.convolution,
        aten.convolution_backward,
        aten._convolution,
        aten.cumsum,
        aten.cumprod,
        aten.prod,
        aten.nansum,
        aten.var,
        aten.std,
        aten.var_mean,
        aten.std_mean,
        aten.norm,
        aten.linalg_vector_norm,
        aten.logsumexp,
        aten.trace,
        aten._softmax,
        aten._log_softmax,
        aten.native_layer_norm,
        aten.native_batch_norm,
    }
)
_PER_OP_PACKETS = frozenset(op.overloadpacket for op in PER_OP_OPS)

# ops whose outputs hold no computed values (uninitialized memory, storage changes)
_NO_VALUES = frozenset(
    {
        aten.empty,
        aten.empty_like,
        aten.empty_strided,
        aten.new_empty,
        aten.new_empty_strided,
        aten.resize_,
        aten.resize_as_,
        aten.set_,
    }
)


# ops that only lay values out or fill a constant: copies (and the ``*_copy`` forms of
# views), concatenations, gathers, scatters of one tensor into another, paddings, the
# constant factories. They compute no value: like views they are not rounded (their output
# holds the format's values where their inputs do), as a Python scalar or `torch.tensor`
# is not. A conversion between dtypes (`converts`) is the exception: it rounds.
LAYOUT_OPS = frozenset(
    {
        aten.clone,
        aten.contiguous,
        aten._unsafe_view,
        aten._reshape_copy,
        aten.lift_fresh_copy,
        aten.copy,
        aten.copy_,
        aten._to_copy,
        aten.alias_copy,
        aten.view_copy,
        aten.expand_copy,
        aten.permute_copy,
        aten.t_copy,
        aten.transpose_copy,
        aten.unsqueeze_copy,
        aten.squeeze_copy,
        aten.slice_copy,
        aten.select_copy,
        aten.narrow_copy,
        aten.diagonal_copy,
        aten.as_strided_copy,
        aten.unfold_copy,
        aten.split_copy,
        aten.split_with_sizes_copy,
        aten.unbind_copy,
        aten.slice_scatter,
        aten.select_scatter,
        aten.diagonal_scatter,
        aten.as_strided_scatter,
        aten.cat,
        aten.stack,
        aten.index_select,
        aten.gather,
        aten.index,
        aten.flip,
        aten.roll,
        aten.repeat,
        aten.constant_pad_nd,
        aten.zeros,
        aten.ones,
        aten.full,
        aten.scalar_tensor,
        aten.zeros_like,
        aten.ones_like,
        aten.full_like,
        aten.new_zeros,
        aten.new_ones,
        aten.new_full,
        aten.fill,
        aten.fill_,
        aten.zero_,
    }
)

# ops that return an input, or views of one, though their schema says their outputs are
# their own (PyTorch's schema check exempts them): their outputs are never written in place
_UNANNOTATED_ALIASES = frozenset(
    {aten.lift, aten._unsafe_view, aten.unsafe_split, aten.unsafe_split_with_sizes}
)

# the layout ops that convert when their source's dtype is not their output's
_CONVERTING = frozenset({aten._to_copy, aten.copy, aten.copy_})


def converts(
    func: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]
) -> bool:
    """Whether ``func`` with these arguments converts a floating tensor into another dtype
    (``x.to(dtype)``: ``_to_copy``; ``dst.copy_(src)``, ``copy``): the one case of a layout
    op that an emulation rounds (its source, once, to the destination's format)."""
    if func.overloadpacket not in _CONVERTING or not args:
        return False
    source = args[0] if func.overloadpacket is aten._to_copy else args[1] if len(args) > 1 else None
    if not isinstance(source, torch.Tensor) or not source.is_floating_point():
        return False
    if func.overloadpacket is aten._to_copy:
        dtype = kwargs.get("dtype")
        return dtype is not None and dtype != source.dtype
    destination = args[0]
    return isinstance(destination, torch.Tensor) and destination.dtype != source.dtype


def check_ops(ops: object) -> str | Callable[[torch._ops.OpOverload], bool]:
    """``ops``, checked: one of `OPS` or a callable (ValueError/TypeError naming it)."""
    if callable(ops):
        return ops
    if not isinstance(ops, str):
        raise TypeError(f"ops must be one of {OPS} or a callable(func) -> bool; got {ops!r}")
    return check_choice("ops", ops, OPS)


FormatSpec = Format | str | torch.dtype


class OpKind:
    """What an op's schema says about it, read once per op: whether it only aliases its
    inputs (views, in-place metadata ops) or holds no values, whether it only lays values
    out (`LAYOUT_OPS`), which arguments it mutates (their positions and names; whether
    that is its first argument alone, one tensor: ``mutates_self``; which it also returns,
    alone: ``returns_self``), which
    positional arguments may hold a list of tensors (``tensor_lists``: every other argument
    is one tensor, a scalar or None, so a check of its tensors needs no walk), whether any
    of its outputs may be a tensor (``returns_tensors``), and whether
    the new tensors it returns are its own (``owns_outputs``: no input's alias, which the
    schema of a few ops does not declare, `_UNANNOTATED_ALIASES`; an emulation may round
    them in place)."""

    __slots__ = (
        "aliases_only",
        "lays_out",
        "mutated_names",
        "mutated_positions",
        "mutates_self",
        "owns_outputs",
        "returns_self",
        "returns_tensors",
        "seeded",
        "tensor_lists",
    )

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        returns_alias = any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        self.aliases_only = (
            returns_alias
            or torch.Tag.inplace_view in func.tags
            or func.overloadpacket in _NO_VALUES
        )
        self.lays_out = func.overloadpacket in LAYOUT_OPS
        self.owns_outputs = func.overloadpacket not in _UNANNOTATED_ALIASES
        mutated = [
            (index, argument.name)
            for index, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        ]
        self.mutated_positions = tuple(index for index, _ in mutated)
        self.mutated_names = tuple(name for _, name in mutated)
        # the common in-place op (``x.add_(y)``): it mutates its first argument, one tensor
        self.mutates_self = self.mutated_positions == (0,) and isinstance(
            schema.arguments[0].type, torch.TensorType
        )
        # ... and returns it, alone (``Tensor(a!)``): its output is an argument
        returned = schema.returns[0].alias_info if len(schema.returns) == 1 else None
        first = schema.arguments[0].alias_info if self.mutates_self else None
        self.returns_self = (
            returned is not None
            and first is not None
            and returned.is_write
            and returned.before_set == first.before_set
        )
        # whether any output may be a tensor (``Tensor``, ``Tensor[]``, ``Tensor?``, ...): an
        # op returning none (a profiler's record, a Python number) has nothing to round
        self.returns_tensors = any("Tensor" in str(r.type) for r in schema.returns)
        # random ops draw from torch's generator: computed once, natively (compute="float64")
        self.seeded = torch.Tag.nondeterministic_seeded in func.tags
        self.tensor_lists = tuple(
            index
            for index, argument in enumerate(schema.arguments)
            if not argument.kwarg_only and _holds_tensor_list(argument.type)
        )


def _holds_tensor_list(kind: torch._C.JitType) -> bool:
    """Whether an argument of this schema type may be a list of tensors (``Tensor[]``,
    ``Tensor?[]``, optional or not)."""
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, torch.ListType) and "Tensor" in str(kind.getElementType())


_KINDS: dict[torch._ops.OpOverload, OpKind] = {}


def op_kind(func: torch._ops.OpOverload) -> OpKind:
    """`OpKind` of ``func``, read once per op."""
    kind = _KINDS.get(func)
    if kind is None:
        kind = _KINDS[func] = OpKind(func)
    return kind


def target_formats(fmt: FormatSpec | Mapping[torch.dtype, FormatSpec]) -> dict[torch.dtype, Format]:
    """The format each floating dtype's results are rounded to: for one format, every dtype
    of `FLOAT_DTYPES` that holds it exactly (`Format.fits_in`); for a dict, its entries,
    each checked to hold its format (ValueError/TypeError naming ``fmt`` otherwise)."""
    if isinstance(fmt, Mapping):
        targets = {}
        for dtype, spec in fmt.items():
            if dtype not in FLOAT_DTYPES:
                allowed = ", ".join(map(str, FLOAT_DTYPES))
                raise TypeError(f"fmt's keys must be floating dtypes ({allowed}); got {dtype!r}")
            target = find_format(spec)
            if not target.fits_in(format_of_dtype(dtype)):
                raise ValueError(
                    f"fmt maps {dtype} to {target.name}, whose values {dtype} cannot hold"
                )
            targets[dtype] = target
        if not targets:
            raise ValueError("fmt must map at least one floating dtype to a format")
        return targets
    target = find_format(fmt)
    targets = {dtype: target for dtype in FLOAT_DTYPES if target.fits_in(format_of_dtype(dtype))}
    if not targets:
        raise ValueError(
            f"fmt {target.name} fits in no floating dtype "
            f"({', '.join(map(str, FLOAT_DTYPES))}): no result could hold its values"
        )
    return targets


# the 8-bit float dtypes torch has: their tensors are not rounded (`stochround.round` takes
# none), but a conversion into one rounds its source to the emulated format (`Emulation`)
FLOAT8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def cast_formats(fmt: FormatSpec | Mapping[torch.dtype, FormatSpec]) -> dict[torch.dtype, Format]:
    """The format a conversion into each 8-bit float dtype rounds its source to: for one
    format, every dtype of `FLOAT8_DTYPES` that holds it exactly; for a dict, none (its
    keys are `FLOAT_DTYPES`)."""
    if isinstance(fmt, Mapping):
        return {}
    target = find_format(fmt)
    return {dtype: target for dtype in FLOAT8_DTYPES if target.fits_in(format_of_dtype(dtype))}


def cannot_compute_per_op(func: torch._ops.OpOverload) -> bool:
    """Whether ``accumulate="per_op"`` refuses ``func``: an op that accumulates but is not
    one of `PER_OP_OPS` (another overload of theirs included), rather than rounding its
    result once."""
    return func not in PER_OP_OPS and (
        func.overloadpacket in _ACCUMULATING or func.overloadpacket in _PER_OP_PACKETS
    )


def each_output(function: Callable[[Tensor], Tensor], out: Any) -> Any:
    """``function`` applied to each tensor of an op's output: a tensor, or a tuple or list
    of tensors and other values (the shapes an ATen op returns)."""
    if isinstance(out, Tensor):
        return function(out)
    if isinstance(out, list):
        return [each_output(function, value) for value in out]
    if isinstance(out, tuple):
        return tuple(each_output(function, value) for value in out)
    return out


def apart(out: Any) -> bool:
    """Whether an op's output tensors (`each_output`'s) are all plain (`plain`) and
    contiguous and lie in pairwise disjoint memory: each rounded where it lies then writes
    no other's bytes, and the roundings in turn give the bits that rounding each into a new
    tensor gives.  (A schema does not say whether an op's several outputs share memory.)"""
    tensors: list[Tensor] = []

    def listed(t: Tensor) -> Tensor:
        tensors.append(t)
        return t

    each_output(listed, out)
    if not all(plain(t) and t.is_contiguous() for t in tensors):
        return False
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel()
    )
    return all(end <= start for (_, end), (start, _) in pairwise(spans))


def scalar_dtype(floating: list[Tensor]) -> torch.dtype | None:
    """The dtype a Python float takes in a native op on these tensors: their promoted
    floating dtype's opmath type (float32 for bf16, fp16 and fp32, where PyTorch's CPU and
    CUDA kernels compute; float64 for float64); None where no floating tensor is given."""
    if not floating:
        return None
    promoted = floating[0].dtype
    for t in floating[1:]:
        promoted = torch.promote_types(promoted, t.dtype)
    return torch.float64 if promoted == torch.float64 else torch.float32


__all__ = [
    "ACCUMULATES",
    "COMPUTES",
    "LAYOUT_OPS",
    "MATMUL_OPS",
    "OPS",
    "PER_OP_OPS",
    "FormatSpec",
    "OpKind",
    "apart",
    "aten",
    "cannot_compute_per_op",
    "cast_formats",
    "check_ops",
    "converts",
    "each_output",
    "op_kind",
    "scalar_dtype",
    "target_formats",
]
