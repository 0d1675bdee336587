"""The data of a block-quantized tensor: `BlockTensor` (codes, scales and how to read them
back), its values decoded, and `GemmOperand`, the form a block-scaled GEMM takes.
The manual: docs/guide/blocks.md."""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from ..block_constants import RESCALE
from ..formats import Format
from ..packing import unpack
from ..rounding import decode
from ..shards import block_of, is_dtensor, placed
from .formats import Block, BlockFormat
from .hadamard import inverse_hadamard
from .layout import unswizzle_scales
from .scales import e8m0_bits

if TYPE_CHECKING:  # for annotations only: importing distributed costs every plain call
    from torch.distributed.tensor import DTensor

__all__ = [
    "BlockTensor",
    "GemmOperand",
    "folded_tensor_scale",
    "gemm_factor",
    "gemm_operand_of",
    "output_shapes",
    "rebuild_block_tensor",
    "stored_codes",
]


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
            return _dequantize_shards(self, dtype, unrotate)
        values = _dequantize_values(self)
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
        return all(_same_bits(getattr(self, name), getattr(other, name)) for name in tensors)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled (torch.save) as `rebuild_block_tensor` of tensors and plain data, which
        torch.load's ``weights_only`` unpickler accepts."""
        state = {
            "codes": self.codes,
            "scales": self.scales,
            "tensor_scale": self.tensor_scale,
            "format": _format_state(self.format),
            "axis": self.axis,
            "shape": tuple(self.shape),
            "dtype": str(self.dtype).removeprefix("torch."),
            "rht": self.rht,
            "rht_signs": self.rht_signs,
            "swizzled": self.swizzled,
            "scale_shape": tuple(self.scale_shape),
        }
        return rebuild_block_tensor, (state,)


def _same_bits(a: Tensor | None, b: Tensor | None) -> bool:
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


def _format_state(fmt: BlockFormat) -> dict[str, Any]:
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


# torch.load(weights_only=True) calls only the functions registered as safe; files saved
# before the function moved here name it in stochround.blocks.quantize, registered alike
torch.serialization.add_safe_globals(
    [
        rebuild_block_tensor,
        (rebuild_block_tensor, "stochround.blocks.quantize.rebuild_block_tensor"),
    ]
)


def _element_values(q: BlockTensor) -> Tensor:
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
    if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return codes.to(torch.float32)  # torch's conversion: the table's values, exactly
    values = _table_on(table, codes.device)
    return values[integers.to(torch.int64) & (len(table) - 1)]


# the element tables copied to a device once (eagerly): a copy per call would cost a
# host-to-device transfer each time, which a CUDA graph cannot capture
_TABLES: dict[tuple[tuple[float, ...], torch.device], Tensor] = {}


def _table_on(table: tuple[float, ...], device: torch.device) -> Tensor:
    """``table`` as an fp32 tensor on ``device``: kept after the first eager call (traced
    as a constant under torch.compile)."""
    if torch.compiler.is_compiling():
        return torch.tensor(table, dtype=torch.float32, device=device)
    key = (table, device)
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(table, dtype=torch.float32, device=device)
    return _TABLES[key]


def _scale_values(q: BlockTensor, *, tensor_scale: bool = True) -> Tensor:
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


def _scaled_elements(elements: Tensor, scales: Tensor, block: Block) -> Tensor:
    """Each element (fp32, quantized layout) times its block's scale, in that layout."""
    if isinstance(block, tuple):
        *lead, rows, cols = elements.shape
        tiles = elements.reshape(*lead, rows // block[0], block[0], cols // block[1], block[1])
        return (tiles * scales.unsqueeze(-1).unsqueeze(-3)).reshape(elements.shape)
    length = elements.shape[-1]
    size = length if block is None else block
    blocks = elements.reshape(*elements.shape[:-1], length // size, size)
    return (blocks * scales.unsqueeze(-1)).reshape(elements.shape)


def _dequantize_values(q: BlockTensor) -> Tensor:
    """The dequantized values in fp32 and x's layout (rotated basis)."""
    values = _scaled_elements(_element_values(q), _scale_values(q), q.format.block)
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

    def transposed_values(self) -> GemmOperand:
        """The operand with its values' transposed view (an operand held as its transpose,
        (K, N), given back as (N, K)); its scales are one per tensor, which transposing
        leaves as they are."""
        return self._replace(values=self.values.T)


def gemm_factor(fmt: BlockFormat) -> float:
    """The factor a GEMM's result takes for ``fmt``'s operand: floor-3/4's fp32 4/3, else
    1.0."""
    return RESCALE if fmt.scale_rule == "floor-3/4" else 1.0


def gemm_operand_of(q: BlockTensor) -> GemmOperand:
    """The `GemmOperand` of a `BlockTensor` of a 2-D x quantized along its last axis (the
    rotated basis kept: a GEMM of two operands rotated alike needs no inverse)."""
    if len(q.shape) != 2 or q.axis != 1 or q.swizzled:
        raise ValueError(
            "a GEMM operand is a 2-D tensor quantized along its last axis, scales unswizzled; "
            f"got shape {tuple(q.shape)}, axis {q.axis}, swizzled {q.swizzled}"
        )
    elements = _element_values(q)
    scales = _scale_values(q, tensor_scale=False)
    row_scale = None
    if q.format.block is None:
        values, row_scale = elements, scales
    else:
        values = _scaled_elements(elements, scales, q.format.block)
    factor = gemm_factor(q.format)
    return GemmOperand(values.to(q.format.gemm_dtype), q.tensor_scale, row_scale, factor)


def folded_tensor_scale(operand: GemmOperand) -> GemmOperand:
    """The operand with its tensor scale multiplied into its values and none left to the
    GEMM: exact where the scale is a power of two that keeps every value in the values'
    dtype, as NVFP4's "pow2" flavour makes it (`stochround.blocks.scales`); the products
    in fp32, stored in the values' dtype."""
    scale = operand.tensor_scale
    if scale is None:
        return operand
    values = (operand.values.to(torch.float32) * scale.to(torch.float32)).to(operand.values.dtype)
    return operand._replace(values=values, tensor_scale=None)


def stored_codes(codes: Tensor, element: Format) -> Tensor:
    """Codes in their stored dtype: float8 dtypes for e4m3fn/e5m2, int8 for two's
    complement grids, uint8 otherwise."""
    if element.name in ("e4m3fn", "e5m2") and element.torch_dtype is not None:
        return codes.view(element.torch_dtype)
    if element.twos_complement and element.bits == 8:
        return codes.view(torch.int8)
    return codes


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


def _dequantize_shards(q: BlockTensor, dtype: torch.dtype | None, unrotate: bool) -> Tensor:
    """`BlockTensor.dequantize` of a sharded one (codes and scales DTensors): each rank
    dequantizes its shard, the result a DTensor placed as the codes, of x's shape.  Here,
    not in `sharded`, so that a BlockTensor reads back whatever made it: it needs only
    `stochround.shards`' placement helpers, not the quantize path's sharding rules."""
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
