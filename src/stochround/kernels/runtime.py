"""The kernels' host runtime: launches with their constexprs and options bound once
(`Launch`), clean scratch kept per stream (`SCRATCH`), and the current device and stream
read the cheap way.  Every use of Triton's and PyTorch's internals lives here, each with a
path through the public API where those internals differ.

Launches.  ``kernel[grid](*args, **constexprs)`` does a lot of Python work around each
launch: every argument, constexprs included, bound into a dict and specialized, a cache
key built from all of them and the options, launch metadata, two hook chains called.  For
a kernel of two dozen parameters launched on a hot path, that is most of a small call's
host time (benchmarks/bench_launch.py measures both ways).  A `Launch` binds one kernel's
constexprs and options once; per call it asks Triton's own specialization function (the
one the JIT's binder calls for every argument) about the runtime arguments only, finds the
compiled kernel under that key and calls its native launch function (the compiled
launcher's Python wrapper only adds scratch buffers, which these kernels do not use).
Constexprs and options being fixed, the key determines the JIT's own cache key, so the
kernel launched is the one ``kernel[grid]`` would launch (a GPU test compares the keys with
the binder's).

Where a caller passes some runtime arguments the same at every call (a prepared plan's
rotation signs, block count and index offset; an in-place rounding's seed and absent
pointers), `Launch.partial` fixes them: its `PartialLaunch` holds them and specializes
only the arguments that change (issues 42 and 43: Triton's specialization of each
argument costs about as much host time as its compiled launcher).  Being held and passed
at every call, the fixed arguments specialize the same at every call, so the key over
the changing ones determines the JIT's key as `Launch.key` does.

Calls go through ``kernel[grid]`` instead where that is the right thing: the first call of
a specialization (Triton compiles and caches it; its kernel is kept for the next calls),
kernels that need global or profiling scratch memory, under the interpreter, while launch
hooks or pre-run hooks are registered (profilers rely on them), and on any Triton release
but the one this module was written against (`FAST_LAUNCH`), whose internals may differ.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
import triton
from torch import Tensor
from triton import knobs
from triton.runtime import driver

from .availability import INTERPRETED

# the specialization function of Triton's JIT binder (Triton 3.6: a native function)
try:
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # another Triton: FAST_LAUNCH is off anyway
    native_specialize_impl = None

TESTED_TRITON = "3.6."


def fast_launch_supported(triton_version: str, interpreted: bool) -> bool:
    """Whether `Launch` may call compiled kernels' native launchers itself: compiled kernels
    (not the interpreter) of the Triton release this module was written against, whose
    binder's specialization function it found.  Anywhere else every launch goes through
    ``kernel[grid]``."""
    return (
        not interpreted
        and triton_version.startswith(TESTED_TRITON)
        and native_specialize_impl is not None
    )


FAST_LAUNCH = fast_launch_supported(triton.__version__, INTERPRETED)


def _hooks_registered(kernel: triton.JITFunction) -> bool:
    """Whether a launch must run Triton's hooks: launch hooks (a hook chain with entries, or
    any other callable set in its place) or the kernel's pre-run hooks."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return bool(kernel.pre_run_hooks)


class Launch:
    """``kernel`` with its constexprs and launch options (``num_warps`` ...) bound; calling
    it with a 1-D grid and the runtime arguments in the kernel's order launches it.

    The kernel must declare its runtime parameters first, unannotated (ValueError
    otherwise): the compiled launcher takes the constexprs' values after them."""

    def __init__(
        self, kernel: triton.JITFunction, constants: Mapping[str, object], fast: bool = FAST_LAUNCH
    ) -> None:
        self.kernel = kernel
        self.constants = dict(constants)
        # per key: the compiled kernel, then what its native launch takes besides the grid,
        # the stream, scratch, hooks and arguments (function, cooperative-grid and PDL
        # flags, packed metadata)
        self.compiled: dict[tuple, tuple] = {}
        # the interpreter's kernels have no compiled launcher
        self.fast = fast and isinstance(kernel, triton.JITFunction)
        if not self.fast:
            return
        params = kernel.params
        runtime = [param for param in params if not param.is_constexpr]
        if any(param.is_constexpr for param in params[: len(runtime)]) or any(
            param.annotation_type for param in runtime
        ):
            raise ValueError(
                f"kernel {kernel.__name__} must declare unannotated runtime parameters first"
            )
        missing = [p.name for p in params[len(runtime) :] if p.name not in self.constants]
        if missing:
            raise ValueError(f"constants must give every constexpr of {kernel.__name__}: {missing}")
        self.constexpr_values = tuple(self.constants[p.name] for p in params[len(runtime) :])
        # (is_const, specialize, align) of each runtime parameter, as the binder passes
        # them, by column: the key maps the specialization function over them
        self.flags = (
            tuple(param.is_const for param in runtime),
            tuple(not param.do_not_specialize for param in runtime),
            tuple(not param.do_not_specialize_on_alignment for param in runtime),
        )
        self.backends: dict[int, tuple] = {}

    def key(self, device: int, args: tuple) -> tuple:
        """The specialization of the runtime arguments (Triton's own function, with the
        binder's flags) and the options the JIT reads at each launch."""
        if len(args) != len(self.flags[0]):
            raise TypeError(
                f"{self.kernel.__name__} takes {len(self.flags[0])} runtime arguments, "
                f"got {len(args)}"
            )
        backends = self.backends.get(device)
        if backends is None:  # the JIT's backend object for the device, once per argument
            backends = self.backends[device] = (self.backend(device),) * len(args)
        return (
            device,
            knobs.runtime.debug,
            knobs.compilation.instrumentation_mode,
            *map(native_specialize_impl, backends, args, *self.flags),
        )

    def backend(self, device: int) -> object:
        """The JIT's backend object for ``device`` (what its specialization function takes)."""
        return self.kernel.device_caches[device][3]

    def __call__(self, device: int, programs: int, *args: object) -> None:
        """Launch ``programs`` programs on the current stream of ``device``, which must be
        the current CUDA device (the caller knows it: asking again costs host time);
        Triton launches on the current device, whose context holds the compiled kernel.
        (``device`` is not read where the call goes through the JIT.)"""
        if not self.fast or _hooks_registered(self.kernel):
            self.kernel[(programs,)](*args, **self.constants)
            return
        key = self.key(device, args)
        bound = self.compiled.get(key)
        if bound is None:
            self.first_launch(programs, args, self.compiled, key)
            return
        self.launch_compiled(bound, device, programs, args)

    def first_launch(self, programs: int, args: tuple, compiled: dict, key: tuple) -> None:
        """The first launch of a key, through the JIT (which compiles, or finds its cached
        kernel); its compiled kernel kept in ``compiled`` under ``key`` unless it needs
        scratch memory (which Triton's launcher wrapper allocates)."""
        kernel = self.kernel[(programs,)](*args, **self.constants)
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        run = kernel.run
        if not (run.global_scratch_size or run.profile_scratch_size):
            flags = (run.launch_cooperative_grid, run.launch_pdl)
            compiled[key] = (kernel, kernel.function, *flags, kernel.packed_metadata)

    def launch_compiled(self, bound: tuple, device: int, programs: int, args: tuple) -> None:
        """Launch ``bound`` (a compiled kernel and what its native launch takes, as
        `first_launch` keeps them) through its native launch function."""
        compiled, function, cooperative, pdl, metadata = bound
        compiled.run.launch(
            programs,
            1,
            1,
            driver.active.get_current_stream(device),
            function,
            cooperative,
            pdl,
            None,  # global and profiling scratch: none needed (checked at the first launch)
            None,
            metadata,
            None,  # launch metadata and hooks: none registered (checked by the caller)
            None,
            None,
            *args,
            *self.constexpr_values,
        )

    def partial(self, template: Sequence[object]) -> PartialLaunch:
        """This launch with the runtime arguments that are not `Varying` in ``template``
        fixed (`PartialLaunch`)."""
        return PartialLaunch(self, template)


class Varying(NamedTuple):
    """In a `PartialLaunch`'s template, a runtime argument that each call passes: the
    call's ``slot``-th argument after the device and the programs."""

    slot: int


# what a fixed argument may be: values that cannot change, and tensors (whose storage the
# caller keeps: `PartialLaunch`)
FIXED_TYPES = (type(None), bool, int, float, Tensor)


class PartialLaunch:
    """A `Launch` with some runtime arguments fixed: ``template`` gives each runtime
    argument in the kernel's order, a `Varying` for one that each call passes or the fixed
    value itself.  ``partial(device, programs, *varying)`` launches as ``launch(device,
    programs, *args)`` would, ``args`` the template with each `Varying` replaced by the
    call's argument at its slot (a slot may stand at several positions of one
    specialization: an in-place rounding's x as its input and its output).

    Its key is `Launch.key`'s over the varying arguments alone: exact, because the fixed
    ones are held here and passed at every call, so their specialization never changes;
    that holds for a fixed tensor as long as it keeps its storage (its pointer, read at each
    launch, is specialized by its alignment), which its holder must see to (no `Tensor.set_`
    on it).  While Triton's debug knob is on, each call checks it: the fixed arguments'
    specialization, recorded at a device's first launch, is computed again and compared
    (RuntimeError if it changed).  Fixed values are None, numbers or tensors (TypeError
    otherwise).  The first launch of each key goes through the JIT, as `Launch`'s."""

    def __init__(self, launch: Launch, template: Sequence[object]) -> None:
        self.launch, self.kernel = launch, launch.kernel
        slots = sorted({entry.slot for entry in template if isinstance(entry, Varying)})
        if slots != list(range(len(slots))):
            raise ValueError(f"the varying slots must be 0, 1, ... with none left out; got {slots}")
        fixed = [entry for entry in template if not isinstance(entry, Varying)]
        wrong = [type(value).__name__ for value in fixed if not isinstance(value, FIXED_TYPES)]
        if wrong:
            raise TypeError(f"a fixed argument must be None, a number or a tensor; got {wrong}")
        self.slots, self.fixed = len(slots), tuple(fixed)
        # each runtime position's index in ``varying + fixed``
        fixed_index = iter(range(len(slots), len(template)))
        self.gather = _gatherer(
            [entry.slot if isinstance(entry, Varying) else next(fixed_index) for entry in template]
        )
        self.compiled: dict[tuple, tuple] = {}  # as `Launch.compiled`, by the varying key
        self.backends: dict[int, tuple] = {}
        self.fixed_specialization: dict[int, tuple] = {}  # by device, at its first launch
        if not launch.fast:
            return
        if len(template) != len(launch.flags[0]):
            raise TypeError(
                f"{launch.kernel.__name__} takes {len(launch.flags[0])} runtime arguments, "
                f"the template gives {len(template)}"
            )
        # the binder's (is_const, specialize, align) of each slot and fixed argument
        slot_flags: dict[int, tuple] = {}
        fixed_flags = []
        for entry, flags in zip(template, zip(*launch.flags, strict=True), strict=True):
            if not isinstance(entry, Varying):
                fixed_flags.append(flags)
            elif slot_flags.setdefault(entry.slot, flags) != flags:
                raise ValueError(f"slot {entry.slot} stands at positions specialized differently")
        # by column, as `Launch.flags`
        self.flags = _columns([slot_flags[slot] for slot in slots])
        self.fixed_flags = _columns(fixed_flags)

    def key(self, device: int, varying: tuple) -> tuple:
        """`Launch.key` over the varying arguments alone (the fixed ones are fixed)."""
        backends = self.backends.get(device)
        if backends is None:
            backends = self.backends[device] = (self.launch.backend(device),) * self.slots
        return (
            device,
            knobs.runtime.debug,
            knobs.compilation.instrumentation_mode,
            *map(native_specialize_impl, backends, varying, *self.flags),
        )

    def specialize_fixed(self, device: int) -> tuple:
        """The specialization of the fixed arguments on ``device`` (Triton's function, with
        the binder's flags)."""
        backends = (self.launch.backend(device),) * len(self.fixed)
        return tuple(map(native_specialize_impl, backends, self.fixed, *self.fixed_flags))

    def arguments(self, varying: tuple) -> tuple:
        """The runtime arguments in full of a call given ``varying``."""
        return self.gather(varying + self.fixed)

    def __call__(self, device: int, programs: int, *varying: object) -> None:
        """Launch as `Launch.__call__` does, with the template's arguments (class docstring)."""
        if len(varying) != self.slots:
            raise TypeError(f"the partial launch takes {self.slots} arguments, got {len(varying)}")
        args = self.gather(varying + self.fixed)
        launch = self.launch
        if not launch.fast or _hooks_registered(launch.kernel):
            launch.kernel[(programs,)](*args, **launch.constants)
            return
        key = self.key(device, varying)
        bound = self.compiled.get(key)
        if bound is None:
            if device not in self.fixed_specialization:
                self.fixed_specialization[device] = self.specialize_fixed(device)
            launch.first_launch(programs, args, self.compiled, key)
            return
        if key[1] and self.specialize_fixed(device) != self.fixed_specialization[device]:
            raise RuntimeError(
                f"a fixed argument of a partial launch of {launch.kernel.__name__} changed "
                "its specialization (a fixed tensor's storage was replaced)"
            )
        launch.launch_compiled(bound, device, programs, args)


def _columns(rows: list[tuple]) -> tuple:
    """The binder's flags of some arguments by column (three empty columns for none)."""
    return tuple(zip(*rows, strict=True)) or ((), (), ())


def _gatherer(order: list[int]) -> Callable[[tuple], tuple]:
    """The function that takes ``values`` to ``tuple(values[i] for i in order)`` (one
    `operator.itemgetter`: a call's host time)."""
    if len(order) == 1:
        only = order[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*order)


@functools.cache
def bound_launch(kernel: triton.JITFunction, constants: tuple[tuple[str, object], ...]) -> Launch:
    """The `Launch` of ``kernel`` with one set of constexprs and options (``constants``,
    as ``tuple(dict.items())``), made once: a launch then costs Triton's specialization of
    the runtime arguments alone."""
    return Launch(kernel, dict(constants))


def check_prepared(
    x: Tensor, name: str, shape: torch.Size, dtype: torch.dtype, device: torch.device
) -> None:
    """ValueError unless ``x`` (called ``name``) is a contiguous tensor of the shape, dtype
    and device a prepared launch was made for."""
    if x.shape != shape or x.dtype != dtype or x.device != device or not x.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dtype} tensor of shape {tuple(shape)} on "
            f"{device}, as prepared; got {x.dtype} {tuple(x.shape)} on {x.device}"
        )


def current_stream_key(device: int) -> object | None:
    """What identifies the current stream of CUDA device ``device`` (PyTorch's triple for
    it, read without building a `torch.cuda.Stream`), "cpu" for -1, or None while that
    stream captures a CUDA graph: a graph keeps the pointers it captured, so a capture
    takes buffers of its own rather than a stream's cached ones."""
    if device < 0:
        return "cpu"
    if torch.cuda.is_current_stream_capturing():
        return None
    return torch._C._cuda_getCurrentStream(device)


@functools.lru_cache(maxsize=64)
def current_stream(stream_data: tuple[int, int, int]) -> torch.cuda.Stream:
    """The `torch.cuda.Stream` of a device's current stream, given as PyTorch's
    ``_cuda_getCurrentStream`` triple (stream id, device index, device type): built once
    per stream, where `torch.cuda.current_stream` builds one anew each call, which costs
    more host time than the synchronization it serves."""
    stream_id, device_index, device_type = stream_data
    return torch.cuda.Stream(
        stream_id=stream_id, device_index=device_index, device_type=device_type
    )


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """A CUDA device's multiprocessor count (read once)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def persistent_programs(device: torch.device) -> int:
    """Programs of a grid that walks a list: four per multiprocessor (four in all on CPU)."""
    if device.type != "cuda":
        return 4
    return 4 * multiprocessors(device)


class Scratch(threading.local):
    """Per thread, device and stream, clean scratch for the rounding kernels: an int32
    buffer (the codes kernels' NaN flag, list length and arrival count, zero, then the list
    of tiles, read only below its length; the general kernel's NaN flag) and a host word
    (page-locked beside a CUDA device, so the kernel writes it directly), zero, that the
    codes kernel sets to 1 when it lists a tile.

    Kernels leave the buffer clean unless a result is NaN, which saves each call a fresh
    `torch.zeros` (a launch of its own): the codes kernel writes only to list a tile, the exact
    kernel clears the list's length after reading it, the general kernel writes only on
    NaN.  A call takes them out and puts them back once they are clean again in its
    stream's order (so they serve that stream alone): unchecked calls once their last
    kernel is queued, checked calls after waiting for their kernels (reading the note
    where it lies, through a NumPy view, cheaper than `Tensor.item` and far cheaper than
    reading a device word) and clearing the note if a tile was listed.  A call that
    raises or fails midway drops them; per thread, so that no two threads share one."""

    def __init__(self) -> None:
        self.by_stream: dict[object, tuple[Tensor, Tensor, np.ndarray]] = {}

    def take(
        self, size: int, device: int, capturable: bool
    ) -> tuple[Tensor, Tensor | None, np.ndarray | None, object]:
        """(a clean int32 buffer of at least ``size`` elements on CUDA device ``device``, or
        the CPU for -1, a zeroed int32 host word the device can write and its NumPy view,
        the key to give them back under: PyTorch's triple for the device's current stream,
        or "cpu").

        ``capturable``: whether the call may run under CUDA-graph capture (checked calls
        refuse it before they get here).  A capture gets fresh scratch, no note and no key:
        a graph keeps the pointers it captured, so its scratch must be its own.  (A device
        index, not a `torch.device`, whose attributes are slow to read on a hot path.)"""
        on_cuda = device >= 0
        key: object  # PyTorch's stream triple, or "cpu"
        where: int | str  # the device of the buffer
        if not on_cuda:
            key = where = "cpu"
        elif capturable and torch.cuda.is_current_stream_capturing():
            return torch.zeros(size, dtype=torch.int32, device=device), None, None, None
        else:
            key, where = torch._C._cuda_getCurrentStream(device), device
        cached = self.by_stream.pop(key, None)
        if cached is None or cached[0].numel() < size:
            flags = torch.zeros(size, dtype=torch.int32, device=where)
            note = torch.zeros(1, dtype=torch.int32, pin_memory=on_cuda)
            cached = flags, note, note.numpy()
        return (*cached, key)

    def give_back(
        self, flags: Tensor, note: Tensor | None, note_view: np.ndarray | None, key: object
    ) -> None:
        """Cache the scratch `take` gave, clean in the order of the stream of ``key``
        (nothing under capture: no key, and no note)."""
        if key is not None:
            # `take` withholds the note only under capture, which has no key either
            assert note is not None and note_view is not None
            self.by_stream[key] = flags, note, note_view


SCRATCH = Scratch()
