"""Argument checks shared by the elementwise operations, the reductions and Monte Carlo
arithmetic: the format and mode every operation takes, and operand tensors that must share
a device, broadcast together and have floating dtypes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

from ..formats import Format
from ..formats import format as find_format
from ..reference import check_mode
from ..torch_path import FLOAT_DTYPES

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["check_operands", "format_and_mode", "operands"]


def format_and_mode(fmt: Format | str, mode: str) -> tuple[Format, str]:
    """The target format (a name resolved) and the mode as `MODES` spells it (any case
    given; ValueError naming it otherwise)."""
    return find_format(fmt), check_mode(mode)


def operands(
    operation: str, names: tuple[str, ...], values: tuple[object, ...], wide_ok: bool
) -> tuple[list[Tensor], torch.dtype]:
    """Checked operands as float64 tensors of the broadcast shape, and the result dtype.

    The tensors are detached: the operations compute rounded values outside autograd, and
    `gradients.with_exact_gradient` gives the result its gradient."""
    shape, dtype = check_operands(operation, names, values, wide_ok)
    tensors: list[Tensor] = list(values)  # type: ignore[arg-type]
    return [tensor.detach().to(torch.float64).expand(shape) for tensor in tensors], dtype


def check_operands(
    operation: str, names: tuple[str, ...], values: tuple[object, ...], wide_ok: bool
) -> tuple[torch.Size, torch.dtype]:
    """The broadcast shape and the result dtype of checked operands (TypeError, ValueError
    naming them; NotImplementedError for float64 where ``wide_ok`` is False)."""
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in FLOAT_DTYPES:
            allowed = ", ".join(str(dtype) for dtype in FLOAT_DTYPES)
            raise TypeError(f"{name} must have a floating dtype ({allowed}); got {value.dtype}")
    tensors: list[Tensor] = list(values)  # type: ignore[arg-type]
    devices = {tensor.device for tensor in tensors}
    if len(devices) > 1:
        raise ValueError(
            f"{', '.join(names)} must be on one device; got {sorted(map(str, devices))}"
        )
    try:
        shape = torch.broadcast_shapes(*(tensor.shape for tensor in tensors))
    except RuntimeError:
        shapes = ", ".join(f"{n}{tuple(t.shape)}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"the shapes of {shapes} do not broadcast") from None
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    if not wide_ok and any(tensor.dtype == torch.float64 for tensor in tensors):
        raise NotImplementedError(
            f"{operation} of float64 inputs: it forms products as fl(a b), exact only for "
            "inputs of at most 26 significand bits; pass fp32/bf16/fp16 inputs"
        )
    return shape, dtype


def eager_only(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, run eagerly where `torch.compile` meets it: the operations emulate
    rounded arithmetic step by step, with Python control flow on the data that torch.compile
    cannot trace.  Without ``fullgraph`` the compiled code calls it eagerly (a graph break);
    with ``fullgraph=True`` compiling raises an error that names it and says what to do.

    The `torch.compiler.disable` wrapper is made when Dynamo first traces a call, not when
    the module is imported: making it imports Dynamo, which `import stochround` should not
    pay for; an eager call runs ``function`` itself."""
    reason = (
        f"stochround.ops.{function.__name__} emulates rounded arithmetic step by step, with "
        "data-dependent Python control flow that torch.compile cannot trace: call it outside "
        "the compiled function (sr.round, sr.cast and sr.encode compile)"
    )
    untraced: list[Callable[P, R]] = []  # the disabled function, once made

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not torch.compiler.is_compiling():
            return function(*args, **kwargs)
        if not untraced:
            # Dynamo cannot trace the making of a disabled function: break the graph first
            # (the error fullgraph=True raises, with the reason), so that what follows runs
            # in Python, where the wrapper is made once
            graph_break(reason)
            untraced.append(disabled(function, reason))
        return untraced[0](*args, **kwargs)

    return run


def disabled(function: Callable[P, R], reason: str) -> Callable[P, R]:
    """`torch.compiler.disable` of ``function``, with ``reason`` where the release takes one."""
    try:
        return torch.compiler.disable(function, reason=reason)
    except TypeError:  # torch releases whose disable takes no reason
        return torch.compiler.disable(function)


def graph_break(reason: str) -> None:
    """Dynamo's graph break, with ``reason`` as its message where the release takes one;
    called only while Dynamo traces, so Dynamo is imported already."""
    import torch._dynamo

    try:
        torch._dynamo.graph_break(msg=reason)
    except TypeError:  # torch releases whose graph_break takes no message
        torch._dynamo.graph_break()
