"""The `stochround::round` custom op: a checked `Request` as named, typed op arguments, so
that `torch.compile(fullgraph=True)` traces a rounding call as one opaque node and
autograd passes the gradient straight through.

No value is formatted into text: ints (a `torch.SymInt` where `torch.compile` traces a
changing int, such as a step counter as the offset) pass through as they are, seeds and
offsets as the signed 64-bit integers of their bits (`stochround.random.as_signed64`: an
op's int is int64).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..formats import NAN_ENCODINGS, Format
from ..shards import is_dtensor
from ..torch_path import Request, output_shape
from .checks import check_rand_values
from .dtensor import round_dtensor
from .route import dispatch, through_op


class FormatFields(NamedTuple):
    """A format as the op takes it (its name travels apart): the fields of `Format` as
    ints, the NaN encoding as its index in `NAN_ENCODINGS`."""

    ebits: int
    mbits: int
    bias: int
    signed: bool
    inf: bool
    subnormals: bool
    twos_complement: bool
    nan: int  # index in NAN_ENCODINGS

    @classmethod
    def of(cls, fmt: Format) -> FormatFields:
        """The fields of ``fmt``."""
        flags = (fmt.signed, fmt.inf, fmt.subnormals, fmt.twos_complement)
        return cls(fmt.ebits, fmt.mbits, fmt.exponent_bias, *flags, NAN_ENCODINGS.index(fmt.nan))

    def to_op(self) -> list[int]:
        """The fields as the op schema's ``int[]``, in field order."""
        return [int(value) for value in self]

    @classmethod
    def from_op(cls, values: Sequence[int]) -> FormatFields:
        """The fields `to_op` flattened (ValueError unless there are as many as fields)."""
        if len(values) != len(cls._fields):
            raise ValueError(f"a format travels as {len(cls._fields)} ints; got {len(values)}")
        ebits, mbits, bias, signed, inf, subnormals, twos_complement, nan = values
        flags = (bool(signed), bool(inf), bool(subnormals), bool(twos_complement))
        return cls(int(ebits), int(mbits), int(bias), *flags, int(nan))

    def format(self, name: str = "") -> Format:
        """The format of these fields (``name`` empty: the layout's default name)."""
        return _format_of(self, name)


@functools.lru_cache(maxsize=256)
def _format_of(fields: FormatFields, name: str) -> Format:
    return Format(
        ebits=fields.ebits,
        mbits=fields.mbits,
        bias=fields.bias,
        signed=fields.signed,
        inf=fields.inf,
        nan=NAN_ENCODINGS[fields.nan],
        subnormals=fields.subnormals,
        twos_complement=fields.twos_complement,
        name=name,
    )


def round_through_op(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """Round a checked request through the `stochround::round` custom op (DTensors shard
    by shard); calls that need no op (`through_op`) call its body's dispatch directly."""
    if is_dtensor(x):
        return round_dtensor(
            x,
            request,
            output,
            lambda local, req: round_through_op(local, req, backend, output, out_dtype),
        )
    if not through_op(x):
        return dispatch(x, request, backend, output, out_dtype)
    seed, offset = request.seed, request.offset
    return torch.ops.stochround.round(
        x,
        seed_tensor=seed if isinstance(seed, Tensor) else None,
        offset_tensor=offset if isinstance(offset, Tensor) else None,
        rand=request.rand,
        seed=0 if isinstance(seed, Tensor) else streams.as_signed64(seed),
        offset=0 if isinstance(offset, Tensor) else streams.as_signed64(offset),
        rbits=request.n,
        index_offset=request.index_offset,
        # traced, rand's values are checked when the op runs (`checks.check_call_values`)
        check_rand=request.rand is not None and torch.compiler.is_compiling(),
        mode=request.mode,
        sat=request.sat,
        variant=request.variant,
        source=request.source,
        nan=request.nan,
        backend=backend,
        output=output,
        format_fields=FormatFields.of(request.fmt).to_op(),
        format_name=request.fmt.name,
        operand_fields=[] if request.operand is None else FormatFields.of(request.operand).to_op(),
        out_dtype=out_dtype,
        flush_below=request.flush_below,
    )


def _round_op_body(
    x: Tensor,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    rand: Tensor | None,
    seed: int,
    offset: int,
    rbits: int,
    index_offset: int,
    check_rand: bool,
    mode: str,
    sat: str,
    variant: str,
    source: str,
    nan: str,
    backend: str,
    output: str,
    format_fields: list[int],
    format_name: str,
    operand_fields: list[int],
    out_dtype: torch.dtype,
    flush_below: float | None,
) -> Tensor:
    """The op behind every entry point: a `Request` flattened (`round_through_op`).
    ``seed``/``offset``: signed 64-bit ints, 0 where ``seed_tensor``/``offset_tensor``
    give them; ``check_rand``: whether to check ``rand``'s values here; ``format_fields``
    the target format's `FormatFields`, ``operand_fields`` a hardware unit's operand
    format's (empty: none); ``flush_below`` the unit's flush to zero."""
    if check_rand:
        assert rand is not None  # set only with rand
        check_rand_values(rand, rbits)
    request = Request(
        FormatFields.from_op(format_fields).format(format_name),
        mode,
        sat,
        rbits,
        variant,
        source,
        seed_tensor if seed_tensor is not None else streams.as_unsigned64(seed),
        offset_tensor if offset_tensor is not None else streams.as_unsigned64(offset),
        index_offset,
        rand,
        nan,
        FormatFields.from_op(operand_fields).format() if operand_fields else None,
        flush_below,
    )
    return dispatch(x, request, backend, output, out_dtype)


# every argument named and typed; each one costs host time on calls through the op (the
# dispatcher's autograd path reads the schema per argument for every argument), so a new
# argument is added only for a new choice
_round_op = torch.library.custom_op("stochround::round", _round_op_body, mutates_args=())

# the position of each argument in the `inputs` that the fake and autograd functions get
_POSITION = {name: index for index, name in enumerate(inspect.signature(_round_op_body).parameters)}


@_round_op.register_fake
def _round_op_shape(x: Tensor, *arguments: object) -> Tensor:
    """The op's result: empty, of the output's shape and dtype."""
    output, out_dtype = (arguments[_POSITION[name] - 1] for name in ("output", "out_dtype"))
    assert isinstance(output, str) and isinstance(out_dtype, torch.dtype)
    return x.new_empty(output_shape(x.shape, output), dtype=out_dtype)


def _passes_gradient(output: str, out_dtype: torch.dtype) -> bool:
    """Whether an output carries the straight-through gradient: values, and `cast`'s 8-bit
    float dtypes (one value an element); packed codes (several values a byte) and integer
    codes do not (they are not differentiable)."""
    return output in ("value", "codes") and out_dtype.is_floating_point


def _straight_through(ctx, grad: Tensor) -> tuple:
    """d round(x) / dx := 1 (the straight-through estimator): the output's gradient, in x's
    dtype (a gradient of an 8-bit float cast arrives in that dtype)."""
    return (grad.to(ctx.x_dtype),) + (None,) * (ctx.inputs - 1)


def _save_for_backward(ctx, inputs: tuple, output: Tensor) -> None:
    x, kind, out_dtype = (inputs[_POSITION[name]] for name in ("x", "output", "out_dtype"))
    ctx.x_dtype, ctx.inputs = x.dtype, len(inputs)
    if not _passes_gradient(kind, out_dtype):
        ctx.mark_non_differentiable(output)


_round_op.register_autograd(_straight_through, setup_context=_save_for_backward)


__all__ = ["FormatFields", "round_through_op"]
