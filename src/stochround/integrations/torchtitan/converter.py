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

Tensor parallelism: torchtitan's model config declares each linear's sharding
(``sharding_config``: colwise ``S(0)`` or rowwise ``S(1)`` weights on the ``tp`` axis),
and its ``Module.parallelize`` hands a swapped layer its rank's shard.  Under the
``spmd_types`` backend (torchtitan's default) the layer's weight and inputs are plain local
tensors: `StochroundLinear.parallelize` checks that its recipe's blocks divide the local
weight (a block would otherwise straddle two ranks' shards: ValueError naming the layer,
the degree and the local shape) and keys the layer's random words by its TP rank
(`stochround.nn.tensor_parallel.rank_key`, as the DTensor path does), so the GEMMs run on
each rank's local operands, quantized there.  Under ``partial_dtensor`` the weight is a
DTensor and `QuantizedLinear` runs its own tensor-parallel path
(`stochround.nn.tensor_parallel`).  The ``full_dtensor`` backend, whose FSDP parameters
stay DTensors on a 2-D mesh, is refused.  The tensor scales come from each rank's shard,
so a recipe with tensor scales (nvfp4) does not give a one-device run's bits (the
distributed guide's decision).

Data parallelism: `StochroundLinear.parallelize` also gives the layer its rank on
torchtitan's ``loss`` mesh (data-parallel replicate and shard, and context parallel:
`stochround.integrations.torchtitan.ranks`), which keys the words of x and dy, while
every rank quantizes the all-gathered weight with the same words (`stochround.nn.streams`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.distributed.parallel_dims import MeshAxisName
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import ShardingConfig
from torchtitan.tools.logging import logger

from ...nn.linear import Plan, QuantizedLinear
from ...nn.recipes import Recipe
from ...nn.tensor_parallel import rank_key
from .ranks import data_parallel_rank, process_rank
from .recipe_rules import RecipeChoice, check_fits, make_recipe

# backends under which FSDP2 hands the layer plain tensors (the gathered weight)
SUPPORTED_SPMD_BACKENDS: tuple[str, ...] = ("spmd_types", "partial_dtensor")


class StochroundLinear(QuantizedLinear, Module):
    """A `stochround.nn.QuantizedLinear` built from a torchtitan config.

    Its config is a ``Linear.Config`` (in/out features, bias, ``param_init``, the sharding
    the model sets) with the layer's `Recipe`, ``layer_index`` and ``path``.  The ``step``
    buffer (persistent: a DCP checkpoint saves it, so a resumed run draws the same random
    bits) is made on the real device by ``init_states`` (torchtitan builds models on
    ``meta``).  ``tp_rank`` is the layer's rank on the tensor-parallel axis when it holds
    a plain local shard (module docstring): its random words are keyed by it; its
    ``data_parallel_rank`` keys the words of x and dy (`QuantizedLinear`): the process's
    global rank when built, its rank on torchtitan's ``loss`` mesh once ``parallelize``
    runs (`ranks`).
    """

    tp_rank: int = 0

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        recipe: Recipe = field(default_factory=Recipe)
        """The layer's recipe (`stochround.nn.recipes`)."""

        layer_index: int = 0
        """The layer's number in the model: its random streams."""

        path: str = ""
        """The layer's path in the model (for error messages)."""

    def __init__(self, config: Config) -> None:
        QuantizedLinear.__init__(
            self,
            config.in_features,
            config.out_features,
            bias=config.bias,
            recipe=config.recipe,
            layer_index=config.layer_index,
            # until parallelize gives the loss mesh's rank (`ranks.process_rank`)
            data_parallel_rank=process_rank(),
        )
        self.path = config.path
        self.tp_axis = tp_weight_axis(config.sharding_config)
        # a slot that init_states fills on the real device (torchtitan's buffer protocol,
        # as NVFP4Linear's _sr_seed): parallelize distributes no None buffer, so the counter
        # stays a plain tensor, the same on every rank
        self.register_buffer("step", None, persistent=True)

    def layer_plan(self, recipe: Recipe, layer: int) -> Plan:
        """`QuantizedLinear.layer_plan` with its Philox key keyed by ``tp_rank``
        (`rank_key`: the layer's own key on rank 0)."""
        plan = QuantizedLinear.layer_plan(self, recipe, layer)
        return plan._replace(seed=rank_key(plan.seed, self.tp_rank))

    def _init_self_buffers(self, *, buffer_device: torch.device | None = None) -> None:
        device = buffer_device if buffer_device is not None else self.weight.device
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.place_stream_bases(device)  # the compiled ops' column

    def check_tp_shard(self, tp: int) -> None:
        """ValueError, naming the layer, the degree and the local weight, unless ``tp``
        ranks shard the weight evenly into shards the recipe's blocks divide."""
        axis = self.tp_axis
        if tp == 1 or axis is None:
            return
        shape = [self.out_features, self.in_features]
        setting = f"parallelism.tensor_parallel_degree={tp}"
        if shape[axis] % tp:
            raise ValueError(
                f"{self.path or self.layer_index}: {setting} does not divide the weight's "
                f"axis {axis} (shape {tuple(shape)}); leave the layer in bf16 with a rule or keep"
            )
        shape[axis] //= tp
        try:
            check_fits(self.path, shape[1], shape[0], self.recipe, self.layer_index)
        except ValueError as error:
            raise ValueError(
                f"{error} (under {setting} each rank quantizes its local weight "
                f"{tuple(shape)}: a block would straddle two ranks' shards)"
            ) from None

    def parallelize(self, parallel_dims: Any) -> None:
        """torchtitan's ``Module.parallelize``, after checking the layer's tensor-parallel
        shards (`check_tp_shard`), refusing the ``full_dtensor`` backend (ValueError naming
        the setting), keying the words of x and dy by the data-parallel rank
        (`data_parallel_rank`) and, under ``spmd_types``, all the words by the TP rank."""
        backend = parallel_dims.spmd_backend
        if backend not in SUPPORTED_SPMD_BACKENDS:
            raise ValueError(
                f"stochround recipes need parallelism.spmd_backend in "
                f"{', '.join(SUPPORTED_SPMD_BACKENDS)} (FSDP2 gathers plain weights); "
                f"got {backend!r}"
            )
        self.check_tp_shard(parallel_dims.tp)
        if parallel_dims.tp > 1 and backend == "spmd_types" and self.tp_axis is not None:
            # plain local shards: the layer cannot see its rank (a DTensor weight tells
            # QuantizedLinear's own path, under partial_dtensor)
            self.tp_rank = parallel_dims.get_mesh("tp").get_local_rank()
        self.set_data_parallel_rank(data_parallel_rank(parallel_dims))  # the plan, made again
        Module.parallelize(self, parallel_dims)


def tp_weight_axis(sharding: ShardingConfig | None) -> int | None:
    """The weight axis a linear's sharding config shards over the ``tp`` mesh axis (0:
    colwise, 1: rowwise), None where it shards none."""
    if sharding is None or "weight" not in sharding.state_shardings:
        return None
    placement = sharding.state_shardings["weight"].per_axis_spmd_types().get(MeshAxisName.TP)
    dim = getattr(placement, "dim", None)
    return None if dim is None else dim % 2


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
                path=path,
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
    "tp_weight_axis",
]
