"""The rows of a stochround torchtitan run: one JSON line per step in ``rows.jsonl``.

``{"step", "loss", "tps", "recipe", "optimizer", "flavor", "device", "world_size"}``,
``tps`` being tokens per second per device.  `RowsLogger` takes the place of torchtitan's
metric logger in its trainer (both APIs name the metrics ``loss_metrics/global_avg_loss``
and ``throughput(tps)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


__all__ = ["RowsLogger"]
