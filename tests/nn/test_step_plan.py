"""A `QuantizedLinear`'s eager step plans (`stochround.nn.step_plan`): made once per input
signature and reused, never reused for another signature, and giving the bits of the
per-call route."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from helpers import cuda_route
from torch import Tensor

import stochround.nn as srnn
from stochround.nn import linear
from stochround.nn.step_plan import StepPlan

# the eager route's own launches and operands: its steps without their CUDA graphs
pytestmark = pytest.mark.usefixtures("no_step_graphs")

SIZE = 64
GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


def route() -> contextlib.AbstractContextManager[None]:
    """The CUDA route's context (`helpers.cuda_route`): none on a GPU (DEVICE is CUDA),
    else `cpu_as_cuda` (the kernels in Triton's interpreter)."""
    return cuda_route()[1]


def layer_and_data(dtype: torch.dtype = torch.float32) -> tuple[srnn.QuantizedLinear, Tensor]:
    """An nvfp4() 64 x 64 layer with bias and 64 tokens of input (fixed values)."""
    torch.manual_seed(0)
    layer = srnn.QuantizedLinear.from_linear(torch.nn.Linear(SIZE, SIZE), srnn.nvfp4())
    x = torch.randn(SIZE, SIZE).to(DEVICE, dtype).requires_grad_()
    return layer.to(DEVICE), x


def step(layer: srnn.QuantizedLinear, x: Tensor) -> tuple[Tensor, ...]:
    """One forward and backward (a fixed upstream gradient): y, dx, dW, db."""
    layer.weight.grad = layer.bias.grad = x.grad = None
    y = layer(x)
    y.backward(torch.ones_like(y))
    assert x.grad is not None and layer.weight.grad is not None and layer.bias.grad is not None
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def test_a_second_step_builds_nothing_and_a_new_shape_builds_a_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[StepPlan] = []
    original = linear.make_step_plan

    def spy(*args: object) -> StepPlan:
        built.append(original(*args))  # type: ignore[arg-type]
        return built[-1]

    monkeypatch.setattr(linear, "make_step_plan", spy)
    layer, x = layer_and_data()
    with route():
        step(layer, x)
        assert len(built) == 1
        plan = built[0]
        gemms = dict(plan.gemms)
        assert sorted(gemms) == ["dgrad", "fprop", "wgrad"]  # each GEMM prepared at its call
        assert plan.input_pair is not None and plan.grad_pair is not None
        step(layer, x)
        assert len(built) == 1  # the second step builds nothing
        assert list(layer.step_plans.values()) == [plan] and plan.gemms == gemms
        assert all(plan.gemms[name] is gemms[name] for name in gemms)
        longer = torch.randn(2 * SIZE, SIZE, device=DEVICE).requires_grad_()
        step(layer, longer)
        assert len(built) == 2 and built[1].tokens == 2 * SIZE  # a new shape: a new plan
        with torch.no_grad():
            layer(x)  # fprop alone: another signature
        assert len(built) == 3 and built[2].signature.gemms == ("fprop",)
    assert len(layer.step_plans) == 3
    assert len(copy.deepcopy(layer).step_plans) == 0  # a copy makes its own
    layer.set_recipe(srnn.nvfp4(seed=1))
    assert len(layer.step_plans) == 0  # a new recipe: the plans of the old one dropped


def test_a_changed_input_dtype_does_not_reuse_the_plan_of_another() -> None:
    """A bf16 step after an fp32 step of the same shape gives a fresh layer's bf16 step
    bits (the fp32 plan's prepared pair and GEMMs would read and write fp32)."""
    stale, x = layer_and_data()
    fresh, _ = layer_and_data()
    x_bf16 = x.detach().to(torch.bfloat16).requires_grad_()
    with route():
        step(stale, x)
        step(fresh, x_bf16)  # the same step count before the compared steps
        expected = step(fresh, x_bf16)
        got = step(stale, x_bf16)
    assert len(stale.step_plans) == 2
    for value, other in zip(got, expected, strict=True):
        assert value.dtype == other.dtype
        assert torch.equal(value.view(torch.int16), other.view(torch.int16))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8", "mxfp4_tseng", "int8", "fp8"])
def test_the_planned_step_equals_the_per_call_route(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two steps on the CUDA route by the step plans give the bits of the per-call route
    (`QuantizedMatmul` given no step plan, as a traced call runs it)."""

    def steps(planned: bool) -> list[tuple[Tensor, ...]]:
        torch.manual_seed(0)
        dense = torch.nn.Linear(SIZE, SIZE)
        layer = srnn.QuantizedLinear.from_linear(dense, srnn.RECIPES[name]()).to(DEVICE)
        x = torch.randn(SIZE, SIZE).to(DEVICE).requires_grad_()
        with monkeypatch.context() as patch, route():
            if not planned:  # every call prepares nothing: the per-call route
                patch.setattr(layer, "prepare_step", lambda *args: None)
            return [step(layer, x) for _ in range(2)]

    for got, expected in zip(steps(True), steps(False), strict=True):
        for value, other in zip(got, expected, strict=True):
            assert torch.equal(value.view(torch.int32), other.view(torch.int32))
