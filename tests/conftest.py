"""Test session set-up: the Triton interpreter where there is no GPU, one torch thread per
xdist worker, an Inductor cache of its own per process, Inductor's dtype rules built once
(`_dtype_rules_built_once`), and GPU tests deselected where there is no GPU.  Shared
helpers live in `helpers.py`."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

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

# Each process compiles into an Inductor cache of its own, made afresh and removed at exit:
# Inductor skips building a kernel whose file already exists, so a shared cache (the
# default folder under /tmp, which the other xdist worker, the README's job, the docs
# build and earlier runs all write to) hands every later test a half-written library once
# one writer stops mid-build ("file too short"), and a run's outcome then depends on what
# ran before it.  A folder the environment names is used as given.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_cache = tempfile.mkdtemp(prefix="stochround-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache
    atexit.register(shutil.rmtree, _inductor_cache, ignore_errors=True)

import pytest


def _dtype_rules_built_once() -> None:
    """Inductor's `DtypePropagationOpsHandler` is a singleton whose ``__init__`` sets one
    attribute per registered op rule at every construction, and code generation constructs
    it for every operation it emits (torch 2.13 on the CPU: about a third of a compile).
    Here it runs again only where the rule registries have grown since its last run, so
    the singleton holds the same attributes as it would; nothing else changes.  Skipped
    where this torch has no such class."""
    try:
        from torch._inductor import dtype_propagation, utils
        from torch._inductor.codegen import common
    except ImportError:
        return
    handler = getattr(dtype_propagation, "DtypePropagationOpsHandler", None)
    registries = (
        getattr(utils, "op_dtype_propagation_rules", None),
        getattr(common, "pointwise_overrides_data", None),
    )
    if handler is None or "_instance" not in vars(handler) or None in registries:
        return
    build = handler.__init__
    built: list[tuple[int, ...]] = []

    def init_once(self: object, *args: object, **kwargs: object) -> None:
        sizes = tuple(len(registry) for registry in registries)
        if args or kwargs or built[-1:] != [sizes]:  # (a torch whose rules take arguments)
            build(self, *args, **kwargs)
            built.append(sizes)

    handler.__init__ = init_once


_dtype_rules_built_once()


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
