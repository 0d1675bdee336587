"""The rows of a stochround torchtitan run: one JSON line per step in ``rows.jsonl``.

``{"step", "loss", "tps", "recipe", "optimizer", "flavor", "device", "world_size"}``,
``tps`` being tokens per second per device.  `RowsLogger` takes the place of torchtitan's
metric logger in its trainer (both APIs name the metrics ``loss_metrics/global_avg_loss``
and ``throughput(tps)``), and the CPU loop (`train_steps`) writes its rows directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RowsLogger:
    """torchtitan's metric logger interface writing the rows (and passing every metric on
    to the logger it replaces)."""

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


Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


def train_steps(
    model: nn.Module,
    logits_of: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    optimizers: Any,
    schedulers: Any,
    batches: Iterator[Batch],
    steps: int,
    max_norm: float,
    rows: RowsLogger,
) -> None:
    """``steps`` steps of the CPU loop: cross entropy of ``logits_of(inputs)`` against the
    labels (in float32), the gradient clipped to ``max_norm``, then torchtitan's
    optimizers and LR schedulers step; one row a step."""
    for step in range(1, steps + 1):
        start = time.perf_counter()
        inputs, labels = next(batches)
        logits = logits_of(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        seconds = time.perf_counter() - start
        rows.write(step, loss.item(), labels.numel() / seconds)


__all__ = ["Batch", "RowsLogger", "train_steps"]
