"""The emulation's hooks into PyTorch (`emulate/torch_hooks.py`): Dynamo kept out of the
mode's Python by its code's frame-execution strategy instead of PyTorch's per-call
wrapper (a compiled function under `emulate` still gives the eager bits and Dynamo
compiles no frame), and each op overload called through its native function."""

from __future__ import annotations

import sys

import torch
import torch._dynamo.testing
from torch.utils._python_dispatch import TorchDispatchMode

from stochround.emulate import Emulation, emulate
from stochround.emulate.mca_batched import BatchedEmulation
from stochround.emulate.ops import OpKind
from stochround.emulate.torch_hooks import STRATEGIES, op_caller, skip_dynamo

aten = torch.ops.aten


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 1.1 + 0.3


def _program(x: torch.Tensor) -> torch.Tensor:
    """Ops, a nested Python call (a frame Dynamo would be asked about) and a reduction."""
    return _scaled(x).sin().sum() + x.square().mean()


def test_a_compiled_function_under_emulate_gives_the_eager_bits_and_traces_nothing():
    """With the mode's method unwrapped, Dynamo must still not trace the mode's Python
    (called by the dispatcher with the mode off its stack): no frame compiled, and the
    compiled function's bits and offsets are those of the plain function under emulate."""
    x = torch.linspace(-2, 2, 64)
    for mode in ("rne", "sr"):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(_program, backend=counter)
        with emulate("bfloat16", mode, seed=1) as emulation:
            expected = [_program(x), _program(x)]
        with emulate("bfloat16", mode, seed=1) as compiled_emulation:
            # (the second call: the frames' strategies set, not a first look)
            got = [compiled(x), compiled(x)]
        assert all(map(torch.equal, got, expected))
        assert compiled_emulation.calls == emulation.calls == 2 * 7
        assert counter.frame_count == 0


def test_a_compiled_function_outside_emulate_still_compiles():
    """The mode's strategy marks its own code alone: a compiled function run outside the
    mode compiles as ever, after the mode has run."""
    x = torch.linspace(-2, 2, 64)
    with emulate("bfloat16", "rne", seed=1):
        _program(x)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    assert torch.equal(torch.compile(_program, backend=counter)(x), _program(x))
    assert counter.frame_count == 1


def test_the_modes_run_their_own_method_without_pytorchs_wrapper():
    """PyTorch's ``_disable_dynamo`` wrapper (a Python frame per op) is replaced: the
    class holds its method itself, where this PyTorch has frame-execution strategies."""
    assert STRATEGIES
    for cls in (Emulation, BatchedEmulation):
        method = cls.__dict__["__torch_dispatch__"]
        assert not hasattr(method, "__wrapped__")
        assert method.__qualname__ == f"{cls.__name__}.__torch_dispatch__"


def test_without_strategies_a_mode_keeps_pytorchs_wrapper(monkeypatch):
    hooks = sys.modules[skip_dynamo.__module__]
    monkeypatch.setattr(hooks, "STRATEGIES", False)

    @skip_dynamo
    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    wrapped = Passing.__dict__["__torch_dispatch__"]
    assert wrapped.__wrapped__.__qualname__.endswith("Passing.__torch_dispatch__")


def test_an_op_overload_is_called_through_its_native_function():
    assert op_caller(aten.add.Tensor) is aten.add.Tensor._op
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(op_caller(aten.add.Tensor)(x, x), torch.tensor([2.0, 4.0]))


def test_an_overload_whose_call_does_more_is_called_itself():
    class Traced(type(aten.add.Tensor)):  # type: ignore[misc]
        def __call__(self, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            return "traced"

    overload = object.__new__(Traced)
    overload.__dict__["_op"] = aten.add.Tensor._op
    assert op_caller(overload) is overload


def test_op_kind_says_which_ops_write_and_return_their_first_argument():
    returning = [aten.add_.Tensor, aten.mul_.Scalar, aten.addcmul_.default, aten.zero_.default]
    assert all(OpKind(op).returns_self for op in returning)
    others = [
        aten.add.Tensor,
        aten.add.out,
        aten._foreach_add_.List,
        aten.native_batch_norm.default,
    ]
    assert not any(OpKind(op).returns_self for op in others)
