"""Block quantization: `quantize` (a `BlockTensor`), `fake_quantize` and `to_nvfp4`.

The PyTorch path (`quantize_torch`) is the executable definition; the Triton kernel
(`stochround.kernels.blocks.quantize_blocks`) computes the same bits for 1-D blocks along a
contiguous last axis and is chosen by ``backend``.

One call:

1. optionally rotate x with a random Hadamard transform of ``rht`` values along the axis
   (`stochround.blocks.hadamard`), rounding the rotation to bf16 with ``rht_bf16``;
2. move the quantized axis last (1-D blocks) and cut it into blocks (2-D tiles cover the
   last two axes in place);
3. each block's ``amax`` (NaN if the block holds a NaN), its scale and fp32 multiplier by
   the scale rule (`stochround.blocks.scales`), and NVFP4's tensor scale;
4. the elements ``v = fp32(x) * multiplier`` rounded to the element format by the rounding
   core (every mode, ``rbits``/``variant``, hardware presets), saturating to the finite
   range (``sat="finite"``); a NaN element in a format without a NaN code stores code 0
   (its block's scale is NaN, so it dequantizes to NaN).

Stochastic rounding draws the core stream's word of each element's global row-major index
in the original x (before the axis is moved): ``random_words(index, seed, offset)``, so
results are the same on every device, eager or compiled, whole or sharded.

A DTensor x whose shards are ranges of whole rows (placements `Replicate` or `Shard(0)`)
is quantized shard by shard (`quantize_shards`): each rank rounds its local tensor from
``index_offset = first_row * row_length`` with the per-tensor scale of the whole tensor
(the global amax), so the sharded codes and scales equal the whole tensor's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..block_constants import HADAMARD_SIZES, POWER_OF_TWO_RULES, RESCALE, SCALE_RULES
from ..formats import Format
from ..kernels.availability import check_backend, kernels_refusal
from ..packing import pack_codes, unpack
from ..presets import preset
from ..random import check_index_offset
from ..reference import VARIANTS, WORD_BITS, check_choice, check_mode, check_rbits
from ..rounding import check_input, decode, encode
from ..rounding import round as round_to
from ..shards import block_of, is_dtensor, local_block, placed
from .formats import (
    OCP_INT8,
    Block,
    BlockFormat,
    block_format,
    check_block,
)
from .hadamard import hadamard, inverse_hadamard, random_signs
from .layout import SCALE_TILE, swizzle_scales, swizzled_shape, unswizzle_scales
from .scales import (
    TensorScale,
    absmax_scales,
    as_e8m0,
    check_flavour,
    e8m0_bits,
    e8m0_codes,
    given_tensor_scale,
    nvfp4_scales,
    nvfp4_tensor_scales,
    power_of_two_exponent,
    power_of_two_multiply,
)

if TYPE_CHECKING:  # for annotations only: importing distributed costs every plain call
    from torch.distributed.tensor import DTensor

ROUNDING_MODES = {"rn": "rne", "rs": "sr"}  # to_nvfp4's names (torchao RFC #3264)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the kernel reads
# the longest row a whole-row block may have on the kernel: one program holds a block, and
# a longer one would not fit its registers (such rows take the PyTorch path)
MAX_KERNEL_ROW = 2**14
# the kernel op's GEMM-operand outputs and their dtypes (`gemm_operand`)
GEMM_OUTPUTS = {"gemm_bf16": torch.bfloat16, "gemm_fp32": torch.float32}

# the fixed sign vector of ``rht_signs=None``: random_signs(size, seed=RHT_SEED), one
# rotation shared by every call, so that two operands of a GEMM quantized with different
# rounding seeds still share their rotation (as Transformer Engine's fixed sign vector)
RHT_SEED = 0

# those sign vectors per (size, device), made once: drawing them takes dozens of small
# operations, a cost every eager call would pay again (under torch.compile they are drawn
# in the graph instead)
_DEFAULT_SIGNS: dict[tuple[int, torch.device], Tensor] = {}


def default_signs(size: int, device: torch.device) -> Tensor:
    """``random_signs(size, seed=RHT_SEED)`` on ``device``: the signs of ``rht_signs=None``."""
    if torch.compiler.is_compiling():
        return random_signs(size, RHT_SEED, device=device)
    key = (size, device)
    if key not in _DEFAULT_SIGNS:
        _DEFAULT_SIGNS[key] = random_signs(size, RHT_SEED, device=device)
    return _DEFAULT_SIGNS[key]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class BlockTensor:
    """A block-quantized tensor.

    ``codes``: the elements' codes in the quantized layout (1-D blocks: x with the
    quantized axis moved last, ``x.movedim(axis, -1)``; 2-D tiles: x's layout): e2m1 packed
    two per byte along the last axis, low nibble first (uint8, `stochround.packing`);
    e4m3fn/e5m2 as torch.float8_e4m3fn/float8_e5m2; int8 grids (int8, MXINT8) as int8; other
    formats one code per byte (uint8).  ``scales``: one per block, shaped like the codes'
    layout with the last axis (2-D tiles: the last two) divided by the block,
    torch.float8_e8m0fnu (power-of-two rules), torch.float8_e4m3fn (NVFP4) or x's dtype
    (absmax); with ``swizzled`` True, in the 128x4 tiled layout of `swizzle_scales` over
    ``scale_shape``.  ``tensor_scale``: NVFP4's fp32 decoding tensor scale (0-d), or None.
    ``format``: the `BlockFormat` (with the call's block and scale rule); ``axis``: the
    quantized axis of x (nonnegative; -1 is ``ndim - 1``); ``shape`` and ``dtype``: x's;
    ``rht`` and ``rht_signs``: the Hadamard rotation applied before quantizing, or None;
    ``scale_shape``: the unswizzled scales' shape.  Quantized from a DTensor x, the codes
    and scales are DTensors placed as x, ``shape`` and ``scale_shape`` the whole tensor's,
    the tensor scale a plain tensor equal on every rank (`quantize`).

    ``repr`` is one line (the format, shapes, dtypes, device); ``==`` is True where the
    formats and the layouts are equal and the codes, scales, tensor scale and rotation
    signs are equal bit for bit (NaN codes included), so a BlockTensor is not hashable;
    ``to(device)`` moves it; ``torch.save`` stores it as its tensors and plain data, which
    ``torch.load`` reads back with ``weights_only=True`` (`rebuild_block_tensor`).
    """

    # equal BlockTensors may hold different tensor objects, and tensors are mutable
    __hash__ = None  # type: ignore[assignment]

    codes: Tensor
    scales: Tensor
    tensor_scale: Tensor | None
    format: BlockFormat
    axis: int
    shape: torch.Size
    dtype: torch.dtype
    rht: int | None = None
    rht_signs: Tensor | None = None
    swizzled: bool = False
    scale_shape: tuple[int, ...] = ()

    def dequantize(self, dtype: torch.dtype | None = None, *, unrotate: bool = False) -> Tensor:
        """The values ``element * (scale * tensor_scale)`` in fp32 (times 4/3 for the
        ``floor-3/4`` rule), then in ``dtype`` (default: x's), in x's layout.

        With a Hadamard rotation the values stay in the rotated basis (what a GEMM of two
        operands rotated alike consumes, as Transformer Engine and torchao keep them);
        ``unrotate=True`` applies the inverse rotation (in fp32) to give x's basis."""
        if is_dtensor(self.codes):
            return dequantize_shards(self, dtype, unrotate)
        values = dequantize_values(self)
        if self.rht is not None and unrotate:
            values = inverse_hadamard(values, self.rht, signs=self.rht_signs, axis=self.axis)
        return values.to(self.dtype if dtype is None else dtype)

    @property
    def device(self) -> torch.device:
        """The device the codes and scales live on."""
        return self.codes.device

    def to(self, device: torch.device | str | int, *, non_blocking: bool = False) -> BlockTensor:
        """The same BlockTensor on ``device`` (codes, scales, tensor scale and rotation
        signs moved; nothing is converted).  TypeError for a dtype: the codes' dtypes are
        the format's (``dequantize(dtype)`` gives the values in a dtype)."""
        if isinstance(device, torch.dtype) or not isinstance(device, (torch.device, str, int)):
            raise TypeError(
                "BlockTensor.to takes a device (torch.device, str or int); its codes' dtypes "
                f"are the format's: dequantize(dtype) converts; got {device!r}"
            )
        target = torch.device(device)

        def moved(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.to(target, non_blocking=non_blocking)

        return dataclasses.replace(
            self,
            codes=self.codes.to(target, non_blocking=non_blocking),
            scales=self.scales.to(target, non_blocking=non_blocking),
            tensor_scale=moved(self.tensor_scale),
            rht_signs=moved(self.rht_signs),
        )

    def __repr__(self) -> str:
        def described(tensor: Tensor) -> str:
            return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"

        parts = [
            self.format.name,
            f"shape={list(self.shape)}",
            f"dtype={str(self.dtype).removeprefix('torch.')}",
            f"axis={self.axis}",
            f"codes={described(self.codes)}",
            f"scales={described(self.scales)}" + (" swizzled" if self.swizzled else ""),
        ]
        if self.tensor_scale is not None:
            parts.append(f"tensor_scale={float(self.tensor_scale):.6g}")
        if self.rht is not None:
            parts.append(f"rht={self.rht}")
        parts.append(f"device={self.device}")
        return f"BlockTensor({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockTensor):
            return NotImplemented
        layout = ("format", "axis", "shape", "dtype", "rht", "swizzled", "scale_shape")
        if any(getattr(self, name) != getattr(other, name) for name in layout):
            return False
        tensors = ("codes", "scales", "tensor_scale", "rht_signs")
        return all(same_bits(getattr(self, name), getattr(other, name)) for name in tensors)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled (torch.save) as `rebuild_block_tensor` of tensors and plain data, which
        torch.load's ``weights_only`` unpickler accepts."""
        state = {
            "codes": self.codes,
            "scales": self.scales,
            "tensor_scale": self.tensor_scale,
            "format": format_state(self.format),
            "axis": self.axis,
            "shape": tuple(self.shape),
            "dtype": str(self.dtype).removeprefix("torch."),
            "rht": self.rht,
            "rht_signs": self.rht_signs,
            "swizzled": self.swizzled,
            "scale_shape": tuple(self.scale_shape),
        }
        return rebuild_block_tensor, (state,)


def same_bits(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two tensors (or None) have one dtype and shape and equal bits (compared on
    a's device): NaN equals a NaN of the same pattern, -0.0 does not equal 0.0."""
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return torch.equal(a, b.to(a.device))


def _init_fields(record: Any) -> dict[str, Any]:
    """A dataclass's constructor arguments (its init fields) as a dict."""
    return {
        field.name: getattr(record, field.name)
        for field in dataclasses.fields(record)
        if field.init
    }


def format_state(fmt: BlockFormat) -> dict[str, Any]:
    """A `BlockFormat` as plain data: its constructor arguments, the element and scale
    formats as theirs (`rebuild_block_tensor` reads it)."""
    state = _init_fields(fmt)
    state["element"] = _init_fields(fmt.element)
    state["scale"] = None if fmt.scale is None else _init_fields(fmt.scale)
    return state


def rebuild_block_tensor(state: dict[str, Any]) -> BlockTensor:
    """The `BlockTensor` that `BlockTensor.__reduce__` stored as ``state`` (registered as a
    safe global, so that ``torch.load(weights_only=True)`` may call it: it builds nothing
    but a BlockTensor from tensors and plain data)."""
    spec = dict(state["format"])
    spec["element"] = Format(**spec["element"])
    spec["scale"] = None if spec["scale"] is None else Format(**spec["scale"])
    fmt = BlockFormat(**spec)
    dtype = getattr(torch, state["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"a stored BlockTensor's dtype must name a torch dtype; got {dtype!r}")
    return BlockTensor(
        codes=state["codes"],
        scales=state["scales"],
        tensor_scale=state["tensor_scale"],
        format=fmt,
        axis=state["axis"],
        shape=torch.Size(state["shape"]),
        dtype=dtype,
        rht=state["rht"],
        rht_signs=state["rht_signs"],
        swizzled=state["swizzled"],
        scale_shape=tuple(state["scale_shape"]),
    )


# torch.load(weights_only=True) calls only the functions registered as safe
torch.serialization.add_safe_globals([rebuild_block_tensor])


def element_values(q: BlockTensor) -> Tensor:
    """The elements' values (fp32) in the quantized layout: the codes looked up in the
    format's table of values (`BlockFormat.element_table`; formats of more than 16 bits
    are decoded by `stochround.decode`, which torch.compile does not trace)."""
    element = q.format.element
    codes = q.codes
    if element.bits == 4:
        integers = unpack(codes, 4)
    elif codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8):
        integers = codes.view(torch.uint8)
    else:
        integers = codes
    table = q.format.element_table
    if table is None:
        return decode(integers, element, torch.float32)
    values = torch.tensor(table, dtype=torch.float32, device=codes.device)
    return values[integers.to(torch.int64) & (len(table) - 1)]


def scale_values(q: BlockTensor, *, tensor_scale: bool = True) -> Tensor:
    """The block scales as fp32 values times the tensor scale (``tensor_scale=False``:
    without it), unswizzled (``scale_shape``): E8M0 code c is ``2**(c - 127)`` (``2**-127``
    an fp32 subnormal), 0xFF NaN."""
    scales = q.scales
    e8m0 = scales.dtype == torch.float8_e8m0fnu
    if e8m0:  # unswizzled and decoded as codes (`e8m0_bits`)
        scales = e8m0_bits(scales)
    if q.swizzled:
        rows = 1
        for size in q.scale_shape[:-1]:
            rows *= size
        scales = unswizzle_scales(scales, rows, q.scale_shape[-1]).reshape(q.scale_shape)
    if e8m0:
        bits = scales.to(torch.int32)
        # code c's fp32 bits are c << 23, except 0 (2**-127 lies below fp32's normals)
        values = torch.where(bits == 0, 2.0**-127, (bits << 23).view(torch.float32))
        values = torch.where(bits == 0xFF, float("nan"), values)
    else:
        values = scales.to(torch.float32)
    if q.tensor_scale is not None and tensor_scale:
        values = values * q.tensor_scale
    return values


def scaled_elements(elements: Tensor, scales: Tensor, block: Block) -> Tensor:
    """Each element (fp32, quantized layout) times its block's scale, in that layout."""
    if isinstance(block, tuple):
        *lead, rows, cols = elements.shape
        tiles = elements.reshape(*lead, rows // block[0], block[0], cols // block[1], block[1])
        return (tiles * scales.unsqueeze(-1).unsqueeze(-3)).reshape(elements.shape)
    length = elements.shape[-1]
    size = length if block is None else block
    blocks = elements.reshape(*elements.shape[:-1], length // size, size)
    return (blocks * scales.unsqueeze(-1)).reshape(elements.shape)


def dequantize_values(q: BlockTensor) -> Tensor:
    """The dequantized values in fp32 and x's layout (rotated basis)."""
    values = scaled_elements(element_values(q), scale_values(q), q.format.block)
    if not isinstance(q.format.block, tuple):
        values = values.movedim(-1, q.axis)
    if q.format.scale_rule == "floor-3/4":
        values = values * RESCALE
    return values


class GemmOperand(NamedTuple):
    """A quantized GEMM operand as a block-scaled tensor core takes it: ``values`` (2-D,
    the contraction axis last) each an element times its block scale, in the format's
    `BlockFormat.gemm_dtype` (bf16 where exact), and the factors that scale the GEMM's
    result: ``tensor_scale`` (fp32 0-d: NVFP4's tensor scale, or None), ``row_scale``
    (fp32 ``(rows, 1)``: the scales of whole-row blocks, or None) and ``factor`` (floor-3/4's
    fp32 4/3, else 1.0).  Q(x) = values * row_scale * tensor_scale * factor."""

    values: Tensor
    tensor_scale: Tensor | None
    row_scale: Tensor | None
    factor: float


def gemm_operand_of(q: BlockTensor) -> GemmOperand:
    """The `GemmOperand` of a `BlockTensor` of a 2-D x quantized along its last axis (the
    rotated basis kept: a GEMM of two operands rotated alike needs no inverse)."""
    if len(q.shape) != 2 or q.axis != 1 or q.swizzled:
        raise ValueError(
            "a GEMM operand is a 2-D tensor quantized along its last axis, scales unswizzled; "
            f"got shape {tuple(q.shape)}, axis {q.axis}, swizzled {q.swizzled}"
        )
    elements = element_values(q)
    scales = scale_values(q, tensor_scale=False)
    row_scale = None
    if q.format.block is None:
        values, row_scale = elements, scales
    else:
        values = scaled_elements(elements, scales, q.format.block)
    factor = RESCALE if q.format.scale_rule == "floor-3/4" else 1.0
    return GemmOperand(values.to(q.format.gemm_dtype), q.tensor_scale, row_scale, factor)


class BlockRequest(NamedTuple):
    """A quantize call's checked choices (what the PyTorch path and the kernel take)."""

    fmt: BlockFormat
    mode: str
    n: int
    variant: str
    axis: int
    flavour: str
    hardware: str | None
    index_offset: int = 0


def check_axis(axis: object, ndim: int) -> int:
    """axis as a nonnegative int below ndim (ValueError naming the range otherwise)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise ValueError(f"axis must be an int in [-{ndim}, {ndim}); got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis must be an int in [-{ndim}, {ndim}) for x of {ndim} dims; got {axis}"
        )
    return axis % ndim


def resolve_block_format(fmt: str | BlockFormat, block: object, scale_rule: object) -> BlockFormat:
    """The call's block format: ``fmt`` with ``block`` and ``scale_rule`` replaced where
    given (the replacement is validated as a `BlockFormat`)."""
    found = block_format(fmt)
    changes: dict[str, Any] = {}
    if block is not None:
        changes["block"] = check_block(block)
    if scale_rule is not None:
        check_choice("scale_rule", scale_rule, SCALE_RULES)
        changes["scale_rule"] = scale_rule
    return dataclasses.replace(found, **changes) if changes else found


def check_blocks(fmt: BlockFormat, shape: torch.Size, axis: int) -> None:
    """ValueError unless the block divides the quantized axis (2-D tiles: the last two axes,
    with axis the last one)."""
    block = fmt.block
    if isinstance(block, tuple):
        if len(shape) < 2:
            raise ValueError(
                f"2-D blocks {block} need x of at least 2 dims; got shape {tuple(shape)}"
            )
        if axis != len(shape) - 1:
            raise ValueError(
                f"2-D blocks {block} cover the last two axes: axis must be -1; got {axis}"
            )
        for size, length, name in zip(block, shape[-2:], ("rows", "columns"), strict=True):
            if length % size:
                raise ValueError(
                    f"block {block} must divide x's last two axes: {length} {name} is not a "
                    f"multiple of {size}"
                )
    elif block is not None and shape[axis] % block:
        raise ValueError(
            f"block {block} must divide the length {shape[axis]} of axis {axis} (no padding)"
        )
    if fmt.element.bits == 4:
        last = shape[-1] if isinstance(block, tuple) else shape[axis]
        if last % 2:
            raise ValueError(f"4-bit codes pack two per byte: the axis length {last} must be even")


def _tensor_scale_choice(fmt: BlockFormat, tensor_scale: object) -> str:
    """What the call's tensor scale is: "none", "amax" (computed), "given" (a decoding
    scale, checked: `check_tensor_scale`) or "pair" (a `TensorScale`: the whole tensor's,
    which a sharded call gives each rank)."""
    if tensor_scale is False:
        return "none"
    if tensor_scale is None:
        return "amax" if fmt.tensor_scale else "none"
    if isinstance(tensor_scale, TensorScale):
        return "pair"
    if isinstance(tensor_scale, bool):
        raise ValueError("tensor_scale must be None, False, a float or an fp32 tensor; got True")
    if not fmt.tensor_scale:
        raise ValueError(
            f"tensor_scale applies to formats with a per-tensor scale (nvfp4); {fmt.name} has none"
        )
    if isinstance(tensor_scale, numbers.Real) or (
        isinstance(tensor_scale, Tensor) and tensor_scale.numel() == 1
    ):
        check_tensor_scale(tensor_scale)
        return "given"
    raise ValueError(
        "tensor_scale must be None (from the tensor's amax), False (single-level), a float "
        f"or a one-element fp32 tensor; got {tensor_scale!r}"
    )


def check_tensor_scale(tensor_scale: numbers.Real | Tensor) -> None:
    """ValueError unless a given decoding tensor scale is positive and finite (a negative
    one flips every block scale's sign, 0 zeroes the tensor, NaN or inf poisons it): a
    number, or a tensor on the CPU, read at once; a tensor on an accelerator is not read
    (that would wait for the device: the guide says so), nor under torch.compile."""
    if isinstance(tensor_scale, Tensor):
        if tensor_scale.device.type != "cpu" or torch.compiler.is_compiling():
            return
        if not tensor_scale.is_floating_point():
            raise ValueError(f"tensor_scale must be a floating tensor; got {tensor_scale.dtype}")
        value = float(tensor_scale.reshape(()).to(torch.float32))
    else:
        value = float(tensor_scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"tensor_scale must be a positive finite decoding scale (as float32); got {value!r}"
        )


def _given_scales(tensor_scale: object, device: torch.device) -> TensorScale:
    """The `TensorScale` of a checked "given" (a decoding scale) or "pair" tensor scale."""
    if isinstance(tensor_scale, TensorScale):
        return TensorScale(*(scale.to(device) for scale in tensor_scale))
    decode = torch.as_tensor(tensor_scale, dtype=torch.float32, device=device).reshape(())
    return given_tensor_scale(decode)


def _check_extras(
    x: Tensor, request: BlockRequest, tensor_scale: object, rht: object, rht_signs: object
) -> None:
    """The tensor scale and RHT options checked before a stream is drawn from (a refused
    call takes nothing from it): ``rht`` one of `HADAMARD_SIZES`, dividing the axis."""
    _tensor_scale_choice(request.fmt, tensor_scale)
    if rht is None:
        if rht_signs is not None:
            raise ValueError("rht_signs applies with rht= (the Hadamard size); got rht=None")
        return
    if isinstance(rht, bool) or rht not in HADAMARD_SIZES:
        allowed = ", ".join(map(str, HADAMARD_SIZES))
        raise ValueError(f"rht must be None or a Hadamard size in {allowed}; got {rht!r}")
    length = x.shape[request.axis]
    if length % typing.cast(int, rht):
        raise ValueError(f"rht={rht} must divide the length {length} of axis {request.axis}")


def _random_source(
    mode: str,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    stream: streams.Stream | None,
) -> tuple[int | Tensor, int | Tensor]:
    """The (seed, offset) of an SR call: given, drawn from torch's default generator
    (seed None, as the core draws it), or taken from ``stream`` (advanced by one)."""
    if stream is not None:
        if not isinstance(stream, streams.Stream):
            raise TypeError(f"stream must be a stochround.Stream, got {type(stream).__name__}")
        if seed is not None or offset is not None:
            raise ValueError("stream= gives the seed and offset: pass stream= or seed=/offset=")
        if mode != "sr":
            return 0, 0
        return stream.take()
    if mode != "sr":
        return 0, 0
    offset = 0 if offset is None else streams.check_seed(offset, "offset")
    if seed is not None:
        return streams.check_seed(seed, "seed"), offset
    if torch.compiler.is_compiling():
        return streams.default_seed_tensor(), offset
    return streams.default_seed(), offset


def _rotate(
    x: Tensor, rht: int | None, signs: Tensor | None, axis: int, rht_bf16: bool
) -> tuple[Tensor, Tensor | None]:
    """x rotated by the Hadamard transform of ``rht`` values along axis (and its signs)."""
    if rht is None:
        if signs is not None:
            raise ValueError("rht_signs applies with rht= (the Hadamard size); got rht=None")
        return x, None
    if signs is None:
        signs = default_signs(rht, x.device)
    narrow = x.dtype in (torch.bfloat16, torch.float16)
    rotated = hadamard(x.float() if narrow else x, rht, signs=signs, axis=axis)
    # narrowed by the core's op, not a cast: where a narrowed tensor only feeds further
    # arithmetic, inductor keeps the cast's input at full precision, which would change
    # the bits under torch.compile; the op's values are on the narrow grid whatever follows
    if narrow:
        rotated = round_to(rotated, x.dtype, "rne").to(x.dtype)
    if rht_bf16:
        rotated = round_to(rotated, torch.bfloat16, "rne").to(torch.bfloat16)
    return rotated, signs


def _blocked_amax(values: Tensor, block: Block) -> Tensor:
    """Each block's max |value| (NaN where the block holds NaN), with a unit axis per block
    axis so that it broadcasts over ``_blocked(values)``."""
    return _blocked(values, block).abs().amax(dim=_block_dims(block), keepdim=True)


def _blocked(values: Tensor, block: Block) -> Tensor:
    """values (quantized layout) with the block axes split out."""
    if isinstance(block, tuple):
        *lead, rows, cols = values.shape
        return values.reshape(*lead, rows // block[0], block[0], cols // block[1], block[1])
    length = values.shape[-1]
    size = length if block is None else block
    return values.reshape(*values.shape[:-1], length // size, size)


def _block_dims(block: Block) -> tuple[int, ...]:
    return (-3, -1) if isinstance(block, tuple) else (-1,)


def _squeeze_blocks(scales: Tensor, block: Block) -> Tensor:
    return scales.squeeze(-1).squeeze(-2) if isinstance(block, tuple) else scales.squeeze(-1)


def scale_and_multiplier(
    values: Tensor,
    fmt: BlockFormat,
    flavour: str,
    tensor_scale: TensorScale | None,
) -> tuple[Tensor, Tensor]:
    """The blocks' scales (squeezed; E8M0 scales as their uint8 codes, which `as_e8m0`
    views as torch.float8_e8m0fnu) and the scaled fp32 elements (blocked layout) of
    ``values`` (the quantized layout: fp32, bf16 or fp16)."""
    rule = fmt.scale_rule
    amax = _blocked_amax(values, fmt.block)
    blocked = _blocked(values, fmt.block).to(torch.float32)
    if rule in POWER_OF_TWO_RULES:
        exponent = power_of_two_exponent(
            amax, rule, emax=fmt.element_emax, mbits=fmt.element_mbits, max_value=fmt.element_max
        )
        scaled = power_of_two_multiply(blocked, exponent, amax, rule)
        return _squeeze_blocks(e8m0_codes(exponent, amax), fmt.block), scaled
    if rule == "nvfp4":
        scales, multiplier = nvfp4_scales(amax, tensor_scale, flavour)
    else:
        scales, multiplier = absmax_scales(amax, fmt.element_max)
    return _squeeze_blocks(scales, fmt.block), blocked * multiplier


def _element_codes(
    scaled: Tensor,
    element: Format,
    request: BlockRequest,
    seed: int | Tensor,
    offset: int | Tensor,
    packed: bool,
) -> Tensor:
    """The elements' codes (uint8; 4-bit codes packed two a byte where ``packed``) of the
    scaled fp32 values, rounded by the core with sat="finite"; SR draws the word of each
    value's row-major position in ``scaled``.  A hardware preset rounds with its own
    saturation: the values are first clamped to the element's finite range, which
    saturates them whatever the preset's."""
    kwargs: dict[str, Any] = {"nan": "zero", "packed": packed, "backend": "torch"}
    if request.mode == "sr":
        kwargs.update(seed=seed, offset=offset, index_offset=request.index_offset)
    if element == OCP_INT8:
        # MXINT8's symmetric range (`OCP_INT8`): -2 (code -128) is never stored, so that
        # the largest scale cannot take a finite block to -2 * 2**127, an fp32 -inf
        scaled = scaled.clamp(min=-request.fmt.element_max)
    if request.hardware is not None:
        bound = request.fmt.element_max
        clamped = scaled.clamp(-bound, bound)
        return encode(clamped, element, "sr", hardware=request.hardware, **kwargs)
    rbits = request.n if request.mode == "sr" and request.n != WORD_BITS else None
    return encode(
        scaled,
        element,
        request.mode,
        rbits=rbits,
        variant=request.variant,
        sat="finite",
        **kwargs,
    )


def _code_storage(codes: Tensor, element: Format) -> Tensor:
    """Codes in their stored dtype: float8 dtypes for e4m3fn/e5m2, int8 for two's
    complement grids, uint8 otherwise."""
    if element.name in ("e4m3fn", "e5m2") and element.torch_dtype is not None:
        return codes.view(element.torch_dtype)
    if element.twos_complement and element.bits == 8:
        return codes.view(torch.int8)
    return codes


def quantize_torch(
    x: Tensor,
    request: BlockRequest,
    *,
    tensor_scale: Tensor | float | bool | None = None,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    swizzle: bool = False,
) -> tuple[BlockTensor, Tensor]:
    """The PyTorch path: the `BlockTensor` of x and a bool mask, in x's layout, of the
    elements whose scaled value lay beyond the element's finite range (clipped by the
    saturation), for `fake_quantize`'s ``clip_mask``.  Arguments as `quantize` takes them,
    checked (``request``: the choices; ``seed``/``offset`` the stream, already drawn)."""
    fmt, axis = request.fmt, request.axis
    rotated, signs = _rotate(x, rht, rht_signs, axis, rht_bf16)
    if rotated.dtype == torch.float64:
        # rounded to fp32 before any amax, as the values are scaled in fp32: a value beyond
        # fp32's range is an infinity, whose block is the one an fp32 infinity makes (NaN
        # for the MX formats), not one scaled by a finite scale that its values overflow
        rotated = rotated.to(torch.float32)
    choice = _tensor_scale_choice(fmt, tensor_scale)
    pair: TensorScale | None = None
    if choice == "amax":
        pair = nvfp4_tensor_scales(absolute_max(rotated), request.flavour)
    elif choice != "none":
        pair = _given_scales(tensor_scale, x.device)
    tiles = isinstance(fmt.block, tuple)
    moved = not tiles and axis != x.dim() - 1
    layout = rotated.movedim(axis, -1) if moved else rotated
    scales, scaled = scale_and_multiplier(layout, fmt, request.flavour, pair)
    flat = scaled.reshape(layout.shape)
    packed = fmt.element.bits == 4
    if moved and request.mode == "sr":
        # rounded in x's layout, where each value's row-major position is its index in x
        # (its word's), then moved with the axis and packed along it; inside the core's one
        # op, so that no Philox rounds reach inductor's graph
        in_x = flat.movedim(-1, axis)
        unpacked = _element_codes(in_x, fmt.element, request, seed, offset, packed=False)
        codes = unpacked.movedim(axis, -1).contiguous()
        if packed:
            codes = pack_codes(codes, fmt.element.bits)
    else:
        codes = _element_codes(flat, fmt.element, request, seed, offset, packed=packed)
    clipped = flat.abs() > fmt.element_max
    if moved:
        clipped = clipped.movedim(-1, axis)
    if fmt.scale_rule == "absmax":
        scales = scales.to(x.dtype)  # held in x's dtype (float64's: its fp32 scale)
    scale_shape = tuple(scales.shape)
    if swizzle:
        scales = swizzle_scales(scales.reshape(-1, scale_shape[-1]))
    if fmt.scale_rule in POWER_OF_TWO_RULES:
        scales = as_e8m0(scales)
    result = BlockTensor(
        codes=_code_storage(codes, fmt.element),
        scales=scales,
        tensor_scale=None if pair is None else pair.decode,
        format=fmt,
        axis=axis,
        shape=x.shape,
        dtype=x.dtype,
        rht=rht,
        rht_signs=signs,
        swizzled=swizzle,
        scale_shape=scale_shape,
    )
    return result, clipped


def _kernel_serves(x: Tensor, request: BlockRequest, rht: int | None, swizzle: bool) -> bool:
    """Whether the Triton kernel computes this call's blocks: 1-D blocks (or whole rows)
    along x's contiguous last axis, or 2-D tiles (without an RHT; the kernel quantizes each
    tile's rows as 1-D blocks given the tile's amax), of x float32, bfloat16 or float16,
    elements of at most 8 bits, without hardware presets or swizzled scales; an RHT with a
    power-of-two block and a power-of-two scale rule or NVFP4's; whole-row blocks of at
    most `MAX_KERNEL_ROW` elements."""
    fmt = request.fmt
    if request.axis != x.dim() - 1 or not x.is_contiguous():
        return False
    if isinstance(fmt.block, tuple) and (rht is not None or x.dim() < 2):
        return False
    if fmt.block is None and x.shape[-1] > MAX_KERNEL_ROW:
        return False
    if x.dtype not in KERNEL_DTYPES or fmt.element.bits > 8:
        return False
    if request.hardware is not None or swizzle or not fmt.kernel_element:
        return False
    if rht is not None:
        block = x.shape[-1] if fmt.block is None else typing.cast(int, fmt.block)
        return fmt.scale_rule != "absmax" and block >= 4 and block & (block - 1) == 0
    return True


def uses_kernel(
    x: Tensor, request: BlockRequest, backend: str, rht: int | None, swizzle: bool
) -> bool:
    """The one routing decision: True for the Triton kernel, False for the PyTorch path.
    "auto" takes the kernel for CUDA tensors it serves where Triton runs; "triton" takes it
    or raises ValueError saying why it cannot."""
    if backend == "torch" or (backend == "auto" and not x.is_cuda):
        return False
    serves = _kernel_serves(x, request, rht, swizzle)
    refusal = kernels_refusal("x", x.is_cuda)
    if backend == "auto":
        return serves and x.is_cuda and refusal is None
    if not serves:
        raise ValueError(
            "backend='triton' serves 1-D blocks along x's contiguous last axis or 2-D tiles "
            "(float32, bfloat16 or float16) of elements of at most 8 bits, without hardware "
            "presets or swizzle (rht with power-of-two 1-D blocks, not absmax; whole rows "
            f"of at most {MAX_KERNEL_ROW}); use backend='torch' or 'auto'"
        )
    if refusal is not None:
        raise ValueError(f"backend='triton' cannot run: {refusal}; use backend='torch' or 'auto'")
    return True


class KernelCall(NamedTuple):
    """What the kernel takes beyond x and the choices: the tensor scales (S_dec and S_enc,
    a 2-element fp32 tensor, or None), the rotation and the stream."""

    tensor_scale: Tensor | None
    rht: int | None
    rht_signs: Tensor | None
    rht_bf16: bool
    seed: int | Tensor
    offset: int | Tensor
    amax: Tensor | None = None


def tile_amax(x: Tensor, tile: tuple[int, int]) -> Tensor:
    """Each 2-D tile's amax (NaN where it holds a NaN) in fp32, repeated for each of the
    tile's rows: one value a 1-D block of ``tile[1]`` elements of x's [rows, last axis]
    view, what the kernel reads to quantize the tiles as those blocks."""
    rows, cols = tile
    # the max over each tile's rows first (a reduction across rows, which reads whole rows
    # at a time), then over runs of ``cols`` of the result, a tile-row's size: the same
    # maxima as one reduction over each tile
    columns = x.reshape(-1, rows, x.shape[-1]).abs().amax(dim=1)
    tiles = columns.reshape(columns.shape[0], -1, cols).amax(dim=-1)
    # repeated by a broadcast copy (repeat_interleave would read its size on the host)
    repeated = tiles.to(torch.float32).unsqueeze(1).expand(-1, rows, -1)
    # contiguous: with one row of tiles the reshape is a view of the broadcast (stride 0)
    return repeated.reshape(-1, tiles.shape[-1]).contiguous()


def _kernel_call(
    x: Tensor,
    request: BlockRequest,
    tensor_scale: Tensor | float | bool | None,
    rotation: tuple[int | None, Tensor | None, bool],
    seed: int | Tensor,
    offset: int | Tensor,
) -> KernelCall:
    """The kernel's arguments: the signs of ``rht_signs=None`` drawn (`RHT_SEED`), the
    decoding tensor scale given, or computed from the (rotated) amax by the kernels'
    one-read `tensor_amax`, and 2-D tiles' amax (`tile_amax`)."""
    rht, signs, rht_bf16 = rotation
    if rht is not None and signs is None:
        signs = default_signs(rht, x.device)
    choice = _tensor_scale_choice(request.fmt, tensor_scale)
    scales: Tensor | None = None  # S_dec and S_enc
    if choice == "amax":
        scale = _tensor_scale_op if torch.compiler.is_compiling() else _run_tensor_scale
        scales = scale(x, signs, request.flavour, rht or 0, rht_bf16)
    elif choice != "none":
        scales = torch.stack(tuple(_given_scales(tensor_scale, x.device)))
    block = request.fmt.block
    amax = tile_amax(x, block) if isinstance(block, tuple) else None
    return KernelCall(scales, rht, signs, rht_bf16, seed, offset, amax)


def _decoding(call: KernelCall) -> Tensor | None:
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
    ints: list[int],
    element: str,
    scale_rule: str,
    mode: str,
    variant: str,
    flavour: str,
    output: str,
) -> list[Tensor]:
    """The kernel's launch as an op, so that torch.compile traces a call as one opaque node
    with the eager bits.  ``ints``: block, random bits, seed and offset (signed 64-bit; 0
    where a tensor gives them), the RHT size (0: none), rht_bf16.  ``output``: "codes",
    "fp4x2" (codes and scales returned), "dequantized" or a GEMM's operand in bf16 or fp32,
    "gemm_bf16" or "gemm_fp32" (the values alone)."""
    from ..kernels.blocks import fake_quantize_blocks, gemm_blocks, quantize_blocks

    block, n, seed, offset, rht, rht_bf16, index_offset = ints
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
        "rht_bf16": bool(rht_bf16),
    }
    if output == "dequantized":
        return [fake_quantize_blocks(x, element_format, block, scale_rule, amax=amax, **options)]
    if output in GEMM_OUTPUTS:
        out_dtype = GEMM_OUTPUTS[output]
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
    ints: list[int],
    element: str,
    scale_rule: str,
    mode: str,
    variant: str,
    flavour: str,
    output: str,
) -> list[Tensor]:
    if output == "dequantized":
        return [torch.empty_like(x)]
    if output in GEMM_OUTPUTS:
        return [torch.empty_like(x, dtype=GEMM_OUTPUTS[output])]
    rows, cols = x.shape
    block = ints[0]
    width = cols // 2 if output == "fp4x2" else cols
    scale_dtype = torch.float32 if scale_rule == "absmax" else torch.uint8
    codes = x.new_empty((rows, width), dtype=torch.uint8)
    return [codes, x.new_empty((rows, cols // block), dtype=scale_dtype)]


def _launch(x: Tensor, request: BlockRequest, call: KernelCall, output: str) -> Any:
    """`stochround.kernels.blocks.quantize_blocks` (``output`` "codes": the codes and
    scales), `fake_quantize_blocks` ("dequantized") or `gemm_blocks` (a key of
    `GEMM_OUTPUTS`) on x's [rows, last axis] view, through `_quantize_blocks_op`; 2-D tiles
    as the 1-D blocks of their rows."""
    fmt = request.fmt
    rows = x.numel() // x.shape[-1]
    if fmt.block is None:
        block = x.shape[-1]
    else:
        block = fmt.block[1] if isinstance(fmt.block, tuple) else fmt.block
    seed_tensor, seed = _stream_arguments(call.seed)
    offset_tensor, offset = _stream_arguments(call.offset)
    ints = [block, request.n, seed, offset, call.rht or 0, int(call.rht_bf16), request.index_offset]
    if output == "codes" and fmt.element.bits == 4:
        output = "fp4x2"
    # eager calls run the kernel directly: the op's dispatch is host time a call need not pay
    launch = _quantize_blocks_op if torch.compiler.is_compiling() else _run_quantize_blocks
    results = launch(
        x.reshape(rows, x.shape[-1]),
        call.tensor_scale,
        call.rht_signs,
        call.amax,
        seed_tensor,
        offset_tensor,
        ints,
        fmt.element.name,
        fmt.scale_rule,
        request.mode,
        request.variant,
        request.flavour,
        output,
    )
    return tuple(results) if output in ("codes", "fp4x2") else results[0]


def _quantize_kernel(x: Tensor, request: BlockRequest, call: KernelCall) -> BlockTensor:
    """The Triton kernel's quantization (`stochround.kernels.blocks.quantize_blocks`)."""
    fmt = request.fmt
    codes, scales = _launch(x, request, call, "codes")
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
        codes=_code_storage(codes, fmt.element),
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


def check_call(
    x: object,
    fmt: str | BlockFormat,
    mode: str,
    *,
    axis: object,
    block: object,
    scale_rule: object,
    nvfp4_flavour: object,
    rbits: int | None,
    variant: str,
    hardware: str | None,
    backend: str,
    index_offset: object = 0,
) -> tuple[Tensor, BlockRequest]:
    """x and the call's choices, each checked (an error naming it)."""
    x = check_input(x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to hold blocks; got a 0-d tensor")
    resolved = resolve_block_format(fmt, block, scale_rule)
    mode = check_mode(mode)
    check_choice("variant", variant, VARIANTS)
    check_backend(backend)
    flavour = check_flavour(nvfp4_flavour)
    if mode != "sr" and rbits is not None:
        raise ValueError(f"rbits applies to mode='sr' only; got mode={mode!r}")
    n = check_rbits(rbits)
    if hardware is not None:
        if mode != "sr" or rbits is not None or variant != "c":
            raise ValueError(
                f"hardware={hardware!r} is an SR unit that sets rbits and variant: pass "
                "mode='sr' and leave rbits and variant at their defaults"
            )
        unit = preset(hardware, resolved.element)
        if unit.target != resolved.element:
            raise ValueError(
                f"hardware={hardware!r} rounds to {unit.target.name}, not to {resolved.name}'s "
                f"elements ({resolved.element.name})"
            )
        n = unit.rbits
    axis_index = check_axis(axis, x.dim())
    check_blocks(resolved, x.shape, axis_index)
    if resolved.block is None and x.shape[axis_index] == 0:
        # a row of nothing has no scale amax / max (and its blocks no length to divide by)
        raise ValueError(
            f"whole-row blocks (block=None: one scale per row along axis {axis_index}) need "
            "a nonempty axis; its length is 0"
        )
    hardware_name = None if hardware is None else str(hardware)
    index_offset = check_index_offset(index_offset)
    return x, BlockRequest(
        resolved, mode, n, variant, axis_index, flavour, hardware_name, index_offset
    )


def absolute_max(x: Tensor) -> Tensor:
    """max |x| in fp32, a 0-d tensor: NaN if x holds a NaN, 0 for an x with no elements
    (nothing raises the maximum of |x| >= 0), as the kernels' amax gives it."""
    if not x.numel():
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.abs().amax().to(torch.float32)


# --- DTensor inputs: each rank quantizes its shard of whole rows ------------------------------


class ShardLayout(NamedTuple):
    """Where this rank's shard of a DTensor x lies and where its outputs go in the whole
    tensor's: ``first_index``, the global row-major index of the shard's first element
    (``first_row * row_length``); the global shapes of the codes and of the scales
    (swizzled where swizzled) and the shard's first row in each; ``scale_shape``, the
    global unswizzled scales' shape."""

    first_index: int
    codes_shape: tuple[int, ...]
    codes_first: int
    scales_shape: tuple[int, ...]
    scales_first: int
    scale_shape: tuple[int, ...]


def output_shapes(
    shape: typing.Sequence[int], fmt: BlockFormat, axis: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The codes' and the (unswizzled) scales' shapes of the `BlockTensor` of x of ``shape``
    quantized along ``axis``: the quantized layout (1-D blocks: the axis moved last), 4-bit
    codes two a byte, one scale a block (a tile)."""
    layout = list(shape)
    block = fmt.block
    if not isinstance(block, tuple):
        layout.append(layout.pop(axis))
    codes = [*layout[:-1], layout[-1] // 2 if fmt.element.bits == 4 else layout[-1]]
    if isinstance(block, tuple):
        scales = [*layout[:-2], layout[-2] // block[0], layout[-1] // block[1]]
    else:
        scales = [*layout[:-1], layout[-1] // (layout[-1] if block is None else block)]
    return tuple(codes), tuple(scales)


def every_shard_rows(x: DTensor) -> list[tuple[int, int]]:
    """(first row, rows) along dimension 0 of the shard of every rank of x's mesh:
    computed alike on every rank, so that a rule refusing one rank's shard refuses the call
    on every rank (none is left waiting in the amax's all-reduce)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = x.device_mesh
    shards = []
    for coordinate in itertools.product(*(range(size) for size in mesh.shape)):
        shape, offset = _compute_local_shape_and_global_offset(
            x.shape, mesh.shape, list(coordinate), x.placements
        )
        shards.append((offset[0], shape[0]))
    return shards


def check_placements(x: DTensor, fmt: BlockFormat, axis: int) -> bool:
    """Whether some placement of x shards it; ValueError unless every placement is
    `Replicate` or `Shard(0)` (a shard of whole rows) and, where x is sharded, the 1-D
    blocks run along another axis than 0 (no shard cuts a block)."""
    from torch.distributed.tensor import Replicate, Shard

    sharded = False
    for placement in x.placements:
        if isinstance(placement, Replicate):
            continue
        # exactly Shard: its subclass _StridedShard holds no range of whole rows
        if type(placement) is not Shard or placement.dim != 0:
            raise ValueError(
                "a DTensor x must be placed Replicate or Shard(0) (each shard a range of "
                f"whole rows, the blocks along the last axis); got placements {x.placements}: "
                f"{placement} is not supported"
            )
        sharded = True
    if sharded and axis == 0 and not isinstance(fmt.block, tuple):
        raise ValueError(
            f"x sharded as {x.placements} cuts its axis 0, which the blocks run along: "
            "quantize a Shard(0) x along another axis (the last: axis=-1)"
        )
    return sharded


def shard_layout(x: DTensor, request: BlockRequest, swizzle: bool) -> ShardLayout:
    """This rank's `ShardLayout`, the sharding rules checked for every rank's shard
    (ValueError naming the rule and the shard's rows): placements `Replicate` or `Shard(0)`
    (`check_placements`); 2-D tiles over x's two axes: every shard's first row and row
    count multiples of the tile's rows; swizzled scales: every shard's scale rows start on
    a 128-row scale tile and fill their tiles (the last shard's may end short), so that
    the swizzled shards are the chunks of the whole tensor's swizzled scales."""
    fmt, axis = request.fmt, request.axis
    sharded = check_placements(x, fmt, axis)
    shards = every_shard_rows(x) if sharded else []
    block = fmt.block
    # the rows of x per row of scales along dimension 0 (2-D tiles over x's two axes)
    tile_rows = block[0] if isinstance(block, tuple) and x.dim() == 2 else 1
    codes_shape, scale_shape = output_shapes(x.shape, fmt, axis)
    # the swizzle's [rows, cols] view: scale matrix rows per scale row of dimension 0
    per_row, matrix_rows = math.prod(scale_shape[1:-1]), math.prod(scale_shape[:-1])
    for first, rows in shards:
        if first % tile_rows or rows % tile_rows:
            raise ValueError(
                f"2-D blocks {block} must not straddle shards: every shard's first row and "
                f"row count must be multiples of {tile_rows}; a shard holds rows "
                f"{first}..{first + rows} of {x.shape[0]} (placements {x.placements})"
            )
        start, count = first // tile_rows * per_row, rows // tile_rows * per_row
        tile = SCALE_TILE[0]
        if swizzle and (start % tile or (count % tile and start + count != matrix_rows)):
            raise ValueError(
                "swizzle=True with a sharded x needs every shard's scale rows to start on a "
                f"multiple of {tile} and fill {tile}-row tiles (the last shard excepted), so "
                f"that its swizzled scales are a chunk of the whole tensor's; a shard holds "
                f"scale rows {start}..{start + count} of {matrix_rows}: pass swizzle=False"
            )
    local_shape, offset = local_block(x)
    first_row = offset[0] if local_shape[0] else 0
    scales_shape, scales_first = scale_shape, first_row // tile_rows
    if swizzle:
        scales_shape = swizzled_shape(matrix_rows, scale_shape[-1])
        scales_first = swizzled_shape(scales_first * per_row, 1)[0]
    return ShardLayout(
        first_row * math.prod(x.shape[1:]),
        codes_shape,
        first_row,
        scales_shape,
        scales_first,
        scale_shape,
    )


def as_shards(local: Tensor, x: DTensor, shape: tuple[int, ...], first: int) -> DTensor:
    """``local`` (an output of this rank's shard) as the DTensor of global ``shape`` with
    x's mesh and placements; ValueError unless it is that DTensor's shard on this rank
    (its shape, and its first row ``first``)."""
    expected, offset = block_of(torch.Size(shape), x.device_mesh, x.placements)
    if tuple(local.shape) != tuple(expected) or (local.numel() and offset[0] != first):
        raise ValueError(
            f"x of shape {tuple(x.shape)} sharded as {x.placements}: this rank's output of "
            f"shape {tuple(local.shape)} from row {first} is not the shard {tuple(expected)} "
            f"from row {offset[0]} of the whole output of shape {shape}"
        )
    return placed(local, x.device_mesh, x.placements, shape)


def global_amax(x: DTensor, amax: Tensor) -> Tensor:
    """The amax of the whole of x from this rank's shard's ``amax`` (fp32, 0-d): the
    maximum over the ranks of each mesh dimension that shards x (all-reduce MAX), NaN if
    any shard's is NaN (the NaN travels as a flag: a reduction's MAX need not keep it)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    nan = amax.isnan()
    stats = torch.stack([torch.where(nan, torch.zeros_like(amax), amax), nan.to(amax.dtype)])
    for dim, placement in enumerate(x.placements):
        if isinstance(placement, Shard):
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=x.device_mesh.get_group(dim))
    return torch.where(stats[1] > 0, torch.full_like(stats[0], float("nan")), stats[0])


def sharded_tensor_scale(
    x: DTensor, local: Tensor, request: BlockRequest, rest: dict[str, Any]
) -> TensorScale:
    """NVFP4's tensor scales of the whole of x (a `TensorScale`): ``nvfp4_tensor_scales`` of
    the global amax of x rotated as the call rotates it (``rest``: the call's rht,
    rht_signs, rht_bf16), the same on every rank."""
    rotated, _ = _rotate(local, rest["rht"], rest["rht_signs"], request.axis, rest["rht_bf16"])
    return nvfp4_tensor_scales(global_amax(x, absolute_max(rotated)), request.flavour)


def sharded_call(
    x: DTensor, options: dict[str, Any], swizzle: bool
) -> tuple[Tensor, ShardLayout, dict[str, Any]]:
    """A call on a DTensor x checked, and what each rank's call on its local tensor takes:
    the local tensor, its `ShardLayout`, and the options (``call``, ``stream``, ``rest``,
    as `fake_quantize` builds them) with ``index_offset`` moved by the shard's first index
    and NVFP4's tensor scale from the global amax given.  SR needs ``seed=`` or
    ``stream=``: a seed drawn from each rank's generator need not agree across ranks."""
    x_checked, request = check_call(x, **options["call"])
    rest = options["rest"]
    _check_extras(x_checked, request, rest["tensor_scale"], rest["rht"], rest["rht_signs"])
    layout = shard_layout(x, request, swizzle)
    seed, _, stream = options["stream"]
    if request.mode == "sr" and seed is None and stream is None:
        raise ValueError(
            "a DTensor x rounded with mode='sr' needs seed= (or stream=): every rank must "
            "draw the same words, and a seed drawn from each rank's generator need not agree"
        )
    local = x.to_local()
    tensor_scale = rest["tensor_scale"]
    if _tensor_scale_choice(request.fmt, tensor_scale) == "amax":
        tensor_scale = sharded_tensor_scale(x, local, request, rest)
    call = {**options["call"], "index_offset": request.index_offset + layout.first_index}
    local_options = {**options, "call": call, "rest": {**rest, "tensor_scale": tensor_scale}}
    return local, layout, local_options


def quantize_shards(x: DTensor, options: dict[str, Any], swizzle: bool) -> BlockTensor:
    """`quantize` of a DTensor x: each rank quantizes its local tensor (`sharded_call`); the
    codes and scales are DTensors with x's mesh and placements, equal (``full_tensor()``)
    to the unsharded call's; the tensor scale a plain 0-d tensor, the same on every rank."""
    local, layout, local_options = sharded_call(x, options, swizzle)
    seed, offset, stream = local_options["stream"]
    q = quantize(
        local,
        **local_options["call"],
        **local_options["rest"],
        seed=seed,
        offset=offset,
        stream=stream,
        swizzle=swizzle,
    )
    return dataclasses.replace(
        q,
        codes=as_shards(q.codes, x, layout.codes_shape, layout.codes_first),
        scales=as_shards(q.scales, x, layout.scales_shape, layout.scales_first),
        shape=x.shape,
        scale_shape=layout.scale_shape,
    )


def fake_quantize_shards(x: DTensor, clip_mask: bool, options: dict[str, Any]) -> DTensor:
    """`fake_quantize` of a DTensor x: each rank's local tensor fake-quantized as a shard
    of the whole (`sharded_call`), the result a
    DTensor placed as x (the straight-through gradient passes through ``to_local`` and
    ``from_local``)."""
    from torch.distributed.tensor import DTensor

    local, _, local_options = sharded_call(x, options, False)
    seed, offset, stream = local_options["stream"]
    out = fake_quantize(
        local,
        clip_mask=clip_mask,
        **local_options["call"],
        **local_options["rest"],
        seed=seed,
        offset=offset,
        stream=stream,
    )
    return DTensor.from_local(out, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())


def dequantize_shards(q: BlockTensor, dtype: torch.dtype | None, unrotate: bool) -> Tensor:
    """`BlockTensor.dequantize` of a sharded one (codes and scales DTensors): each rank
    dequantizes its shard; a DTensor placed as the
    codes, of x's shape."""
    codes = typing.cast("DTensor", q.codes)
    scales = typing.cast("DTensor", q.scales)
    mesh, placements = codes.device_mesh, codes.placements
    local_shape, _ = block_of(q.shape, mesh, placements)
    _, scale_shape = output_shapes(local_shape, q.format, q.axis)
    local = dataclasses.replace(
        q,
        codes=codes.to_local(),
        scales=scales.to_local(),
        shape=torch.Size(local_shape),
        scale_shape=scale_shape,
    )
    return placed(local.dequantize(dtype, unrotate=unrotate), mesh, placements, q.shape)


def quantize(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    axis: int = -1,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    swizzle: bool = False,
) -> BlockTensor:
    """Quantize x into a block-scaled format: each block's scale from its amax by the scale
    rule, the elements ``fp32(x) * multiplier`` rounded to the element format (module
    docstring; the rules in `stochround.blocks.scales`).

    Args:
        x: a float64, float32, bfloat16 or float16 tensor (TypeError otherwise); its
            values are scaled in fp32 (float64 values are rounded to fp32 first).
        fmt: a block format name (`BLOCK_FORMATS`) or a `BlockFormat`.
        mode: the elements' rounding mode: rne, rna, rz, ru, rd, ro or sr.
        axis: the axis the 1-D blocks run along (moved last in the codes and scales);
            2-D tiles cover the last two axes (axis -1).
        block: replaces the format's block (an int, a 2-D tile ``(rows, cols)``, or None
            for the format's); it must divide the axis (ValueError; no padding).
        scale_rule: replaces the format's scale rule (one of `SCALE_RULES`, matching its
            scale format: the power-of-two rules for E8M0 scales).
        tensor_scale: NVFP4's per-tensor scale: None computes it from x's amax, a float
            or one-element tensor gives the decoding scale (delayed scaling; stored as
            ``BlockTensor.tensor_scale``; positive and finite, else ValueError, checked
            for numbers and CPU tensors), False quantizes single-level.
        nvfp4_flavour: "te" (default) or "torchao": whose operation order computes NVFP4
            scales (`stochround.blocks.scales`).
        rht: the size of a random Hadamard transform applied along ``axis`` before
            quantizing (16..256, dividing the axis), or None.
        rht_signs: its ±1 signs (a tensor of ``rht`` values), or None for
            ``random_signs(rht, seed=RHT_SEED)``: one fixed rotation for every call, so
            that two GEMM operands share it whatever their rounding seeds.
        rht_bf16: round the rotated values to bf16 before taking amax (as TE does).
        rbits, variant: limited-bit SR (1..32 random bits; None: exact SR) and its variant
            a/b/c/odd, as `stochround.round`.
        seed, offset, stream: the SR stream, as `stochround.round` takes them (seed None:
            drawn from torch's default generator; ``stream`` advances by one per SR call).
            Element ``i`` (row-major index in x) draws ``random_words(i, seed, offset)``.
        hardware: a hardware SR preset for the elements (for instance
            ``"nvidia-cvt-rs-e2m1"``), with mode "sr".
        index_offset: the global row-major index of x's first element in the tensor x is
            a shard of (element ``i`` draws the word of ``index_offset + i``): a shard of
            whole rows quantized with ``index_offset = first_row * row_length`` gets the
            bits of the same rows of the whole tensor.
        backend: "auto" (the Triton kernel for CUDA tensors it serves, else the PyTorch
            path), "torch" or "triton".
        swizzle: store the scales in the 128x4 tiled layout (`swizzle_scales`).

    A DTensor x (placements `Replicate` or `Shard(0)`, on any mesh: each rank's shard a
    range of whole rows) is quantized shard by shard, each rank its local tensor with the
    words of its elements' global indices and NVFP4's tensor scale from the global amax
    (an all-reduce over the mesh dimensions that shard x): the codes and scales are
    DTensors placed as x, equal (``full_tensor()``) to the unsharded call's bit for bit;
    ``dequantize()`` gives a DTensor placed as x.  ValueError for: the blocks along axis 0
    of a sharded x; 2-D tiles over x's two axes that a shard boundary cuts (every shard's
    first row and row count must be multiples of the tile's rows); swizzled scales whose
    shards are not the chunks of the whole tensor's (each shard's scale rows from a
    multiple of 128, filling their tiles); other placements (`Shard(d)` of another
    dimension, `Partial`, `_StridedShard`); and mode "sr" without ``seed=`` or
    ``stream=`` (the ranks must agree on the seed).

    Returns a `BlockTensor`.
    """
    if is_dtensor(x):
        checked = dict(
            fmt=fmt, mode=mode, axis=axis, block=block, scale_rule=scale_rule,
            nvfp4_flavour=nvfp4_flavour, rbits=rbits, variant=variant, hardware=hardware,
            backend=backend, index_offset=index_offset,
        )  # fmt: skip
        rest = dict(tensor_scale=tensor_scale, rht=rht, rht_signs=rht_signs, rht_bf16=rht_bf16)
        options = {"call": checked, "stream": (seed, offset, stream), "rest": rest}
        return quantize_shards(x, options, swizzle)
    x, request = check_call(
        x,
        fmt,
        mode,
        axis=axis,
        block=block,
        scale_rule=scale_rule,
        nvfp4_flavour=nvfp4_flavour,
        rbits=rbits,
        variant=variant,
        hardware=hardware,
        backend=backend,
        index_offset=index_offset,
    )
    if not isinstance(rht_bf16, bool) or not isinstance(swizzle, bool):
        raise TypeError("rht_bf16 and swizzle must be bools")
    _check_extras(x, request, tensor_scale, rht, rht_signs)
    seed_value, offset_value = _random_source(mode, seed, offset, stream)
    if uses_kernel(x, request, backend, rht, swizzle):
        rotation = (rht, rht_signs, rht_bf16)
        call = _kernel_call(x, request, tensor_scale, rotation, seed_value, offset_value)
        return _quantize_kernel(x, request, call)
    result, _ = quantize_torch(
        x,
        request,
        tensor_scale=tensor_scale,
        rht=rht,
        rht_signs=rht_signs,
        rht_bf16=rht_bf16,
        seed=seed_value,
        offset=offset_value,
        swizzle=swizzle,
    )
    return result


class _FakeQuantize(torch.autograd.Function):
    """Quantize-dequantize with a straight-through gradient (masked where clipped)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, clip_mask: bool, options: dict[str, Any]) -> Tensor:
        x_checked, request = check_call(x, **options["call"])
        rest = options["rest"]
        _check_extras(x_checked, request, rest["tensor_scale"], rest["rht"], rest["rht_signs"])
        seed, offset = _random_source(request.mode, *options["stream"])
        backend = options["call"]["backend"]
        ctx.clip_mask = clip_mask
        if not clip_mask and uses_kernel(x_checked, request, backend, rest["rht"], False):
            rotation = (rest["rht"], rest["rht_signs"], rest["rht_bf16"])
            call = _kernel_call(x_checked, request, rest["tensor_scale"], rotation, seed, offset)
            return _launch(x_checked, request, call, "dequantized").reshape(x.shape)
        q, clipped = quantize_torch(x_checked, request, seed=seed, offset=offset, **options["rest"])
        if clip_mask:
            ctx.save_for_backward(clipped)
        return q.dequantize(x.dtype, unrotate=True)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        if ctx.clip_mask:
            (clipped,) = ctx.saved_tensors
            grad = torch.where(clipped, torch.zeros_like(grad), grad)
        return grad, None, None


def fake_quantize(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    clip_mask: bool = False,
    axis: int = -1,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
) -> Tensor:
    """``quantize(x, ...).dequantize(x.dtype, unrotate=True)``: the quantized values in x's
    dtype, shape and basis (a Hadamard rotation is undone), with a straight-through
    gradient: d out / d x := 1, or 0 where ``clip_mask`` is True and the element's scaled
    value lay beyond the element's finite range (saturated).  The other arguments as in
    `quantize`; the Triton kernel writes the dequantized values itself where it serves the
    call (``backend``, routed as `quantize` routes it), except with ``clip_mask``, whose
    mask the PyTorch path computes.  A DTensor x (`Replicate` or `Shard(0)`, the rules of
    `quantize`) gives a DTensor placed as x, equal (``full_tensor()``) to the unsharded
    call's: each rank fake-quantizes its shard."""
    check_backend(backend)
    if backend == "triton" and clip_mask:
        raise ValueError("clip_mask=True runs on the PyTorch path: pass backend='auto' or 'torch'")
    if not isinstance(clip_mask, bool):
        raise TypeError(f"clip_mask must be a bool, got {type(clip_mask).__name__}")
    call = dict(
        fmt=fmt, mode=mode, axis=axis, block=block, scale_rule=scale_rule,
        nvfp4_flavour=nvfp4_flavour, rbits=rbits, variant=variant, hardware=hardware,
        backend=backend, index_offset=index_offset,
    )  # fmt: skip
    rest = dict(tensor_scale=tensor_scale, rht=rht, rht_signs=rht_signs, rht_bf16=rht_bf16)
    options = {"call": call, "stream": (seed, offset, stream), "rest": rest}
    if is_dtensor(x):
        return fake_quantize_shards(x, clip_mask, options)
    return _FakeQuantize.apply(x, clip_mask, options)


def gemm_operand(
    x: Tensor,
    fmt: str | BlockFormat,
    mode: str = "rne",
    *,
    block: Block = None,
    scale_rule: str | None = None,
    tensor_scale: Tensor | float | bool | None = None,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    rbits: int | None = None,
    variant: str = "c",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    stream: streams.Stream | None = None,
    hardware: str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
) -> GemmOperand:
    """``gemm_operand_of(quantize(x, ...))``: a 2-D x quantized along its last axis (the
    GEMM's contraction axis) as a GEMM takes it (`GemmOperand`), the rotated basis kept.
    Arguments as `quantize` takes them; the Triton kernel writes the values itself where
    it serves the call (blocks with their own scales: not whole rows, whose scales the
    `GemmOperand` keeps apart), as exact as the codes."""
    x_checked, request = check_call(
        x,
        fmt,
        mode,
        axis=-1,
        block=block,
        scale_rule=scale_rule,
        nvfp4_flavour=nvfp4_flavour,
        rbits=rbits,
        variant=variant,
        hardware=hardware,
        backend=backend,
        index_offset=index_offset,
    )
    if x_checked.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, contraction); got shape {tuple(x.shape)}")
    if request.fmt.block is None or not uses_kernel(x_checked, request, backend, rht, False):
        q = quantize(
            x_checked,
            request.fmt,
            mode,
            tensor_scale=tensor_scale,
            nvfp4_flavour=nvfp4_flavour,
            rht=rht,
            rht_signs=rht_signs,
            rht_bf16=rht_bf16,
            rbits=rbits,
            variant=variant,
            seed=seed,
            offset=offset,
            stream=stream,
            hardware=hardware,
            index_offset=index_offset,
            backend=backend,
        )
        return gemm_operand_of(q)
    _check_extras(x_checked, request, tensor_scale, rht, rht_signs)
    seed_value, offset_value = _random_source(mode, seed, offset, stream)
    rotation = (rht, rht_signs, rht_bf16)
    call = _kernel_call(x_checked, request, tensor_scale, rotation, seed_value, offset_value)
    output = "gemm_bf16" if request.fmt.gemm_dtype == torch.bfloat16 else "gemm_fp32"
    values = _launch(x_checked, request, call, output)
    factor = RESCALE if request.fmt.scale_rule == "floor-3/4" else 1.0
    return GemmOperand(values, _decoding(call), None, factor)


def to_nvfp4(x: Tensor, rounding_mode: str = "rn", **options: Any) -> BlockTensor:
    """``quantize(x, "nvfp4", mode)`` with torchao RFC #3264's names for the mode:
    ``rounding_mode="rn"`` (round to nearest-even) or ``"rs"`` (stochastic rounding); the
    other keyword arguments as `quantize` takes them."""
    check_choice("rounding_mode", rounding_mode, tuple(ROUNDING_MODES))
    if "mode" in options:
        raise ValueError("to_nvfp4 takes rounding_mode= ('rn' or 'rs'), not mode=")
    return quantize(x, "nvfp4", ROUNDING_MODES[rounding_mode], **options)


__all__ = [
    "GEMM_OUTPUTS",
    "MAX_KERNEL_ROW",
    "RHT_SEED",
    "ROUNDING_MODES",
    "BlockRequest",
    "BlockTensor",
    "GemmOperand",
    "ShardLayout",
    "as_shards",
    "check_axis",
    "check_blocks",
    "check_call",
    "check_placements",
    "dequantize_shards",
    "dequantize_values",
    "element_values",
    "every_shard_rows",
    "fake_quantize",
    "fake_quantize_shards",
    "format_state",
    "gemm_operand",
    "gemm_operand_of",
    "global_amax",
    "output_shapes",
    "quantize",
    "quantize_shards",
    "quantize_torch",
    "rebuild_block_tensor",
    "resolve_block_format",
    "same_bits",
    "scale_and_multiplier",
    "scale_values",
    "scaled_elements",
    "shard_layout",
    "sharded_call",
    "sharded_tensor_scale",
    "tile_amax",
    "to_nvfp4",
    "uses_kernel",
]
