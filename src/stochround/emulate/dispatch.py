"""`Emulation`, the `TorchDispatchMode` that runs each ATen op as the emulation says and
rounds its floating outputs (the emulation guide, docs/guide/emulate.md, states what is
rounded, with which offsets, and why).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .. import random as streams
from ..formats import Format, format_of_dtype
from ..kernels.availability import on_kernel_device
from ..presets import HardwarePreset
from ..reference import check_choice, check_mode
from ..rounding.prepared import PreparedRounding, prepare
from ..torch_path import FLOAT_DTYPES
from .exact import EXACT_OPS, exact_pair, sr_pair
from .ops import (
    ACCUMULATES,
    COMPUTES,
    MATMUL_OPS,
    FormatSpec,
    OpKind,
    apart,
    aten,
    cast_formats,
    check_ops,
    converts,
    each_output,
    op_kind,
    scalar_dtype,
    target_formats,
)
from .per_op import per_op_result
from .supported import check_supported, plain, raise_unsupported
from .torch_hooks import op_caller, skip_dynamo

# (a layout is one object, read by identity in `__torch_dispatch__`'s argument check)
_STRIDED = torch.strided
_UNSEEN = object()  # (a dtype and device whose in-place rounding is not yet looked up)
# a prepared rounding in place: ``rounding(x, offset)`` (`PreparedRounding.in_place_rounding`)
_InPlace = Callable[[Tensor, int], None]
_Observer = Callable[[torch._ops.OpOverload, Any], None]


# Set while an emulation's handler runs, in the thread that runs it: the ops it dispatches
# (the op itself, the rounding's own arithmetic) pass through every enclosing emulation, so
# the innermost emulation alone rounds an op and no rounding is rounded again.
class _Handling(threading.local):
    """Whether an emulation's handler runs in this thread (False in each new thread)."""

    active = False


_handling = _Handling()


class _Entry:
    """What an emulation does with one op overload, resolved at its first call: its
    `OpKind`, what calls it (``call``: `op_caller`), whether it handles it (``handled``: it
    computes values and ``ops`` picks it), and whether it runs it plainly (``plain``:
    natively, its outputs or mutated arguments rounded (`Emulation._native`); no
    conversion, no rounded inputs, no per-operation accumulation, no float64 computation,
    no observer), the path most ops take; ``fresh``: a plain op that mutates nothing (its
    outputs are new tensors, `Emulation._fresh`; else `Emulation._mutating`: ``run`` names
    the one); ``passes``: an op called as it is, its arguments checked and nothing else (one
    not handled: views, ops the filter leaves out; or a fresh op whose schema returns no
    tensor, such as a profiler's record or ``x.item()``: nothing to round); ``owned``: its
    outputs are its own (`OpKind.owns_outputs`), which a fresh op may round in place.  Each
    call then reads only what depends on its tensors."""

    __slots__ = (
        "call",
        "fresh",
        "handled",
        "kind",
        "owned",
        "passes",
        "plain",
        "run",
        "tensor_lists",
    )

    def __init__(self, func: torch._ops.OpOverload, kind: OpKind, handled: bool, plain: bool):
        self.kind, self.handled, self.plain, self.call = kind, handled, plain, op_caller(func)
        self.fresh, self.tensor_lists = plain and not kind.mutated_positions, kind.tensor_lists
        self.owned = kind.owns_outputs
        self.passes = not handled or (self.fresh and not kind.returns_tensors)
        self.run = Emulation._fresh if self.fresh else Emulation._mutating


@skip_dynamo
class Emulation(TorchDispatchMode):
    """The dispatch mode `emulate` returns; ``with`` it, every floating ATen op's floating
    outputs are rounded (`emulate`).  Arguments as `emulate` takes them, and
    ``observer``: None or a callable ``observer(func, outputs)`` called after each op
    that rounded an output, with the ATen op and its (rounded) result.  Two options of
    Monte Carlo arithmetic (`stochround.emulate.mca`): ``round_outputs=False`` leaves the
    outputs unrounded (only the inputs, with ``round_inputs``: precision bounding), and
    ``residuals=True`` (with ``compute="float64"`` and mode "sr") rounds the ops
    `stochround.emulate.exact` covers from their exact result ``hi + lo`` (`sr_pair`), so
    that a float64 op's residual below its 53 bits is seen; ``no_residual`` then collects
    the float64 ops rounded at 53 bits that it does not cover (their results unperturbed).

    ``calls``: the tensors rounded so far, which is also the counter: the next rounding
    draws its random words at offset ``calls`` of the stream ``key`` (``seed`` in
    `StreamDomain.EMULATE`: `stochround.random.stream_key`).  What can be is resolved
    once: every argument is checked here, each format's rounding prepared here
    (``roundings``: `stochround.rounding.prepared`), each op overload's handling read at
    its first call (``ops`` asked then).
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
        observer: _Observer | None = None,
        round_outputs: bool = True,
        residuals: bool = False,
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
        for name, flag in (("round_outputs", round_outputs), ("residuals", residuals)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool; got {flag!r}")
        if residuals and (self.compute != "float64" or self.mode != "sr"):
            raise ValueError(
                "residuals=True rounds each op's exact result stochastically: it needs "
                f"compute='float64' and mode='sr'; got compute={compute!r}, mode={mode!r}"
            )
        self.round_outputs, self.residuals = round_outputs, residuals
        self.no_residual: set[str] = set()
        self.rbits, self.variant, self.hardware = rbits, variant, hardware
        self.seed = (
            streams.default_seed() if seed is None else int(streams.check_seed(seed, "seed"))
        )
        self.key = int(streams.stream_key(self.seed, streams.StreamDomain.EMULATE))
        self.calls = 0
        # each format's rounding, its choices (rbits, variant, hardware against the mode and
        # format) checked here, not at the first op, and resolved once: an op's rounding
        # calls it directly, without `stochround.round`'s per-call checks and routing
        prepared = {
            target: prepare(
                target, self.mode, seed=self.key, rbits=rbits, variant=variant, hardware=hardware
            )
            for target in (*self.formats.values(), *self.cast_formats.values())
        }
        self.roundings = {dtype: prepared[target] for dtype, target in self.formats.items()}
        self.cast_roundings = {
            dtype: prepared[target] for dtype, target in self.cast_formats.items()
        }
        # what each op overload gets, read once per op (`_op_entry`)
        self._entries: dict[torch._ops.OpOverload, _Entry] = {}
        # the same, by the op's id (an op overload hashes in Python; ``_entries`` keeps
        # each op alive, so that its id is not reused)
        self._entry_ids: dict[int, _Entry] = {}
        # each format's in-place rounding (`PreparedRounding.in_place_rounding`; None: it has
        # none) of a tensor off and on a kernel device, found at the first of each
        self.in_place: dict[torch.dtype, list[Any]] = {
            dtype: [_UNSEEN, _UNSEEN] for dtype in self.roundings
        }

    def _op_entry(self, func: torch._ops.OpOverload) -> _Entry:
        """``func``'s `_Entry`, resolved at its first call (``ops`` asked once an op)."""
        kind = op_kind(func)
        handled = not kind.aliases_only and self.selected(func)
        plain = (
            handled
            and not kind.lays_out
            and not self.round_inputs
            and self.round_outputs
            and self.accumulate == "once"
            and (self.compute == "native" or kind.seeded)
            and self.observer is None
        )
        return _Entry(func, kind, handled, plain)

    def selected(self, func: torch._ops.OpOverload) -> bool:
        """Whether ``ops`` picks ``func`` for rounding."""
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
        if _handling.active:  # an inner emulation's op or rounding
            return func(*args, **kwargs) if kwargs else func(*args)
        entry = self._entry_ids.get(id(func))
        if entry is None:
            entry = self._entries[func] = self._entry_ids[id(func)] = self._op_entry(func)
        # the arguments checked (`check_supported`), written out here: the check runs on
        # every op, views and factories included, so a tensor argument is checked without
        # a walk, and only the schema's list positions are walked
        for value in args:
            if isinstance(value, Tensor) and (
                value.layout is not _STRIDED or value.dtype.is_complex
            ):
                raise_unsupported(value)
        for position in entry.tensor_lists:  # (those that may hold a list of tensors)
            if position < len(args):
                check_supported((args[position],))
        if kwargs:
            check_supported(kwargs.values())
            if entry.passes:  # (views; ops the filter leaves out; no tensor returned)
                return entry.call(*args, **kwargs)
        elif entry.passes:
            return entry.call(*args)
        else:
            kwargs = {}
        if entry.plain:
            _handling.active = True
            try:
                return entry.run(self, entry, args, kwargs)
            finally:
                _handling.active = False
        kind = entry.kind
        if kind.lays_out and not converts(func, args, kwargs):
            out = func(*args, **kwargs)  # a factory makes complex tensors from nothing
            check_supported((out,))
            return out
        # the enclosing emulations pass this op's own ops and its roundings through
        _handling.active = True
        try:
            return self._emulated(func, kind, args, kwargs)
        finally:
            _handling.active = False

    def _fresh(self, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op of a fresh entry (`_Entry`): what `_emulated` does for it (`_native`, its
        outputs rounded, then checked), with one output tensor, the common case, rounded
        without a walk, and in place where the op owns it (`OpKind.owns_outputs`) and the
        rounding can write it (`PreparedRounding.round_in_place`: a contiguous output on
        the kernels' route).  Several outputs are rounded in place where they lie apart
        (`apart`), else each into a new tensor: a schema does not say whether they share
        memory, where rounding one in place would change another before its rounding."""
        out = entry.call(*args, **kwargs) if kwargs else entry.call(*args)
        if not isinstance(out, Tensor):
            owned = entry.owned and apart(out)
            out = each_output(self._owned_output_rounded if owned else self._output_rounded, out)
            check_supported((out,))
            return out
        dtype = out.dtype
        prepared = self.roundings.get(dtype)
        if prepared is None:
            if out.layout is not _STRIDED or dtype.is_complex:
                raise_unsupported(out)
            return out
        if entry.owned and plain(out) and out.is_contiguous():
            return self._owned_rounded(out, prepared)
        return self._fresh_rounded(out, prepared)

    def _rounded_in_place(self, x: Tensor) -> bool:
        """x (plain and contiguous, of a dtype with a format) rounded where it lies with the
        emulation's next rounding, where its in-place rounding can write it: True; else
        False, x untouched."""
        rounding = self._in_place_rounding(x, x.dtype)
        if rounding is None:
            return False
        rounding(x, self.calls)
        self.calls += 1
        return True

    def _in_place_rounding(self, x: Tensor, dtype: torch.dtype) -> _InPlace | None:
        """The rounding in place of a contiguous x of ``dtype`` (a dtype with a format; the
        caller has read it), held in ``in_place`` by whether x is on a kernel device
        (`on_kernel_device`): `PreparedRounding.in_place_rounding`, without its lookup."""
        on_kernel, held = on_kernel_device(x), self.in_place[dtype]
        if held[on_kernel] is _UNSEEN:
            held[on_kernel] = self.roundings[dtype].in_place_rounding((dtype, on_kernel))
        return held[on_kernel]

    def _mutating(self, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op of a plain entry that mutates its arguments: `_native`, its output checked;
        an op that writes its first argument and returns it (`OpKind.returns_self`: ``x.add_
        (y)``, an optimizer's update) without a walk, its output checked with the arguments."""
        if entry.kind.returns_self and args:
            out = entry.call(*args, **kwargs) if kwargs else entry.call(*args)
            self._round_written(args[0])
            return out
        out = self._native(entry.call, entry.kind, args, kwargs)
        check_supported((out,))
        return out

    def _emulated(
        self,
        func: torch._ops.OpOverload,
        kind: OpKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run the op as the emulation says and round its floating outputs."""
        if self.round_inputs:
            args, kwargs = self._inputs_rounded(kind, args, kwargs)
        before = self.calls
        out = self._cast(func, args, kwargs) if kind.lays_out else None  # (conversions)
        if out is None and self.accumulate == "per_op":
            out = per_op_result(func, args, kwargs, self.formats, self.mode, self._arith_options)
        if out is None:
            if self.compute == "float64" and not kind.seeded:
                out = self._wide(func, kind, args, kwargs)
            else:
                out = self._native(func, kind, args, kwargs)
        check_supported((out,))
        if self.observer is not None and self.calls > before:
            self.observer(func, out)
        return out

    def _native(
        self,
        func: Callable[..., Any],
        kind: OpKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The op (``func``, or its `op_caller`) run natively, its outputs rounded: the
        tensors it mutates in place (`_round_written`), else its fresh outputs
        (`_output_rounded`)."""
        out = func(*args, **kwargs)
        if not self.round_outputs:
            return out
        if not kind.mutated_positions:
            return each_output(self._output_rounded, out)
        for tensor in self._mutated(kind, args, kwargs):
            self._round_written(tensor)
        return out

    def _round_written(self, tensor: Tensor) -> None:
        """A tensor an op wrote rounded where it lies, if its dtype has a format
        (`PreparedRounding.round_in_place`), else its rounding copied in."""
        dtype = tensor.dtype
        prepared = self.roundings.get(dtype)
        if prepared is None:
            return
        if plain(tensor) and tensor.is_contiguous() and self._rounded_in_place(tensor):
            return
        tensor.copy_(self._next_rounding(tensor.detach(), prepared, fresh=True))

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
            target = self._cast_rounding(kwargs.get("dtype") or source.dtype)
            if target is None or not source.is_floating_point():
                return None
            return func(self._next_rounding(source.to(torch.float64), target), **kwargs)
        if func is aten.copy_.default:
            destination, source = args[0], args[1]
            target = self._cast_rounding(destination.dtype)
            if target is None or not isinstance(source, Tensor) or not source.is_floating_point():
                return None
            rounded = self._next_rounding(source.to(torch.float64), target)
            return func(destination, rounded, *args[2:], **kwargs)
        return None

    def _arith_options(self, steps: int) -> dict[str, Any]:
        """The rounding options of an arith call that consumes ``steps`` offsets, starting
        at the counter, which it advances past them."""
        options = dict(rbits=self.rbits, variant=self.variant, seed=self.key, offset=self.calls)
        self.calls += steps
        return options

    def cast_format(self, dtype: torch.dtype) -> Format | None:
        """The format a conversion into ``dtype`` rounds to (None: none)."""
        target = self.formats.get(dtype)
        return self.cast_formats.get(dtype) if target is None else target

    def _cast_rounding(self, dtype: torch.dtype) -> PreparedRounding | None:
        """The rounding of a conversion into ``dtype`` (to `cast_format`; None: none)."""
        prepared = self.roundings.get(dtype)
        return self.cast_roundings.get(dtype) if prepared is None else prepared

    def _output_rounded(self, out: Tensor) -> Tensor:
        """A fresh output rounded, if its dtype has a format: the rounding's own result where
        its strides are the output's (one pass: a dense output, the common case), else
        copied into the output (its strides kept: a transposed ``mm`` result, ...).  (A
        plain op's single output is rounded in place where it can be: `_plain`.)"""
        prepared = self.roundings.get(out.dtype)
        if prepared is None:
            return out
        return self._fresh_rounded(out, prepared)

    def _owned_output_rounded(self, out: Tensor) -> Tensor:
        """`_output_rounded` of an output the op owns, plain and contiguous (`apart`)."""
        prepared = self.roundings.get(out.dtype)
        if prepared is None:
            return out
        return self._owned_rounded(out, prepared)

    def _owned_rounded(self, out: Tensor, prepared: PreparedRounding) -> Tensor:
        """An output the op owns, plain and contiguous, of a dtype with a format
        (``prepared``): rounded in place where its rounding can write it (not an output
        that requires grad), else into a new tensor (`_fresh_rounded`)."""
        if not out.requires_grad and self._rounded_in_place(out):
            return out
        return self._fresh_rounded(out, prepared)

    def _fresh_rounded(self, out: Tensor, prepared: PreparedRounding) -> Tensor:
        """`_output_rounded` of an output whose dtype has a format (``prepared``)."""
        rounded = self._next_rounding(out, prepared, fresh=True)
        if rounded.stride() == out.stride():
            return rounded
        return out.copy_(rounded)

    def _mutated(self, kind: OpKind, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
        """The floating tensors an op mutates (its ``Tensor(a!)`` arguments)."""
        if kind.mutates_self and args:  # (its first argument, a tensor: no walk)
            return [args[0]] if args[0].dtype.is_floating_point else []
        found = []
        for position, name in zip(kind.mutated_positions, kind.mutated_names, strict=True):
            value = args[position] if position < len(args) else kwargs.get(name)
            candidates = value if isinstance(value, list | tuple) else [value]
            found += [t for t in candidates if isinstance(t, Tensor) and t.is_floating_point()]
        return found

    def _inputs_rounded(
        self, kind: OpKind, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The op's arguments with every floating tensor of a mapped dtype rounded: the
        mutated ones in place (the op overwrites them anyway), the others as copies (the
        caller's tensors are not changed)."""
        mutated = {id(t) for t in self._mutated(kind, args, kwargs)}

        def entered(t: Tensor) -> Tensor:
            prepared = self.roundings.get(t.dtype)
            if prepared is None:
                return t
            if id(t) in mutated:
                return t.copy_(self._next_rounding(t, prepared))
            return self._next_rounding(t, prepared)

        return pytree.tree_map_only(Tensor, entered, (args, kwargs))

    def _wide(
        self,
        func: torch._ops.OpOverload,
        kind: OpKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """compute="float64": the op on float64 copies of the floating inputs (Python
        floats as the op's arithmetic holds them, `scalar_dtype`), each result rounded
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
        number_dtype = scalar_dtype(floating)
        wide_of = {id(t): t.to(torch.float64, copy=True) for t in floating}

        def widened(value: object) -> object:
            if isinstance(value, Tensor):
                return wide_of.get(id(value), value)
            if isinstance(value, float) and number_dtype is not None:
                return float(torch.tensor(value, dtype=number_dtype))
            return value

        wide_args, wide_kwargs = pytree.tree_map(widened, (args, kwargs))
        # an in-place op's exact result: from its arguments before the op overwrites one
        before = self._pair(func, wide_args, wide_kwargs) if native is None else None
        wide_out = func(*wide_args, **wide_kwargs)
        if native is None:  # an in-place or out= op: its mutated tensors take the results
            for tensor in mutated:
                result = wide_of[id(tensor)]
                if tensor.shape != result.shape:  # an out= tensor the op resized
                    tensor.resize_(result.shape)
                if tensor.dtype in self.formats:
                    pair = before if len(mutated) == 1 else None
                    result = self._result_rounded(func, pair, result, tensor.dtype)
                tensor.copy_(result)
            # what it returns: its mutated arguments (or nothing), the caller's tensors
            original_of = {id(wide_of[id(t)]): t for t in floating}
            return pytree.tree_map_only(Tensor, lambda t: original_of.get(id(t), t), wide_out)
        outs, spec = pytree.tree_flatten(native)
        for out, wide in zip(outs, pytree.tree_leaves(wide_out), strict=True):
            if isinstance(out, Tensor) and out.dtype in self.formats:
                pair = self._pair(func, wide_args, wide_kwargs) if len(outs) == 1 else None
                out.copy_(self._result_rounded(func, pair, wide, out.dtype))
        return pytree.tree_unflatten(outs, spec)

    def _pair(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Tensor, Tensor] | None:
        """With ``residuals`` (and outputs rounded), the op's exact result ``(hi, lo)`` from
        its float64 arguments (`exact_pair`); None otherwise or where it has none."""
        if not (self.residuals and self.round_outputs):
            return None
        return exact_pair(func, args, kwargs)

    def _result_rounded(
        self,
        func: torch._ops.OpOverload,
        pair: tuple[Tensor, Tensor] | None,
        wide: Tensor,
        dtype: torch.dtype,
    ) -> Tensor:
        """An op's float64 result ``wide`` for an output of ``dtype``: unrounded without
        ``round_outputs``; its exact result ``pair`` rounded where given (`sr_pair`); else
        ``wide`` rounded (with ``residuals``, a float64 op at 53 bits, unchanged by that,
        is noted in ``no_residual``)."""
        if not self.round_outputs:
            return wide
        target = self.formats[dtype]
        if pair is None:
            full = target.precision >= format_of_dtype(dtype).precision
            if self.residuals and dtype == torch.float64 and full and func not in EXACT_OPS:
                self.no_residual.add(str(func))
            return self._next_rounding(wide, self.roundings[dtype], fresh=True)
        offset = self.calls
        self.calls += 1
        return sr_pair(pair[0], pair[1], target, self.key, offset)

    def _next_rounding(self, x: Tensor, prepared: PreparedRounding, fresh: bool = False) -> Tensor:
        """x rounded by a format's prepared rounding with the next offset of the counter: a
        new tensor of x's dtype (float64 for a result computed wide, which holds every
        format until stored); the bits of ``stochround.round(x, fmt, mode, rbits=rbits,
        variant=variant, seed=key, offset=k, hardware=hardware)``.

        ``fresh``: x is an output the op just made inside the mode, below autograd, or a
        tensor it wrote, detached (no gradient to detach).  A plain dense tensor with data
        (not a subclass such as a DTensor, not sparse, not on the meta device, not a
        transform's wrapper) then skips the call's checks (`PreparedRounding.round_plain`):
        the checks cost about what the rounding's own host side does, on every op."""
        offset = self.calls
        self.calls += 1
        if fresh and not x.requires_grad and plain(x):
            return prepared.round_plain(x, offset)
        return prepared.round(x.detach(), offset)


__all__ = ["Emulation"]
