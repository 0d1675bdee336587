"""torchtitan configs training Llama 3 on the Python standard library with stochround.

torchtitan's trainer finds these by module:
``torchtitan train --module stochround.integrations.torchtitan --config
stochround_debugmodel_nvfp4`` (or ``python -m torchtitan.train ...``; any field can be
overridden on its command line, e.g. ``--training.steps 200``).  Each function is
torchtitan's ``llama3_debugmodel`` config with the data made offline (`StdlibDataLoader`,
`ByteTokenizer`), validation off, activation checkpointing off by default, and the model
converted by `StochroundConverter`.  `titan_config` builds any combination: a model size
(`FLAVORS`), a recipe with its switches, rules and seed, an optimizer, and torchtitan's
full or selective activation checkpointing (`ACTIVATION_CHECKPOINTS`): a checkpointed
block's recomputation reads the step its forward read, eager or compiled, so the run is
the un-checkpointed one bit for bit (`stochround.nn.recompute`, docs/guide/recipes.md);
torchtitan's profiler over the run's last steps (`stochround.integrations.torchtitan.profiling`);
data parallelism by FSDP2's sharding over every rank (torchtitan's default) or by replicas,
FSDP2's reshard-after-forward policy (`stochround.integrations.torchtitan.fsdp`), the
steps between two logged rows (`stochround.integrations.torchtitan.rows`), and tensor
parallelism (`TENSOR_PARALLEL_SPMD_BACKEND`).
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.components.validate import Validator
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import (
    ActivationCheckpointingConfig,
    FullAC,
    SelectiveAC,
)
from torchtitan.models.common import (
    ComplexRoPE,
    Embedding,
    Linear,
    RMSNorm,
    compute_ffn_hidden_dim,
)
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import llama3_configs, model_registry
from torchtitan.models.llama3.model import Llama3Model
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.tools.profiler import Profiler
from torchtitan.trainer import Trainer

from .checkpointing import check_activation_checkpoint
from .converter import StochroundConverter
from .data import ByteTokenizer, StdlibDataLoader
from .flavors import FLAVORS, SIZES, check_flavor
from .fsdp import check_reshard_after_forward
from .launch import DETERMINISTIC_WARN_ONLY
from .optimizers import SROptimizersContainer, sr_optimizer
from .profiling import TRACES_FOLDER, profile_schedule
from .ranks import check_tensor_parallel_degree
from .rows import check_log_every
from .sr_optimizers import OPTIMIZERS, check_optimizer
from .stages import recording_pipeline

# The SPMD backend of a config with tensor parallelism: torchtitan 0.3.0's default,
# "spmd_types", stops its trainer in FSDP2's wrapping under tensor parallelism (the
# parameters FSDP2 finds are not DTensors on the full mesh), a bf16 model too; with
# "partial_dtensor" (DTensor on the model-parallel axes only) it trains, each rank's
# `QuantizedLinear` on its own DTensor path.
TENSOR_PARALLEL_SPMD_BACKEND = "partial_dtensor"


def activation_checkpoint_config(mode: str) -> ActivationCheckpointingConfig | None:
    """torchtitan's activation checkpointing config of ``mode`` (one of
    `ACTIVATION_CHECKPOINTS`; None for "none", which the trainer reads as off)."""
    check_activation_checkpoint(mode)
    if mode == "full":
        return FullAC.Config()
    if mode == "selective":
        return SelectiveAC.Config()
    return None


def llama3_model(dim: int, n_layers: int, n_heads: int) -> Llama3Model.Config:
    """Llama 3 as torchtitan's debug model (its vocabulary of 2048, room for the byte
    tokenizer's 258; its inits), at another width and depth."""
    debug = llama3_configs["debugmodel"](attn_backend="flex")
    # torchtitan's own layer builder (0.3.0, pinned): depth-scaled inits, fused QKV
    from torchtitan.models.llama3 import _build_llama3_layers

    vocab = debug.vocab_size
    scale = dim**-0.5
    output_init = dict(debug.lm_head.param_init or {})
    output_init["weight"] = functools.partial(
        nn.init.trunc_normal_, std=scale, a=-3 * scale, b=3 * scale
    )
    return Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=debug.tok_embeddings.param_init
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=debug.norm.param_init),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=output_init),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=n_layers,
            dim=dim,
            n_heads=n_heads,
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=256),
            rope=ComplexRoPE.Config(
                dim=dim // n_heads, max_seq_len=131072, theta=500000, scaling="llama"
            ),
            attn_backend="flex",
        ),
    )


def spmd_backend(tensor_parallel_degree: int) -> dict[str, str]:
    """The config's SPMD backend setting: `TENSOR_PARALLEL_SPMD_BACKEND` under tensor
    parallelism, torchtitan's default (nothing set) without it."""
    return {"spmd_backend": TENSOR_PARALLEL_SPMD_BACKEND} if tensor_parallel_degree > 1 else {}


def model_spec(flavor: str, converter: StochroundConverter.Config | None) -> ModelSpec:
    """torchtitan's Llama 3 model spec of ``flavor`` (one of `FLAVORS`), converted; its
    pipelining marks the whole model for the SR optimizers' numbering
    (`stochround.integrations.torchtitan.stages.recording_pipeline`)."""
    check_flavor(flavor)
    converters = None if converter is None else [converter]
    spec = model_registry("debugmodel", converters=converters)
    if spec.pipelining_fn is not None:  # the SR optimizers' numbering of its stages
        spec.pipelining_fn = recording_pipeline(spec.pipelining_fn)
    if flavor in SIZES:
        model = llama3_model(*SIZES[flavor])
        if converter is not None:
            model = converter.build().convert(model)
        spec.model = model
        spec.flavor = flavor
    return spec


def titan_config(
    recipe: str = "bf16",
    *,
    flavor: str = "debugmodel",
    optimizer: str = "AdamW",
    switches: dict[str, Any] | None = None,
    rules: list[tuple[str, str | None]] | None = None,
    keep: tuple[str, ...] = ("lm_head",),
    seed: int = 0,
    steps: int = 200,
    seq_len: int = 2048,
    local_batch_size: int = 8,
    lr: float = 8e-4,
    compile_model: bool = False,
    activation_checkpoint: str = "none",
    profile_steps: int = 0,
    data_parallel_replicate_degree: int = 1,
    deterministic: bool = False,
    reshard_after_forward: str = "default",
    log_every: int = 1,
    tensor_parallel_degree: int = 1,
    dump_folder: str = "titan-run",
) -> Trainer.Config:
    """The trainer config (module docstring): ``recipe`` a name of
    `stochround.nn.RECIPES` ("bf16": no layer converted), with ``switches``, ``rules``,
    ``keep`` and ``seed`` as `StochroundConverter` takes them; ``optimizer`` torchtitan's
    "AdamW" or one of `SR_OPTIMIZERS` (states in bf16); the seed also seeds torchtitan
    (``debug.seed``), so two runs of a config give the same model and data, and the SR
    optimizer (its groups' ``seed``: `stochround.integrations.torchtitan.sr_optimizers`
    says why the layers' seed is safe there), so they draw the same optimizer words;
    ``activation_checkpoint`` one of `ACTIVATION_CHECKPOINTS`; ``profile_steps`` the last
    steps torchtitan's profiler records (0: off; `profiler_config`);
    ``data_parallel_replicate_degree`` torchtitan's (1: FSDP2 shards over every rank; the
    world size: each rank holds the whole model, HSDP with one shard); ``deterministic``
    torch's deterministic algorithms (torchtitan's ``debug.deterministic``, warning only
    where an op has none: `DETERMINISTIC_WARN_ONLY`); ``reshard_after_forward`` one of
    `RESHARD_AFTER_FORWARD`, torchtitan's ``parallelism.fsdp_reshard_after_forward`` (FSDP2
    applies it to every group, on one rank too: `stochround.integrations.torchtitan.fsdp`);
    ``log_every`` torchtitan's ``metrics.log_freq``, a row every that many steps and at step
    1 (each logged step syncs the host with the device: `check_log_every`);
    ``tensor_parallel_degree`` torchtitan's (`check_tensor_parallel_degree`: each layer's
    weight sharded over that many ranks, the rest data parallel; above 1 with
    `TENSOR_PARALLEL_SPMD_BACKEND`); the rows, checkpoints and traces go to
    ``dump_folder``."""
    check_optimizer(optimizer)
    check_tensor_parallel_degree(tensor_parallel_degree)
    check_reshard_after_forward(reshard_after_forward)
    check_log_every(log_every)
    checkpointing = activation_checkpoint_config(activation_checkpoint)
    profiler = profiler_config(steps, profile_steps)
    converter = None
    if recipe != "bf16":
        converter = StochroundConverter.Config(
            recipe=recipe,
            switches=dict(switches or {}),
            rules=list(rules or []),
            keep=list(keep),
            seed=seed,
            model_compile_enabled=compile_model,
        )
    spec = model_spec(flavor, converter)
    config = Trainer.Config(
        model_spec=spec,
        hf_assets_path="",
        tokenizer=ByteTokenizer.Config(),
        dataloader=StdlibDataLoader.Config(),
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec)),
        ),
        optimizer=sr_optimizer(optimizer, lr=lr, seed=seed) if optimizer != "AdamW" else adamw(lr),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=max(1, steps // 20), decay_ratio=0.8, decay_type="linear"
        ),
        training=TrainingConfig(local_batch_size=local_batch_size, seq_len=seq_len, steps=steps),
        metrics=MetricsProcessor.Config(log_freq=log_every),
        parallelism=ParallelismConfig(
            data_parallel_replicate_degree=data_parallel_replicate_degree,
            fsdp_reshard_after_forward=reshard_after_forward,
            tensor_parallel_degree=tensor_parallel_degree,
            **(
                {"spmd_backend": TENSOR_PARALLEL_SPMD_BACKEND} if tensor_parallel_degree > 1 else {}
            ),
        ),
        profiler=profiler,
        activation_checkpoint=checkpointing,  # type: ignore[arg-type]
        validator=Validator.Config(enable=False),
    )
    config.dump_folder = dump_folder
    config.debug.seed = seed
    config.debug.deterministic = deterministic
    config.debug.deterministic_warn_only = DETERMINISTIC_WARN_ONLY
    config.compile.enable = compile_model
    # every case alike: torchtitan's CUDA-graph capture of the step is off
    config.training.disable_cuda_graphs = True
    return config


def profiler_config(steps: int, profile_steps: int) -> Profiler.Config:
    """torchtitan's profiler recording the last ``profile_steps`` of ``steps``
    (`profile_schedule`; 0: its default, off), its traces in `TRACES_FOLDER`."""
    schedule = profile_schedule(steps, profile_steps)
    if schedule is None:
        return Profiler.Config()
    return Profiler.Config(
        enable_profiling=True,
        save_traces_folder=TRACES_FOLDER,
        profile_freq=schedule.freq,
        profiler_warmup=schedule.warmup,
        profiler_active=schedule.active,
    )


def adamw(lr: float) -> SROptimizersContainer.Config:
    """torchtitan's ``default_adamw`` (torch.optim.AdamW), in the container that also
    knows the SR optimizers."""
    config = sr_optimizer("SRAdamW", lr=lr)
    config.param_groups[0].optimizer_name = "AdamW"
    return config


# the configs torchtitan's --config names (one per recipe of the GPU comparison)
def stochround_debugmodel() -> Trainer.Config:
    """The debug model in bf16 (torchtitan's AdamW): the baseline."""
    return titan_config("bf16")


def stochround_debugmodel_nvfp4() -> Trainer.Config:
    """The debug model under `stochround.nn.nvfp4` (SR gradients), head in bf16."""
    return titan_config("nvfp4")


def stochround_debugmodel_mxfp8() -> Trainer.Config:
    return titan_config("mxfp8")


def stochround_debugmodel_fp8() -> Trainer.Config:
    return titan_config("fp8")


def stochround_debugmodel_int8() -> Trainer.Config:
    return titan_config("int8")


def stochround_debugmodel_mxfp4_tseng() -> Trainer.Config:
    return titan_config("mxfp4_tseng")


def stochround_debugmodel_nvfp4_sr_adamw() -> Trainer.Config:
    """`nvfp4` with the SR AdamW (bf16 states)."""
    return titan_config("nvfp4", optimizer="SRAdamW")


def stochround_100m_nvfp4() -> Trainer.Config:
    """The ~100M model under `nvfp4`."""
    return titan_config("nvfp4", flavor="100M")


__all__ = [
    "FLAVORS",
    "OPTIMIZERS",
    "SIZES",
    "TENSOR_PARALLEL_SPMD_BACKEND",
    "adamw",
    "llama3_model",
    "model_spec",
    "profiler_config",
    "spmd_backend",
    "stochround_100m_nvfp4",
    "stochround_debugmodel",
    "stochround_debugmodel_fp8",
    "stochround_debugmodel_int8",
    "stochround_debugmodel_mxfp4_tseng",
    "stochround_debugmodel_mxfp8",
    "stochround_debugmodel_nvfp4",
    "stochround_debugmodel_nvfp4_sr_adamw",
    "titan_config",
]
