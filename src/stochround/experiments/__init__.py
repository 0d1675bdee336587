"""The experiment suite: one module per experiment, each with
``run(quick, seed, out, progress) -> Experiment`` (those that train a model, lm, also take
``device``; its parts are the `lm_*` modules); `report` holds the shared helpers."""

from types import ModuleType

from . import (
    block_formats,
    emulate_science,
    gradient_descent,
    hardware_units,
    language_model,
    limited_bits,
    lorenz96,
    optimizer_state,
    recipes_regime,
    stagnation,
    summation,
    tall_thin,
)
from .report import Experiment

EXPERIMENTS: dict[str, ModuleType] = {
    "stagnation": stagnation,
    "summation": summation,
    "limited-bits": limited_bits,
    "gradient-descent": gradient_descent,
    "hardware-units": hardware_units,
    "lorenz96": lorenz96,
    "tall-thin": tall_thin,
    "block-formats": block_formats,
    "optimizer-state": optimizer_state,
    "emulate-science": emulate_science,
    "lm": language_model,
    "recipes-regime": recipes_regime,
}
DEFAULT_SEED = 2024

__all__ = ["DEFAULT_SEED", "EXPERIMENTS", "Experiment"]
