"""stochround as a torchtitan component (``pip install 'stochround[torchtitan]'`` for
torchtitan 0.3.0 on torch >= 2.13, ``'stochround[torchtitan-0.2]'`` for 0.2.2 on torch
2.10 to 2.12).

Which API this package exports depends on the installed torchtitan
(`stochround.integrations.torchtitan.versions`); both offer

- the stochround recipes as a model converter (a recipe by name with its switches,
  per-module rules, keep, the seed: `recipe_rules`) — 0.3.0: `StochroundConverter`
  swapping configs for `StochroundLinear`; 0.2.2: `StochroundConverter` registered as
  ``"stochround"``, a module swap (`stochround.integrations.torchtitan.v0_2`);
- the SR optimizers (AdamW, Adam, SGD, Lion with bf16 states) by name (`sr_optimizers`);
- offline data, the Python standard library's source as bytes (`corpus`);
- `titan_config` (a run's trainer or job config: `FLAVORS`, recipe, optimizer) and
  `run_training` (the ``stochround titan`` command).

Importing this package imports torchtitan; without it, or with another release,
ImportError names the installed version and the supported ones.
"""

from __future__ import annotations

from .versions import installed_torchtitan, titan_api

TITAN_VERSION = installed_torchtitan()
TITAN_API = titan_api(TITAN_VERSION)

from .checkpointing import ACTIVATION_CHECKPOINTS  # noqa: E402
from .corpus import ByteCodec, StdlibDataset, stdlib_files  # noqa: E402
from .flavors import FLAVORS  # noqa: E402
from .recipe_rules import RecipeChoice, make_recipe  # noqa: E402
from .sr_optimizers import OPTIMIZERS, SR_OPTIMIZERS  # noqa: E402

if TITAN_API == "0.3":
    from .config_registry import titan_config
    from .converter import StochroundConverter, StochroundLinear, converted_paths
    from .data import ByteTokenizer, StdlibDataLoader
    from .optimizers import SROptimizersContainer, sr_optimizer
    from .run import run_training

    __all__ = [
        "SROptimizersContainer",
        "StdlibDataLoader",
        "StochroundLinear",
        "sr_optimizer",
    ]
else:
    # the same names as the 0.3 branch, other objects: mypy sees the 0.3 branch's types
    from .v0_2 import (  # type: ignore[assignment]
        ByteTokenizer,
        StochroundConverter,
        build_sr_optimizers,
        converted_paths,
        run_training,
        titan_config,
    )

    __all__ = ["build_sr_optimizers"]

__all__ += [
    "ACTIVATION_CHECKPOINTS",
    "FLAVORS",
    "OPTIMIZERS",
    "SR_OPTIMIZERS",
    "TITAN_API",
    "TITAN_VERSION",
    "ByteCodec",
    "ByteTokenizer",
    "RecipeChoice",
    "StdlibDataset",
    "StochroundConverter",
    "converted_paths",
    "make_recipe",
    "run_training",
    "stdlib_files",
    "titan_config",
]
