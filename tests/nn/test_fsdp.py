"""`QuantizedLinear` recipes and GaussWS under FSDP2 (`fully_shard`) on two ranks, bit for
bit against one process.

FSDP2 all-gathers each layer's bf16 weight before its forward and backward, so a layer
quantizes (or samples) the all-gathered weight, a plain tensor equal to the unsharded
one: its codes and random words are the single process's.  With every rank on the same
batch the reduce-scatter averages equal gradients, which is exact, and
`stochround.optim.AdamW` (bf16 parameters and states, SR, a fixed seed) updates each
rank's shard with the words of its elements' global indices.  So after three steps the
losses and the gathered parameters must equal a single process's, for the named recipes
(NVFP4 with 16x16 weight tiles and the wgrad RHT, MXFP4 of Tseng et al. with per-step
RHT signs, MXFP8, per-tensor FP8, int8 with SR gradients) and for GaussWS-sampled
weights.

Every case runs in one spawn of the ranks (`ranks.run_ranks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks import bits, devices, run_ranks
from torch import nn

import stochround as sr

STEPS = 3
SEED = 7
WIDTH = 64  # the tokens and features: mxfp4_tseng's 64-point RHT runs along each GEMM axis
RECIPE_SEED = 3


def recipe_model(recipe: sr.nn.Recipe) -> Callable[[nn.Module], nn.Module]:
    return lambda model: sr.nn.quantize_(model, recipe)


def gaussws_model(model: nn.Module) -> nn.Module:
    return sr.nn.gaussws_(model, "e2m1", seed=RECIPE_SEED)


# name: how a bf16 model of nn.Linear layers is made quantized (in place)
MODELS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "nvfp4": recipe_model(sr.nn.nvfp4(seed=RECIPE_SEED)),
    "mxfp4_tseng": recipe_model(sr.nn.mxfp4_tseng(seed=RECIPE_SEED)),
    "mxfp8": recipe_model(sr.nn.mxfp8(seed=RECIPE_SEED)),
    "fp8": recipe_model(sr.nn.fp8(seed=RECIPE_SEED)),
    "int8": recipe_model(sr.nn.int8(seed=RECIPE_SEED)),
    "gaussws": gaussws_model,
}


def build_model(name: str, device: str) -> nn.Module:
    """Two bf16 layers WIDTH -> WIDTH -> WIDTH (the same initial weights on every rank),
    made quantized by ``MODELS[name]``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    return MODELS[name](model.to(device=device, dtype=torch.bfloat16))


def sharded(model: nn.Module, device: str) -> nn.Module:
    """``model`` under FSDP2: each linear layer a unit, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets, the same on every rank."""
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WIDTH, WIDTH, generator=generator).to(torch.bfloat16)
    y = torch.randn(WIDTH, WIDTH, generator=generator).to(torch.bfloat16)
    return x.to(device), y.to(device)


def train(model: nn.Module, device: str) -> tuple[list[float], list[torch.Tensor]]:
    """The losses of STEPS steps of AdamW (SR, bf16 states, seed SEED), and the parameters'
    bits after them."""
    optimizer = sr.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, seed=SEED)
    losses = []
    for step in range(STEPS):
        x, y = batch(step, device)
        loss = F.mse_loss(model(x).float(), y.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, [bits(p) for p in model.parameters()]


def fsdp_body(rank: int, world_size: int, device: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    for name in MODELS:
        whole_losses, whole_params = train(build_model(name, device), device)
        model = sharded(build_model(name, device), device)
        losses, params = train(model, device)
        outcome[name] = {
            "losses": (losses, whole_losses),
            "params": len(params) == len(whole_params)
            and all(torch.equal(a, b) for a, b in zip(params, whole_params, strict=True)),
            "sharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
            "quantized": quantized_layers(model) == 2,
            "moved": any(not torch.equal(p, q) for p, q in zip(params, initial(name), strict=True)),
        }
    return outcome


def quantized_layers(model: nn.Module) -> int:
    """How many layers quantize (`QuantizedLinear`) or sample (a GaussWS parametrization)
    their weight."""
    from torch.nn.utils import parametrize

    return sum(
        isinstance(module, sr.nn.QuantizedLinear)
        or (isinstance(module, nn.Linear) and parametrize.is_parametrized(module, "weight"))
        for module in model.modules()
    )


def initial(name: str) -> list[torch.Tensor]:
    """The parameters' bits before training (on the CPU)."""
    return [bits(p) for p in build_model(name, "cpu").parameters()]


@pytest.mark.parametrize("device", devices())
def test_fsdp2_training_equals_one_process(device: str) -> None:
    results = run_ranks(fsdp_body, device=device)
    for rank, outcome in enumerate(results):
        assert set(outcome) == set(MODELS)
        for name, case in outcome.items():
            losses, whole_losses = case["losses"]
            assert losses == whole_losses, (rank, name, losses, whole_losses)
            assert case["params"], (rank, name)
            assert case["sharded"] and case["quantized"] and case["moved"], (rank, name, case)


def data_rank_body(rank: int, world_size: int, device: str) -> dict[str, torch.Tensor]:
    """mxfp4_tseng (SR on dy, x and W in the backward GEMMs) keyed by each rank's
    data-parallel rank, every rank on the same batch and the same dy, so that what differs
    between the ranks is their random words: under FSDP2, the gradient dx of the input
    (``Q(dy) Q(W)``); and the first layer's dgrad and wgrad operands, quantized by its
    plan from the all-gathered weight."""
    from stochround.nn.linear import gemm_operands, slot_offsets, step_column

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    plain = plain.to(device=device, dtype=torch.bfloat16)
    recipe = sr.nn.mxfp4_tseng(seed=RECIPE_SEED)
    model = sharded(sr.nn.quantize_(plain, recipe, data_parallel_rank=rank), device)
    x, dy = batch(0, device)
    x.requires_grad_(True)
    model(x).backward(dy)
    layer = model[0]
    weight = layer.weight.full_tensor().detach()
    offsets = slot_offsets(step_column(torch.zeros((), dtype=torch.int64, device=device), 0))
    grad, weight_t, _ = gemm_operands(layer.plan, "dgrad", dy, weight.T, offsets)
    grad_t, x_t, _ = gemm_operands(layer.plan, "wgrad", dy.T, x.detach().T, offsets)
    return {
        "dx": bits(x.grad),
        "dgrad_grad_output": bits(grad.values),
        "dgrad_weight": bits(weight_t.values),
        "wgrad_grad_output": bits(grad_t.values),
        "wgrad_input": bits(x_t.values),
        "rank": torch.tensor(layer.data_parallel_rank),
    }


@pytest.mark.parametrize("device", devices())
def test_data_parallel_ranks_draw_their_own_words_for_x_and_dy_and_one_for_the_weight(
    device: str,
) -> None:
    """``quantize_(..., data_parallel_rank=rank)`` under FSDP2: on the same data the two
    ranks' dy and x operands differ (their own words), the all-gathered weight's operand
    is equal bit for bit (one key on every rank), and so the input gradients differ."""
    first, second = run_ranks(data_rank_body, device=device)
    assert (int(first["rank"]), int(second["rank"])) == (0, 1)
    assert torch.equal(first["dgrad_weight"], second["dgrad_weight"])
    for role in ("dgrad_grad_output", "wgrad_grad_output", "wgrad_input", "dx"):
        assert not torch.equal(first[role], second[role]), role
