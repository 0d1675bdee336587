"""The user entry points `round`, `cast`, `encode` and `decode`: their checks, the one
dispatch point between the PyTorch path and the Triton kernels, the `stochround::round`
custom op, DTensor inputs, and rounding as a hardware preset's unit does.

`round`, `encode` and `cast` share one body, `_round_call`: a call's choices are checked and
routed once per set of them (`_call_route`, cached), its per-call values (seed, offset,
rand, index_offset) on every call.  The route picks the backend: ``backend="auto"`` uses
the Triton kernels (`stochround.kernels.rounding`) for CUDA tensors they support and the
PyTorch path (`stochround.torch_path`) otherwise.  Calls under `torch.compile`, for
autograd or on DTensors go through the custom op, whose body (`_dispatch`) routes them the
same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeGuard

import torch
from torch import Tensor

from . import random as streams
from .formats import Format, format_of_dtype
from .formats import format as find_format
from .kernels.availability import kernels_refusal
from .packing import PACK_GROUPS, PACKINGS
from .presets import HardwarePreset, preset
from .reference import MODES, SATURATIONS, VARIANTS, check_choice, check_rbits
from .torch_path import (
    FLOAT_DTYPES,
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

BACKENDS = ("auto", "torch", "triton")

# what codes of a format without a NaN code hold for a NaN result: "raise" checks (a
# ValueError; on CUDA the call waits for its kernel), "zero" stores code 0 (+0) unchecked
NAN_POLICIES = ("raise", "zero")


def check_input(x: object) -> Tensor:
    """x, if it is a tensor of a floating dtype the rounding functions take."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(dtype) for dtype in FLOAT_DTYPES)
        raise TypeError(f"x must have a floating dtype ({allowed}); got {x.dtype}")
    return x


def _check_rand(x: Tensor, rand: object, n: int) -> Tensor:
    """rand as int64 integers on x's device, checked: the whole tensor's (a DTensor's
    shards are gathered: a DTensor input takes the rows of its shard)."""
    if _is_dtensor(rand):
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
    if rand.numel() and (int(rand.min()) < 0 or int(rand.max()) >= 2**n):
        raise ValueError(
            f"rand must hold integers in [0, 2**{n}) (rbits={n}); got values in "
            f"[{int(rand.min())}, {int(rand.max())}]"
        )
    return rand


def _check_choices(
    fmt: Format | str, mode: str, rbits: int | None, variant: str, sat: str, nan: str
) -> tuple[Format, int]:
    """The format and random bits n of a call's choices, each choice checked (an error
    naming it)."""
    check_choice("mode", mode, MODES)
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
    offset: int | Tensor,
    rand: Tensor | str | None,
    index_offset: int,
) -> tuple[int | Tensor, int | Tensor, Tensor | None]:
    """A call's per-call values checked (an error naming each), as the paths take them:
    (seed, offset, rand) — the seed drawn if None, rand as int64 integers of x's shape,
    and 0, 0, None for what the call does not use."""
    if isinstance(index_offset, bool) or not isinstance(index_offset, int) or index_offset < 0:
        raise ValueError(f"index_offset must be a nonnegative int; got {index_offset!r}")
    if mode != "sr":
        if rbits is not None or rand is not None:
            raise ValueError(f"rbits and rand apply to mode='sr' only; got mode={mode!r}")
        return 0, 0, None
    if rand is None:
        seed = streams.default_seed() if seed is None else streams.check_seed(seed, "seed")
        return seed, streams.check_seed(offset, "offset"), None
    if isinstance(rand, str):
        if rand != "data":
            raise ValueError(f"rand must be an integer tensor or 'data'; got {rand!r}")
        return 0, 0, None
    return 0, 0, _check_rand(x, rand, n).expand(x.shape)


def check_request(
    x: Tensor,
    fmt: Format | str,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor,
    rand: Tensor | str | None,
    index_offset: int,
    nan: str = "raise",
) -> Request:
    """Check every argument (ValueError/TypeError naming it); draw the seed if None."""
    check_input(x)
    fmt, n = _check_choices(fmt, mode, rbits, variant, sat, nan)
    source = _source(rand)
    seed, offset, rand = _check_values(x, mode, rbits, n, seed, offset, rand, index_offset)
    return Request(fmt, mode, sat, n, variant, source, seed, offset, index_offset, rand, nan)


class Route(NamedTuple):
    """What a call's choices decide (`_call_route`, once per set of them)."""

    fmt: Format
    n: int  # random bits
    output: str  # OUTPUTS
    out_dtype: torch.dtype  # the result's: values' dtype, codes' integer dtype, or cast's
    plan: KernelPlan | None  # the Triton kernels' plan; None: the PyTorch path rounds
    checked: bool  # whether the call checks for NaN results (`checks_nan`)


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
    fmt: Format | str,
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
    traces this function, never builds one (a `KernelPlan` cannot be traced)."""
    fmt, n = _check_choices(fmt, mode, rbits, variant, sat, nan)
    check_choice("backend", backend, BACKENDS)
    output, out_dtype = _output_of(fmt, output, out_dtype, x_dtype)
    route = Route(fmt, n, output, out_dtype, None, checks_nan(fmt, nan, output))
    if through_op or backend == "torch" or (backend == "auto" and not on_cuda):
        return route
    reason = kernels_refusal("x", on_cuda)
    if reason is None:
        # imported here: the kernels import Triton, which CPU-only calls never need
        from .kernels import rounding as kernels

        reason = kernels.unsupported(x_dtype, fmt, output)
        if reason is None:
            plan = kernels.kernel_plan(output, out_dtype, nan, fmt, mode, sat, n, variant, source)
            return route._replace(plan=plan)
    if backend == "triton":
        raise ValueError(f"backend='triton' cannot round this call: {reason}")
    return route  # auto: what the kernels cannot do


def _through_op(x: Tensor) -> bool:
    """Whether a call goes through the `stochround::round` custom op: under
    `torch.compile`, for autograd, or for a DTensor (shard by shard)."""
    return (
        torch.compiler.is_compiling()
        or (x.requires_grad and torch.is_grad_enabled())
        or _is_dtensor(x)
    )


def _round_call(
    x: Tensor,
    fmt: Format | str,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor,
    rand: Tensor | str | None,
    index_offset: int,
    nan: str,
    backend: str,
    output: str,
    out_dtype: torch.dtype | None,
) -> Tensor:
    """The entry points' one body: check a call and round it (``output`` and ``out_dtype``
    as `_output_of` takes them).  The choices are checked and routed in one cached lookup
    and the per-call values checked apart; a call the kernels round that needs no custom
    op (`_through_op`) goes to the kernels' plan directly, the others to `_round_to` with
    a `Request` (the op's dispatch would only flatten the arguments and unflatten them
    again: about 40% of such a call's host time)."""
    check_input(x)
    source, through_op = _source(rand), _through_op(x)
    choices = (fmt, mode, rbits, variant, sat, nan, source, backend, output, out_dtype)
    try:
        route = _call_route(*choices, x.dtype, x.is_cuda, through_op)
    except TypeError:  # an unhashable choice: routed uncached, for the error naming it
        route = _call_route.__wrapped__(*choices, x.dtype, x.is_cuda, through_op)
    seed, offset, rand = _check_values(x, mode, rbits, route.n, seed, offset, rand, index_offset)
    group = PACK_GROUPS.get(route.output)
    if group is not None and (x.dim() == 0 or x.shape[-1] % group):
        raise ValueError(
            f"{route.fmt.name} codes are packed {group} together along x's last dimension, "
            f"which must be a multiple of {group}; got shape {tuple(x.shape)}"
        )
    if route.plan is not None:  # (none through the op)
        return route.plan.round(x, seed, offset, index_offset, rand)
    request = Request(
        route.fmt, mode, sat, route.n, variant, source, seed, offset, index_offset, rand, nan
    )
    return _round_to(x, request, backend, route.output, route.out_dtype)


def _round_to(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """Round a checked request through the `stochround::round` custom op (DTensors shard
    by shard), so `torch.compile(fullgraph=True)` sees one opaque op and autograd passes
    gradients straight through; calls that need no op (`_through_op`) call its body."""
    if _is_dtensor(x):
        return _round_dtensor(
            x, request, output, lambda local, req: _round_to(local, req, backend, output, out_dtype)
        )
    if not _through_op(x):
        return _dispatch(x, request, backend, output, out_dtype)
    fmt = request.fmt
    seed, offset = request.seed, request.offset
    return torch.ops.stochround.round(
        x,
        seed if isinstance(seed, Tensor) else None,
        offset if isinstance(offset, Tensor) else None,
        # ints travel as text: seeds span [0, 2**64), beyond an op schema's int64
        f"{0 if isinstance(seed, Tensor) else seed}:{0 if isinstance(offset, Tensor) else offset}",
        request.rand,
        [fmt.ebits, fmt.mbits, fmt.bias, fmt.signed, fmt.inf, fmt.subnormals, fmt.twos_complement],
        f"{fmt.nan}:{fmt.name}",
        f"{request.mode}:{request.sat}:{request.variant}:{request.source}:{backend}:{output}:"
        f"{request.nan}",
        request.n,
        request.index_offset,
        out_dtype,
    )


@torch.library.custom_op("stochround::round", mutates_args=())
def _round_op(
    x: Tensor,
    seed: Tensor | None,
    offset: Tensor | None,
    seed_and_offset: str,
    rand: Tensor | None,
    format_fields: list[int],
    format_names: str,
    choices: str,
    n: int,
    index_offset: int,
    out_dtype: torch.dtype,
) -> Tensor:
    """The op behind every entry point (arguments flattened to types an op schema takes)."""
    request, backend, output = _unflatten(
        seed if seed is not None else int(seed_and_offset.split(":")[0]),
        offset if offset is not None else int(seed_and_offset.split(":")[1]),
        rand,
        format_fields,
        format_names,
        choices,
        n,
        index_offset,
    )
    return _dispatch(x, request, backend, output, out_dtype)


@_round_op.register_fake
def _(
    x,
    seed,
    offset,
    seed_and_offset,
    rand,
    format_fields,
    format_names,
    choices,
    n,
    index_offset,
    out_dtype,
):
    return x.new_empty(output_shape(x.shape, choices.split(":")[5]), dtype=out_dtype)


def _straight_through(ctx, grad: Tensor) -> tuple:
    """d round(x) / dx := 1 (the straight-through estimator), for value outputs."""
    return (grad.to(ctx.x_dtype) if ctx.is_value else None,) + (None,) * 10


def _save_for_backward(ctx, inputs: tuple, output: Tensor) -> None:
    ctx.x_dtype = inputs[0].dtype
    ctx.is_value = inputs[7].split(":")[5] == "value"


_round_op.register_autograd(_straight_through, setup_context=_save_for_backward)


def _unflatten(
    seed: int | Tensor,
    offset: int | Tensor,
    rand: Tensor | None,
    format_fields: list[int],
    format_names: str,
    choices: str,
    n: int,
    index_offset: int,
) -> tuple[Request, str, str]:
    ebits, mbits, bias, signed, inf, subnormals, twos_complement = format_fields
    nan, name = format_names.split(":", 1)
    fmt = Format(
        ebits=ebits,
        mbits=mbits,
        bias=bias,
        signed=bool(signed),
        inf=bool(inf),
        nan=nan,
        subnormals=bool(subnormals),
        twos_complement=bool(twos_complement),
        name=name,
    )
    mode, sat, variant, source, backend, output, nan = choices.split(":")
    request = Request(fmt, mode, sat, n, variant, source, seed, offset, index_offset, rand, nan)
    return request, backend, output


def _dispatch(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """The one dispatch point between the PyTorch path and the Triton kernels, for a
    checked request (``output`` and ``out_dtype`` decided)."""
    route = _call_route(
        request.fmt,
        request.mode,
        request.n,
        request.variant,
        request.sat,
        request.nan,
        request.source,
        backend,
        output,
        out_dtype,
        x.dtype,
        x.is_cuda,
        False,
    )
    if route.plan is not None:
        return route.plan.round(x, request.seed, request.offset, request.index_offset, request.rand)
    refuse_capture(route.checked, x, request.fmt)
    return round_tensor(x, request, output, out_dtype)


def _is_dtensor(x: object) -> TypeGuard[DTensor]:
    return type(x).__name__ == "DTensor"


def _round_dtensor(
    x: DTensor, request: Request, output: str, round_local: Callable[[Tensor, Request], Tensor]
) -> Tensor:
    """Round a DTensor shard by shard: each rank rounds its local tensor with
    ``round_local`` and the random words of its global indices (explicit integers: the rows
    of ``rand`` it holds), so the result does not depend on the sharding; replicated
    placements round identically.  Values, codes and packed codes alike (a Shard(0) shard
    holds whole rows); a checked call (``nan="raise"``) raises on the ranks whose shard
    holds a NaN result."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for placement in x.placements:
        sharded_rows = isinstance(placement, Shard) and placement.dim == 0
        if not (isinstance(placement, Replicate) or sharded_rows):
            raise ValueError(
                f"DTensor placements must be Replicate or Shard(0) for SR; got {x.placements}"
            )
    local_shape, global_offset = compute_local_shape_and_global_offset(
        x.shape, x.device_mesh, x.placements
    )
    first_row = global_offset[0] if global_offset else 0
    row = 1
    for size in x.shape[1:]:
        row *= size
    rand = request.rand  # x's shape (checked): the shard's rows
    if rand is not None and x.dim():
        rand = rand[first_row : first_row + local_shape[0]]
    start = request.index_offset + first_row * row
    local = round_local(x.to_local(), request._replace(index_offset=start, rand=rand))
    # the global result: x's shape (packed codes: shorter rows), contiguous
    shape = torch.Size(output_shape(x.shape, output))
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, x.device_mesh, x.placements, shape=shape, stride=stride)


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
    if _is_dtensor(x):
        return _round_dtensor(
            x, request, "value", lambda local, req: round_tensor(local, req, "value", torch.float64)
        )
    return round_tensor(x, request, "value", torch.float64)


def round(  # noqa: A001 - the public name users type, shadowing the builtin on purpose
    x: Tensor,
    fmt: Format | str | None = None,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    hardware: str | HardwarePreset | None = None,
) -> Tensor:
    """Round every element of ``x`` to a value of ``fmt``; the result has x's dtype and shape.

    ``mode``: rne, rna, rz, ru, rd, ro (round to odd) or sr.  For ``sr``, ``rbits`` random
    bits (1..32; None: exact SR with 32-bit words) and ``variant`` a/b/c/odd decide: with
    nu the fraction being rounded away (in ulps) and r the random integer, the value rounds
    away from zero iff count + r >= 2**rbits, count the floor (a), half-up (b), half-even
    (c) or half-odd (odd) rounding of nu 2**rbits (the rounding contract in the docs).
    The random integers are the top ``rbits`` bits of the word of
    ``(seed, offset, index_offset + flat index)`` in the Philox stream (seed None: drawn
    from torch's default generator), or ``rand``: integers in [0, 2**rbits) broadcastable
    to x, or ``"data"``: words hashed from each value and its index (no state at all).
    ``sat``: finite, propagate or none (P3109).  ``backend``: auto, torch or triton.
    A rounded value outside x's dtype's range becomes infinite or zero in that dtype.
    ``hardware``: a `stochround.hardware` preset or its name (``"amd-mi300-fp8"``, ...),
    which sets the format, variant, rbits and saturation of a documented SR unit, or of a
    family of them with ``fmt`` naming the unit's format (``"amd-mi300"`` with
    ``"e5m2fnuz"``); PyTorch path only.
    """
    if hardware is not None:
        return _round_hardware(
            x, fmt, hardware, mode, rbits, variant, sat, seed, offset, rand, index_offset, backend
        )
    if fmt is None:
        raise ValueError("fmt is required (a format name or Format) unless hardware= is given")
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
    )


def _round_hardware(
    x: Tensor,
    fmt: Format | str | None,
    name: str | HardwarePreset,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor,
    rand: Tensor | str | None,
    index_offset: int,
    backend: str,
) -> Tensor:
    """`round(x, hardware=name)`: the preset fixes everything but the random bits; ``fmt``
    picks the unit of a family (``amd-mi300``: e4m3fnuz or e5m2fnuz) or confirms it.  The
    presets round on the PyTorch path, in float64."""
    if mode not in ("rne", "sr") or rbits is not None or variant != "c" or sat != "none":
        raise ValueError(
            f"hardware={name!r} sets the mode, rbits, variant and sat; pass only x, fmt (to "
            "pick or confirm the unit's format), seed, offset, rand and index_offset"
        )
    if isinstance(rand, str):
        raise ValueError("hardware presets take rand as an integer tensor, not 'data'")
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        raise ValueError("hardware presets round on the PyTorch path: backend='triton' cannot")
    unit = preset(name, fmt)
    result = round_preset(
        preset_operand(x, unit), unit, seed, offset, rand, index_offset=index_offset
    )
    return result.to(x.dtype)


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
    backend: str = "auto",
    nan: str = "raise",
    packed: bool = False,
) -> Tensor:
    """Round x to ``fmt`` (as `round`) and return the bit patterns.

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
    )


def decode(codes: Tensor, fmt: Format | str, dtype: torch.dtype = torch.float32) -> Tensor:
    """The values of bit patterns (any integer dtype; the low ``fmt.bits`` bits are used)."""
    fmt = find_format(fmt)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {FLOAT_DTYPES}; got {dtype}")
    if not fmt.fits_in(format_of_dtype(dtype)):
        raise ValueError(f"format {fmt.name} does not fit in {dtype}; pass dtype=torch.float64")
    return decode_values(codes.to(torch.int64), fmt, dtype)


def _cast_target(dtype: torch.dtype) -> tuple[Format, str]:
    """A `cast` dtype's format and the output that holds it (fp4 packed two a byte, 8-bit
    formats as codes, wider ones as values)."""
    fmt = format_of_dtype(dtype)
    return fmt, {4: "fp4x2", 8: "codes"}.get(fmt.bits, "value")


# the dtypes `cast` rounds to (those this torch has)
_CAST_TARGETS: dict[torch.dtype, tuple[Format, str]] = {
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
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
    index_offset: int = 0,
    backend: str = "auto",
    nan: str = "raise",
) -> Tensor:
    """Round x to the format of a torch dtype and return the result in that dtype.

    8-bit float dtypes hold the format's codes (`encode`); ``float4_e2m1fn_x2`` packs two
    e2m1 codes per byte along the last dimension (which must be even), the first in the
    low nibble.  ``nan``: what e2m1, which has no NaN code, holds for a NaN result, as in
    `encode` ("raise": ValueError, the call synchronizes; "zero": code 0, asynchronous).
    """
    target = _CAST_TARGETS.get(dtype) if isinstance(dtype, torch.dtype) else None
    if target is None:
        raise ValueError(f"dtype must be one of {', '.join(map(str, CAST_DTYPES))}; got {dtype}")
    fmt, output = target
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
        dtype,
    )


__all__ = [
    "BACKENDS",
    "CAST_DTYPES",
    "NAN_POLICIES",
    "cast",
    "check_input",
    "check_request",
    "decode",
    "encode",
    "preset_operand",
    "round",
    "round_float64",
    "round_preset",
]
