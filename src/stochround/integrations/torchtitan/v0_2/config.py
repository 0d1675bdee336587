"""The torchtitan 0.2.2 job config of a stochround run.

`TOML` (``stochround_debugmodel.toml`` beside this module) is the run torchtitan's own
command line trains (``python -m torchtitan.train --job.config_file TOML``); `titan_config`
reads it through torchtitan's ``ConfigManager`` with command-line overrides, so the two
agree: a model size (`FLAVORS`), a recipe with its switches, rules, keep and seed, an
optimizer (`OPTIMIZERS`), steps, sequence length, batch, learning rate, torchtitan's
profiler over the last steps (`stochround.integrations.torchtitan.profiling`), data
parallelism by FSDP2's sharding or by replicas (DDP), FSDP2's reshard-after-forward policy
(`stochround.integrations.torchtitan.fsdp`), the steps between two logged rows
(`stochround.integrations.torchtitan.rows`; the TOML logs every step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchtitan.config import ConfigManager, JobConfig

from ..checkpointing import check_activation_checkpoint
from ..flavors import check_flavor
from ..fsdp import check_reshard_after_forward
from ..launch import DETERMINISTIC_WARN_ONLY
from ..profiling import TRACES_FOLDER, profile_schedule
from ..ranks import check_tensor_parallel_degree
from ..recipe_rules import make_recipe
from ..rows import check_log_every
from ..sr_optimizers import check_optimizer

TOML = Path(__file__).with_name("stochround_debugmodel.toml")
# the output head's path in torchtitan 0.2.2's Llama 3 (0.3.0 calls it lm_head)
HEAD = "^output$"


def titan_config(
    recipe: str = "bf16",
    *,
    flavor: str = "debugmodel",
    optimizer: str = "AdamW",
    switches: dict[str, Any] | None = None,
    rules: list[tuple[str, str | None]] | None = None,
    keep: tuple[str, ...] = (HEAD,),
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
) -> JobConfig:
    """`TOML` with these settings: ``recipe`` a name of `stochround.nn.RECIPES` ("bf16":
    the converter is off), ``rules`` ``(regex, recipe name or None)`` pairs (None: bf16),
    the seed also torchtitan's (``debug.seed``) and the SR optimizers' (``optimizer.seed``:
    `stochround.integrations.torchtitan.sr_optimizers` says why the layers' seed is safe
    there), ``activation_checkpoint`` one of
    `ACTIVATION_CHECKPOINTS` (torchtitan's ``activation_checkpoint.mode``),
    ``profile_steps`` the last steps torchtitan's profiler records (0: off;
    `profiling_args`), ``data_parallel_replicate_degree`` torchtitan's (1: FSDP2 shards
    over every rank; the world size: DDP, each rank holding the whole model),
    ``deterministic`` torch's deterministic algorithms (``debug.deterministic``, warning
    only where an op has none: `DETERMINISTIC_WARN_ONLY`), ``reshard_after_forward`` one of
    `RESHARD_AFTER_FORWARD` (``parallelism.fsdp_reshard_after_forward``; without effect
    where 0.2.2 applies no FSDP2: one rank, or replicas by DDP), ``log_every``
    ``metrics.log_freq`` (a row every that many steps and at step 1: `check_log_every`),
    ``tensor_parallel_degree`` ``parallelism.tensor_parallel_degree``
    (`check_tensor_parallel_degree`); ValueError naming a bad flavour, optimizer,
    checkpointing, reshard policy, logging interval, tensor-parallel degree, profiling or
    recipe."""
    check_flavor(flavor)
    check_activation_checkpoint(activation_checkpoint)
    check_reshard_after_forward(reshard_after_forward)
    check_log_every(log_every)
    check_tensor_parallel_degree(tensor_parallel_degree)
    check_optimizer(optimizer)
    make_recipe(recipe, switches, seed=seed, keep=keep)  # its errors, before torchtitan's
    args = ["--job.config_file", str(TOML), "--job.dump_folder", dump_folder]
    args += ["--model.flavor", flavor, "--optimizer.name", optimizer, "--optimizer.lr", str(lr)]
    args += ["--training.steps", str(steps), "--training.seq_len", str(seq_len)]
    args += ["--training.local_batch_size", str(local_batch_size)]
    args += ["--lr_scheduler.warmup_steps", str(max(1, steps // 20))]
    args += ["--debug.seed", str(seed), "--stochround.seed", str(seed)]
    args += ["--optimizer.seed", str(seed)]  # the SR optimizers' (job_config.Optimizer)
    args += ["--stochround.recipe", recipe, "--stochround.switches", json.dumps(switches or {})]
    args += ["--compile.enable" if compile_model else "--compile.no-enable"]
    args += ["--activation_checkpoint.mode", activation_checkpoint]
    args += profiling_args(steps, profile_steps)
    args += ["--parallelism.data_parallel_replicate_degree", str(data_parallel_replicate_degree)]
    args += ["--parallelism.fsdp_reshard_after_forward", reshard_after_forward]
    args += ["--metrics.log_freq", str(log_every)]
    args += ["--parallelism.tensor_parallel_degree", str(tensor_parallel_degree)]
    config = ConfigManager().parse_args(args)
    # lists set here: torchtitan's command line splits a list at commas, which regexes hold
    config.stochround.keep = list(keep)
    config.stochround.rules = [f"{pattern}={name or 'bf16'}" for pattern, name in rules or []]
    config.model.converters = ["stochround"] if recipe != "bf16" else []
    config.debug.deterministic = deterministic
    config.debug.deterministic_warn_only = DETERMINISTIC_WARN_ONLY
    return config


def profiling_args(steps: int, profile_steps: int) -> list[str]:
    """torchtitan's ``[profiling]`` options recording the last ``profile_steps`` of
    ``steps`` (`profile_schedule`; none for 0: its default, off), the traces in
    `TRACES_FOLDER`."""
    schedule = profile_schedule(steps, profile_steps)
    if schedule is None:
        return []
    return [
        "--profiling.enable_profiling",
        "--profiling.save_traces_folder",
        TRACES_FOLDER,
        "--profiling.profile_freq",
        str(schedule.freq),
        "--profiling.profiler_warmup",
        str(schedule.warmup),
        "--profiling.profiler_active",
        str(schedule.active),
    ]


__all__ = ["HEAD", "TOML", "profiling_args", "titan_config"]
