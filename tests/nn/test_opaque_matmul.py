"""`QuantizedLinear` under torch.compile as two opaque ops (`stochround.nn.opaque_matmul`);
their bits against eager are tested with the layer's compiled step (tests/nn/test_linear.py)."""

from __future__ import annotations

import copy

import torch
from helpers import cuda_route
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import stochround.nn as srnn
from stochround.nn import opaque_matmul, streams


def test_warm_up_runs_on_real_zeros_of_the_fake_shapes() -> None:
    """The fake's warm-up calls the op's eager body on real tensors (not fake ones: made
    under the fake mode, the eager route's per-shape state would be fake too), zeros shaped
    and typed as the fake inputs, None kept."""
    seen: list[tuple[object, ...]] = []
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.ones(3, 4, dtype=torch.bfloat16))
        step = mode.from_tensor(torch.ones((), dtype=torch.int64))
        assert isinstance(x, FakeTensor)
        opaque_matmul.warm_up(lambda *args: seen.append(args), (x, None, step), 7)
    (real_x, none, real_step, rest) = seen[0]
    assert isinstance(real_x, Tensor) and not isinstance(real_x, FakeTensor)
    assert real_x.dtype == torch.bfloat16 and torch.equal(
        real_x, torch.zeros(3, 4, dtype=torch.bfloat16)
    )
    assert none is None and real_step.dtype == torch.int64 and rest == 7


def test_a_layer_registers_its_plan_and_each_recipe_change_a_new_index() -> None:
    """A layer's plan is registered without its layer number (the ops read it from the
    layer's streams column): layers of one recipe share an index, another recipe gets
    another."""
    layer = srnn.QuantizedLinear(32, 32, recipe=srnn.nvfp4())
    first = layer.plan_index
    assert opaque_matmul.registered_plan(first, -1) == layer.plan
    other = srnn.QuantizedLinear(32, 32, recipe=srnn.nvfp4(), layer_index=7)
    assert other.plan_index == first and other.plan.layer == 7
    layer.set_recipe(srnn.int8())
    assert (
        layer.plan_index != first
        and opaque_matmul.registered_plan(layer.plan_index, -1) == layer.plan
    )
    keyed = opaque_matmul.registered_plan(layer.plan_index, 1)
    assert keyed.seed != layer.plan.seed and keyed._replace(seed=layer.plan.seed) == layer.plan


def test_an_op_runs_by_one_step_plan_a_signature() -> None:
    """The ops resolve the eager step's choices once per signature, as a layer does: the
    same plan for a second call, another for another dtype or GEMM set; none under tensor
    parallelism (a rank's calls take the per-call route)."""
    layer = srnn.QuantizedLinear(64, 64, recipe=srnn.nvfp4())
    x, weight = torch.randn(32, 64), layer.weight.detach()
    index = layer.plan_index
    first = opaque_matmul.op_step_plan(index, -1, x, weight, None, ("fprop",))
    assert first is not None and first.plan == layer.plan
    assert opaque_matmul.op_step_plan(index, -1, x.clone(), weight, None, ("fprop",)) is first
    other = opaque_matmul.op_step_plan(index, -1, x.double(), weight, None, ("fprop",))
    assert other is not None and other is not first and other.signature.dtype == torch.float64
    backward = opaque_matmul.op_step_plan(index, -1, x, weight, None, ("dgrad", "wgrad"))
    assert backward is not first and backward.signature.gemms == ("dgrad", "wgrad")  # type: ignore[union-attr]
    assert opaque_matmul.op_step_plan(index, 1, x, weight, None, ("fprop",)) is None


def test_the_backward_ops_plan_pairs_dy_alone() -> None:
    """On the CUDA route the backward op's plan holds dy's two-orientation pair and no pair
    of x: x's pair writes fprop's operand with wgrad's, and the backward runs no fprop (a
    pair of x prepared there would be made and kept for nothing)."""
    device, route = cuda_route()
    layer = srnn.QuantizedLinear(64, 64, recipe=srnn.nvfp4(), dtype=torch.bfloat16).to(device)
    x, weight = torch.randn(32, 64, dtype=torch.bfloat16, device=device), layer.weight.detach()
    with route:
        plan = opaque_matmul.op_step_plan(layer.plan_index, -1, x, weight, None, ("dgrad", "wgrad"))
        eager = opaque_matmul.op_step_plan(
            layer.plan_index, -1, x, weight, None, ("fprop", "dgrad", "wgrad")
        )
    assert plan is not None and plan.grad_pair is not None and plan.input_pair is None
    assert eager is not None and eager.input_pair is not None


class Block(torch.nn.Module):
    """Two quantized linears around a ReLU: a model's block, compiled one at a time."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.relu(self.a(x)))


def test_blocks_compiled_one_at_a_time_share_one_graph_and_train_as_eager() -> None:
    """Ten blocks compiled each on its own (torchtitan's order), ``fullgraph=True``: one
    graph for all (the layers' numbers reach the ops as their `stream_bases` buffers, not
    as graph constants: before, each block recompiled and the ninth hit dynamo's limit),
    and the outputs and gradients are eager's bit for bit (each layer its own streams)."""
    torch.manual_seed(0)
    eager = torch.nn.ModuleList([Block(64) for _ in range(10)])
    srnn.quantize_(eager, srnn.nvfp4(seed=3))
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for index, block in enumerate(compiled):
        compiled[index] = torch.compile(block, fullgraph=True)
    x = torch.randn(32, 64)
    outputs = []
    for model in (eager, compiled):
        y = x.clone().requires_grad_()
        h = y
        for block in model:
            h = block(h)
        h.square().sum().backward()
        outputs.append([h, y.grad, *(p.grad for p in model.parameters())])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    for got, want in zip(outputs[1], outputs[0], strict=True):
        assert torch.equal(got, want)


def test_a_layer_built_on_meta_has_its_stream_bases_after_to_empty() -> None:
    """`stream_bases` (not a buffer: derived from the layer's number) follows the weight
    when the layer moves, here from ``meta`` by ``to_empty``."""
    layer = srnn.QuantizedLinear(64, 64, device="meta", recipe=srnn.nvfp4(), layer_index=5)
    layer.to_empty(device="cpu")
    assert torch.equal(layer.stream_bases, streams.layer_bases(5))
    assert "stream_bases" not in layer.state_dict() and layer.stream_bases.device.type == "cpu"


def test_moving_a_gaussws_layer_draws_no_sample() -> None:
    """`stream_bases` follows the stored weight when the layer moves: a parametrized weight
    (GaussWS) is not computed for its device, which would draw a sample and advance the
    sampler's step."""
    layer = srnn.QuantizedLinear(64, 64, recipe=srnn.nvfp4(), layer_index=2)
    srnn.gaussws_(layer, "e2m1", block=16, seed=5)
    steps = [buffer.clone() for buffer in layer.buffers()]
    layer.to(torch.float64).to(torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(steps, layer.buffers(), strict=True))
    assert torch.equal(layer.stream_bases, streams.layer_bases(2))
