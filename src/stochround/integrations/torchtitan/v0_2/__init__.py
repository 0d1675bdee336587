"""stochround in torchtitan 0.2.2 (torch 2.10 to 2.12: ``pip install
'stochround[torchtitan-0.2]'``), the API of `stochround.integrations.torchtitan` when 0.2.2
is installed.

torchtitan 0.2.2 builds the model on ``meta`` from its flavour's ``TransformerModelArgs``,
then applies the ``model.converters`` its job config names (registered classes with
``__init__(job_config, parallel_dims)`` and ``convert(model)``), then shards, materializes
(``to_empty``) and initializes it (``init_weights``).  Its job config is a dataclass tree
read from TOML and the command line; ``job.custom_config_module`` adds sections.  Here:

- `converter`: `StochroundConverter`, registered as ``"stochround"``: a module swap by
  `stochround.nn.quantize_` of the recipe, rules, keep and seed of the ``[stochround]``
  section;
- `job_config`: that section (`Stochround`), the module ``job.custom_config_module`` names;
- `optimizers`: `build_sr_optimizers`, ``optimizer.name`` one of torch's or the SR
  optimizers;
- `data`: `ByteTokenizer`, `build_stdlib_dataloader` (offline data);
- `train_spec`: the train spec ``stochround_llama3`` (Llama 3 with the flavours
  ``debugmodel``, ``100M``, ``tiny`` and the pieces above);
- `config`: `titan_config`, the job config of a run; ``stochround_debugmodel.toml`` beside
  it, for ``python -m torchtitan.train --job.config_file``;
- `run`: `run_training` (the ``stochround titan`` command).
"""

from __future__ import annotations

from .config import HEAD, TOML, titan_config
from .converter import CONVERTER_NAME, StochroundConverter, converted_paths
from .data import ByteTokenizer, build_byte_tokenizer, build_stdlib_dataloader
from .job_config import Stochround
from .optimizers import build_sr_optimizers
from .run import run_training
from .train_spec import TRAIN_SPEC_NAME, model_args

__all__ = [
    "CONVERTER_NAME",
    "HEAD",
    "TOML",
    "TRAIN_SPEC_NAME",
    "ByteTokenizer",
    "Stochround",
    "StochroundConverter",
    "build_byte_tokenizer",
    "build_sr_optimizers",
    "build_stdlib_dataloader",
    "converted_paths",
    "model_args",
    "run_training",
    "titan_config",
]
