"""Train a `titan_config`: torchtitan's trainer on CUDA, the same parts in a loop on the CPU.

On CUDA, `run` builds torchtitan's ``Trainer`` from the config and trains (one process,
or one per GPU under ``torchrun``: FSDP2 over ``data_parallel_shard_degree``, -1 taking
every rank).  torchtitan's trainer does not run on the CPU (it takes CUDA when no other
accelerator is found, and FlexAttention has no CPU backward), so on the CPU `run` trains
the same model config — with `DenseMaskAttention` — by the same optimizer, LR schedule,
data and gradient clipping in a plain loop, in float32.

Both write one JSON row per step to ``rows.jsonl`` in the dump folder (rank 0;
`stochround.integrations.torchtitan.rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchtitan.trainer import Trainer

from .attention import dense_attention
from .data import ByteTokenizer
from .launch import (
    TRAINING_DEVICES,
    check_training_device,
    free_port,
    single_process_env,
    train_with_rows,
)
from .rows import RowsLogger, train_steps


def run_training(config: Trainer.Config, device: str, fields: dict[str, Any]) -> Path:
    """Train ``config`` on ``device`` (one of `TRAINING_DEVICES`); returns the rows file."""
    check_training_device(device)
    rows = Path(config.dump_folder) / "rows.jsonl"
    if device == "cpu":
        cpu_train(config, RowsLogger(rows, {**fields, "device": "cpu", "world_size": 1}))
        return rows
    with single_process_env() as world:
        train_with_rows(config.build(), rows, {**fields, "device": "cuda", "world_size": world})
    return rows


def cpu_train(config: Trainer.Config, rows: RowsLogger) -> None:
    """The CPU loop (module docstring): ``config.training.steps`` steps."""
    assert config.model_spec is not None
    torch.manual_seed(config.debug.seed or 0)
    model_config = dense_attention(config.model_spec.model)
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    training = config.training
    optimizers = config.optimizer.build(model_parts=[model])
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=training.steps)
    loader = config.dataloader.build(
        dp_world_size=1,
        dp_rank=0,
        tokenizer=ByteTokenizer(),
        seq_len=training.seq_len,
        local_batch_size=training.local_batch_size,
    )

    def logits_of(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        positions = inputs["positions"]
        masks = model.get_attention_masks(positions)
        return model(inputs["input"], attention_masks=masks, positions=positions)

    train_steps(
        model, logits_of, optimizers, schedulers, iter(loader), training.steps,
        training.max_norm, rows,
    )  # fmt: skip


__all__ = ["TRAINING_DEVICES", "RowsLogger", "cpu_train", "free_port", "run_training"]
