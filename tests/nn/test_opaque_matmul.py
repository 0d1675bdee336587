"""`QuantizedLinear` under torch.compile as two opaque ops (`stochround.nn.opaque_matmul`);
their bits against eager are tested with the layer's compiled step (tests/nn/test_linear.py)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from helpers import cuda_route, graphed_route
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import stochround.nn as srnn
from stochround.nn import linear, opaque_matmul, step_graphs, streams
from stochround.nn.linear import COMPILES
from stochround.nn.matmul import QuantizedMatmul


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


def test_warm_up_lays_its_zeros_out_as_the_fake_tensors() -> None:
    """A strided fake gets strided zeros (the op's route depends on x's layout: a strided
    x has no two-orientation pair, and the forward's fake declares what the op keeps from
    the warm-up's run)."""
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.ones(4, 6)[:, 1:5])
        y = mode.from_tensor(torch.ones(3, 5).T)
        got = opaque_matmul.warm_up(lambda *args: args, (x, y))
    assert [(t.shape, t.stride()) for t in got] == [((4, 4), (6, 1)), ((5, 3), (1, 5))]
    assert not any(isinstance(t, FakeTensor) or t.any() for t in got)


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


def test_a_plans_key_is_the_same_in_every_process() -> None:
    """A compiled graph holds the plan's key, and inductor's on-disk cache keys the graph by
    it: an index in the order of registration had named another recipe's plan in another
    process, whose kept operands the cached graph then expected."""
    code = (
        "import stochround.nn as s; "
        "print(s.QuantizedLinear(64, 64, recipe=s.nvfp4(seed=3)).plan_index, "
        "s.QuantizedLinear(64, 64, recipe=s.fp8()).plan_index)"
    )
    printed = set()
    for hash_seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=environment
        )
        printed.add(run.stdout)
    # fp8 first here: the order of registration does not matter
    fp8 = srnn.QuantizedLinear(64, 64, recipe=srnn.fp8()).plan_index
    nvfp4 = srnn.QuantizedLinear(64, 64, recipe=srnn.nvfp4(seed=3)).plan_index
    assert printed == {f"{nvfp4} {fp8}\n"}


def test_no_op_mutates_an_optional_or_defaulted_argument() -> None:
    """Every stochround op's mutated arguments are required tensors or tensor lists (never
    optional, never defaulted), and the shared backward
    op mutates nothing: torch 2.11 bumps a mutated argument's version by its position in
    the arguments as called, without filling defaults, so a defaulted mutated argument left
    out had broken every compiled layer's backward (IndexError); a delayed layer's buffers
    go to its own ops (`quantized_linear_delayed`, `quantized_linear_delayed_backward`)."""
    # every module that registers a stochround op (the kernels' where Triton is there), so
    # that the set does not depend on the tests that ran before in this process
    if importlib.util.find_spec("triton") is not None:
        for module in ("stochround.kernels.optim", "stochround.kernels.gaussws"):
            importlib.import_module(module)
    mutated = {}
    for name in torch.ops.stochround:
        for overload in getattr(torch.ops.stochround, name).overloads():
            schema = getattr(getattr(torch.ops.stochround, name), overload)._schema
            written = [
                arg for arg in schema.arguments if arg.alias_info and arg.alias_info.is_write
            ]
            for arg in written:
                # a required tensor or list of tensors (the fused optimizer step's states)
                assert isinstance(arg.type, (torch.TensorType, torch.ListType)), (name, arg)
                assert not arg.has_default_value(), (name, arg)
            mutated[name] = [arg.name for arg in written]
    assert mutated["quantized_linear_backward"] == []
    assert mutated["quantized_linear"] == []
    assert mutated["quantized_linear_delayed"] == ["amaxes", "steps"]
    assert mutated["quantized_linear_delayed_backward"] == ["amaxes", "steps"]


def graphed_steps(
    name: str, route: bool, needs: tuple[bool, bool], step: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Tensor], list[tuple[Tensor | None, ...]]]:
    """y, dx, dW and db of two steps of a 64 x 128 layer (40 tokens: wgrad pads them; 48
    for "fp8_native", `fp8(native=True)`, whose GEMMs take multiples of 16) by ``step``:
    "eager" (`QuantizedMatmul`, as where the step graphs do not serve it), "graphed"
    (`GraphedMatmul`, keeping nothing, as where they serve it) or "graphed_kept"
    (`GraphedMatmul` keeping the backward's operands, as a compiled step traced without
    the step graphs), x and W requiring a gradient as ``needs`` says;
    and each step's saved tensors past x, W and the column."""
    device, context = cuda_route(route)
    torch.manual_seed(0)
    native = name == "fp8_native"
    recipe = srnn.fp8(seed=4, native=True) if native else srnn.RECIPES[name](seed=4)
    layer = srnn.QuantizedLinear.from_linear(torch.nn.Linear(64, 128).to(device), recipe)
    tokens = 48 if native else 40
    layer.weight.requires_grad_(needs[1])
    generator = torch.Generator().manual_seed(1)
    results: list[Tensor] = []
    saved: list[tuple[Tensor | None, ...]] = []
    with monkeypatch.context() as patched:
        if step == "eager":  # QuantizedMatmul, where a GPU's step graphs would serve it
            patched.setattr(linear, "graphed_step", lambda *args: False)
        else:
            graphed_route(patched, keep=step == "graphed_kept")
        if native and not torch.cuda.is_available():  # the CPU's _scaled_mm takes float8
            patched.setattr(linear, "check_native", lambda x: None)
        with context:
            for _ in range(2):
                x = torch.randn(tokens, 64, generator=generator).to(device)
                x.requires_grad_(needs[0])
                layer.weight.grad = layer.bias.grad = None  # type: ignore[union-attr]
                y = layer(x)
                saved.append(tuple(y.grad_fn.saved_tensors[3:]))  # type: ignore[union-attr]
                y.backward(torch.randn(tokens, 128, generator=generator).to(device))
                grads = (x.grad, layer.weight.grad, layer.bias.grad)  # type: ignore[union-attr]
                results += [y.detach(), *(g for g in grads if g is not None)]
    return results, saved


# (recipe, CUDA route, (x, W) requiring a gradient) of the graphed steps' tests
GRAPHED_CASES = [
    *((name, route, (True, True)) for name in ("nvfp4", "fp8", "mxfp8") for route in (0, 1)),
    ("mxfp4_tseng", 1, (True, True)),
    ("int8", 1, (True, True)),
    ("nvfp4", 1, (False, True)),
    ("nvfp4", 1, (True, False)),
    ("fp8", 1, (False, True)),
    ("fp8", 1, (True, False)),
    ("fp8_native", 1, (True, True)),  # float8 codes kept
]


@pytest.mark.parametrize(("name", "route", "needs"), GRAPHED_CASES)
def test_a_graphed_step_told_to_keep_keeps_the_eager_forwards_operands_and_gives_its_bits(
    name: str, route: int, needs: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward op told to keep (a compiled step traced where the step graphs will not
    serve it, `keeps_operands`; graphed at run time or not) keeps what the eager forward
    saves for the GEMMs the backward will run (Q(W) where dgrad reuses it, x's wgrad
    operand where wgrad runs: x's pair on the CUDA route, per-tensor Q(x)^T), contiguous at
    the start of a storage of their own (the step graphs serve contiguous tensors alone;
    Inductor's CUDA code asserts an op output's 16-byte alignment, which a view into a
    larger buffer can miss), and the backward op, reading them, gives the eager step's y,
    dx, dW and db bit for bit."""
    got, kept = graphed_steps(name, bool(route), needs, "graphed_kept", monkeypatch)
    want, eager_kept = graphed_steps(name, bool(route), needs, "eager", monkeypatch)
    for mine, theirs in zip(got, want, strict=True):
        assert torch.equal(mine, theirs)
    for step, eager_step in zip(kept, eager_kept, strict=True):
        weight, x_t = step[:2], step[2:]
        eager_weight = eager_step[:2] if needs[0] else (None, None)
        for mine, theirs in zip((*weight, *x_t), (*eager_weight, *eager_step[2:]), strict=True):
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert mine.is_contiguous() and mine.storage_offset() == 0
                assert torch.equal(mine, theirs)
    if name in ("nvfp4", "fp8", "fp8_native") and route and needs[1]:
        assert kept[0][2] is not None  # x's wgrad operand kept
    if name == "nvfp4" and needs[0]:
        assert kept[0][0] is not None  # Q(W), 16 x 16 tiles


@pytest.mark.parametrize(("name", "route", "needs"), GRAPHED_CASES)
def test_a_graphed_step_keeps_nothing_and_gives_the_eager_steps_bits(
    name: str, route: int, needs: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eager step the step graphs serve keeps nothing for its backward (a kept operand
    would be one more graph output to copy out at each replay, `keeps_operands`): its
    backward quantizes x^T and W again, and gives the eager step's y, dx, dW and db bit for
    bit (the step of main before the twelfth session's keeping)."""
    got, kept = graphed_steps(name, bool(route), needs, "graphed", monkeypatch)
    want, _ = graphed_steps(name, bool(route), needs, "eager", monkeypatch)
    for mine, theirs in zip(got, want, strict=True):
        assert torch.equal(mine, theirs)
    assert all(each is None for step in kept for each in step)


def test_the_kept_weights_factor_is_the_eager_forwards() -> None:
    """The backward op reads a kept Q(W) with `kept_factor`, which the eager backward takes
    from its forward's operand."""
    for name, recipe in srnn.RECIPES.items():
        layer = srnn.QuantizedLinear(128, 128, recipe=recipe())
        ctx = opaque_matmul._Saved(layer.plan)
        ctx.factor = None  # type: ignore[assignment]
        x, weight = torch.randn(64, 128), layer.weight.detach()
        column = layer.offsets_column(layer.step)
        QuantizedMatmul.forward(ctx, x, weight, None, column, layer.plan, True, True)
        if ctx.saved_tensors[3] is not None:  # Q(W) kept
            assert ctx.factor == opaque_matmul.kept_factor(layer.plan), name


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")  # a GPU's step then keeps (`keeps_operands`)
@pytest.mark.parametrize("name", ["nvfp4", "fp8"])
def test_a_compiled_layer_with_dynamic_tokens_keeps_its_operands_and_gives_eagers_bits(
    name: str,
) -> None:
    """torch.compile(dynamic=True): the tokens symbolic in the forward op's fake, x's kept
    wgrad operand padded to the token multiple symbolically (`kept_layouts`); three token
    counts, one graph, eager's bits (on the CUDA route: x's pair kept)."""
    torch._dynamo.reset()
    device, context = cuda_route()
    torch.manual_seed(0)
    reference = torch.nn.Linear(64, 64).to(device)
    eager = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), srnn.RECIPES[name](seed=2))
    compiled_layer = srnn.QuantizedLinear.from_linear(
        copy.deepcopy(reference), srnn.RECIPES[name](seed=2)
    )
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(compiled_layer, backend=counter, fullgraph=True, dynamic=True)
    with context:
        for tokens in (20, 36, 52):
            generator = torch.Generator().manual_seed(tokens)
            x = torch.randn(tokens, 64, generator=generator).to(device)
            grad = torch.randn(tokens, 64, generator=generator).to(device)
            results = []
            for model in (compiled, eager):
                xs = x.clone().requires_grad_()
                y = model(xs)
                y.backward(grad)
                results.append((y, xs.grad))
            for mine, theirs in zip(*results, strict=True):
                assert torch.equal(mine, theirs), tokens
    assert counter.frame_count == 1
    for a, b in zip(eager.parameters(), compiled_layer.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # type: ignore[arg-type]


def test_a_compiled_step_keeps_its_operands_only_where_the_step_graphs_will_not_serve_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`keeps_operands`, asked while torch.compile traces (fake CUDA tensors here, no GPU
    needed: it reads no stream): nothing kept where the step graphs serve the step (its
    kept operands would be graph outputs more to copy out at each replay); kept with the
    graphs off, for CPU tensors, above the work bound, for a strided x; a host-bound plan
    (FP8 tensor-core GEMMs) is graphed above the bound too, and keeps nothing there."""
    plan = srnn.QuantizedLinear(64, 128, recipe=srnn.nvfp4()).plan
    native = plan._replace(native=True)
    above = step_graphs.GRAPHED_MAX_WORK // (64 * 128) + 1  # tokens past the bound
    with FakeTensorMode():
        x, weight = torch.empty(40, 64, device="cuda"), torch.empty(128, 64, device="cuda")
        big = torch.empty(above, 64, device="cuda")
        strided = torch.empty(64, 40, device="cuda").T
        on_the_cpu = torch.empty(40, 64), torch.empty(128, 64)
        monkeypatch.setattr(step_graphs.STEP_GRAPHS, "enabled", True)
        assert not opaque_matmul.keeps_operands(x, weight, plan)
        assert not opaque_matmul.keeps_operands(big, weight, native)
        assert opaque_matmul.keeps_operands(big, weight, plan)
        assert opaque_matmul.keeps_operands(strided, weight, plan)
        assert opaque_matmul.keeps_operands(*on_the_cpu, plan)
        monkeypatch.setattr(step_graphs.STEP_GRAPHS, "enabled", False)
        assert opaque_matmul.keeps_operands(x, weight, plan)
        assert opaque_matmul.keeps_operands(big, weight, native)


# how a compiled step's trace decides to keep and whether the step graphs are on at run
# time: (keep forced at trace time or None for `keeps_operands`'s, step graphs on)
KEEPING = {
    "graphs_on": (None, True),  # a GPU's step keeps nothing, graphed; a CPU's keeps
    "graphs_off": (None, False),  # kept, run as they are
    "kept_then_graphed": (True, True),  # the trace kept, the run graphed (on a GPU)
    "unkept_then_eager": (False, False),  # the trace kept nothing, the run not graphed
}


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize("setting", list(KEEPING))
def test_a_compiled_step_gives_eagers_bits_whether_its_trace_kept_the_operands_or_not(
    setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor, fullgraph, nvfp4() on the CUDA route (a GPU, or the interpreter), three
    steps (on a GPU: run, captured, replayed): the forward op keeps Q(W) and x's wgrad
    operand as the layer decided while it was traced (`keeps_operands`, or forced), the
    backward op receives them or quantizes x^T and W again, and y, dx, dW and db equal the
    eager step's bit for bit either way, with the step graphs serving the run or not."""
    forced, graphs_on = KEEPING[setting]
    gpu = torch.cuda.is_available()
    keep = (not gpu or not graphs_on) if forced is None else forced
    torch._dynamo.reset()
    device, context = cuda_route()
    torch.manual_seed(0)
    reference = torch.nn.Linear(64, 64).to(device)
    eager = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), srnn.nvfp4(seed=2))
    compiled_layer = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), srnn.nvfp4(seed=2))
    compiled = torch.compile(compiled_layer, backend="inductor", fullgraph=True)
    forwards: set[tuple[bool, bool]] = set()
    backwards: set[tuple[bool, bool]] = set()
    forward_step, backward_step = opaque_matmul.forward_step, opaque_matmul.backward_step

    compiled_runs = [False]  # the spies record the compiled step's ops (a GPU's eager
    # step the step graphs serve calls the same functions, keeping nothing)

    def spied_forward(*args: object) -> object:
        if compiled_runs[0]:
            forwards.add(args[-2:])  # type: ignore[arg-type]
        return forward_step(*args)  # type: ignore[arg-type]

    def spied_backward(*args: object) -> object:
        if compiled_runs[0]:  # Q(W), x's wgrad operand
            backwards.add((args[4] is not None, args[6] is not None))
        return backward_step(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(opaque_matmul, "forward_step", spied_forward)
    monkeypatch.setattr(opaque_matmul, "backward_step", spied_backward)
    if forced is not None:
        monkeypatch.setattr(linear, "keeps_operands", lambda *args: forced)
    previous = step_graphs.use_step_graphs(graphs_on)
    compiled_replays = 0
    try:
        with context:
            for step in range(3):
                generator = torch.Generator().manual_seed(step)
                x = torch.randn(40, 64, generator=generator).to(device)
                grad = torch.randn(40, 64, generator=generator).to(device)
                compiled_runs[0], before = True, step_graphs.STEP_GRAPHS.replays
                got = one_step(compiled, x, grad)
                compiled_runs[0] = False
                compiled_replays += step_graphs.STEP_GRAPHS.replays - before
                want = one_step(eager, x, grad)
                for what, mine, theirs in zip(("y", "dx", "dW", "db"), got, want, strict=True):
                    assert torch.equal(mine, theirs), f"step {step}: {what}"
    finally:
        step_graphs.use_step_graphs(False)
        step_graphs.use_step_graphs(previous)
        torch._dynamo.reset()
    assert forwards == {(keep, keep)}
    assert backwards == {(keep, keep)}
    assert (compiled_replays > 0) == (gpu and graphs_on)


def one_step(layer: torch.nn.Module, x: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
    """(y, dx, dW, db) of one forward and backward with upstream gradient ``grad``."""
    inputs = x.clone().requires_grad_()
    layer.zero_grad()
    y = layer(inputs)
    y.backward(grad)
    gradients = (inputs.grad, layer.weight.grad, layer.bias.grad)
    return (y.detach(), *(each.clone() for each in gradients))  # type: ignore[union-attr]
