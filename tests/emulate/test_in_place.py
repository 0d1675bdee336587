"""An emulation on the kernels' route rounds an op's own fresh outputs (several where they
lie apart) and the tensors it mutates where they lie (`PreparedRounding.round_in_place`):
the bits it gave with a new tensor a rounding, nothing allocated, and never an input an op
returns as its output.
The route a CUDA tensor takes: a GPU's, else `cpu_as_cuda` under Triton's interpreter."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import OpCounter

from stochround.emulate import emulate

sys.path.insert(0, str(Path(__file__).parent))
from test_op_entries import BEFORE, _digest

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

aten = torch.ops.aten


def _kernel_route() -> contextlib.AbstractContextManager[None]:
    """The kernels' route: CUDA tensors on a GPU, else `cpu_as_cuda`."""
    if DEVICE == "cuda":
        return contextlib.nullcontext()
    from stochround.kernels.availability import cpu_as_cuda

    return cpu_as_cuda()


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)


def _values(*shape: int) -> torch.Tensor:
    """fp32 values with bits below bfloat16's."""
    generator = torch.Generator().manual_seed(7)
    return torch.randn(*shape, generator=generator).to(DEVICE)


@pytest.mark.parametrize("mode", sorted(BEFORE))
def test_a_training_step_on_the_kernels_route_gives_the_bits_it_gave_before(mode):
    """Fresh outputs of every kind (products, several outputs, a softmax, a concatenation,
    conversions) and in-place updates (SGD with momentum: parameters and buffers)."""
    if DEVICE == "cuda":
        pytest.skip("the digest is of CPU tensors")
    with _kernel_route():
        assert _digest(mode) == (BEFORE[mode], 88)


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_a_rounded_op_allocates_nothing_on_the_kernels_route(mode, monkeypatch):
    """An enclosing mode sees the op alone (before: a ``new_empty`` a rounding, and for an
    in-place op a ``detach`` and a ``copy_`` of its rounding into the tensor), and the
    kernel is launched with the op's output as its input and its output.  (The launches
    are recorded, not run: the interpreter's own copies would reach the enclosing mode.)"""
    from stochround.kernels.runtime import PartialLaunch

    launched: list[tuple[object, ...]] = []  # each launch's runtime arguments in full
    monkeypatch.setattr(
        PartialLaunch,
        "__call__",
        lambda self, device, programs, *varying: launched.append(self.arguments(varying)),
    )
    a, b = _values(4, 8), _values(4, 8) + 1
    parameter = torch.nn.Parameter(_values(4, 8))
    with _kernel_route(), OpCounter() as seen, emulate("bfloat16", mode, seed=2) as emulation:
        c = a * b
        with torch.no_grad():
            parameter.add_(c, alpha=-0.5)
    assert seen.ops == Counter({"aten.mul.Tensor": 1, "aten.add_.Tensor": 1})
    assert emulation.calls == 2
    assert [(args[0], args[1]) for args in launched] == [(c, c), (parameter, parameter)]
    assert [args[0] is args[1] for args in launched] == [True, True]


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_in_place_roundings_give_the_pytorch_paths_bits(mode):
    a, b = _values(4, 8), _values(4, 8) + 1
    parameter = torch.nn.Parameter(_values(4, 8))
    with _kernel_route(), emulate("bfloat16", mode, seed=2):
        c = a * b
        with torch.no_grad():
            parameter.add_(c, alpha=-0.5)
    expected_p = _values(4, 8).cpu()
    with emulate("bfloat16", mode, seed=2):  # the CPU's PyTorch path: new tensors
        expected_c = a.cpu() * b.cpu()
        expected_p.add_(expected_c, alpha=-0.5)
    assert torch.equal(_bits(c.cpu()), _bits(expected_c))
    assert torch.equal(_bits(parameter.detach().cpu()), _bits(expected_p))


def test_an_input_an_op_returns_is_not_rounded_in_place():
    """``lift`` returns its input and ``unsafe_split`` views of it, though their schemas
    say their outputs are new: the input keeps its values, the outputs are rounded."""
    x = _values(8)
    before = x.clone()
    with _kernel_route(), emulate("bfloat16", "rne"):
        lifted = aten.lift.default(x)
        parts = aten.unsafe_split.Tensor(x, 4)
    assert torch.equal(_bits(x), _bits(before))
    assert lifted is not x
    expected = before.to(torch.bfloat16).float()
    assert torch.equal(_bits(lifted), _bits(expected))
    assert torch.equal(_bits(torch.cat(parts)), _bits(expected))


def test_a_strided_or_empty_output_is_rounded_as_before():
    """A transposed output (its strides kept) takes the rounding's new tensor, copied in;
    an empty one is left as it is."""
    x = _values(3, 5)
    with _kernel_route(), emulate("bfloat16", "rne") as emulation:
        y = x.t() * 1.0001  # TensorIterator keeps the input's transposed layout
        empty = x[:0] * 2.0
    assert y.stride() == (1, 5)
    assert torch.equal(_bits(y), _bits((x.t() * 1.0001).to(torch.bfloat16).float()))
    assert empty.shape == (0, 5)
    assert emulation.calls == 2


def test_several_outputs_apart_are_rounded_in_place(monkeypatch):
    """An op's outputs that lie apart in memory (`apart`) are each rounded where they lie,
    one launch into itself each, in the order of the outputs."""
    from stochround.kernels.runtime import PartialLaunch

    launched: list[tuple[object, ...]] = []
    monkeypatch.setattr(
        PartialLaunch,
        "__call__",
        lambda self, device, programs, *varying: launched.append(self.arguments(varying)),
    )
    x = _values(4, 8)
    with _kernel_route(), OpCounter() as seen, emulate("bfloat16", "sr", seed=2) as emulation:
        var, mean = torch.var_mean(x, dim=0)
    assert seen.ops == Counter({"aten.var_mean.correction": 1})
    assert emulation.calls == len(launched) == 2
    assert [(args[0], args[1]) for args in launched] == [(var, var), (mean, mean)]


def test_outputs_that_share_memory_are_not_apart():
    """Rounding one of them in place would change another before its own rounding: each
    then takes a new tensor, as `apart` tells `Emulation._fresh`."""
    from stochround.emulate.ops import apart

    buffer = torch.zeros(8)
    assert apart((buffer[:4], buffer[4:], torch.zeros(3), buffer[:0], 2.0))
    assert apart([buffer[:4], (buffer[4:6], buffer[6:])])
    assert not apart((buffer[:5], buffer[4:]))
    assert not apart((buffer[:4], buffer[:4]))
    assert not apart((buffer.reshape(2, 4).t(), torch.zeros(3)))  # not contiguous


def test_several_outputs_give_the_pytorch_paths_bits():
    x = _values(4, 8)
    with _kernel_route(), emulate("bfloat16", "sr", seed=4):
        found = torch.var_mean(x, dim=0)
    with emulate("bfloat16", "sr", seed=4):
        expected = torch.var_mean(x.cpu(), dim=0)
    for ours, theirs in zip(found, expected, strict=True):
        assert torch.equal(_bits(ours.cpu()), _bits(theirs))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_a_layer_norms_outputs_and_gradients_give_the_pytorch_paths_bits(mode):
    """Its forward's three outputs and its backward's three gradients lie apart: each is
    rounded where it lies, with the bits of the PyTorch path's new tensors."""
    if DEVICE == "cuda":
        pytest.skip("the reference is the CPU's layer norm: a GPU's reductions differ")
    found, expected = [], []
    for route, device, results in ((_kernel_route(), DEVICE, found), (None, "cpu", expected)):
        x, weight, bias = (_values(*shape).to(device) for shape in ((6, 16), (16,), (16,)))
        for t in (x, weight, bias):
            t.requires_grad_()
        with route or contextlib.nullcontext(), emulate("bfloat16", mode, seed=5):
            y = torch.nn.functional.layer_norm(x, (16,), weight, bias)
            (y * y).sum().backward()
        results += [_bits(t.detach().cpu()) for t in (y, x.grad, weight.grad, bias.grad)]
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(found, expected, strict=True))
