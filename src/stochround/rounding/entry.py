"""The user entry points `round`, `cast`, `encode` and `decode` (and the float64 and
hardware-unit rounding that `stochround.hardware` and `stochround.arith` build on): one
body, `_round_call`, checks a call, routes it and rounds it."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..formats import Format, format_of_dtype
from ..formats import format as find_format
from ..kernels.availability import on_kernel_device
from ..packing import PACK_GROUPS
from ..presets import HardwarePreset
from ..reference import check_mode
from ..shards import is_dtensor
from ..torch_path import FLOAT_DTYPES, Request, decode_values, round_tensor
from .checks import check_call_values, check_input, check_request, rand_source
from .dtensor import round_dtensor
from .op import round_through_op
from .prepared import call_target
from .route import call_route, through_op


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
    as `route.call_route` takes them; ``hardware`` and ``stream`` as `round` takes them).
    The choices are checked and routed in one cached lookup and the per-call values
    checked apart; a call the kernels round that needs no custom op (`route.through_op`)
    goes to the kernels' plan directly, the others to `op.round_through_op` with a
    `Request` (the op's dispatch would only flatten the arguments and unflatten them
    again)."""
    check_input(x)
    # "SR" is "sr" below: every comparison sees the canonical name
    fmt, mode, rbits, variant, sat, operand, flush_below, backend = call_target(
        hardware, fmt, check_mode(mode), rbits, variant, sat, rand, backend
    )
    source, via_op = rand_source(rand), through_op(x)
    choices = (fmt, mode, rbits, variant, sat, nan, source, backend, output, out_dtype)
    route = call_route(choices, x.dtype, on_kernel_device(x), via_op)
    if stream is not None:  # taken once the choices are checked: a refused call takes none
        seed, offset = _stream_values(stream, seed, offset, rand, mode == "sr")
    seed, offset, rand, index_offset = check_call_values(
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
    return round_through_op(x, request, backend, route.output, route.out_dtype)


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
        return round_dtensor(
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
    "cast",
    "decode",
    "encode",
    "preset_operand",
    "round",
    "round_float64",
    "round_preset",
]
