"""A quantized run saved mid-way with torch.distributed.checkpoint (one gloo rank on the
CPU, as docs/guide/distributed.md sets it up) and resumed into a fresh model and SR
optimizer equals the uninterrupted run bit for bit: losses, parameters, the optimizer's
states and every step buffer — also when the resumed run checkpoints its activations."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import stochround as sr
import stochround.nn as srnn

WIDTH = 64
STEPS = 2


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group on the CPU for the module's tests."""
    if dist.is_initialized():  # another test's group: use it
        yield
        return
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build(init_seed: int) -> nn.Sequential:
    """Two linears quantized by nvfp4 and sampled by GaussWS (both keep step buffers),
    their weights drawn from ``init_seed``."""
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
    srnn.quantize_(model, srnn.nvfp4(seed=7))
    srnn.gaussws_(model, "e2m1", block=16, seed=9)
    return model


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[Tensor]:
    """Steps ``steps`` on batches drawn from each step's number; the losses."""
    losses = []
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(32, WIDTH, generator=generator)
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }


def flat(state: dict[str, Any]) -> dict[str, Tensor]:
    """Every tensor of a nested state dict by its path."""
    found: dict[str, Tensor] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            found.update({f"{key}.{k}": v for k, v in flat(value).items()})
        elif isinstance(value, Tensor):
            found[str(key)] = value
    return found


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_dcp_checkpoint_resumes_a_quantized_run_bit_exactly(
    one_rank: None, checkpointed: bool
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model = build(0)
    optimizer = sr.optim.AdamW(model.parameters(), lr=1e-2, seed=3)
    train(model, optimizer, range(STEPS))
    with tempfile.TemporaryDirectory() as folder:
        dcp.save(state_of(model, optimizer), checkpoint_id=folder)
        continued = train(model, optimizer, range(STEPS, 2 * STEPS))

        fresh = build(1)  # other weights: the load must bring them
        if checkpointed:
            fresh = nn.Sequential(*(checkpoint_wrapper(each) for each in fresh))
        fresh_optimizer = sr.optim.AdamW(fresh.parameters(), lr=1e-2, seed=3)
        state = state_of(fresh, fresh_optimizer)
        dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_optimizer, state["optimizer"])
    resumed = train(fresh, fresh_optimizer, range(STEPS, 2 * STEPS))

    assert all(torch.equal(a, b) for a, b in zip(resumed, continued, strict=True))
    expected, got = flat(state_of(model, optimizer)), flat(state_of(fresh, fresh_optimizer))
    assert sorted(got) == sorted(expected)
    steps = [key for key in expected if key.endswith("step") and key.startswith("model.")]
    assert len(steps) == 4  # two QuantizedLinear and two GaussWS counters
    assert all(int(expected[key]) == 2 * STEPS for key in steps)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
