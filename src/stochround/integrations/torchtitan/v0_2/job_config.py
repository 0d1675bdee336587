"""The ``[stochround]`` section of a torchtitan 0.2.2 job config.

torchtitan merges the ``JobConfig`` dataclass of the module ``job.custom_config_module``
names (in the TOML or on the command line) into its own; naming this module also
registers the ``stochround`` converter and the ``stochround_llama3`` train spec (its
import does), so a TOML run needs no other code::

    [job]
    custom_config_module = "stochround.integrations.torchtitan.v0_2.job_config"
    [model]
    name = "stochround_llama3"
    converters = ["stochround"]
    [stochround]
    recipe = "nvfp4"

It also adds ``seed`` to torchtitan's ``[optimizer]`` section: the SR optimizers' seed
(torchtitan hands its optimizer builder that section alone).
"""

# no `from __future__ import annotations`: torchtitan's tyro resolves these hints in its own
# merged class, where string annotations naming Stochround would not resolve
from dataclasses import dataclass, field

from . import converter, train_spec  # noqa: F401  (their imports register them)


@dataclass
class Stochround:
    recipe: str = "nvfp4"
    """The recipe of every layer no rule decides: a name of `stochround.nn.RECIPES`."""

    switches: str = "{}"
    """The recipe's keyword switches as a JSON object, e.g. '{"stochastic_rounding": false}'."""

    seed: int = 0
    """The seed of every random bit the recipes draw."""

    keep: list[str] = field(default_factory=lambda: ["^output$"])
    """Module-path regexes (re.search) left in bf16: the output head by default."""

    rules: list[str] = field(default_factory=list)
    """'REGEX=RECIPE' items: the first REGEX matching a layer's whole path gives its recipe
    (its default switches, this seed and keep); RECIPE bf16 leaves the layer in bf16."""


@dataclass
class Optimizer:
    seed: int | None = None
    """The SR optimizers' seed (optimizer.name SRAdamW, SRAdam, SRSGD, SRLion): the run's
    seed, as titan_config and the TOML set it; unset, one from torch's generator state."""


@dataclass
class JobConfig:
    stochround: Stochround = field(default_factory=Stochround)
    # merged into torchtitan's [optimizer] section, field by field
    optimizer: Optimizer = field(default_factory=Optimizer)


__all__ = ["JobConfig", "Optimizer", "Stochround"]
