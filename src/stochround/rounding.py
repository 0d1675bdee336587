"""The vectorized PyTorch path and the public entry points: `round`, `cast`, `encode`,
`decode`, `pack`, `unpack`.

The PyTorch path runs on any device and is the executable definition the Triton kernels
are tested against; `reference.py` is the definition it is tested against.  It evaluates
the rounding contract of DESIGN.md in floating point where every step is exact — float32
for fp32/bf16/fp16 inputs and formats whose values fp32 holds, float64 otherwise:

    |x| = f 2**k (frexp),  e = max(k - 1, emin),  q = e - m,  s = f 2**(k - q),
    kept = floor(s),  nu = s - kept,  magnitude = (kept + away) 2**q.

`round`, `encode` and `cast` share one body, `_round_call`: a call's choices are checked and
routed once per set of them (`_call_route`, cached), its per-call values (seed, offset,
rand, index_offset) on every call.  The route picks the backend: ``backend="auto"`` uses
the Triton kernels for CUDA tensors they support and the PyTorch path otherwise.  Calls
under `torch.compile`, for autograd or on DTensors go through the `stochround::round`
custom op, whose body (`_dispatch`) routes them the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from . import random as streams
from .formats import Format, format_of_dtype
from .formats import format as find_format
from .reference import MODES, SATURATIONS, VARIANTS, WORD_BITS, check_choice, check_rbits

BACKENDS = ("auto", "torch", "triton")
# what codes of a format without a NaN code hold for a NaN result: "raise" checks (a
# ValueError; on CUDA the call waits for its kernel), "zero" stores code 0 (+0) unchecked
NAN_POLICIES = ("raise", "zero")
FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
OUTPUTS = ("value", "codes", "fp4x2", "fp6x4")
# the packed outputs by code width: (output, codes a group of whole bytes holds)
PACKINGS = {4: ("fp4x2", 2), 6: ("fp6x4", 4)}
PACK_GROUPS = dict(PACKINGS.values())
# Below 2**-90 a fraction's only property that matters is being nonzero (n <= 32 bits).
_MIN_SCALE_EXPONENT = -90
# CPU tensors are rounded in pieces of 2**18 elements (1 MiB of fp32: ~40 elementwise
# passes each stay in cache), spread over torch's threads.  Measured on 2 cores for 2**24
# values: 2**15 pieces 0.88 s, 2**16 0.70 s, 2**17 0.58 s, 2**18 0.55 s, 2**20 0.68 s.
_CPU_CHUNK = 2**18
# (exponent bias, mantissa bits, largest biased exponent, integer dtype of the same width)
_FLOAT_LAYOUT = {
    torch.float64: (1023, 52, 2046, torch.int64),
    torch.float32: (127, 23, 254, torch.int32),
}
_FP32 = format_of_dtype(torch.float32)


def _pow2(exponent: Tensor, dtype: torch.dtype) -> Tensor:
    """2**exponent in float32/float64, built from its bits: exact in the normal range."""
    bias, mbits, top, integer = _FLOAT_LAYOUT[dtype]
    return ((exponent.to(integer) + bias).clamp(1, top) << mbits).view(dtype)


def scale_by_power_of_two(value: Tensor, exponent: Tensor) -> Tensor:
    """value * 2**exponent in value's dtype, exact whenever the result is representable.

    Two factors keep each power of two in the normal range.
    """
    half = exponent >> 1
    return value * _pow2(half, value.dtype) * _pow2(exponent - half, value.dtype)


# The PyTorch path decides with float arithmetic on 0.0/1.0 flags (sign, clamp, floor)
# rather than comparisons and `where`: exact all the same, and several times faster on
# CPUs, where boolean kernels are slow.


def _away(
    nu: Tensor, odd: Tensor, negative: Tensor, mode: str, n: int, variant: str, r: Tensor | None
) -> Tensor:
    """The mode's decision for the fraction nu in [0, 1) as 0.0/1.0 (reference.rounds_away);
    odd and negative are 0.0/1.0 flags."""
    if mode in ("rne", "rna"):
        above = torch.sign(nu - 0.5)  # exact sign: rounding never crosses zero
        if mode == "rna":
            return torch.clamp(above + 1, 0, 1)
        return torch.relu(above) + (1 - above.abs()) * odd
    if mode == "rz":
        return torch.zeros_like(nu)
    inexact = torch.sign(nu)
    if mode == "ru":
        return inexact * (1 - negative)
    if mode == "rd":
        return inexact * negative
    if mode == "ro":
        return inexact * (1 - odd)
    assert r is not None
    return _sr_away(nu, r, n, variant)


def _sr_away(nu: Tensor, r: Tensor, n: int, variant: str) -> Tensor:
    """DESIGN.md's table: count + r >= 2**n with count the floor (a), half-up (b), half-even
    (c) or half-odd (odd) rounding of nu 2**n.  Exact: nu 2**n and every integer below
    2**(n+1) are exact in float32 for n <= 23, and in float64 always."""
    wide = nu.dtype if n <= 23 else torch.float64
    scaled = nu.to(wide) * 2.0**n
    if variant == "a":
        count = torch.floor(scaled)
    elif variant == "b":
        count = torch.floor((torch.floor(scaled * 2) + 1) * 0.5)
    else:
        floor = torch.floor(scaled)
        above = torch.sign(scaled - floor - 0.5)
        floor_is_odd = floor - 2 * torch.floor(floor * 0.5)
        tie_up = floor_is_odd if variant == "c" else 1 - floor_is_odd
        count = floor + torch.relu(above) + (1 - above.abs()) * tie_up
    return torch.floor((count + r.to(wide)) * 2.0**-n).to(nu.dtype)


def _handle_overflow(value: Tensor, fmt: Format, mode: str, sat: str) -> Tensor:
    """Values beyond [lowest, max] become the bound (saturation, inward directed modes),
    +-infinity (bound / 0) or NaN (0 / 0), per `_overflow_value`."""
    clamped = value.clamp(fmt.lowest, fmt.max)
    result = clamped
    for negative, bound in ((False, fmt.max), (True, fmt.lowest)):
        target = _overflow_value(negative, False, fmt, mode, sat)
        if target == bound:
            continue
        beyond = torch.relu(torch.sign(clamped - value if negative else value - clamped))
        if target != target:  # NaN
            result = result * (1 - beyond)
        result = result / (1 - beyond)
    return result


def _overflow_value(negative: bool, infinite: bool, fmt: Format, mode: str, sat: str) -> float:
    """reference.overflow_value, restated here so the two stay independently written."""
    inward = mode == "rz" or (mode == "rd" and not negative) or (mode == "ru" and negative)
    if sat == "finite" or (not infinite and (sat == "propagate" or inward)):
        return fmt.lowest if negative else fmt.max
    if fmt.inf and (fmt.signed or not negative):
        return -float("inf") if negative else float("inf")
    return float("nan")


def compute_dtype(x_dtype: torch.dtype, fmt: Format) -> torch.dtype:
    """float32 where every step of the contract is exact in it, float64 otherwise."""
    exact_in_float32 = x_dtype != torch.float64 and fmt.fits_in(_FP32)
    return torch.float32 if exact_in_float32 else torch.float64


def round_values(
    x: Tensor,
    fmt: Format,
    mode: str,
    sat: str,
    n: int,
    variant: str,
    r: Tensor | None,
) -> Tensor:
    """The rounded values in `compute_dtype` (arguments already checked); r: random int64
    integers below 2**n, shaped like x."""
    dtype = compute_dtype(x.dtype, fmt)
    bias, mbits, _, integer = _FLOAT_LAYOUT[dtype]
    xd = x.to(dtype)
    magnitude = xd.abs()
    field = magnitude.view(integer) >> mbits  # the biased exponent; top + 1: inf or NaN
    if fmt.emin >= 1 - bias:  # subnormal inputs lie below emin, which clamps them anyway
        e = field.clamp(min=fmt.emin + bias) - bias
    else:
        e = torch.frexp(magnitude)[1].to(integer).clamp(min=fmt.emin + 1) - 1
    q = e - fmt.mbits
    scale = -q
    if fmt.emin > fmt.mbits:  # an ulp above 1: s could underflow, where only nu > 0 matters
        scale = torch.maximum(scale, _MIN_SCALE_EXPONENT - (field - bias))
    s = scale_by_power_of_two(magnitude, scale)
    kept = torch.floor(s)
    # the code's last bit: the significand's, or with p = 1 the exponent field's
    if fmt.mbits > 0:
        odd = kept - 2 * torch.floor(kept * 0.5)
    else:
        odd = torch.clamp(kept, max=1) * ((e + fmt.bias) & 1).to(dtype)
    negative = torch.relu(-torch.sign(xd))
    rounded = scale_by_power_of_two(kept + _away(s - kept, odd, negative, mode, n, variant, r), q)
    if not fmt.has_zero:
        rounded = torch.clamp(rounded, min=fmt.min_normal)
    if fmt.has_negative_zero:
        value = torch.copysign(rounded, xd)
    else:  # -0.0 + 0.0 is +0.0: no negative zeros, and -0.0 inputs count as positive
        value = torch.copysign(rounded, xd + 0.0) + 0.0
    value = _handle_overflow(value, fmt, mode, sat)
    special = (field + 1) >> (integer.itemsize * 8 - 1 - mbits)  # 1 for inf and NaN inputs
    if bool(special.any()):
        where = special.nonzero(as_tuple=True)
        value[where] = _special_values(xd[where], fmt, mode, sat)
    return value


def _special_values(x: Tensor, fmt: Format, mode: str, sat: str) -> Tensor:
    """Results for infinite and NaN inputs."""
    infinity = torch.where(
        x < 0,
        x.new_tensor(_overflow_value(True, True, fmt, mode, sat)),
        x.new_tensor(_overflow_value(False, True, fmt, mode, sat)),
    )
    return torch.where(torch.isnan(x), float("nan"), infinity)


def check_input(x: object) -> Tensor:
    """x, if it is a tensor of a floating dtype the rounding functions take."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(dtype) for dtype in FLOAT_DTYPES)
        raise TypeError(f"x must have a floating dtype ({allowed}); got {x.dtype}")
    return x


class Request(NamedTuple):
    """The checked arguments of one rounding call (a tuple: built on every call, where a
    frozen dataclass's field-by-field constructor costs a microsecond more).  The first six
    fields are the choices that select and bind kernels (`kernels.rounding.kernel_plan`
    takes them in this order)."""

    fmt: Format
    mode: str
    sat: str
    n: int
    variant: str
    source: str  # "stream", "rand" (explicit integers) or "data" (hashed from the values)
    seed: int | Tensor
    offset: int | Tensor
    index_offset: int
    rand: Tensor | None
    nan: str = "raise"  # NAN_POLICIES: codes of formats without a NaN code


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


def random_integers(x: Tensor, request: Request, start: int = 0) -> Tensor:
    """r in [0, 2**n) (int64) for the elements of x, which sit at flat positions
    ``start ..`` of the rounded tensor: explicit, from the stream, or hashed from x."""
    if request.source == "rand":
        assert request.rand is not None
        return request.rand.reshape(-1)[start : start + x.numel()].reshape(x.shape)
    index_offset = request.index_offset + start
    if request.source == "data":
        index = torch.arange(x.numel(), device=x.device).reshape(x.shape) + index_offset
        words = streams.data_words(x, index)
    else:
        words = streams.random_words_like(x, request.seed, request.offset, index_offset)
    return words >> (WORD_BITS - request.n)


# Quiet NaNs with a positive sign and no payload: torch's own casts disagree on NaN bits
# (CPU fp32 -> bf16 gives 0xFFFF), so the outputs are normalized to these.
CANONICAL_NAN_BITS = {
    torch.float64: (0x7FF8000000000000, torch.int64),
    torch.float32: (0x7FC00000, torch.int32),
    torch.bfloat16: (0x7FC0, torch.int16),
    torch.float16: (0x7E00, torch.int16),
}


def canonical_nan(dtype: torch.dtype, device: torch.device) -> Tensor:
    """A 0-d tensor holding the canonical quiet NaN of a float dtype."""
    bits, integer = CANONICAL_NAN_BITS[dtype]
    return torch.tensor(bits, dtype=integer, device=device).view(dtype)


def _finish(values: Tensor, fmt: Format, output: str, out_dtype: torch.dtype, nan: str) -> Tensor:
    """Rounded values (compute dtype) to the requested output in ``out_dtype`` (codes and
    packed codes: their bytes viewed as it, `cast`'s 8-bit and fp4 dtypes; ``nan``:
    NAN_POLICIES)."""
    if output == "value":
        narrowed = values.to(out_dtype)
        is_nan = torch.isnan(values)
        if bool(is_nan.any()):
            narrowed = torch.where(is_nan, canonical_nan(out_dtype, values.device), narrowed)
        return narrowed
    codes = encode_values(values, fmt, nan)
    if output == "codes":
        return codes.to(_code_dtype(fmt.bits)).view(out_dtype)
    return pack(codes.to(torch.uint8), 4 if output == "fp4x2" else 6).view(out_dtype)


def _round_torch(x: Tensor, request: Request, output: str, out_dtype: torch.dtype) -> Tensor:
    """The PyTorch path.  On the CPU in cache-sized pieces spread over torch's threads
    (exact: a piece draws the random words of its own flat positions)."""
    flat = x.reshape(-1) if x.is_contiguous() else x.contiguous().reshape(-1)
    shape = _output_shape(x.shape, output)
    if flat.numel() == 0:
        return x.new_empty(shape, dtype=out_dtype)

    def piece(start: int) -> Tensor:
        values = flat[start : start + chunk]
        r = random_integers(values, request, start) if request.mode == "sr" else None
        rounded = round_values(
            values, request.fmt, request.mode, request.sat, request.n, request.variant, r
        )
        return _finish(rounded, request.fmt, output, out_dtype, request.nan)

    if x.device.type != "cpu" or flat.numel() <= _CPU_CHUNK:
        chunk = flat.numel()
        return piece(0).reshape(shape)
    chunk = _CPU_CHUNK
    starts = range(0, flat.numel(), chunk)
    with ThreadPoolExecutor(max_workers=torch.get_num_threads()) as pool:
        return torch.cat(list(pool.map(piece, starts))).reshape(shape)


def _output_shape(shape: torch.Size, output: str) -> tuple[int, ...]:
    if output == "fp4x2":
        return (*shape[:-1], shape[-1] // 2)
    if output == "fp6x4":
        return (*shape[:-1], shape[-1] // 4 * 3)
    return tuple(shape)


@functools.cache
def _rounding_kernels() -> ModuleType | str:
    """The Triton rounding kernels' module, or why it cannot be imported (once: a call's
    import statement would cost microseconds of its host time)."""
    try:
        from .kernels import rounding
    except ImportError as error:  # triton not installed
        return f"triton is not importable ({error})"
    return rounding


def _triton_unsupported(
    x_dtype: torch.dtype, on_cuda: bool, fmt: Format, output: str
) -> str | None:
    """Why the Triton kernels cannot round x of this dtype and device to ``fmt`` for
    ``output`` (None if they can)."""
    kernels = _rounding_kernels()
    if isinstance(kernels, str):
        return kernels
    if not (on_cuda or kernels.INTERPRETED):
        return "x is not a CUDA tensor (set TRITON_INTERPRET=1 to run kernels on the CPU)"
    if x_dtype not in kernels.INPUT_DTYPES:
        return f"the kernels read fp32/bf16/fp16 inputs, not {x_dtype}"
    return kernels.format_unsupported(fmt, output)


class Route(NamedTuple):
    """What a call's choices decide (`_call_route`, once per set of them)."""

    fmt: Format
    n: int  # random bits
    output: str  # OUTPUTS
    out_dtype: torch.dtype  # the result's: values' dtype, codes' integer dtype, or cast's
    plan: object | None  # the Triton kernels' `KernelPlan`; None: the PyTorch path rounds
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
    return output, x_dtype if output == "value" else _code_dtype(fmt.bits)


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
    reason = _triton_unsupported(x_dtype, on_cuda, fmt, output)
    if reason is None:
        kernels = _rounding_kernels()
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
    return x.new_empty(_output_shape(x.shape, choices.split(":")[5]), dtype=out_dtype)


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


def checks_nan(fmt: Format, nan: str, output: str) -> bool:
    """Whether a call must find NaN results to raise: codes of a format without a NaN code
    with nan="raise" (on CUDA the call then waits for its kernel)."""
    return output != "value" and not fmt.has_nan and nan == "raise"


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
    return _round_torch(x, request, output, out_dtype)


def refuse_capture(checked: bool, x: Tensor, fmt: Format) -> None:
    """ValueError for a checked call (nan="raise", `checks_nan`) under CUDA-graph capture:
    it waits for its kernel, which a graph cannot capture."""
    if checked and x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            f"format {fmt.name} has no NaN code: nan='raise' waits for the kernel to learn "
            "whether a result is NaN, which a CUDA graph cannot capture; pass nan='zero' "
            "(NaN results stored as code 0, unchecked) to capture this call"
        )


def _is_dtensor(x: Tensor) -> bool:
    return type(x).__name__ == "DTensor"


def _round_dtensor(
    x: Tensor, request: Request, output: str, round_local: Callable[[Tensor, Request], Tensor]
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
    shape = torch.Size(_output_shape(x.shape, output))
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
            x, request, "value", lambda local, req: _round_torch(local, req, "value", torch.float64)
        )
    return _round_torch(x, request, "value", torch.float64)


def round(  # noqa: A001 - the public name DESIGN.md gives
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
    hardware: str | None = None,
) -> Tensor:
    """Round every element of ``x`` to a value of ``fmt``; the result has x's dtype and shape.

    ``mode``: rne, rna, rz, ru, rd, ro (round to odd) or sr.  For ``sr``, ``rbits`` random
    bits (1..32; None: exact SR with 32-bit words) and ``variant`` a/b/c/odd decide, per
    DESIGN.md's table.  The random integers are the top ``rbits`` bits of the word of
    ``(seed, offset, index_offset + flat index)`` in the Philox stream (seed None: drawn
    from torch's default generator), or ``rand``: integers in [0, 2**rbits) broadcastable
    to x, or ``"data"``: words hashed from each value and its index (no state at all).
    ``sat``: finite, propagate or none (P3109).  ``backend``: auto, torch or triton.
    A rounded value outside x's dtype's range becomes infinite or zero in that dtype.
    ``hardware``: the name of a `stochround.hardware` preset (``"amd-mi300-fp8"``, ...),
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
    name: str,
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
    from . import hardware  # the presets are built on this module

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
    unit = hardware.preset(name, fmt)
    return hardware.round_hardware(
        x, unit, seed=seed, offset=offset, rand=rand, index_offset=index_offset
    )


def _code_dtype(bits: int) -> torch.dtype:
    """uint8 up to 8 bits; otherwise the signed type of the next width (as `Tensor.view`)."""
    for width, dtype in ((8, torch.uint8), (16, torch.int16), (32, torch.int32)):
        if bits <= width:
            return dtype
    return torch.int64


def encode_values(values: Tensor, fmt: Format, nan: str = "raise") -> Tensor:
    """The codes of values of the format (float32 or float64), as int64 in [0, 2**bits).
    NaN in a format without a NaN code: ValueError (``nan="raise"``) or code 0 ("zero")."""
    if fmt.nan == "none" and nan == "raise" and bool(torch.isnan(values).any()):
        raise nan_without_code(fmt)
    if fmt.twos_complement:
        integers = torch.nan_to_num(values / float(fmt.ulp_at_emin)).to(torch.int64)
        return torch.remainder(integers, fmt.num_codes)
    magnitude_bits = fmt.ebits + fmt.mbits
    magnitude = values.abs()
    regular = torch.isfinite(values) & (values != 0)
    _, exponent = torch.frexp(torch.where(regular, magnitude, 1.0))
    e = torch.clamp(exponent.to(torch.int64) - 1, min=fmt.emin)
    exponent_field = torch.where(magnitude < fmt.min_normal, 0, e + fmt.bias)
    significand = scale_by_power_of_two(magnitude, fmt.mbits - e).to(torch.int64)
    mantissa = torch.where(exponent_field == 0, significand, significand - 2**fmt.mbits)
    if not fmt.subnormals:
        mantissa = torch.zeros_like(mantissa)
        exponent_field = e + fmt.bias
    code = exponent_field << fmt.mbits | mantissa
    code = torch.where(values == 0, 0, code)
    code = torch.where(torch.isinf(values), fmt.max_magnitude_code + 1, code)
    if fmt.signed:
        code = code | (torch.signbit(values).to(torch.int64) << magnitude_bits)
    return torch.where(torch.isnan(values), _nan_code(fmt), code)


def nan_without_code(fmt: Format) -> ValueError:
    """The error for NaN results in a format without a NaN code (nan="raise")."""
    return ValueError(
        f"format {fmt.name} has no NaN code, and the rounded values contain NaN (a NaN input "
        "or an overflow); use sat='finite' or filter the input, or pass nan='zero' to store "
        "code 0 for them"
    )


def _nan_code(fmt: Format) -> int:
    """The code of a NaN result: the canonical NaN code (reference.encode_value(nan)): quiet
    NaN, fn's all-ones, fnuz's -0; in a format without a NaN code, 0 (+0, nan="zero")."""
    if not fmt.has_nan:
        return 0
    magnitude_bits = fmt.ebits + fmt.mbits
    if fmt.nan == "fnuz":
        return 1 << magnitude_bits
    quiet = 1 << (fmt.mbits - 1) if fmt.nan == "ieee" and fmt.mbits else 2**fmt.mbits - 1
    return (2**fmt.ebits - 1) << fmt.mbits | quiet


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
    code = codes.to(torch.int64) & (fmt.num_codes - 1)
    if fmt.twos_complement:
        signed = torch.where(code >= fmt.num_codes // 2, code - fmt.num_codes, code)
        return (signed.to(torch.float64) * float(fmt.ulp_at_emin)).to(dtype)
    magnitude_bits = fmt.ebits + fmt.mbits
    magnitude_code = code & (2**magnitude_bits - 1)
    exponent_field = magnitude_code >> fmt.mbits
    mantissa = (magnitude_code & (2**fmt.mbits - 1)).to(torch.float64)
    subnormal = (exponent_field == 0) & fmt.subnormals
    value = torch.where(
        subnormal,
        scale_by_power_of_two(mantissa, torch.full_like(code, fmt.emin - fmt.mbits)),
        scale_by_power_of_two(mantissa + 2**fmt.mbits, exponent_field - fmt.bias - fmt.mbits),
    )
    value = torch.where(magnitude_code == fmt.max_magnitude_code + 1, float("inf"), value)
    nan = magnitude_code > fmt.max_magnitude_code + int(fmt.inf)
    if fmt.signed:
        negative = ((code >> magnitude_bits) & 1) == 1  # 64-bit codes arrive negative
        value = torch.where(negative, -value, value)
        if fmt.nan == "fnuz":
            nan = nan | (negative & (magnitude_code == 0))
    return torch.where(nan, float("nan"), value).to(dtype)


def pack(codes: Tensor, bits: int) -> Tensor:
    """Pack 4-bit codes two per byte (first in the low nibble) or 6-bit codes four per three
    bytes (little-endian 24-bit groups: code i at bits 6i..6i+5), along the last dimension."""
    codes = _check_codes(codes, bits)
    group = PACKINGS[bits][1]
    if codes.shape[-1] % group:
        raise ValueError(
            f"the last dimension must be a multiple of {group} to pack {bits}-bit codes"
        )
    grouped = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, group)
    shifts = torch.arange(group, device=codes.device) * bits
    word = (grouped << shifts).sum(-1)
    nbytes = group * bits // 8
    byte_shifts = torch.arange(nbytes, device=codes.device) * 8
    packed = (word.unsqueeze(-1) >> byte_shifts) & 0xFF
    return packed.reshape(*codes.shape[:-1], -1).to(torch.uint8)


def unpack(packed: Tensor, bits: int) -> Tensor:
    """Inverse of `pack`: uint8 codes, the last dimension grown back."""
    if not isinstance(packed, Tensor) or packed.dtype != torch.uint8:
        raise TypeError("packed must be a uint8 torch.Tensor")
    check_bits(bits)
    group = PACKINGS[bits][1]
    nbytes = group * bits // 8
    if packed.shape[-1] % nbytes:
        raise ValueError(f"the last dimension must be a multiple of {nbytes} to unpack")
    grouped = packed.to(torch.int64).reshape(*packed.shape[:-1], -1, nbytes)
    word = (grouped << (torch.arange(nbytes, device=packed.device) * 8)).sum(-1)
    shifts = torch.arange(group, device=packed.device) * bits
    codes = (word.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def check_bits(bits: int) -> int:
    if bits not in PACKINGS:
        raise ValueError(f"bits must be 4 or 6; got {bits!r}")
    return bits


def _check_codes(codes: Tensor, bits: int) -> Tensor:
    check_bits(bits)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**bits):
        raise ValueError(f"codes must be in [0, 2**{bits})")
    return codes


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
    "cast",
    "decode",
    "encode",
    "pack",
    "round",
    "round_float64",
    "round_values",
    "unpack",
]
