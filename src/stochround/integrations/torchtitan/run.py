"""Train a `titan_config`: torchtitan's trainer on CUDA, the same parts in a loop on the CPU.

On CUDA, `run` builds torchtitan's ``Trainer`` from the config and trains (one process,
or one per GPU under ``torchrun``: FSDP2 over ``data_parallel_shard_degree``, -1 taking
every rank).  torchtitan's trainer does not run on the CPU (it takes CUDA when no other
accelerator is found, and FlexAttention has no CPU backward), so on the CPU `run` trains
the same model config — with `DenseMaskAttention` — by the same optimizer, LR schedule,
data and gradient clipping in a plain loop, in float32.

Both write one JSON row per step to ``rows.jsonl`` in the dump folder (rank 0):
``{"step", "loss", "tps", "recipe", "optimizer", "flavor", "device", "world_size"}``,
``tps`` being tokens per second per device.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torchtitan.trainer import Trainer

from .attention import dense_attention
from .data import ByteTokenizer

TRAINING_DEVICES: tuple[str, ...] = ("cpu", "cuda")


class RowsLogger:
    """torchtitan's metric logger interface writing `run`'s rows (and passing every
    metric on to the logger it replaces)."""

    def __init__(self, path: Path, fields: dict[str, Any], inner: Any = None) -> None:
        self.path = path
        self.fields = fields
        self.inner = inner
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.inner is not None:
            self.inner.log(metrics, step)
        if "loss_metrics/global_avg_loss" in metrics:
            self.write(step, metrics["loss_metrics/global_avg_loss"], metrics["throughput(tps)"])

    def write(self, step: int, loss: float, tps: float) -> None:
        row = {"step": step, "loss": float(loss), "tps": float(tps), **self.fields}
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def free_port() -> int:
    """A TCP port free on this machine now (for a one-process group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def run_training(config: Trainer.Config, device: str, fields: dict[str, Any]) -> Path:
    """Train ``config`` on ``device`` (one of `TRAINING_DEVICES`); returns the rows file."""
    if device not in TRAINING_DEVICES:
        raise ValueError(f"device must be one of {', '.join(TRAINING_DEVICES)}; got {device!r}")
    rows = Path(config.dump_folder) / "rows.jsonl"
    if device == "cpu":
        cpu_train(config, RowsLogger(rows, {**fields, "device": "cpu", "world_size": 1}))
        return rows
    if not torch.cuda.is_available():
        raise ValueError("device='cuda' needs a CUDA device; use device='cpu'")
    # one process without torchrun: a group of one
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    world = int(os.environ["WORLD_SIZE"])
    trainer = config.build()
    try:
        if int(os.environ["RANK"]) == 0:
            processor = trainer.metrics_processor
            processor.logger = RowsLogger(  # type: ignore[assignment]
                rows, {**fields, "device": "cuda", "world_size": world}, processor.logger
            )
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
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
    batches = iter(loader)
    for step in range(1, training.steps + 1):
        start = time.perf_counter()
        inputs, labels = next(batches)
        positions = inputs["positions"]
        logits = model(
            inputs["input"],
            attention_masks=model.get_attention_masks(positions),
            positions=positions,
        )
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_norm)
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        seconds = time.perf_counter() - start
        rows.write(step, loss.item(), labels.numel() / seconds)


__all__ = ["TRAINING_DEVICES", "RowsLogger", "cpu_train", "free_port", "run_training"]
