"""``stochround hardware [NAME]``: the hardware SR units stochround reproduces, or one of
them documented: its formats, random bits, rules, sources and decisions."""

from typing import Annotated

import typer

from .. import hardware
from . import output
from .output import Section

HARDWARE_EPILOG = (
    "Examples: stochround hardware ; stochround hardware amd-mi300-fp8 ; "
    "stochround hardware nvidia-cvt-rs --format e2m1"
)


def flush_rule(unit: hardware.HardwarePreset) -> str:
    """The unit's flush to zero, as a table cell ("-" where it flushes nothing)."""
    return "-" if unit.flush_below is None else f"below {output.number_text(unit.flush_below)}"


def hardware_section() -> Section:
    """Every hardware preset: what its unit reads and writes, its random bits and rules."""
    headers = ["preset", "operand", "target", "rbits", "variant", "sat", "flush to zero"]
    rows = [
        [p.name, p.source_format, p.target_format, str(p.rbits), p.variant, p.sat, flush_rule(p)]
        for p in hardware.PRESETS.values()
    ]
    notes = [
        "Families (a preset's name without its destination; --format picks the unit): "
        + ", ".join(hardware.FAMILIES)
        + ". stochround hardware NAME documents one unit; stochround round VALUE --hardware "
        "NAME gives a value's exact probabilities under it; sr.round(x, hardware=NAME) rounds "
        "with it."
    ]
    return Section("Hardware SR units", headers, rows, notes, left=tuple(headers[:3]))


def preset_section(unit: hardware.HardwarePreset) -> Section:
    """One preset: its fields, then what the unit does, the sources and the decisions."""
    rows = [
        ["name", unit.name],
        ["family", hardware.family(unit.name)],
        ["operand format", f"{unit.source_format} (wider inputs are rounded to it, rne)"],
        ["target format", unit.target_format],
        ["random bits", str(unit.rbits)],
        ["variant", unit.variant],
        ["sat", unit.sat],
        ["flush to zero", flush_rule(unit)],
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
    console = output.new_console()
    if name is None:
        if format_name is not None:
            output.fail("--format picks a unit of the family NAME: give NAME too")
        hardware_section().print(console)
        return
    target = None if format_name is None else output.checked_format(format_name)
    unit = output.checked(lambda: hardware.preset(name, target))
    preset_section(unit).print(console)
