"""How `QuantizedLinear` quantizes one GEMM operand: a role's `Operand` (its spec and
resolved format) applied to a 2-D tensor with the contraction axis last, giving the
`stochround.blocks.GemmOperand` its GEMM takes: block formats by the block quantizer,
per-tensor formats by one amax and one elementwise rounding, Qwix's row noise, and MXFP8's
values as exact bf16 (docs/guide/recipes.md)."""

from __future__ import annotations

import functools
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from ..block_constants import POWER_OF_TWO_RULES
from ..blocks.formats import BlockFormat
from ..blocks.gemm import exact_bf16_operand
from ..blocks.prepared_operand import PreparedGemmOperand
from ..blocks.quantize import gemm_operand, quantize
from ..blocks.reference import absolute_max
from ..blocks.request import BlockArguments
from ..blocks.rowwise import PreparedRowGemmOperand, row_kernel_operand, row_operand_refusal
from ..blocks.scales import absmax_floor, absmax_scales, device_constant
from ..blocks.tensor import GemmOperand
from ..kernels.availability import on_kernel_device, triton_missing, use_kernel
from ..random import random_words, seed_tensor
from ..rounding import cast
from ..rounding import round as round_values
from .amax_history import (
    AmaxHistory,
    checked_history,
    delayed_operand_scale,
    device_decided_scales,
    kernel_scale,
    record_kernel_amaxes,
)
from .graph_notes import kept_by_graphs
from .quant_spec import TENSOR_FORMATS, QuantSpec
from .step_ops import transposed

if TYPE_CHECKING:  # the kernel module imports triton: only its type here
    from ..kernels.tensor_round import TensorRounding


class Operand(NamedTuple):
    """A role's spec and its resolved `BlockFormat` (None: passthrough), made once per
    layer so that a call builds no format."""

    role: str
    spec: QuantSpec
    fmt: BlockFormat | None


def row_noise_operand(operand: Tensor, fmt: BlockFormat, words: Tensor) -> GemmOperand:
    """The `GemmOperand` of an absmax (row-scaled) format with the random words ``words``
    (one per element, int64 in [0, 2**32), shaped like ``operand``): the elements ``e``,
    the scaled values ``fp32(x) / scale`` rounded stochastically to the element format by
    the words (saturating), and the row scales ``scale = amax_row / max``.  Equal to
    `stochround.blocks.gemm_operand` with mode "sr" when the words are its own;
    `quantize_operand` passes one word per row."""
    amax = operand.abs().amax(dim=-1, keepdim=True)
    scales, multiplier = absmax_scales(amax, fmt.element_max)
    scaled = operand.to(torch.float32) * multiplier
    elements = round_values(scaled, fmt.element, "sr", rand=words, sat="finite", backend="torch")
    return GemmOperand(elements.to(fmt.gemm_dtype), None, scales.to(torch.float32), 1.0)


def dequantized_operand(operand: GemmOperand) -> Tensor:
    """Q(x) in fp32: ``values * row_scale * tensor_scale * factor`` (the basis the values
    are in)."""
    values = operand.values.to(torch.float32)
    if operand.row_scale is not None:
        values = values * operand.row_scale
    if operand.tensor_scale is not None:
        values = values * operand.tensor_scale
    return values * operand.factor if operand.factor != 1.0 else values


# the roles whose operand is the transpose of the tensor the layer holds (W^T in dgrad,
# dy^T and x^T in wgrad): their contraction axis is the tensor's first axis
TRANSPOSED_ROLES = ("dgrad_weight", "wgrad_grad_output", "wgrad_input")


# the roles whose operand is the transpose of another role's tensor: W^T of fprop's W, x^T of
# fprop's x, dy^T of dgrad's dy
TRANSPOSE_SOURCES = {
    "dgrad_weight": "fprop_weight",
    "wgrad_input": "fprop_input",
    "wgrad_grad_output": "dgrad_grad_output",
}
# the other way: the role whose operand is each source role's transpose
TRANSPOSE_TARGETS = {source: role for role, source in TRANSPOSE_SOURCES.items()}


def tensor_transposes(operands: dict[str, Operand], token_multiple: int) -> frozenset[str]:
    """The roles of `TRANSPOSE_SOURCES` whose per-tensor operand is its source's transposed
    bit for bit, so that a step transposes Q(t) instead of quantizing t^T again: both roles
    of one per-tensor spec without random bits (the amax of t^T is t's, and the rounding of
    each element is the same function of it and the scale) and, for wgrad's, no token
    padding (zero tokens would be appended)."""
    reused = set()
    for role, source in TRANSPOSE_SOURCES.items():
        spec = operands[role].spec
        alike = spec == operands[source].spec and spec.mode != "sr"
        padded = role.startswith("wgrad") and token_multiple != 1
        if alike and spec.format in TENSOR_FORMATS and not padded:
            reused.add(role)
    return frozenset(reused)


def transposed_operand(operand: GemmOperand) -> GemmOperand:
    """A per-tensor operand's transpose: its values transposed contiguously (as the
    transposed tensor's quantization lays them out), its scale kept.  float8 codes are
    transposed as bytes (the transpose kernel's 1-byte loads)."""
    values = operand.values
    if values.element_size() == 1 and values.is_floating_point():
        values_t = transposed(values.view(torch.uint8)).view(values.dtype)
    else:
        values_t = transposed(values)
    return GemmOperand(values_t, operand.tensor_scale, None, operand.factor)


def tensor_scaled_operand(
    operand: Tensor,
    fmt: BlockFormat,
    spec: QuantSpec,
    seed: int,
    offset: int | Tensor,
    native: bool = False,
    transposes: list[GemmOperand] | None = None,
) -> GemmOperand:
    """The `GemmOperand` of a per-tensor (current scaling) format: the whole tensor as one
    row of the row-wise absmax rule in fp32, ``scale = amax / max`` (fp32, the rule's
    floor below), the elements ``round(fp32(x) / scale)`` by the core with sat="finite"
    (SR drawing the word of each element's row-major index), the scale as the GEMM's
    tensor scale.  The values in the format's GEMM dtype, or with ``native`` in its
    float8 dtype, as an FP8 tensor core reads them.  ``transposes``: where given, the
    operand's transpose (`transposed_operand`'s) is appended to it.
    Equal to `stochround.blocks.gemm_operand` of ``x.reshape(1, -1)`` in fp32 (a test
    checks it), computed as one amax (one read on CUDA) and one elementwise rounding: on
    CUDA one pass of `stochround.kernels.tensor_round` (x times the multiplier, rounded,
    stored in the values' dtype, and transposed where asked), else the PyTorch path below,
    its executable spec."""
    if operand.dtype == torch.float64:  # the rule scales fp32 values
        operand = operand.to(torch.float32)
    # a 0-d amax: the rule's one row, which the products broadcast alike
    scale, multiplier = tensor_scales(_tensor_amax(operand), fmt.element_max)
    dtype = fmt.element.torch_dtype
    if dtype is None or dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"a per-tensor format has float8 elements; got {fmt.element.name}")
    values_t: Tensor | None = None
    if tensor_kernel_serves(operand, fmt, native):
        values, values_t = kernel_tensor_round(
            operand, multiplier, spec, fmt, native, seed, offset, transposes is not None
        )
    else:
        rbits = spec.rbits if spec.mode == "sr" else None
        codes = cast(
            # fp32: x's values times the fp32 multiplier, as the rule has it (a 0-d
            # multiplier would leave a bf16 x's product in bf16, rounded twice; one
            # dimension promotes it)
            operand * multiplier.reshape(1),
            dtype,
            spec.mode,
            seed=seed,
            offset=offset,
            rbits=rbits,
            variant=spec.variant,
            sat="finite",
        )
        values = codes if native else codes.to(fmt.gemm_dtype)
    result = GemmOperand(values, tensor_scale=scale, row_scale=None, factor=1.0)
    if transposes is not None:
        # the kernel's, written with the values, or the values transposed
        if values_t is None:
            transposes.append(transposed_operand(result))
        else:
            transposes.append(result._replace(values=values_t))
    return result


def kernel_tensor_round(
    operand: Tensor,
    multiplier: Tensor,
    spec: QuantSpec,
    fmt: BlockFormat,
    native: bool,
    seed: int,
    offset: int | Tensor,
    transpose: bool,
) -> tuple[Tensor, Tensor | None]:
    """`stochround.kernels.tensor_round.tensor_round` of a per-tensor operand (its values,
    and with ``transpose`` their transpose, else None)."""
    from ..kernels.tensor_round import tensor_round  # needs triton: imported here

    words: tuple[Tensor | None, Tensor | None] = (None, None)
    if spec.mode == "sr":
        words = (seed_on(seed, operand.device), offset_on(offset, operand.device))
    rounding = tensor_rounding(spec, fmt, native)
    return tensor_round(operand, multiplier, rounding, *words, transpose)


def tensor_kernel_serves(operand: Tensor, fmt: BlockFormat, native: bool) -> bool:
    """Whether `stochround.kernels.tensor_round` computes a per-tensor operand: where "auto"
    routes it to a kernel (`tensor_operand_refusal`)."""
    refusal = tensor_operand_refusal(operand, fmt, native)
    return use_kernel("auto", "operand", operand.is_cuda, refusal)


def tensor_operand_refusal(operand: Tensor, fmt: BlockFormat, native: bool) -> str | None:
    """Why `stochround.kernels.tensor_round` cannot compute a per-tensor operand (None if
    it can): it takes 2-D contiguous fp32, bf16 or fp16 tensors and writes float8 codes
    (``native``) or bf16 values."""
    if operand.dim() != 2 or not operand.is_contiguous():
        return "the per-tensor kernel takes 2-D contiguous operands"
    if operand.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"the per-tensor kernel reads fp32/bf16/fp16 operands, not {operand.dtype}"
    if not native and fmt.gemm_dtype != torch.bfloat16:
        return f"the per-tensor kernel writes bf16 values, not {fmt.gemm_dtype}"
    return None


@kept_by_graphs
@functools.lru_cache(maxsize=64)
def tensor_rounding(spec: QuantSpec, fmt: BlockFormat, native: bool) -> TensorRounding:
    """The `stochround.kernels.tensor_round.TensorRounding` of a per-tensor spec (made once
    per spec: a step's calls repeat it)."""
    from ..kernels.tensor_round import TensorRounding  # needs triton: imported here

    nbits = 32 if spec.rbits is None or spec.mode != "sr" else spec.rbits
    output = "codes" if native else "bfloat16"
    return TensorRounding(fmt.element, spec.mode, nbits, spec.variant, output)


def offset_on(offset: int | Tensor, device: torch.device) -> Tensor:
    """An SR offset as the one-element int64 tensor the kernels read (a step's tensor as
    it is; an int filled on ``device``)."""
    if isinstance(offset, Tensor):
        return one_element(offset)
    return seed_tensor(offset, "offset", device)


def tensor_scales(amax: Tensor, max_value: float) -> tuple[Tensor, Tensor]:
    """`stochround.blocks.scales.absmax_scales` of a 0-d fp32 ``amax``: ``scale =
    max(amax / max, floor)`` and ``multiplier = 1 / scale``, each an fp32 division of fp32
    operands, which eager PyTorch rounds correctly on the CPU and on CUDA (tensor by tensor:
    neither is a CPU scalar, which CUDA would turn into a product with its reciprocal), so
    the rule's float64 quotients rounded once to fp32 bit for bit (53 >= 2 * 24 + 2 bits),
    in three operations with cached 0-d constants instead of seven.  Another dtype: the
    rule itself."""
    if amax.dtype != torch.float32:
        return absmax_scales(amax, max_value)
    fp32, device = torch.float32, amax.device
    top = device_constant(max_value, fp32, device, fp32)
    floor = device_constant(absmax_floor(fp32), fp32, device, fp32)
    scale = torch.maximum(torch.div(amax, top), floor)  # maximum keeps NaN, as the rule's
    return scale, torch.div(device_constant(1.0, fp32, device, fp32), scale)


def _tensor_amax(x: Tensor) -> Tensor:
    """max |x| in fp32 (NaN where x holds one): the kernels' one-read amax for a CUDA
    tensor where Triton runs, else the PyTorch path's (the same value: a maximum is exact,
    in any order)."""
    if on_kernel_device(x) and x.is_contiguous() and triton_missing() is None:
        from ..kernels.blocks import tensor_amax  # needs triton: imported here

        return tensor_amax(x)
    return absolute_max(x)


def row_words(operand: Tensor, role: str, seed: int, offset: int | Tensor) -> Tensor:
    """Qwix's channelwise noise (``channelwise_noise_axes=(0,)``): one word per index of
    the first axis of the tensor the layer holds (x and dy: one per token; W: one per
    output feature), ``random_words(i, seed, offset)``, broadcast along its other axis.
    Returned per element of ``operand`` (the GEMM's layout: transposed for
    `TRANSPOSED_ROLES`)."""
    rows, cols = operand.shape
    transposed = role in TRANSPOSED_ROLES
    count = cols if transposed else rows
    index = torch.arange(count, dtype=torch.int64, device=operand.device)
    words = random_words(index, seed, offset)
    shared = words.unsqueeze(0) if transposed else words.unsqueeze(-1)
    return shared.expand(rows, cols).contiguous()


def quantize_operand(
    operand: Tensor,
    entry: Operand,
    seed: int,
    offset: int | Tensor,
    signs: Tensor | None,
    rotated: bool = False,
    *,
    native: bool = False,
    transposes: list[GemmOperand] | None = None,
    history: AmaxHistory | None = None,
) -> GemmOperand:
    """Q(operand) as a GEMM takes it (`stochround.blocks.GemmOperand`): ``operand`` (2-D,
    contiguous, the GEMM's contraction axis last) quantized by the entry's spec; a
    passthrough entry gives the operand itself.  ``seed``/``offset``: its SR stream;
    ``signs``: the per-step RHT signs (None: the fixed ones); ``rotated``: keep an RHT's
    rotated basis (the other operand is rotated alike), else the values are rotated back
    (fp32); ``native``: per-tensor operands in their float8 dtype, for the FP8 tensor
    cores; ``transposes`` (per-tensor entries): Q(operand)^T appended to it
    (`tensor_scaled_operand`); ``history``: the layer's amax history at the step, which a
    delayed tensor scale reads and records in (`stochround.nn.amax_history`)."""
    spec, fmt = entry.spec, entry.fmt
    if transposes is not None and spec.format not in TENSOR_FORMATS:
        raise ValueError(f"transposes is given for per-tensor formats only; got {spec.format}")
    if fmt is None:
        return GemmOperand(operand, None, None, 1.0)
    if spec.format in TENSOR_FORMATS:
        return tensor_scaled_operand(operand, fmt, spec, seed, offset, native, transposes)
    if fmt.block is None and spec.hardware is None:
        row_operand = row_kernel_operand_of(operand, entry, seed, offset)
        if row_operand is not None:
            return row_operand
    if spec.noise == "row":
        return row_noise_operand(operand, fmt, row_words(operand, entry.role, seed, offset))
    options: dict[str, Any] = {
        **block_options(spec),
        "rht_signs": signs,
        "seed": seed,
        "offset": offset,
        "hardware": spec.hardware,
    }
    delayed = spec.tensor_scale == "delayed"
    if spec.rht is not None and not rotated:
        if delayed:  # the spec's route: the amax a pass of its own
            options["tensor_scale"] = delayed_operand_scale(
                operand, entry.role, spec, signs, history
            )
        quantized = quantize(operand, fmt, spec.mode, **options)
        return GemmOperand(quantized.dequantize(torch.float32, unrotate=True), None, None, 1.0)
    prepared = None
    if on_kernel_device(operand):
        prepared = prepared_operand(spec, fmt, operand.shape, operand.dtype, operand.device)
    if prepared is not None and isinstance(offset, Tensor):
        # the eager CUDA step: the checks and the launches' set-up made once per shape
        stream = (seed_on(seed, operand.device), one_element(offset), signs)
        if delayed and history is not None and history.windows is not None:
            # the window's scales given (none where the host knows it empty: current
            # scaling's amax pass), the current amax the quantize launch's by-product
            given = kernel_scale(history, entry.role, spec.amax_history)
            result = prepared(operand, *stream, given.scales, given.record)
            record_kernel_amaxes(history, (entry.role,), given.record)
        elif delayed:
            # the device's decision (under ``mode="reduce-overhead"``, a capture): the
            # scales from the current amax the tensor-scale or tiles' launch gives, and the
            # record, in one launch
            checked = checked_history(entry.role, history)
            windows = ((entry.role, spec.amax_history),)
            decide = functools.partial(device_decided_scales, checked, windows)
            result = prepared(operand, *stream, decide=decide)
        else:
            result = prepared(operand, *stream)
    else:
        if delayed:
            options["tensor_scale"] = delayed_operand_scale(
                operand, entry.role, spec, signs, history
            )
        result = gemm_operand(operand, fmt, spec.mode, **options)
    values = result.values
    if on_kernel_device(values) and values.dtype == torch.float32 and exact_in_bf16(fmt):
        # a bf16 GEMM instead of an fp32 one: the same products, exactly
        return exact_bf16_operand(result, fmt.element.mbits)
    return result


def one_element(offset: Tensor) -> Tensor:
    """A 0-d or one-element offset as the one-element tensor the kernels read (itself where
    it is one already: `stochround.nn.linear.slot_offsets` gives them so, without a view a
    call)."""
    return offset if offset.dim() == 1 else offset.reshape(1)


def noise_words(entry: Operand) -> str:
    """Whose word each element's SR draws (`stochround.block_constants.ROW_WORDS`): its own
    (noise "element"), or under Qwix's row noise (`row_words`) its row's, or its column's
    for `TRANSPOSED_ROLES`."""
    if entry.spec.noise == "element":
        return "element"
    return "column" if entry.role in TRANSPOSED_ROLES else "row"


def row_kernel_operand_of(
    operand: Tensor, entry: Operand, seed: int, offset: int | Tensor
) -> GemmOperand | None:
    """A whole-row entry's operand by the row operand kernel (one launch), or None where
    it does not serve it (CPU tensors: the PyTorch path).  The eager CUDA step with a
    device offset takes the prepared launch (`prepared_row_operand`); the row noise draws
    exact SR (32-bit words, variant c), as `row_noise_operand` does."""
    spec, fmt = entry.spec, typing.cast(BlockFormat, entry.fmt)
    refusal = row_operand_refusal(operand, fmt)
    if not use_kernel("auto", "operand", operand.is_cuda, refusal):
        return None
    words = noise_words(entry)
    rbits, variant = (spec.rbits, spec.variant) if words == "element" else (None, "c")
    if isinstance(offset, Tensor):
        prepared = prepared_row_operand(
            spec, fmt, words, operand.shape, operand.dtype, operand.device
        )
        return prepared(operand, seed_on(seed, operand.device), one_element(offset))
    n = 32 if rbits is None else rbits
    return row_kernel_operand(operand, fmt, spec.mode, n, variant, words, seed, offset)


@kept_by_graphs
@functools.lru_cache(maxsize=256)
def prepared_row_operand(
    spec: QuantSpec,
    fmt: BlockFormat,
    words: str,
    shape: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
) -> PreparedRowGemmOperand:
    """The row operand kernel's prepared launch
    (`stochround.blocks.rowwise.PreparedRowGemmOperand`) for an operand of this spec,
    words, shape, dtype and device: made once, so that a step's whole-row operands are a
    launch each."""
    rbits, variant = (spec.rbits, spec.variant) if words == "element" else (None, "c")
    example = torch.empty(shape, dtype=dtype, device=device)
    # "triton": the caller routed the operand to the kernel (`row_kernel_operand_of`)
    return PreparedRowGemmOperand(
        example, fmt, spec.mode, rbits=rbits, variant=variant, words=words, backend="triton"
    )


def block_options(spec: QuantSpec) -> dict[str, Any]:
    """The block quantizer's options a spec fixes (`stochround.blocks.quantize`'s keywords):
    the tensor scale (none, or from the amax) and its flavour, the RHT and its bf16
    rounding, the random bits and the variant."""
    return {
        "tensor_scale": False if spec.tensor_scale == "none" else None,
        "nvfp4_flavour": spec.nvfp4_flavour,
        "rht": spec.rht,
        "rht_bf16": spec.rht_bf16,
        "rbits": spec.rbits,
        "variant": spec.variant,
    }


@kept_by_graphs
@functools.lru_cache(maxsize=256)
def prepared_operand(
    spec: QuantSpec, fmt: BlockFormat, shape: torch.Size, dtype: torch.dtype, device: torch.device
) -> PreparedGemmOperand | None:
    """The kernel's `stochround.blocks.prepared_operand.PreparedGemmOperand` for an operand of this
    spec, shape, dtype and device (None where the kernel does not serve it: whole-row
    blocks, hardware presets): made once, so that a step's operands skip the checks and
    the launch set-up that the layer's fixed shapes make the same at every step."""
    if spec.hardware is not None or fmt.block is None:
        return None
    options = block_options(spec)
    args = BlockArguments(
        fmt, spec.mode, -1, None, None, options["tensor_scale"], options["nvfp4_flavour"],
        options["rht"], None, options["rht_bf16"], options["rbits"], options["variant"], 0, 0,
        None, None, 0, "auto",
    )  # fmt: skip
    try:
        # MXFP8's fp32 values as exact bf16 in the quantizer's pass (`quantize_operand`
        # then finds them bf16): the bits of `exact_bf16_operand` of the fp32 values
        exact = fmt.gemm_dtype == torch.float32 and exact_in_bf16(fmt)
        example = torch.empty(shape, dtype=dtype, device=device)
        record = spec.tensor_scale == "delayed"  # the current amax a by-product
        return PreparedGemmOperand(example, args, exact_bf16=exact, record=record)
    except ValueError:  # the kernel refuses it: the entry point routes the call
        return None


@kept_by_graphs
@functools.lru_cache(maxsize=64)
def seed_on(seed: int, device: torch.device) -> Tensor:
    """The layer's Philox key as the one-element int64 tensor the kernel reads, on device
    (made once: a fill per call would be a launch)."""
    return seed_tensor(seed, "seed", device)


def exact_in_bf16(fmt: BlockFormat) -> bool:
    """Whether ``fmt``'s fp32 GEMM values become exact bf16 values under a per-row power of
    two (`stochround.blocks.gemm.exact_bf16_operand`): power-of-two block scales and
    elements of at most 7 mantissa bits (MXFP8's e4m3 and e5m2)."""
    return fmt.scale_rule in POWER_OF_TWO_RULES and fmt.element.mbits <= 7


__all__ = [
    "TRANSPOSED_ROLES",
    "TRANSPOSE_SOURCES",
    "TRANSPOSE_TARGETS",
    "Operand",
    "dequantized_operand",
    "exact_in_bf16",
    "kernel_tensor_round",
    "noise_words",
    "offset_on",
    "one_element",
    "prepared_operand",
    "prepared_row_operand",
    "quantize_operand",
    "row_kernel_operand_of",
    "row_noise_operand",
    "row_words",
    "seed_on",
    "tensor_kernel_serves",
    "tensor_operand_refusal",
    "tensor_rounding",
    "tensor_scaled_operand",
    "tensor_scales",
    "tensor_transposes",
    "transposed_operand",
]
