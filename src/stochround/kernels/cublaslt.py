"""cuBLASLt's bf16 GEMM with its scale read from the device: ``out = round(alpha * (A B^T))``
for bf16 ``A`` (M, K) and ``B`` (N, K), the products summed in fp32, ``alpha`` an fp32
word in device memory, the result rounded once to bf16 (or written in fp32) by cuBLAS's
own epilogue.

This is `stochround.blocks.scaled_mm`'s scaling where the product takes its tensor scales
alone (``P * (sa * sb)``, then one rounding: the spec in
`stochround.kernels.scaled_gemm`) without an fp32 product in memory and a pass over it.
PyTorch exposes no bf16 GEMM with a device-side alpha (``torch._scaled_mm`` takes FP8
and FP4 operands alone), so this module calls the few cuBLASLt functions it needs
through ctypes, in the cuBLASLt library PyTorch itself loaded (the same build as
PyTorch's GEMMs).  Split-K partial sums stay in fp32 (`REDUCTION_SCHEMES`), and
``beta`` is a device zero, so cuBLAS never reads the output before writing it.

A plan (`AlphaGemmPlan`) is made once per shapes, strides and alignments; a call is one
``cublasLtMatmul`` on the current stream, captured by CUDA graphs like any launch.  Its
workspace (`WORKSPACE_BYTES`) is one buffer per device, made once in PyTorch's regular
memory, outside every graph's pool (`outside_graph_pools`).
Guide: docs/guide/blocks.md ("GEMM operands and the emulated GEMM").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

from .availability import current_device

# cuBLASLt's enumerations (cublasLt.h, library_types.h, cublas_api.h)
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUDA_R_32F, CUDA_R_16BF = 0, 14
DESC_POINTER_MODE, DESC_TRANSA, DESC_TRANSB = 2, 3, 4
POINTER_MODE_DEVICE = 1
PREF_MAX_WORKSPACE_BYTES, PREF_REDUCTION_SCHEME_MASK = 1, 3
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
# split-K's partial sums: none, or in the compute type (fp32) in the workspace; never in
# the output's type (bf16 partial sums would round more than once)
REDUCTION_SCHEME_NONE, REDUCTION_SCHEME_COMPUTE_TYPE = 0, 2
REDUCTION_SCHEMES = REDUCTION_SCHEME_NONE | REDUCTION_SCHEME_COMPUTE_TYPE
# the workspace of a device's GEMMs (what PyTorch gives cuBLASLt on Hopper)
WORKSPACE_BYTES = 32 * 1024 * 1024
# the output dtypes cuBLAS writes from the fp32 scaled sums
ALPHA_OUT_DTYPES = {torch.bfloat16: CUDA_R_16BF, torch.float32: CUDA_R_32F}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", _Algo),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def _library_path() -> str | None:
    """The cuBLASLt library this process loaded with PyTorch's CUDA build (read from the
    process's mappings), else the one the loader finds."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "libcublasLt.so" in path:
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("cublasLt")


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The cuBLASLt library with its functions' signatures declared, or why it cannot be
    used."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    path = _library_path()
    if path is None:
        return "no cuBLASLt library is loaded or found"
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        return f"cuBLASLt at {path} cannot be loaded ({error})"
    p, size, u64, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64
    signatures = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), ctypes.c_int, ctypes.c_int],
        "cublasLtMatmulDescSetAttribute": [p, ctypes.c_int, p, size],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), ctypes.c_int, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceSetAttribute": [p, ctypes.c_int, p, size],
        "cublasLtMatmulAlgoGetHeuristic": [
            p, p, p, p, p, p, p, ctypes.c_int, ctypes.POINTER(_Heuristic),
            ctypes.POINTER(ctypes.c_int),
        ],
        "cublasLtMatmulDescDestroy": [p],
        "cublasLtMatrixLayoutDestroy": [p],
        "cublasLtMatmulPreferenceDestroy": [p],
        "cublasLtMatmul": [
            p, p, p, p, p, p, p, p, p, p, p, p, ctypes.POINTER(_Algo), p, size, p,
        ],
    }  # fmt: skip
    for name, arguments in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = ctypes.c_int
    return lib


def cublaslt_missing() -> str | None:
    """Why cuBLASLt cannot serve a device-alpha GEMM in this process (None if it can)."""
    found = _library()
    return found if isinstance(found, str) else None


def _checked(status: int, call: str) -> None:
    if status != CUBLAS_STATUS_SUCCESS:
        raise RuntimeError(f"cuBLASLt's {call} failed with status {status}")


def _lib() -> ctypes.CDLL:
    found = _library()
    if isinstance(found, str):
        raise RuntimeError(f"cuBLASLt is not usable: {found}")
    return found


@functools.cache
def _handle(device: int) -> ctypes.c_void_p:
    """A cuBLASLt handle made while ``device`` is current (one per device)."""
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        _checked(_lib().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


def outside_graph_pools(make: Callable[[], Tensor], device: int) -> Tensor:
    """``make()`` run on a thread and a stream of its own, and waited for: its tensor comes
    from PyTorch's regular memory, never from a CUDA graph's private pool (a capture or
    ``torch.compile``'s graph trees route the capturing thread's or stream's allocations
    to theirs, which also check that nothing outlives them there), and is ready on every
    stream."""
    made: list[Tensor] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with torch.cuda.device(device):
                stream = torch.cuda.Stream(device)
                with torch.cuda.stream(stream):
                    made.append(make())
                stream.synchronize()
        except BaseException as error:  # raised again in the caller's thread
            failed.append(error)

    thread = threading.Thread(target=run, name="stochround-cublaslt-workspace")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


@functools.cache
def _device_buffer(device: int) -> Tensor:
    """The device's workspace of `WORKSPACE_BYTES`, then a zero fp32 word (beta: the
    output is written, never read), made once outside every graph's pool.  One per
    device: the GEMMs of this route on two streams at once would share it (the layers
    run theirs on the current stream, one after another)."""
    return outside_graph_pools(
        lambda: torch.zeros(WORKSPACE_BYTES + 4, dtype=torch.uint8, device=device), device
    )


class StoredOperand(NamedTuple):
    """How cuBLAS reads a 2-D tensor: column-major rows, columns and leading dimension of
    its memory, and the operation that gives the operand wanted from them."""

    rows: int
    cols: int
    ld: int
    op: int


def stored_operand(t: Tensor, wanted_transposed: bool) -> StoredOperand | None:
    """``t`` (R, C) as cuBLAS's column-major operand of ``t^T`` (``wanted_transposed``) or
    of ``t``: row-major memory holds t^T column-major, column-major memory holds t.  None
    where neither of its strides is 1 (the caller copies it)."""
    (r, c), (s0, s1) = t.shape, t.stride()
    if s1 == 1 and s0 >= max(c, 1):
        rows, cols, ld, holds_transpose = c, r, s0, True
    elif s0 == 1 and s1 >= max(r, 1):
        rows, cols, ld, holds_transpose = r, c, s1, False
    else:
        return None
    op = CUBLAS_OP_N if holds_transpose == wanted_transposed else CUBLAS_OP_T
    return StoredOperand(rows, cols, ld, op)


def alignment(t: Tensor) -> int:
    """The largest power of two up to 16 bytes that ``t``'s address and leading dimension
    share (cuBLASLt's heuristics assume 256 unless told)."""
    row_bytes = max(t.stride()) * t.element_size()
    address = t.data_ptr() | row_bytes | 16
    return address & -address


class AlphaGemmPlan:
    """cuBLASLt's descriptors and chosen algorithm for ``out (M, N) = alpha * a b^T`` of
    one signature: b given as (N, K) (``b_transposed`` False) or as b^T (K, N), the
    operands' stored layouts and alignments, the output dtype, the device."""

    def __init__(
        self,
        a: Tensor,
        b: Tensor,
        b_transposed: bool,
        out_dtype: torch.dtype,
        device: int,
    ) -> None:
        lib = _lib()
        m, n = a.shape[0], b.shape[1 if b_transposed else 0]
        # column-major: out^T (N, M) = op(A) op(B) with A holding b and B holding a^T
        stored_b = stored_operand(b, wanted_transposed=b_transposed)
        stored_a = stored_operand(a, wanted_transposed=True)
        if stored_a is None or stored_b is None:
            raise ValueError("a plan's operands must each have a stride of 1")
        self.handle = _handle(device)
        buffer = _device_buffer(device)
        self.workspace, self.zero = buffer.data_ptr(), buffer.data_ptr() + WORKSPACE_BYTES
        self.desc = ctypes.c_void_p()
        _checked(
            lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate",
        )
        for attribute, value in (
            (DESC_POINTER_MODE, POINTER_MODE_DEVICE),
            (DESC_TRANSA, stored_b.op),
            (DESC_TRANSB, stored_a.op),
        ):
            word = ctypes.c_int32(value)
            _checked(
                lib.cublasLtMatmulDescSetAttribute(self.desc, attribute, ctypes.byref(word), 4),
                "cublasLtMatmulDescSetAttribute",
            )
        self.layouts = [
            self._layout(CUDA_R_16BF, stored_b.rows, stored_b.cols, stored_b.ld),
            self._layout(CUDA_R_16BF, stored_a.rows, stored_a.cols, stored_a.ld),
            self._layout(ALPHA_OUT_DTYPES[out_dtype], n, m, n),
        ]
        self.algo = self._choose(lib, {"a": alignment(b), "b": alignment(a)}, out_dtype)
        self.algo_ref = ctypes.byref(self.algo)
        self.matmul = lib.cublasLtMatmul

    @staticmethod
    def _layout(dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _checked(
            _lib().cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld),
            "cublasLtMatrixLayoutCreate",
        )
        return layout

    def _choose(self, lib: ctypes.CDLL, aligned: dict[str, int], out_dtype: torch.dtype) -> _Algo:
        """cuBLASLt's first heuristic choice for the plan, within the workspace, fp32
        split-K sums and the operands' alignment (the output: 16 bytes, a fresh
        allocation's)."""
        preference = ctypes.c_void_p()
        _checked(
            lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)),
            "cublasLtMatmulPreferenceCreate",
        )
        settings = [
            (PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES)),
            (PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(REDUCTION_SCHEMES)),
            (PREF_MIN_ALIGNMENT["a"], ctypes.c_uint32(aligned["a"])),
            (PREF_MIN_ALIGNMENT["b"], ctypes.c_uint32(aligned["b"])),
            (PREF_MIN_ALIGNMENT["c"], ctypes.c_uint32(16)),
            (PREF_MIN_ALIGNMENT["d"], ctypes.c_uint32(16)),
        ]
        for attribute, value in settings:
            _checked(
                lib.cublasLtMatmulPreferenceSetAttribute(
                    preference, attribute, ctypes.byref(value), ctypes.sizeof(value)
                ),
                "cublasLtMatmulPreferenceSetAttribute",
            )
        result, found = _Heuristic(), ctypes.c_int(0)
        layout_b, layout_a, layout_out = self.layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            self.handle, self.desc, layout_b, layout_a, layout_out, layout_out,
            preference, 1, ctypes.byref(result), ctypes.byref(found),
        )  # fmt: skip
        lib.cublasLtMatmulPreferenceDestroy(preference)
        _checked(status, "cublasLtMatmulAlgoGetHeuristic")
        if found.value < 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for this {out_dtype} GEMM")
        return result.algo

    def __del__(self) -> None:
        """Free the plan's cuBLASLt objects (while the library is still loaded: at the
        interpreter's exit this module's names may already be None)."""
        found = _library() if callable(_library) else None
        if found is None or isinstance(found, str):
            return
        for layout in getattr(self, "layouts", ()):
            found.cublasLtMatrixLayoutDestroy(layout)
        if getattr(self, "desc", None):
            found.cublasLtMatmulDescDestroy(self.desc)

    def __call__(self, a: Tensor, b: Tensor, alpha: Tensor, out: Tensor, device: int) -> None:
        """Write ``alpha * a b^T`` into ``out`` (the plan's signature: not checked here) on
        ``device``'s current stream, with ``device`` made current for the launch where it
        is not."""
        if current_device() != device:
            with torch.cuda.device(device):
                return self(a, b, alpha, out, device)
        stream = torch._C._cuda_getCurrentRawStream(device)
        layout_b, layout_a, layout_out = self.layouts
        _checked(
            self.matmul(
                self.handle, self.desc, alpha.data_ptr(), b.data_ptr(), layout_b,
                a.data_ptr(), layout_a, self.zero, out.data_ptr(), layout_out,
                out.data_ptr(), layout_out, self.algo_ref, self.workspace,
                WORKSPACE_BYTES, stream,
            ),
            "cublasLtMatmul",
        )  # fmt: skip


def has_unit_stride(t: Tensor) -> bool:
    """Whether cuBLAS can read 2-D ``t`` as it lies (`stored_operand`)."""
    return stored_operand(t, wanted_transposed=False) is not None


def alpha_plan_key(a: Tensor, b: Tensor, b_transposed: bool, out_dtype: torch.dtype) -> tuple:
    """What a plan depends on: shapes, strides, alignments, output dtype, device."""
    return (
        a.shape, a.stride(), alignment(a), b.shape, b.stride(), alignment(b),
        b_transposed, out_dtype, a.get_device(),
    )  # fmt: skip


_PLANS: dict[tuple, AlphaGemmPlan] = {}
# plans kept at most (a signature's plan is made again after a clear)
MAX_PLANS = 1024


def alpha_gemm(
    a: Tensor, b: Tensor, alpha: Tensor, out_dtype: torch.dtype, b_transposed: bool = False
) -> Tensor:
    """``round(alpha * a b^T)`` in ``out_dtype`` (bf16 or fp32) of bf16 CUDA ``a`` (M, K)
    and ``b`` (N, K) (or b^T (K, N), ``b_transposed``), ``alpha`` an fp32 element on the
    same device: one cuBLASLt GEMM, its plan made once per signature.  Operands without a
    stride of 1 are copied first."""
    if not a.is_cuda:  # a CPU tensor routed as a CUDA one (`cpu_as_cuda`)
        return _cpu_stand_in(a, b, alpha, out_dtype, b_transposed)
    if not has_unit_stride(a):
        a = a.contiguous()
    if not has_unit_stride(b):
        b = b.contiguous()
    key = alpha_plan_key(a, b, b_transposed, out_dtype)
    plan = _PLANS.get(key)
    device = a.get_device()
    if plan is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = AlphaGemmPlan(a, b, b_transposed, out_dtype, device)
    m, n = a.shape[0], b.shape[1 if b_transposed else 0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    plan(a, b, alpha, out, device)
    return out


def _cpu_stand_in(
    a: Tensor, b: Tensor, alpha: Tensor, out_dtype: torch.dtype, b_transposed: bool
) -> Tensor:
    """`alpha_gemm` of CPU tensors inside `stochround.kernels.availability.cpu_as_cuda`:
    the output allocated as the CUDA route allocates it, then filled outside any dispatch
    mode (a CUDA call dispatches no ATen operation for the GEMM, so a count of a step's
    operations on the CPU stays the GPU's) with the widened operands' fp32 product times
    alpha, rounded once."""
    m, n = a.shape[0], b.shape[1 if b_transposed else 0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    with _disable_current_modes():
        b_t = b if b_transposed else b.T
        product = torch.mm(a.to(torch.float32), b_t.to(torch.float32))
        out.copy_(product * alpha.to(torch.float32).reshape(()))
    return out


__all__ = [
    "ALPHA_OUT_DTYPES",
    "MAX_PLANS",
    "REDUCTION_SCHEMES",
    "WORKSPACE_BYTES",
    "AlphaGemmPlan",
    "StoredOperand",
    "alignment",
    "alpha_gemm",
    "alpha_plan_key",
    "cublaslt_missing",
    "has_unit_stride",
    "outside_graph_pools",
    "stored_operand",
]
