"""The stochround model converter for torchtitan: a recipe by name, per-module rules, a seed.

torchtitan (0.3.0) converts a model before it is built: a converter walks the model's
config tree and replaces each ``Linear.Config`` it selects by the config of another linear
class (its float8 / mx / nvfp4 converters do the same with torchao's layers).
`StochroundConverter` replaces them by `StochroundLinear.Config`, whose module is a
`stochround.nn.QuantizedLinear` that also satisfies torchtitan's ``Module`` protocol, so
the trainer builds, initializes, shards (FSDP2), compiles and checkpoints it as any linear.

Which layers and which recipe: `stochround.integrations.torchtitan.recipe_rules` (the
rules of `stochround.nn.quantize_` on the paths torchtitan's ``traverse`` writes).  The
swapped layers are numbered 0,
1, ... in the config tree's order (their ``layer_index``: each draws its own random
streams).

Tensor parallelism is refused: `StochroundLinear.parallelize` raises ValueError when the
tensor-parallel degree is above 1, and under the ``full_dtensor`` backend, whose parameters
stay DTensors.  `QuantizedLinear` itself runs under torch's `ColwiseParallel` and
`RowwiseParallel` (`stochround.nn.tensor_parallel`), but torchtitan's TP plans (sequence
parallelism, loss parallelism, its prepare-input styles) have not been run with it, and
torchtitan 0.3.0 does not run on the GPU machine's torch: refused until a run checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module
from torchtitan.tools.logging import logger

from ...nn.linear import QuantizedLinear
from ...nn.recipes import Recipe
from .recipe_rules import RecipeChoice, check_fits, make_recipe

# backends under which FSDP2 hands the layer plain tensors (the gathered weight)
SUPPORTED_SPMD_BACKENDS: tuple[str, ...] = ("spmd_types", "partial_dtensor")


class StochroundLinear(QuantizedLinear, Module):
    """A `stochround.nn.QuantizedLinear` built from a torchtitan config.

    Its config is a ``Linear.Config`` (in/out features, bias, ``param_init``, the sharding
    the model sets) with the layer's `Recipe` and ``layer_index``.  The ``step`` buffer
    (persistent: a DCP checkpoint saves it, so a resumed run draws the same random bits)
    is made on the real device by ``init_states`` (torchtitan builds models on ``meta``).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        recipe: Recipe = field(default_factory=Recipe)
        """The layer's recipe (`stochround.nn.recipes`)."""

        layer_index: int = 0
        """The layer's number in the model: its random streams."""

    def __init__(self, config: Config) -> None:
        QuantizedLinear.__init__(
            self,
            config.in_features,
            config.out_features,
            bias=config.bias,
            recipe=config.recipe,
            layer_index=config.layer_index,
        )
        # a slot that init_states fills on the real device (torchtitan's buffer protocol,
        # as NVFP4Linear's _sr_seed): parallelize distributes no None buffer, so the counter
        # stays a plain tensor, the same on every rank
        self.register_buffer("step", None, persistent=True)

    def _init_self_buffers(self, *, buffer_device: torch.device | None = None) -> None:
        device = buffer_device if buffer_device is not None else self.weight.device
        self.step = torch.zeros((), dtype=torch.int64, device=device)

    def parallelize(self, parallel_dims: Any) -> None:
        """torchtitan's ``Module.parallelize``, after refusing tensor parallelism and the
        ``full_dtensor`` backend (ValueError naming the setting)."""
        if parallel_dims.tp > 1:
            raise ValueError(
                "stochround's torchtitan converter does not support tensor parallelism yet "
                f"(parallelism.tensor_parallel_degree={parallel_dims.tp}): torchtitan's TP "
                "plans are untested with QuantizedLinear; shard with FSDP2 (parallelism."
                "data_parallel_shard_degree) instead, or keep this layer in bf16 with a rule"
            )
        backend = parallel_dims.spmd_backend
        if backend not in SUPPORTED_SPMD_BACKENDS:
            raise ValueError(
                f"stochround recipes need parallelism.spmd_backend in "
                f"{', '.join(SUPPORTED_SPMD_BACKENDS)} (FSDP2 gathers plain weights); "
                f"got {backend!r}"
            )
        Module.parallelize(self, parallel_dims)


class StochroundConverter(QuantizationConverter):
    """Replace the selected ``Linear.Config`` nodes by `StochroundLinear.Config` (the
    module docstring says which, under which recipe)."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe: str = "nvfp4"
        """The recipe of every layer no rule decides: a name of `stochround.nn.RECIPES`."""

        switches: dict[str, Any] = field(default_factory=dict)
        """The recipe's keyword switches, e.g. ``{"stochastic_rounding": False}``."""

        seed: int = 0
        """The seed of every random bit the recipes draw."""

        keep: list[str] = field(default_factory=lambda: ["lm_head"])
        """Module-path regexes (``re.search``) left in bf16: the output head by default."""

        rules: list[tuple[str, str | None]] = field(default_factory=list)
        """``(regex, recipe name or None)``: the first regex matching a layer's whole path
        gives its recipe (with its default switches, this seed and ``keep``); None leaves
        the layer in bf16."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.choice = RecipeChoice(
            config.recipe, config.switches, rules=config.rules, keep=config.keep, seed=config.seed
        )
        logger.info(f"stochround: recipe {config.recipe} {config.switches} seed {config.seed}")

    def convert(self, model_config: Any) -> Any:
        """The model config with each selected linear swapped (ValueError naming the layer
        whose shape does not fit its recipe's blocks)."""
        index = 0
        swaps = 0
        for path, linear, parent, attr in model_config.traverse(Linear.Config):
            recipe = self.choice.recipe_of(path)
            if recipe is None:
                continue
            new = StochroundLinear.Config(
                in_features=linear.in_features,
                out_features=linear.out_features,
                bias=linear.bias,
                param_init=linear.param_init,
                recipe=recipe,
                layer_index=index,
            )
            check_fits(path, new.in_features, new.out_features, recipe, index)
            index += 1
            swaps += 1
            if parent is None:
                model_config = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
        logger.info(f"stochround: swapped {swaps} Linear layers for StochroundLinear")
        return model_config


def converted_paths(model_config: Any) -> dict[str, str]:
    """``{path: recipe name}`` of the `StochroundLinear` layers of a model config."""
    return {
        path: linear.recipe.name
        for path, linear, _, _ in model_config.traverse(StochroundLinear.Config)
    }


__all__ = [
    "SUPPORTED_SPMD_BACKENDS",
    "StochroundConverter",
    "StochroundLinear",
    "check_fits",
    "converted_paths",
    "make_recipe",
]
