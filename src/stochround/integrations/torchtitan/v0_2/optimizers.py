"""The SR optimizers in torchtitan 0.2.2: ``optimizer.name`` of the job config.

torchtitan 0.2.2's ``build_optimizers`` knows ``Adam`` and ``AdamW`` (torch's); the
stochround train spec builds with `build_sr_optimizers`, which also knows `SR_OPTIMIZERS`
(`stochround.integrations.torchtitan.sr_optimizers`): one optimizer per model part in
torchtitan's ``OptimizersContainer`` (so its checkpointing and LR schedulers work), with
the job config's ``lr``, ``beta1``/``beta2``, ``eps`` and ``weight_decay`` where the
optimizer takes them, and ``seed`` (the ``[optimizer]`` field that
`stochround.integrations.torchtitan.v0_2.job_config` adds: the run's seed), states in bf16.
Under pipeline parallelism each part's optimizer numbers its parameters as the whole
model's does (`stochround.integrations.torchtitan.stages`), so the stages draw the one-part
run's words.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from torch.optim import Optimizer
from torchtitan.components.optimizer import OptimizersContainer, build_optimizers

from ..sr_optimizers import OPTIMIZERS, SR_OPTIMIZERS, sr_factory
from ..stages import number_pipeline_parts


def sr_keywords(name: str, optimizer_config: Any) -> dict[str, Any]:
    """The job config's hyperparameters that SR optimizer ``name`` takes, and its seed
    (None, the optimizers' default, where the section has no ``seed``: a job config
    without stochround's custom config module)."""
    offered = {
        "lr": optimizer_config.lr,
        "betas": (optimizer_config.beta1, optimizer_config.beta2),
        "eps": optimizer_config.eps,
        "weight_decay": optimizer_config.weight_decay,
        "seed": getattr(optimizer_config, "seed", None),
    }
    accepted = inspect.signature(SR_OPTIMIZERS[name]).parameters
    return {key: value for key, value in offered.items() if key in accepted}


def build_sr_optimizers(
    model_parts: list[nn.Module],
    optimizer_config: Any,
    parallel_dims: Any,
    ft_manager: Any = None,
) -> OptimizersContainer:
    """torchtitan's ``build_optimizers`` for its own names; for `SR_OPTIMIZERS`, an
    ``OptimizersContainer`` of the SR optimizer (ValueError for optimizers in the backward
    or torchft, which these do not support, and for an unknown name)."""
    name = optimizer_config.name
    if name not in SR_OPTIMIZERS:
        if name not in OPTIMIZERS and name != "Adam":
            raise ValueError(
                f"optimizer.name must be one of Adam, {', '.join(OPTIMIZERS)}; got {name!r}"
            )
        return build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
    if optimizer_config.early_step_in_backward or (ft_manager and ft_manager.enabled):
        raise ValueError(
            f"optimizer.name={name!r} runs as a plain optimizer: set "
            "optimizer.early_step_in_backward=false and disable torchft"
        )
    factory = sr_factory(SR_OPTIMIZERS[name])

    def build(params: list[nn.Parameter], **kwargs: Any) -> Optimizer:
        # the keywords ride in the group, where sr_factory reads them
        return factory([{"params": params, **kwargs}])

    container = OptimizersContainer(model_parts, build, sr_keywords(name, optimizer_config))  # type: ignore[arg-type]
    number_pipeline_parts(model_parts, container.optimizers, [(r".*", name)])
    return container


__all__ = ["build_sr_optimizers", "sr_keywords"]
