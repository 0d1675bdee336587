"""The SR optimizers as torchtitan optimizers: names a trainer's optimizer config selects.

torchtitan (0.3.0) builds its optimizers in ``OptimizersContainer``: each
``ParamGroupConfig(pattern, optimizer_name, optimizer_kwargs)`` gives the parameters whose
names match ``pattern`` to the optimizer its container resolves ``optimizer_name`` to.
`SROptimizersContainer` resolves, besides torchtitan's own names, ``SRAdamW``, ``SRAdam``,
``SRSGD`` and ``SRLion`` (`stochround.optim`'s AdamW, Adam, SGD and Lion, states in bf16
unless ``state_dtype`` says otherwise); `sr_optimizer` writes the config of one catch-all
group, as torchtitan's ``default_adamw`` does.

torchtitan adds its ``implementation`` (``fused`` / ``foreach``) to every group; the
container leaves it out of the SR groups, whose implementation is their ``backend``
(``"auto"``: the fused Triton kernel on CUDA, the PyTorch path elsewhere, bit-identical).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

from ...optim import SGD, Adam, AdamW, Lion
from ...optim.checks import IMPLEMENTATION_KEYS  # keys that pick a torch implementation

SR_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "SRAdamW": AdamW,
    "SRAdam": Adam,
    "SRSGD": SGD,
    "SRLion": Lion,
}
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def sr_factory(cls: type[Optimizer]) -> Callable[..., Optimizer]:
    """``cls`` as a torchtitan optimizer factory: the groups without torchtitan's
    implementation keys, ``state_dtype`` read from its name ("bfloat16", the default, or
    "float16"; None: the parameter's dtype) so that a config stays JSON-able."""

    def build(param_groups: list[dict[str, Any]], **kwargs: Any) -> Optimizer:
        groups = []
        for group in param_groups:
            group = {k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS}
            dtype = group.pop("state_dtype", "bfloat16")
            if dtype is not None:
                if dtype not in DTYPES:
                    raise ValueError(
                        f"state_dtype must be one of {', '.join(DTYPES)} or None; got {dtype!r}"
                    )
                group["state_dtype"] = DTYPES[dtype]
            groups.append(group)
        return cls(groups, **kwargs)

    return build


class SROptimizersContainer(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` that also builds `SR_OPTIMIZERS` by name."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

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
