"""The SR optimizers as torchtitan optimizers: names a trainer's optimizer config selects.

torchtitan (0.3.0) builds its optimizers in ``OptimizersContainer``: each
``ParamGroupConfig(pattern, optimizer_name, optimizer_kwargs)`` gives the parameters whose
names match ``pattern`` to the optimizer its container resolves ``optimizer_name`` to.
`SROptimizersContainer` resolves, besides torchtitan's own names, ``SRAdamW``, ``SRAdam``,
``SRSGD`` and ``SRLion`` (`stochround.optim`'s AdamW, Adam, SGD and Lion, states in bf16
unless ``state_dtype`` says otherwise); `sr_optimizer` writes the config of one catch-all
group, as torchtitan's ``default_adamw`` does.

torchtitan adds its ``implementation`` (``fused`` / ``foreach``) to every group; the
container leaves it out of the SR groups (`stochround.integrations.torchtitan.sr_optimizers`).
Under pipeline parallelism each part's SR optimizer draws the words the whole model's
optimizer draws for the same parameters (`stochround.integrations.torchtitan.stages`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

from .sr_optimizers import DTYPES, SR_OPTIMIZERS, sr_factory
from .stages import number_pipeline_parts


class SROptimizersContainer(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` that also builds `SR_OPTIMIZERS` by name; the
    SR optimizers of pipeline stages number their parameters as the whole model's
    optimizer does (`stochround.integrations.torchtitan.stages`)."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

    def __init__(self, config: Config, *, model_parts: list[nn.Module]) -> None:
        super().__init__(config, model_parts=model_parts)
        rules = [(group.pattern, group.optimizer_name) for group in config.param_groups]
        number_pipeline_parts(model_parts, self.optimizers, rules)

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> Callable[..., Optimizer]:
        if name in SR_OPTIMIZERS:
            return sr_factory(SR_OPTIMIZERS[name])
        return OptimizersContainer._resolve_optimizer_factory(name)


def sr_optimizer(
    name: str = "SRAdamW", lr: float = 8e-4, **kwargs: Any
) -> SROptimizersContainer.Config:
    """The optimizer config of one catch-all group under ``name`` (one of `SR_OPTIMIZERS`);
    ``SRAdamW`` takes torchtitan's ``default_adamw`` hyperparameters (betas (0.9, 0.95),
    eps 1e-8, weight decay 0.1) unless ``kwargs`` says otherwise."""
    if name not in SR_OPTIMIZERS:
        raise ValueError(f"name must be one of {', '.join(SR_OPTIMIZERS)}; got {name!r}")
    defaults: dict[str, Any] = {}
    if name in ("SRAdamW", "SRAdam"):
        defaults = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    return SROptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(
                pattern=r".*",
                optimizer_name=name,
                optimizer_kwargs={"lr": lr, **defaults, **kwargs},
            )
        ]
    )


__all__ = [
    "DTYPES",
    "SR_OPTIMIZERS",
    "SROptimizersContainer",
    "sr_factory",
    "sr_optimizer",
]
