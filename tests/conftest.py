"""Shared test helpers: format lists, exact tensor comparison against scalar results."""

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

import stochround as sr


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


# Every registered format, plus P3109 and CFloat8 formats that exercise p = 1, unsigned
# formats with infinities, all-subnormal grids and configurable biases.
TEST_FORMATS = [
    *sr.FORMATS,
    "p3109_k8p1se",
    "p3109_k8p3ue",
    "p3109_k8p4se",
    "p3109_k8p4sf",
    "p3109_k8p8sf",
    "p3109_k6p3sf",
    "p3109_k3p2sf",
    "cfloat8_e4m3_b20",
    "cfloat8_e5m2_b40",
]


def assert_same_values(actual: torch.Tensor, expected: list[float], context: str = "") -> None:
    """Bit-exact equality of float64 values: NaN matches NaN, zeros match by sign."""
    actual = actual.to(torch.float64).flatten().cpu()
    wanted = torch.tensor(expected, dtype=torch.float64)
    same = (actual.view(torch.int64) == wanted.view(torch.int64)) | (
        torch.isnan(actual) & torch.isnan(wanted)
    )
    if not bool(same.all()):
        bad = torch.nonzero(~same).flatten()[:5].tolist()
        detail = ", ".join(f"#{i}: got {actual[i].item()!r} want {wanted[i].item()!r}" for i in bad)
        raise AssertionError(f"{context}: {int((~same).sum())} mismatches; {detail}")


def all_bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 16-bit float dtype, in code order."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)
