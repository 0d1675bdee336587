"""The experiment suite: one module per experiment, each with
``run(quick, seed, out, progress) -> Experiment``; `report` holds the shared helpers."""

from types import ModuleType

from . import limited_bits, stagnation, summation
from .report import Experiment

EXPERIMENTS: dict[str, ModuleType] = {
    "stagnation": stagnation,
    "summation": summation,
    "limited-bits": limited_bits,
}
DEFAULT_SEED = 2024

__all__ = ["DEFAULT_SEED", "EXPERIMENTS", "Experiment"]
