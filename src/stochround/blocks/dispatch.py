"""Kernel or reference for a local (non-DTensor) tensor: the routing decision
(`block_kernel_refusal`, `use_kernel`), the two custom ops the kernel runs through under
torch.compile, and the launch.  The manual: docs/guide/blocks.md."""

from __future__ import annotations

import typing
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..block_constants import FOLDED_FLAVOURS, POWER_OF_TWO_RULES
from ..kernels.availability import use_kernel
from ..rounding import check_input_state
from .formats import OCP_INT8
from .quantize_plan import PreparedQuantize, plan_key, prepared_quantize
from .reference import quantize_torch
from .request import (
    BlockArguments,
    BlockRequest,
    check_call,
    check_extras,
    default_signs,
    given_scales,
    random_source,
    tensor_scale_choice,
)
from .rowwise import row_kernel_operand, row_operand_refusal
from .tensor import BlockTensor, GemmOperand, gemm_factor, stored_codes

__all__ = [
    "block_kernel_refusal",
    "fake_quantize_local",
    "kernel_gemm_operand",
    "quantize_local",
]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the kernel reads
# the longest row a whole-row block may have on the kernel: one program holds a block, and
# a longer one would not fit its registers (such rows take the PyTorch path)
_MAX_KERNEL_ROW = 2**14
# the kernel op's GEMM-operand outputs and their dtypes (`kernel_gemm_operand`)
_GEMM_OUTPUTS = {"gemm_bf16": torch.bfloat16, "gemm_fp32": torch.float32}


def block_kernel_refusal(
    x: Tensor, request: BlockRequest, rht: int | None, swizzle: bool
) -> str | None:
    """Why the Triton kernel cannot compute this call's blocks (None if it can).  It serves
    1-D blocks (or whole rows of at most `_MAX_KERNEL_ROW` elements) along x's contiguous
    last axis, and 2-D tiles without an RHT (each tile's rows quantized as 1-D blocks given
    the tile's amax), of x float32, bfloat16 or float16, elements of at most 8 bits that it
    rounds, without hardware presets or swizzled scales; an RHT with a power-of-two block
    and a power-of-two scale rule or NVFP4's."""
    fmt = request.fmt
    if request.axis != x.dim() - 1 or not x.is_contiguous():
        return "it quantizes blocks along x's last axis, contiguous"
    if isinstance(fmt.block, tuple) and (rht is not None or x.dim() < 2):
        return "it takes 2-D tiles without rht="
    if fmt.block is None and x.shape[-1] > _MAX_KERNEL_ROW:
        return f"whole-row blocks hold at most {_MAX_KERNEL_ROW} elements; x's hold {x.shape[-1]}"
    if x.dtype not in _KERNEL_DTYPES:
        return f"x must be float32, bfloat16 or float16; got {x.dtype}"
    if fmt.element.bits > 8 or not fmt.kernel_element:
        return f"it does not round {fmt.element.name} elements"
    if request.hardware is not None:
        return "hardware presets round on the PyTorch path"
    if swizzle:
        return "swizzled scales are laid out by the PyTorch path"
    if rht is not None:
        block = x.shape[-1] if fmt.block is None else typing.cast(int, fmt.block)
        if fmt.scale_rule == "absmax" or block < 4 or block & (block - 1):
            return "rht= needs a power-of-two block of at least 4 and a scale rule not absmax"
    return None


def _routed(x: Tensor, request: BlockRequest, args: BlockArguments, swizzle: bool) -> bool:
    """Whether the kernel computes the call (`use_kernel` given `block_kernel_refusal`)."""
    refusal = block_kernel_refusal(x, request, args.rht, swizzle)
    return use_kernel(args.backend, "x", x.is_cuda, refusal)


def quantize_local(
    x: object,
    choices: tuple,
    swizzle: bool,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    stream: streams.Stream | None,
) -> BlockTensor:
    """`quantize` of a local tensor (``choices``: `BlockArguments.choices`; the stream's
    arguments apart): checked, then computed by the kernel or the PyTorch path (the
    backend).  The sharded path calls it for each rank's shard.  The checks and routing of
    a call's choices, x's shape, dtype and device are made once (`_quantize_plan`, kept
    under `plan_key`): a later call with the same ones checks what of x the key does not
    hold and the stream, and where its plan holds a prepared launch, runs it without a
    record of its arguments."""
    key = plan_key(x, choices, swizzle)
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: the checks name it
        key = plan = None
    if plan is None:
        plan = _quantize_plan(x, BlockArguments.of(choices, seed, offset, stream), swizzle)
        if key is not None:
            if len(_PLANS) >= _MAX_PLANS:  # many shapes: start again rather than grow
                _PLANS.clear()
            _PLANS[key] = plan
    else:  # a plain dense tensor whose type, dtype and device the plan's checks passed
        check_input_state(typing.cast(Tensor, x))  # what of x the key does not hold
    x = typing.cast(Tensor, x)
    request = plan.request
    seed, offset = random_source(request.mode, seed, offset, stream)
    if plan.prepared is not None:
        return plan.prepared(x, seed, offset)
    args = BlockArguments.of(choices, seed, offset, None)  # the stream as drawn
    if plan.routed:
        call = _kernel_call(x, request, args, seed, offset)
        return _quantize_kernel(x, request, call, plan.launch)
    result, _ = quantize_torch(
        x,
        request,
        tensor_scale=args.tensor_scale,
        rht=args.rht,
        rht_signs=args.rht_signs,
        rht_bf16=args.rht_bf16,
        seed=seed,
        offset=offset,
        swizzle=swizzle,
    )
    return result


class _QuantizePlan(NamedTuple):
    """A `quantize_local` call's choices checked and routed: its request, whether the
    kernel computes it, and then its launch's options (`_launch_options`) and, for an
    eager call, its prepared launch (`prepared_quantize`; None where it has none)."""

    request: BlockRequest
    routed: bool
    launch: dict[str, Any]
    prepared: PreparedQuantize | None = None


# the plans of the calls made so far, by `plan_key` (a bound on their number: a program
# that quantizes ever new shapes starts again rather than grow)
_PLANS: dict[tuple, _QuantizePlan] = {}
_MAX_PLANS = 256


def _quantize_plan(x: object, args: BlockArguments, swizzle: bool) -> _QuantizePlan:
    """A call's checks (each error naming its argument) and its routing."""
    x, request = check_call(x, args)
    if not isinstance(args.rht_bf16, bool) or not isinstance(swizzle, bool):
        raise TypeError("rht_bf16 and swizzle must be bools")
    check_extras(x, request, args)
    routed = _routed(x, request, args, swizzle)
    if not routed:
        return _QuantizePlan(request, False, {})
    options = _launch_options(x, request, args.rht, args.rht_bf16, "codes")
    return _QuantizePlan(request, True, options, prepared_quantize(x, request, args, options))


class _FakeQuantize(torch.autograd.Function):
    """Quantize-dequantize with a straight-through gradient (masked where clipped)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, clip_mask: bool, args: BlockArguments) -> Tensor:
        x_checked, request = check_call(x, args)
        check_extras(x_checked, request, args)
        seed, offset = random_source(request.mode, args.seed, args.offset, args.stream)
        ctx.clip_mask = clip_mask
        if not clip_mask and _routed(x_checked, request, args, False):
            call = _kernel_call(x_checked, request, args, seed, offset)
            return _launch(x_checked, request, call, "dequantized").reshape(x.shape)
        q, clipped = quantize_torch(
            x_checked,
            request,
            tensor_scale=args.tensor_scale,
            rht=args.rht,
            rht_signs=args.rht_signs,
            rht_bf16=args.rht_bf16,
            seed=seed,
            offset=offset,
        )
        if clip_mask:
            ctx.save_for_backward(clipped)
        return q.dequantize(x.dtype, unrotate=True)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        if ctx.clip_mask:
            (clipped,) = ctx.saved_tensors
            grad = torch.where(clipped, torch.zeros_like(grad), grad)
        return grad, None, None


def fake_quantize_local(x: Tensor, clip_mask: bool, args: BlockArguments) -> Tensor:
    """`fake_quantize` of a local tensor (``clip_mask`` and the backend already checked):
    the kernel writes the dequantized values where it serves the call without a mask."""
    return typing.cast(Tensor, _FakeQuantize.apply(x, clip_mask, args))


def kernel_gemm_operand(x: Tensor, args: BlockArguments) -> GemmOperand | None:
    """The `GemmOperand` of a 2-D x written by a kernel, or None where no kernel serves the
    call: the entry point then quantizes it (`gemm_operand_of`).  Whole-row blocks (their
    scales kept apart as the row scales) go to the row operand kernel
    (`stochround.blocks.rowwise`), the others to the block kernel."""
    x_checked, request = check_call(x, args)
    if x_checked.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, contraction); got shape {tuple(x.shape)}")
    if request.fmt.block is None:
        return _row_operand(x_checked, request, args)
    if not _routed(x_checked, request, args, False):
        return None
    check_extras(x_checked, request, args)
    seed, offset = random_source(request.mode, args.seed, args.offset, args.stream)
    call = _kernel_call(x_checked, request, args, seed, offset)
    output = "gemm_bf16" if request.fmt.gemm_dtype == torch.bfloat16 else "gemm_fp32"
    values = _launch(x_checked, request, call, output)
    decode = None if request.flavour in FOLDED_FLAVOURS else _decoding(call)  # held in values
    return GemmOperand(values, decode, None, gemm_factor(request.fmt))


def _row_operand(x: Tensor, request: BlockRequest, args: BlockArguments) -> GemmOperand | None:
    """A whole-row format's operand by the row operand kernel where it serves the call
    (`row_operand_refusal`; no RHT), else None."""
    refusal = row_operand_refusal(x, request.fmt, request.hardware)
    if refusal is None and args.rht is not None:
        refusal = "rht= rotates on the PyTorch path for whole-row blocks"
    if not use_kernel(args.backend, "x", x.is_cuda, refusal):
        return None
    check_extras(x, request, args)
    seed, offset = random_source(request.mode, args.seed, args.offset, args.stream)
    return row_kernel_operand(
        x, request.fmt, request.mode, request.n, request.variant, "element", seed, offset,
        request.index_offset,
    )  # fmt: skip


# --- the kernel's side: its arguments, the custom ops and the launch --------------------------


class _KernelCall(NamedTuple):
    """What the kernel takes beyond x and the choices: the tensor scales (S_dec and S_enc,
    a 2-element fp32 tensor, or None), the rotation, the stream and 2-D tiles' amax."""

    tensor_scale: Tensor | None
    rht: int | None
    rht_signs: Tensor | None
    rht_bf16: bool
    seed: int | Tensor
    offset: int | Tensor
    amax: Tensor | None = None


def _kernel_call(
    x: Tensor, request: BlockRequest, args: BlockArguments, seed: int | Tensor, offset: int | Tensor
) -> _KernelCall:
    """The kernel's arguments: the signs of ``rht_signs=None`` drawn (`RHT_SEED`), the
    decoding tensor scale given, or computed from the (rotated) amax by the kernels'
    one-read `tensor_amax`, and 2-D tiles' amax (`_run_tile_amax`, with the tensor scales
    from the same read where they are computed)."""
    rht, signs, rht_bf16 = args.rht, args.rht_signs, args.rht_bf16
    if rht is not None and signs is None:
        signs = default_signs(rht, x.device)
    choice = tensor_scale_choice(request.fmt, args.tensor_scale)
    scales: Tensor | None = None  # S_dec and S_enc
    block, amax = request.fmt.block, None
    if isinstance(block, tuple):  # the tiles' amaxes (and the tensor scales) in one read
        tile_amax = _tile_amax_op if torch.compiler.is_compiling() else _run_tile_amax
        amax, *rest = tile_amax(x, *block, request.flavour if choice == "amax" else "")
        scales = rest[0] if rest else None
    if choice == "amax" and scales is None:
        scale = _tensor_scale_op if torch.compiler.is_compiling() else _run_tensor_scale
        scales = scale(x, signs, request.flavour, rht or 0, rht_bf16)
    elif choice not in ("amax", "none"):
        scales = torch.stack(tuple(given_scales(args.tensor_scale, x.device)))
    return _KernelCall(scales, rht, signs, rht_bf16, seed, offset, amax)


def _decoding(call: _KernelCall) -> Tensor | None:
    """The decoding tensor scale S_dec (0-d) of a kernel call's tensor scales, or None."""
    return None if call.tensor_scale is None else call.tensor_scale[0]


def _run_tensor_scale(
    x: Tensor, rht_signs: Tensor | None, flavour: str, rht: int, rht_bf16: bool
) -> Tensor:
    """NVFP4's tensor scales of x (S_dec, S_enc: a 2-element fp32 tensor; rotated by an
    RHT of size ``rht``, 0: none) by the kernels
    (`stochround.kernels.blocks.nvfp4_tensor_scale`), as an op that torch.compile traces as
    one node."""
    from ..kernels.blocks import nvfp4_tensor_scale as kernel_tensor_scale

    rotation = rht or None
    return kernel_tensor_scale(x, flavour, rht=rotation, rht_signs=rht_signs, rht_bf16=rht_bf16)[0]


_tensor_scale_op = torch.library.custom_op(
    "stochround::nvfp4_tensor_scale", _run_tensor_scale, mutates_args=()
)


@_tensor_scale_op.register_fake
def _(x: Tensor, rht_signs: Tensor | None, flavour: str, rht: int, rht_bf16: bool) -> Tensor:
    return x.new_empty(2, dtype=torch.float32)


def _run_tile_amax(x: Tensor, rows: int, columns: int, flavour: str) -> list[Tensor]:
    """`stochround.kernels.blocks.tile_amax` of x's ``rows`` x ``columns`` tiles (a
    ``flavour`` "": none) as an op that torch.compile traces as one node."""
    from ..kernels.blocks import tile_amax

    result = tile_amax(x, (rows, columns), flavour or None)
    return [result.amax] if result.scales is None else [result.amax, result.scales]


_tile_amax_op = torch.library.custom_op("stochround::tile_amax", _run_tile_amax, mutates_args=())


@_tile_amax_op.register_fake
def _(x: Tensor, rows: int, columns: int, flavour: str) -> list[Tensor]:
    amax = x.new_empty((x.shape[:-1].numel(), x.shape[-1] // columns), dtype=torch.float32)
    return [amax] if not flavour else [amax, x.new_empty(2, dtype=torch.float32)]


def _stream_arguments(value: int | Tensor) -> tuple[Tensor | None, int]:
    """A seed or offset as the ops take it: a tensor, or an int as a signed 64-bit int."""
    if isinstance(value, Tensor):
        return value, 0
    return None, streams.as_signed64(value)


def _stream_value(tensor: Tensor | None, signed: int) -> int | Tensor:
    """The seed or offset `_stream_arguments` passed."""
    return tensor if tensor is not None else streams.as_unsigned64(signed)


def _run_quantize_blocks(
    x: Tensor,
    tensor_scale: Tensor | None,
    rht_signs: Tensor | None,
    amax: Tensor | None,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    *,
    element: str,
    block: int,
    scale_rule: str,
    mode: str,
    n: int,
    variant: str,
    flavour: str,
    seed: int,
    offset: int,
    index_offset: int,
    rht: int,
    rht_bf16: bool,
    output: str,
) -> list[Tensor]:
    """The kernel's launch (`_launch_options`' arguments by name, and the stream: ``seed``
    and ``offset`` signed 64-bit ints, 0 where a tensor gives them) as an op, so that
    torch.compile traces a call as one opaque node with the eager bits."""
    from ..kernels.blocks import fake_quantize_blocks, gemm_blocks, quantize_blocks

    element_format = OCP_INT8 if element == OCP_INT8.name else element
    options: dict[str, Any] = {
        "tensor_scale": tensor_scale,
        "mode": mode,
        "n": n,
        "variant": variant,
        "seed": _stream_value(seed_tensor, seed),
        "offset": _stream_value(offset_tensor, offset),
        "index_offset": index_offset,
        "nvfp4_flavour": flavour,
        "rht": rht or None,
        "rht_signs": rht_signs,
        "rht_bf16": rht_bf16,
    }
    if output == "dequantized":
        return [fake_quantize_blocks(x, element_format, block, scale_rule, amax=amax, **options)]
    if output in _GEMM_OUTPUTS:
        out_dtype = _GEMM_OUTPUTS[output]
        gemm = gemm_blocks(
            x, element_format, block, scale_rule, out_dtype=out_dtype, amax=amax, **options
        )
        return [gemm]
    codes = quantize_blocks(
        x, element_format, block, scale_rule, output=output, amax=amax, **options
    )
    return list(codes)


_quantize_blocks_op = torch.library.custom_op(
    "stochround::quantize_blocks", _run_quantize_blocks, mutates_args=()
)


@_quantize_blocks_op.register_fake
def _(
    x: Tensor,
    tensor_scale: Tensor | None,
    rht_signs: Tensor | None,
    amax: Tensor | None,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    *,
    element: str,
    block: int,
    scale_rule: str,
    mode: str,
    n: int,
    variant: str,
    flavour: str,
    seed: int,
    offset: int,
    index_offset: int,
    rht: int,
    rht_bf16: bool,
    output: str,
) -> list[Tensor]:
    if output == "dequantized":
        return [torch.empty_like(x)]
    if output in _GEMM_OUTPUTS:
        return [torch.empty_like(x, dtype=_GEMM_OUTPUTS[output])]
    rows, cols = x.shape
    width = cols // 2 if output == "fp4x2" else cols
    scale_dtype = torch.float32 if scale_rule == "absmax" else torch.uint8
    codes = x.new_empty((rows, width), dtype=torch.uint8)
    return [codes, x.new_empty((rows, cols // block), dtype=scale_dtype)]


def _launch_options(
    x: Tensor, request: BlockRequest, rht: int | None, rht_bf16: bool, output: str
) -> dict[str, Any]:
    """A launch's arguments beside its tensors and the stream, each named as the op takes
    it: the element format's name, the block along the row, the scale rule, the rounding
    (mode, random bits ``n``, variant), NVFP4's flavour, the first element's global index,
    the RHT size (0: none) and rht_bf16, and the output: "codes", "fp4x2" (codes and
    scales), "dequantized", or a GEMM's operand "gemm_bf16"/"gemm_fp32" (the values)."""
    fmt = request.fmt
    block = fmt.block[1] if isinstance(fmt.block, tuple) else fmt.block
    if output == "codes" and fmt.element.bits == 4:
        output = "fp4x2"
    return {
        "element": fmt.element.name, "block": x.shape[-1] if block is None else block,
        "scale_rule": fmt.scale_rule, "mode": request.mode, "n": request.n,
        "variant": request.variant, "flavour": request.flavour,
        "index_offset": request.index_offset, "rht": rht or 0, "rht_bf16": rht_bf16,
        "output": output,
    }  # fmt: skip


def _launch(
    x: Tensor,
    request: BlockRequest,
    call: _KernelCall,
    output: str,
    options: dict[str, Any] | None = None,
) -> Any:
    """`stochround.kernels.blocks.quantize_blocks` (``output`` "codes": the codes and
    scales), `fake_quantize_blocks` ("dequantized") or `gemm_blocks` (a key of
    `_GEMM_OUTPUTS`) on x's [rows, last axis] view, through `_quantize_blocks_op`; 2-D tiles
    as the 1-D blocks of their rows.  ``options``: `_launch_options` of the call, if made."""
    if options is None:
        options = _launch_options(x, request, call.rht, call.rht_bf16, output)
    seed_tensor, seed = _stream_arguments(call.seed)
    offset_tensor, offset = _stream_arguments(call.offset)
    # eager calls run the kernel directly: the op's dispatch is host time a call need not pay
    launch = _quantize_blocks_op if torch.compiler.is_compiling() else _run_quantize_blocks
    # a view op: only if needed
    matrix = x if x.dim() == 2 else x.reshape(x.numel() // x.shape[-1], x.shape[-1])
    tensors = (matrix, call.tensor_scale, call.rht_signs, call.amax)
    results = launch(*tensors, seed_tensor, offset_tensor, seed=seed, offset=offset, **options)
    return tuple(results) if options["output"] in ("codes", "fp4x2") else results[0]


def _quantize_kernel(
    x: Tensor, request: BlockRequest, call: _KernelCall, options: dict[str, Any]
) -> BlockTensor:
    """The Triton kernel's quantization (`stochround.kernels.blocks.quantize_blocks`) with
    the launch's options (`_launch_options`)."""
    fmt = request.fmt
    codes, scales = _launch(x, request, call, "codes", options)
    if x.dim() != 2:  # the kernel's rows are x's: no view for a matrix
        lead = tuple(x.shape[:-1])
        codes = codes.reshape(*lead, codes.shape[-1])
        scales = scales.reshape(*lead, scales.shape[-1])
    if isinstance(fmt.block, tuple):  # the rows of a tile hold its scale alike: keep one
        scales = scales[..., :: fmt.block[0], :].contiguous()
    if fmt.scale_rule in POWER_OF_TWO_RULES:
        scales = scales.view(torch.float8_e8m0fnu)
    elif fmt.scale_rule == "nvfp4":
        scales = scales.view(torch.float8_e4m3fn)
    else:
        scales = scales.to(x.dtype)  # the kernel's fp32 holds the scale of x's dtype
    return BlockTensor(
        codes=stored_codes(codes, fmt.element),
        scales=scales,
        tensor_scale=_decoding(call),
        format=fmt,
        axis=request.axis,
        shape=x.shape,
        dtype=x.dtype,
        rht=call.rht,
        rht_signs=call.rht_signs,
        scale_shape=tuple(scales.shape),
    )
