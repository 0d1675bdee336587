"""torchtitan's trainer on the CPU (both releases): its device, seen as ``"cpu"``.

torchtitan picks its device once, at import (``torchtitan.tools.utils.device_type``: the
available accelerator, else ``"cuda"``), and its modules copy that name and the device's
``torch.<device>`` module; with no accelerator the trainer calls CUDA.  `cpu_trainer`
sets the name to ``"cpu"`` and the module to `CpuDevice` (the calls torchtitan makes:
set the device, synchronize, memory statistics — none has anything to do on the CPU) in
each module that holds them, for the duration of a ``with`` block, and restores them
after.  The trainer also shortens its process groups' timeouts after the first step
(``set_pg_timeouts``); 0.3.0 does it by ``torch.distributed.set_timeout``, which torch's
CPU build (2.13) lacks, so inside the block that step only synchronizes the ranks, as it
does before changing them, and the groups keep their timeouts (`keep_pg_timeouts`, under
both releases).  Under it the trainer runs as on a GPU, with gloo for its process groups:
what ``stochround titan --device cpu`` (0.2.2) and the tests run.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import ModuleType
from typing import Any, NamedTuple

import torch

# the torchtitan modules (0.2.2 and 0.3.0) that copy device_type and/or device_module at
# import
DEVICE_HOLDERS: tuple[str, ...] = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
)


class DeviceProperties(NamedTuple):
    total_memory: int


class CpuDevice:
    """The ``torch.cuda`` calls torchtitan's trainer makes, for the CPU."""

    @staticmethod
    def set_device(*args: Any) -> None:
        """Nothing to select."""

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def synchronize(*args: Any) -> None:
        """CPU work is synchronous."""

    @staticmethod
    def get_device_name(*args: Any) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(*args: Any) -> DeviceProperties:
        # the machine's memory, which torchtitan's monitor reports percentages of
        return DeviceProperties(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def reset_peak_memory_stats(*args: Any) -> None:
        """No statistics kept."""

    @staticmethod
    def empty_cache() -> None:
        """No cache."""

    @staticmethod
    def memory_stats(*args: Any) -> dict[str, int]:
        return {}


def keep_pg_timeouts(timeout: timedelta, parallel_dims: Any) -> None:
    """torchtitan 0.3.0's ``set_pg_timeouts`` on the CPU: the ranks synchronized, the
    timeouts kept (module docstring)."""
    torch.distributed.barrier()


@contextmanager
def cpu_trainer() -> Iterator[None]:
    """torchtitan's device seen as the CPU inside the block (module docstring)."""
    modules: list[ModuleType] = [importlib.import_module(name) for name in DEVICE_HOLDERS]
    cpu = {
        "device_type": "cpu",
        "device_module": CpuDevice,
        "set_pg_timeouts": keep_pg_timeouts,
    }
    saved = [(m, name, getattr(m, name)) for m in modules for name in cpu if hasattr(m, name)]
    try:
        for module, name, _ in saved:
            setattr(module, name, cpu[name])
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


__all__ = ["DEVICE_HOLDERS", "CpuDevice", "DeviceProperties", "cpu_trainer", "keep_pg_timeouts"]
