"""Whether the Triton kernels can serve a call: the one check that rounding, arithmetic and
the optimizers share, made without importing a kernel module.

The kernels run where Triton is importable and the call's tensors lie on a CUDA device, or
anywhere under Triton's interpreter (``TRITON_INTERPRET=1``, read once, as Triton reads it
when a kernel is defined).  What else a kernel needs (input dtypes, formats, layouts) its
own module says (`kernels.rounding.rounding_refusal`, `kernels.matmul.matmul_refusal`, and the
optimizers' own checks of a parameter).  Also the current CUDA device's getter that every
launch reads before it runs (`current_device`), here where no Triton import is needed, so
that cuBLASLt's route (`kernels.cublaslt`) reads the same one.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from ..compile_cache import caches_keyed_apart
from ..formats import Format, format_of_dtype
from ..reference import check_choice

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# who computes a call: "triton" the kernels (or a ValueError saying why they cannot),
# "torch" the PyTorch path, "auto" the kernels where they can serve it
BACKENDS = ("auto", "torch", "triton")


def check_backend(backend: object) -> str:
    """``backend`` if it is one of `BACKENDS` (ValueError naming them otherwise)."""
    return check_choice("backend", backend, BACKENDS)


# Triton's importability, once known (a list read by a plain function: torch.compile warns
# about lru_cache-wrapped functions in the code it traces, and the optimizers' compiled step
# asks this)
_TRITON_IMPORT: list[str | None] = []


def triton_missing() -> str | None:
    """Why Triton cannot be imported (None if it can); tried once per process."""
    if not _TRITON_IMPORT:
        try:
            import triton  # noqa: F401 - imported only to learn whether it can be
        except ImportError as error:
            _TRITON_IMPORT.append(f"triton is not importable ({error})")
        else:
            _TRITON_IMPORT.append(None)
    return _TRITON_IMPORT[0]


# whether "auto" routes CPU tensors as it routes CUDA ones (`cpu_as_cuda`): a list read by a
# plain function, as `_TRITON_IMPORT`
_CPU_AS_CUDA: list[bool] = [False]
# what `cpu_as_cuda` adds to torch.compile's cache key tag while it routes CPU tensors
ROUTE_CACHE_TAG = "+cpu-as-cuda"


def on_kernel_device(x: torch.Tensor) -> bool:
    """Whether ``x`` lies where "auto" routes a call to the kernels: a CUDA tensor, or any
    tensor inside `cpu_as_cuda`.  Every routing decision reads this instead of
    ``x.is_cuda``."""
    return x.is_cuda or _CPU_AS_CUDA[0]


# [routing as CUDA, supplying the CUDA-only mm]: `cpu_as_cuda`'s flags
_CPU_MM_DTYPE = [False]
_CPU_MM_LIBRARY: list[torch.library.Library] = []


def _cpu_mm_dtype(a: Tensor, b: Tensor, out_dtype: torch.dtype) -> Tensor:
    """``aten::mm.dtype`` for CPU tensors inside ``cpu_as_cuda()``: the product of the
    widened operands (each bf16 value exact in fp32), what a CUDA step's bf16 mm with an
    fp32 ``out_dtype`` computes up to its order of accumulation."""
    if not _CPU_MM_DTYPE[0]:
        raise NotImplementedError(
            "aten::mm.dtype has no CPU kernel (stochround supplies one inside cpu_as_cuda)"
        )
    return torch.mm(a.to(torch.float32), b.to(torch.float32)).to(out_dtype)


def _register_cpu_mm_dtype() -> None:
    """Registers `_cpu_mm_dtype` as aten's CPU kernel of ``mm.dtype`` (once a process): a
    kernel, not a dispatch mode, so that torch.compile traces a step that calls it and a
    call pays no mode's host time."""
    if not _CPU_MM_LIBRARY:
        library = torch.library.Library("aten", "IMPL")
        library.impl("mm.dtype", _cpu_mm_dtype, "CPU")
        _CPU_MM_LIBRARY.append(library)


@contextlib.contextmanager
def cpu_as_cuda(cuda_only_ops: bool = True) -> Iterator[None]:
    """Under Triton's interpreter, route CPU tensors as CUDA ones: "auto" calls take the
    kernels (in the interpreter) and the host code a CUDA step runs, so that the
    operations a CUDA step dispatches can be counted, and its bits checked, on a CPU
    (benchmarks/bench_ops.py).  The one operation only CUDA has (``torch.mm`` with an
    ``out_dtype``) is supplied for CPU tensors meanwhile (by a CPU kernel, which
    torch.compile traces and which costs no other operation host time), unless
    ``cuda_only_ops`` is False; cuBLASLt's scaled GEMM (`stochround.kernels.cublaslt`),
    which dispatches no ATen operation on CUDA, by a stand-in that dispatches none either.
    ValueError outside the interpreter.

    torch.compile's caches are keyed apart meanwhile (`ROUTE_CACHE_TAG`,
    `stochround.compile_cache.caches_keyed_apart`): the route changes what a layer's opaque ops
    return (a CUDA step keeps operands a CPU step does not) with the traced graph's code
    and inputs the same, so a graph compiled under the route, found again outside it (or
    the reverse), would run with the other's output layouts."""
    if not INTERPRETED:
        raise ValueError("cpu_as_cuda needs Triton's interpreter (TRITON_INTERPRET=1)")
    _register_cpu_mm_dtype()
    before = _CPU_AS_CUDA[0], _CPU_MM_DTYPE[0]
    _CPU_AS_CUDA[0], _CPU_MM_DTYPE[0] = True, cuda_only_ops
    try:
        with caches_keyed_apart(ROUTE_CACHE_TAG):
            yield
    finally:
        _CPU_AS_CUDA[0], _CPU_MM_DTYPE[0] = before


def kernels_refusal(tensor: str, on_cuda: bool) -> str | None:
    """Why no Triton kernel can serve a call whose tensor (named ``tensor`` in the message)
    is on a CUDA device or not (None if the kernels can run there)."""
    if not (on_cuda or INTERPRETED):
        return f"{tensor} is not a CUDA tensor (set TRITON_INTERPRET=1 to run kernels on the CPU)"
    return triton_missing()


def use_kernel(backend: str, tensor: str, on_cuda: bool, refusal: str | None) -> bool:
    """The one routing decision of every call that has a kernel: True to run the Triton
    kernel, False for the PyTorch path.

    ``refusal`` is the caller's own ``*_refusal`` answer: why the kernel cannot serve this
    call's inputs (dtypes, formats, layouts), None if it can.  "torch" never takes the
    kernel; "auto" takes it for a CUDA tensor (named ``tensor`` in messages) that it serves
    where Triton runs; "triton" takes it or raises a ValueError saying why it cannot.
    """
    on_cuda = on_cuda or _CPU_AS_CUDA[0]
    if backend == "torch" or (backend == "auto" and not on_cuda):
        return False
    reason = refusal if refusal is not None else kernels_refusal(tensor, on_cuda)
    if reason is None:
        return True
    if backend == "auto":
        return False
    raise ValueError(
        f"backend='triton' cannot serve this call: {reason}; use backend='torch' or 'auto'"
    )


__all__ = [
    "BACKENDS",
    "INTERPRETED",
    "ROUTE_CACHE_TAG",
    "check_backend",
    "cpu_as_cuda",
    "current_device",
    "kernels_refusal",
    "on_kernel_device",
    "triton_missing",
    "use_kernel",
]


def current_device() -> int:
    """The index of the current CUDA device (PyTorch's own getter, without building a
    `torch.device`: this runs on every kernel call)."""
    return torch._C._cuda_getDevice()


@functools.cache  # Format is frozen; fits_in works in exact fractions
def kernel_supports(fmt: Format) -> bool:
    """Formats the kernels round exactly: values exact in fp32 and emin >= -126."""
    fp32 = format_of_dtype(torch.float32)
    return fmt.fits_in(fp32) and fmt.emin >= fp32.emin
