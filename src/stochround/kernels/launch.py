"""Launches of Triton kernels with their constexprs and options bound once (`Launch`).

``kernel[grid](*args, **constexprs)`` spends about 20 us of host time (H100 host, Triton
3.6) on a kernel of two dozen parameters, most of it Python around the launch: every
argument, constexprs included, bound into a dict and specialized, a cache key built from
all of them and the options, launch metadata, two hook chains called; the compiled
kernel's own launcher takes 6 us of it. A `Launch` binds one kernel's constexprs and
options once; per call it asks Triton's own specialization function (the one the JIT's
binder calls for every argument) about the runtime arguments only, finds the compiled
kernel under that key and calls its native launch function (the compiled launcher's
Python wrapper only adds scratch buffers, which our kernels do not use: 2 us a launch).
Constexprs and options being fixed, the key determines the JIT's own cache key, so the
kernel launched is the one ``kernel[grid]`` would launch (a GPU test compares the keys with
the binder's).

Calls go through ``kernel[grid]`` instead where that is the right thing: the first call of
a specialization (Triton compiles and caches it; its kernel is kept for the next calls),
kernels that need global or profiling scratch memory, under the interpreter, while launch
hooks or pre-run hooks are registered (profilers rely on them), and on any Triton release
but the one this module was written against (`FAST_LAUNCH`), whose internals may differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import triton
from triton import knobs
from triton.runtime import driver

# the specialization function of Triton's JIT binder (Triton 3.6: a native function)
try:
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # another Triton: FAST_LAUNCH is off anyway
    native_specialize_impl = None

TESTED_TRITON = "3.6."
FAST_LAUNCH = (
    os.environ.get("TRITON_INTERPRET") != "1"
    and triton.__version__.startswith(TESTED_TRITON)
    and native_specialize_impl is not None
)


def _hooks_registered(kernel: object) -> bool:
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
            backends = self.backends[device] = (self.kernel.device_caches[device][3],) * len(args)
        return (
            device,
            knobs.runtime.debug,
            knobs.compilation.instrumentation_mode,
            *map(native_specialize_impl, backends, args, *self.flags),
        )

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
        if bound is None:  # through the JIT: compiles, or finds its cached kernel
            compiled = self.kernel[(programs,)](*args, **self.constants)
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            run = compiled.run
            if not (run.global_scratch_size or run.profile_scratch_size):
                flags = (run.launch_cooperative_grid, run.launch_pdl)
                self.compiled[key] = (compiled, compiled.function, *flags, compiled.packed_metadata)
            return
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
            None,  # launch metadata and hooks: none registered (checked above)
            None,
            None,
            *args,
            *self.constexpr_values,
        )
