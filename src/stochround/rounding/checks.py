"""A rounding call's arguments checked: the input tensor, the choices (format, mode, random
bits, variant, saturation, NaN policy) and the per-call values (seed, offset, rand,
index_offset), each error naming the argument and the values it takes."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import random as streams
from ..formats import Format
from ..formats import format as find_format
from ..reference import SATURATIONS, VARIANTS, check_choice, check_mode, check_rbits
from ..shards import is_dtensor
from ..torch_path import FLOAT_DTYPES, Request

# what codes of a format without a NaN code hold for a NaN result: "raise" checks (a
# ValueError; on CUDA the call waits for its kernel), "zero" stores code 0 (+0) unchecked
NAN_POLICIES = ("raise", "zero")


def check_input(x: object) -> Tensor:
    """x, if it is a tensor of a floating dtype the rounding functions take: dense, with
    data (not on the meta device), and not one of `torch.func`'s transformed tensors nor
    under `torch.jit.trace` (TypeError naming what is not supported)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(dtype) for dtype in FLOAT_DTYPES)
        raise TypeError(f"x must have a floating dtype ({allowed}); got {x.dtype}")
    if not torch.compiler.is_compiling():  # traced, x is a fake tensor: these hold
        unsupported = _unsupported_input(x)
        if unsupported is not None:
            raise TypeError(f"stochround does not support {unsupported}")
    return x


def check_input_state(x: Tensor) -> None:
    """The part of `check_input` that x's type, dtype, layout and device do not decide: x
    not one of `torch.func`'s transformed tensors (their type is `Tensor`), no
    `torch.jit.trace` running (TypeError as `check_input` raises it).  For a caller that
    has seen `check_input` pass for a tensor of x's type, dtype, layout and device (a
    plan's key holds them) and is not under torch.compile."""
    unsupported = _unsupported_state(x)
    if unsupported is not None:
        raise TypeError(f"stochround does not support {unsupported}")


def _unsupported_input(x: Tensor) -> str | None:
    """What makes x an input the rounding functions do not support, or None."""
    if x.layout != torch.strided:
        return f"{x.layout} tensors: x must be dense (strided); pass x.to_dense()"
    if x.is_meta:
        return "meta tensors: x has no data to round"
    return _unsupported_state(x)


def _unsupported_state(x: Tensor) -> str | None:
    """What of a dense x with data the rounding functions do not support: a transformed
    tensor, a trace."""
    if torch._C._functorch.is_functorch_wrapped_tensor(x):
        return (
            "torch.func transforms (vmap, grad, jvp, functionalize): round outside the "
            "transform, or use torch.autograd for the straight-through gradient"
        )
    if torch.jit.is_tracing():
        return "torch.jit.trace: use torch.compile (fullgraph=True traces every entry point)"
    return None


def _check_rand(x: Tensor, rand: object, n: int) -> Tensor:
    """rand as int64 integers on x's device, checked: the whole tensor's (a DTensor's
    shards are gathered: a DTensor input takes the part of its shard).  Under
    `torch.compile` its values are checked by the custom op when it runs (a check here
    would read them back while tracing)."""
    if is_dtensor(rand):
        rand = rand.full_tensor()
    if not isinstance(rand, Tensor):
        raise TypeError(
            f"rand must be an integer torch.Tensor or 'data', got {type(rand).__name__}"
        )
    if rand.dtype.is_floating_point or rand.dtype.is_complex or rand.dtype == torch.bool:
        raise TypeError(f"rand must have an integer dtype, got {rand.dtype}")
    try:
        shape = torch.broadcast_shapes(rand.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(
            f"rand of shape {tuple(rand.shape)} does not broadcast to x's shape {tuple(x.shape)}"
        )
    rand = rand.to(device=x.device, dtype=torch.int64)
    if not torch.compiler.is_compiling():
        check_rand_values(rand, n)
    return rand


def check_rand_values(rand: Tensor, n: int) -> None:
    """ValueError unless the int64 tensor ``rand`` holds integers in [0, 2**n) (a read of
    its extremes: on CUDA the call waits for it)."""
    if rand.numel() and (int(rand.min()) < 0 or int(rand.max()) >= 2**n):
        raise ValueError(
            f"rand must hold integers in [0, 2**{n}) (rbits={n}); got values in "
            f"[{int(rand.min())}, {int(rand.max())}]"
        )


def check_choices(
    fmt: Format | str | torch.dtype, mode: str, rbits: int | None, variant: str, sat: str, nan: str
) -> tuple[Format, int]:
    """The format and random bits n of a call's choices, each choice checked (an error
    naming it)."""
    check_mode(mode)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    check_choice("nan", nan, NAN_POLICIES)
    return find_format(fmt), check_rbits(rbits)


def rand_source(rand: object) -> str:
    """The random source a call's ``rand`` names: "stream" (None), "data" or "rand"."""
    if rand is None:
        return "stream"
    return "data" if isinstance(rand, str) else "rand"


def check_call_values(
    x: Tensor,
    mode: str,
    rbits: int | None,
    n: int,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    rand: Tensor | str | None,
    index_offset: int,
) -> tuple[int | Tensor, int | Tensor, Tensor | None, int]:
    """A call's per-call values checked (an error naming each), as the paths take them:
    (seed, offset, rand, index_offset) — the seed drawn if None, the offset 0 if None,
    rand as int64 integers of x's shape, and 0, 0, None for what the call does not use."""
    index_offset = streams.check_index_offset(index_offset)
    if mode != "sr":
        check_sr_only(mode, rbits, rand)
        return 0, 0, None, index_offset
    if rand is None:
        offset = 0 if offset is None else streams.check_seed(offset, "offset")
        return _drawn_seed(seed), offset, None, index_offset
    if isinstance(rand, str):
        if rand != "data":
            raise ValueError(f"rand must be an integer tensor or 'data'; got {rand!r}")
        return 0, 0, None, index_offset
    return 0, 0, _check_rand(x, rand, n).expand(x.shape), index_offset


def check_sr_only(mode: str, rbits: int | None, rand: object) -> None:
    """ValueError where a call in a deterministic ``mode`` gives ``rbits`` or ``rand``,
    which only SR draws on."""
    if mode != "sr" and (rbits is not None or rand is not None):
        raise ValueError(f"rbits and rand apply to mode='sr' only; got mode={mode!r}")


def _drawn_seed(seed: int | Tensor | None) -> int | Tensor:
    """The seed checked, or for None one drawn from torch's default generator: an int, or
    under `torch.compile` a one-element tensor of the same draws (`default_seed_tensor`:
    reading the draws back while tracing would break the graph)."""
    if seed is not None:
        return streams.check_seed(seed, "seed")
    if torch.compiler.is_compiling():
        return streams.default_seed_tensor()
    return streams.default_seed()


def check_request(
    x: Tensor,
    fmt: Format | str,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    rand: Tensor | str | None,
    index_offset: int,
    nan: str = "raise",
) -> Request:
    """Check every argument (ValueError/TypeError naming it); draw the seed if None."""
    check_input(x)
    mode = check_mode(mode)
    fmt, n = check_choices(fmt, mode, rbits, variant, sat, nan)
    source = rand_source(rand)
    seed, offset, rand, index_offset = check_call_values(
        x, mode, rbits, n, seed, offset, rand, index_offset
    )
    return Request(fmt, mode, sat, n, variant, source, seed, offset, index_offset, rand, nan)


__all__ = [
    "NAN_POLICIES",
    "check_call_values",
    "check_choices",
    "check_input",
    "check_input_state",
    "check_rand_values",
    "check_request",
    "check_sr_only",
    "rand_source",
]
