"""Activation checkpointing: a model whose blocks torch.utils.checkpoint (non-reentrant and
reentrant), checkpoint_wrapper or torchtitan's full and selective AC recompute trains as
the same model without it, bit for bit — loss, gradients and step buffers — for the
quantized recipes and GaussWS (`stochround.nn.recompute`)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import typing
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import checkpoint

import stochround.nn as srnn
from stochround.kernels import availability
from stochround.nn.linear import COMPILES
from stochround.nn.recompute import read_step

WIDTH = 64  # a multiple of 64: mxfp4_tseng's RHT-64 takes the features in 64s
TOKENS = 32
STEPS = 3
# The compiled runs train two steps: their time is Inductor's compiles and, on the CUDA
# route without a GPU, each step's launches in Triton's interpreter (some 70 for mxfp8).
COMPILED_STEPS = 2


def titan_ac_policies() -> bool:
    """Whether torchtitan's AC policy classes (``FullAC``, ``SelectiveAC``: torchtitan >=
    0.3.0; 0.2.2 on torch < 2.13 applies AC through a function instead) import."""
    if importlib.util.find_spec("torchtitan") is None:
        return False
    from torchtitan.distributed import activation_checkpoint

    return hasattr(activation_checkpoint, "FullAC")


TITAN = titan_ac_policies()
NEEDS_TITAN_AC = pytest.mark.skipif(not TITAN, reason="no torchtitan >= 0.3.0")


class Blocks(nn.Module):
    """Two blocks of Linear, GELU, Linear, each run through ``wrap`` (the checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.layers = nn.ModuleList()
        for _ in range(2):
            block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
            for parameter in block.parameters():
                with torch.no_grad():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) / 8)
            self.layers.append(block)
        self.wrap: Callable[[nn.Module, Tensor], Tensor] = lambda block, x: block(x)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.layers:
            x = self.wrap(block, x)
        return x


def quantized(name: str) -> Blocks:
    """The model with every linear quantized by the recipe ``name``, or sampled by GaussWS
    ("gaussws"), or both ("nvfp4+gaussws")."""
    model = Blocks()
    if name != "gaussws":
        srnn.quantize_(model, srnn.RECIPES[name.split("+")[0]](seed=3))
    if "gaussws" in name:
        srnn.gaussws_(model, "e2m1", block=16, seed=5)
    return model


def checkpointed(model: Blocks, mode: str) -> Blocks:
    """``model`` with each block checkpointed as ``mode`` says."""
    if mode == "non_reentrant" or mode == "reentrant":
        reentrant = mode == "reentrant"
        model.wrap = lambda block, x: checkpoint(block, x, use_reentrant=reentrant)
    elif mode == "wrapper" or mode == "wrapper_reentrant":
        impl = CheckpointImpl.REENTRANT if mode == "wrapper_reentrant" else None
        for index, block in enumerate(model.layers):
            kwargs = {} if impl is None else {"checkpoint_impl": impl}
            model.layers[index] = checkpoint_wrapper(block, **kwargs)
    elif mode in ("titan_full", "titan_selective"):
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

        policy = (
            FullAC(FullAC.Config()) if mode == "titan_full" else SelectiveAC(SelectiveAC.Config())
        )
        policy.apply(model)
    else:
        assert mode == "none"
    return model


def train(
    model: Blocks,
    run: Callable[[Blocks, Tensor], Tensor] | None = None,
    device: str | torch.device = "cpu",
    steps: int = STEPS,
) -> list[Tensor]:
    """``steps`` SGD steps on fixed batches (on ``device``, the model's); every step's loss,
    gradients and step buffers."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(1)
    seen: list[Tensor] = []
    for _ in range(steps):
        x = torch.randn(2, TOKENS // 2, WIDTH, generator=generator).to(device).requires_grad_()
        optimizer.zero_grad()
        loss = (model(x) if run is None else run(model, x)).square().mean()
        loss.backward()
        seen.append(loss.detach().clone())
        seen.append(x.grad.clone())  # type: ignore[union-attr]
        seen += [parameter.grad.clone() for parameter in model.parameters()]  # type: ignore[union-attr]
        seen += [buffer.clone() for buffer in model.buffers()]
        optimizer.step()
    return seen


def assert_same(got: list[Tensor], expected: list[Tensor]) -> None:
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), f"tensor {index}"


MODES = [
    "non_reentrant",
    "reentrant",
    "wrapper",
    "wrapper_reentrant",
    pytest.param("titan_full", marks=NEEDS_TITAN_AC),
    pytest.param("titan_selective", marks=NEEDS_TITAN_AC),
]
NAMES = ["nvfp4", "mxfp4_tseng", "int8", "fp8", "gaussws", "nvfp4+gaussws"]


@functools.cache
def reference(name: str) -> tuple[Tensor, ...]:
    """The run without checkpointing."""
    return tuple(train(quantized(name)))


# every checkpoint for nvfp4 and GaussWS (the step's two readers); the other recipes under
# torch's two checkpoints (the same mechanism, their own draws)
def case(name: str, mode: object) -> object:
    """A (name, mode) case, keeping a mode's marks (torchtitan's modes need torchtitan)."""
    if isinstance(mode, str):
        return (name, mode)
    return pytest.param(name, *mode.values, marks=mode.marks)  # type: ignore[attr-defined]


CASES = [case(name, mode) for name in ("nvfp4", "gaussws") for mode in MODES] + [
    (name, mode) for name in NAMES if name not in ("nvfp4", "gaussws")
    for mode in ("non_reentrant", "reentrant")
]  # fmt: skip


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_checkpointed_training_equals_the_plain_run_bit_for_bit(name: str, mode: str) -> None:
    """Each checkpointed run gives the plain run's losses, gradients (of x and of every
    parameter) and step buffers at each of three steps: the recomputation reads the step
    its forward read and does not advance the counter (before: it drew the next step's
    words, so dW and dx came from other operands than y, and the counter skipped a step)."""
    got = train(checkpointed(quantized(name), mode))
    assert_same(got, list(reference(name)))
    model = checkpointed(quantized(name), mode)
    train(model)
    assert {int(buffer) for buffer in model.buffers()} == {STEPS}


def test_micro_batches_recompute_in_their_order() -> None:
    """Two micro-batches' forwards, then their backwards in the same order (a pipeline
    schedule's): each recomputation reads its own forward's step."""

    def two_micro_batches(model: Blocks, x: Tensor) -> Tensor:
        first, second = model(x[:1]), model(x[1:])
        (first.square().mean() / 2).backward()
        return second / 2**0.5  # the caller's loss: the second half's

    plain = train(quantized("nvfp4"), two_micro_batches)
    got = train(checkpointed(quantized("nvfp4"), "non_reentrant"), two_micro_batches)
    assert_same(got, plain)


def test_nested_checkpoints_recompute_from_the_forwards_step() -> None:
    """A checkpointed region inside another: the outer recomputation replays the inner
    forward, and the inner region recomputes later, both from the forward's step."""
    plain = train(quantized("mxfp4_tseng"))
    model = checkpointed(quantized("mxfp4_tseng"), "non_reentrant")
    inner = model.wrap
    model.wrap = lambda block, x: checkpoint(inner, block, x, use_reentrant=False)
    assert_same(train(model), plain)


def test_a_recomputation_without_a_kept_step_raises() -> None:
    """A forward run inside a backward that no torch checkpoint recorded (another
    checkpoint implementation) raises instead of drawing the next step's words."""
    layer = srnn.QuantizedLinear(WIDTH, WIDTH, recipe=srnn.int8())
    x = torch.randn(4, WIDTH, requires_grad=True)

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: object, grad: Tensor) -> Tensor:
            with torch.enable_grad():
                layer(x.detach())
            return grad

    with pytest.raises(RuntimeError, match="no step kept for it"):
        Recompute.apply(x).sum().backward()


def test_no_grad_forwards_keep_no_step() -> None:
    """Under no_grad, in a checkpointed region or not, the step neither advances nor is
    kept (a reentrant checkpoint applied under no_grad has no backward to recompute it)."""
    model = quantized("int8")
    with torch.no_grad():
        for mode in ("non_reentrant", "reentrant"):
            checkpointed(model, mode)(torch.randn(TOKENS, WIDTH))
    layers = [each for each in model.modules() if isinstance(each, srnn.QuantizedLinear)]
    assert all(int(each.step) == 0 and not each.step_reads for each in layers)
    counter = torch.zeros((), dtype=torch.int64)
    with torch.no_grad():
        assert read_step(counter, layers[0].step_reads) is None


class Checkpointed(nn.Module):
    """``block`` run through ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        return typing.cast(Tensor, checkpoint(self.block, x, use_reentrant=False))


def compiled_run(name: str, mode: str, route: bool = False) -> list[Tensor]:
    """The run (`COMPILED_STEPS` steps) of the blocks checkpointed as ``mode`` says
    ("none", "non_reentrant": the block's call wrapped in torch's checkpoint, "wrapper":
    ``checkpoint_wrapper``), then each compiled with inductor (torchtitan's order: AC, then
    compile); on the CUDA route (``route``: a GPU's CUDA tensors where there is one, else
    CPU tensors under `cpu_as_cuda`, the kernels in Triton's interpreter)."""
    torch._dynamo.reset()
    on_gpu = route and torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    model = quantized(name).to(device)
    for index, block in enumerate(model.layers):
        wrapped: nn.Module = block
        if mode == "non_reentrant":
            wrapped = Checkpointed(block)
        elif mode == "wrapper":
            wrapped = checkpoint_wrapper(block)
        model.layers[index] = torch.compile(wrapped, backend="inductor", fullgraph=True)
    interpreted = route and not on_gpu
    with availability.cpu_as_cuda() if interpreted else contextlib.nullcontext():
        seen = train(model, device=device, steps=COMPILED_STEPS)
    # dynamo's caches of checkpointed code would otherwise meet later tests' compiles
    torch._dynamo.reset()
    return seen


@functools.cache
def compiled_reference(name: str, route: bool = False) -> tuple[Tensor, ...]:
    """The compiled run without checkpointing."""
    return tuple(compiled_run(name, "none", route))


# the CPU path, and the CUDA route (CUDA on a GPU, else `cpu_as_cuda`)
ROUTES = [pytest.param(False, id="cpu"), pytest.param(True, id="cuda_route")]


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize("route", ROUTES)
def test_compiled_checkpointing_of_a_round_to_nearest_recipe_changes_no_bit(route: bool) -> None:
    """mxfp8() draws no random bits: its compiled checkpointed blocks give the bits of the
    compiled blocks without checkpointing (inductor recomputes the forward's ops alike)."""
    got = compiled_run("mxfp8", "wrapper", route)
    assert_same(got, list(compiled_reference("mxfp8", route)))


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("name", "mode"),
    [("nvfp4", "non_reentrant"), ("nvfp4", "wrapper"), ("mxfp4_tseng", "wrapper"),
     ("int8", "non_reentrant"), ("gaussws", "wrapper")],
)  # fmt: skip
def test_compiled_checkpointing_of_an_sr_recipe_changes_no_bit(
    name: str, mode: str, route: bool
) -> None:
    """Recipes that draw random bits (SR gradients; mxfp4_tseng's per-step RHT signs; GaussWS's
    samples), checkpointed by torch's checkpoint or ``checkpoint_wrapper`` and compiled,
    give the compiled blocks' bits without checkpointing — losses, gradients, step buffers
    at each of two steps — with no policy passed: the step read is saved for the
    backward (`stochround.nn.step_ops.save_the_step_read`).  Before, the compiled backward
    recomputed it from the buffer the forward had advanced and drew the next step's words.
    On the CUDA route as well (CUDA, or `cpu_as_cuda`): a graph break there (a kernel
    launched in the trace) made the recomputation read another step (int8's dW differed).
    On torch 2.11 the plain region's nodes are tagged without the mode that rule hooks: the
    read's own selective checkpoint saves it there (`step_ops.advance_step_traced`; before,
    nvfp4, int8 and mxfp4_tseng differed from the first step's x.grad on).

    GaussWS on a GPU: its layers' GEMMs are inductor's fp32 ``addmm`` of the sampled weight
    (not an exact quantized product), and the two compiled graphs may lower them differently
    (cuBLAS's bias epilogue or a separate add; found on an H200: step 0's loss differed in
    its last bit, in some runs only).  There the step buffers must be equal and the floats
    within `GEMM_LOWERING_BOUND`, far below what a recomputation reading another step's
    samples gives (a sample's noise is some 2^-3 of its block's scale)."""
    got, expected = compiled_run(name, mode, route), list(compiled_reference(name, route))
    if name == "gaussws" and route and torch.cuda.is_available():
        assert_close_to_lowering(got, expected)
    else:
        assert_same(got, expected)


# relative bound between two inductor lowerings of the same fp32 addmm chain (two steps of
# two blocks): a few fp32 ulps, grown through two SGD steps
GEMM_LOWERING_BOUND = 2.0**-16


def assert_close_to_lowering(got: list[Tensor], expected: list[Tensor]) -> None:
    """Integer tensors (step buffers) equal, floats within `GEMM_LOWERING_BOUND` of their
    reference's largest magnitude."""
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine.dtype == theirs.dtype, f"tensor {index}"
        if not theirs.is_floating_point():
            assert torch.equal(mine, theirs), f"tensor {index}"
            continue
        scale = float(theirs.abs().max())
        difference = float((mine - theirs).abs().max())
        assert difference <= GEMM_LOWERING_BOUND * scale, f"tensor {index}: {difference}"


def traced_graphs(mode: str) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The forward and backward graphs into which inductor's partitioner (min-cut) splits
    the joint graph of one quantized layer checkpointed as ``mode`` says ("non_reentrant",
    "wrapper") and compiled, at its first training forward."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def partition(
        joint: torch.fx.GraphModule, inputs: object, **kwargs: object
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        forward, backward = min_cut_rematerialization_partition(joint, inputs, **kwargs)
        graphs.extend((forward, backward))
        return forward, backward

    def run(graph: torch.fx.GraphModule, inputs: object) -> object:
        return make_boxed_func(graph.forward)

    backend = aot_autograd(fw_compiler=run, bw_compiler=run, partition_fn=partition)
    torch._dynamo.reset()
    layer = srnn.QuantizedLinear(WIDTH, WIDTH, recipe=srnn.int8(seed=3))
    wrapped = Checkpointed(layer) if mode == "non_reentrant" else checkpoint_wrapper(layer)
    torch.compile(wrapped, backend=backend, fullgraph=True)(
        torch.randn(TOKENS, WIDTH, requires_grad=True)
    )
    torch._dynamo.reset()
    forward, backward = graphs
    return forward, backward


def step_reads(graph: torch.fx.GraphModule) -> int:
    """How many nodes of ``graph`` run the step read (`stochround::nn_advance_step`,
    functionalised: an ``auto_functionalized`` node naming it)."""
    op = torch.ops.stochround.nn_advance_step.default
    return sum(
        node.target is op or (bool(node.args) and node.args[0] is op)
        for node in graph.graph.nodes
        if node.op == "call_function"
    )


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize("mode", ["non_reentrant", "wrapper"])
def test_the_compiled_backward_of_a_checkpointed_layer_reads_no_step(mode: str) -> None:
    """Compiled in a plain checkpointed region, the step read runs once, in the forward
    graph, and the backward graph takes its saved value: it runs no step read of its own
    (before, on torch 2.11, whose plain compiled region tags every node "recompute"
    without entering the selective-checkpoint mode that `save_the_step_read` hooks, the
    backward ran it again on the buffer the forward had advanced: the next step's words)."""
    forward, backward = traced_graphs(mode)
    assert (step_reads(forward), step_reads(backward)) == (1, 0)
