"""Whole-row (absmax) GEMM operands on the Triton kernel: whether it serves a call
(`row_operand_refusal`, `use_kernel`), the launch (an op that torch.compile traces as one
node), and the prepared form a training layer resolves once per shape.  The kernel
(`stochround.kernels.row_operand`) writes the values and the row scales in one launch,
bit for bit the PyTorch path's: `gemm_operand_of` of `reference.quantize_torch` for
per-element words, `stochround.nn.operands.row_noise_operand` for one word per row or
column."""

from __future__ import annotations

import typing

import torch
from torch import Tensor

from .. import random as streams
from ..block_constants import ROW_WORDS
from ..formats import format as find_format
from ..kernels.availability import use_kernel
from ..reference import MODES, VARIANTS, WORD_BITS, check_choice, check_rbits
from .formats import OCP_INT8, BlockFormat
from .tensor import GemmOperand, gemm_factor

# whose word each element's SR draws: its own (its row-major index's), its row's (the row
# index's) or its column's (the column index's); the kernel reads the same names
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

__all__ = ["PreparedRowGemmOperand", "row_kernel_operand", "row_operand_refusal"]


def row_operand_refusal(x: Tensor, fmt: BlockFormat, hardware: str | None = None) -> str | None:
    """Why the row operand kernel cannot compute ``fmt``'s GEMM operand of x (None if it
    can): whole-row blocks under the absmax rule, elements of at most 8 bits that the
    kernels round (not MXINT8's symmetric grid), no hardware preset, and x a contiguous
    2-D float32, bfloat16 or float16 tensor with elements."""
    if fmt.block is not None or fmt.scale_rule != "absmax":
        return "it computes whole-row blocks under the absmax rule"
    if fmt.element.bits > 8 or not fmt.kernel_element or fmt.element == OCP_INT8:
        return f"it does not round {fmt.element.name} elements"
    if _registered(fmt.element.name) != fmt.element:
        return f"its element format must be a registered one; {fmt.element.name} is not"
    if hardware is not None:
        return "hardware presets round on the PyTorch path"
    if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0:
        return f"x must be a contiguous 2-D tensor with elements; got shape {tuple(x.shape)}"
    if x.dtype not in _KERNEL_DTYPES:
        return f"x must be float32, bfloat16 or float16; got {x.dtype}"
    return None


def _registered(name: str) -> object:
    """The registered format of this name, or None (the op names its element format)."""
    try:
        return find_format(name)
    except ValueError:
        return None


def _nan_zero(fmt: BlockFormat, words: str) -> bool:
    """Whether a NaN element's value is 0: per-element words encode the codes with
    ``nan="zero"`` (a format without a NaN code stores 0); the row noise rounds values,
    and NaN stays NaN."""
    return words == "element" and not fmt.element.has_nan


def _run_row_operand(
    x: Tensor,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    *,
    element: str,
    mode: str,
    n: int,
    variant: str,
    words: str,
    seed: int,
    offset: int,
    index_offset: int,
    out_bf16: bool,
    nan_zero: bool,
) -> list[Tensor]:
    """The kernel's launch (`stochround.kernels.row_operand.row_gemm_operand`) as an op:
    [values, row scales]; the stream as tensors or, where they are None, as signed 64-bit
    ints."""
    from ..kernels.row_operand import row_gemm_operand  # needs triton

    values, scales = row_gemm_operand(
        x,
        find_format(element),
        mode=mode,
        n=n,
        variant=variant,
        words=words,
        seed=seed_tensor if seed_tensor is not None else streams.as_unsigned64(seed),
        offset=offset_tensor if offset_tensor is not None else streams.as_unsigned64(offset),
        index_offset=index_offset,
        out_dtype=torch.bfloat16 if out_bf16 else torch.float32,
        nan_zero=nan_zero,
    )
    return [values, scales]


_row_operand_op = torch.library.custom_op(
    "stochround::row_gemm_operand", _run_row_operand, mutates_args=()
)


@_row_operand_op.register_fake
def _(
    x: Tensor,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    *,
    element: str,
    mode: str,
    n: int,
    variant: str,
    words: str,
    seed: int,
    offset: int,
    index_offset: int,
    out_bf16: bool,
    nan_zero: bool,
) -> list[Tensor]:
    dtype = torch.bfloat16 if out_bf16 else torch.float32
    return [torch.empty_like(x, dtype=dtype), x.new_empty((x.shape[0], 1), dtype=torch.float32)]


def _stream_pair(value: int | Tensor) -> tuple[Tensor | None, int]:
    """A seed or offset as the op takes it: a tensor, or an int as a signed 64-bit int."""
    if isinstance(value, Tensor):
        return value, 0
    return None, streams.as_signed64(value)


def row_kernel_operand(
    x: Tensor,
    fmt: BlockFormat,
    mode: str,
    n: int,
    variant: str,
    words: str,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int = 0,
) -> GemmOperand:
    """``fmt``'s `GemmOperand` of x (checked: `row_operand_refusal` is None) by the kernel:
    ``values`` the elements in the format's GEMM dtype, ``row_scale`` the fp32 row scales
    (rows, 1); the rounding ``mode``, ``n`` random bits and ``variant`` checked by the
    caller, SR drawing the words of ``words`` (`ROW_WORDS`) from ``(seed, offset)`` (ints
    or one-element int64 tensors)."""
    check_choice("words", words, ROW_WORDS)
    seed_tensor, seed_value = _stream_pair(seed)
    offset_tensor, offset_value = _stream_pair(offset)
    # eager calls run the kernel directly: the op's dispatch is host time a call need not pay
    launch = _row_operand_op if torch.compiler.is_compiling() else _run_row_operand
    values, scales = launch(
        x,
        seed_tensor,
        offset_tensor,
        element=typing.cast(str, fmt.element.name),
        mode=mode,
        n=n,
        variant=variant,
        words=words,
        seed=seed_value,
        offset=offset_value,
        index_offset=index_offset,
        out_bf16=fmt.gemm_dtype == torch.bfloat16,
        nan_zero=_nan_zero(fmt, words),
    )
    return GemmOperand(values, None, scales, gemm_factor(fmt))


class PreparedRowGemmOperand:
    """`row_kernel_operand` for one shape, dtype and device and one set of choices (a
    training layer's operand), checked and resolved once: a call is the launch alone.  The
    stream is given per call as one-element int64 tensors on x's device (no host sync; a
    CUDA graph replays them).  ValueError where the kernel does not serve the choices
    (``backend`` "auto" or "triton": `use_kernel`)."""

    def __init__(
        self,
        x: Tensor,
        fmt: BlockFormat,
        mode: str,
        *,
        rbits: int | None = None,
        variant: str = "c",
        words: str = "element",
        backend: str = "auto",
    ) -> None:
        check_choice("mode", mode, MODES)
        check_choice("variant", variant, VARIANTS)
        check_choice("words", words, ROW_WORDS)
        if words != "element" and mode != "sr":
            raise ValueError(f"words={words!r} draws SR's words: it needs mode='sr'; got {mode!r}")
        n = WORD_BITS if rbits is None else check_rbits(rbits)
        refusal = row_operand_refusal(x, fmt)
        if refusal is not None or not use_kernel(backend, "x", x.is_cuda, refusal):
            raise ValueError(f"a prepared row operand runs on the kernel, which refuses: {refusal}")
        from ..kernels.row_operand import PreparedRowOperand  # needs triton

        self.kernel = PreparedRowOperand(
            x,
            fmt.element,
            mode=mode,
            n=n,
            variant=variant,
            words=words,
            out_dtype=fmt.gemm_dtype,
            nan_zero=_nan_zero(fmt, words),
        )
        self.factor = gemm_factor(fmt)

    def __call__(self, x: Tensor, seed: Tensor, offset: Tensor) -> GemmOperand:
        """The `GemmOperand` of x (of the prepared shape, dtype and device, contiguous:
        ValueError otherwise) with this stream."""
        values, scales = self.kernel(x, seed, offset)
        return GemmOperand(values, None, scales, self.factor)
