"""The vectorized PyTorch path: the rounding contract evaluated on tensors.

It runs on any device and is the executable definition the Triton kernels are tested
against, bit for bit; `stochround.reference` (exact scalar arithmetic) is the definition it
is tested against.  For a finite nonzero x and a format of precision p = mbits + 1 and
minimum exponent emin, it evaluates, in floating point where every step is exact (float32
for fp32/bf16/fp16 inputs and formats whose values fp32 holds, float64 otherwise):

    |x| = f 2**k (frexp),  e = max(k - 1, emin),  q = e - mbits,  s = |x| 2**-q,
    kept = floor(s),  nu = s - kept,  magnitude = (kept + away) 2**q,

where the rounding mode decides ``away`` in {0, 1} from nu (and, for SR, a random integer
r), then handles overflow per the saturation mode and restores the sign.  Besides the
values it encodes them as bit patterns (`encode_values`), decodes codes (`decode_values`),
and finishes a rounding into the output an entry point asks for (`rounded_output`).
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
from torch import Tensor

from . import random as streams
from .formats import Format, format_of_dtype
from .packing import pack
from .reference import WORD_BITS, overflow_value, round_checked

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

OUTPUTS = ("value", "codes", "fp4x2", "fp6x4")

# Below 2**-90 a fraction's only property that matters is being nonzero (n <= 32 bits).
_MIN_SCALE_EXPONENT = -90

# CPU tensors are rounded in pieces of 2**18 elements (1 MiB of fp32), spread over torch's
# threads: small enough that the dozens of elementwise passes of a piece stay in cache,
# large enough that each pass amortizes its dispatch (benchmarks/bench_cpu.py).
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
    """SR's decision: away iff count + r >= 2**n, count the floor (variant a), half-up (b),
    half-even (c) or half-odd (odd) rounding of nu 2**n.  Exact: nu 2**n and every integer below
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
    +-infinity (bound / 0) or NaN (0 / 0), per `stochround.reference.overflow_value`."""
    clamped = value.clamp(fmt.lowest, fmt.max)
    result = clamped
    for negative, bound in ((False, fmt.max), (True, fmt.lowest)):
        target = overflow_value(negative, False, fmt, mode, sat)
        if target == bound:
            continue
        beyond = torch.relu(torch.sign(clamped - value if negative else value - clamped))
        if target != target:  # NaN
            result = result * (1 - beyond)
        result = result / (1 - beyond)
    return result


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
    *,
    branch_free: bool = False,
) -> Tensor:
    """The rounded values in `compute_dtype` (arguments already checked); r: random int64
    integers below 2**n, shaped like x.  ``branch_free``: infinite and NaN inputs are
    handled by a select over every element rather than a data-dependent branch, so that a
    graph tracer (`stochround.emulate.compiled`) can record the function."""
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
        odd = torch.clamp(kept, max=1) * ((e + fmt.exponent_bias) & 1).to(dtype)
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
    if branch_free:
        return torch.where(special.bool(), _special_values(xd, fmt, mode, sat), value)
    if bool(special.any()):
        where = special.nonzero(as_tuple=True)
        value[where] = _special_values(xd[where], fmt, mode, sat)
    return value


def _special_values(x: Tensor, fmt: Format, mode: str, sat: str) -> Tensor:
    """Results for infinite and NaN inputs."""
    infinity = torch.where(
        x < 0,
        x.new_tensor(overflow_value(True, True, fmt, mode, sat)),
        x.new_tensor(overflow_value(False, True, fmt, mode, sat)),
    )
    return torch.where(torch.isnan(x), float("nan"), infinity)


class Request(NamedTuple):
    """The checked arguments of one rounding call: a named tuple, because one is built on
    every call and a tuple is the cheapest record to build.  The first six fields are the
    choices that select and bind kernels (`kernels.rounding.kernel_plan` takes them in this
    order)."""

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
    nan: str = "raise"  # what codes of a format without a NaN code hold for NaN: raise or zero
    # a hardware unit's steps around the contract (`stochround.presets`): x is first rounded
    # to nearest-even in ``operand`` (the instruction's input format), and results whose
    # operand lies below ``flush_below`` in magnitude become zero; None: no such step
    operand: Format | None = None
    flush_below: float | None = None


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


@functools.lru_cache(maxsize=256)
def saturation_bounds(fmt: Format, dtype: torch.dtype, sat: str) -> tuple[float, float] | None:
    """The bounds the finite results of a rounding are clamped to in a float ``dtype`` that
    cannot hold the format's largest or most negative value: the largest value of
    ``dtype`` not above ``fmt.max``, and for a format with negative values the most
    negative not below ``fmt.lowest`` (-inf for one without: narrowing never takes a value
    below zero).  Narrowing to nearest would step beyond them: bf16 holds no 65504, fp16's
    max, and rounds it to 65536.  Results at the bound come from a saturating ``sat``
    (finite or propagate) and from the directed modes, which keep an overflow at the max on
    their side whatever ``sat`` says.  With ``sat="none"`` a bound beyond ``dtype``'s range
    is none (±inf): a value the dtype cannot hold becomes infinite, as any narrowing does.
    None where no finite result needs clamping."""
    held = format_of_dtype(dtype)

    def bound(value: float) -> float:
        if sat == "none" and abs(value) > held.max:
            return math.copysign(math.inf, value)
        return round_checked(value, held, "rz", WORD_BITS, "c", "none", None)

    high = bound(fmt.max)
    low = bound(fmt.lowest) if fmt.lowest < 0 else -math.inf
    kept = high in (fmt.max, math.inf) and low in (fmt.lowest, -math.inf)
    return None if kept else (low, high)


def _narrow_saturated(values: Tensor, narrowed: Tensor, bounds: tuple[float, float]) -> Tensor:
    """``narrowed`` with the finite results clamped to ``bounds`` (`saturation_bounds`):
    infinite results (``sat="propagate"`` of infinite inputs) stay infinite."""
    low, high = bounds
    return torch.where(torch.isfinite(values), narrowed.clamp(low, high), narrowed)


def rounded_output(
    values: Tensor, fmt: Format, output: str, out_dtype: torch.dtype, nan: str, sat: str = "none"
) -> Tensor:
    """Rounded values (compute dtype) to the requested output in ``out_dtype`` (codes and
    packed codes: their bytes viewed as it, `cast`'s 8-bit and fp4 dtypes; ``nan``:
    NAN_POLICIES).  Values narrow to nearest, except that no finite result lies beyond the
    format's range where ``out_dtype`` holds it (`saturation_bounds`)."""
    if output == "value":
        narrowed = values.to(out_dtype)
        if out_dtype != values.dtype:
            bounds = saturation_bounds(fmt, out_dtype, sat)
            if bounds is not None:
                narrowed = _narrow_saturated(values, narrowed, bounds)
        is_nan = torch.isnan(values)
        if bool(is_nan.any()):
            narrowed = torch.where(is_nan, canonical_nan(out_dtype, values.device), narrowed)
        return narrowed
    codes = encode_values(values, fmt, nan)
    if output == "codes":
        return codes.to(code_dtype(fmt.bits)).view(out_dtype)
    return pack(codes.to(torch.uint8), 4 if output == "fp4x2" else 6).view(out_dtype)


def round_tensor(x: Tensor, request: Request, output: str, out_dtype: torch.dtype) -> Tensor:
    """The PyTorch path.  On the CPU in cache-sized pieces spread over torch's threads
    (exact: a piece draws the random words of its own flat positions)."""
    flat = x.reshape(-1) if x.is_contiguous() else x.contiguous().reshape(-1)
    shape = output_shape(x.shape, output)
    if flat.numel() == 0:
        return x.new_empty(shape, dtype=out_dtype)

    def piece(start: int) -> Tensor:
        values = flat[start : start + chunk]
        r = random_integers(values, request, start) if request.mode == "sr" else None
        operand = values
        if request.operand is not None:  # a hardware unit's input: rne to its format
            operand = round_values(values, request.operand, "rne", "none", WORD_BITS, "c", None)
        rounded = round_values(
            operand, request.fmt, request.mode, request.sat, request.n, request.variant, r
        )
        if request.flush_below is not None:
            rounded = _flush(operand, rounded, request.fmt, request.flush_below)
        return rounded_output(rounded, request.fmt, output, out_dtype, request.nan, request.sat)

    if x.device.type != "cpu" or flat.numel() <= _CPU_CHUNK:
        chunk = flat.numel()
        return piece(0).reshape(shape)
    chunk = _CPU_CHUNK
    starts = range(0, flat.numel(), chunk)
    with ThreadPoolExecutor(max_workers=torch.get_num_threads()) as pool:
        return torch.cat(list(pool.map(piece, starts))).reshape(shape)


def _flush(operand: Tensor, rounded: Tensor, fmt: Format, below: float) -> Tensor:
    """A hardware unit's flush (`stochround.presets.HardwarePreset.flush`): the results
    whose operand lies below ``below`` in magnitude (compared in float64, which holds
    both) become zero, signed as the operand where ``fmt`` has -0."""
    zero = torch.zeros_like(rounded)
    if fmt.has_negative_zero:
        zero = torch.copysign(zero, operand.to(rounded.dtype))
    return torch.where(operand.to(torch.float64).abs() < below, zero, rounded)


def output_shape(shape: torch.Size, output: str) -> tuple[int, ...]:
    if output == "fp4x2":
        return (*shape[:-1], shape[-1] // 2)
    if output == "fp6x4":
        return (*shape[:-1], shape[-1] // 4 * 3)
    return tuple(shape)


def checks_nan(fmt: Format, nan: str, output: str) -> bool:
    """Whether a call must find NaN results to raise: codes of a format without a NaN code
    with nan="raise" (on CUDA the call then waits for its kernel)."""
    return output != "value" and not fmt.has_nan and nan == "raise"


def refuse_capture(checked: bool, x: Tensor, fmt: Format) -> None:
    """ValueError for a checked call (nan="raise", `checks_nan`) under CUDA-graph capture:
    it waits for its kernel, which a graph cannot capture."""
    if checked and x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            f"format {fmt.name} has no NaN code: nan='raise' waits for the kernel to learn "
            "whether a result is NaN, which a CUDA graph cannot capture; pass nan='zero' "
            "(NaN results stored as code 0, unchecked) to capture this call"
        )


def code_dtype(bits: int) -> torch.dtype:
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
    exponent_field = torch.where(magnitude < fmt.min_normal, 0, e + fmt.exponent_bias)
    significand = scale_by_power_of_two(magnitude, fmt.mbits - e).to(torch.int64)
    mantissa = torch.where(exponent_field == 0, significand, significand - 2**fmt.mbits)
    if not fmt.subnormals:
        mantissa = torch.zeros_like(mantissa)
        exponent_field = e + fmt.exponent_bias
    code = exponent_field << fmt.mbits | mantissa
    code = torch.where(values == 0, 0, code)
    code = torch.where(torch.isinf(values), fmt.max_magnitude_code + 1, code)
    if fmt.signed:
        code = code | (torch.signbit(values).to(torch.int64) << magnitude_bits)
    return torch.where(torch.isnan(values), nan_code(fmt), code)


def nan_without_code(fmt: Format) -> ValueError:
    """The error for NaN results in a format without a NaN code (nan="raise")."""
    return ValueError(
        f"format {fmt.name} has no NaN code, and the rounded values contain NaN (a NaN input "
        "or an overflow); use sat='finite' or filter the input, or pass nan='zero' to store "
        "code 0 for them"
    )


def nan_code(fmt: Format) -> int:
    """The code of a NaN result: the canonical NaN code (reference.encode_value(nan)): quiet
    NaN, fn's all-ones, fnuz's -0; in a format without a NaN code, 0 (+0, nan="zero")."""
    if not fmt.has_nan:
        return 0
    magnitude_bits = fmt.ebits + fmt.mbits
    if fmt.nan == "fnuz":
        return 1 << magnitude_bits
    quiet = 1 << (fmt.mbits - 1) if fmt.nan == "ieee" and fmt.mbits else 2**fmt.mbits - 1
    return (2**fmt.ebits - 1) << fmt.mbits | quiet


def decode_values(codes: Tensor, fmt: Format, dtype: torch.dtype) -> Tensor:
    """The values of bit patterns (int64 codes; the low ``fmt.bits`` bits are used) in
    ``dtype``, which must hold every value of the format: sign-magnitude codes are
    (-1)**s 2**(E - bias) (1 + M 2**-mbits), subnormals (E = 0) 2**emin M 2**-mbits; two's
    complement integer grids are the signed integer times the grid's spacing."""
    code = codes & (fmt.num_codes - 1)
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
        scale_by_power_of_two(
            mantissa + 2**fmt.mbits, exponent_field - fmt.exponent_bias - fmt.mbits
        ),
    )
    value = torch.where(magnitude_code == fmt.max_magnitude_code + 1, float("inf"), value)
    nan = magnitude_code > fmt.max_magnitude_code + int(fmt.inf)
    if fmt.signed:
        negative = ((code >> magnitude_bits) & 1) == 1  # 64-bit codes arrive negative
        value = torch.where(negative, -value, value)
        if fmt.nan == "fnuz":
            nan = nan | (negative & (magnitude_code == 0))
    return torch.where(nan, float("nan"), value).to(dtype)


__all__ = [
    "CANONICAL_NAN_BITS",
    "FLOAT_DTYPES",
    "OUTPUTS",
    "Request",
    "canonical_nan",
    "checks_nan",
    "code_dtype",
    "compute_dtype",
    "decode_values",
    "encode_values",
    "nan_code",
    "nan_without_code",
    "output_shape",
    "random_integers",
    "refuse_capture",
    "round_tensor",
    "round_values",
    "rounded_output",
    "saturation_bounds",
    "scale_by_power_of_two",
]
