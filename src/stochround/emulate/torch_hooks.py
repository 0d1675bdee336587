"""The two places where an emulation's per-op path reaches into PyTorch's internals, each
with PyTorch's own public route where those internals are missing.

Keeping Dynamo out of a dispatch mode (`skip_dynamo`).  A dispatch mode's
``__torch_dispatch__`` is called by the dispatcher with the mode off its stack, so a
function compiled with `torch.compile` and called inside the mode would have Dynamo trace
the mode's own Python.  PyTorch prevents it by wrapping the method of every
`TorchDispatchMode` subclass in ``torch._disable_dynamo(..., recursive=True)``
(``TorchDispatchMode.__init_subclass__``), a Python wrapper that runs on every op: two
frames, four ``set_eval_frame`` calls and an export check around each call, whether
anything is compiled or not.  Dynamo's frame-execution strategy says the same once, of the
method's code object: SKIP that frame and every frame it calls (the strategy ``disable``'s
own recursive form sets).  Dynamo's frame evaluator reads it only while a compile callback
is set; a plain eager op pays nothing.

Calling an op overload (`op_caller`): ``func(*args)`` is a Python method
(``OpOverload.__call__``) that calls the overload's native function ``func._op``; the
emulation calls that function itself, for the overloads whose call does nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

try:  # Dynamo's native frame evaluator (the C extension PyTorch builds it into)
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )

    STRATEGIES = True
except ImportError:  # another PyTorch: the mode keeps PyTorch's wrapper
    STRATEGIES = False

_Mode = TypeVar("_Mode", bound=type)

# the Python method every plain op overload's call goes through (`op_caller`)
_OVERLOAD_CALL = torch._ops.OpOverload.__call__


def skip_dynamo(cls: _Mode) -> _Mode:
    """``cls`` (a `TorchDispatchMode` subclass that defines ``__torch_dispatch__``) with its
    method unwrapped and its code marked for Dynamo to skip, with every frame it calls
    (module docstring): the guarantee of PyTorch's wrapper, that Dynamo never traces the
    mode's Python, without the wrapper's Python on every op.  Where this PyTorch has no
    frame-execution strategy, ``cls`` is returned as it is (PyTorch's wrapper kept)."""
    wrapped = cls.__dict__["__torch_dispatch__"]
    # PyTorch's wrapper names the method it wraps (functools.wraps); none: not wrapped
    method = getattr(wrapped, "__wrapped__", wrapped)
    code = getattr(method, "__code__", None)
    if not STRATEGIES or code is None:
        return cls
    skip = _FrameAction.SKIP
    set_code_exec_strategy(code, _FrameExecStrategy(skip, skip))
    cls.__torch_dispatch__ = method  # type: ignore[attr-defined]
    return cls


def op_caller(func: torch._ops.OpOverload) -> Callable[..., Any]:
    """What calls ``func`` with an op's arguments: its native function where its call is
    `torch._ops.OpOverload`'s (which calls that function and nothing else), else ``func``
    itself (an overload whose call does more, such as TorchBind's)."""
    native = getattr(func, "_op", None)
    if native is None or type(func).__call__ is not _OVERLOAD_CALL:
        return func
    return native


__all__ = ["STRATEGIES", "op_caller", "skip_dynamo"]
