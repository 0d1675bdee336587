"""Delayed tensor scales (`stochround.nn.amax_history`, ``tensor_scale="delayed"``): the
first step is current scaling's, a later step's operands are quantized with the previous
steps' amax given as the tensor scale, an amax that grows clips, the history resumes from
a state dict, a checkpoint's recomputation reads its forward's scale, evaluation records
nothing, the kernels' route (x's and dy's two orientations from one read) gives the spec's
bits, a compiled step (the opaque ops) gives eager's, and what is not built raises."""

from __future__ import annotations

import copy
import importlib
from typing import NamedTuple

import pytest
import torch
from helpers import assert_same_tensors, cuda_route, graphs_on_the_cpu
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

import stochround as sr
import stochround.nn as srnn
from stochround.blocks.scales import nvfp4_tensor_scales
from stochround.kernels import blocks as kernel_blocks
from stochround.kernels import two_orientation
from stochround.nn import (
    amax_history,
    delayed_ops,
    matmul,
    opaque_matmul,
    orientations,
    step_graphs,
)
from stochround.nn.amax_history import (
    EMPTY,
    AmaxHistory,
    HostRoute,
    empty_history,
    host_copy,
    host_step,
    operand_amax,
    record_amax,
    window_amax,
)
from stochround.nn.delayed_steps import BACKWARD_WRITES, FORWARD_WRITES
from stochround.nn.linear import COMPILES
from stochround.nn.operands import Operand, dequantized_operand, quantize_operand
from stochround.nn.step_ops import PLAIN_REGIONS_RUN_THE_MODE
from stochround.nn.streams import STEP_SHIFT

WIDTH = 64
TOKENS = 32


def model_of(tensor_scale: str, amax_history: int = 1) -> nn.Sequential:
    """Two quantized linears (both run all three GEMMs with an x that needs a gradient)."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / 8)
    recipe = srnn.nvfp4(seed=3, tensor_scale=tensor_scale, amax_history=amax_history)
    return srnn.quantize_(model, recipe)


def batches(count: int, growth: float = 1.0) -> list[Tensor]:
    """``count`` inputs, the k-th scaled by ``growth ** k``."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(TOKENS, WIDTH, generator=generator) * growth**k for k in range(count)]


def train(
    model: nn.Module, inputs: list[Tensor], eval_between: bool = False, histories: bool = True
) -> list[Tensor]:
    """A step per input (SGD): each step's output, x's gradient, the parameters' gradients
    and the buffers (the amax histories left out unless ``histories``); with
    ``eval_between``, a no-grad forward before each step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen: list[Tensor] = []
    for x in inputs:
        if eval_between:
            with torch.no_grad():
                model(x * 5)
        x = x.clone().requires_grad_()
        optimizer.zero_grad()
        y = model(x)
        y.square().mean().backward()
        # clones: a step captured as CUDA graphs overwrites its outputs at the next step
        seen += [y.detach().clone(), x.grad.clone()]  # type: ignore[union-attr]
        seen += [parameter.grad.clone() for parameter in model.parameters()]  # type: ignore[union-attr]
        for name, buffer in model.named_buffers():
            if histories or "amax_history" not in name:
                seen.append(buffer.clone())
        optimizer.step()
    return seen


def test_the_first_step_is_current_scaling_bit_for_bit() -> None:
    """No history yet: every role's scale comes from its current amax, as "amax"."""
    model = model_of("delayed")
    delayed = train(model, batches(1), histories=False)
    assert_same_tensors(delayed, train(model_of("amax"), batches(1)))
    layer = model[2]
    assert layer.amax_history is not None and layer.amax_history_steps is not None
    assert torch.equal(layer.amax_history_steps[:, 0], torch.tensor([0, 0, 0, EMPTY, 0, 0]))


def layer_step(layer: srnn.QuantizedLinear, x: Tensor) -> Tensor:
    """One training step of ``layer`` on ``x``: its output."""
    y = layer(x.clone().requires_grad_())
    y.square().mean().backward()
    return y.detach()


def test_a_later_step_quantizes_with_the_previous_amax_given_as_the_tensor_scale() -> None:
    """Step 1's fprop is the GEMM of x and W quantized by `stochround.blocks.gemm_operand`
    with step 0's amaxes given as the tensor scales (TE's pair from that amax), bit for bit;
    x grew, so it differs from current scaling."""
    layer = model_of("delayed")[0]
    first, second = batches(2, growth=3.0)
    layer_step(layer, first)
    got = layer_step(layer, second)
    weight = layer.weight.detach()
    x_scale = nvfp4_tensor_scales(first.abs().amax(), "te")
    w_scale = nvfp4_tensor_scales(weight.abs().amax(), "te")
    qx = sr.blocks.gemm_operand(second, "nvfp4", tensor_scale=x_scale)  # type: ignore[arg-type]
    qw = sr.blocks.gemm_operand(weight, "nvfp4", block=(16, 16), tensor_scale=w_scale)  # type: ignore[arg-type]
    expected = sr.blocks.scaled_mm(qx, qw, bias=layer.bias.detach(), out_dtype=torch.float32)
    assert torch.equal(got, expected)
    current = sr.blocks.gemm_operand(second, "nvfp4")
    assert not torch.equal(got, sr.blocks.scaled_mm(current, qw, bias=layer.bias.detach()))
    assert layer.amax_history is not None
    assert torch.equal(layer.amax_history[0, 1], second.abs().amax())  # step 1's, recorded


def test_an_amax_that_grows_clips_the_elements_beyond_the_previous_amax() -> None:
    """Under the previous amax A, every element with |x| > A leaves e2m1's range: it clips
    to ±2688 S_dec (A up to S_dec's rounding), its block's e4m3 scale saturated at 448.
    Below A only what current scaling clips too: a block's largest elements, where its
    e4m3 scale rounded down, by less than the scale's rounding (2**-4 relative)."""
    first, second = batches(2, growth=2.0)
    previous = first.abs().amax()
    scale = nvfp4_tensor_scales(previous, "te")
    x = second.clone().requires_grad_()
    # fake_quantize's clip mask: the gradient is 0 where an element's scaled value clipped
    out = sr.blocks.fake_quantize(x, "nvfp4", tensor_scale=scale, clip_mask=True)  # type: ignore[arg-type]
    out.sum().backward()
    clipped, beyond = x.grad == 0, second.abs() > previous  # type: ignore[union-attr]
    assert beyond.any() and torch.equal(clipped & beyond, beyond)
    edge = torch.tensor(2688.0) * scale.decode
    values = out.detach()
    assert torch.equal(values[beyond], torch.sign(second[beyond]) * edge)
    rounded = clipped & ~beyond
    assert torch.all(values[rounded].abs() >= second[rounded].abs() * (1 - 2**-4))
    q = sr.blocks.quantize(second, "nvfp4", tensor_scale=scale)  # type: ignore[arg-type]
    blocks_beyond = beyond.reshape(TOKENS, -1, 16).any(-1)
    assert torch.all(q.scales.to(torch.float32)[blocks_beyond] == 448)


def test_the_window_takes_the_largest_amax_of_the_previous_steps() -> None:
    """With a history of 2, step s reads steps s-2 and s-1 only (not its own column), and
    a step records once (a second record of the same step keeps the first)."""
    amaxes, steps = empty_history(3, "cpu")
    for step, value in enumerate((5.0, 1.0, 2.0, 3.0)):
        history = AmaxHistory(amaxes, steps, torch.tensor(step), True)
        record_amax(history, "fprop_input", torch.tensor(value))
    history = AmaxHistory(amaxes, steps, torch.tensor(4), True)
    assert float(window_amax(history, "fprop_input", 2)) == 3.0
    assert float(window_amax(history, "fprop_input", 1)) == 3.0
    first = AmaxHistory(amaxes, steps, torch.tensor(0), True)
    assert float(window_amax(first, "fprop_input", 2)) == -1  # nothing before step 0
    again = AmaxHistory(amaxes, steps, torch.tensor(3), True)
    record_amax(again, "fprop_input", torch.tensor(9.0))  # a recomputation of step 3
    assert float(window_amax(history, "fprop_input", 2)) == 3.0
    assert int(steps[1].eq(EMPTY).sum()) == 3  # fprop_weight's row: untouched


def test_a_longer_history_takes_the_largest_recent_amax() -> None:
    """amax_history=2: step 2 of a shrinking input is scaled by step 0's amax."""
    layer = model_of("delayed", amax_history=2)[0]
    inputs = batches(3, growth=0.5)
    for x in inputs:
        layer_step(layer, x)
    history = AmaxHistory(
        layer.amax_history,
        layer.amax_history_steps,
        torch.tensor(2),
        False,  # type: ignore[arg-type]
    )
    assert float(window_amax(history, "fprop_input", 2)) == float(inputs[0].abs().amax())


def test_a_state_dict_resumes_the_history_bit_for_bit() -> None:
    """Two steps, a state dict, a third step: a fresh model loading the dict gives the
    same third step; one without the history (current-scaling dict) does not."""
    inputs = batches(3, growth=1.5)
    model = model_of("delayed")
    train(model, inputs[:2])
    saved = copy.deepcopy(model.state_dict())
    assert "0.amax_history" in saved and "0.amax_history_steps" in saved
    expected = train(model, inputs[2:])
    resumed = model_of("delayed")
    resumed.load_state_dict(saved)
    assert_same_tensors(train(resumed, inputs[2:]), expected)
    without = {key: value for key, value in saved.items() if "amax_history" not in key}
    fresh = model_of("delayed")
    fresh.load_state_dict(without)  # keeps its own (empty) history: the current amax
    assert not torch.equal(train(fresh, inputs[2:])[0], expected[0])
    current = model_of("amax")
    current.load_state_dict(saved)  # no delayed role: the history is ignored
    assert "0.amax_history" not in current.state_dict()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_recomputation_reads_its_forwards_scale(reentrant: bool) -> None:
    """Each block checkpointed: the run equals the plain one bit for bit, histories too
    (the recomputed forward of step s reads steps before s and records nothing new)."""
    inputs = batches(3, growth=2.0)
    plain = train(model_of("delayed"), inputs)
    model = model_of("delayed")
    blocks = list(model)
    model.forward = lambda x: checkpoint(  # type: ignore[method-assign]
        lambda x: blocks[2](blocks[1](blocks[0](x))), x, use_reentrant=reentrant
    )
    assert_same_tensors(train(model, inputs), plain)


def test_evaluation_forwards_record_nothing() -> None:
    """No-grad forwards between the steps (on other data) leave the training bits and the
    histories as they were; such a forward reads the next step's scale."""
    inputs = batches(3, growth=1.5)
    assert_same_tensors(
        train(model_of("delayed"), inputs, eval_between=True), train(model_of("delayed"), inputs)
    )
    model = model_of("delayed")
    train(model, inputs[:2])
    with torch.no_grad():
        evaluated = model(inputs[2])
    assert torch.equal(evaluated, train(model, inputs[2:])[0])


NVFP4_DELAYED = {"format": "nvfp4", "tensor_scale": "delayed"}
DELAYED_SPEC_ERRORS = [
    ({"format": "mxfp4", "tensor_scale": "delayed"}, ValueError, "per-tensor scale"),
    ({"format": "fp8_e4m3_tensor", "tensor_scale": "delayed"}, NotImplementedError, "not built"),
    ({"tensor_scale": "delayed"}, ValueError, "quantized operand"),
    ({**NVFP4_DELAYED, "amax_history": 0}, ValueError, "amax_history must be in"),
    ({**NVFP4_DELAYED, "amax_history": 2.0}, TypeError, "amax_history must be an int"),
    ({"format": "nvfp4", "amax_history": 4}, ValueError, "applies with tensor_scale='delayed'"),
    ({"format": "nvfp4", "tensor_scale": "previous"}, ValueError, "'amax', 'delayed', 'none'"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), DELAYED_SPEC_ERRORS)
def test_bad_delayed_specs_raise_naming_the_argument(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        srnn.QuantSpec(**kwargs)  # type: ignore[arg-type]


def test_what_is_not_built_raises_instead_of_scaling_currently() -> None:
    """Tensor parallelism raises NotImplementedError (the step graphs serve delayed layers:
    `test_a_delayed_step_keys_a_graph_per_host_decision`); an operand quantized without
    the layer's history raises ValueError."""
    layer = model_of("delayed")[0]
    x = batches(1)[0]
    with pytest.raises(NotImplementedError, match="not built under tensor parallelism"):
        layer.check_delayed_route(True)
    layer.check_delayed_route(False)
    entry = layer.plan.operands["fprop_input"]
    with pytest.raises(ValueError, match="amax history"):
        quantize_operand(x, entry, 0, 0, None)
    assert float(operand_amax(x, entry.spec, None)) == float(x.abs().amax())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("rht_bf16", [False, True])
@pytest.mark.parametrize("per_step", [False, True])
def test_the_rotated_amax_rounds_the_amax_as_the_rotation_rounds_each_value(
    dtype: torch.dtype, rht_bf16: bool, per_step: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`operand_amax` of an RHT role rounds the fp32 rotation's amax (to a narrow operand's
    dtype, then to bf16) instead of each rotated value: the bits of the amax of
    `rht_rotated`'s values (rounding to nearest is monotonic and odd), on values large,
    tiny and beyond fp16 (NaN, as the rotation of an infinity gives); and, but for float64,
    neither the core's rounding (whose kernel keeps scratch per stream, in torch.compile's
    CUDA-graph pool where first asked there) nor the signs' check (a host read, which a
    capture refuses) runs."""
    from stochround.blocks import reference

    # the module (`stochround.blocks.hadamard` is also the function's name)
    hadamard = importlib.import_module("stochround.blocks.hadamard")
    generator = torch.Generator().manual_seed(5)
    spec = srnn.QuantSpec("nvfp4", "sr", rht=16, rht_bf16=rht_bf16)
    signs = sr.blocks.random_signs(16, 9) if per_step else None
    for scale in (1.0, 2.0**-140, 7e4, 3e38):
        operand = (torch.randn(8, 64, generator=generator, dtype=torch.float64) * scale).to(dtype)
        rotated, _ = reference.rht_rotated(operand, 16, signs, -1, rht_bf16)
        want = reference.absolute_max(rotated.to(torch.float32))
        if dtype != torch.float64:
            monkeypatch.setattr(reference, "round_to", None)  # not called
            monkeypatch.setattr(hadamard, "check_signs", None)
        got = operand_amax(operand, spec, signs)
        monkeypatch.undo()
        assert got.dtype == torch.float32 and got.dim() == 0
        if want.isnan():  # an operand infinite in fp16: NaN either way (its sign is no bit of it)
            assert got.isnan(), (scale, got)
        else:
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (scale, got, want)


class RoutedRun(NamedTuple):
    """What `routed_operands` saw: each quantized operand dequantized by (role, step), the
    layer's buffers after the last step, the steps of the tensor-scale (amax) passes (the
    separate operands' and the pair's launches, the spec's `operand_amax`), the roles of
    each pair launch by step, and the layer's host copy of its history (`HostCopy`)."""

    operands: dict[tuple[str, int], Tensor]
    buffers: list[Tensor]
    passes: list[int]
    pairs: list[tuple[int, str]]
    copy: object = None  # the layer's `HostCopy` after the run


def offset_step(offset: object) -> int:
    """The step an operand's stream offset (a one-element int64 tensor) is drawn at: its
    upper half (`stochround.nn.streams.step_column`)."""
    assert isinstance(offset, Tensor)
    return int(offset.reshape(-1)[0]) >> STEP_SHIFT


def routed_operands(
    route: bool,
    checkpointed: bool,
    monkeypatch: pytest.MonkeyPatch,
    frozen: int | None = None,
    compiled: bool = False,
    *,
    steps: int = 3,
    eager_steps: int = 0,
    captured_at: int | None = None,
) -> RoutedRun:
    """``steps`` steps of one delayed layer on the CUDA route
    (``route``: a GPU, or the interpreter under `cpu_as_cuda`; x's and dy's two
    orientations from one read where the pair serves them) or the CPU path, on given
    inputs that grow by 2x a step and given output gradients, with no optimizer step (each
    quantized operand then depends on x, W and dy alone, not on a GEMM's summation order,
    which differs between cuBLAS and the CPU).  ``frozen``: the step at which the weight
    needs no gradient (no wgrad: fprop's and dgrad's roles record, wgrad's do not).
    ``compiled``: the layer under torch.compile (inductor, fullgraph: its opaque ops), but
    for its first ``eager_steps`` steps; ``captured_at``: from that step on the ops' bodies
    run as inside a CUDA-graph capture (`amax_history.stream_capturing` says so).
    Operands are keyed by the step their stream offset is drawn at; amax passes (the
    kernels' tensor-scale launch, the pair's amax launch, alone or before its quantize
    launch, the spec's `operand_amax`) by the layer's step."""
    torch.manual_seed(0)
    device, context = cuda_route(route)
    layer = model_of("delayed")[0].to(device)
    forward: nn.Module = Checkpointed(layer) if checkpointed else layer
    if compiled:  # a checkpoint compiled with the layer: its forward op recomputed
        torch._dynamo.reset()
        forward = torch.compile(forward, backend="inductor", fullgraph=True)  # type: ignore[assignment]
    run = RoutedRun({}, [], [], [])
    original = matmul.quantize_operand
    # the compiled ops' warm-ups (on zeros, as torch.compile traces them) are not steps
    warming = [False]
    warm_up = opaque_matmul.warm_up

    def warm_up_unseen(*args: object) -> object:
        warming[0] = True
        try:
            return warm_up(*args)  # type: ignore[arg-type]
        finally:
            warming[0] = False

    def spy(operand: Tensor, entry: Operand, *args: object, **kwargs: object) -> object:
        result = original(operand, entry, *args, **kwargs)  # type: ignore[arg-type]
        if not warming[0]:
            run.operands[entry.role, offset_step(args[1])] = dequantized_operand(result).cpu()
        return result

    def count_pass() -> None:
        if not warming[0]:
            run.passes.append(int(layer.step) - 1)

    scale_pass = kernel_blocks.PreparedTensorScale.__call__

    def counted(self: object, *args: object, **kwargs: object) -> object:
        count_pass()
        return scale_pass(self, *args, **kwargs)  # type: ignore[arg-type]

    def spec_pass(*args: object) -> Tensor:
        count_pass()
        return operand_amax(*args)  # type: ignore[arg-type]

    served = orientations.PreparedPair.__call__

    def pair_spy(self: orientations.PreparedPair, *args: object) -> object:
        operands = served(self, *args)  # type: ignore[arg-type]
        step = offset_step(args[2])
        for entry, result in zip(self.roles, operands or (None, None), strict=True):
            if result is not None and not warming[0]:  # None: each orientation apart
                run.operands[entry.role, step] = dequantized_operand(result).cpu()
                run.pairs.append((step, entry.role))
        return operands

    pair_kernel = two_orientation.PreparedTwoOrientations.__call__

    def pair_pass(self: two_orientation.PreparedTwoOrientations, *args: object) -> object:
        if self.tensor_scales and (len(args) < 6 or args[5] is None):  # no scales given
            count_pass()  # the pair's amax launch runs
        return pair_kernel(self, *args)  # type: ignore[arg-type]

    pair_amaxes = two_orientation.PreparedTwoOrientations.amaxes

    def pair_amax_pass(self: two_orientation.PreparedTwoOrientations, *args: object) -> Tensor:
        count_pass()  # the pair's amax launch alone (the device's delayed scales)
        return pair_amaxes(self, *args)  # type: ignore[arg-type]

    capturing = [False]
    monkeypatch.setattr(two_orientation.PreparedTwoOrientations, "amaxes", pair_amax_pass)
    monkeypatch.setattr(opaque_matmul, "warm_up", warm_up_unseen)
    monkeypatch.setattr(delayed_ops, "warm_up", warm_up_unseen)
    monkeypatch.setattr(matmul, "quantize_operand", spy)
    monkeypatch.setattr(kernel_blocks.PreparedTensorScale, "__call__", counted)
    monkeypatch.setattr(amax_history, "operand_amax", spec_pass)
    monkeypatch.setattr(orientations.PreparedPair, "__call__", pair_spy)
    monkeypatch.setattr(two_orientation.PreparedTwoOrientations, "__call__", pair_pass)
    monkeypatch.setattr(amax_history, "stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(orientations, "SERVES_STEPS", True)
    grads = batches(steps, growth=0.5)
    with context:
        for step, (x, grad) in enumerate(zip(batches(steps, growth=2.0), grads[::-1], strict=True)):
            layer.weight.requires_grad_(step != frozen)
            capturing[0] = captured_at is not None and step >= captured_at
            call = layer if step < eager_steps else forward
            call(x.to(device).requires_grad_()).backward(grad.to(device))
    monkeypatch.undo()
    run.buffers.extend(buffer.cpu() for buffer in layer.buffers())
    return run._replace(copy=host_copy(layer.amax_history))  # type: ignore[arg-type]


def assert_same_run(kernels: RoutedRun, spec: RoutedRun, steps: set[int]) -> None:
    """The kernels' route quantized the spec's operands (by role and step, these steps)
    bit for bit and left its buffers."""
    assert kernels.operands.keys() == spec.operands.keys()
    assert {step for _, step in spec.operands} == steps
    for key, values in spec.operands.items():
        assert torch.equal(kernels.operands[key], values), key
    assert_same_tensors(kernels.buffers, spec.buffers)


PAIRED = ["fprop_input", "wgrad_input", "dgrad_grad_output", "wgrad_grad_output"]


@pytest.mark.usefixtures("no_step_graphs")
@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_kernels_route_gives_the_specs_bits_without_an_amax_pass(
    checkpointed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three steps on the CUDA route quantize every operand as the PyTorch path (the spec)
    does, bit for bit, and leave the same buffers (the recorded amaxes: the "amax" rule's,
    `operand_amax`), checkpointed or not; x's and dy's orientations come from one read at
    every step (the pair: each role's own window scales, each orientation's amax recorded
    in its role's row); after the first step no tensor-scale (amax) pass runs: the
    quantize launches take the window's scales and record the current amax by an atomic
    max."""
    kernels = routed_operands(True, checkpointed, monkeypatch)
    spec = routed_operands(False, checkpointed, monkeypatch)
    assert [step for step in kernels.passes if step > 0] == []
    assert 0 in kernels.passes and spec.pairs == []
    # the recomputed forward's x pair launches again, with the same scales
    x_pairs = 2 if checkpointed else 1
    for step in range(3):
        roles = [role for seen, role in kernels.pairs if seen == step]
        assert sorted(roles) == sorted(PAIRED[:2] * x_pairs + PAIRED[2:]), step
    assert_same_run(kernels, spec, {0, 1, 2})


@pytest.mark.usefixtures("no_step_graphs")
def test_a_pair_whose_windows_disagree_takes_the_specs_scales(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step without wgrad (the weight frozen at step 1) records fprop's and dgrad's roles
    but not wgrad's: at step 2 (a history of 1) x's and dy's row-wise windows hold step
    1's amax and their column-wise ones nothing, so the pair takes both roles' scales as
    the spec computes them on the device (an amax pass over each orientation: wgrad's
    roles by current scaling); at step 3 the host decides again, with given scales.
    Every operand and the buffers are the spec's, bit for bit."""
    kernels = routed_operands(True, False, monkeypatch, frozen=1, steps=4)
    spec = routed_operands(False, False, monkeypatch, frozen=1, steps=4)
    assert {step for step, _ in kernels.pairs} == {0, 2, 3}
    assert sorted(set(kernels.passes)) == [0, 2]
    assert_same_run(kernels, spec, {0, 1, 2, 3})


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")
@pytest.mark.parametrize("route", [False, True], ids=["cpu", "cuda_route"])
def test_a_compiled_layer_quantizes_eagers_operands_and_records_its_amaxes(
    route: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three steps of one delayed layer compiled (inductor, fullgraph: the opaque ops, the
    history's buffers their arguments) on the CPU path and on the CUDA route (a GPU, or the
    interpreter): every quantized operand by role and step and the buffers (the recorded
    amaxes and their steps) are the eager layer's, bit for bit, and so is the route: the
    ops' bodies decide on the host from the layer's host copy as the eager step does, so
    on the CUDA route no amax pass runs after the first step and x's and dy's orientations
    come from one read (the pair) at every step; on the CPU path, the spec's amax pass at
    every step, as eagerly."""
    compiled = routed_operands(route, False, monkeypatch, compiled=True)
    eager = routed_operands(route, False, monkeypatch)
    assert_same_run(compiled, eager, {0, 1, 2})
    assert sorted(compiled.passes) == sorted(eager.passes)
    assert sorted(compiled.pairs) == sorted(eager.pairs)
    if route:
        assert [step for step in compiled.passes if step > 0] == []
        assert {step for step, _ in compiled.pairs} == {0, 1, 2}


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")
def test_a_compiled_layer_finds_its_recomputations_step_by_its_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CUDA route, in one non-reentrant checkpoint, a compiled layer's forward op
    run again in the backward (recording nothing new) and its backward op take their
    forward's step from the host copy, by the offsets column the forward registered:
    every operand by role and step, the buffers and the pairs are the eager layer's, and
    no amax pass runs after the first step.  (Several forwards before their backwards do
    not compile yet: AOT autograd saves the history's buffers for the backward and refuses
    them once a later forward wrote them, main's compiled route alike.)"""
    compiled = routed_operands(True, True, monkeypatch, compiled=True)
    eager = routed_operands(True, True, monkeypatch)
    assert_same_run(compiled, eager, {0, 1, 2})
    # torch 2.11's partitioner saves the forward op's outputs instead of running it again
    # (its run quantizes each forward's operands once; the same bits); 2.13 runs it again,
    # as eager recomputes, which is the path this test is for
    assert set(compiled.pairs) == set(eager.pairs)
    if PLAIN_REGIONS_RUN_THE_MODE:
        assert sorted(compiled.pairs) == sorted(eager.pairs)
    assert [step for step in compiled.passes if step > 0] == []


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")
def test_a_layer_stepped_eagerly_then_compiled_keeps_one_host_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One layer's host copy serves its eager steps and its compiled ops alike: two eager
    steps on the CUDA route, then compiled ones (whose trace runs the ops' warm-up on
    zeros, which must not advance or mark the copy): every operand, the buffers and the
    pairs are an eager run's, no amax pass after the first step, and the copy counted
    every step once."""
    mixed = routed_operands(True, False, monkeypatch, compiled=True, eager_steps=2, steps=4)
    eager = routed_operands(True, False, monkeypatch, steps=4)
    assert_same_run(mixed, eager, {0, 1, 2, 3})
    assert sorted(mixed.pairs) == sorted(eager.pairs)
    assert [step for step in mixed.passes if step > 0] == []
    copy = mixed.copy
    assert isinstance(copy, amax_history.HostCopy) and copy.windows is not None
    assert copy.windows.step == 4 and HostRoute.on


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")
def test_a_captured_history_takes_the_devices_decisions_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a compiled op's body runs inside a CUDA-graph capture (torch.compile's
    ``mode="reduce-overhead"`` recording a step, simulated here: `stream_capturing` says
    so from step 1 on), its history's host copy is marked captured and left: the replays
    run no Python, so each later step decides on the device (an amax pass per delayed
    operand, the pair given the scales), with the same bits.  The eager layer's operands
    and buffers, the host copy's step left at the capture's."""
    captured = routed_operands(True, False, monkeypatch, compiled=True, captured_at=1)
    eager = routed_operands(True, False, monkeypatch)
    assert_same_run(captured, eager, {0, 1, 2})
    assert sorted(captured.pairs) == sorted(eager.pairs)
    assert {1, 2} <= set(captured.passes)
    copy = captured.copy
    assert isinstance(copy, amax_history.HostCopy) and copy.captured
    assert copy.windows is not None and copy.windows.step == 1


# the roles a delayed nvfp4 layer records at a step that runs all three GEMMs (dgrad
# reuses fprop's Q(W): dgrad_weight's window stays empty)
RECORDING = frozenset(
    {"fprop_input", "fprop_weight", "wgrad_input", "dgrad_grad_output", "wgrad_grad_output"}
)


@pytest.mark.parametrize("route", [False, True], ids=["cpu", "cuda_route"])
def test_a_delayed_step_keys_a_graph_per_host_decision(
    route: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host decides before each step function which roles' windows hold a recorded
    amax, and passes the decisions among its hashable arguments (the step graphs' key): on
    the kernels' route the first step's calls find every window empty and the later ones
    the recording roles' windows recorded, so each function takes two keys over three
    steps (a graph for each); its calls name the buffers they write (``mutates``).  On
    the kernels' route the step graphs serve the calls (a GPU's own; on the CPU stand-ins
    that run the function at each replay, `graphs_on_the_cpu`), and the decisions are
    those of a run without them: the forward keeps Q(W) for dgrad whether or not they
    serve, so ``dgrad_weight`` never records.  The host copy holds what the calls noted
    they recorded, the steps the buffers hold.  On the CPU path the device decides: no
    decisions passed, one key a function."""
    calls: list[tuple[str, object, tuple]] = []
    run = step_graphs.StepGraphs.run

    def spy(
        self: step_graphs.StepGraphs,
        function: object,
        tensors: list,
        rest: tuple,
        *args: object,
        **kwargs: object,
    ) -> object:
        name = function.__name__  # type: ignore[attr-defined]
        writes = FORWARD_WRITES if "forward" in name else BACKWARD_WRITES
        assert kwargs.get("mutates") == writes
        calls.append((name, rest[-1], step_graphs.call_key(tensors, rest)))
        return run(self, function, tensors, rest, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(step_graphs.StepGraphs, "run", spy)
    device, context = cuda_route(route)
    if route and device.type == "cpu":
        graphs_on_the_cpu(monkeypatch, step_graphs.STEP_GRAPHS)
    layer = model_of("delayed")[0].to(device)
    try:
        with context:
            for x in batches(3):
                layer_step(layer, x.to(device))
    finally:
        step_graphs.STEP_GRAPHS.clear()
    forwards = [(windows, key) for name, windows, key in calls if "forward" in name]
    backwards = [(windows, key) for name, windows, key in calls if "backward" in name]
    assert len(forwards) == len(backwards) == 3
    if not route:
        assert {windows for windows, _ in forwards + backwards} == {None}
        assert len({key for _, key in forwards}) == len({key for _, key in backwards}) == 1
        return
    for decided in (forwards, backwards):
        assert [windows for windows, _ in decided] == [frozenset(), RECORDING, RECORDING]
        assert decided[0][1] != decided[1][1] == decided[2][1]
    copy = host_copy(layer.amax_history)  # type: ignore[arg-type]
    assert copy is not None and copy.windows is not None and copy.windows.step == 3
    steps = layer.amax_history_steps
    assert steps is not None
    for role, row in amax_history.ROLE_ROWS.items():
        recorded = sorted(step for step in steps[row].tolist() if step >= 0)
        assert sorted(copy.windows.recorded[role]) == recorded, role


def test_a_history_no_layer_registered_turns_the_host_route_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An op given history buffers that no layer registered (a copy the compiler made of
    them, where it did not write them in place) cannot tell their layer's host copy: it
    warns, turns the host route off for every history (the device's decisions from then
    on, eager steps included: the same bits) and reads the buffers on the device."""
    monkeypatch.setattr(HostRoute, "on", True)
    device, context = cuda_route()
    amaxes, steps = empty_history(2, device)
    column = torch.zeros(8, 1, dtype=torch.int64, device=device)
    with context, pytest.warns(RuntimeWarning, match="no QuantizedLinear registered"):
        host = host_step(amaxes, steps, column, True, "forward")
    assert host is None and not HostRoute.on
    assert host_copy(amaxes) is None


class Checkpointed(nn.Module):
    """``module`` in one non-reentrant activation checkpoint."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.module, x, use_reentrant=False)  # type: ignore[no-any-return]


def relu_model(device: torch.device) -> nn.Sequential:
    """`model_of`'s delayed model with a ReLU between its layers: inductor computes ReLU as
    eager does (its GELU is not eager's bit for bit), so a compiled step equals eager's."""
    model = model_of("delayed")
    model[1] = nn.ReLU()
    return model.to(device)


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.usefixtures("no_step_graphs")
@pytest.mark.parametrize(
    ("route", "mode", "checkpointed"),
    [
        (False, None, False),
        (False, None, True),
        (True, None, False),
        (True, None, True),
        pytest.param(True, "reduce-overhead", False, marks=pytest.mark.gpu),
    ],
    ids=["cpu", "cpu_checkpointed", "cuda_route", "cuda_route_checkpointed", "cuda_graphs"],
)
def test_a_compiled_delayed_model_trains_as_eager_byte_for_byte(
    route: bool, mode: str | None, checkpointed: bool
) -> None:
    """Two delayed layers compiled whole (inductor, fullgraph=True, no graph break; with
    ``mode="reduce-overhead"`` on a GPU: the whole step captured as CUDA graphs, its window
    decisions on the device, nothing the ops' bodies keep made in the graphs' pool by their
    warm-up run (a rounding kernel's per-stream flag had been) and no host read in the
    capture; ``checkpointed``: the model in one non-reentrant checkpoint,
    its forward ops recomputed in the backward), three SGD steps on inputs that grow: each
    step's output, x's and the parameters' gradients and every buffer (the steps, the amax
    histories) equal the eager model's byte for byte."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    device, context = cuda_route(route)
    inputs = [x.to(device) for x in batches(3, growth=2.0)]
    eager, model = relu_model(device), relu_model(device)
    if checkpointed:
        model = nn.Sequential(Checkpointed(model))
    compiled = torch.compile(model, backend="inductor", fullgraph=True, mode=mode)
    counters.clear()
    with context:
        got = train(compiled, inputs)
        want = train(eager, inputs)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert_same_tensors(got, want)
