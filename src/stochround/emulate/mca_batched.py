"""The n samples of Monte Carlo arithmetic in one run (`stochround.emulate.mca` with
``batched=True``): every tensor the program makes carries the n samples' values
(`SampleTensor`), each ATen op runs once over all of them, and each rounding draws, for
sample j, the words sample j's own serial run draws, so that sample j is the serial run j
bit for bit.  A pointwise op, a conversion, a sum or a mean runs its emulation directly
on the stacked ``(n, ...)`` values (`stochround.emulate.mca_direct`; on CUDA a binary
op's whole emulation is one launch, `stochround.kernels.sample_pair`); any other op
runs through `torch.func.vmap` over the op and its emulation.

Streams: run j of `mca` starts its counter at ``j * SAMPLE_STRIDE`` (serial and batched
alike; `stochround.emulate.mca_samples`), and run 0 draws offsets 0, 1, ..., as ``with
Emulation(..., seed=seed)`` alone does.

What cannot be batched (`BatchingError`): an op whose result is not a tensor, read from the
samples' values (``.item()``, ``bool(x)``, ``if x > 0``, ``x.tolist()``), an op whose
result's shape depends on the values (``nonzero``, ``masked_select``, ``unique``), a
draw from torch's generator (``randn`` inside the program), an in-place op that writes the
samples' values into a tensor made outside the program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch._C import _functorch as functorch
from torch.utils import _pytree as pytree

from .. import random as streams
from .. import rounding
from ..formats import Format
from ..kernels.availability import on_kernel_device, use_kernel
from ..rounding.prepared import PreparedRounding
from .dispatch import Emulation
from .exact import sr_pair_words
from .mca_direct import (
    BINARY_KERNEL_OPS,
    CallSpec,
    Direct,
    StackedCall,
    binary_call,
    direct_kind,
    flat_call,
    same_dtypes,
    scalar_operand,
    signature,
    stacked_pointwise,
    stacked_reduction,
)
from .mca_samples import (
    SAMPLE_STRIDE,
    BatchingError,
    SampleTensor,
    sample_pair_refusal,
    sample_words,
)
from .ops import OpKind
from .torch_hooks import skip_dynamo


class _Rounds(Exception):
    """A factory run once (`BatchedEmulation._made`) reached a rounding."""


def _tensor_returns(func: torch._ops.OpOverload) -> bool:
    """Whether every result of ``func`` is a tensor or a list of tensors (vmap needs that)."""
    return all(
        isinstance(r.type, torch.TensorType)
        or (
            isinstance(r.type, torch.ListType)
            and isinstance(r.type.getElementType(), torch.TensorType)
        )
        for r in func._schema.returns
    )


def _written_results(func: torch._ops.OpOverload) -> tuple[tuple[int, int, str], ...]:
    """Each result of ``func`` that is an argument it writes (``add_``, ``out=``): (the
    result's position, the argument's position and name), from its schema."""
    schema = func._schema
    found = []
    for position, result in enumerate(schema.returns):
        if result.alias_info is None or not result.alias_info.is_write:
            continue
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is not None and (
                argument.alias_info.before_set == result.alias_info.before_set
            ):
                found.append((position, index, argument.name))
    return tuple(found)


@functools.cache
def _sample_pair() -> ModuleType:
    """`stochround.kernels.sample_pair`, imported at its first use (it imports triton),
    then without an import statement an op."""
    from ..kernels import sample_pair

    return sample_pair


# the dtypes whose ops the sample-pair kernel computes
_PAIR_DTYPES = (torch.float32, torch.float64)


@skip_dynamo
class BatchedEmulation(Emulation):
    """An `Emulation` (compute="float64", accumulate="once", 32-bit words, variant c)
    that runs every op on the n samples together: the op's `SampleTensor` arguments give
    their samples, its other tensors are shared by every sample, and its tensor results
    are `SampleTensor`s.  Each rounding of the i-th call draws, for sample j, offset
    ``j SAMPLE_STRIDE + i`` (`sample_words`).  ``on_samples``: None or a callable
    ``(func, outputs)`` given each rounded op's outputs as ``(n, *shape)`` tensors, which
    it may hold until ``before_write`` (None or a callable) is called: before any op
    writes into a tensor of the run;
    ``site``: where the program is (its errors name it: `stochround.emulate.mca.call_site`)."""

    def __init__(
        self,
        n: int,
        fmt: Any,
        mode: str,
        *,
        seed: int,
        residuals: bool,
        round_inputs: bool,
        round_outputs: bool,
        on_samples: Callable[[torch._ops.OpOverload, Any], None] | None = None,
        before_write: Callable[[], None] | None = None,
        site: Callable[[], str] = lambda: "?",
    ) -> None:
        super().__init__(
            fmt,
            mode,
            seed=seed,
            compute="float64",
            residuals=residuals,
            round_inputs=round_inputs,
            round_outputs=round_outputs,
        )
        self.n = n
        self.on_samples, self.before_write, self.site = on_samples, before_write, site
        self._bases: dict[torch.device, Tensor] = {}
        self._seeds: dict[torch.device, Tensor] = {}
        # per op overload, read once: whether its results are tensors, how it runs on
        # the stacked samples (`stochround.emulate.mca_direct`)
        self._forms: dict[torch._ops.OpOverload, tuple[bool, Direct]] = {}
        # per op and form of its call (`signature`): whether stacking keeps its dtypes
        self._alike: dict[tuple[Any, ...], bool] = {}
        # per op overload: the kernel's name for a binary op whose emulation the kernel
        # computes whole ("" for any other op: `_fused_op`), and the results its
        # arguments write (`_written_results`)
        self._binary: dict[torch._ops.OpOverload, str] = {}
        self._written: dict[torch._ops.OpOverload, tuple[tuple[int, int, str], ...]] = {}
        # per (dtype, on a kernel device): the format the kernel rounds its results to,
        # None where it does not serve them (`_pair_target`)
        self._pair_targets: dict[tuple[torch.dtype, bool], Format | None] = {}
        # set while an op runs directly on the stacked samples: its tensors are the
        # samples' ``(n, ...)`` values, not vmap's
        self._direct = False
        # the counter once the op's inputs were rounded (`_inputs_rounded`)
        self._entered = 0

    def __enter__(self) -> BatchedEmulation:
        # the dispatch keys of the code that enters the run (`__torch_dispatch__`), the
        # Python keys excluded: the op's own ops do not come back to the mode
        python = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
            torch._C.DispatchKey.PythonTLSSnapshot
        )
        self._keys = (
            torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set() | python,
        )
        super().__enter__()
        return self

    def seed_on(self, device: torch.device) -> Tensor:
        """The stream's key as the kernels take it (`stochround.random.seed_tensor`) on
        ``device``, made once."""
        found = self._seeds.get(device)
        if found is None:
            found = self._seeds[device] = streams.seed_tensor(self.key, "seed", device)
        return found

    def bases(self, device: torch.device) -> Tensor:
        """The first offset of each sample's counter, ``j SAMPLE_STRIDE``, on ``device``."""
        found = self._bases.get(device)
        if found is None:
            found = torch.arange(self.n, dtype=torch.int64, device=device) * SAMPLE_STRIDE
            self._bases[device] = found
        return found

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        op = self._binary.get(func)
        if op is None:
            op = self._binary[func] = self._fused_op(func)
        if op and not kwargs and len(args) == 2:
            fused = self._binary_fused(func, op, args[0], args[1])
            if fused is not None:
                return fused
        kwargs = kwargs or {}
        leaves, spec = flat_call(args, kwargs)
        batched = [isinstance(value, SampleTensor) for value in leaves]
        entry = self._entries.get(func)
        if entry is None:
            entry = self._entries[func] = self._op_entry(func)
        form = self._forms.get(func)
        if form is None:
            form = self._forms[func] = (_tensor_returns(func), direct_kind(func, entry.kind))
        tensor_returns, direct = form
        if not any(batched) and (entry.kind.aliases_only or not tensor_returns):
            # a view of a tensor made outside the program, a query of one: shared as it is
            return super().__torch_dispatch__(func, types, args, kwargs)
        if not tensor_returns:
            raise self._error(func, "its result is a Python value read from the samples' values")
        if not func._schema.returns:  # a check of the values (linalg's): of every sample's
            unwrapped = [v.samples if b else v for v, b in zip(leaves, batched, strict=True)]
            return super().__torch_dispatch__(func, types, *spec.unflatten(unwrapped))
        if not any(isinstance(v, Tensor) for v in leaves):
            made = self._made(func, types, args, kwargs)
            if made is not None:
                return made
        if any(not isinstance(t, SampleTensor) for t in self._mutated(entry.kind, args, kwargs)):
            raise self._error(
                func,
                "it writes into a tensor made outside the run (an argument, a global), which "
                "holds one value, not the n samples'",
            )
        if entry.kind.mutated_positions and self.before_write is not None:
            self.before_write()  # the observer may hold the tensor this op writes into
        self._entered = self.calls
        stacked = self._stacked(func, direct, leaves, batched, spec, args, kwargs)
        if stacked is not None:
            out = self._run_stacked(types, stacked)
        else:
            out = self._vmapped(func, types, leaves, batched, spec)
        wrapped = self._wrapped(func, args, kwargs, out)
        # observed as the serial emulation observes: an op that rounded once its inputs
        # were (its outputs, a conversion's source)
        if self.on_samples is not None and self.calls > self._entered:
            # one tensor (most ops) without pytree's walk: it costs more than the trace
            if isinstance(wrapped, SampleTensor):
                self.on_samples(func, wrapped.samples)
            else:
                self.on_samples(func, pytree.tree_map_only(SampleTensor, _samples_of, wrapped))
        return wrapped

    def _fused_op(self, func: torch._ops.OpOverload) -> str:
        """The kernel's name for ``func`` where `_fused` would compute its emulation whole
        (a binary op of the kernel, selected; outputs rounded from their exact results, no
        input rounded), else "": read once an overload."""
        op = BINARY_KERNEL_OPS.get(func)
        if op is None or not (self.residuals and self.round_outputs and not self.round_inputs):
            return ""
        entry = self._entries.get(func)
        if entry is None:
            entry = self._entries[func] = self._op_entry(func)
        return op if entry.handled else ""

    def _pair_target(self, dtype: torch.dtype, on_kernel: bool) -> Format | None:
        """The format the kernel rounds results of ``dtype`` to, on a kernel device or not;
        None where it does not serve them (not float32 or float64, no format, a format it
        refuses, no kernel there): read once per (dtype, device kind)."""
        key = (dtype, on_kernel)
        if key not in self._pair_targets:
            target = self.formats.get(dtype) if dtype in _PAIR_DTYPES else None
            served = target is not None and use_kernel(
                "auto", "a", on_kernel, sample_pair_refusal(target)
            )
            self._pair_targets[key] = target if served else None
        return self._pair_targets[key]

    def _binary_fused(
        self, func: torch._ops.OpOverload, op: str, a: object, b: object
    ) -> SampleTensor | None:
        """The common op of a program, resolved without the general path's walk: ``a op
        b`` of a sample tensor and a sample tensor of its shape, dtype and device or a
        Python number, computed by the kernel (`_fused`'s launch, the same bits), its
        result observed; None for any other call (the general path serves it)."""
        if type(a) is not SampleTensor:
            return None
        samples = a.samples
        target = self._pair_target(samples.dtype, on_kernel_device(samples))
        if target is None:
            return None
        other: Tensor | float | None
        if type(b) is SampleTensor:
            other = b.samples
            if (
                other.dtype != samples.dtype
                or other.shape != samples.shape
                or other.get_device() != samples.get_device()
            ):
                return None
        else:
            other = scalar_operand(b, samples.dtype)
            if other is None:
                return None
        offset = self.calls
        self.calls += 1
        device = samples.device
        seed, bases = self.seed_on(device), self.bases(device)
        kernel = _sample_pair().sample_binary_triton
        out = kernel(op, samples, other, samples.dtype, target, seed, bases, offset)
        wrapped = self._sample_tensor(out)
        if self.on_samples is not None:
            self.on_samples(func, wrapped.samples)
        return wrapped

    def _stacked(
        self,
        func: torch._ops.OpOverload,
        direct: Direct,
        leaves: list[Any],
        batched: list[bool],
        spec: CallSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> StackedCall | None:
        """The op as it runs directly on the stacked samples (`stochround.emulate.
        mca_direct`), or None where it takes vmap's path: not pointwise nor a covered
        reduction, or its dtypes would change (checked once per form of its call)."""
        if direct is Direct.NONE:
            return None
        if direct is Direct.REDUCTION:
            first = args[0] if args else None
            if not isinstance(first, SampleTensor):
                return None
            stacked = stacked_reduction(func, args, kwargs, first.samples)
        else:
            samples = [v.samples if b else None for v, b in zip(leaves, batched, strict=True)]
            flat = stacked_pointwise(func, leaves, samples, self.n)
            stacked = StackedCall(func, *spec.unflatten(flat))
        if stacked is None:
            return None
        key = signature(leaves, batched)
        if key is None:
            return stacked if same_dtypes(func, leaves, stacked, spec.unflatten) else None
        key = (func, *key)
        alike = self._alike.get(key)
        if alike is None:
            alike = self._alike[key] = same_dtypes(func, leaves, stacked, spec.unflatten)
        return stacked if alike else None

    def _run_stacked(self, types: tuple[type, ...], stacked: StackedCall) -> Any:
        """The emulation's op on the stacked samples: its handling (computed wide, its
        exact result, its rounding) as one sample's, every tensor ``(n, ...)``."""
        fused = self._fused(stacked)
        if fused is not None:
            return fused
        self._direct = True
        try:
            return Emulation.__torch_dispatch__(
                self, stacked.func, types, stacked.args, stacked.kwargs
            )
        finally:
            self._direct = False

    def _fused(self, stacked: StackedCall) -> Tensor | None:
        """A binary op of the stacked samples computed whole by one kernel on CUDA (its
        float64 result, its exact residual, their rounding with each sample's words:
        `stochround.kernels.sample_pair`), where the emulation would compute just that:
        its output rounded from its exact result, no input rounded, the op selected, a
        format the kernel takes.  None otherwise (the emulation's handling)."""
        first = stacked.args[0] if stacked.args else None
        if not (isinstance(first, Tensor) and on_kernel_device(first)):
            return None
        if not (self.residuals and self.round_outputs and not self.round_inputs):
            return None
        call = binary_call(stacked)
        if (
            call is None
            or call.dtype not in self.formats
            or not self._entries[stacked.func].handled
        ):
            return None
        target = self.formats[call.dtype]
        if not use_kernel("auto", "a", on_kernel_device(call.a), sample_pair_refusal(target)):
            return None
        # the kernel module imports triton: imported where it runs
        from ..kernels.sample_pair import sample_binary_triton

        offset = self.calls
        self.calls += 1
        bases = self.bases(call.a.device)
        return sample_binary_triton(
            call.op, call.a, call.b, call.dtype, target, self.seed_on(call.a.device), bases, offset
        )

    def _vmapped(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        leaves: list[Any],
        batched: list[bool],
        spec: CallSpec,
    ) -> Any:
        """The emulation's op on each sample by `torch.func.vmap`: the general path."""
        # a tensor shared by every sample enters as n views of it: the op's results (and
        # the emulation's copies into them) are then per sample, as its rounding is
        values = [
            v.samples if b else v.expand(self.n, *v.shape) if isinstance(v, Tensor) else v
            for v, b in zip(leaves, batched, strict=True)
        ]
        devices = [v.device for v in values if isinstance(v, Tensor)]
        device = devices[0] if devices else torch.device("cpu")

        def one_sample(_: Tensor, *flat: Any) -> Any:
            inner_args, inner_kwargs = spec.unflatten(list(flat))
            return Emulation.__torch_dispatch__(self, func, types, inner_args, inner_kwargs)

        in_dims = (0, *(0 if isinstance(v, Tensor) else None for v in values))
        try:
            # a dispatch mode's handler runs with every key above Python excluded, vmap's
            # among them: the op's vmap runs with the keys the program's code had
            with torch._C._ForceDispatchKeyGuard(*self._keys):
                out = torch.func.vmap(one_sample, in_dims=in_dims, randomness="error")(
                    self.bases(device), *values
                )
        except (BatchingError, TypeError):  # the emulation's own refusals (complex, ...)
            raise
        except Exception as error:  # vmap refuses the op (its message says why)
            raise self._error(func, f"{type(error).__name__}: {error}") from error
        return out

    def _made(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A factory (no tensor argument: ``zeros``, ``arange``) run once, its tensors then
        given to every sample (copies: a program writes in them); None where the emulation
        rounded it (the counter moved: each sample's rounding needs the op's vmap)."""
        before = self.calls
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs)
        except _Rounds:
            self.calls = before
            return None
        return pytree.tree_map_only(
            Tensor, lambda t: SampleTensor(t.expand(self.n, *t.shape).clone()), out
        )

    def _error(self, func: torch._ops.OpOverload, why: str) -> BatchingError:
        return BatchingError(
            f"{func} (at {self.site()}) cannot run on the {self.n} MCA samples together: "
            f"{why}.  Run the samples one after another: mca(..., batched=False), "
            "stochround mca --serial"
        )

    def _wrapped(
        self,
        func: torch._ops.OpOverload,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> Any:
        """vmap's ``(n, ...)`` results as `SampleTensor`s; a result that is a mutated
        argument (``add_``, ``out=``) is that argument itself."""
        written_results = self._written.get(func)
        if written_results is None:
            written_results = self._written[func] = _written_results(func)
        written: dict[int, Any] = {}
        for position, index, name in written_results:
            written[position] = args[index] if index < len(args) else kwargs.get(name)
        if isinstance(out, Tensor):
            return written.get(0, self._sample_tensor(out))
        results = [
            written[i] if i in written else pytree.tree_map_only(Tensor, self._sample_tensor, r)
            for i, r in enumerate(out)
        ]
        return type(out)(results) if isinstance(out, tuple) else results

    def _sample_tensor(self, samples: Tensor) -> SampleTensor:
        """``samples`` as a `SampleTensor`; a result shared by every sample (vmap expands
        it) copied, so that an in-place op may write one sample's value in it."""
        if samples.ndim and samples.stride(0) == 0 and self.n > 1:
            samples = samples.contiguous()
        return SampleTensor(samples)

    def _physical(self, x: Tensor) -> Tensor:
        """The ``(n, *shape)`` values of x inside the op's vmap (a tensor shared by every
        sample: expanded); on the stacked path, x itself."""
        if self._direct:
            return x
        level = functorch.maybe_current_level()
        if level is None:  # a factory run once (`_made`): it must run per sample
            raise _Rounds
        values, dim = functorch._unwrap_batched(x, level)
        if dim is None:
            return values.expand(self.n, *values.shape)
        return values.movedim(dim, 0)

    def _batched(self, values: Tensor) -> Tensor:
        """``(n, *shape)`` values as a tensor of the op's vmap (the inverse of `_physical`)."""
        if self._direct:
            return values
        return functorch._add_batch_dim(values, 0, functorch.current_level())

    def _inputs_rounded(
        self, kind: OpKind, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """As the emulation's; the counter after it noted (`_entered`): the serial run
        observes an op whose rounding came after its inputs'."""
        rounded = super()._inputs_rounded(kind, args, kwargs)
        self._entered = self.calls
        return rounded

    def _words(self, x: Tensor, offset: int) -> Tensor:
        """Sample j's words of offset ``j SAMPLE_STRIDE + offset`` for x's ``(n, *shape)``."""
        return sample_words(x.shape[1:], self.key, self.bases(x.device), offset)

    def _next_rounding(self, x: Tensor, prepared: PreparedRounding, fresh: bool = False) -> Tensor:
        """As the emulation's, each sample drawing its own run's words (`_words`); x's
        samples (``fresh`` or not) are read out of the op's vmap, then rounded whole."""
        offset = self.calls
        self.calls += 1
        values = self._physical(x.detach())
        if self.mode != "sr":
            return self._batched(prepared.round(values, offset))
        target = prepared.request.fmt
        rounded = rounding.round(values, target, "sr", rand=self._words(values, offset))
        return self._batched(rounded)

    def _result_rounded(
        self,
        func: torch._ops.OpOverload,
        pair: tuple[Tensor, Tensor] | None,
        wide: Tensor,
        dtype: torch.dtype,
    ) -> Tensor:
        """As the emulation's; an exact result ``hi + lo`` rounded by `sr_pair_words` with
        each sample's words."""
        if pair is None or not self.round_outputs:
            return super()._result_rounded(func, pair, wide, dtype)
        target: Format = self.formats[dtype]
        offset = self.calls
        self.calls += 1
        hi, lo = self._physical(pair[0]), self._physical(pair[1])
        return self._batched(self._pair_rounded(hi, lo, target, offset))

    def _pair_rounded(self, hi: Tensor, lo: Tensor, target: Format, offset: int) -> Tensor:
        """``hi + lo`` (``(n, *shape)``) rounded by `sr_pair_words` with each sample's
        words of ``offset``: one kernel on CUDA for words and rounding
        (`stochround.kernels.sample_pair`), PyTorch's ops elsewhere."""
        bases = self.bases(hi.device)
        if use_kernel("auto", "hi", on_kernel_device(hi), sample_pair_refusal(target)):
            # the kernel module imports triton: imported where it runs
            from ..kernels.sample_pair import sample_pair_triton

            return sample_pair_triton(hi, lo, target, self.seed_on(hi.device), bases, offset)
        return sr_pair_words(hi, lo, target, self._words(hi, offset))


def _samples_of(value: SampleTensor) -> Tensor:
    return value.samples


__all__ = ["BatchedEmulation"]
