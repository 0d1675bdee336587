"""Train a `titan_config` with torchtitan's trainer, on CUDA or the CPU.

`run_training` builds torchtitan's ``Trainer`` from the config and trains: one process,
or one per device under ``torchrun`` (FSDP2 over ``data_parallel_shard_degree``, -1 taking
every rank).  On the CPU the trainer runs under `cpu_trainer` (torchtitan sees the CPU,
its groups use gloo), with parameters in float32 (``training.mixed_precision_param``) and
each FlexAttention swapped for `DenseMaskAttention` (FlexAttention has no CPU backward):
the same trainer, data, optimizer, LR schedule, gradient clipping and DCP checkpoints as
on a GPU.

Rank 0 writes one JSON row per step to ``rows.jsonl`` in the dump folder
(`stochround.integrations.torchtitan.rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchtitan.trainer import Trainer

from .attention import dense_attention
from .launch import TRAINING_DEVICES, check_training_device, free_port, train_on
from .rows import RowsLogger


def run_training(config: Trainer.Config, device: str, fields: dict[str, Any]) -> Path:
    """Train ``config`` on ``device`` (one of `TRAINING_DEVICES`); returns the rows file."""
    check_training_device(device)
    if device == "cpu":
        assert config.model_spec is not None
        config.model_spec.model = dense_attention(config.model_spec.model)
        config.training.mixed_precision_param = "float32"
    return train_on(device, config.build, Path(config.dump_folder) / "rows.jsonl", fields)


__all__ = ["TRAINING_DEVICES", "RowsLogger", "free_port", "run_training"]
