"""The ``stochround`` command: the format registry, one format in detail, one value rounded
(with the exact probability of each neighbour), the hardware SR units and a short demo.

Every number it prints about a format or a probability comes from the scalar reference
(`reference.py`, exact fractions); the drawn results come from the public `round`.  Bad
input gets the library's own ValueError message and exit status 2.
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Annotated, NoReturn

import torch
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import hardware as hardware_module
from . import reference
from . import rounding as rounding_module
from .experiments.report import markdown_table
from .formats import ALIASES, FORMATS, Format
from .formats import format as find_format

app = typer.Typer(
    name="stochround",
    help=(
        "Stochastic rounding and low-precision number formats: inspect formats, round a "
        "value and see the exact probability of each neighbour (under a mode or a hardware "
        "SR unit), run the demo."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_BAD_INPUT = 2
EXIT_INCONSISTENT = 1
VALUE_TABLE_MAX_BITS = 8


# --------------------------------------------------------------------------------------
# output helpers
# --------------------------------------------------------------------------------------


def _console(stderr: bool = False) -> Console:
    """A fresh console, so that the terminal width (COLUMNS) is read at each command."""
    return Console(stderr=stderr, highlight=False)


def _fail(message: str) -> NoReturn:
    """Print a bad-input message in red on stderr and exit with status 2 (no traceback)."""
    _console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _checked(action: Callable[[], object]) -> object:
    """Run ``action``; a ValueError or TypeError from the library becomes a bad-input exit."""
    try:
        return action()
    except (ValueError, TypeError) as error:
        _fail(str(error))


@dataclass
class Section:
    """A titled table with notes, rendered both as a rich table and as Markdown.

    ``groups`` (lists of headers) splits a table too wide for the terminal into several,
    each repeating the first (key) column.
    """

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    left: tuple[str, ...] = ()
    groups: list[list[str]] = field(default_factory=list)

    def rich_table(self, headers: Sequence[str] | None = None, title: str | None = None) -> Table:
        headers = list(self.headers if headers is None else headers)
        columns = [self.headers.index(header) for header in headers]
        table = Table(
            title=self.title if title is None else title,
            box=box.SIMPLE_HEAD,
            title_justify="left",
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for header in headers:
            justify = "left" if header in self.left else "right"
            table.add_column(Text(header), justify=justify, overflow="fold")
        for row in self.rows:  # Text: cells are plain text, never rich markup
            table.add_row(*(Text(row[column]) for column in columns))
        return table

    def print(self, console: Console) -> None:
        table = self.rich_table()
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        if self.groups and natural > console.width:
            for index, group in enumerate(self.groups):
                title = f"{self.title} ({index + 1}/{len(self.groups)})"
                console.print(self.rich_table([self.headers[0], *group], title))
        else:
            console.print(table)
        for note in self.notes:
            console.print(note, soft_wrap=True, markup=False)
        console.print()

    def markdown(self) -> str:
        return markdown_table(f"## {self.title}", self.headers, self.rows, self.notes)


def _value(value: float) -> str:
    """A format value, exactly: Python's shortest round-trip repr (1.0, -0.0, inf, nan)."""
    return repr(float(value))


def _number(value: float) -> str:
    """A compact rendering for tables: small integers as such, powers of two as 2^k."""
    if math.isnan(value) or math.isinf(value):
        return repr(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    mantissa, exponent = math.frexp(abs(value))
    if mantissa == 0.5:
        return f"{'-' if value < 0 else ''}2^{exponent - 1}"
    return f"{value:.4g}"


def _fraction(value: Fraction) -> str:
    """An exact probability: the reduced fraction (0, 1, 3/8, ...)."""
    return str(value)


def _decimal(value: Fraction) -> str:
    return f"{float(value):.12g}"


def _signed(value: float) -> str:
    """A signed difference to 6 decimals, without a "-0.000000" for tiny negatives."""
    text = f"{value:+.6f}"
    return "+0.000000" if text == "-0.000000" else text


def _same(a: float, b: float) -> bool:
    """Equal as format values: NaN matches NaN, and -0.0 differs from 0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _code(value: float, fmt: Format) -> str:
    """The bit pattern of a value of the format, in hex (or why there is none)."""
    if math.isnan(value) and not fmt.has_nan:
        return "(no NaN code)"
    if math.isinf(value) and not (fmt.inf and (fmt.signed or value > 0)):
        return "(no inf code)"
    code = reference.encode_value(value, fmt)
    return f"0x{code:0{(fmt.bits + 3) // 4}x}"


def _aliases(fmt: Format) -> list[str]:
    return [alias for alias, name in ALIASES.items() if name == fmt.name]


def _torch_dtype(fmt: Format) -> str:
    dtype = fmt.torch_dtype
    return str(dtype).removeprefix("torch.") if dtype is not None else "-"


# --------------------------------------------------------------------------------------
# formats
# --------------------------------------------------------------------------------------


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
            _number(fmt.max),
            _number(fmt.min_normal),
            _number(fmt.min_subnormal),
            _number(fmt.eps),
            "yes" if fmt.inf else "no",
            fmt.nan,
            _torch_dtype(fmt),
            ", ".join(_aliases(fmt)),
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


@app.command("formats")
def formats_command() -> None:
    """List every registered format with its key numbers (bits, bias, range, specials)."""
    formats_section(list(FORMATS.values())).print(_console())


# --------------------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------------------


def value_class(value: float, fmt: Format) -> str:
    """zero, subnormal, normal, inf or nan (integer for integer grids)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "zero"
    if fmt.ebits == 0:
        return "integer"
    return "subnormal" if abs(value) < fmt.min_normal else "normal"


def _bit_fields(code: int, fmt: Format) -> str:
    """The code in binary, with sign, exponent and mantissa fields separated by spaces."""
    bits = f"{code:0{fmt.bits}b}"
    if fmt.twos_complement:
        return bits
    sign = int(fmt.signed)
    fields = (bits[:sign], bits[sign : sign + fmt.ebits], bits[sign + fmt.ebits :])
    return " ".join(part for part in fields if part)


def properties_section(fmt: Format) -> Section:
    rows = [
        ["name", fmt.name, "canonical name"],
        ["aliases", ", ".join(_aliases(fmt)) or "-", "other names format() accepts"],
        ["bits", str(fmt.bits), "sign + ebits + mbits"],
        ["signed", "yes" if fmt.signed else "no", "has a sign bit"],
        ["ebits", str(fmt.ebits), "exponent bits"],
        ["mbits", str(fmt.mbits), "mantissa (trailing significand) bits"],
        ["bias", str(fmt.bias), "exponent bias"],
        ["precision", str(fmt.precision), "significand bits incl. the implicit one"],
        ["emin", str(fmt.emin), "exponent of the smallest normal binade"],
        ["emax", str(fmt.emax), "floor(log2(max))"],
        ["max", _value(fmt.max), "largest finite value"],
        ["lowest", _value(fmt.lowest), "most negative finite value"],
        ["min normal", _value(fmt.min_normal), "2^emin"],
        ["min subnormal", _value(fmt.min_subnormal), "smallest positive value"],
        ["eps", _value(fmt.eps), "distance from 1 to the next value"],
        ["subnormals", "yes" if fmt.subnormals else "no", "gradual underflow"],
        ["negative zero", "yes" if fmt.has_negative_zero else "no", ""],
        ["inf", "yes" if fmt.inf else "no", "has infinities"],
        ["NaN encoding", fmt.nan, "ieee, fn, fnuz or none"],
        ["two's complement", "yes" if fmt.twos_complement else "no", "integer grid"],
        ["codes", str(fmt.num_codes), "2^bits"],
        ["torch dtype", _torch_dtype(fmt), "dtype holding exactly these values"],
    ]
    headers = ["property", "value", "meaning"]
    return Section(f"Format {fmt.name}", headers, rows, left=tuple(headers))


def values_section(fmt: Format) -> Section:
    rows = []
    for code, value in reference.all_values(fmt):
        rows.append(
            [
                f"0x{code:0{(fmt.bits + 3) // 4}x}",
                _bit_fields(code, fmt),
                _value(value),
                value_class(value, fmt),
            ]
        )
    return Section(
        f"All {fmt.num_codes} codes of {fmt.name}",
        ["code", "bits", "value", "class"],
        rows,
        left=("bits", "class"),
    )


@app.command("info")
def info_command(
    format_name: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT",
            help="A format name or alias, e.g. e4m3fn, bf16, p3109_k8p4se, cfloat8_e4m3_b20.",
        ),
    ],
    values: Annotated[
        bool,
        typer.Option(help="List every code with its value (formats of at most 8 bits)."),
    ] = True,
) -> None:
    """Show a format's properties and, for formats of at most 8 bits, every code's value."""
    fmt = _checked(lambda: find_format(format_name))
    assert isinstance(fmt, Format)
    console = _console()
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


# --------------------------------------------------------------------------------------
# round
# --------------------------------------------------------------------------------------


def parse_value(text: str) -> float:
    """A Python float from text (0.1, -3e-4, inf, -inf, nan) or a hex float (0x1.8p+0)."""
    try:
        return float(text) if "0x" not in text.lower() else float.fromhex(text)
    except ValueError:
        _fail(f"VALUE must be a number such as 0.1, -3e-4, inf, nan or 0x1.8p+0; got {text!r}")


def outcomes(
    x: float,
    fmt: Format,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
) -> list[tuple[float, Fraction]]:
    """Every possible result of rounding x (after overflow handling) with its exact
    probability, from the reference.

    SR rounds away with probability P = away_probability(nu, n, variant); r = 0 gives the
    toward-zero result whenever P < 1, and r = 2**n - 1 the away result whenever P > 0.
    """
    if mode != "sr":
        return [(reference.round_value(x, fmt, mode, sat=sat), Fraction(1))]
    n = reference.check_rbits(rbits)
    if math.isnan(x) or math.isinf(x):
        return [(reference.round_value(x, fmt, "sr", rbits=rbits, sat=sat, rand=0), Fraction(1))]
    p_away = reference.away_probability(reference.discarded_fraction(x, fmt), n, variant)
    options = {"rbits": rbits, "variant": variant, "sat": sat}
    result: list[tuple[float, Fraction]] = []
    if p_away < 1:
        result.append((reference.round_value(x, fmt, "sr", rand=0, **options), 1 - p_away))
    if p_away > 0:
        away = reference.round_value(x, fmt, "sr", rand=2**n - 1, **options)
        result.append((away, p_away))
    merged: list[tuple[float, Fraction]] = []
    for value, probability in result:
        for index, (seen, seen_probability) in enumerate(merged):
            if _same(seen, value):
                merged[index] = (seen, seen_probability + probability)
                break
        else:
            merged.append((value, probability))
    return merged


def probability_of(value: float, distribution: list[tuple[float, Fraction]]) -> Fraction:
    return sum((p for v, p in distribution if _same(v, value)), Fraction(0))


def _sr_rule(rbits: int | None, variant: str) -> str:
    n = "32 (exact SR)" if rbits is None else str(rbits)
    count = {
        "a": "floor(nu*2^n)",
        "b": "half_up(nu*2^n)",
        "c": "round_half_even(nu*2^n)",
        "odd": "round_half_odd(nu*2^n)",
    }[variant]
    return f"P(away from zero) = {count} / 2^n with n = {n}, variant {variant}"


def _describe_fraction(nu: Fraction) -> str:
    if nu.denominator <= 2**32:
        return f"{nu} = {float(nu):.10g}"
    return f"~{float(nu):.17g}"


def _round_special(
    console: Console, x: float, fmt: Format, mode: str, sat: str
) -> list[tuple[float, Fraction]]:
    """NaN and infinite inputs: no neighbours; show what each saturation mode gives."""
    if math.isnan(x):
        note = "NaN stays NaN in every mode"
        if not fmt.has_nan:
            note += (
                f" ({fmt.name} has no NaN code: encode() refuses it, or stores code 0 with "
                "nan='zero')"
            )
        console.print(note + ".", markup=False)
        return [(math.nan, Fraction(1))]
    rows = []
    for option in reference.SATURATIONS:
        value = reference.round_value(x, fmt, mode, sat=option)
        chosen = " (chosen)" if option == sat else ""
        rows.append([f"{option}{chosen}", _value(value), _code(value, fmt)])
    Section(
        f"{_value(x)} to {fmt.name} (infinite input)",
        ["sat", "result", "code"],
        rows,
        [
            "finite: +-inf go to +-max; propagate: infinities stay infinite (NaN where the "
            "format has no inf); none: the same as propagate for infinite inputs."
        ],
        left=("sat",),
    ).print(console)
    return [(reference.round_value(x, fmt, mode, sat=sat), Fraction(1))]


@app.command(
    "round",
    context_settings={"ignore_unknown_options": True},  # lets VALUE be negative: -1.5, -inf
    epilog=(
        "Examples: stochround round 1.0625 --format e4m3fn --rbits 8 ; "
        "stochround round -0.3 --format bf16 --mode rne ; "
        "stochround round 1000 --format e4m3fn --sat finite ; "
        "stochround round 0.3 --hardware amd-mi300 --format e5m2fnuz"
    ),
)
def round_command(
    value_text: Annotated[
        str,
        typer.Argument(
            metavar="VALUE",
            help="The value, read as a Python float (0.1, -3e-4, 1e-3, inf, nan, 0x1.8p+0).",
            show_default=False,
        ),
    ],
    format_name: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Target format name or alias (e4m3fn, bf16, ...); with --hardware, the "
            "unit's format (picks one of a family's units).",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        str,
        typer.Option(help="Rounding mode: rne, rna, rz, ru, rd, ro (round to odd) or sr."),
    ] = "sr",
    rbits: Annotated[
        int | None,
        typer.Option(help="Random bits for sr, 1..32; omit for exact SR (32-bit words)."),
    ] = None,
    variant: Annotated[
        str,
        typer.Option(help="SR variant with rbits: a, b, c (P3109 StochasticA/B/C) or odd."),
    ] = "c",
    sat: Annotated[
        str,
        typer.Option(
            help="Overflow: none (to inf, or NaN without inf), finite (to +-max), "
            "propagate (finite overflow to +-max, infinities stay)."
        ),
    ] = "none",
    hardware: Annotated[
        str | None,
        typer.Option(
            help="A hardware SR unit (stochround hardware lists them), which sets the mode, "
            "rbits, variant and sat: the value is first rounded to the unit's operand format.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random stream for the drawn result.")] = 0,
) -> None:
    """Round one value: its two neighbours in the format, the exact probability of each under
    the chosen mode (or hardware unit), and one result drawn with stochround.round."""
    x = parse_value(value_text)
    if hardware is None:
        unit, operand = None, x
        fmt, drawn = _draw(x, format_name, mode, rbits, variant, sat, seed)
    else:
        if (mode, rbits, variant, sat) != ("sr", None, "c", "none"):
            _fail("--hardware sets the mode, rbits, variant and sat: pass none of them")
        unit, operand, drawn = _draw_with_unit(x, hardware, format_name, seed)
        fmt, rbits, variant, sat = unit.target, unit.rbits, unit.variant, unit.sat
    console = _console()
    header = f"x = {_value(x)}  (float64 {x.hex()})  ->  "
    if unit is not None:
        header += f"{unit.name}: operand {_value(operand)} ({unit.source_format}, rne)  ->  "
    console.print(
        header
        + f"{fmt.name}, mode={mode}"
        + (f", rbits={rbits or 'exact (32-bit words)'}, variant={variant}" if mode == "sr" else "")
        + f", sat={sat}",
        markup=False,
        soft_wrap=True,
    )

    if math.isnan(operand) or math.isinf(operand):
        distribution = _round_special(console, operand, fmt, mode, sat)
    else:
        distribution = outcomes(operand, fmt, mode, rbits, variant, sat)
        if unit is not None and unit.flushes(operand):
            console.print(
                f"{unit.name} flushes operands below {_value(unit.flush_below)} in magnitude "
                "to zero: this one is flushed.",
                markup=False,
                soft_wrap=True,
            )
            zero = math.copysign(0.0, operand) if fmt.has_negative_zero else 0.0
            distribution = [(zero, Fraction(1))]
        _round_finite(console, operand, fmt, mode, rbits, variant, sat, distribution)

    console.print(
        f"drawn with stochround.round (seed={seed}): {_value(drawn)}"
        + ("" if math.isnan(drawn) and not fmt.has_nan else f"  code {_code(drawn, fmt)}"),
        markup=False,
        soft_wrap=True,
    )
    if not any(_same(drawn, value) for value, p in distribution if p > 0):
        _console(stderr=True).print(
            Text(
                f"inconsistent: stochround.round gave {_value(drawn)}, which the reference "
                "gives with probability 0 (a library bug; please report it)",
                style="red",
            ),
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INCONSISTENT)


def _draw(
    x: float,
    format_name: str | None,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int,
) -> tuple[Format, float]:
    """The target format and one result of stochround.round, which validates every
    argument (format, mode, variant, sat, rbits) first."""
    if format_name is None:
        _fail("--format is required (a format name or alias) unless --hardware is given")
    fmt = _checked(lambda: find_format(format_name))
    assert isinstance(fmt, Format)
    options = {"rbits": rbits, "variant": variant, "sat": sat, "seed": seed}
    drawn = _checked(
        lambda: rounding_module.round(torch.tensor([x], dtype=torch.float64), fmt, mode, **options)
    )
    assert isinstance(drawn, torch.Tensor)
    return fmt, float(drawn.item())


def _draw_with_unit(
    x: float, name: str, format_name: str | None, seed: int
) -> tuple[hardware_module.HardwarePreset, float, float]:
    """The hardware unit (a preset, or a family's with its format), x rounded to its operand
    format by the reference, and one result of stochround.round with the unit."""
    unit = _checked(lambda: hardware_module.preset(name, format_name))
    assert isinstance(unit, hardware_module.HardwarePreset)
    operand = reference.round_value(x, unit.operand, "rne")
    drawn = rounding_module.round(
        torch.tensor([x], dtype=torch.float64), hardware=unit.name, seed=seed
    )
    return unit, operand, float(drawn.item())


def _round_finite(
    console: Console,
    x: float,
    fmt: Format,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    distribution: list[tuple[float, Fraction]],
) -> None:
    lower, upper = reference.neighbours(x, fmt)
    negative = math.copysign(1.0, x) < 0
    rows = []
    if _same(lower, upper):
        candidates = [("x itself (representable)", lower, "")]
    else:
        toward, away = "toward zero", "away from zero"
        down, up = (away, toward) if negative else (toward, away)
        candidates = [("lower (round down)", lower, down), ("upper (round up)", upper, up)]
    listed = []
    for label, value, direction in candidates:
        probability = probability_of(value, distribution)
        listed.append(value)
        rows.append(
            [
                label,
                _value(value),
                _code(value, fmt),
                direction,
                _fraction(probability),
                _decimal(probability),
            ]
        )
    for value, probability in distribution:
        if not any(_same(value, seen) for seen in listed):  # after overflow handling
            rows.append(
                [
                    f"overflow (sat={sat})",
                    _value(value),
                    _code(value, fmt),
                    "",
                    _fraction(probability),
                    _decimal(probability),
                ]
            )
    notes = []
    nu = reference.discarded_fraction(x, fmt)
    if not _same(lower, upper) and x <= fmt.max and x >= fmt.lowest:
        notes.append(f"discarded fraction nu = {_describe_fraction(nu)} ulp")
    if mode == "sr" and not _same(lower, upper):
        notes.append(_sr_rule(rbits, variant))
    elif mode != "sr":
        notes.append(f"{mode} is deterministic: probability 1 for the value it chooses")
    if x > fmt.max or x < fmt.lowest:
        notes.append(_overflow_note(x, fmt, mode, rbits, variant, sat))
    Section(
        f"{_value(x)} to {fmt.name}",
        ["neighbour", "value", "code", "direction", "probability", "decimal"],
        rows,
        notes,
        left=("neighbour", "direction"),
    ).print(console)


def _overflow_note(
    x: float, fmt: Format, mode: str, rbits: int | None, variant: str, sat: str
) -> str:
    """What each saturation mode makes of an out-of-range x."""
    parts = []
    for option in reference.SATURATIONS:
        results = outcomes(x, fmt, mode, rbits, variant, option)
        shown = ", ".join(
            _value(v) if p == 1 else f"{_value(v)} (p={_fraction(p)})" for v, p in results
        )
        parts.append(f"sat={option}{' (chosen)' if option == sat else ''} -> {shown}")
    bound = f"max {_value(fmt.max)}" if x > fmt.max else f"lowest {_value(fmt.lowest)}"
    return f"overflow: {_value(x)} is beyond the format's {bound}; " + "; ".join(parts)


# --------------------------------------------------------------------------------------
# hardware
# --------------------------------------------------------------------------------------


def _flush_rule(unit: hardware_module.HardwarePreset) -> str:
    """The unit's flush to zero, as a table cell ("-" where it flushes nothing)."""
    return "-" if unit.flush_below is None else f"below {_number(unit.flush_below)}"


def hardware_section() -> Section:
    """Every hardware preset: what its unit reads and writes, its random bits and rules."""
    headers = ["preset", "operand", "target", "rbits", "variant", "sat", "flush to zero"]
    rows = [
        [p.name, p.source_format, p.target_format, str(p.rbits), p.variant, p.sat, _flush_rule(p)]
        for p in hardware_module.PRESETS.values()
    ]
    notes = [
        "Families (a preset's name without its destination; --format picks the unit): "
        + ", ".join(hardware_module.FAMILIES)
        + ". stochround hardware NAME documents one unit; stochround round VALUE --hardware "
        "NAME gives a value's exact probabilities under it; sr.round(x, hardware=NAME) rounds "
        "with it."
    ]
    return Section("Hardware SR units", headers, rows, notes, left=tuple(headers[:3]))


def preset_section(unit: hardware_module.HardwarePreset) -> Section:
    """One preset: its fields, then what the unit does, the sources and the decisions."""
    rows = [
        ["name", unit.name],
        ["family", hardware_module.family(unit.name)],
        ["operand format", f"{unit.source_format} (wider inputs are rounded to it, rne)"],
        ["target format", unit.target_format],
        ["random bits", str(unit.rbits)],
        ["variant", unit.variant],
        ["sat", unit.sat],
        ["flush to zero", _flush_rule(unit)],
    ]
    notes = [
        f"What it does: {unit.description}",
        f"Equal to sr.round: {unit.exact_domain}",
        f"Sources: {unit.source}",
        f"Decisions: {unit.decisions}",
    ]
    return Section(
        f"Hardware preset {unit.name}", ["field", "value"], rows, notes, ("field", "value")
    )


@app.command(
    "hardware",
    epilog=(
        "Examples: stochround hardware ; stochround hardware amd-mi300-fp8 ; "
        "stochround hardware nvidia-cvt-rs --format e2m1"
    ),
)
def hardware_command(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]",
            help="A preset (amd-mi300-fp8, intel-fp16, ...) or a family with --format.",
            show_default=False,
        ),
    ] = None,
    format_name: Annotated[
        str | None,
        typer.Option(
            "--format", help="The unit's target format (picks one of a family).", show_default=False
        ),
    ] = None,
) -> None:
    """List the hardware SR units stochround reproduces, or document one: its formats,
    random bits, rules, sources and where it equals the plain contract."""
    console = _console()
    if name is None:
        if format_name is not None:
            _fail("--format picks a unit of the family NAME: give NAME too")
        hardware_section().print(console)
        return
    unit = _checked(lambda: hardware_module.preset(name, format_name))
    assert isinstance(unit, hardware_module.HardwarePreset)
    preset_section(unit).print(console)


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------

DEMO_FORMATS = ("bfloat16", "binary16", "e4m3fn", "e5m2", "e3m2", "e2m1", "p3109_k8p4se")
DEMO_VALUE = 1.3
DEMO_DRAWS = 20_000  # below torch's parallel grain size: no thread start-up per op


def demo_formats_section() -> Section:
    return formats_section([find_format(name) for name in DEMO_FORMATS], "Some formats")


def demo_modes_section(x: float = DEMO_VALUE, fmt_name: str = "e4m3fn") -> Section:
    """One value rounded under every mode (and two few-bit SR variants): the result of one
    draw, the exact expectation, and the mean of many draws."""
    fmt = find_format(fmt_name)
    cases: list[tuple[str, str, int | None, str]] = [
        (mode, mode, None, "c") for mode in reference.MODES
    ]
    cases += [("sr rbits=2 a", "sr", 2, "a"), ("sr rbits=2 c", "sr", 2, "c")]
    rows = []
    for label, mode, rbits, variant in cases:
        distribution = outcomes(x, fmt, mode, rbits, variant, "none")
        expectation = sum((Fraction(v) * p for v, p in distribution), Fraction(0))
        options = {"rbits": rbits, "variant": variant, "seed": 0} if mode == "sr" else {}
        one = rounding_module.round(torch.tensor([x], dtype=torch.float64), fmt, mode, **options)
        draws = rounding_module.round(
            torch.full((DEMO_DRAWS,), x, dtype=torch.float64), fmt, mode, **options
        )
        rows.append(
            [
                label,
                _value(float(one.item())),
                f"{float(expectation):.6f}",
                _signed(float(expectation) - x),
                f"{float(draws.mean()):.6f}",
            ]
        )
    lower, upper = reference.neighbours(x, fmt)
    notes = [
        f"x = {x}; neighbours in {fmt.name}: {_value(lower)} and {_value(upper)}. "
        "Exact SR is unbiased (E = x); deterministic modes and few-bit SR are not.",
    ]
    return Section(
        f"{x} rounded to {fmt.name} under every mode",
        ["mode", "one draw (seed 0)", "E[result]", "bias", f"mean of {DEMO_DRAWS} draws"],
        rows,
        notes,
        left=("mode",),
    )


def demo_sections() -> list[Section]:
    """The demo's introductory tables, before the experiments."""
    return [demo_formats_section(), demo_modes_section()]


@app.command("demo")
def demo_command(
    out: Annotated[
        Path,
        typer.Option(help="Folder for report.md, results.json and PNG plots.", metavar="DIR"),
    ] = Path("stochround-demo"),
    seed: Annotated[int | None, typer.Option(help="Seed of inputs and random bits.")] = None,
) -> None:
    """The tour: a few formats, one value under every mode, then the quick version of every
    experiment (about a minute on two CPU cores), written to DIR as one report."""
    from .experiments import DEFAULT_SEED, EXPERIMENTS
    from .experiments.report import print_experiment, progress_bar, write_results

    console = _console()
    started = time.perf_counter()
    sections = demo_sections()
    for section in sections:
        section.print(console)
    seed = DEFAULT_SEED if seed is None else seed
    results = []
    for module in EXPERIMENTS.values():
        with progress_bar(console, enabled=console.is_terminal) as progress:
            result = module.run(True, seed, out, progress)
        print_experiment(result, console)
        results.append(result)
    preamble = "\n".join(section.markdown() for section in sections)
    json_path, report_path = write_results(results, out, "stochround demo", preamble)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)
    console.print(f"demo took {time.perf_counter() - started:.1f} s", markup=False)


# --------------------------------------------------------------------------------------
# run: the experiment suite
# --------------------------------------------------------------------------------------


@app.command("run")
def run_command(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="An experiment (stagnation, summation, ...) or all."),
    ],
    quick: Annotated[bool, typer.Option(help="Small sizes: seconds instead of minutes.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed of inputs and random bits.")] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for report.md, results.json and PNG plots.", metavar="DIR")
    ] = Path("stochround-report"),
) -> None:
    """Run experiments, print their tables, write report.md, results.json and plots to DIR."""
    from .experiments import DEFAULT_SEED, EXPERIMENTS
    from .experiments.report import print_experiment, progress_bar, write_results

    if name != "all" and name not in EXPERIMENTS:
        _fail(f"NAME must be one of {', '.join([*EXPERIMENTS, 'all'])}; got {name!r}")
    names = list(EXPERIMENTS) if name == "all" else [name]
    seed = DEFAULT_SEED if seed is None else seed
    console = _console()
    results = []
    for experiment_name in names:
        with progress_bar(console, enabled=console.is_terminal) as progress:
            result = EXPERIMENTS[experiment_name].run(quick, seed, out, progress)
        print_experiment(result, console)
        results.append(result)
    json_path, report_path = write_results(results, out)
    console.print(f"wrote {report_path} and {json_path}", markup=False, soft_wrap=True)


def main() -> None:  # pragma: no cover - the console script calls app directly
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
