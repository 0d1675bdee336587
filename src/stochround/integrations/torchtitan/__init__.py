"""stochround as a torchtitan component (``pip install stochround[torchtitan]``).

- `StochroundConverter`: torchtitan's model converter of the stochround recipes (a recipe
  by name with its switches, per-module rules, the seed), whose layers are
  `StochroundLinear` (a `stochround.nn.QuantizedLinear` in torchtitan's Module protocol);
- `SROptimizersContainer` and `sr_optimizer`: the SR optimizers (AdamW, Adam, SGD, Lion
  with bf16 states) by name in a trainer's optimizer config;
- `StdlibDataLoader` and `ByteTokenizer`: offline data, the Python standard library's
  source as bytes;
- `config_registry`: trainer configs torchtitan's ``--module`` finds, and `titan_config`;
  `run` trains one (the ``stochround titan`` command).

Importing this package imports torchtitan (0.3.0, which needs torch >= 2.11); without it,
ImportError says what to install.
"""

from __future__ import annotations

try:
    import torchtitan  # noqa: F401
except ImportError as error:  # pragma: no cover - the tests skip without torchtitan
    raise ImportError(
        "stochround.integrations.torchtitan needs torchtitan: pip install 'stochround[torchtitan]'"
    ) from error

from .config_registry import ACTIVATION_CHECKPOINTS, FLAVORS, OPTIMIZERS, titan_config
from .converter import StochroundConverter, StochroundLinear, converted_paths, make_recipe
from .data import ByteTokenizer, StdlibDataLoader, StdlibDataset, stdlib_files
from .optimizers import SR_OPTIMIZERS, SROptimizersContainer, sr_optimizer

__all__ = [
    "ACTIVATION_CHECKPOINTS",
    "FLAVORS",
    "OPTIMIZERS",
    "SR_OPTIMIZERS",
    "ByteTokenizer",
    "SROptimizersContainer",
    "StdlibDataLoader",
    "StdlibDataset",
    "StochroundConverter",
    "StochroundLinear",
    "converted_paths",
    "make_recipe",
    "sr_optimizer",
    "stdlib_files",
    "titan_config",
]
