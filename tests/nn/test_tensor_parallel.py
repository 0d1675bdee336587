"""`QuantizedLinear` under tensor parallelism (torch's `ColwiseParallel` and
`RowwiseParallel`) on two ranks, bit for bit against the per-shard layers computed in one
process.

An MLP ``Linear(W, 2W) -> ReLU -> Linear(2W, W)`` with biases, quantized by a recipe, is
parallelized colwise then rowwise.  Rank r's layers quantize their local operands under the
Philox key `rank_key(key, r)`, so one process reproduces the parallel step with, for each
r, a `QuantizedLinear` holding W1's rows r (and b1's) and one holding W2's columns r, their
plans keyed `rank_key(key, r)`: ``y = sum_r (L2_r(relu(L1_r(x))) + b2 / R)`` over the R
ranks (DTensor adds a replicated bias to a partial sum in shares).  The output, dx
(the ranks' partial sums reduced) and the gathered weight and bias gradients must equal that
bit for bit.  A shard its blocks do not divide and an unsupported placement raise
ValueError.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks import bits, devices, run_ranks
from torch import nn

import stochround as sr
from stochround.nn.tensor_parallel import RANK_KEY_STEP, rank_key

WIDTH = 64  # mxfp4_tseng's 64-point RHT runs along every local GEMM axis
RECIPES = {
    "nvfp4": lambda: sr.nn.nvfp4(seed=3),
    "mxfp4_tseng": lambda: sr.nn.mxfp4_tseng(seed=3),
    "mxfp8": lambda: sr.nn.mxfp8(seed=3),
    "fp8": lambda: sr.nn.fp8(seed=3),
    "int8": lambda: sr.nn.int8(seed=3),
}


def mlp(name: str, device: str, hidden: int = 2 * WIDTH) -> nn.Sequential:
    """The bf16 MLP (the same initial weights on every rank), quantized by the recipe."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, hidden), nn.ReLU(), nn.Linear(hidden, WIDTH))
    model = model.to(device=device, dtype=torch.bfloat16)
    return sr.nn.quantize_(model, RECIPES[name]())  # type: ignore[return-value]


def inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(WIDTH, WIDTH, generator=generator).to(torch.bfloat16)
    target = torch.randn(WIDTH, WIDTH, generator=generator).to(torch.bfloat16)
    return x.to(device), target.to(device)


def parallel(model: nn.Sequential, device: str) -> nn.Sequential:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def step(model: nn.Module, device: str) -> dict[str, torch.Tensor]:
    """One forward and backward: y, dx and the parameters' gradients (gathered), as bits."""
    x, target = inputs(device)
    x.requires_grad_()
    y = model(x)
    F.mse_loss(y.float(), target.float()).backward()
    grads = {name: bits(p.grad) for name, p in model.named_parameters()}
    return {"y": bits(y), "dx": bits(x.grad), **grads}


def shard_layer(whole: sr.nn.QuantizedLinear, rows: slice, cols: slice, rank: int, bias: bool):
    """A `QuantizedLinear` holding ``whole``'s weight[rows, cols] (and bias[rows]), keyed as
    rank ``rank``'s local layer."""
    weight = whole.weight.detach()[rows, cols]
    layer = sr.nn.QuantizedLinear(
        weight.shape[1], weight.shape[0], bias=bias, device=weight.device, dtype=weight.dtype,
        recipe=whole.recipe, layer_index=whole.layer_index,
    )  # fmt: skip
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            layer.bias.copy_(whole.bias.detach()[rows])
    layer.plan = layer.plan._replace(seed=rank_key(layer.plan.seed, rank))
    return layer


def one_process_step(name: str, device: str, world_size: int) -> dict[str, torch.Tensor]:
    """The parallel step computed in one process from the per-shard layers."""
    model = mlp(name, device)
    first, second = model[0], model[2]
    part = 2 * WIDTH // world_size
    firsts = [
        shard_layer(first, slice(r * part, (r + 1) * part), slice(None), r, True)
        for r in range(world_size)
    ]
    seconds = [
        shard_layer(second, slice(None), slice(r * part, (r + 1) * part), r, False)
        for r in range(world_size)
    ]
    x, target = inputs(device)
    x.requires_grad_()
    # DTensor adds a replicated bias to a partial sum as bias / world size on each rank
    # (as for an nn.Linear under RowwiseParallel), then reduces
    share = second.bias / world_size
    partials = [seconds[r](torch.relu(firsts[r](x))) + share for r in range(world_size)]
    y = partials[0]
    for each in partials[1:]:
        y = y + each
    F.mse_loss(y.float(), target.float()).backward()
    return {
        "y": bits(y),
        "dx": bits(x.grad),
        "0.weight": bits(torch.cat([layer.weight.grad for layer in firsts])),
        "0.bias": bits(torch.cat([layer.bias.grad for layer in firsts])),
        "2.weight": bits(torch.cat([layer.weight.grad for layer in seconds], dim=1)),
        "2.bias": bits(second.bias.grad),
    }


def tp_body(rank: int, world_size: int, device: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    for name in RECIPES:
        ours = step(parallel(mlp(name, device), device), device)
        reference = one_process_step(name, device, world_size)
        outcome[name] = {key: torch.equal(ours[key], reference[key]) for key in reference}
    outcome["straddle"] = error_of(lambda: step(parallel(mlp("mxfp8", device, 96), device), device))
    outcome["placement"] = error_of(lambda: replicated_call(device))
    return outcome


def replicated_call(device: str) -> None:
    """A layer whose weight and input are replicated DTensors (no supported style)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    layer = mlp("nvfp4", device)[0]
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Replicate()]))
    layer.bias = None
    x, _ = inputs(device)
    layer(distribute_tensor(x, mesh, [Replicate()]))


def error_of(call: Any) -> str:
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("device", devices())
def test_tensor_parallel_equals_the_shards_in_one_process(device: str) -> None:
    for rank, outcome in enumerate(run_ranks(tp_body, device=device)):
        assert "blocks must divide the local shapes" in outcome.pop("straddle"), rank
        assert "supports ColwiseParallel" in outcome.pop("placement"), rank
        for name, same in outcome.items():
            assert all(same.values()), (rank, name, same)


def test_rank_keys() -> None:
    """Rank 0 keeps the layer's key (a one-rank mesh draws the single process's words);
    other ranks xor in multiples of an odd constant, distinct for each rank."""
    assert rank_key(12345, 0) == 12345
    assert rank_key(12345, 1) == 12345 ^ RANK_KEY_STEP
    assert rank_key(0, 3) == (3 * RANK_KEY_STEP) % (1 << 64)
    assert len({rank_key(7, r) for r in range(1024)}) == 1024
    with pytest.raises(ValueError, match="rank must be non-negative"):
        rank_key(1, -1)
