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

import torch
from torch import Tensor

from .tensor import GemmOperand

# torch's mm with an fp32 output for bf16 operands (CUDA only): fp32 accumulation without
# widening the operands first
MM_TO_FP32 = hasattr(torch.ops.aten.mm, "dtype")


def fp32_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` in fp32, accumulated in fp32: ``a`` (M, K), ``b`` (N, K), each bf16 or
    fp32 (a bf16 operand's values are exact in fp32, so widening it changes no product)."""
    if MM_TO_FP32 and a.is_cuda and a.dtype == b.dtype == torch.bfloat16:
        return torch.mm(a, b.T, out_dtype=torch.float32)
    return a.to(torch.float32) @ b.to(torch.float32).T


def scaled_mm(
    a: GemmOperand,
    b: GemmOperand,
    *,
    bias: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``Q(a) Q(b)^T (+ bias)``: ``a.values`` (M, K) and ``b.values`` (N, K) multiplied with
    fp32 accumulation (`fp32_product`), then times ``a.row_scale`` (M, 1) and
    ``b.row_scale`` transposed (1, N), the product of the tensor scales and the factors,
    each in fp32, plus ``bias`` (N,) in fp32, and rounded once to ``out_dtype`` (the last
    of these operations writes it).  Both operands must share their basis (two rotated
    operands: the same rotation, which the product cancels).  TypeError unless ``a`` and
    ``b`` are `GemmOperand` values."""
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
    product = fp32_product(a.values, b.values)
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
    if not steps:
        return product.to(out_dtype)
    for index, (operation, operand) in enumerate(steps):
        last = index == len(steps) - 1
        # the last operation rounds straight into out_dtype: one pass, one rounding
        out = torch.empty_like(product, dtype=out_dtype) if last else None
        function = torch.mul if operation == "mul" else torch.add
        product = function(product, operand, out=out) if last else function(product, operand)
    return product


__all__ = ["MM_TO_FP32", "fp32_product", "scaled_mm"]
