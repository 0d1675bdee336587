"""Operations a CUDA step dispatches, counted: the host work of issue 42 as numbers.

On a GPU the eager `QuantizedLinear` step is host-bound: each dispatched ATen operation
and each Triton launch costs the host microseconds, whatever the GPU does.  Their NUMBER is
exact and the same on any machine, so this script counts them on the route a CUDA tensor
takes, on the CPU: under Triton's interpreter (``TRITON_INTERPRET=1``, set here when no GPU
is present) inside `stochround.kernels.availability.cpu_as_cuda`, which routes CPU
tensors as CUDA ones, so that the kernels run (interpreted) where a CUDA step launches
them and the host code is a CUDA step's.  On a GPU the counts are taken on CUDA tensors.

Counted, per case (after a warm-up call, which builds the prepared launches):

- ``launches``: Triton kernel launches (`stochround.kernels.runtime.Launch` and
  `PartialLaunch` calls, whose fast path on a GPU calls the compiled launcher itself, and
  `triton.JITFunction.run` or
  the interpreter's ``InterpretedFunction.run`` outside one);
- ``aten``: ATen operations dispatched (a `TorchDispatchMode`), outside the launches (the
  interpreter's own tensor copies are not the step's), views and allocations included;
- ``other``: operations of other namespaces (stochround's custom ops).

Cases: one `QuantizedLinear` forward and backward (dx, dW, db) per named recipe with its
defaults, on ``--tokens`` x ``--features`` x ``--features`` (fp32 input), and
`stochround.blocks.quantize` of a ``--features`` square (NVFP4 SR, MXFP8 RN); and
``linear_fp8_native``, fp8(native=True)'s step (on the CPU with its device check skipped).

    python benchmarks/bench_ops.py                   # CPU (interpreter) or GPU: the table
    python benchmarks/bench_ops.py --ops nvfp4       # also each operation's name, in order

``--host``: the Python host time of each case (a `QuantizedLinear` step's forward and
backward, a `stochround.blocks.quantize` call) on the CUDA route, measured on the CPU (no
GPU figure): inside ``cpu_as_cuda()`` (no dispatch mode: a CUDA call has none; the
CUDA-only ``torch.mm`` with an ``out_dtype`` supplied by a registered CPU kernel)
with every Triton launch stubbed out (`stochround.kernels.runtime.Launch` and `PartialLaunch`
return at once:
the kernels are not what is measured), the ATen operations real on the small default
shapes (their compute is negligible); the best of ``--repeats`` runs of ``--calls`` calls
back to back, in process time, per call; ``--profile`` adds cProfile's top entries by own
and by cumulative time.  Only where no GPU is present.

    python benchmarks/bench_ops.py --host            # the table and each case's host time
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

if not torch.cuda.is_available():  # before stochround imports a kernel (Triton reads it then)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
from torch.utils._python_dispatch import TorchDispatchMode

import stochround as sr
import stochround.nn as srnn
from stochround.kernels.availability import cpu_as_cuda
from stochround.kernels.runtime import Launch, PartialLaunch

RECIPES = ("nvfp4", "mxfp8", "mxfp4_tseng", "int8", "fp8")
BLOCK_CASES = (("nvfp4", "sr"), ("mxfp8_e4m3", "rne"))


class Counts(NamedTuple):
    """One case's counts: Triton launches, ATen operations, other operations, and the
    names of the ATen and other operations in dispatch order (launches as ``launch:name``),
    and with ``where`` each one's caller (`caller`)."""

    launches: int
    aten: int
    other: int
    names: tuple[str, ...]
    sites: tuple[str, ...] = ()


class OpCounter(TorchDispatchMode):
    """Records every operation dispatched to it by name (``cpu_as_cuda``, entered first,
    supplies the CUDA-only ``torch.mm`` with an ``out_dtype`` below it)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.paused = 0
        # each operation's caller (file:line of the innermost stochround frame), with --where
        self.where: list[str] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self.paused:
            self.names.append(func.name())
            if self.where is not None:
                self.where.append(caller())
        return func(*args, **kwargs)


def caller() -> str:
    """file:line of the innermost stochround frame on the stack (for --where)."""
    for frame in reversed(traceback.extract_stack()):
        if "stochround" in frame.filename and "bench_ops" not in frame.filename:
            return f"{frame.filename.rsplit('stochround/', 1)[-1]}:{frame.lineno} {frame.name}"
    return "?"


@contextlib.contextmanager
def counting() -> Iterator[OpCounter]:
    """An `OpCounter` active, with each Triton launch recorded as ``launch:<kernel>`` and
    the operations inside it left out.  A launch is a call of
    `stochround.kernels.runtime.Launch` or `PartialLaunch` (whose fast paths call the
    compiled launcher themselves on a GPU) or of a kernel's ``run`` outside one (the JIT's
    and the interpreter's)."""
    counter = OpCounter()
    patched: list[tuple[type, str, Callable]] = []
    targets: list[tuple[type, str]] = [
        (Launch, "__call__"),
        (PartialLaunch, "__call__"),
        (triton.JITFunction, "run"),
    ]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        targets.append((InterpretedFunction, "run"))
    except ImportError:
        pass
    for cls, method in targets:
        original = getattr(cls, method)

        def launch(self: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            if kwargs.get("warmup") or counter.paused:  # a launch's own inner call
                return _original(self, *args, **kwargs)
            kernel = getattr(self, "kernel", self)  # a Launch's kernel, or the kernel
            name = getattr(kernel, "__name__", None) or getattr(kernel.fn, "__name__", "?")
            counter.names.append(f"launch:{name}")
            if counter.where is not None:
                counter.where.append(caller())
            counter.paused += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                counter.paused -= 1

        setattr(cls, method, launch)
        patched.append((cls, method, original))
    try:
        with counter:
            yield counter
    finally:
        for cls, method, original in patched:
            setattr(cls, method, original)


def counted(call: Callable[[], object], where: bool = False) -> Counts:
    """The counts of one ``call`` (after a warm-up call) on the CUDA route: CUDA tensors on
    a GPU, else CPU tensors inside `cpu_as_cuda` (the caller builds them on the device
    `device()` names)."""
    route = contextlib.nullcontext() if torch.cuda.is_available() else cpu_as_cuda()
    with route:
        call()  # the warm-up: prepared launches made, kernels compiled
        with counting() as counter:
            counter.where = [] if where else None
            call()
    names = tuple(counter.names)
    launches = sum(name.startswith("launch:") for name in names)
    aten = sum(name.startswith("aten::") for name in names)
    sites = tuple(counter.where or ())
    return Counts(launches, aten, len(names) - launches - aten, names, sites)


@contextlib.contextmanager
def launches_stubbed() -> Iterator[None]:
    """Every `Launch` and `PartialLaunch` call returns at once (the kernels are not run:
    host time alone)."""
    originals = Launch.__call__, PartialLaunch.__call__
    Launch.__call__ = lambda self, *args: None  # type: ignore[method-assign]
    PartialLaunch.__call__ = lambda self, *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Launch.__call__, PartialLaunch.__call__ = originals  # type: ignore[method-assign]


@contextlib.contextmanager
def jit_runs_stubbed() -> Iterator[None]:
    """Every launch outside a `Launch` (``kernel[grid](...)``: the interpreter's
    ``InterpretedFunction.run``) returns at once, its outputs left unwritten."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        yield
        return
    original = InterpretedFunction.run
    InterpretedFunction.run = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        InterpretedFunction.run = original  # type: ignore[method-assign]


@contextlib.contextmanager
def host_route() -> Iterator[None]:
    """The CUDA route on the CPU as a host-time measurement takes it: `cpu_as_cuda`
    without its dispatch mode (its registered CPU kernel supplies the CUDA-only mm), every
    launch stubbed (`launches_stubbed`, `jit_runs_stubbed`: a launch outside a `Launch`
    costs a GPU step far more host time than one inside, which the ``--ops`` listing
    shows by name) and one ATen thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with cpu_as_cuda(), launches_stubbed(), jit_runs_stubbed():
            yield
    finally:
        torch.set_num_threads(threads)


def host_time(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Seconds of process time one ``call`` takes on the CPU's CUDA route with the launches
    stubbed (`host_route`): the best of ``repeats`` runs of ``calls`` calls, after
    warm-up calls."""
    with host_route():
        for _ in range(10):
            call()
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(calls):
                call()
            best = min(best, (time.process_time() - start) / calls)
    return best


def profiled(call: Callable[[], object], calls: int, top: int = 15) -> str:
    """cProfile's ``top`` entries by own time, then by cumulative time, over ``calls``
    calls (as `host_time` runs them)."""
    profile = cProfile.Profile()
    with host_route():
        call()
        profile.enable()
        for _ in range(calls):
            call()
        profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumtime").print_stats(top)
    return text.getvalue()


def device() -> torch.device:
    """CUDA where there is a GPU, else the CPU (the interpreter's route)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def linear_step(
    name: str,
    tokens: int,
    features: int,
    recipe: srnn.Recipe | None = None,
    dtype: torch.dtype = torch.float32,
) -> Callable[[], object]:
    """One forward and backward of a ``features`` square `QuantizedLinear` (with bias) under
    the recipe ``name`` with its defaults (or ``recipe``), on ``tokens`` tokens, the layer
    and its input in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    where = device()
    torch.manual_seed(0)  # the layer's initial weights
    linear = torch.nn.Linear(features, features).to(where, dtype)
    layer = srnn.QuantizedLinear.from_linear(linear, recipe or srnn.RECIPES[name]())
    x = torch.randn(tokens, features, generator=generator).to(where, dtype).requires_grad_()
    grad = torch.randn(tokens, features, generator=generator).to(where, dtype)

    def step() -> None:
        # as a training step after zero_grad(): no gradient to accumulate into
        x.grad = layer.weight.grad = layer.bias.grad = None
        layer(x).backward(grad)

    return step


def without_check(step: Callable[[], object]) -> Callable[[], object]:
    """``step`` with gemm="native"'s device check skipped: on the CPU, whose
    ``torch._scaled_mm`` takes float8 operands too, so that the native step's host
    operations are counted there."""
    from stochround.nn import linear

    def call() -> object:
        check, linear.check_native = linear.check_native, lambda x: None
        try:
            return step()
        finally:
            linear.check_native = check

    return call


def block_quantize(fmt: str, mode: str, features: int) -> Callable[[], object]:
    """`stochround.blocks.quantize` of a ``features`` square of fp32 values (SR: seed 0,
    offset 0)."""
    x = torch.randn(features, features, generator=torch.Generator().manual_seed(0))
    x = x.to(device())
    options = {"seed": 0, "offset": 0} if mode == "sr" else {}
    return lambda: sr.blocks.quantize(x, fmt, mode, **options)


def cases(
    tokens: int, features: int, dtype: torch.dtype = torch.float32
) -> dict[str, Callable[[], object]]:
    """Every case by name: ``linear_<recipe>`` (its layer and input in ``dtype``; also
    ``linear_fp8_native`` and ``linear_nvfp4_pow2``, nvfp4() with tensor_scale="pow2") and
    ``quantize_<format>_<mode>``."""
    found = {f"linear_{name}": linear_step(name, tokens, features, dtype=dtype) for name in RECIPES}
    native = linear_step("fp8", tokens, features, srnn.fp8(native=True), dtype)
    found["linear_fp8_native"] = native if torch.cuda.is_available() else without_check(native)
    pow2 = srnn.nvfp4(tensor_scale="pow2")  # the operands hold their tensor scales
    found["linear_nvfp4_pow2"] = linear_step("nvfp4", tokens, features, pow2, dtype)
    for fmt, mode in BLOCK_CASES:
        found[f"quantize_{fmt}_{mode}"] = block_quantize(fmt, mode, features)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens of a layer step (64)")
    parser.add_argument("--features", type=int, default=64, help="in = out features (64)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="a layer step's"
    )
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    parser.add_argument("--ops", action="append", default=[], help="list this case's ops")
    parser.add_argument("--where", action="store_true", help="with --ops: in order, by caller")
    parser.add_argument("--json", help="write the counts to this file")
    parser.add_argument(
        "--host", action="store_true", help="each case's CPU host time, launches stubbed"
    )
    parser.add_argument(
        "--calls", type=int, default=None, help="--host: calls a run (2000; 200 a linear step)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="--host: runs, best kept (7)")
    parser.add_argument("--profile", action="store_true", help="--host: cProfile's top")
    args = parser.parse_args(argv)
    if args.host and torch.cuda.is_available():
        parser.error("--host measures the CUDA route on the CPU: run it without a GPU")
    where = "cuda" if torch.cuda.is_available() else "cpu (interpreter, cpu_as_cuda)"
    shape = f"{args.tokens} x {args.features} ({args.dtype})"
    print(f"operations dispatched per call, {shape}; route: {where}")
    print(f"{'case':<28}{'launches':>9}{'aten':>6}{'other':>6}")
    results = {}
    for case, call in cases(args.tokens, args.features, getattr(torch, args.dtype)).items():
        if args.case and case not in args.case:
            continue
        listed = case in args.ops or case.removeprefix("linear_") in args.ops
        counts = counted(call, where=listed and args.where)
        results[case] = counts._asdict()
        print(f"{case:<28}{counts.launches:>9}{counts.aten:>6}{counts.other:>6}")
        if listed and args.where:
            for name, site in zip(counts.names, counts.sites, strict=True):
                print(f"    {name:<32} {site}")
        elif listed:
            for name, count in Counter(counts.names).most_common():
                print(f"    {count:>3}  {name}")
        if args.host:
            calls = args.calls or (200 if case.startswith("linear_") else 2000)
            seconds = host_time(call, calls, args.repeats)
            results[case]["host_us"] = seconds * 1e6
            print(f"    host time (CPU, launches stubbed): {seconds * 1e6:.1f} us a call")
            if args.profile:
                print(profiled(call, calls))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": where, "counts": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
