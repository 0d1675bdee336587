"""`stochround.blocks.scaled_mm`'s scaling of the product in one pass: a bf16 GEMM with the
scales in its epilogue (`scaled_gemm`), cuBLASLt's bf16 GEMM scaled in its own epilogue
where the tensor scales are all there is to apply (`alpha_scaled_gemm`), or cuBLAS's fp32
product then one elementwise kernel (`fused_epilogue`); `gemm_kernel` and `cublas_route`
choose.

The spec is `scaled_mm`'s PyTorch sequence over the fp32 product ``P = A B^T``, each
operation rounded in fp32, in this order::

    P * row_a          (M, 1)      a's whole-row scales
      * row_b^T        (1, N)      b's whole-row scales
      * (sa * sb)      one fp32    the tensor scales' product (or the one present)
      * factor_a * factor_b        Python floats, each rounded to fp32 first, as PyTorch does
      + bias           (N,)        widened to fp32
    -> out_dtype                   round to nearest even, once

Each step an `Epilogue` lacks is skipped; a factor of 1.0 is multiplied all the same
(``x * 1`` is x).  Kernels are compiled without fused multiply-adds, so that ``x * f + b``
rounds twice, as the sequence does.  A 16-bit result is narrowed with integer operations
(`stochround.kernels.common.narrow_to_16_bits`: subnormals kept in the interpreter too; a
NaN becomes the canonical NaN, whose payload the spec leaves open).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .availability import INTERPRETED, current_device, on_kernel_device
from .common import fp32_bits_of, narrow_to_16_bits
from .cublaslt import ALPHA_OUT_DTYPES, alpha_gemm, cublaslt_missing
from .runtime import bound_launch

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class GemmConfig(NamedTuple):
    """The GEMM's tile and schedule: a (block_m, block_n) tile of the result per program,
    K in steps of block_k, programs grouped group_m tiles deep along M (the tiles running
    together share their rows of A and columns of B in L2), Triton's warps and pipeline
    stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


# Hopper: two warpgroups per tile, three or four stages of loads in flight; the wide tile
# where the result has enough tiles of it to fill the GPU, the square one below that
WIDE_TILE = GemmConfig(128, 256, 64, 8, 8, 3)
SQUARE_TILE = GemmConfig(128, 128, 64, 8, 8, 4)
# tiles of the wide shape a result needs for it (about one per multiprocessor of an H100 or
# H200)
WIDE_TILES = 128
# the epilogue pass's tile (row-major, 16-byte fp32 loads per thread)
EPILOGUE_BLOCK_M = 16
EPILOGUE_BLOCK_N = 256
EPILOGUE_WARPS = 8

# which kernel serves a call: the bf16 GEMM with the scales fused, or cuBLAS (`CUBLAS_ROUTES`)
GEMM_KERNELS = ("triton_gemm", "fused_epilogue")
# cuBLAS's: its bf16 GEMM scaled by a device-side alpha, or its fp32 product and the pass
CUBLAS_ROUTES = ("device_alpha", "fused_epilogue")


class Epilogue(NamedTuple):
    """What scales an (M, N) fp32 product, in the module docstring's order: ``row_a``
    (fp32, M elements), ``row_b`` (fp32, N elements), ``scale_a`` and ``scale_b`` (fp32,
    one element each), ``factor_a`` and ``factor_b``, ``bias`` (N elements, a float
    dtype) and the result's dtype; None where a step is absent."""

    row_a: Tensor | None
    row_b: Tensor | None
    scale_a: Tensor | None
    scale_b: Tensor | None
    factor_a: float
    factor_b: float
    bias: Tensor | None
    out_dtype: torch.dtype


def epilogue_refusal(epilogue: Epilogue, rows: int, cols: int) -> str | None:
    """Why the kernels cannot scale an (rows, cols) product by ``epilogue`` (None if they
    can): fp32 scales of the product's lengths, a float bias of cols elements, an
    out_dtype in `OUT_DTYPES`."""
    if epilogue.out_dtype not in OUT_DTYPES:
        return f"out_dtype must be one of {OUT_DTYPES} for the kernels; got {epilogue.out_dtype}"
    named = (
        ("a.row_scale", epilogue.row_a, rows),
        ("b.row_scale", epilogue.row_b, cols),
        ("a.tensor_scale", epilogue.scale_a, 1),
        ("b.tensor_scale", epilogue.scale_b, 1),
    )
    for name, scale, length in named:
        if scale is not None and (scale.dtype != torch.float32 or scale.numel() != length):
            return f"{name} must be fp32 with {length} elements for the kernels"
    bias = epilogue.bias
    if bias is not None and (not bias.is_floating_point() or bias.numel() != cols):
        return f"bias must be a float tensor of {cols} elements for the kernels"
    return None


def scaled_gemm_refusal(a: Tensor, b: Tensor, epilogue: Epilogue) -> str | None:
    """Why no kernel serves ``a @ b.T`` scaled by ``epilogue`` (None if one can): bf16
    2-D operands of one contraction length on one device, and an epilogue the kernels
    take (`epilogue_refusal`).  fp32 operands keep the PyTorch path."""
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return f"a.values and b.values must be bf16 for the kernels; got {a.dtype}, {b.dtype}"
    tensors = [a, b, *(t for t in epilogue if isinstance(t, Tensor))]
    if any(t.device != a.device for t in tensors):
        return "the operands, their scales and the bias must lie on one device"
    return epilogue_refusal(epilogue, a.shape[0], b.shape[0])


def gemm_config(m: int, n: int) -> GemmConfig:
    """The tile of an (m, n) result: `WIDE_TILE` where the result holds `WIDE_TILES` of
    them and its width is a multiple of the tile's, `SQUARE_TILE` elsewhere."""
    wide = WIDE_TILE.block_m * WIDE_TILE.block_n
    if n % WIDE_TILE.block_n == 0 and m * n >= WIDE_TILES * wide:
        return WIDE_TILE
    return SQUARE_TILE


# the largest m * n * k the fused GEMM serves: above it cuBLAS with the epilogue pass was
# faster (benchmarks/RESULTS.md, bench_gemm and bench_model)
FUSED_GEMM_LIMIT = 2**31


def gemm_kernel(m: int, n: int, k: int) -> str:
    """The kernel (one of `GEMM_KERNELS`) that serves an (m, k) x (n, k)^T product: the
    fused GEMM where its tile (`gemm_config`) divides every dimension (no masked tiles) and
    the product is small (one launch instead of two, where a step is bound by its
    launches), cuBLAS and the epilogue pass elsewhere (cuBLAS's GEMM beats the fused one on
    large products by more than the pass costs: benchmarks/RESULTS.md, bench_gemm)."""
    config = gemm_config(m, n)
    tiled = m % config.block_m == 0 and n % config.block_n == 0 and k % config.block_k == 0
    small = m * n * k <= FUSED_GEMM_LIMIT
    return "triton_gemm" if tiled and k > 0 and small else "fused_epilogue"


def alpha_refusal(a: Tensor, b: Tensor, epilogue: Epilogue) -> str | None:
    """Why cuBLASLt cannot apply ``epilogue`` itself to the product of ``a`` and ``b`` (None
    if it can): non-empty CUDA operands, one or two tensor scales and nothing else (no row
    scales, no bias, factors 1: one multiplication by their fp32 product, as the spec's),
    a bf16 or fp32 result, cuBLASLt loaded (`stochround.kernels.cublaslt`; CPU tensors
    inside `cpu_as_cuda` take its stand-in)."""
    if not on_kernel_device(a) or not a.numel() or not b.numel():
        return "the operands are empty or not on a CUDA device"
    if epilogue.out_dtype not in ALPHA_OUT_DTYPES:
        return f"out_dtype must be one of {tuple(ALPHA_OUT_DTYPES)}; got {epilogue.out_dtype}"
    rows = (epilogue.row_a, epilogue.row_b, epilogue.bias)
    if any(t is not None for t in rows) or epilogue.factor_a != 1.0 or epilogue.factor_b != 1.0:
        return "row scales, a bias and factors other than 1 need the epilogue pass"
    if epilogue.scale_a is None and epilogue.scale_b is None:
        return "an unscaled product is cuBLAS's plain GEMM"
    return cublaslt_missing() if a.is_cuda else None


def cublas_route(a: Tensor, b: Tensor, epilogue: Epilogue) -> str:
    """The route (one of `CUBLAS_ROUTES`) of a product that `gemm_kernel` leaves to cuBLAS:
    "device_alpha" where cuBLASLt applies the epilogue (`alpha_refusal`), else
    "fused_epilogue"."""
    return "device_alpha" if alpha_refusal(a, b, epilogue) is None else "fused_epilogue"


def alpha_scaled_gemm(a: Tensor, b: Tensor, epilogue: Epilogue, transposed: bool = False) -> Tensor:
    """``a @ b.T`` of bf16 CUDA ``a`` (M, K) and ``b`` (N, K) (b^T (K, N) where
    ``transposed``) times the epilogue's tensor scales (their fp32 product where there are
    two, as the spec rounds it) in cuBLASLt's epilogue, rounded once to ``out_dtype``: the
    spec's bits over cuBLAS's sums (`alpha_refusal` says where it serves)."""
    present = [s for s in (epilogue.scale_a, epilogue.scale_b) if s is not None]
    alpha = present[0] if len(present) == 1 else torch.mul(present[0], present[1])
    return alpha_gemm(a, b, alpha, epilogue.out_dtype, transposed)


@triton.jit
def scale_tile(
    acc,
    rows,
    cols,
    row_mask,
    col_mask,
    row_a_ptr,
    row_b_ptr,
    scale_a_ptr,
    scale_b_ptr,
    factor_a,
    factor_b,
    bias_ptr,
    HAS_ROW_A: tl.constexpr,
    HAS_ROW_B: tl.constexpr,
    SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """An fp32 tile of the product scaled as the module docstring says (SCALES: how many
    tensor scales are present)."""
    if HAS_ROW_A:
        acc = acc * tl.load(row_a_ptr + rows, mask=row_mask, other=1.0)[:, None]
    if HAS_ROW_B:
        acc = acc * tl.load(row_b_ptr + cols, mask=col_mask, other=1.0)[None, :]
    if SCALES == 2:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    elif SCALES == 1:
        acc = acc * tl.load(scale_a_ptr)
    acc = acc * factor_a
    acc = acc * factor_b
    if HAS_BIAS:
        bias = fp32_bits_of(tl.load(bias_ptr + cols, mask=col_mask, other=0.0))
        acc = acc + bias.to(tl.float32, bitcast=True)[None, :]
    return acc


@triton.jit
def store_tile(out_ptr, offsets, acc, mask):
    """Store an fp32 tile in the output's dtype, rounded to nearest even."""
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    if dtype == tl.float32:
        tl.store(out_ptr + offsets, acc, mask=mask)
    else:
        nan: tl.constexpr = 0x7FC0 if dtype == tl.bfloat16 else 0x7E00
        bits = acc.to(tl.int32, bitcast=True)
        tl.store(out_ptr + offsets, narrow_to_16_bits(bits, dtype, nan), mask=mask)


@triton.jit
def _scaled_gemm_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    row_a_ptr,
    row_b_ptr,
    scale_a_ptr,
    scale_b_ptr,
    bias_ptr,
    factor_a,
    factor_b,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_MN: tl.constexpr,
    EVEN_K: tl.constexpr,
    LOOP_K: tl.constexpr,
    HAS_ROW_A: tl.constexpr,
    HAS_ROW_B: tl.constexpr,
    SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP_M tile rows walked column by column
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # rows and columns past the end read a valid row (their results are not stored); whole
    # tiles keep their offsets plain, whose contiguity the compiler sees for wide loads
    a_rows = (rows if EVEN_MN else rows % M).to(tl.int64)
    b_cols = (cols if EVEN_MN else cols % N).to(tl.int64)
    a_tile = a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + b_cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the interpreter's loops need a constant trip count (LOOP_K); a GPU reads K
    for first in range(0, LOOP_K if LOOP_K > 0 else K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_tile)
            b = tl.load(b_tile)
        else:
            left = K - first
            a = tl.load(a_tile, mask=ks[None, :] < left, other=0.0)
            b = tl.load(b_tile, mask=ks[:, None] < left, other=0.0)
        if LOOP_K > 0:  # the interpreter multiplies bf16 tiles' raw bits: widen them
            a = fp32_bits_of(a).to(tl.float32, bitcast=True)
            b = fp32_bits_of(b).to(tl.float32, bitcast=True)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    row_mask = rows < M
    col_mask = cols < N
    acc = scale_tile(
        acc,
        rows,
        cols,
        row_mask,
        col_mask,
        row_a_ptr,
        row_b_ptr,
        scale_a_ptr,
        scale_b_ptr,
        factor_a,
        factor_b,
        bias_ptr,
        HAS_ROW_A,
        HAS_ROW_B,
        SCALES,
        HAS_BIAS,
    )
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
    store_tile(out_ptr, offsets, acc, row_mask[:, None] & col_mask[None, :])


@triton.jit
def _epilogue_kernel(
    product_ptr,
    out_ptr,
    row_a_ptr,
    row_b_ptr,
    scale_a_ptr,
    scale_b_ptr,
    bias_ptr,
    factor_a,
    factor_b,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ROW_A: tl.constexpr,
    HAS_ROW_B: tl.constexpr,
    SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    rows = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
    acc = tl.load(product_ptr + offsets, mask=mask, other=0.0)
    acc = scale_tile(
        acc,
        rows,
        cols,
        row_mask,
        col_mask,
        row_a_ptr,
        row_b_ptr,
        scale_a_ptr,
        scale_b_ptr,
        factor_a,
        factor_b,
        bias_ptr,
        HAS_ROW_A,
        HAS_ROW_B,
        SCALES,
        HAS_BIAS,
    )
    store_tile(out_ptr, offsets, acc, mask)


def _epilogue_arguments(epilogue: Epilogue, stand_in: Tensor) -> tuple[tuple, dict[str, object]]:
    """(the kernels' epilogue pointers and factors, their constexprs): absent tensors
    passed as ``stand_in`` (never read), tensor scales in the order present."""
    scales = [s for s in (epilogue.scale_a, epilogue.scale_b) if s is not None]
    pointers = (
        stand_in if epilogue.row_a is None else epilogue.row_a,
        stand_in if epilogue.row_b is None else epilogue.row_b,
        scales[0] if scales else stand_in,
        scales[1] if len(scales) == 2 else stand_in,
        stand_in if epilogue.bias is None else epilogue.bias,
        float(epilogue.factor_a),
        float(epilogue.factor_b),
    )
    constants: dict[str, object] = {
        "HAS_ROW_A": epilogue.row_a is not None,
        "HAS_ROW_B": epilogue.row_b is not None,
        "SCALES": len(scales),
        "HAS_BIAS": epilogue.bias is not None,
        "enable_fp_fusion": False,  # x * f + b rounds twice, as the spec does
    }
    return pointers, constants


def _contiguous(epilogue: Epilogue) -> Epilogue:
    """The epilogue's tensors as contiguous vectors: themselves where they are contiguous
    already (the kernels read them through their pointers alone, whatever their shape: a
    view would be one more operation a call), else flattened copies."""

    def flat(t: Tensor | None) -> Tensor | None:
        if t is None or t.is_contiguous():
            return t
        return t.reshape(-1).contiguous()

    return epilogue._replace(
        row_a=flat(epilogue.row_a),
        row_b=flat(epilogue.row_b),
        scale_a=flat(epilogue.scale_a),
        scale_b=flat(epilogue.scale_b),
        bias=flat(epilogue.bias),
    )


def fused_epilogue(product: Tensor, epilogue: Epilogue) -> Tensor:
    """The (M, N) fp32 ``product`` scaled by ``epilogue`` (module docstring) in one pass:
    an ``out_dtype`` tensor bit-identical to `stochround.blocks.scaled_mm`'s sequence (up to
    NaN payloads)."""
    product = product.contiguous()
    rows, cols = product.shape
    out = torch.empty_like(product, dtype=epilogue.out_dtype)
    if not product.numel():
        return out
    pointers, constants = _epilogue_arguments(_contiguous(epilogue), product)
    row_a, row_b, scale_a, scale_b, bias, factor_a, factor_b = pointers
    constants.update(BLOCK_M=EPILOGUE_BLOCK_M, BLOCK_N=EPILOGUE_BLOCK_N, num_warps=EPILOGUE_WARPS)
    programs = triton.cdiv(rows, EPILOGUE_BLOCK_M) * triton.cdiv(cols, EPILOGUE_BLOCK_N)
    device = current_device() if product.is_cuda else 0
    bound_launch(_epilogue_kernel, tuple(constants.items()))(
        device,
        programs,
        product,
        out,
        row_a,
        row_b,
        scale_a,
        scale_b,
        bias,
        factor_a,
        factor_b,
        rows,
        cols,
    )
    return out


def scaled_gemm(
    a: Tensor, b: Tensor, epilogue: Epilogue, config: GemmConfig | None = None
) -> Tensor:
    """``a @ b.T`` of bf16 ``a`` (M, K) and ``b`` (N, K) (any strides) accumulated in fp32
    and scaled by ``epilogue`` in registers (module docstring): one ``out_dtype`` (M, N)
    tensor, no fp32 product written.  The sums' order differs from cuBLAS's; the scaling
    is the spec's, bit for bit.  ``config``: the tile (`gemm_config`'s by default)."""
    (m, k), n = a.shape, b.shape[0]
    config = gemm_config(m, n) if config is None else config
    out = a.new_empty((m, n), dtype=epilogue.out_dtype)
    if not out.numel():
        return out
    pointers, constants = _epilogue_arguments(_contiguous(epilogue), out)
    row_a, row_b, scale_a, scale_b, bias, factor_a, factor_b = pointers
    constants.update(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        EVEN_MN=m % config.block_m == 0 and n % config.block_n == 0,
        EVEN_K=k % config.block_k == 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    # K as a constexpr under the interpreter only (a GPU reads it at run time: no kernel
    # compiled per length)
    constants["LOOP_K"] = k if INTERPRETED else 0
    programs = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    device = current_device() if a.is_cuda else 0
    bound_launch(_scaled_gemm_kernel, tuple(constants.items()))(
        device,
        programs,
        a,
        b,
        out,
        row_a,
        row_b,
        scale_a,
        scale_b,
        bias,
        factor_a,
        factor_b,
        m,
        n,
        k,
        *a.stride(),
        *b.stride(),
    )
    return out


class PreparedScaledGemm:
    """`scaled_gemm` or `fused_epilogue` (as `gemm_kernel` chooses) of operands of one
    signature: the shapes, the dtypes and which epilogue steps are present, as the example
    ``a``, ``b`` and ``epilogue`` have them, checked (`scaled_gemm_refusal`) and the choice,
    the tile and the bound launch made once, so that a call assembles the pointers alone;
    where cuBLAS serves the product, `cublas_route` chooses once too.  ``product``: the
    fp32 product ``a @ b_t`` of the fused-epilogue route (the caller's cuBLAS GEMM), given
    b transposed (K, N)."""

    def __init__(
        self, a: Tensor, b: Tensor, epilogue: Epilogue, product: Callable[[Tensor, Tensor], Tensor]
    ) -> None:
        refusal = scaled_gemm_refusal(a, b, epilogue)
        if refusal is not None:
            raise ValueError(f"a prepared scaled GEMM runs on the kernels, which refuse: {refusal}")
        (m, k), n = a.shape, b.shape[0]
        self.sizes = (m, n, k)
        self.out_dtype = epilogue.out_dtype
        self.product = product
        self.fused = gemm_kernel(m, n, k) == "triton_gemm"
        self.alpha = not self.fused and cublas_route(a, b, epilogue) == "device_alpha"
        self.presence = tuple(t is None for t in epilogue if not isinstance(t, (float, int)))
        _, constants = _epilogue_arguments(epilogue, a)
        if self.fused:
            config = gemm_config(m, n)
            constants.update(
                BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                GROUP_M=config.group_m, EVEN_MN=m % config.block_m == 0 and n % config.block_n == 0,
                EVEN_K=k % config.block_k == 0, num_warps=config.num_warps,
                num_stages=config.num_stages, LOOP_K=k if INTERPRETED else 0,
            )  # fmt: skip
            self.programs = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
            self.launch = bound_launch(_scaled_gemm_kernel, tuple(constants.items()))
        else:
            constants.update(
                BLOCK_M=EPILOGUE_BLOCK_M, BLOCK_N=EPILOGUE_BLOCK_N, num_warps=EPILOGUE_WARPS
            )
            self.programs = triton.cdiv(m, EPILOGUE_BLOCK_M) * triton.cdiv(n, EPILOGUE_BLOCK_N)
            self.launch = bound_launch(_epilogue_kernel, tuple(constants.items()))

    def __call__(
        self, a: Tensor, b: Tensor, epilogue: Epilogue, transposed: bool = False
    ) -> Tensor:
        """The scaled product, bit for bit `scaled_gemm`'s or `fused_epilogue`'s.
        ``transposed``: ``b`` given as b^T (K, N), which both routes read as they are (the
        GEMM its strides swapped, cuBLAS the (K, N) operand it takes): no view made.
        ValueError where the operands' sizes or the epilogue's steps are not the prepared
        ones (the dtypes are the caller's plan's)."""
        (m, k), n = a.shape, b.shape[1 if transposed else 0]
        present = tuple(t is None for t in epilogue if not isinstance(t, (float, int)))
        if (m, n, k) != self.sizes or present != self.presence:
            raise ValueError(
                f"a prepared scaled GEMM takes the {self.sizes} (m, n, k) product and the "
                f"epilogue it was made for; got {(m, n, k)}"
            )
        if self.alpha:
            return alpha_scaled_gemm(a, b, epilogue, transposed)
        if self.fused:
            source = a
            out = a.new_empty((m, n), dtype=self.out_dtype)
        else:
            source = self.product(a, b if transposed else b.T).contiguous()
            out = torch.empty_like(source, dtype=self.out_dtype)
        if not out.numel():
            return out
        # the stand-in of absent tensors as the unprepared kernels pass it (never read)
        stand_in = out if self.fused else source
        pointers, _ = _epilogue_arguments(_contiguous(epilogue), stand_in)
        device = current_device() if a.is_cuda else 0
        if self.fused:
            b_strides = b.stride()[::-1] if transposed else b.stride()
            self.launch(device, self.programs, a, b, out, *pointers, m, n, k, *a.stride(),
                        *b_strides)  # fmt: skip
        else:
            self.launch(device, self.programs, source, out, *pointers, m, n)
        return out


__all__ = [
    "CUBLAS_ROUTES",
    "FUSED_GEMM_LIMIT",
    "GEMM_KERNELS",
    "OUT_DTYPES",
    "SQUARE_TILE",
    "WIDE_TILE",
    "WIDE_TILES",
    "Epilogue",
    "GemmConfig",
    "PreparedScaledGemm",
    "alpha_refusal",
    "alpha_scaled_gemm",
    "cublas_route",
    "epilogue_refusal",
    "fused_epilogue",
    "gemm_config",
    "gemm_kernel",
    "scale_tile",
    "scaled_gemm",
    "scaled_gemm_refusal",
    "store_tile",
]
