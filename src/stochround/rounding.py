"""The user entry points `round`, `cast`, `encode` and `decode`: their checks, the one
dispatch point between the PyTorch path and the Triton kernels, the `stochround::round`
custom op, DTensor inputs, and rounding as a hardware preset's unit does.

`round`, `encode` and `cast` share one body, `_round_call`: a call's choices are checked and
routed once per set of them (`_call_route`, cached), its per-call values (seed, offset,
rand, index_offset) on every call.  The route picks the backend: ``backend="auto"`` uses
the Triton kernels (`stochround.kernels.rounding`) for CUDA tensors they support and the
PyTorch path (`stochround.torch_path`) otherwise; hardware presets (``hardware=``) round
on the PyTorch path.  Calls under `torch.compile`, for autograd or on DTensors go through
the custom op, whose arguments are typed (no value is formatted into text, so a traced
int passes as a `torch.SymInt`) and whose body (`_dispatch`) routes them the same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from . import cpu_path
from . import random as streams
from .formats import NAN_ENCODINGS, Format, format_of_dtype
from .formats import format as find_format
from .kernels.availability import BACKENDS, check_backend, kernels_refusal
from .packing import PACK_GROUPS, PACKINGS
from .presets import HardwarePreset, preset
from .reference import (
    MODES,
    SATURATIONS,
    VARIANTS,
    WORD_BITS,
    check_choice,
    check_mode,
    check_rbits,
)
from .shards import block_of, first_index, is_dtensor, local_block, placed
from .torch_path import (
    FLOAT_DTYPES,
    OUTPUTS,
    Request,
    checks_nan,
    code_dtype,
    decode_values,
    output_shape,
    refuse_capture,
    round_tensor,
)

if TYPE_CHECKING:  # for annotations only: the kernels import Triton, DTensor is distributed's
    from torch.distributed.tensor import DTensor

    from .kernels.rounding import KernelPlan


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


def _unsupported_input(x: Tensor) -> str | None:
    """What makes x an input the rounding functions do not support, or None."""
    if x.layout != torch.strided:
        return f"{x.layout} tensors: x must be dense (strided); pass x.to_dense()"
    if x.is_meta:
        return "meta tensors: x has no data to round"
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


def _check_choices(
    fmt: Format | str | torch.dtype, mode: str, rbits: int | None, variant: str, sat: str, nan: str
) -> tuple[Format, int]:
    """The format and random bits n of a call's choices, each choice checked (an error
    naming it)."""
    check_mode(mode)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    check_choice("nan", nan, NAN_POLICIES)
    return find_format(fmt), check_rbits(rbits)


def _source(rand: object) -> str:
    """The random source a call's ``rand`` names: "stream" (None), "data" or "rand"."""
    if rand is None:
        return "stream"
    return "data" if isinstance(rand, str) else "rand"


def _check_values(
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
        if rbits is not None or rand is not None:
            raise ValueError(f"rbits and rand apply to mode='sr' only; got mode={mode!r}")
        return 0, 0, None, index_offset
    if rand is None:
        offset = 0 if offset is None else streams.check_seed(offset, "offset")
        return _drawn_seed(seed), offset, None, index_offset
    if isinstance(rand, str):
        if rand != "data":
            raise ValueError(f"rand must be an integer tensor or 'data'; got {rand!r}")
        return 0, 0, None, index_offset
    return 0, 0, _check_rand(x, rand, n).expand(x.shape), index_offset


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
    fmt, n = _check_choices(fmt, mode, rbits, variant, sat, nan)
    source = _source(rand)
    seed, offset, rand, index_offset = _check_values(
        x, mode, rbits, n, seed, offset, rand, index_offset
    )
    return Request(fmt, mode, sat, n, variant, source, seed, offset, index_offset, rand, nan)


class Route(NamedTuple):
    """What a call's choices decide (`_call_route`, once per set of them)."""

    fmt: Format
    n: int  # random bits
    output: str  # OUTPUTS
    out_dtype: torch.dtype  # the result's: values' dtype, codes' integer dtype, or cast's
    plan: KernelPlan | None  # the Triton kernels' plan; None: the PyTorch path rounds
    checked: bool  # whether the call checks for NaN results (`checks_nan`)
    cpu: bool = False  # the compiled CPU path rounds it where x is large enough (`_dispatch`)


def _output_of(
    fmt: Format, output: str, out_dtype: torch.dtype | None, x_dtype: torch.dtype
) -> tuple[str, torch.dtype]:
    """The output and result dtype an entry point asks for: ``output`` "packed" (`encode`'s
    packed=True) is the packing of the format's width, in bytes; ``out_dtype`` None is x's
    dtype for values and the integer dtype of the format's width for codes."""
    if output == "packed":
        if fmt.bits not in PACKINGS:
            raise ValueError(
                f"packed=True packs formats of {' or '.join(map(str, PACKINGS))} bits; "
                f"{fmt.name} has {fmt.bits}"
            )
        return PACKINGS[fmt.bits][0], torch.uint8
    if out_dtype is not None:
        return output, out_dtype
    return output, x_dtype if output == "value" else code_dtype(fmt.bits)


@functools.lru_cache(maxsize=512, typed=True)  # typed: rbits=True is no rbits=1
def _call_route(
    fmt: Format | str | torch.dtype,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    nan: str,
    source: str,
    backend: str,
    output: str,
    out_dtype: torch.dtype | None,
    x_dtype: torch.dtype,
    on_cuda: bool,
    through_op: bool,
) -> Route:
    """The route of a call's choices (``output`` and ``out_dtype`` as `_output_of` takes
    them) for x of ``x_dtype`` on a CUDA device or not, each choice checked (an error naming
    it).  Decided once per set of choices: calls repeat them, and checking them and finding
    the kernels' plan per call took a fifth of a checked e2m1 call's host time.  ValueError
    where ``backend="triton"`` cannot round them (an error is not cached).

    ``through_op`` (`_through_op`): the call goes through the custom op, whose body routes
    it again; its route has no plan (no backend decided), so that `torch.compile`, which
    traces this function (`_route`), never builds one (a `KernelPlan` cannot be traced)."""
    fmt, n = _check_choices(fmt, mode, rbits, variant, sat, nan)
    check_backend(backend)
    output, out_dtype = _output_of(fmt, output, out_dtype, x_dtype)
    route = Route(fmt, n, output, out_dtype, None, checks_nan(fmt, nan, output))
    if through_op or backend == "torch":
        return route
    if backend == "auto" and not on_cuda:
        serves = _cpu_path_serves(fmt, mode, source, output, out_dtype, x_dtype, n, variant)
        return route._replace(cpu=serves)
    reason = kernels_refusal("x", on_cuda)
    if reason is None:
        # imported here: the kernels import Triton, which CPU-only calls never need
        from .kernels import rounding as kernels

        reason = kernels.rounding_refusal(x_dtype, fmt, output)
        if reason is None:
            plan = kernels.kernel_plan(output, out_dtype, nan, fmt, mode, sat, n, variant, source)
            return route._replace(plan=plan)
    if backend == "triton":
        raise ValueError(f"backend='triton' cannot round this call: {reason}")
    return route  # auto: what the kernels cannot do


def _cpu_path_serves(
    fmt: Format,
    mode: str,
    source: str,
    output: str,
    out_dtype: torch.dtype,
    x_dtype: torch.dtype,
    n: int,
    variant: str,
) -> bool:
    """Whether the compiled CPU path (`stochround.cpu_path`) takes a CPU call of these
    choices: SR from the stream to bfloat16 values (a bf16 result, or fp32 values), with
    the random bits and variants it takes (`_dispatch` sends it there where x is large
    enough and `torch.compile` can build the path)."""
    return (
        mode == "sr"
        and source == "stream"
        and output == "value"
        and fmt.name == "bfloat16"
        and out_dtype in (torch.bfloat16, torch.float32)
        and cpu_path.supports(x_dtype, n, variant)
    )


def _route(choices: tuple, x_dtype: torch.dtype, on_cuda: bool, through_op: bool) -> Route:
    """`_call_route` of a call's choices: from its cache, except under `torch.compile`,
    which traces the function itself (calling the cached wrapper there makes Dynamo warn
    at every compiled call) and folds it to constants, and for unhashable choices, which
    are routed uncached for the error naming them."""
    if torch.compiler.is_compiling():
        return _call_route.__wrapped__(*choices, x_dtype, on_cuda, through_op)
    try:
        return _call_route(*choices, x_dtype, on_cuda, through_op)
    except TypeError:  # an unhashable choice
        return _call_route.__wrapped__(*choices, x_dtype, on_cuda, through_op)


def _through_op(x: Tensor) -> bool:
    """Whether a call goes through the `stochround::round` custom op: under
    `torch.compile`, for autograd, or for a DTensor (shard by shard)."""
    return (
        torch.compiler.is_compiling()
        or (x.requires_grad and torch.is_grad_enabled())
        or is_dtensor(x)
    )


def _stream_values(
    stream: object, seed: int | Tensor | None, offset: int | Tensor | None, rand: object, sr: bool
) -> tuple[int | Tensor | None, int | Tensor | None]:
    """The (seed, offset) a call with ``stream=`` draws from: the stream's, which an SR
    call (``sr``) advances; a call in a deterministic mode draws nothing and leaves it as
    it is.  ValueError where seed=, offset= or rand= is given too."""
    if not isinstance(stream, streams.Stream):
        raise TypeError(f"stream must be a stochround.Stream, got {type(stream).__name__}")
    if seed is not None or offset is not None:
        raise ValueError(
            "stream= gives the seed and offset: pass stream= or seed=/offset=, not both"
        )
    if rand is not None:
        raise ValueError("rand= replaces the random stream: pass stream= or rand=, not both")
    return stream.take() if sr else (None, None)


def _hardware_unit(
    hardware: str | HardwarePreset,
    fmt: Format | str | torch.dtype | None,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    rand: object,
    backend: str,
) -> HardwarePreset:
    """The preset a call's ``hardware=`` names (``fmt`` picks the unit of a family or
    confirms it), checked against the call's other choices: the preset fixes the mode,
    rbits, variant and saturation, and rounds on the PyTorch path."""
    if mode not in ("rne", "sr") or rbits is not None or variant != "c" or sat != "none":
        raise ValueError(
            f"hardware={hardware!r} sets the mode, rbits, variant and sat; pass only x, the "
            "format (to pick or confirm the unit's), seed, offset or stream, rand, "
            "index_offset and nan"
        )
    if isinstance(rand, str):
        raise ValueError("hardware presets take rand as an integer tensor, not 'data'")
    check_backend(backend)
    if backend == "triton":
        raise ValueError("hardware presets round on the PyTorch path: backend='triton' cannot")
    return preset(hardware, None if fmt is None else find_format(fmt))


def _round_call(
    x: Tensor,
    fmt: Format | str | torch.dtype | None,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    rand: Tensor | str | None,
    index_offset: int,
    nan: str,
    backend: str,
    output: str,
    out_dtype: torch.dtype | None,
    hardware: str | HardwarePreset | None = None,
    stream: streams.Stream | None = None,
) -> Tensor:
    """The entry points' one body: check a call and round it (``output`` and ``out_dtype``
    as `_output_of` takes them; ``hardware`` and ``stream`` as `round` takes them).  The
    choices are checked and routed in one cached lookup and the per-call values checked
    apart; a call the kernels round that needs no custom op (`_through_op`) goes to the
    kernels' plan directly, the others to `_round_to` with a `Request` (the op's dispatch
    would only flatten the arguments and unflatten them again: about 40% of such a call's
    host time)."""
    check_input(x)
    mode = check_mode(mode)  # "SR" is "sr" below: every comparison sees the canonical name
    operand: Format | None = None
    flush_below: float | None = None
    if hardware is not None:
        unit = _hardware_unit(hardware, fmt, mode, rbits, variant, sat, rand, backend)
        fmt, mode, rbits, variant, sat = unit.target, "sr", unit.rbits, unit.variant, unit.sat
        operand, flush_below, backend = unit.operand, unit.flush_below, "torch"
    elif fmt is None:
        raise ValueError("fmt is required (a format name or Format) unless hardware= is given")
    source, through_op = _source(rand), _through_op(x)
    choices = (fmt, mode, rbits, variant, sat, nan, source, backend, output, out_dtype)
    route = _route(choices, x.dtype, x.is_cuda, through_op)
    if stream is not None:  # taken once the choices are checked: a refused call takes none
        seed, offset = _stream_values(stream, seed, offset, rand, mode == "sr")
    seed, offset, rand, index_offset = _check_values(
        x, mode, rbits, route.n, seed, offset, rand, index_offset
    )
    group = PACK_GROUPS.get(route.output)
    if group is not None and (x.dim() == 0 or x.shape[-1] % group):
        raise ValueError(
            f"{route.fmt.name} codes are packed {group} together along x's last dimension, "
            f"which must be a multiple of {group}; got shape {tuple(x.shape)}"
        )
    if route.plan is not None:  # (none through the op)
        return route.plan.round(x, seed, offset, index_offset, rand)
    request = Request(
        route.fmt,
        mode,
        sat,
        route.n,
        variant,
        source,
        seed,
        offset,
        index_offset,
        rand,
        nan,
        operand,
        flush_below,
    )
    return _round_to(x, request, backend, route.output, route.out_dtype)


# The op's arguments are few and typed: the dispatcher's autograd path re-reads the schema
# once per argument for every argument, so its cost grows with their square.  The choices
# travel as their indices in these tuples, a format as its integer fields.
_SOURCES = ("stream", "rand", "data")
_CHOICES: tuple[tuple[str, ...], ...] = (
    MODES,
    SATURATIONS,
    VARIANTS,
    _SOURCES,
    NAN_POLICIES,
    BACKENDS,
    OUTPUTS,
)
_OUTPUT = _CHOICES.index(OUTPUTS)  # the choice the shape function and autograd read
_FORMAT_FIELDS = 8  # the ints of a format (`_format_fields`)


def _format_fields(fmt: Format | None) -> list[int]:
    """A format as op arguments: its fields as ints, the NaN encoding by its index in
    `NAN_ENCODINGS` (none for no format); its name travels apart."""
    if fmt is None:
        return []
    fields = (fmt.ebits, fmt.mbits, fmt.exponent_bias, fmt.signed, fmt.inf, fmt.subnormals)
    nan = NAN_ENCODINGS.index(fmt.nan)
    return [int(value) for value in (*fields, fmt.twos_complement, nan)]


@functools.lru_cache(maxsize=256)
def _format_from_fields(fields: tuple[int, ...], name: str = "") -> Format:
    """The format `_format_fields` flattened (``name`` empty: the layout's default)."""
    ebits, mbits, bias, signed, inf, subnormals, twos_complement, nan = fields
    return Format(
        ebits=ebits,
        mbits=mbits,
        bias=bias,
        signed=bool(signed),
        inf=bool(inf),
        nan=NAN_ENCODINGS[nan],
        subnormals=bool(subnormals),
        twos_complement=bool(twos_complement),
        name=name,
    )


def _round_to(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """Round a checked request through the `stochround::round` custom op (DTensors shard
    by shard), so `torch.compile(fullgraph=True)` sees one opaque op and autograd passes
    gradients straight through; calls that need no op (`_through_op`) call its body.

    The op's arguments are typed, none formatted into text: ints, a `torch.SymInt` where
    `torch.compile` traces a changing int (a step counter as the offset) included, pass
    through as they are (seeds and offsets as the signed 64-bit integers of their bits,
    `stochround.random.as_signed64`: an op's int is int64)."""
    if is_dtensor(x):
        return _round_dtensor(
            x, request, output, lambda local, req: _round_to(local, req, backend, output, out_dtype)
        )
    if not _through_op(x):
        return _dispatch(x, request, backend, output, out_dtype)
    seed, offset = request.seed, request.offset
    chosen = (request.mode, request.sat, request.variant, request.source, request.nan)
    choices = [
        options.index(value)
        for options, value in zip(_CHOICES, (*chosen, backend, output), strict=True)
    ]
    return torch.ops.stochround.round(
        x,
        seed if isinstance(seed, Tensor) else None,
        offset if isinstance(offset, Tensor) else None,
        request.rand,
        [
            0 if isinstance(seed, Tensor) else streams.as_signed64(seed),
            0 if isinstance(offset, Tensor) else streams.as_signed64(offset),
            request.n,
            request.index_offset,
            # traced, rand's values are checked when the op runs (`_check_rand`)
            int(request.rand is not None and torch.compiler.is_compiling()),
        ],
        choices,
        _format_fields(request.fmt) + _format_fields(request.operand),
        request.fmt.name,
        out_dtype,
        request.flush_below,
    )


@torch.library.custom_op("stochround::round", mutates_args=())
def _round_op(
    x: Tensor,
    seed_tensor: Tensor | None,
    offset_tensor: Tensor | None,
    rand: Tensor | None,
    ints: list[int],
    choices: list[int],
    format_fields: list[int],
    format_name: str,
    out_dtype: torch.dtype,
    flush_below: float | None,
) -> Tensor:
    """The op behind every entry point, its arguments typed as an op schema takes them: a
    `Request` flattened (`_round_to`).  ``ints``: the seed and offset (signed 64-bit ints;
    0 where a tensor gives them), the random bits, ``index_offset``, and whether to check
    ``rand``'s values; ``choices``: indices into `_CHOICES`; ``format_fields``: the
    target format's fields, then a hardware unit's operand format's, if any."""
    seed, offset, n, index_offset, check_rand = ints
    mode, sat, variant, source, nan, backend, output = (
        options[index] for options, index in zip(_CHOICES, choices, strict=True)
    )
    if check_rand:
        assert rand is not None  # set only with rand
        check_rand_values(rand, n)
    operand = tuple(format_fields[_FORMAT_FIELDS:])
    request = Request(
        _format_from_fields(tuple(format_fields[:_FORMAT_FIELDS]), format_name),
        mode,
        sat,
        n,
        variant,
        source,
        seed_tensor if seed_tensor is not None else streams.as_unsigned64(seed),
        offset_tensor if offset_tensor is not None else streams.as_unsigned64(offset),
        index_offset,
        rand,
        nan,
        _format_from_fields(operand) if operand else None,
        flush_below,
    )
    return _dispatch(x, request, backend, output, out_dtype)


@_round_op.register_fake
def _(x, seed_tensor, offset_tensor, rand, ints, choices, format_fields, name, out_dtype, flush):
    output = OUTPUTS[choices[_OUTPUT]]
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
    x, choices, out_dtype = inputs[0], inputs[5], inputs[8]
    ctx.x_dtype, ctx.inputs = x.dtype, len(inputs)
    if not _passes_gradient(OUTPUTS[choices[_OUTPUT]], out_dtype):
        ctx.mark_non_differentiable(output)


_round_op.register_autograd(_straight_through, setup_context=_save_for_backward)


def _dispatch(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """The one dispatch point between the PyTorch path and the Triton kernels, for a
    checked request (``output`` and ``out_dtype`` decided).  A hardware unit's request
    (``request.operand`` set) rounds on the PyTorch path."""
    route = _call_route(
        request.fmt,
        request.mode,
        request.n,
        request.variant,
        request.sat,
        request.nan,
        request.source,
        "torch" if request.operand is not None else backend,
        output,
        out_dtype,
        x.dtype,
        x.is_cuda,
        False,
    )
    if route.plan is not None:
        return route.plan.round(x, request.seed, request.offset, request.index_offset, request.rand)
    if route.cpu and cpu_path.worth_compiling(x.numel()) and cpu_path.compile_refusal() is None:
        stream = (request.seed, request.offset, request.index_offset)
        rounded = cpu_path.bf16_sr_cpu(x, *stream, request.n, request.variant, request.sat)
        return rounded if out_dtype == torch.bfloat16 else rounded.to(out_dtype)
    refuse_capture(route.checked, x, request.fmt)
    return round_tensor(x, request, output, out_dtype)


def _round_dtensor(
    x: DTensor, request: Request, output: str, round_local: Callable[[Tensor, Request], Tensor]
) -> Tensor:
    """Round a DTensor shard by shard: each rank rounds its local tensor with
    ``round_local`` and the random words of its elements' global (row-major) indices, so
    the result does not depend on the sharding; replicated placements round identically.

    Placements: `Replicate` and `Shard(d)` of any dimension, on meshes of any shape.  A
    shard of whole rows (sharded along dimension 0 only) is a range of global indices: it
    rounds from its first one (``index_offset``).  Any other shard draws its words (the
    stream's, or ``rand="data"``'s) at its elements' global indices and rounds with them
    as explicit integers; explicit ``rand`` gives each shard its part.  Packed codes
    (`encode(packed=True)`, `cast` to fp4) may be sharded along the last dimension where
    every shard holds whole groups of codes and the packed shards are the chunks of the
    packed result.  A checked call (``nan="raise"``) raises on the ranks whose shard holds
    a NaN result."""
    mesh, placements = x.device_mesh, x.placements
    local_shape, global_offset = local_block(x)
    # the global result: x's shape (packed codes: shorter rows), contiguous
    shape = torch.Size(output_shape(x.shape, output))
    expected = block_of(shape, mesh, placements)[0]
    group = PACK_GROUPS.get(output)
    if group is not None and (
        local_shape[-1] % group or tuple(output_shape(torch.Size(local_shape), output)) != expected
    ):
        raise ValueError(
            f"packed codes of x of shape {tuple(x.shape)} sharded as {placements}: every "
            f"shard must hold whole groups of {group} codes along the last dimension, and "
            "the packed shards must be the chunks of the packed result"
        )
    local_x = x.to_local()
    local = round_local(local_x, _shard_request(x, local_x, request, local_shape, global_offset))
    return placed(local, mesh, placements, shape)


def _shard_request(
    x: Tensor,
    local_x: Tensor,
    request: Request,
    local_shape: Sequence[int],
    global_offset: Sequence[int],
) -> Request:
    """The request of a shard (local shape and global offset of its block of ``x``) that
    rounds its elements as the whole tensor's request rounds them (`_round_dtensor`)."""
    start = first_index(x)
    if start is not None:  # whole rows: a range of indices
        rand = request.rand  # x's shape (checked): the shard's rows
        if rand is not None and x.dim():
            rand = rand[global_offset[0] : global_offset[0] + local_shape[0]]
        return request._replace(index_offset=request.index_offset + start, rand=rand)
    block = tuple(
        slice(first, first + size) for first, size in zip(global_offset, local_shape, strict=True)
    )
    if request.source == "rand":
        assert request.rand is not None  # checked: x's shape
        return request._replace(rand=request.rand[block])
    if request.mode != "sr":
        return request
    strides, device = torch.empty(x.shape, device="meta").stride(), local_x.device
    index = torch.full(tuple(local_shape), request.index_offset, dtype=torch.int64, device=device)
    for dim, (first, size) in enumerate(zip(global_offset, local_shape, strict=True)):
        along = torch.arange(first, first + size, dtype=torch.int64, device=device)
        index = index + (along * strides[dim]).reshape(
            [size if d == dim else 1 for d in range(x.dim())]
        )
    if request.source == "data":
        words = streams.data_words(local_x.detach(), index)
    else:
        words = streams.random_words(index, request.seed, request.offset)
    rand = words >> (WORD_BITS - request.n)
    return request._replace(source="rand", rand=rand, index_offset=0)


def round_float64(
    x: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
) -> Tensor:
    """The PyTorch path's rounded values as float64, which holds every format exactly
    (DTensors shard by shard, as `round`)."""
    request = check_request(x, fmt, mode, rbits, variant, sat, seed, offset, rand, index_offset)
    if is_dtensor(x):
        return _round_dtensor(
            x, request, "value", lambda local, req: round_tensor(local, req, "value", torch.float64)
        )
    return round_tensor(x, request, "value", torch.float64)


def round(  # noqa: A001 - the public name users type, shadowing the builtin on purpose
    x: Tensor,
    fmt: Format | str | torch.dtype | None = None,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    hardware: str | HardwarePreset | None = None,
    stream: streams.Stream | None = None,
) -> Tensor:
    """Round every element of ``x`` to a value of ``fmt``; the result has x's dtype and shape.

    ``fmt``: a format, its name, or a torch dtype (its format: ``torch.float8_e4m3fn`` is
    e4m3fn).  ``mode``: rne, rna, rz, ru, rd, ro (round to odd) or sr.  For ``sr``,
    ``rbits`` random bits (1..32; None: exact SR with 32-bit words) and ``variant``
    a/b/c/odd decide: with nu the fraction being rounded away (in ulps) and r the random
    integer, the value rounds away from zero iff count + r >= 2**rbits, count the floor
    (a), half-up (b), half-even (c) or half-odd (odd) rounding of nu 2**rbits (the
    rounding contract in the docs).  The random integers are the top ``rbits`` bits of the
    word of ``(seed, offset, index_offset + flat index)`` in the Philox stream (seed None:
    drawn from torch's default generator; offset None: 0), or of a `stochround.Stream`'s
    next ``(seed, offset)`` (``stream=``, which the call advances; not with seed= or
    offset=), or ``rand``: integers in [0, 2**rbits) broadcastable to x, or ``"data"``:
    words hashed from each value and its index (no state at all).  Ints may be Python or
    numpy integers.  ``sat``: finite, propagate or none (P3109).  ``backend``: auto, torch
    or triton.  A rounded value outside x's dtype's range becomes infinite or zero in that
    dtype, except that a finite result at the format's bound (saturated by ``sat`` finite
    or propagate, or kept there by a directed mode) is the value of x's dtype nearest the
    bound and within it (bf16 holds no 65504: fp16's max becomes 65280).

    ``hardware``: a `stochround.hardware` preset or its name (``"amd-mi300-fp8"``, ...),
    which sets the format, variant, rbits and saturation of a documented SR unit, or of a
    family of them with ``fmt`` naming the unit's format (``"amd-mi300"`` with
    ``"e5m2fnuz"``); PyTorch path only.

    Gradients pass straight through (d round(x) / dx := 1, also with ``hardware``).  Under
    `torch.compile(fullgraph=True)` every form of the call traces as one op; an int seed
    or offset that changes between calls (a step counter) compiles once more, as a
    dynamic int, and then not again.
    """
    return _round_call(
        x,
        fmt,
        mode,
        rbits,
        variant,
        sat,
        seed,
        offset,
        rand,
        index_offset,
        "raise",
        backend,
        "value",
        None,
        hardware,
        stream,
    )


def preset_operand(x: Tensor, unit: HardwarePreset) -> Tensor:
    """A hardware unit's operand: x rounded to nearest-even in the preset's source format
    (the identity when x already has that format), in that format's torch dtype when it
    has one (float64 otherwise), which holds it exactly."""
    dtype = unit.operand.torch_dtype
    if check_input(x).dtype == dtype:
        return x
    operand = round_float64(x, unit.source_format, "rne")
    return operand if dtype is None else operand.to(dtype)


def round_preset(
    operand: Tensor,
    unit: HardwarePreset,
    seed: int | Tensor | None,
    offset: int | Tensor,
    rand: Tensor | None,
    variant: str | None = None,
    rbits: int | None = None,
    index_offset: int = 0,
) -> Tensor:
    """The preset's rounding of its operand values (`preset_operand`), as float64: SR to the
    target format with the preset's variant, rbits (or the ones given) and saturation, from
    ``rand`` (integers broadcastable to the operand) or the stream ``(seed, offset)`` at
    the elements' indices from ``index_offset``, then the unit's flush to zero."""
    if isinstance(rand, Tensor):
        # expanded to the operand's shape where it broadcasts (round_float64 reports the
        # shape that does not)
        with contextlib.suppress(RuntimeError):
            rand = torch.broadcast_to(rand, operand.shape)
    result = round_float64(
        operand,
        unit.target_format,
        "sr",
        rbits=unit.rbits if rbits is None else rbits,
        variant=unit.variant if variant is None else variant,
        sat=unit.sat,
        seed=seed,
        offset=offset,
        rand=rand,
        index_offset=index_offset,
    )
    return unit.flush(operand.to(torch.float64), result)


def encode(
    x: Tensor,
    fmt: Format | str | torch.dtype | None,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    nan: str = "raise",
    packed: bool = False,
    hardware: str | HardwarePreset | None = None,
    stream: streams.Stream | None = None,
) -> Tensor:
    """Round x to ``fmt`` (as `round`, with the same arguments) and return the bit patterns.

    Codes are uint8 for formats of at most 8 bits, else int16/int32/int64 holding the bit
    pattern as `Tensor.view` would (``encode(x, "bf16") == x.to(bf16).view(int16)``).
    NaN becomes the canonical quiet NaN code.  In a format without a NaN code (e2m1, e2m3,
    e3m2), a NaN result (a NaN input, or an overflow with ``sat="none"``) raises ValueError
    with ``nan="raise"``, for which a CUDA call waits for its kernel before it returns (no
    CUDA-graph capture); ``nan="zero"`` stores code 0 (+0) for it, unchecked and
    asynchronous (with ``sat="finite"`` only NaN inputs are affected).

    ``packed=True`` (4-bit and 6-bit formats) returns the codes packed along the last
    dimension as `pack` packs them — two 4-bit codes a byte, four 6-bit codes in three
    bytes — written by the rounding kernel itself on CUDA (no uint8 codes in between).
    ``hardware``: a preset's codes (``fmt`` None: the preset's target format).  Codes are
    integers: they carry no gradient (the result does not require grad).
    """
    if not isinstance(packed, bool):
        raise TypeError(f"packed must be a bool, got {type(packed).__name__}")
    output = "packed" if packed else "codes"
    return _round_call(
        x,
        fmt,
        mode,
        rbits,
        variant,
        sat,
        seed,
        offset,
        rand,
        index_offset,
        nan,
        backend,
        output,
        None,
        hardware,
        stream,
    )


def decode(
    codes: Tensor, fmt: Format | str | torch.dtype, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The values of bit patterns (any integer dtype; the low ``fmt.bits`` bits are used)."""
    fmt = find_format(fmt)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {FLOAT_DTYPES}; got {dtype}")
    if not fmt.fits_in(format_of_dtype(dtype)):
        raise ValueError(f"format {fmt.name} does not fit in {dtype}; pass dtype=torch.float64")
    return decode_values(codes.to(torch.int64), fmt, dtype)


def _torch_saturation(dtype: torch.dtype) -> str:
    """The ``sat`` that gives the overflow of ``x.to(dtype)`` in this torch: e4m3fn
    saturates to +-448 (torch 2.x releases before it gave NaN, as sat="none"; read off
    torch itself); every other dtype gives +-inf where it has infinities, NaN where it has
    none."""
    if dtype != getattr(torch, "float8_e4m3fn", None):
        return "none"
    overflow = torch.tensor([1000.0]).to(dtype).to(torch.float32)
    return "finite" if bool(overflow[0] == 448) else "none"


class _CastTarget(NamedTuple):
    """What `cast` rounds to for a dtype: its format, the output that holds it (fp4 packed
    two a byte, 8-bit formats as codes, wider ones as values), and ``sat=None``'s
    saturation (`_torch_saturation`)."""

    fmt: Format
    output: str
    sat: str


def _cast_target(dtype: torch.dtype) -> _CastTarget:
    fmt = format_of_dtype(dtype)
    return _CastTarget(
        fmt, {4: "fp4x2", 8: "codes"}.get(fmt.bits, "value"), _torch_saturation(dtype)
    )


# the dtypes `cast` rounds to (those this torch has)
_CAST_TARGETS: dict[torch.dtype, _CastTarget] = {
    dtype: _cast_target(dtype)
    for dtype in (
        getattr(torch, name)
        for name in (
            "float64",
            "float32",
            "bfloat16",
            "float16",
            "float8_e4m3fn",
            "float8_e5m2",
            "float8_e4m3fnuz",
            "float8_e5m2fnuz",
            "float8_e8m0fnu",
            "float4_e2m1fn_x2",
        )
        if hasattr(torch, name)
    )
}

CAST_DTYPES: tuple[torch.dtype, ...] = tuple(_CAST_TARGETS)


def cast(
    x: Tensor,
    dtype: torch.dtype,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str | None = None,
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    nan: str = "raise",
    hardware: str | HardwarePreset | None = None,
    stream: streams.Stream | None = None,
) -> Tensor:
    """Round x to the format of a torch dtype and return the result in that dtype (the
    other arguments as in `round`).

    ``sat=None`` (the default) handles overflow as ``x.to(dtype)`` does, so that
    ``cast(x, dtype)`` equals ``x.to(dtype)`` bit for bit (NaN for NaN: torch's NaN sign
    and payload bits are not kept): ``"finite"`` for float8_e4m3fn (torch saturates its
    overflow and infinities to +-448), ``"none"`` for every other dtype (+-inf where the
    dtype has infinities: float64/32, bf16, fp16, float8_e5m2; NaN where it has none:
    the fnuz dtypes and float8_e8m0fnu; and float4_e2m1fn_x2, which torch does not cast
    to, where NaN needs ``nan``).  float8_e8m0fnu is the exception: torch rounds it to
    nearest with ties up (mode ``"rna"`` here), takes negative values by their magnitude
    (here NaN: e8m0 has no negative values) and rounds fp32 subnormals apart.  ``sat``
    "none", "finite" or "propagate" choose P3109's handling instead.

    8-bit float dtypes hold the format's codes (`encode`); ``float4_e2m1fn_x2`` packs two
    e2m1 codes per byte along the last dimension (which must be even), the first in the
    low nibble.  ``nan``: what e2m1, which has no NaN code, holds for a NaN result, as in
    `encode` ("raise": ValueError, the call synchronizes; "zero": code 0, asynchronous).
    ``hardware``: a preset whose target format is the dtype's (its saturation replaces
    ``sat``).  Gradients pass straight through to x (in x's dtype) for every dtype but
    the packed float4_e2m1fn_x2, whose result does not require grad.
    """
    target = _CAST_TARGETS.get(dtype) if isinstance(dtype, torch.dtype) else None
    if target is None:
        raise ValueError(f"dtype must be one of {', '.join(map(str, CAST_DTYPES))}; got {dtype}")
    if sat is None:
        sat = "none" if hardware is not None else target.sat
    return _round_call(
        x,
        target.fmt,
        mode,
        rbits,
        variant,
        sat,
        seed,
        offset,
        rand,
        index_offset,
        nan,
        backend,
        target.output,
        dtype,
        hardware,
        stream,
    )


__all__ = [
    "CAST_DTYPES",
    "NAN_POLICIES",
    "cast",
    "check_input",
    "check_rand_values",
    "check_request",
    "decode",
    "encode",
    "preset_operand",
    "round",
    "round_float64",
    "round_preset",
]
