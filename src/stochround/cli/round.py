"""``stochround round VALUE``: a value's two neighbours in a format, the exact probability of
each under a mode (or a hardware SR unit), and one result drawn with stochround.round.

The probabilities come from `stochround.outcomes` (exact fractions from the scalar
reference); the drawn result comes from the public `round`, which also validates every
argument.  A drawn result the reference gives probability 0 is a library bug: the command
says so and exits with status 1.
"""

import math
from fractions import Fraction
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.text import Text

from .. import hardware, outcomes, reference, rounding
from ..formats import Format
from ..reference import check_mode
from . import output
from .output import Section

EXIT_INCONSISTENT = 1

# A negative VALUE (-1.5, -inf) looks like an option: unknown options are passed on as
# arguments, so that it reaches VALUE.
ROUND_CONTEXT = {"ignore_unknown_options": True}
ROUND_EPILOG = (
    "Examples: stochround round 1.0625 --format e4m3fn --rbits 8 ; "
    "stochround round -0.3 --format bf16 --mode rne ; "
    "stochround round 1000 --format e4m3fn --sat finite ; "
    "stochround round 0.3 --hardware amd-mi300 --format e5m2fnuz"
)


def parse_value(text: str) -> float:
    """A Python float from text (0.1, -3e-4, inf, -inf, nan) or a hex float (0x1.8p+0)."""
    try:
        return float(text) if "0x" not in text.lower() else float.fromhex(text)
    except ValueError:
        output.fail(
            f"VALUE must be a number such as 0.1, -3e-4, inf, nan or 0x1.8p+0; got {text!r}"
        )


def fraction_text(value: Fraction) -> str:
    """An exact probability: the reduced fraction (0, 1, 3/8, ...)."""
    return str(value)


def decimal_text(value: Fraction) -> str:
    """A probability as a decimal of 12 significant digits."""
    return f"{float(value):.12g}"


def nu_text(nu: Fraction) -> str:
    """The discarded fraction: exactly where its denominator fits 32 bits, else approximately."""
    if nu.denominator <= 2**32:
        return f"{nu} = {float(nu):.10g}"
    return f"~{float(nu):.17g}"


def sr_rule(rbits: int | None, variant: str) -> str:
    """The probability of rounding away under SR with rbits random bits, as a formula."""
    n = "32 (exact SR)" if rbits is None else str(rbits)
    count = {
        "a": "floor(nu*2^n)",
        "b": "half_up(nu*2^n)",
        "c": "round_half_even(nu*2^n)",
        "odd": "round_half_odd(nu*2^n)",
    }[variant]
    return f"P(away from zero) = {count} / 2^n with n = {n}, variant {variant}"


def round_special(
    console: Console, x: float, fmt: Format, mode: str, sat: str
) -> outcomes.Outcomes:
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
        rows.append([f"{option}{chosen}", output.value_text(value), output.code_text(value, fmt)])
    Section(
        f"{output.value_text(x)} to {fmt.name} (infinite input)",
        ["sat", "result", "code"],
        rows,
        [
            "finite: +-inf go to +-max; propagate: infinities stay infinite (NaN where the "
            "format has no inf); none: the same as propagate for infinite inputs."
        ],
        left=("sat",),
    ).print(console)
    return outcomes.outcomes(x, fmt, mode, sat=sat)


def overflow_note(
    x: float, fmt: Format, mode: str, rbits: int | None, variant: str, sat: str
) -> str:
    """What each saturation mode makes of an out-of-range x."""
    value = output.value_text
    parts = []
    for option in reference.SATURATIONS:
        results = outcomes.outcomes(x, fmt, mode, rbits=rbits, variant=variant, sat=option)
        shown = ", ".join(
            value(v) if p == 1 else f"{value(v)} (p={fraction_text(p)})" for v, p in results
        )
        parts.append(f"sat={option}{' (chosen)' if option == sat else ''} -> {shown}")
    bound = f"max {value(fmt.max)}" if x > fmt.max else f"lowest {value(fmt.lowest)}"
    return f"overflow: {value(x)} is beyond the format's {bound}; " + "; ".join(parts)


def underflows(x: float, fmt: Format) -> bool:
    """Whether finite x lies below the smallest magnitude of a format without zero (e8m0).

    Args:
        x: the value.
        fmt: the target format.

    Such a format rounds 0 (of either sign) and every x with 0 < |x| < min normal to its
    smallest value of x's sign in every mode and saturation mode: an underflow, not a
    value on the grid and not an overflow.  Negative x in an unsigned format is out of
    range on the other side (an overflow), and is not counted here.
    """
    if fmt.has_zero or abs(x) >= fmt.min_normal:
        return False
    return x == 0 or x > 0 or fmt.signed


def underflow_note(x: float, fmt: Format, result: float) -> str:
    """The note explaining an underflow.

    Args:
        x: a value that `underflows` in ``fmt``.
        fmt: the target format (one without zero).
        result: what every mode and saturation mode gives for x (its smallest value).
    """
    smallest = output.value_text(fmt.min_normal)
    return (
        f"underflow: {output.value_text(x)} lies below {fmt.name}'s smallest magnitude "
        f"{smallest} ({output.number_text(fmt.min_normal)}) and {fmt.name} has no zero: "
        f"every mode and every sat rounds it to {output.value_text(result)}"
    )


def round_finite(
    console: Console,
    x: float,
    fmt: Format,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    distribution: outcomes.Outcomes,
) -> None:
    """The neighbours of a finite x with their probabilities in ``distribution``, any
    overflow result, and notes on the discarded fraction, the mode and overflow."""
    lower, upper = reference.neighbours(x, fmt)
    negative = math.copysign(1.0, x) < 0
    # below the smallest value of a format without zero both neighbours are that value,
    # which x is not: labelled as the underflow it is, not as x itself
    underflow = underflows(x, fmt)
    on_grid = outcomes.same_value(lower, upper)
    if underflow:
        candidates = [("smallest (underflow)", lower, "away from zero")]
    elif on_grid:
        candidates = [("x itself (representable)", lower, "")]
    else:
        toward, away = "toward zero", "away from zero"
        down, up = (away, toward) if negative else (toward, away)
        candidates = [("lower (round down)", lower, down), ("upper (round up)", upper, up)]
    rows = []
    for label, value, direction in candidates:
        probability = outcomes.probability_of(value, distribution)
        rows.append(
            [
                label,
                output.value_text(value),
                output.code_text(value, fmt),
                direction,
                fraction_text(probability),
                decimal_text(probability),
            ]
        )
    listed = [value for _, value, _ in candidates]
    for value, probability in distribution:
        if not any(outcomes.same_value(value, seen) for seen in listed):  # after overflow
            rows.append(
                [
                    f"overflow (sat={sat})",
                    output.value_text(value),
                    output.code_text(value, fmt),
                    "",
                    fraction_text(probability),
                    decimal_text(probability),
                ]
            )
    notes = []
    if underflow:
        notes.append(underflow_note(x, fmt, lower))
    out_of_range = (x > fmt.max or x < fmt.lowest) and not underflow
    if not on_grid and not out_of_range and not underflow:
        notes.append(f"discarded fraction nu = {nu_text(reference.discarded_fraction(x, fmt))} ulp")
    if mode == "sr" and not on_grid and not underflow:
        notes.append(sr_rule(rbits, variant))
    elif mode != "sr":
        notes.append(f"{mode} is deterministic: probability 1 for the value it chooses")
    if out_of_range:
        notes.append(overflow_note(x, fmt, mode, rbits, variant, sat))
    Section(
        f"{output.value_text(x)} to {fmt.name}",
        ["neighbour", "value", "code", "direction", "probability", "decimal"],
        rows,
        notes,
        left=("neighbour", "direction"),
    ).print(console)


def draw(
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
        output.fail("--format is required (a format name or alias) unless --hardware is given")
    fmt = output.checked_format(format_name)
    options: dict[str, Any] = {"rbits": rbits, "variant": variant, "sat": sat, "seed": seed}
    drawn = output.checked(
        lambda: rounding.round(torch.tensor([x], dtype=torch.float64), fmt, mode, **options)
    )
    return fmt, float(drawn.item())


def draw_with_unit(
    x: float, name: str, format_name: str | None, seed: int
) -> tuple[hardware.HardwarePreset, float, float]:
    """The hardware unit (a preset, or a family's with its format), x rounded to its operand
    format by the reference, and one result of stochround.round with the unit."""
    target = None if format_name is None else output.checked_format(format_name)
    unit = output.checked(lambda: hardware.preset(name, target))
    operand = reference.round_value(x, unit.operand, "rne")
    drawn = rounding.round(torch.tensor([x], dtype=torch.float64), hardware=unit.name, seed=seed)
    return unit, operand, float(drawn.item())


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
    mode_text: Annotated[
        str,
        typer.Option(
            "--mode",
            help="Rounding mode: rne, rna, rz, ru, rd, ro (round to odd) or sr (any case).",
        ),
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
    hardware_name: Annotated[
        str | None,
        typer.Option(
            "--hardware",
            help="A hardware SR unit (stochround hardware lists them), which sets the mode, "
            "rbits, variant and sat: the value is first rounded to the unit's operand format.",
            show_default=False,
        ),
    ] = None,
    seed_text: Annotated[
        str,
        typer.Option(
            "--seed",
            metavar="SEED",
            help="Seed of the random stream for the drawn result: an integer in [0, 2**64).",
        ),
    ] = "0",
) -> None:
    """Round one value: its two neighbours in the format, the exact probability of each under
    the chosen mode (or hardware unit), and one result drawn with stochround.round."""
    x = parse_value(value_text)
    seed = output.parse_seed(seed_text)
    mode = output.checked(lambda: check_mode(mode_text))
    if hardware_name is None:
        unit, operand = None, x
        fmt, drawn = draw(x, format_name, mode, rbits, variant, sat, seed)
    else:
        if (mode, rbits, variant, sat) != ("sr", None, "c", "none"):
            output.fail("--hardware sets the mode, rbits, variant and sat: pass none of them")
        unit, operand, drawn = draw_with_unit(x, hardware_name, format_name, seed)
        fmt, rbits, variant, sat = unit.target, unit.rbits, unit.variant, unit.sat
    console = output.new_console()
    header = f"x = {output.value_text(x)}  (float64 {x.hex()})  ->  "
    if unit is not None:
        header += (
            f"{unit.name}: operand {output.value_text(operand)} ({unit.source_format}, rne)  ->  "
        )
    console.print(
        header
        + f"{fmt.name}, mode={mode}"
        + (f", rbits={rbits or 'exact (32-bit words)'}, variant={variant}" if mode == "sr" else "")
        + f", sat={sat}",
        markup=False,
        soft_wrap=True,
    )

    if math.isnan(operand) or math.isinf(operand):
        distribution = round_special(console, operand, fmt, mode, sat)
    else:
        if unit is not None and unit.flushes(operand):
            assert unit.flush_below is not None  # a unit without a threshold flushes nothing
            console.print(
                f"{unit.name} flushes operands below {output.value_text(unit.flush_below)} in "
                "magnitude to zero: this one is flushed.",
                markup=False,
                soft_wrap=True,
            )
            distribution = outcomes.flushed(operand, fmt)
        else:
            distribution = outcomes.outcomes(
                operand, fmt, mode, rbits=rbits, variant=variant, sat=sat
            )
        round_finite(console, operand, fmt, mode, rbits, variant, sat, distribution)

    has_code = not (math.isnan(drawn) and not fmt.has_nan)
    console.print(
        f"drawn with stochround.round (seed={seed}): {output.value_text(drawn)}"
        + (f"  code {output.code_text(drawn, fmt)}" if has_code else ""),
        markup=False,
        soft_wrap=True,
    )
    if not any(outcomes.same_value(drawn, value) for value, p in distribution if p > 0):
        output.new_console(stderr=True).print(
            Text(
                f"inconsistent: stochround.round gave {output.value_text(drawn)}, which the "
                "reference gives with probability 0 (a library bug; please report it)",
                style="red",
            ),
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INCONSISTENT)
