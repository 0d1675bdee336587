"""A torchtitan trainer's run (both APIs): in one process without ``torchrun``, the
environment ``torch.distributed`` reads (a group of one on a free port); `train_with_rows`
trains a built trainer, rank 0 writing the rows; `train_on` builds and trains one on a
device (the CPU under `cpu_trainer`)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .cpu_device import cpu_trainer
from .rows import RowsLogger

# where ``stochround titan`` trains: torchtitan's trainer, on the CPU with the device
# switched (`cpu_trainer`)
TRAINING_DEVICES: tuple[str, ...] = ("cpu", "cuda")
# under torch's deterministic algorithms (``stochround titan --deterministic``), an op
# that has no deterministic implementation warns and the run goes on: the run is for
# finding which op varies from run to run, which an error at the first such op would hide
DETERMINISTIC_WARN_ONLY = True


def check_training_device(device: str) -> None:
    """ValueError unless ``device`` is one of `TRAINING_DEVICES` (and, for "cuda", a CUDA
    device is present)."""
    if device not in TRAINING_DEVICES:
        raise ValueError(f"device must be one of {', '.join(TRAINING_DEVICES)}; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' needs a CUDA device; use device='cpu'")


def free_port() -> int:
    """A TCP port free on this machine now (for a one-process group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def single_process_env() -> Iterator[int]:
    """Within: the rank variables ``torchrun`` would set, filled in for a group of one
    where they are missing (a free port for the rendezvous); yields the world size.  The
    variables it filled in are removed after, so a later run in the process picks its own
    port."""
    defaults = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": None,
    }
    filled = [key for key in defaults if key not in os.environ]
    for key in filled:
        os.environ[key] = defaults[key] or str(free_port())
    try:
        yield int(os.environ["WORLD_SIZE"])
    finally:
        for key in filled:
            os.environ.pop(key, None)


def train_with_rows(trainer: Any, rows: Path, fields: dict[str, Any]) -> None:
    """``trainer.train()``, rank 0's metric logger wrapped by a `RowsLogger` writing
    ``rows`` (each row with ``fields``); the trainer closed and the process group destroyed
    after, whatever happens."""
    try:
        if int(os.environ["RANK"]) == 0:
            processor = trainer.metrics_processor
            processor.logger = RowsLogger(rows, fields, processor.logger)
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def train_on(device: str, build: Callable[[], Any], rows: Path, fields: dict[str, Any]) -> Path:
    """The trainer ``build()`` makes, trained on ``device`` by `train_with_rows` (the CPU:
    under `cpu_trainer`, built there too), in the rank environment of
    `single_process_env`; each row with ``fields``, the device and the world size.
    Returns ``rows``."""
    on_cpu = device == "cpu"
    with single_process_env() as world, cpu_trainer() if on_cpu else contextlib.nullcontext():
        train_with_rows(build(), rows, {**fields, "device": device, "world_size": world})
    return rows


__all__ = [
    "DETERMINISTIC_WARN_ONLY",
    "TRAINING_DEVICES",
    "check_training_device",
    "free_port",
    "single_process_env",
    "train_on",
    "train_with_rows",
]
