"""Block-scaled formats: the `BlockFormat` description and the registry of named ones.

A block format stores a tensor as small *elements* (any `Format`) and, for each block of
consecutive elements along one axis (or each 2-D tile of the last two axes), one *scale*
shared by the block:  ``value = element * scale (* tensor_scale)``.  The scale is chosen
from the block's largest magnitude ``amax`` by a *scale rule* (`stochround.blocks.scales`),
and NVFP4 adds one FP32 scale for the whole tensor.

The named formats:

* OCP Microscaling (MX) v1.0: ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``,
  ``mxfp6_e3m2``, ``mxfp4`` and ``mxint8``: blocks of 32, an E8M0 (power of two) scale
  chosen by the spec's rule ``2**(floor(log2 amax) - emax_elem)`` (``"floor"``).  MXINT8's
  elements are 8-bit two's complement integers times ``2**-6`` (the `OCP_INT8` grid, whose
  ``emax`` is 0).  Its code ``-128`` (the value -2) decodes, as gfloat's ``ocp_int8``
  decodes it, but quantization never stores it: the scaled values are clamped to the
  symmetric range ``[-127/64, 127/64]``, the spec's ``±1 63/64`` and the range Microsoft's
  microxcaling library clamps MX int8 to (at the scale ``2**127``, -2 would dequantize a
  finite block to an fp32 -inf).
* NVIDIA NVFP4: ``nvfp4``: blocks of 16 E2M1 elements, an E4M3 scale, and an FP32
  per-tensor scale (rule ``"nvfp4"``).
* ``int8_rowwise``: int8 elements with one scale per row (the whole last axis: ``block`` is
  None), ``amax / 127`` held in x's dtype, as torchao's ``quantize_int8_rowwise`` (rule
  ``"absmax"``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import struct
from dataclasses import dataclass

import torch

from ..block_constants import POWER_OF_TWO_RULES, SCALE_RULES
from ..formats import FORMATS, Format
from ..formats import format as find_format
from ..kernels.availability import kernel_supports
from ..torch_path import decode_values

# MXINT8's element grid: two's complement 8-bit integers times 2**-6 (k / 64, k in
# -128..127), so that its emax is 0 as the OCP spec states (gfloat's ``ocp_int8``)
OCP_INT8 = Format(
    ebits=0, mbits=7, bias=0, inf=False, nan="none", twos_complement=True, name="ocp_int8"
)

_E8M0 = find_format("e8m0")
_E4M3 = find_format("e4m3fn")
_FP32 = find_format("binary32")

# the scale format each rule needs
_RULE_SCALES = {
    **dict.fromkeys(POWER_OF_TWO_RULES, (_E8M0,)),
    "nvfp4": (_E4M3,),
    "absmax": (_FP32,),
}

Block = int | tuple[int, int] | None


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format.

    ``name``: the registry name (or a caller's own); ``element``: the elements' `Format`;
    ``block``: the block length along the quantized axis (an int), a 2-D tile
    ``(rows, cols)`` over the last two axes, or None for the whole axis (one scale per
    row); ``scale``: the scale's format (e8m0 for the power-of-two rules, e4m3fn for
    ``"nvfp4"``, binary32 for ``"absmax"``); ``scale_rule``: how a block's scale follows
    from its amax (one of `SCALE_RULES`, `stochround.blocks.scales`); ``tensor_scale``:
    whether an FP32 per-tensor scale sits above the block scales (NVFP4's second level).
    """

    name: str
    element: Format
    block: Block
    scale: Format | None
    scale_rule: str
    tensor_scale: bool = False

    # set by __post_init__ from the element format (not fields)
    element_max: float = dataclasses.field(init=False, repr=False, compare=False)
    kernel_element: bool = dataclasses.field(init=False, repr=False, compare=False)
    element_emax: int = dataclasses.field(init=False, repr=False, compare=False)
    element_mbits: int = dataclasses.field(init=False, repr=False, compare=False)
    element_table: tuple[float, ...] | None = dataclasses.field(
        init=False, repr=False, compare=False
    )
    gemm_dtype: torch.dtype = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        if not isinstance(self.element, Format):
            raise TypeError(f"element must be a Format, got {type(self.element).__name__}")
        object.__setattr__(self, "block", check_block(self.block))
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(
                f"scale_rule must be one of {', '.join(map(repr, SCALE_RULES))}; "
                f"got {self.scale_rule!r}"
            )
        allowed = _RULE_SCALES[self.scale_rule]
        if self.scale not in allowed:
            names = ", ".join(fmt.name for fmt in allowed)
            got = None if self.scale is None else self.scale.name
            raise ValueError(
                f"scale rule {self.scale_rule!r} needs a scale of format {names}; got {got}"
            )
        if not isinstance(self.tensor_scale, bool):
            raise TypeError(f"tensor_scale must be a bool, got {type(self.tensor_scale).__name__}")
        if self.tensor_scale and self.scale_rule != "nvfp4":
            raise ValueError("tensor_scale=True (a per-tensor FP32 scale) needs scale_rule 'nvfp4'")
        # the element's numbers the rules read, as plain attributes: `Format`'s cached
        # properties take a lock, which torch.compile cannot trace
        object.__setattr__(self, "element_max", float(self.element.max))
        object.__setattr__(self, "element_emax", int(self.element.emax))
        object.__setattr__(self, "element_mbits", int(self.element.mbits))
        object.__setattr__(self, "element_table", element_table(self.element))
        object.__setattr__(self, "gemm_dtype", gemm_dtype(self))
        # whether the Triton kernel's op can name and round the element format
        registered = self.element in (FORMATS.get(self.element.name), OCP_INT8)
        object.__setattr__(self, "kernel_element", registered and kernel_supports(self.element))

    @property
    def block_size(self) -> int | None:
        """The number of elements a block holds (None: a whole row)."""
        if isinstance(self.block, tuple):
            return self.block[0] * self.block[1]
        return self.block

    def describe(self) -> str:
        """The format in words: elements, block, scale and rule, one line each."""
        element = self.element
        if isinstance(self.block, tuple):
            block = f"{self.block[0]}x{self.block[1]} tiles of the last two axes"
        elif self.block is None:
            block = "the whole axis (one scale per row)"
        else:
            block = f"{self.block} consecutive elements along the quantized axis"
        scale = "none" if self.scale is None else self.scale.name
        lines = [
            f"{self.name}: block-scaled format",
            f"  elements: {element.name} ({element.bits} bits, largest {element.max:g})",
            f"  block:    {block}",
            f"  scale:    {scale}, rule {self.scale_rule!r}: {RULE_WORDS[self.scale_rule]}",
        ]
        if self.tensor_scale:
            lines.append("  tensor:   an FP32 per-tensor scale above the block scales")
        bits = self.bits_per_element
        if bits is not None:
            lines.append(f"  storage:  {bits:g} bits per element (elements and block scales)")
        return "\n".join(lines)

    @property
    def bits_per_element(self) -> float | None:
        """Storage bits per element, the block scale shared out (None for row-wise blocks,
        whose cost depends on the row length)."""
        size = self.block_size
        if size is None or self.scale is None:
            return None
        return self.element.bits + self.scale.bits / size

    def __str__(self) -> str:
        return self.describe()


# what each rule computes, in words (`BlockFormat.describe`)
RULE_WORDS = {
    "floor": "2**(floor(log2 amax) - emax_elem) (OCP MX v1.0)",
    "rceil": "2**ceil(log2(amax / max_elem)) (cuBLAS, Transformer Engine)",
    "ceil": "2**(ceil(log2 amax) - emax_elem) (torchao CEIL)",
    "even": "2**(floor(log2 amax') - emax_elem), amax' amax rounded to the element's "
    "precision (torchao EVEN)",
    "floor-3/4": "the floor scale, elements multiplied by 3/4 first so that no value "
    "rounds past the element's max (Tseng et al.); dequantized times 4/3",
    "absmax": "amax / max_elem in x's dtype (torchao quantize_int8_rowwise)",
    "nvfp4": "e4m3(amax * S_enc / 6) with S_enc = 448 * 6 / amax_tensor (NVIDIA NVFP4)",
}


# the widest elements whose every value is tabulated (`element_table`)
TABLE_BITS = 16


def element_table(element: Format) -> tuple[float, ...] | None:
    """The value of every code of an element format of at most 16 bits (code order;
    NaN for NaN codes), or None for wider formats: dequantization looks codes up in it.
    Computed once per format (`_TABLES`, keyed by its fields): a block format rebuilt
    with another block or rule under torch.compile finds its table there."""
    key = (
        element.ebits,
        element.mbits,
        element.bias,
        element.signed,
        element.inf,
        element.nan,
        element.subnormals,
        element.twos_complement,
    )
    if key not in _TABLES:
        table = None
        if element.bits <= TABLE_BITS:
            codes = torch.arange(2**element.bits, dtype=torch.int64)
            table = tuple(decode_values(codes, element, torch.float64).tolist())
        _TABLES[key] = table
    return _TABLES[key]


_TABLES: dict[tuple[object, ...], tuple[float, ...] | None] = {}


def _in_bf16(value: float) -> bool:
    """Whether the float64 ``value`` is a bf16 value, or is beyond fp32's range (where the
    fp32 product a dequantization computes is infinite as well).  The range is tested
    first, not left to struct's OverflowError: torch.compile traces this function where a
    call builds a format (a ``scale_rule=`` override) and cannot trace that exception."""
    if abs(value) >= 2.0**128:  # the products of elements and scales hold a few bits
        return True
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return struct.unpack("<f", struct.pack("<I", bits))[0] == value and bits & 0xFFFF == 0


def _scale_values(fmt: BlockFormat) -> tuple[float, ...] | None:
    """Every finite positive block scale of ``fmt`` (None: not enumerable, an fp32 or
    x-dtype scale): 2**-127 .. 2**127 for E8M0, the positive E4M3 values for NVFP4."""
    if fmt.scale_rule in POWER_OF_TWO_RULES:
        return tuple(2.0**k for k in range(-127, 128))
    if fmt.scale_rule == "nvfp4":
        return tuple(v for v in element_table(_E4M3) or () if math.isfinite(v) and v > 0)
    return None


def gemm_dtype(fmt: BlockFormat) -> torch.dtype:
    """The dtype in which a GEMM can take ``fmt``'s operand exactly: torch.bfloat16 where
    every product ``element * block scale`` is a bf16 value (NVFP4, MXFP4, MXFP6; for a
    whole-row block, whose scale the GEMM applies to its result, every element: the int8
    grids), else torch.float32 (where E8M0's small scales take e4m3/e5m2 elements below
    bf16's subnormals, or an fp32 scale has too many bits).  The tensor scale and
    floor-3/4's 4/3 multiply the GEMM's result and do not count."""
    # keyed by the scale format (what the scale values depend on), not the rule: a rule
    # override under torch.compile finds the named format's entry and traces no loop
    key = (fmt.element, fmt.scale, fmt.block is None)
    if key not in _GEMM_DTYPES:
        elements = [v for v in fmt.element_table or () if math.isfinite(v)]
        scales = (1.0,) if fmt.block is None else _scale_values(fmt)
        exact = bool(elements) and scales is not None
        exact = exact and all(_in_bf16(e * s) for e in elements for s in scales or ())
        _GEMM_DTYPES[key] = torch.bfloat16 if exact else torch.float32
    return _GEMM_DTYPES[key]


_GEMM_DTYPES: dict[tuple[object, ...], torch.dtype] = {}


def check_block(block: object) -> Block:
    """block, checked: a positive int, a pair of positive ints (a 2-D tile) or None."""
    if block is None:
        return None
    if isinstance(block, tuple) and len(block) == 2:
        if all(_positive_int(size) for size in block):
            return (int(block[0]), int(block[1]))
    elif _positive_int(block):
        return int(block)  # type: ignore[call-overload]
    raise ValueError(
        f"block must be a positive int, a pair of positive ints (a 2-D tile) or None; got {block!r}"
    )


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _mx(name: str, element: str | Format) -> BlockFormat:
    return BlockFormat(name, find_format(element), 32, _E8M0, "floor")


BLOCK_FORMATS: dict[str, BlockFormat] = {
    fmt.name: fmt
    for fmt in (
        _mx("mxfp8_e4m3", "e4m3fn"),
        _mx("mxfp8_e5m2", "e5m2"),
        _mx("mxfp6_e2m3", "e2m3"),
        _mx("mxfp6_e3m2", "e3m2"),
        _mx("mxfp4", "e2m1"),
        _mx("mxint8", OCP_INT8),
        BlockFormat("nvfp4", find_format("e2m1"), 16, _E4M3, "nvfp4", tensor_scale=True),
        BlockFormat("int8_rowwise", find_format("int8"), None, _FP32, "absmax"),
    )
}


def block_format(name_or_format: str | BlockFormat) -> BlockFormat:
    """A named block format (case-insensitive), or a `BlockFormat` as it is; ValueError
    naming the known formats otherwise."""
    if isinstance(name_or_format, BlockFormat):
        return name_or_format
    if not isinstance(name_or_format, str):
        raise TypeError(
            f"fmt must be a block format name (str) or a BlockFormat, "
            f"got {type(name_or_format).__name__}"
        )
    key = name_or_format.strip().lower()
    if key in BLOCK_FORMATS:
        return BLOCK_FORMATS[key]
    close = difflib.get_close_matches(key, list(BLOCK_FORMATS), n=3, cutoff=0.5)
    hint = f" (closest: {', '.join(close)})" if close else ""
    raise ValueError(
        f"unknown block format {name_or_format!r}{hint}; known: {', '.join(BLOCK_FORMATS)}"
    )


__all__ = [
    "BLOCK_FORMATS",
    "OCP_INT8",
    "RULE_WORDS",
    "TABLE_BITS",
    "BlockFormat",
    "block_format",
    "check_block",
    "element_table",
]
