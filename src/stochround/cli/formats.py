"""``stochround formats`` (the registry, one row per format, then the block formats) and
``stochround info FORMAT`` (one format's properties and, for formats of at most 8 bits, every
code with its value; for a block format such as ``mxfp4``, its element, block, scale and
storage cost).

The values and classes come from the scalar reference and the block formats' registry
(`stochround.blocks.formats`); this module only lays them out.
"""

from collections.abc import Sequence
from typing import Annotated

import typer

from .. import outcomes, reference
from ..blocks.formats import BLOCK_FORMATS, RULE_WORDS, BlockFormat
from ..formats import ALIASES, FORMATS, Format
from ..formats import format as find_format
from . import output
from .output import Section

VALUE_TABLE_MAX_BITS = 8


def aliases(fmt: Format) -> list[str]:
    """The other names `stochround.format` accepts for the format."""
    return [alias for alias, name in ALIASES.items() if name == fmt.name]


def dtype_text(fmt: Format) -> str:
    """The torch dtype holding exactly the format's values, without "torch." ("-": none)."""
    dtype = fmt.torch_dtype
    return str(dtype).removeprefix("torch.") if dtype is not None else "-"


def formats_section(formats: Sequence[Format], title: str = "Registered formats") -> Section:
    """The key numbers of each format, one row per format."""
    headers = [
        "format",
        "bits",
        "ebits",
        "mbits",
        "bias",
        "p",
        "emin",
        "emax",
        "max",
        "min normal",
        "min subnormal",
        "eps",
        "inf",
        "NaN",
        "torch dtype",
        "aliases",
    ]
    rows = [
        [
            fmt.name,
            str(fmt.bits),
            str(fmt.ebits),
            str(fmt.mbits),
            str(fmt.bias),
            str(fmt.precision),
            str(fmt.emin),
            str(fmt.emax),
            output.number_text(fmt.max),
            output.number_text(fmt.min_normal),
            output.number_text(fmt.min_subnormal),
            output.number_text(fmt.eps),
            "yes" if fmt.inf else "no",
            fmt.nan,
            dtype_text(fmt),
            ", ".join(aliases(fmt)),
        ]
        for fmt in formats
    ]
    notes = [
        "p = precision = mbits + 1; emin = 1 - bias (smallest normal exponent); "
        "emax = floor(log2(max)); eps = 2^-mbits.",
        "NaN: ieee = top binade reserved (inf and NaNs); fn = only the all-ones code is NaN; "
        "fnuz = the negative-zero code is the single NaN; none = no NaN.",
    ]
    groups = [
        ["bits", "ebits", "mbits", "bias", "p", "emin", "emax", "inf", "NaN", "torch dtype"],
        ["max", "min normal", "min subnormal", "eps", "aliases"],
    ]
    left = ("format", "NaN", "torch dtype", "aliases")
    return Section(title, headers, rows, notes, left, groups)


def block_text(block: int | tuple[int, int] | None) -> str:
    """A block shape as the tables show it: ``32``, ``16x16``, or ``row`` (None: the
    whole axis)."""
    if block is None:
        return "row"
    if isinstance(block, tuple):
        return "x".join(str(side) for side in block)
    return str(block)


def bits_per_element(fmt: BlockFormat) -> str:
    """The storage cost of one element, its scale's share included: element bits +
    scale bits / elements in a block (``8 + 32/row`` where the block is a whole row).  The
    per-tensor FP32 scale, 32 bits for the whole tensor, is left out."""
    bits = fmt.bits_per_element
    if bits is not None:
        return f"{bits:g}"
    if fmt.scale is None:
        return str(fmt.element.bits)
    return f"{fmt.element.bits} + {fmt.scale.bits}/row"


def block_formats_section(formats: Sequence[BlockFormat]) -> Section:
    """The block formats, one row each: element, block, scale format and rule, tensor
    scale and bits per element."""
    headers = ["block format", "element", "block", "scale", "rule", "tensor", "bits/elem"]
    rows = [
        [
            fmt.name,
            fmt.element.name,
            block_text(fmt.block),
            fmt.scale.name if fmt.scale is not None else "none",
            fmt.scale_rule,
            "fp32" if fmt.tensor_scale else "no",
            bits_per_element(fmt),
        ]
        for fmt in formats
    ]
    notes = [
        "block: elements sharing a scale (row: the whole axis).",
        "tensor: an FP32 per-tensor scale on top of the block scales.",
        "bits/elem: element bits + scale bits / block (the tensor scale left out).",
        "stochround info NAME describes one; sr.blocks.quantize(x, NAME) uses it.",
    ]
    left = ("block format", "element", "scale", "rule", "tensor")
    return Section("Block formats", headers, rows, notes, left)


def formats_command() -> None:
    """List every registered format with its key numbers (bits, bias, range, specials),
    then the block formats (element, block, scale, rule, bits per element)."""
    console = output.new_console()
    formats_section(list(FORMATS.values())).print(console)
    block_formats_section(list(BLOCK_FORMATS.values())).print(console)


def bit_fields(code: int, fmt: Format) -> str:
    """The code in binary, with sign, exponent and mantissa fields separated by spaces."""
    bits = f"{code:0{fmt.bits}b}"
    if fmt.twos_complement:
        return bits
    sign = int(fmt.signed)
    fields = (bits[:sign], bits[sign : sign + fmt.ebits], bits[sign + fmt.ebits :])
    return " ".join(part for part in fields if part)


def zero_meaning(fmt: Format) -> str:
    """The "zero" property's meaning for ``fmt``: a format without zero (e8m0) rounds 0 and
    the values below its smallest magnitude up to that magnitude, an underflow no mode or
    saturation avoids."""
    if fmt.has_zero:
        return "has a zero code"
    smallest = output.number_text(fmt.min_normal)
    return f"no zero code: 0 and |x| < {smallest} round to the smallest value (underflow)"


def properties_section(fmt: Format) -> Section:
    """Every property of one format, with what it means."""
    value = output.value_text
    rows = [
        ["name", fmt.name, "canonical name"],
        ["aliases", ", ".join(aliases(fmt)) or "-", "other names format() accepts"],
        ["bits", str(fmt.bits), "sign + ebits + mbits"],
        ["signed", "yes" if fmt.signed else "no", "has a sign bit"],
        ["ebits", str(fmt.ebits), "exponent bits"],
        ["mbits", str(fmt.mbits), "mantissa (trailing significand) bits"],
        ["bias", str(fmt.bias), "exponent bias"],
        ["precision", str(fmt.precision), "significand bits incl. the implicit one"],
        ["emin", str(fmt.emin), "exponent of the smallest normal binade"],
        ["emax", str(fmt.emax), "floor(log2(max))"],
        ["max", value(fmt.max), "largest finite value"],
        ["lowest", value(fmt.lowest), "most negative finite value"],
        ["min normal", value(fmt.min_normal), "2^emin"],
        ["min subnormal", value(fmt.min_subnormal), "smallest positive value"],
        ["eps", value(fmt.eps), "distance from 1 to the next value"],
        ["subnormals", "yes" if fmt.subnormals else "no", "gradual underflow"],
        ["zero", "yes" if fmt.has_zero else "no", zero_meaning(fmt)],
        ["negative zero", "yes" if fmt.has_negative_zero else "no", ""],
        ["inf", "yes" if fmt.inf else "no", "has infinities"],
        ["NaN encoding", fmt.nan, "ieee, fn, fnuz or none"],
        ["two's complement", "yes" if fmt.twos_complement else "no", "integer grid"],
        ["codes", str(fmt.num_codes), "2^bits"],
        ["torch dtype", dtype_text(fmt), "dtype holding exactly these values"],
    ]
    headers = ["property", "value", "meaning"]
    return Section(f"Format {fmt.name}", headers, rows, left=tuple(headers))


def values_section(fmt: Format) -> Section:
    """Every code of the format: hex, binary fields, value and class."""
    rows = [
        [
            output.hex_code(code, fmt),
            bit_fields(code, fmt),
            output.value_text(value),
            outcomes.value_class(value, fmt),
        ]
        for code, value in reference.all_values(fmt)
    ]
    return Section(
        f"All {fmt.num_codes} codes of {fmt.name}",
        ["code", "bits", "value", "class"],
        rows,
        left=("bits", "class"),
    )


def block_properties_section(fmt: BlockFormat) -> Section:
    """Every property of one block format, with what it means."""
    element = fmt.element
    scale = fmt.scale
    rows = [
        ["name", fmt.name, "block format (sr.blocks.quantize(x, NAME))"],
        ["element", element.name, f"{element.bits} bits, max {output.value_text(element.max)}"],
        ["block", block_text(fmt.block), block_meaning(fmt)],
        [
            "scale",
            scale.name if scale is not None else "none",
            f"{scale.bits} bits a block" if scale is not None else "elements unscaled",
        ],
        ["scale rule", fmt.scale_rule, RULE_WORDS[fmt.scale_rule]],
        [
            "tensor scale",
            "fp32" if fmt.tensor_scale else "no",
            "FP32 per-tensor scale over the block scales" if fmt.tensor_scale else "",
        ],
        ["bits per element", bits_per_element(fmt), "element + scale / block"],
    ]
    headers = ["property", "value", "meaning"]
    return Section(f"Block format {fmt.name}", headers, rows, left=tuple(headers))


def block_meaning(fmt: BlockFormat) -> str:
    """What the block shape means: how many elements along which axes share a scale."""
    if fmt.block_size is None:
        return "one scale per row (the whole quantized axis)"
    if isinstance(fmt.block, tuple):
        return f"{fmt.block_size} elements (a tile of the last two axes) share a scale"
    return f"{fmt.block_size} consecutive elements along the axis share a scale"


def info_command(
    format_name: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT",
            help=(
                "A format name or alias, e.g. e4m3fn, bf16, p3109_k8p4se, cfloat8_e4m3_b20, "
                "or a block format, e.g. mxfp4, nvfp4."
            ),
        ),
    ],
    values: Annotated[
        bool,
        typer.Option(help="List every code with its value (formats of at most 8 bits)."),
    ] = True,
) -> None:
    """Show a format's properties and, for formats of at most 8 bits, every code's value;
    for a block format, its element, block, scale and bits per element, then its element
    format's properties and codes."""
    console = output.new_console()
    block = BLOCK_FORMATS.get(format_name.strip().lower())
    if block is not None:
        block_properties_section(block).print(console)
        fmt = block.element  # mxint8's element grid (ocp_int8) is not in the registry
    else:
        try:
            fmt = find_format(format_name)
        except (ValueError, TypeError) as error:
            output.fail(f"{error}; block formats: {', '.join(BLOCK_FORMATS)}")
    properties_section(fmt).print(console)
    if not values:
        return
    if fmt.bits <= VALUE_TABLE_MAX_BITS:
        values_section(fmt).print(console)
    else:
        console.print(
            f"(the value table is listed for formats of at most {VALUE_TABLE_MAX_BITS} bits; "
            f"{fmt.name} has {fmt.bits})",
            markup=False,
        )
