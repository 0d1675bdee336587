"""The emulated block-scaled GEMM: two quantized operands multiplied as a block-scaled
tensor core multiplies them.

A tensor core computes ``D = alpha * sum_k (e_a[k] s_a[k]) (e_b[k] s_b[k])``: each element
times its block's scale, the products accumulated in fp32, and the per-tensor scales in
``alpha``.  `scaled_mm` takes the operands as `stochround.blocks.GemmOperand` values (each
element times its block scale, exact in bf16 for NVFP4 and MXFP4), multiplies them with fp32
accumulation (a bf16 GEMM with an fp32 output on CUDA, an fp32 matmul elsewhere: the same
sums up to their order), then applies the whole-row scales, the tensor scales and
floor-3/4's factor to the result.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ..kernels.availability import (
    check_backend,
    on_kernel_device,
    triton_missing,
    use_kernel,
)
from .scales import exact_floor_log2, power_of_two_fp32
from .tensor import GemmOperand

# torch's mm with an fp32 output for bf16 operands (CUDA only): fp32 accumulation without
# widening the operands first
MM_TO_FP32 = hasattr(torch.ops.aten.mm, "dtype")

# what cuBLAS rounds an unscaled product of bf16 operands to itself (`rounded_matmul`)
ROUNDED_OUT_DTYPES = (torch.bfloat16, torch.float32)

# bf16's exponent range: its smallest subnormal is 2**-133 (the lowest bit it holds), its
# largest binade 2**127
BF16_LOWEST_BIT = -133
BF16_TOP_BINADE = 127


def bf16_row_shifts(values: Tensor, mbits: int) -> Tensor:
    """Per row of fp32 ``values`` (M, K) whose values have at most ``mbits + 1``
    significant bits (an element of ``mbits`` mantissa bits times a power of two): the
    power-of-two exponent s (int32, (M, 1)) that makes ``values * 2**s`` exact in bf16:
    ``s = max(0, -133 + mbits - floor(log2 min|v|))`` over the row's nonzero values (its
    lowest bit at or above bf16's smallest subnormal), capped at ``127 - floor(log2
    max|v|)`` so that no value overflows.  Where the cap binds (a row spanning more than
    about 2**250) the row's smallest values round (docs/guide/recipes.md)."""
    magnitude = values.abs()
    # a NaN takes no part (it stays NaN at any shift)
    largest = torch.where(magnitude.isnan(), 0.0, magnitude).amax(dim=1, keepdim=True)
    smallest = torch.where(magnitude > 0, magnitude, torch.inf).amin(dim=1, keepdim=True)
    finite = torch.isfinite(smallest)
    need = torch.where(finite, BF16_LOWEST_BIT + mbits - exact_floor_log2(smallest), 0)
    room = torch.where(
        torch.isfinite(largest) & (largest > 0),
        BF16_TOP_BINADE - exact_floor_log2(largest),
        BF16_TOP_BINADE,
    )
    return torch.minimum(need.clamp(min=0), room).to(torch.int32)


def exact_bf16_operand(operand: GemmOperand, mbits: int) -> GemmOperand:
    """The operand with fp32 values of at most ``mbits + 1`` significant bits (MXFP8's
    e4m3/e5m2 elements times E8M0 scales) as bf16 values, exact: each row times ``2**s``
    (`bf16_row_shifts`) and ``2**-s`` moved into the row scale, so that a bf16 GEMM with
    fp32 accumulation computes the fp32 GEMM's products exactly (the same sums up to their
    order).  By the Triton kernel for a CUDA tensor (`stochround.kernels.operand_bf16`;
    traced by torch.compile, through the opaque op `exact_bf16_rows_op`), else by PyTorch;
    the same bits."""
    values = operand.values
    if values.dtype != torch.float32 or values.dim() != 2:
        raise ValueError(
            f"operand.values must be 2-D fp32; got {values.dtype} {tuple(values.shape)}"
        )
    if on_kernel_device(values):
        # eager calls launch directly: the op's dispatch is host time they need not pay
        rows = exact_bf16_rows_op if torch.compiler.is_compiling() else run_exact_bf16_rows
        shifted, unshift = rows(values, mbits)
    else:
        shifts = bf16_row_shifts(values, mbits)
        shifted = (values * power_of_two_fp32(shifts)).to(torch.bfloat16)
        unshift = power_of_two_fp32(-shifts)
    row_scale = unshift if operand.row_scale is None else unshift * operand.row_scale
    return operand._replace(values=shifted, row_scale=row_scale)


def run_exact_bf16_rows(values: Tensor, mbits: int) -> tuple[Tensor, Tensor]:
    """`stochround.kernels.operand_bf16.exact_bf16_rows` of fp32 ``values`` (M, K): the
    bf16 ``values * 2**s`` and the fp32 ``2**-s`` (M, 1), ``s`` per row by
    `bf16_row_shifts`."""
    from ..kernels.operand_bf16 import exact_bf16_rows  # needs triton: imported here

    return exact_bf16_rows(values, mbits)


# The kernel as one opaque op under torch.compile: Dynamo cannot trace a Triton launch of
# the kernels' runtime, and the kernel reads each row once for its extremes and its shifted
# values where inductor would make two reductions and a pointwise pass of the PyTorch path.
# The op runs the eager function: eager's bits.
exact_bf16_rows_op = torch.library.custom_op(
    "stochround::exact_bf16_rows", run_exact_bf16_rows, mutates_args=()
)


@exact_bf16_rows_op.register_fake
def _(values: Tensor, mbits: int) -> tuple[Tensor, Tensor]:
    shifted = torch.empty_like(values, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
    return shifted, values.new_empty((values.shape[0], 1))


def fp32_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` in fp32, accumulated in fp32: ``a`` (M, K), ``b`` (N, K), each bf16 or
    fp32 (a bf16 operand's values are exact in fp32, so widening it changes no product).
    Traced (torch.compile), ``out_dtype`` is taken for CUDA tensors alone: inductor lowers
    it for no other device (`stochround.kernels.availability.cpu_as_cuda`'s CPU tensors
    take the widened product, the one `cpu_as_cuda` supplies for their eager call)."""
    return fp32_matmul(a, b.T)


def fp32_matmul(a: Tensor, b_t: Tensor) -> Tensor:
    """``a @ b_t`` in fp32, accumulated in fp32: `fp32_product` of ``a`` (M, K) and ``b``
    given as its transpose ``b_t`` (K, N) — a GEMM that holds b^T (dgrad's Q(W), kept from
    fprop) makes no view of it.  ``b_t.to(fp32)`` keeps b_t's strides (a dense tensor's),
    so the product is `fp32_product`'s bit for bit."""
    kernel_device = a.is_cuda if torch.compiler.is_compiling() else on_kernel_device(a)
    if MM_TO_FP32 and kernel_device and a.dtype == b_t.dtype == torch.bfloat16:
        return torch.mm(a, b_t, out_dtype=torch.float32)
    return a.to(torch.float32) @ b_t.to(torch.float32)


def unscaled(a: GemmOperand, b: GemmOperand, bias: Tensor | None) -> bool:
    """Whether the product of ``a`` and ``b`` takes no scaling and no bias: no row or
    tensor scales (NVFP4's "pow2" operands hold theirs), factors 1."""
    scales = (a.row_scale, b.row_scale, a.tensor_scale, b.tensor_scale, bias)
    return all(scale is None for scale in scales) and a.factor == b.factor == 1.0


@contextlib.contextmanager
def fp32_reductions() -> Iterator[None]:
    """cuBLAS's reduced-precision reductions of bf16 GEMMs (split-K partial sums in the
    output's dtype, which PyTorch allows by default) disallowed: the fp32 sums rounded
    once to the output."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def rounded_matmul(a: Tensor, b_t: Tensor, out_dtype: torch.dtype) -> Tensor:
    """``a @ b_t`` of bf16 CUDA operands with fp32 accumulation, rounded once to
    ``out_dtype`` (bf16 or fp32) by cuBLAS itself: `fp32_matmul`'s product cast, with no
    pass over the result (`unscaled` products)."""
    if out_dtype == torch.float32 or not a.is_cuda:  # elsewhere: the fp32 product, cast
        return fp32_matmul(a, b_t).to(out_dtype)
    with fp32_reductions():
        return torch.mm(a, b_t)


def native_fp8_mm(
    a: GemmOperand,
    b: GemmOperand,
    *,
    bias: Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """``Q(a) Q(b)^T (+ bias)`` on the FP8 tensor cores (``torch._scaled_mm``): ``a.values``
    (M, K) and ``b.values`` (N, K) float8 (at most one of them e5m2) with their per-tensor
    fp32 scales.  What the hardware computes: its own accumulation and rounding of the
    result, not `scaled_mm`'s exact products summed in fp32 (docs/guide/recipes.md).
    Dimensions must be multiples of 16 (ValueError otherwise)."""
    for name, given in (("a", a), ("b", b)):
        values = given.values
        if values.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or values.dim() != 2:
            raise ValueError(f"{name}.values must be a 2-D float8 tensor; got {values.dtype}")
        if given.tensor_scale is None or given.row_scale is not None or given.factor != 1.0:
            raise ValueError(f"{name} must carry one per-tensor scale and nothing else")
    (m, k), n = a.values.shape, b.values.shape[0]
    if m % 16 or k % 16 or n % 16:
        raise ValueError(f"FP8 GEMMs take dimensions that are multiples of 16; got {m}x{k}x{n}")
    # cuBLAS adds a bias in the epilogue of a 16-bit output only; an fp32 output's sum
    # with the bias is the same fp32 addition done after
    epilogue_bias = bias is not None and out_dtype != torch.float32
    product = torch._scaled_mm(
        a.values,
        b.values.t(),  # column-major, as the tensor cores read the second operand
        scale_a=a.tensor_scale.reshape(()),  # type: ignore[union-attr]
        scale_b=b.tensor_scale.reshape(()),  # type: ignore[union-attr]
        bias=bias.to(out_dtype) if epilogue_bias else None,  # type: ignore[union-attr]
        out_dtype=out_dtype,
        use_fast_accum=False,
    )
    if bias is not None and not epilogue_bias:
        product.add_(bias.to(out_dtype))
    return product


def epilogue_fields(
    a: GemmOperand, b: GemmOperand, bias: Tensor | None, out_dtype: torch.dtype
) -> tuple[Any, ...]:
    """The fields of `stochround.kernels.scaled_gemm.Epilogue` (its order) that scale the
    product of ``a`` and ``b``: row scales, tensor scales, factors, bias, dtype."""
    return (
        a.row_scale, b.row_scale, a.tensor_scale, b.tensor_scale, a.factor, b.factor, bias,
        out_dtype,
    )  # fmt: skip


def kernel_scaled_mm(
    a: GemmOperand, b: GemmOperand, bias: Tensor | None, out_dtype: torch.dtype, backend: str
) -> Tensor | None:
    """`scaled_mm` by the kernels (`stochround.kernels.scaled_gemm`), or None where
    `use_kernel` leaves it to the PyTorch path: bf16 operands, the GEMM with the scales in
    its epilogue, or cuBLAS: cuBLASLt's GEMM scaled in its own epilogue where tensor scales
    are all there is, else its fp32 product and one epilogue pass, as
    `stochround.kernels.scaled_gemm.gemm_kernel` and ``cublas_route`` choose; an `unscaled`
    product taken by cuBLAS alone (`rounded_matmul`) where the GEMM is not the kernels'."""
    on_cuda = a.values.is_cuda
    missing = triton_missing()
    if missing is not None:
        use_kernel(backend, "a.values", on_cuda, missing)  # raises for backend="triton"
        return None
    from ..kernels import scaled_gemm as kernels  # needs triton: imported here

    epilogue = kernels.Epilogue(*epilogue_fields(a, b, bias, out_dtype))
    refusal = kernels.scaled_gemm_refusal(a.values, b.values, epilogue)
    if not use_kernel(backend, "a.values", on_cuda, refusal):
        return None
    (m, k), n = a.values.shape, b.values.shape[0]
    if kernels.gemm_kernel(m, n, k) == "triton_gemm":
        return kernels.scaled_gemm(a.values, b.values, epilogue)
    if unscaled(a, b, bias) and out_dtype in ROUNDED_OUT_DTYPES:
        return rounded_matmul(a.values, b.values.T, out_dtype)
    if kernels.cublas_route(a.values, b.values, epilogue) == "device_alpha":
        return kernels.alpha_scaled_gemm(a.values, b.values, epilogue)
    return kernels.fused_epilogue(fp32_product(a.values, b.values), epilogue)


def run_kernel_scaled_mm(
    a_values: Tensor,
    a_tensor_scale: Tensor | None,
    a_row_scale: Tensor | None,
    a_factor: float,
    b_values: Tensor,
    b_tensor_scale: Tensor | None,
    b_row_scale: Tensor | None,
    b_factor: float,
    bias: Tensor | None,
    out_dtype: torch.dtype,
) -> Tensor:
    """`scaled_mm` of CUDA operands given field by field, as eager computes it
    (`kernel_scaled_mm_op`'s body: not traced, so `scaled_mm` takes its eager route)."""
    a = GemmOperand(a_values, a_tensor_scale, a_row_scale, a_factor)
    b = GemmOperand(b_values, b_tensor_scale, b_row_scale, b_factor)
    return scaled_mm(a, b, bias=bias, out_dtype=out_dtype)


# Traced on CUDA, `scaled_mm` is this one opaque op: eager's kernels and their choice of
# GEMM, so that a compiled step has eager's bits (inductor's code of the PyTorch sequence
# sums in cuBLAS's order where the kernels' Triton GEMM sums in its own)
kernel_scaled_mm_op = torch.library.custom_op(
    "stochround::kernel_scaled_mm", run_kernel_scaled_mm, mutates_args=()
)


@kernel_scaled_mm_op.register_fake
def _(
    a_values: Tensor,
    a_tensor_scale: Tensor | None,
    a_row_scale: Tensor | None,
    a_factor: float,
    b_values: Tensor,
    b_tensor_scale: Tensor | None,
    b_row_scale: Tensor | None,
    b_factor: float,
    bias: Tensor | None,
    out_dtype: torch.dtype,
) -> Tensor:
    return a_values.new_empty((a_values.shape[0], b_values.shape[0]), dtype=out_dtype)


def scaled_mm(
    a: GemmOperand,
    b: GemmOperand,
    *,
    bias: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    backend: str = "auto",
) -> Tensor:
    """``Q(a) Q(b)^T (+ bias)``: ``a.values`` (M, K) and ``b.values`` (N, K) multiplied with
    fp32 accumulation (`fp32_product`), then times ``a.row_scale`` (M, 1) and
    ``b.row_scale`` transposed (1, N), the product of the tensor scales and the factors,
    each in fp32, plus ``bias`` (N,) in fp32, and rounded once to ``out_dtype`` (the last
    of these operations writes it).  Both operands must share their basis (two rotated
    operands: the same rotation, which the product cancels).  TypeError unless ``a`` and
    ``b`` are `GemmOperand` values.

    ``backend``: "auto" scales bf16 CUDA operands' product by the kernels (a bf16 GEMM with
    the scaling in its epilogue, or cuBLAS's product and one pass: the same scaling, bit
    for bit, of sums in another order), "torch" by the PyTorch sequence above, "triton" by
    the kernels or a ValueError saying why they cannot.  A traced call (torch.compile)
    takes the PyTorch sequence, which the compiler fuses; on CUDA the kernels' own choice
    as one opaque op (`kernel_scaled_mm_op`), eager's bits."""
    for name, given in (("a", a), ("b", b)):
        if not isinstance(given, GemmOperand):
            raise TypeError(
                f"{name} must be a GemmOperand: sr.blocks.gemm_operand(x, fmt) of a tensor, or "
                f"sr.blocks.gemm_operand_of(q) of a BlockTensor; got {type(given).__name__}"
            )
    if a.values.dim() != 2 or b.values.dim() != 2 or a.values.shape[1] != b.values.shape[1]:
        raise ValueError(
            "a and b must be 2-D with the contraction axis last and of one length; got "
            f"{tuple(a.values.shape)} and {tuple(b.values.shape)}"
        )
    backend = check_backend(backend)
    wanted = backend == "triton" or (backend == "auto" and on_kernel_device(a.values))
    if wanted and torch.compiler.is_compiling() and a.values.is_cuda:
        # the kernels' own choice as one opaque op: at small sizes they sum in a Triton
        # GEMM's order, which the traced cuBLAS product would not give
        return typing.cast(Tensor, kernel_scaled_mm_op(*a, *b, bias, out_dtype))
    if wanted and not torch.compiler.is_compiling():
        result = kernel_scaled_mm(a, b, bias, out_dtype, backend)
        if result is not None:
            return result
    return torch_scaled_mm(a, b, bias, out_dtype)


class PreparedScaledMm:
    """`scaled_mm` (backend "auto", eager) of operands of one signature — the shapes and
    dtypes of the example ``a``, ``b``, ``bias`` and ``out_dtype``, and which of their
    scales are present — with its route chosen once: the kernels' prepared GEMM
    (`stochround.kernels.scaled_gemm.PreparedScaledGemm`) where they serve it (an
    `unscaled` product outside their GEMM's sizes: cuBLAS alone, `rounded_matmul`), else
    the PyTorch path.  The same bits as `scaled_mm`; a caller's plan keeps the
    signature."""

    def __init__(
        self, a: GemmOperand, b: GemmOperand, bias: Tensor | None, out_dtype: torch.dtype
    ) -> None:
        self.kernel: Any = None
        self.epilogue: Any = None
        self.rounded = False  # an unscaled product by cuBLAS alone (`rounded_matmul`)
        if not on_kernel_device(a.values) or triton_missing() is not None:
            return
        from ..kernels import scaled_gemm as kernels  # needs triton: imported here

        epilogue = kernels.Epilogue(*epilogue_fields(a, b, bias, out_dtype))
        (m, k), n = a.values.shape, b.values.shape[0]
        refusal = kernels.scaled_gemm_refusal(a.values, b.values, epilogue)
        if refusal is None and unscaled(a, b, bias) and out_dtype in ROUNDED_OUT_DTYPES:
            self.rounded = kernels.gemm_kernel(m, n, k) != "triton_gemm"
        if refusal is None and not self.rounded:
            self.kernel = kernels.PreparedScaledGemm(a.values, b.values, epilogue, fp32_matmul)
            self.epilogue = kernels.Epilogue

    def __call__(
        self,
        a: GemmOperand,
        b: GemmOperand,
        bias: Tensor | None,
        out_dtype: torch.dtype,
        transposed: bool = False,
    ) -> Tensor:
        """``Q(a) Q(b)^T (+ bias)`` as `scaled_mm` computes it.  ``transposed``: b's values
        given as their transpose (K, N), which the kernels read as they are (no view; the
        PyTorch path takes the transposed view)."""
        if self.rounded:
            return rounded_matmul(a.values, b.values if transposed else b.values.T, out_dtype)
        if self.kernel is None:
            if transposed:
                b = b.transposed_values()
            return torch_scaled_mm(a, b, bias, out_dtype)
        epilogue = self.epilogue(*epilogue_fields(a, b, bias, out_dtype))
        return typing.cast(Tensor, self.kernel(a.values, b.values, epilogue, transposed))


def torch_scaled_mm(
    a: GemmOperand, b: GemmOperand, bias: Tensor | None, out_dtype: torch.dtype
) -> Tensor:
    """`scaled_mm` by PyTorch: `fp32_product`, then `scale_product`."""
    return scale_product(fp32_product(a.values, b.values), a, b, bias, out_dtype)


def scale_product(
    product: Tensor, a: GemmOperand, b: GemmOperand, bias: Tensor | None, out_dtype: torch.dtype
) -> Tensor:
    """The fp32 ``product`` of ``a`` and ``b``'s values scaled as `scaled_mm` says, in
    PyTorch passes (the last writes ``out_dtype``): the executable spec of
    `stochround.kernels.scaled_gemm`."""
    steps: list[tuple[str, Tensor | float]] = []
    if a.row_scale is not None:
        steps.append(("mul", a.row_scale))
    if b.row_scale is not None:
        steps.append(("mul", b.row_scale.T))
    scales = [scale for scale in (a.tensor_scale, b.tensor_scale) if scale is not None]
    if scales:  # one product of the two, as a tensor core's alpha
        steps.append(("mul", scales[0] * scales[1] if len(scales) == 2 else scales[0]))
    steps += [("mul", factor) for factor in (a.factor, b.factor) if factor != 1.0]
    if bias is not None:
        steps.append(("add", bias.to(torch.float32)))
    # eagerly the last operation writes out_dtype itself (one pass); traced, no out=
    # argument (torch 2.11's Dynamo lost the gradient of an autograd.Function whose output
    # an out= op wrote): the fp32 result cast, the same one rounding
    into = not torch.compiler.is_compiling()
    for index, (operation, operand) in enumerate(steps):
        last = index == len(steps) - 1
        function = torch.mul if operation == "mul" else torch.add
        if last and into:
            out = torch.empty_like(product, dtype=out_dtype)
            product = function(product, operand, out=out)
        else:
            product = function(product, operand)
    return product if product.dtype == out_dtype else product.to(out_dtype)


__all__ = [
    "MM_TO_FP32",
    "ROUNDED_OUT_DTYPES",
    "PreparedScaledMm",
    "bf16_row_shifts",
    "epilogue_fields",
    "exact_bf16_operand",
    "exact_bf16_rows_op",
    "fp32_matmul",
    "fp32_product",
    "fp32_reductions",
    "kernel_scaled_mm",
    "native_fp8_mm",
    "power_of_two_fp32",
    "run_exact_bf16_rows",
    "scale_product",
    "scaled_mm",
    "torch_scaled_mm",
    "unscaled",
]
