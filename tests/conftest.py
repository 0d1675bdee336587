"""Test session set-up: the Triton interpreter where there is no GPU, one torch thread per
xdist worker, and GPU tests deselected where there is no GPU.  Shared helpers live in
`helpers.py`."""

from __future__ import annotations

import os

import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, so it is set before any test
# module imports stochround.kernels: without a GPU the kernels run in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Each pytest-xdist worker is a process of its own: with torch's default of one intra-op
# thread per core, `pytest -n 2` on two cores runs four spinning threads (measured: twice
# the wall time and three times the CPU time of one thread per worker).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests are deselected (not skipped) where there is no CUDA device, two-GPU tests
    where there are fewer than two: CI's run does not count them, and the GPU machines run
    them for real."""
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = {"gpu"} if devices == 0 else set()
    if devices < 2:
        missing.add("gpus2")
    kept, deselected = [], []
    for item in items:
        (deselected if any(mark in item.keywords for mark in missing) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture
def no_step_graphs() -> object:
    """Quantized layers' eager steps without their CUDA graphs (`stochround.nn.step_graphs`):
    for the tests of that route's own launches, operations and operands on a GPU (on the
    CPU no step is graphed)."""
    from stochround.nn import use_step_graphs

    previous = use_step_graphs(False)
    yield
    use_step_graphs(previous)
