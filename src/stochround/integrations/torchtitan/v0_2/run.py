"""Train a torchtitan 0.2.2 job config (`titan_config`) with torchtitan's trainer.

One process (a group of one), or one per device under ``torchrun`` (FSDP2 over
``data_parallel_shard_degree``, -1 taking every rank).  On the CPU the trainer runs under
`cpu_trainer` (gloo, parameters in float32: ``training.mixed_precision_param``); on CUDA as
torchtitan runs it.  Rank 0 writes one row per step to ``rows.jsonl`` in the dump folder
(`stochround.integrations.torchtitan.rows`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from torchtitan.config import JobConfig
from torchtitan.train import Trainer

from ..launch import TRAINING_DEVICES, check_training_device, single_process_env, train_with_rows
from .cpu_device import cpu_trainer


def run_training(config: JobConfig, device: str, fields: dict[str, Any]) -> Path:
    """Train ``config`` on ``device`` (one of `TRAINING_DEVICES`); returns the rows file."""
    check_training_device(device)
    rows = Path(config.job.dump_folder) / "rows.jsonl"
    on_cpu = device == "cpu"
    if on_cpu:
        config.training.mixed_precision_param = "float32"
    with single_process_env() as world, cpu_trainer() if on_cpu else contextlib.nullcontext():
        trainer = Trainer(config)
        train_with_rows(trainer, rows, {**fields, "device": device, "world_size": world})
    return rows


__all__ = ["TRAINING_DEVICES", "run_training"]
