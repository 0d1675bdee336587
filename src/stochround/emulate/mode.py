"""Unmodified PyTorch code run in any format and rounding mode: a `TorchDispatchMode` that
rounds the floating outputs of every ATen operation.

Under ``with emulate(fmt, mode):`` each ATen op runs as usual and then every floating
output tensor whose dtype has a target format is rounded, ``y <- round(op(x), fmt, mode,
seed=key, offset=k)`` with `stochround.rounding.round`, ``key = stream_key(seed,
StreamDomain.EMULATE)`` (`stochround.random`: the emulations' own domain, so a rounding
call, an optimizer or a recipe given the same seed draws other words) and k the
emulation's counter, one step per rounded tensor: the program runs as on a machine whose
every operation delivers values of ``fmt``, and a run is a pure function of its seed.
The op's result keeps its dtype (an fp32 tensor holds bf16 values), so the program itself
needs no change.

Which outputs are rounded: those of dtypes in `stochround.torch_path.FLOAT_DTYPES` that
hold the target format exactly; integer and bool outputs never.  Views and other alias
ops (``view``, ``t``, ``transpose``, ``detach``, ``expand``, ...) and in-place metadata
ops compute nothing and are not rounded, so aliasing is kept; an in-place op (``add_``,
``out=`` forms) rounds the tensor it mutates, in place.  Ops that produce no values
(``empty``, ``resize_``, ``set_``) are not rounded either.  A conversion (``x.to(dtype)``,
``copy_``) rounds its source with the mode before converting, so that SR is not lost to
the conversion's own round-to-nearest (`emulate`).

Accumulation: under ``accumulate="once"`` a matmul or a sum is rounded once, like any op;
under ``accumulate="per_op"`` the ops of `PER_OP_OPS` are computed by `stochround.arith`,
every product and addition rounded, with offsets k, k + 1, ... from the same counter, and
the accumulating ops it cannot compute raise ValueError naming the op (`emulate`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .. import arith, rounding
from .. import random as streams
from ..formats import Format, format_of_dtype
from ..formats import format as find_format
from ..presets import HardwarePreset
from ..reference import check_choice, check_mode
from ..torch_path import FLOAT_DTYPES

__all__ = ["ACCUMULATES", "COMPUTES", "FLOAT8_DTYPES", "MATMUL_OPS", "OPS", "PER_OP_OPS"]
__all__ += ["Emulation", "emulate"]

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
# accumulation rounded (`Emulation._per_op`)
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

FormatSpec = Format | str | torch.dtype
Observer = Callable[[torch._ops.OpOverload, Any], None]

# Set while an emulation's handler runs, in the thread that runs it: the ops it dispatches
# (the op itself, the rounding's own arithmetic) pass through every enclosing emulation, so
# the innermost emulation alone rounds an op and no rounding is rounded again.
_handling = threading.local()


class _OpKind:
    """What an op's schema says about it, read once per op: whether it only aliases its
    inputs (views, in-place metadata ops) or holds no values, and which arguments it
    mutates (their positions and names)."""

    __slots__ = ("aliases_only", "mutated_names", "mutated_positions", "seeded")

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
        mutated = [
            (index, argument.name)
            for index, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        ]
        self.mutated_positions = tuple(index for index, _ in mutated)
        self.mutated_names = tuple(name for _, name in mutated)
        # random ops draw from torch's generator: computed once, natively (compute="float64")
        self.seeded = torch.Tag.nondeterministic_seeded in func.tags


_KINDS: dict[torch._ops.OpOverload, _OpKind] = {}


def _kind(func: torch._ops.OpOverload) -> _OpKind:
    kind = _KINDS.get(func)
    if kind is None:
        kind = _KINDS[func] = _OpKind(func)
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
# none), but a conversion into one rounds its source to the emulated format (`_cast`)
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


def check_ops(ops: object) -> str | Callable[[torch._ops.OpOverload], bool]:
    """``ops``, checked: one of `OPS` or a callable (ValueError/TypeError naming it)."""
    if callable(ops):
        return ops
    if not isinstance(ops, str):
        raise TypeError(f"ops must be one of {OPS} or a callable(func) -> bool; got {ops!r}")
    return check_choice("ops", ops, OPS)


def _tensors(values: Iterable[object]) -> Iterator[Tensor]:
    """The tensors among an ATen op's arguments or outputs: its schema admits tensors,
    lists and tuples of them (optional ones: None) and scalars, never a dict, so a walk of
    the lists and tuples finds them all (a general pytree walk costs every op's dispatch
    more than the op itself)."""
    for value in values:
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from _tensors(value)


def _each_output(function: Callable[[Tensor], Tensor], out: Any) -> Any:
    """``function`` applied to each tensor of an op's output: a tensor, or a tuple or list
    of tensors and other values (the shapes an ATen op returns)."""
    if isinstance(out, Tensor):
        return function(out)
    if isinstance(out, list):
        return [_each_output(function, value) for value in out]
    if isinstance(out, tuple):
        return tuple(_each_output(function, value) for value in out)
    return out


def _unsupported(value: object) -> None:
    """TypeError for a complex or sparse (any non-strided) tensor: SR of their values is
    not defined here (complex) or would lose their structure (sparse)."""
    if isinstance(value, Tensor):
        if value.is_complex():
            raise TypeError(
                f"emulate does not support complex tensors (got {value.dtype}): round the "
                "real and imaginary parts as real tensors"
            )
        if value.layout != torch.strided:
            raise TypeError(
                f"emulate does not support {value.layout} tensors: only dense (strided) "
                "tensors can be rounded; pass x.to_dense()"
            )


class Emulation(TorchDispatchMode):
    """The dispatch mode `emulate` returns; ``with`` it, every floating ATen op's floating
    outputs are rounded (module docstring).  Arguments as `emulate` takes them, and
    ``observer``: None or a callable ``observer(func, outputs)`` called after each op
    that rounded an output, with the ATen op and its (rounded) result.

    ``calls``: the tensors rounded so far, which is also the counter: the next rounding
    draws its random words at offset ``calls`` of the stream ``key`` (``seed`` in
    `StreamDomain.EMULATE`: `stochround.random.stream_key`).
    """

    def __init__(
        self,
        fmt: FormatSpec | Mapping[torch.dtype, FormatSpec],
        mode: str = "rne",
        *,
        seed: int | None = None,
        ops: str | Callable[[torch._ops.OpOverload], bool] = "all",
        rbits: int | None = None,
        variant: str = "c",
        hardware: str | HardwarePreset | None = None,
        round_inputs: bool = False,
        compute: str = "native",
        accumulate: str = "once",
        observer: Observer | None = None,
    ) -> None:
        super().__init__()
        self.formats = target_formats(fmt)
        self.cast_formats = cast_formats(fmt)
        self.mode = check_mode(mode)
        self.ops = check_ops(ops)
        self.compute = check_choice("compute", compute, COMPUTES)
        self.accumulate = check_choice("accumulate", accumulate, ACCUMULATES)
        if self.accumulate == "per_op" and hardware is not None:
            raise ValueError(
                "accumulate='per_op' rounds with stochround.arith, which takes no hardware "
                f"preset; got hardware={hardware!r}: pass accumulate='once' or hardware=None"
            )
        if not isinstance(round_inputs, bool):
            raise TypeError(f"round_inputs must be a bool; got {round_inputs!r}")
        if observer is not None and not callable(observer):
            raise TypeError(f"observer must be None or a callable; got {observer!r}")
        self.round_inputs, self.observer = round_inputs, observer
        self.rbits, self.variant, self.hardware = rbits, variant, hardware
        self.seed = (
            streams.default_seed() if seed is None else int(streams.check_seed(seed, "seed"))
        )
        self.key = int(streams.stream_key(self.seed, streams.StreamDomain.EMULATE))
        self.calls = 0
        # the rounding's own checks (rbits, variant, hardware against the mode and format)
        # raise here, not at the first op
        self._unhandled(self._probe)

    def _probe(self) -> None:
        for dtype, target in self.formats.items():
            self._rounded(torch.zeros(1, dtype=dtype), target, offset=0)

    def _unhandled(self, body: Callable[[], Any]) -> Any:
        """body() with the enclosing emulations passed through (`_handling`)."""
        outer = getattr(_handling, "active", False)
        _handling.active = True
        try:
            return body()
        finally:
            _handling.active = outer

    def _rounded(self, x: Tensor, target: Format, offset: int) -> Tensor:
        """x rounded to ``target`` (values in x's dtype) with the words of offset ``offset``."""
        return rounding.round(
            x,
            target,
            self.mode,
            rbits=self.rbits,
            variant=self.variant,
            seed=self.key,
            offset=offset,
            hardware=self.hardware,
        )

    def _selected(self, func: torch._ops.OpOverload) -> bool:
        if self.ops == "all":
            return True
        if self.ops == "matmul":
            return func.overloadpacket in MATMUL_OPS
        assert callable(self.ops)  # checked in __init__
        return bool(self.ops(func))

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(_handling, "active", False):  # an inner emulation's op or rounding
            return func(*args, **kwargs)
        for tensor in _tensors((args, kwargs.values())):
            _unsupported(tensor)
        kind = _kind(func)
        if kind.aliases_only or not self._selected(func):
            return func(*args, **kwargs)
        return self._unhandled(lambda: self._emulated(func, kind, args, kwargs))

    def _emulated(
        self,
        func: torch._ops.OpOverload,
        kind: _OpKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run the op as the emulation says and round its floating outputs."""
        if self.round_inputs:
            args, kwargs = self._inputs_rounded(kind, args, kwargs)
        before = self.calls
        cast = self._cast(func, args, kwargs)
        per_op = None
        if cast is None and self.accumulate == "per_op":
            per_op = self._per_op(func, args, kwargs)
        if cast is not None:
            out = cast
        elif per_op is not None:
            out = per_op
        elif self.compute == "float64" and not kind.seeded:
            out = self._wide(func, kind, args, kwargs)
        else:
            out = func(*args, **kwargs)
            for tensor in self._mutated(kind, args, kwargs):
                if tensor.dtype in self.formats:
                    tensor.copy_(self._next_rounding(tensor, self.formats[tensor.dtype]))
            if not kind.mutated_positions:
                out = _each_output(self._output_rounded, out)
        for tensor in _tensors((out,)):
            _unsupported(tensor)
        if self.observer is not None and self.calls > before:
            self.observer(func, out)
        return out

    def _cast(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor | None:
        """A conversion between floating dtypes (``x.to(dtype)``: ``_to_copy``; ``dst.copy_
        (src)``) into a dtype with a format, or None for any other op.  The source is rounded
        once to the destination's format (in float64, which holds both) and then converted,
        exactly: converting first would round to nearest in the destination dtype, and an
        SR or directed rounding after it would see its values already rounded."""
        if func is aten._to_copy.default:
            source = args[0]
            target = self._cast_format(kwargs.get("dtype") or source.dtype)
            if target is None or not source.is_floating_point():
                return None
            return func(self._next_rounding(source.to(torch.float64), target), **kwargs)
        if func is aten.copy_.default:
            destination, source = args[0], args[1]
            target = self._cast_format(destination.dtype)
            if target is None or not isinstance(source, Tensor) or not source.is_floating_point():
                return None
            rounded = self._next_rounding(source.to(torch.float64), target)
            return func(destination, rounded, *args[2:], **kwargs)
        return None

    def _per_op(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor | None:
        """accumulate="per_op": an op of `PER_OP_OPS` computed by `stochround.arith`, every
        product and every addition rounded to the format with the mode; None for an op that
        does not accumulate (rounded once, as under "once") or whose result has no format.
        ValueError naming the op for an accumulating op it cannot compute (`_ACCUMULATING`,
        the other overloads of `PER_OP_OPS`' ops)."""
        if func not in PER_OP_OPS:
            if func.overloadpacket in _ACCUMULATING or func.overloadpacket in _PER_OP_PACKETS:
                raise ValueError(
                    f"accumulate='per_op' cannot compute {func} per operation (it computes "
                    f"{', '.join(sorted(str(op) for op in PER_OP_OPS))}); run it under "
                    "accumulate='once' or leave it out with an ops filter"
                )
            return None
        first = args[0]
        dtype = kwargs.get("dtype") or first.dtype
        target = self.formats.get(dtype)
        if target is None:
            return None
        if func.overloadpacket in (aten.sum, aten.mean):
            return self._per_op_sum(func, first.to(dtype), args[1:], kwargs, target)
        return self._per_op_product(func, args, kwargs, target)

    def _arith_options(self, steps: int) -> dict[str, Any]:
        """The rounding options of an arith call that consumes ``steps`` offsets, starting
        at the counter, which it advances past them."""
        options = dict(rbits=self.rbits, variant=self.variant, seed=self.key, offset=self.calls)
        self.calls += steps
        return options

    def _per_op_sum(
        self,
        func: torch._ops.OpOverload,
        x: Tensor,
        rest: tuple[Any, ...],
        kwargs: dict[str, Any],
        target: Format,
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
        total = arith.sum(terms, target, self.mode, dim=-1, **self._arith_options(count))
        if func.overloadpacket is aten.mean:
            divisor = torch.full_like(total, float(count))
            total = arith.div(total, divisor, target, self.mode, **self._arith_options(1))
        if keepdim:
            shape = [1 if d in dims else size for d, size in enumerate(x.shape)]
            total = total.reshape(shape)
        return total

    def _per_op_product(
        self,
        func: torch._ops.OpOverload,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        target: Format,
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
            return arith.dot(a, b, target, self.mode, **self._arith_options(count + 1))
        if func is aten.mv.default:
            column = arith.matmul(
                a, b.unsqueeze(-1), target, self.mode, **self._arith_options(count + 1)
            )
            return column.squeeze(-1)
        out = arith.matmul(a, b, target, self.mode, **self._arith_options(count + 1))
        if bias is not None:
            out = arith.add(bias.detach(), out, target, self.mode, **self._arith_options(1))
        return out

    def _cast_format(self, dtype: torch.dtype) -> Format | None:
        """The format a conversion into ``dtype`` rounds to (None: none)."""
        target = self.formats.get(dtype)
        return self.cast_formats.get(dtype) if target is None else target

    def _output_rounded(self, out: Tensor) -> Tensor:
        """A fresh output rounded, if its dtype has a format: the rounding's own result where
        its strides are the output's (one pass: a dense output, the common case), else
        copied into the output (its strides kept: a transposed ``mm`` result, ...)."""
        if out.dtype not in self.formats:
            return out
        rounded = self._next_rounding(out, self.formats[out.dtype])
        if rounded.stride() == out.stride():
            return rounded
        return out.copy_(rounded)

    def _mutated(
        self, kind: _OpKind, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Tensor]:
        """The floating tensors an op mutates (its ``Tensor(a!)`` arguments)."""
        found = []
        for position, name in zip(kind.mutated_positions, kind.mutated_names, strict=True):
            value = args[position] if position < len(args) else kwargs.get(name)
            candidates = value if isinstance(value, list | tuple) else [value]
            found += [t for t in candidates if isinstance(t, Tensor) and t.is_floating_point()]
        return found

    def _inputs_rounded(
        self, kind: _OpKind, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The op's arguments with every floating tensor of a mapped dtype rounded: the
        mutated ones in place (the op overwrites them anyway), the others as copies (the
        caller's tensors are not changed)."""
        mutated = {id(t) for t in self._mutated(kind, args, kwargs)}

        def entered(t: Tensor) -> Tensor:
            if t.dtype not in self.formats:
                return t
            if id(t) in mutated:
                return t.copy_(self._next_rounding(t, self.formats[t.dtype]))
            return self._next_rounding(t, self.formats[t.dtype])

        return pytree.tree_map_only(Tensor, entered, (args, kwargs))

    def _wide(
        self,
        func: torch._ops.OpOverload,
        kind: _OpKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """compute="float64": the op on float64 copies of the floating inputs (Python
        floats as the op's arithmetic holds them, `_scalar_dtype`), each result rounded
        once and stored in the output the op gives natively (its dtype, shape, strides).
        An op that gives no output of a dtype with a format runs natively only."""
        mutated = self._mutated(kind, args, kwargs)
        if kind.mutated_positions:
            if not any(t.dtype in self.formats for t in mutated):
                return func(*args, **kwargs)
            native = None
        else:
            # the native run gives the outputs' dtypes (promotion, dtype= arguments) and
            # layout; the values of those with a format are replaced
            native = func(*args, **kwargs)
            outputs = pytree.tree_leaves(native)
            if not any(isinstance(t, Tensor) and t.dtype in self.formats for t in outputs):
                return native
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        floating = [t for t in tensors if t.dtype in FLOAT_DTYPES]
        scalar_dtype = _scalar_dtype(floating)
        wide_of = {id(t): t.to(torch.float64, copy=True) for t in floating}

        def widened(value: object) -> object:
            if isinstance(value, Tensor):
                return wide_of.get(id(value), value)
            if isinstance(value, float) and scalar_dtype is not None:
                return float(torch.tensor(value, dtype=scalar_dtype))
            return value

        wide_args, wide_kwargs = pytree.tree_map(widened, (args, kwargs))
        wide_out = func(*wide_args, **wide_kwargs)
        if native is None:  # an in-place or out= op: its mutated tensors take the results
            for tensor in mutated:
                result = wide_of[id(tensor)]
                if tensor.shape != result.shape:  # an out= tensor the op resized
                    tensor.resize_(result.shape)
                if tensor.dtype in self.formats:
                    result = self._next_rounding(result, self.formats[tensor.dtype])
                tensor.copy_(result)
            # what it returns: its mutated arguments (or nothing), the caller's tensors
            original_of = {id(wide_of[id(t)]): t for t in floating}
            return pytree.tree_map_only(Tensor, lambda t: original_of.get(id(t), t), wide_out)
        outs, spec = pytree.tree_flatten(native)
        for out, wide in zip(outs, pytree.tree_leaves(wide_out), strict=True):
            if isinstance(out, Tensor) and out.dtype in self.formats:
                out.copy_(self._next_rounding(wide, self.formats[out.dtype]))
        return pytree.tree_unflatten(outs, spec)

    def _next_rounding(self, x: Tensor, target: Format) -> Tensor:
        """x rounded to ``target`` with the next offset of the counter: a new tensor of x's
        dtype (float64 for a result computed wide, which holds every format until stored)."""
        offset = self.calls
        self.calls += 1
        return self._rounded(x.detach(), target, offset)


def _scalar_dtype(floating: list[Tensor]) -> torch.dtype | None:
    """The dtype a Python float takes in a native op on these tensors: their promoted
    floating dtype's opmath type (float32 for bf16, fp16 and fp32, where PyTorch's CPU and
    CUDA kernels compute; float64 for float64); None where no floating tensor is given."""
    if not floating:
        return None
    promoted = floating[0].dtype
    for t in floating[1:]:
        promoted = torch.promote_types(promoted, t.dtype)
    return torch.float64 if promoted == torch.float64 else torch.float32


def emulate(
    fmt: FormatSpec | Mapping[torch.dtype, FormatSpec],
    mode: str = "rne",
    *,
    seed: int | None = None,
    ops: str | Callable[[torch._ops.OpOverload], bool] = "all",
    rbits: int | None = None,
    variant: str = "c",
    hardware: str | HardwarePreset | None = None,
    round_inputs: bool = False,
    compute: str = "native",
    accumulate: str = "once",
) -> Emulation:
    """A dispatch mode under which unmodified PyTorch code computes in ``fmt`` with ``mode``:
    ``with emulate("bfloat16", "sr", seed=0): y = model(x)``.

    Every floating output y of an ATen op whose dtype holds the target format becomes
    ``round(y, fmt, mode, rbits=rbits, variant=variant, hardware=hardware, seed=key,
    offset=k)`` (`stochround.rounding.round`), ``key = stream_key(seed,
    StreamDomain.EMULATE)`` (`stochround.random`), k = 0, 1, 2, ... counting the rounded
    tensors (`Emulation.calls`), so a run is reproducible from its seed and every
    rounding draws fresh words.  Forward and backward alike: autograd's backward ops run
    under the mode when ``backward()`` is called inside the block.

    ``fmt``: a format name, `Format` or torch dtype, applied to the results of every
    floating dtype that holds it exactly (``"bfloat16"``: fp32 and fp64 results, and bf16
    ones, where it is the identity under ``compute="native"``: a bf16 op has rounded to
    nearest already, so bf16 code gets SR from ``compute="float64"`` only), or a dict
    ``{torch dtype: format}`` (``{torch.float32: "bfloat16", torch.float64: "float32"}``).
    ``mode``: one of `stochround.reference.MODES`.  ``seed``: the stream's seed, an int in
    [0, 2**64); None draws one from torch's default generator once, here.  ``ops``:
    ``"all"``, ``"matmul"`` (the products and convolutions, `MATMUL_OPS`) or a callable
    ``ops(func) -> bool`` of the ATen `OpOverload`; ops it leaves out run unrounded and
    draw nothing.  ``rbits``, ``variant``, ``hardware``: as `stochround.rounding.round`
    takes them (``hardware`` fixes the bits and variant, and the mode but for "rne" or
    "sr").  ``round_inputs``: round the op's floating tensor arguments too before it runs
    (copies; in place for the tensors it mutates), each a rounding of its own.

    ``compute``: ``"native"``: the op runs in its tensors' dtype, and its result (already
    rounded to that dtype by the op) is rounded again to ``fmt`` — a double rounding,
    which can differ from one rounding of the exact result when the dtype is close to
    ``fmt`` (fp32 results to bf16 under rne: where fp32's rounding lands on a bf16 tie).
    ``"float64"``: the op runs on float64 copies of its floating inputs (a Python float as
    the native op would use it: float32 for 16- and 32-bit tensors) and its result is
    rounded once: exact for products of fp32 values and for sums whose exponents differ
    by at most 29 (53 bits hold them), and correctly rounded under rne for + - * / sqrt of
    fp32 inputs (53 >= 2 p + 2 for p <= 24: the double rounding is innocuous).  Random ops
    (``normal_``, ``dropout``) compute natively in both.  Under ``"float64"`` a functional
    op runs natively too, for its outputs' dtypes and layout: twice the work.

    ``accumulate``: ``"once"``: a matmul or reduction is an op like the others, its result
    rounded once.  ``"per_op"``: the ops of `PER_OP_OPS` (mm, bmm, mv, dot, addmm with
    beta = alpha = 1, sum, mean; ``matmul`` and ``linear`` reach the dispatcher as these)
    are computed by `stochround.arith` as a machine with that arithmetic computes them:
    each product rounded to the format (`arith.matmul`, `arith.dot`), the K products summed
    in recursive order, every addition rounded (`arith.sum`), with the emulation's seed and
    offsets from its counter k: a matmul of inner size K takes k (products) and
    k + 1 .. k + K (the additions), addmm's bias addition k + K + 1; a sum of n terms
    (the reduced dims moved last and flattened row-major) takes k .. k + n - 1, and mean's
    division by n the next offset, k + n.  The counter advances past every offset used.
    Memory: M N K doubles per matmul (`arith.matmul`), for small problems.  Such ops
    ignore ``compute`` (arith computes exactly); the elementwise ops round once as under
    "once" (one op, one rounding).  Ops that accumulate and that it cannot compute
    (``baddbmm``, ``addmv``, convolutions, ``cumsum``, ``prod``, ``var``, ``softmax``,
    ``layer_norm``, the ``out=`` overloads of the ops above, ...) raise ValueError naming
    the op: nothing falls back to "once".  It takes no ``hardware``.

    Conversions into a dtype with a format (``x.to(dtype)``, ``dst.copy_(src)`` from a
    floating source; with one ``fmt``, also into the 8-bit float dtypes that hold it,
    `FLOAT8_DTYPES`) round the source once to that format with the mode and then convert,
    exactly (a native conversion would round to nearest first), under both computes.
    Views, in-place metadata ops and ``empty``-like ops are not rounded; in-place ops round
    their mutated tensor in place; integer and bool outputs, and 8-bit float outputs of
    other ops, are left as they are.  Complex and sparse (non-strided) tensors raise
    TypeError.  Nested emulations: the innermost one rounds, the enclosing ones pass its
    ops through until it exits.

    ``torch.compile`` inside an emulation works, and compiles nothing: Dynamo does not
    compile a frame while a dispatch mode is active, so a compiled function (compiled
    before the block or first called in it) runs eagerly, op by op, every op rounded: the
    same bits as the plain function under the same emulation, with no speed-up.  An
    emulation entered inside a compiled function runs the same way (Dynamo warns that it
    cannot trace the mode's entry).  A custom op (``torch.library``) is one op here: its
    outputs are rounded, its body runs unemulated.

    stochround's own functions called inside an emulation dispatch their ATen ops too, and
    those are rounded: call `stochround.round` outside the block.
    """
    return Emulation(
        fmt,
        mode,
        seed=seed,
        ops=ops,
        rbits=rbits,
        variant=variant,
        hardware=hardware,
        round_inputs=round_inputs,
        compute=compute,
        accumulate=accumulate,
    )
