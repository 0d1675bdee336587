"""Train a torchtitan 0.2.2 job config (`titan_config`) with torchtitan's trainer.

One process (a group of one), or one per device under ``torchrun`` (FSDP2 over
``data_parallel_shard_degree``, -1 taking every rank).  On the CPU the trainer runs under
`cpu_trainer` (gloo, parameters in float32: ``training.mixed_precision_param``); on CUDA as
torchtitan runs it.  Rank 0 writes one row per step to ``rows.jsonl`` in the dump folder
(`stochround.integrations.torchtitan.rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchtitan.config import JobConfig
from torchtitan.train import Trainer

from ..launch import TRAINING_DEVICES, check_training_device, train_on


def run_training(config: JobConfig, device: str, fields: dict[str, Any]) -> Path:
    """Train ``config`` on ``device`` (one of `TRAINING_DEVICES`); returns the rows file."""
    check_training_device(device)
    if device == "cpu":
        config.training.mixed_precision_param = "float32"
    rows = Path(config.job.dump_folder) / "rows.jsonl"
    return train_on(device, lambda: Trainer(config), rows, fields)


__all__ = ["TRAINING_DEVICES", "run_training"]
