"""The SR optimizers by the names torchtitan's optimizer configs use (both torchtitan APIs).

``SRAdamW``, ``SRAdam``, ``SRSGD`` and ``SRLion`` are `stochround.optim`'s AdamW, Adam, SGD
and Lion, their states in bf16 unless ``state_dtype`` says otherwise.  torchtitan adds its
``implementation`` (``fused`` / ``foreach``) to the optimizer's keywords; `sr_factory`
leaves it out, the SR optimizers' implementation being their ``backend`` (``"auto"``: the
fused Triton kernel on CUDA, the PyTorch path elsewhere, bit-identical).

The seed.  A stochround config (`titan_config`, both APIs) gives the SR optimizer the run's
seed, the one its recipes and torchtitan's ``debug.seed`` take, so that two runs of a
config draw the same optimizer words whatever torch's generator did before the optimizer
was built (without a seed it takes one from that generator's state:
`stochround.optim.streams.generator_seed`), and another seed other words.  The layers and
the optimizer given one seed draw no common word: each consumer mixes the seed into a key
of its own stream domain (`stochround.random.stream_key`: ``seed ^ domain *
0x9E3779B97F4A7C15``, the recipes' domain and the optimizers' distinct), so one seed gives
two keys, and a key names a stream whatever the offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

from ...optim import SGD, Adam, AdamW, Lion
from ...optim.checks import IMPLEMENTATION_KEYS  # keys that pick a torch implementation

SR_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "SRAdamW": AdamW,
    "SRAdam": Adam,
    "SRSGD": SGD,
    "SRLion": Lion,
}
# the names a stochround torchtitan config offers: torch's AdamW, and the SR optimizers
OPTIMIZERS: tuple[str, ...] = ("AdamW", *SR_OPTIMIZERS)
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


def check_optimizer(name: str) -> str:
    """``name`` if it is one of `OPTIMIZERS`, else ValueError naming them."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    return name


__all__ = ["DTYPES", "OPTIMIZERS", "SR_OPTIMIZERS", "check_optimizer", "sr_factory"]
