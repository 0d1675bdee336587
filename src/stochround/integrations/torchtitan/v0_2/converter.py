"""The stochround model converter of torchtitan 0.2.2: a module swap after the build.

torchtitan 0.2.2 builds the model on ``meta`` and then calls each converter its job config
names (``model.converters``) on it, as its float8 and mx converters swap ``nn.Linear`` for
torchao's layers.  `StochroundConverter` (registered as ``"stochround"``) swaps them by
`stochround.nn.quantize_` — each selected ``nn.Linear`` becomes a `QuantizedLinear`
sharing its Parameters, numbered 0, 1, ... in ``named_modules`` order (its random
streams) — under the recipe, rules, keep and seed of the job config's ``[stochround]``
section (`stochround.integrations.torchtitan.recipe_rules`).

The step counters: a swapped layer's ``step`` buffer is made on ``meta`` with the model;
torchtitan then materializes the model with ``to_empty`` (uninitialized memory) and calls
the model's ``init_weights``, which knows nothing of them, so the converter makes the
model's ``init_weights`` zero every counter after it runs.

Parallelism: FSDP2 gathers whole weights.  Tensor parallelism runs torchtitan's Llama 3
plan on the swapped layers (a `QuantizedLinear` is an ``nn.Linear``, so the plan's
``ColwiseParallel``/``RowwiseParallel`` take it; `stochround.nn.tensor_parallel` runs it on
each rank's shard): the plan's sequence parallelism gives the blocks' linears replicated
inputs (``PrepareModuleInput`` gathers them) and their rowwise outputs are reduce-scattered
to ``Shard(1)``, placements the layer supports.  A shard its recipe's blocks do not divide
raises ValueError when the layer runs; the tensor scales come from each rank's shard, so a
recipe with tensor scales (nvfp4) does not give a one-device run's bits (the distributed
guide's decision).

Data parallelism: the swapped layers take this process's rank on torchtitan's ``loss``
mesh (data-parallel replicate and shard, and context parallel:
`stochround.integrations.torchtitan.ranks`) as their ``data_parallel_rank``, which keys
the words of x and dy, while every rank quantizes the all-gathered weight with the same
words (`stochround.nn.streams`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchtitan.protocols.model_converter import register_model_converter
from torchtitan.tools.logging import logger

from ....nn.apply import quantize_
from ....nn.linear import QuantizedLinear
from ..ranks import data_parallel_rank
from ..recipe_rules import RecipeChoice

CONVERTER_NAME = "stochround"


def parse_rules(items: list[str]) -> list[tuple[str, str]]:
    """``REGEX=RECIPE`` items as ``(regex, recipe name)`` pairs (split at the last ``=``;
    ValueError naming a malformed item)."""
    pairs = []
    for item in items:
        pattern, sep, name = item.rpartition("=")
        if not sep or not pattern or not name:
            raise ValueError(f"stochround.rules items must be REGEX=RECIPE; got {item!r}")
        pairs.append((pattern, name))
    return pairs


def switches_of_json(text: str) -> dict[str, Any]:
    """The JSON object of ``stochround.switches`` (ValueError otherwise)."""
    try:
        switches = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"stochround.switches must be a JSON object; got {text!r}") from None
    if not isinstance(switches, dict):
        raise ValueError(f"stochround.switches must be a JSON object; got {text!r}")
    return switches


class StochroundConverter:
    """torchtitan 0.2.2's ``ModelConverter`` of the stochround recipes (module docstring)."""

    def __init__(self, job_config: Any, parallel_dims: Any) -> None:
        args = getattr(job_config, "stochround", None)
        if args is None:
            raise ValueError(
                "model.converters names 'stochround' but the job config has no [stochround] "
                "section: set job.custom_config_module = "
                "'stochround.integrations.torchtitan.v0_2.job_config'"
            )
        self.choice = RecipeChoice(
            args.recipe,
            switches_of_json(args.switches),
            rules=parse_rules(list(args.rules)),
            keep=list(args.keep),
            seed=args.seed,
        )
        self.data_parallel_rank = data_parallel_rank(parallel_dims)
        logger.info(f"stochround: recipe {args.recipe} {args.switches} seed {args.seed}")

    def convert(self, model: nn.Module) -> None:
        """Swap the selected linears in place (ValueError naming a layer whose shape does
        not fit its recipe's blocks, before any is swapped)."""
        rank = self.data_parallel_rank
        quantize_(model, self.choice.recipe, rules=self.choice.pairs, data_parallel_rank=rank)
        swapped = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        init_weights = getattr(model, "init_weights", None)
        if swapped and callable(init_weights):
            # an instance attribute: this model's init_weights, whatever its class
            model.__dict__["init_weights"] = zeroing_steps(model, init_weights)
        logger.info(f"stochround: swapped {len(swapped)} Linear layers for QuantizedLinear")

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]) -> None:
        """Nothing to do after an optimizer step."""


def zeroing_steps(model: nn.Module, init_weights: Callable[..., Any]) -> Callable[..., Any]:
    """``init_weights`` followed by zeroing the step counter of each `QuantizedLinear` of
    ``model`` (materialized by ``to_empty``: uninitialized)."""

    @functools.wraps(init_weights)
    def init(*args: Any, **kwargs: Any) -> Any:
        result = init_weights(*args, **kwargs)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, QuantizedLinear):
                    module.step.zero_()
        return result

    return init


def converted_paths(model: nn.Module) -> dict[str, str]:
    """``{path: recipe name}`` of the `QuantizedLinear` layers of a model."""
    return {
        path: module.recipe.name
        for path, module in model.named_modules()
        if isinstance(module, QuantizedLinear)
    }


register_model_converter(StochroundConverter, CONVERTER_NAME)  # type: ignore[arg-type]

__all__ = [
    "CONVERTER_NAME",
    "StochroundConverter",
    "converted_paths",
    "parse_rules",
    "switches_of_json",
    "zeroing_steps",
]
