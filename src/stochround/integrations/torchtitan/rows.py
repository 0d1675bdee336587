"""The rows of a stochround torchtitan run: one JSON line per logged step in ``rows.jsonl``.

``{"step", "loss", "tps", "graph_captures", "graph_replays", "recipe", "optimizer",
"flavor", "device", "world_size"}``, ``tps`` being tokens per second per device and the
graph counts the process's layers' CUDA step graphs captured and replayed so far
(`stochround.nn.step_graphs`; 0 on the CPU): captures that go on step after step are
layers whose graphs have not settled, each capture costing the step a warm-up run.
`RowsLogger` takes the place of torchtitan's metric logger in its trainer (both APIs name
the metrics ``loss_metrics/global_avg_loss`` and ``throughput(tps)``).

torchtitan logs step 1 and every step that its ``metrics.log_freq`` divides
(``titan_config(log_every=N)``; 1, every step, by default).  A row's ``step`` is the step
torchtitan logged, its ``loss`` that step's alone, and its ``tps`` the tokens of the steps
since the previous logged step over the time since (torchtitan's count and clock, reset at
each log): with ``N`` above 1 one row's throughput covers ``N`` steps (the first row: step
1 alone).  A logged step reads the loss and the gradient norm on the host (``.item()``),
which waits for the device to finish the step: between two logged steps the host runs
ahead of the device, at a logged step it cannot.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

from ...nn.step_graphs import STEP_GRAPHS


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
        row = {
            "step": step,
            "loss": float(loss),
            "tps": float(tps),
            "graph_captures": STEP_GRAPHS.captures,
            "graph_replays": STEP_GRAPHS.replays,
            **self.fields,
        }
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def check_log_every(log_every: object) -> int:
    """``log_every`` (torchtitan's ``metrics.log_freq``: a row every that many steps, and
    step 1) if it is an int of at least 1 (a bool is not), else ValueError naming it."""
    # a numpy integer is an int too; a bool is not
    if isinstance(log_every, bool) or not isinstance(log_every, numbers.Integral) or log_every < 1:
        raise ValueError(f"log_every must be an int >= 1 (steps between rows); got {log_every!r}")
    return int(log_every)


__all__ = ["RowsLogger", "check_log_every"]
