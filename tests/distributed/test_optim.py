"""The SR optimizers under torch.distributed, on two ranks, bit for bit against one process.

- DTensor parameters (Shard(0) as FSDP2 gives them, Shard of the last dimension,
  Replicate): every rank updates its shard with the words of its elements' global indices,
  on the PyTorch path and on the fused kernel (`backend="triton"`: the local shards, no
  gather), so parameters and states equal a single process's.
- FSDP2 (`fully_shard`) end to end: a small bf16 model trained by AdamW, SGD with momentum
  and Lion, every rank on the same batch (the reduce-scatter's mean of equal gradients is
  exact): the losses and the gathered parameters equal a single process's.
- DDP: each rank on its own batch, the replicas stay bit-identical (one agreed seed: every
  rank draws the same words for a replicated parameter).
- torch.distributed.checkpoint: a run saved on two ranks resumes on two and on one rank
  (`get/set_optimizer_state_dict`, DCP resharding) and continues bit for bit as the run
  that never stopped.

Every case of a device runs in one spawn of the ranks (`ranks.run_ranks`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks import bits, devices, run_ranks
from torch import nn

import stochround as sr
from stochround.kernels.availability import INTERPRETED

STEPS = 2  # each optimizer's second step reads the states its first one stored
SEED = 5
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda params, **kw: sr.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw),
    "sgd": lambda params, **kw: sr.optim.SGD(params, lr=1e-2, momentum=0.9, **kw),
    "lion": lambda params, **kw: sr.optim.Lion(params, lr=1e-3, weight_decay=0.1, **kw),
}


def same(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(
        torch.equal(bits(a), bits(b)) for a, b in zip(first, second, strict=True)
    )


# --- DTensor parameters --------------------------------------------------------------------


def tensor_values(device: str) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """bf16 values and STEPS steps of gradients. Shapes: 8 rows of 6 (rank 1's shard starts
    at element 24), 7 rows of 4 (rank 1 at 16 of 28: unequal shards), 6 (rank 1 at 3: no
    multiple of 4, the fused kernel declines it), 64 x 3 (rank 1 at 96)."""
    generator = torch.Generator().manual_seed(1)
    shapes = ((8, 6), (7, 4), (6,), (64, 3))
    values = [torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]
    grads = [
        [torch.randn(s, generator=generator).to(torch.bfloat16) for s in shapes]
        for _ in range(STEPS)
    ]
    to_device = lambda ts: [t.to(device) for t in ts]  # noqa: E731
    return to_device(values), [to_device(step) for step in grads]


def stepped(
    name: str, params: list[torch.Tensor], grads: list[list[torch.Tensor]], backend: str
) -> list[torch.Tensor]:
    """The parameters and states after STEPS steps of optimizer ``name`` (bf16 states)."""
    optimizer = OPTIMIZERS[name](params, seed=SEED, backend=backend)
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = grad
        optimizer.step()
    states = [t for p in params for t in optimizer.state[p].values() if t.dim() > 0]
    return [*params, *states]


def dtensor_cases(device: str) -> dict[str, bool]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    values, grads = tensor_values(device)
    placements = {
        "shard0": lambda t: Shard(0),
        "replicate": lambda t: Replicate(),
        "shard_last": lambda t: Shard(t.dim() - 1),  # FSDP2's shard_placement_fn may give it
    }
    outcome = {}
    for name in OPTIMIZERS:
        for backend in ("torch", "triton"):
            kept = list(range(len(values)))
            if backend == "triton":
                kept = [0, 1, 3]  # the shard of (6,) that starts at element 3 is refused
            # the one process's run, which each placement's run must equal
            whole = stepped(
                name,
                [values[i].clone().requires_grad_() for i in kept],
                [[step[i] for i in kept] for step in grads],
                backend,
            )
            for placement_name, placement_of in placements.items():
                if backend == "triton" and placement_name == "shard_last":
                    continue  # refused (`refusals`)
                params = [
                    distribute_tensor(values[i].clone(), mesh, [placement_of(values[i])])
                    for i in kept
                ]
                sharded_grads = [
                    [distribute_tensor(step[i], mesh, [placement_of(step[i])]) for i in kept]
                    for step in grads
                ]
                ran = stepped(name, [p.requires_grad_() for p in params], sharded_grads, backend)
                outcome[f"{name}/{backend}/{placement_name}"] = same(ran, whole)
    outcome["refusals"] = refusals(mesh)
    outcome["compiled"] = compiled_step_case(mesh, values, grads)
    return outcome


def compiled_step_case(
    mesh: Any, values: list[torch.Tensor], grads: list[list[torch.Tensor]]
) -> bool:
    """``torch.compile(optimizer.step)`` over DTensor parameters steps them eagerly (a
    compiled region's call runs `SROptimizer.eager_step`): the same bits as the eager run."""
    from torch.distributed.tensor import Shard, distribute_tensor

    whole = stepped("adamw", [v.clone().requires_grad_() for v in values], grads, "auto")
    params = [distribute_tensor(v.clone(), mesh, [Shard(0)]).requires_grad_() for v in values]
    optimizer = OPTIMIZERS["adamw"](params, seed=SEED, backend="auto")
    step = torch.compile(optimizer.step)
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = distribute_tensor(grad, mesh, [Shard(0)])
        step()
    states = [t for p in params for t in optimizer.state[p].values() if t.dim() > 0]
    return same([*params, *states], whole)


def refusals(mesh: Any) -> bool:
    """backend="triton" names why it cannot update a shard of the last dimension, and one
    that starts at an element that is no multiple of 4."""
    from torch.distributed.tensor import Shard, distribute_tensor

    messages = []
    for shape, dim in (((4, 8), 1), ((6,), 0)):
        param = distribute_tensor(torch.ones(shape), mesh, [Shard(dim)]).requires_grad_()
        param.grad = distribute_tensor(torch.ones(shape), mesh, [Shard(dim)])
        try:
            sr.optim.AdamW([param], seed=SEED, backend="triton").step()
        except ValueError as error:
            messages.append(str(error))
    first_rank = dist.get_rank() == 0
    return (
        len(messages) == (1 if first_rank else 2)
        and "not a range of whole rows" in messages[0]
        and (first_rank or "starts at global element 3, not a multiple of 4" in messages[1])
    )


# --- FSDP2, DDP and checkpoints --------------------------------------------------------------


def build_model(device: str, width: int = 6) -> nn.Module:
    """A small bf16 MLP: 16 -> 24 -> ``width`` -> 8 (``width`` 6: a bias whose second
    shard starts at element 3, which the fused kernel declines; 8: every shard at a
    multiple of 4)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, width), nn.ReLU())
    model.append(nn.Linear(width, 8))
    return model.to(device=device, dtype=torch.bfloat16)


def batch(step: int, device: str, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets: the same on every rank (rank None) or a rank's own."""
    generator = torch.Generator().manual_seed(1000 * step + (0 if rank is None else rank + 1))
    x = torch.randn(8, 16, generator=generator).to(torch.bfloat16)
    y = torch.randn(8, 8, generator=generator).to(torch.bfloat16)
    return x.to(device), y.to(device)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: range,
    device: str,
    rank: int | None = None,
) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step, device, rank)
        loss = F.mse_loss(model(x).float(), y.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def sharded_model(device: str, width: int = 6) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    model = build_model(device, width)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def fsdp_cases(device: str) -> dict[str, bool]:
    """AdamW, SGD and Lion on the PyTorch path and on the fused kernel (on the CPU its
    interpreter, `backend="triton"`, with every shard at a multiple of 4; on CUDA "auto",
    the fused kernel for those shards and the PyTorch path for the one it declines)."""
    fused, width = ("triton", 8) if device == "cpu" else ("auto", 6)
    outcome = {}
    for name in OPTIMIZERS:
        for backend in ("torch", fused):
            size = width if backend == fused else 6
            whole = build_model(device, size)
            whole_losses = train(
                whole, OPTIMIZERS[name](whole.parameters(), seed=SEED, backend=backend),
                range(STEPS), device,
            )  # fmt: skip
            model = sharded_model(device, size)
            losses = train(
                model, OPTIMIZERS[name](model.parameters(), seed=SEED, backend=backend),
                range(STEPS), device,
            )  # fmt: skip
            outcome[f"fsdp/{name}/{backend}"] = losses == whole_losses and same(
                parameters(model), parameters(whole)
            )
    return outcome


def ddp_case(device: str, rank: int) -> list[torch.Tensor]:
    """The replica's parameters after STEPS steps on the rank's own batches (seed None: the
    optimizer takes rank 0's default seed)."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(build_model(device))
    train(model, sr.optim.AdamW(model.parameters(), lr=1e-2), range(STEPS), device, rank)
    return [bits(p) for p in model.parameters()]


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's state dicts as DCP saves and loads them (FQN keys,
    DTensor values)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }


def resumed_run(device: str, folder: str) -> list[torch.Tensor]:
    """A fresh sharded model and AdamW loaded from the checkpoint in ``folder`` (DCP
    reshards it onto this world's ranks), trained steps STEPS .. 2 STEPS - 1."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model = sharded_model(device)
    optimizer = sr.optim.AdamW(model.parameters(), lr=1e-2, seed=SEED)
    state = checkpoint_state(model, optimizer)
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    train(model, optimizer, range(STEPS, 2 * STEPS), device)
    return parameters(model)


def uninterrupted(device: str) -> list[torch.Tensor]:
    """The single-process run of 2 STEPS steps."""
    whole = build_model(device)
    train(whole, sr.optim.AdamW(whole.parameters(), lr=1e-2, seed=SEED), range(2 * STEPS), device)
    return parameters(whole)


def checkpoint_cases(device: str, folder: str) -> dict[str, Any]:
    """Train STEPS steps sharded, save with DCP, train STEPS more; resume from the
    checkpoint on these ranks and train the same STEPS more: both equal the uninterrupted
    single-process run."""
    import torch.distributed.checkpoint as dcp

    model = sharded_model(device)
    optimizer = sr.optim.AdamW(model.parameters(), lr=1e-2, seed=SEED)
    train(model, optimizer, range(STEPS), device)
    dcp.save(checkpoint_state(model, optimizer), checkpoint_id=folder)
    train(model, optimizer, range(STEPS, 2 * STEPS), device)
    whole = uninterrupted(device)
    return {
        "checkpoint/continued": same(parameters(model), whole),
        "checkpoint/resumed_2_to_2": same(resumed_run(device, folder), whole),
    }


def two_rank_body(rank: int, world_size: int, device: str, folder: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {**dtensor_cases(device), **fsdp_cases(device)}
    outcome.update(checkpoint_cases(device, folder))
    outcome["ddp"] = ddp_case(device, rank)
    return outcome


def one_rank_resume(rank: int, world_size: int, device: str, folder: str) -> bool:
    """A checkpoint of two ranks resumed on one (DCP reshards; one rank's shard is the
    whole parameter): STEPS more steps equal the uninterrupted single-process run."""
    return same(resumed_run(device, folder), uninterrupted(device))


def kernel_devices() -> list[Any]:
    """`devices`, the CPU case only where the fused kernel runs on CPU tensors: in Triton's
    interpreter (TRITON_INTERPRET=1, which conftest.py sets where there is no GPU)."""
    cpu, cuda = devices()
    reason = "the fused kernel takes CPU tensors only in Triton's interpreter"
    return [pytest.param(cpu, marks=pytest.mark.skipif(not INTERPRETED, reason=reason)), cuda]


@pytest.fixture(scope="module", params=kernel_devices())
def outcomes(request: pytest.FixtureRequest) -> tuple[list[dict[str, Any]], bool]:
    """Every two-rank case of a device in one spawn, then the one-rank resume."""
    device = request.param
    with tempfile.TemporaryDirectory() as folder:
        results = run_ranks(two_rank_body, folder, device=device)
        resumed = run_ranks(one_rank_resume, folder, device=device, world_size=1)[0]
    return results, resumed


def test_sharded_and_replicated_dtensor_parameters_step_as_one_process(outcomes) -> None:
    results, _ = outcomes
    for rank, outcome in enumerate(results):
        cases = {k: v for k, v in outcome.items() if "/" in k and k.split("/")[0] in OPTIMIZERS}
        assert len(cases) == len(OPTIMIZERS) * 5, cases
        assert all(cases.values()), (rank, cases)


def test_the_fused_kernel_names_the_shards_it_cannot_update(outcomes) -> None:
    results, _ = outcomes
    assert [outcome["refusals"] for outcome in results] == [True, True]


def test_a_compiled_step_over_shards_runs_eagerly_with_the_same_bits(outcomes) -> None:
    results, _ = outcomes
    assert [outcome["compiled"] for outcome in results] == [True, True]


def test_fsdp2_training_equals_the_single_process_run(outcomes) -> None:
    results, _ = outcomes
    for outcome in results:
        cases = {k: v for k, v in outcome.items() if k.startswith("fsdp/")}
        assert len(cases) == len(OPTIMIZERS) * 2 and all(cases.values()), cases


def test_ddp_replicas_stay_bit_identical(outcomes) -> None:
    results, _ = outcomes
    first, second = (outcome["ddp"] for outcome in results)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    # the ranks trained on different batches: the replicas agree because they average
    # the same gradients and draw the same words, not because nothing moved
    assert not torch.equal(first[0], bits(build_model("cpu")[0].weight))


def test_dcp_checkpoints_resume_bit_exactly_on_two_ranks_and_on_one(outcomes) -> None:
    results, resumed_on_one = outcomes
    for outcome in results:
        assert outcome["checkpoint/continued"] and outcome["checkpoint/resumed_2_to_2"]
    assert resumed_on_one
