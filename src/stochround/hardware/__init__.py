"""Hardware SR units: presets that reproduce the stochastic-rounding conversions of shipping
hardware (AMD MI300/MI350, NVIDIA ``cvt.rs``, Graphcore IPU, Intel), rounding as each unit
does, and the unit's expected value and bias against exact SR.

The presets are data (`stochround.presets`, re-exported here); `round_hardware` (or
``stochround.round(x, fmt, hardware=name)``) applies one; `expected_value` and
`bias_against_exact` say what the unit's limited random bits cost.
"""

from ..presets import FAMILIES, PRESETS, HardwarePreset, family, preset
from .units import (
    ENUMERATE_MAX_RBITS,
    bias_against_exact,
    expected_value,
    operand_values,
    round_hardware,
    round_hardware_float64,
    ulp,
)

__all__ = [
    "ENUMERATE_MAX_RBITS",
    "FAMILIES",
    "PRESETS",
    "HardwarePreset",
    "bias_against_exact",
    "expected_value",
    "family",
    "operand_values",
    "preset",
    "round_hardware",
    "round_hardware_float64",
    "ulp",
]
