"""The train spec ``stochround_llama3`` of torchtitan 0.2.2: its Llama 3 with the
stochround flavours, the offline data and the SR optimizers.

``model.name = "stochround_llama3"`` selects it; ``model.flavor`` is one of the `FLAVORS`:
``debugmodel`` (torchtitan's: dim 256, 6 layers, 16 heads), ``100M`` and ``tiny``
(`stochround.integrations.torchtitan.flavors`), all with the debug model's vocabulary of
2048 (room for the byte tokenizer's 258), RoPE theta and SDPA causal attention.
Validation is off (no validation data).  Its ``parallelize_fn`` is torchtitan's, then, on
gloo process groups (the CPU), FSDP2's reductions are plain sums: torchtitan turns FSDP2's
gradient division off (factor 1), which FSDP2 runs as ``ReduceOp.PREMUL_SUM(1.0)``, an op
gloo lacks; a sum is the same reduction.  Its ``pipelining_fn`` is torchtitan's after
marking the whole model, so that the SR optimizers of its stages draw the one-part run's
words (`stochround.integrations.torchtitan.stages`).  Everything else is torchtitan's
Llama 3 spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torchtitan.models import llama3
from torchtitan.models.llama3 import TransformerModelArgs
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from ..flavors import SIZES
from ..stages import recording_pipeline
from .data import build_byte_tokenizer, build_stdlib_dataloader
from .optimizers import build_sr_optimizers

TRAIN_SPEC_NAME = "stochround_llama3"


def model_args() -> dict[str, TransformerModelArgs]:
    """The model arguments of each flavour (`stochround.integrations.torchtitan.flavors`)."""
    debug = llama3.llama3_args["debugmodel"]
    args = {"debugmodel": dataclasses.replace(debug)}
    for flavor, (dim, n_layers, n_heads) in SIZES.items():
        args[flavor] = dataclasses.replace(debug, dim=dim, n_layers=n_layers, n_heads=n_heads)
    return args


def parallelize(model: nn.Module, parallel_dims: Any, job_config: Any) -> nn.Module:
    """torchtitan's ``parallelize_llama``; on gloo, FSDP2 reducing by plain sums (module
    docstring)."""
    model = llama3.parallelize_llama(model, parallel_dims, job_config)
    if dist.is_initialized() and dist.get_backend() == "gloo":
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def train_spec() -> TrainSpec:
    """torchtitan's Llama 3 train spec with the pieces above."""
    spec = llama3.get_train_spec()
    return dataclasses.replace(
        spec,
        model_args=model_args(),
        pipelining_fn=recording_pipeline(spec.pipelining_fn),
        parallelize_fn=parallelize,
        build_optimizers_fn=build_sr_optimizers,
        build_dataloader_fn=build_stdlib_dataloader,
        build_tokenizer_fn=build_byte_tokenizer,
        build_validator_fn=None,
    )


register_train_spec(TRAIN_SPEC_NAME, train_spec())

__all__ = ["TRAIN_SPEC_NAME", "model_args", "parallelize", "train_spec"]
