"""Rounding as a hardware unit does, and what that rounding is worth: a preset's result, its
expected value over the unit's random integers and its bias against exact SR.

The presets themselves are data (`stochround.presets`); rounding with one is an option of
the rounding API (`stochround.round(x, fmt, hardware=name)`), which `round_hardware` calls.
A preset's expected value is exact: by enumerating every random integer when rbits <= 16,
by the closed form ``down + P(away) (up - down)`` otherwise, with P(away) from
`stochround.reference.away_probability`.
"""

from __future__ import annotations

from fractions import Fraction

import torch
from torch import Tensor

from .. import reference
from ..formats import Format
from ..formats import format as find_format
from ..presets import HardwarePreset, preset
from ..rounding import check_input, preset_operand, round_float64, round_preset
from ..rounding import round as round_api

__all__ = [
    "ENUMERATE_MAX_RBITS",
    "bias_against_exact",
    "expected_value",
    "operand_values",
    "round_hardware",
    "round_hardware_float64",
    "ulp",
]

# Expected values are computed by enumerating every random integer up to this many bits
# (2**16 evaluations of the vectorized path); above it, by the closed form.
ENUMERATE_MAX_RBITS = 16
_ENUMERATION_CHUNK_ELEMENTS = 1 << 22


def operand_values(x: Tensor, name_or_preset: str | HardwarePreset) -> Tensor:
    """The instruction's operand: x rounded to nearest-even in the preset's source format
    (the identity when x already has that format), in that format's torch dtype when it
    has one (float64 otherwise), which holds it exactly."""
    return preset_operand(x, preset(name_or_preset))


def round_hardware(
    x: Tensor,
    name_or_preset: str | HardwarePreset,
    *,
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | None = None,
    index_offset: int = 0,
) -> Tensor:
    """Round x as the preset's hardware unit does; the result has x's dtype and shape.

    x is first rounded to nearest-even in the preset's source format (the instruction's
    operand), then stochastically rounded per the preset (its docstring fields say how).
    ``rand``: each element's random integer in ``[0, 2**rbits)``, broadcastable to x;
    otherwise the top ``rbits`` bits of the counter-based word ``(seed, offset, index)``,
    the index counted from ``index_offset`` (a shard's place in the whole tensor).
    Values outside x's dtype's range become infinite or zero in it, as in ``sr.round``.
    This is ``sr.round(x, hardware=name_or_preset, ...)``: gradients pass straight through,
    and `torch.compile` traces it.
    """
    return round_api(
        x, hardware=name_or_preset, seed=seed, offset=offset, rand=rand, index_offset=index_offset
    )


def round_hardware_float64(
    x: Tensor,
    name_or_preset: str | HardwarePreset,
    *,
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | None = None,
    index_offset: int = 0,
) -> Tensor:
    """`round_hardware` with the result in float64, which holds every target value."""
    p = preset(name_or_preset)
    return round_preset(operand_values(x, p), p, seed, offset, rand, index_offset=index_offset)


def expected_value(x: Tensor, name_or_preset: str | HardwarePreset) -> Tensor:
    """E[round_hardware(x)] over a uniform random integer, as float64: exact, by
    enumerating every random integer when rbits <= 16, else by the closed form."""
    p = preset(name_or_preset)
    operand = operand_values(x, p)
    if p.rbits <= ENUMERATE_MAX_RBITS:
        return _expected_by_enumeration(p, operand)
    return _expected_by_closed_form(p, operand)


def _expected_by_enumeration(p: HardwarePreset, operand: Tensor) -> Tensor:
    flat = operand.reshape(-1)
    count = 1 << p.rbits
    total = torch.zeros(flat.shape, dtype=torch.float64, device=flat.device)
    rows = max(1, _ENUMERATION_CHUNK_ELEMENTS // max(1, flat.numel()))
    first = None
    for start in range(0, count, rows):
        r = torch.arange(start, min(start + rows, count), dtype=torch.int64, device=flat.device)
        block = flat.unsqueeze(0).expand(r.numel(), -1)
        results = round_preset(block, p, None, 0, r.unsqueeze(1).expand_as(block))
        first = results[0] if first is None else first
        total = total + results.sum(dim=0)
    # Every sum is of at most 2**16 values of the target's grid: exact in float64. A zero
    # mean comes from zeros only, which share the sign of the one at r = 0.
    mean = total / count
    assert first is not None  # count = 2**rbits >= 1: the loop ran
    return torch.where(mean == 0, first, mean).reshape(operand.shape)


def _expected_by_closed_form(p: HardwarePreset, operand: Tensor) -> Tensor:
    """down + P(away) (away - down), with P(away) from reference.away_probability."""
    never_away = torch.zeros(operand.shape, dtype=torch.int64, device=operand.device)
    # Variant a never rounds away with r = 0, whatever the preset's variant: the value kept.
    down = round_preset(operand, p, None, 0, never_away, variant="a")
    up = round_float64(operand, p.target_format, "ru", sat=p.sat)
    up_negative = round_float64(operand, p.target_format, "rd", sat=p.sat)
    exact = operand.to(torch.float64)
    up = p.flush(exact, torch.where(exact < 0, up_negative, up))
    probability = [_away_probability(value, p) for value in exact.reshape(-1).tolist()]
    chance = torch.tensor(probability, dtype=torch.float64, device=operand.device).reshape(
        operand.shape
    )
    # Where the candidates coincide (zero chance, or both infinite) keep `down`: no 0 * inf.
    moves = (chance > 0) & (up != down)
    return torch.where(moves, down + chance * (up - down), down)


def _away_probability(value: float, p: HardwarePreset) -> float:
    """reference.away_probability of one operand value (0 for zero, NaN and infinities)."""
    if value != value or value in (0.0, float("inf"), float("-inf")):
        return 0.0
    nu = reference.discarded_fraction(Fraction(value), p.target)
    return float(reference.away_probability(nu, p.rbits, p.variant))


def ulp(x: Tensor, fmt: Format | str) -> Tensor:
    """The spacing of ``fmt``'s grid at x, 2**(max(floor(log2|x|), emin) - mbits), as float64
    (the subnormal spacing at zero; NaN for non-finite x)."""
    fmt = find_format(fmt)
    xd = x.to(torch.float64)
    regular = torch.isfinite(xd) & (xd != 0)
    _, exponent = torch.frexp(torch.where(regular, xd.abs(), 1.0))
    e = torch.clamp(exponent.to(torch.int64) - 1, min=fmt.emin)
    e = torch.where(regular, e, torch.full_like(e, fmt.emin))
    spacing = torch.ldexp(torch.ones_like(xd), e - fmt.mbits)
    return torch.where(torch.isfinite(xd), spacing, float("nan"))


def bias_against_exact(name: str | HardwarePreset, x: Tensor) -> Tensor:
    """E[round_hardware(x)] - x in ulps of the target format at x (float64, x's shape).

    Exact SR gives 0; variant a with too few random bits gives a value in (-2**-n, 0] for
    positive x; flushing and rounding x to the source format show up here too.
    """
    p = preset(name)
    x = check_input(x)
    expected = expected_value(x, p)
    xd = x.to(torch.float64)
    return (expected - xd) / ulp(xd, p.target)
