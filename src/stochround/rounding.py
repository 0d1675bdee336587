"""The vectorized PyTorch path: `round`, `cast`, `encode`, `decode`, `pack`, `unpack`.

It runs on any device and is the executable definition the kernels are tested against;
`reference.py` is the definition it is tested against.  The rounding contract is the one
of DESIGN.md, evaluated in float64, where every step is exact for fp64/fp32/bf16/fp16
inputs and formats of at most 53 significand bits:

    |x| = f 2**k (frexp),  e = max(k - 1, emin),  q = e - m,  s = f 2**(k - q),
    kept = floor(s),  nu = s - kept,  magnitude = (kept + away) 2**q.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import random as streams
from .formats import Format, format_of_dtype
from .formats import format as find_format
from .reference import MODES, SATURATIONS, VARIANTS, WORD_BITS, check_choice, check_rbits

BACKENDS = ("auto", "torch")
FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
# Below 2**-100 a fraction's only property that matters is being nonzero (n <= 32 bits).
_MIN_SCALE_EXPONENT = -100


def _pow2(exponent: Tensor) -> Tensor:
    """2**exponent as float64, built from its bits: exact for exponents in [-1022, 1023]."""
    return ((exponent + 1023).clamp(1, 2046) << 52).view(torch.float64)


def scale_by_power_of_two(value: Tensor, exponent: Tensor) -> Tensor:
    """value * 2**exponent in float64, exact whenever the result is representable.

    Two factors keep each power of two in the normal range (|exponent| up to 2044).
    """
    half = torch.div(exponent, 2, rounding_mode="floor")
    return value * _pow2(half) * _pow2(exponent - half)


def _nearest_integer(value: Tensor, ties_to_odd: bool) -> Tensor:
    """Round a float64 tensor of nonnegative values to the nearest integer, ties to even or odd."""
    floor = torch.floor(value)
    rest = value - floor
    floor_is_odd = torch.fmod(floor, 2) == 1
    tie_up = floor_is_odd != ties_to_odd  # ties go to the even (or odd) neighbour
    return floor + ((rest > 0.5) | ((rest == 0.5) & tie_up)).to(value.dtype)


def _sr_rounds_away(nu: Tensor, r: Tensor, n: int, variant: str) -> Tensor:
    """DESIGN.md's table; every quantity is an integer below 2**34, exact in float64."""
    scale = float(2**n)
    if variant == "a":
        return torch.floor(nu * scale) + r >= scale
    if variant == "b":
        return torch.floor(nu * (2 * scale)) + 2 * r + 1 >= 2 * scale
    return _nearest_integer(nu * scale, ties_to_odd=variant == "odd") + r >= scale


def _rounds_away(
    nu: Tensor,
    odd: Tensor,
    negative: Tensor,
    mode: str,
    n: int,
    variant: str,
    r: Tensor | None,
) -> Tensor:
    """The mode's decision for the discarded fraction nu in [0, 1) (reference.rounds_away)."""
    if mode == "rne":
        return (nu > 0.5) | ((nu == 0.5) & odd)
    if mode == "rna":
        return nu >= 0.5
    if mode == "rz":
        return torch.zeros_like(odd)
    if mode == "ru":
        return (nu > 0) & ~negative
    if mode == "rd":
        return (nu > 0) & negative
    if mode == "ro":
        return (nu > 0) & ~odd
    assert r is not None
    return _sr_rounds_away(nu, r, n, variant)


def _overflow_value(negative: bool, infinite: bool, fmt: Format, mode: str, sat: str) -> float:
    """reference.overflow_value, restated here so the two stay independently written."""
    inward = mode == "rz" or (mode == "rd" and not negative) or (mode == "ru" and negative)
    if sat == "finite" or (not infinite and (sat == "propagate" or inward)):
        return fmt.lowest if negative else fmt.max
    if fmt.inf and (fmt.signed or not negative):
        return -float("inf") if negative else float("inf")
    return float("nan")


def round_to_float64(
    x: Tensor,
    fmt: Format,
    mode: str,
    sat: str,
    n: int,
    variant: str,
    r: Tensor | None,
) -> Tensor:
    """The rounded values as float64 (arguments already checked); r: random integers < 2**n."""
    xd = x.to(torch.float64)
    negative = xd < 0
    magnitude = xd.abs()
    regular = torch.isfinite(xd) & (xd != 0)
    fraction, exponent = torch.frexp(torch.where(regular, magnitude, 1.0))
    exponent = exponent.to(torch.int64)
    e = torch.clamp(exponent - 1, min=fmt.emin)
    q = e - fmt.mbits
    s = scale_by_power_of_two(fraction, torch.clamp(exponent - q, min=_MIN_SCALE_EXPONENT))
    kept = torch.floor(s)
    if fmt.mbits > 0:
        odd = torch.fmod(kept, 2) == 1
    else:  # p = 1: the code's last bit is the exponent field's
        odd = (kept != 0) & (torch.remainder(e + fmt.bias, 2) == 1)
    away = _rounds_away(s - kept, odd, negative, mode, n, variant, r)
    rounded = scale_by_power_of_two(kept + away.to(torch.float64), q)
    if not fmt.has_zero:
        rounded = torch.clamp(rounded, min=fmt.min_normal)
    value = torch.where(negative, -rounded, rounded)
    value = torch.where(value > fmt.max, _overflow_value(False, False, fmt, mode, sat), value)
    value = torch.where(value < fmt.lowest, _overflow_value(True, False, fmt, mode, sat), value)
    if not fmt.has_negative_zero:
        value = torch.where(value == 0, 0.0, value)

    if fmt.has_zero:
        zero = xd if fmt.has_negative_zero else torch.zeros_like(xd)
    else:
        zero = torch.full_like(xd, fmt.min_normal)
    infinity = torch.where(
        negative,
        xd.new_tensor(_overflow_value(True, True, fmt, mode, sat)),
        xd.new_tensor(_overflow_value(False, True, fmt, mode, sat)),
    )
    value = torch.where(xd == 0, zero, value)
    value = torch.where(torch.isinf(xd), infinity, value)
    return torch.where(torch.isnan(xd), float("nan"), value)


def _check_input(x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(dtype) for dtype in FLOAT_DTYPES)
        raise TypeError(f"x must have a floating dtype ({allowed}); got {x.dtype}")
    return x


def _random_integers(
    x: Tensor,
    n: int,
    seed: int | Tensor | None,
    offset: int | Tensor,
    rand: Tensor | None,
) -> Tensor:
    """r in [0, 2**n) for every element: ``rand`` checked, or the top n bits of the stream."""
    if rand is None:
        words = streams.random_words_like(
            x, streams.default_seed() if seed is None else seed, offset
        )
        return (words >> (WORD_BITS - n)).to(torch.float64)
    if not isinstance(rand, Tensor):
        raise TypeError(f"rand must be an integer torch.Tensor, got {type(rand).__name__}")
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
    return rand.to(torch.float64)


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
    rand: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """`round` with the result in float64, which holds every value of every format exactly."""
    x = _check_input(x)
    fmt = find_format(fmt)
    check_choice("mode", mode, MODES)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    check_choice("backend", backend, BACKENDS)
    n = check_rbits(rbits)
    if mode != "sr" and (rbits is not None or rand is not None):
        raise ValueError(f"rbits and rand apply to mode='sr' only; got mode={mode!r}")
    r = _random_integers(x, n, seed, offset, rand) if mode == "sr" else None
    return round_to_float64(x, fmt, mode, sat, n, variant, r)


def round(  # noqa: A001 - the public name DESIGN.md gives
    x: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """Round every element of ``x`` to a value of ``fmt``; the result has x's dtype and shape.

    ``mode``: rne, rna, rz, ru, rd, ro (round to odd) or sr.  For ``sr``, ``rbits`` random
    bits (1..32; None: exact SR with 32-bit words) and ``variant`` a/b/c/odd decide, per
    DESIGN.md's table; the random integers come from the counter-based stream
    ``(seed, offset, element index)`` (seed None: drawn from torch's default generator)
    unless ``rand`` gives them (integers in [0, 2**rbits), broadcastable to x).
    ``sat``: finite, propagate or none (P3109).  A rounded value outside x's dtype's range
    (fp16 inputs rounded to a wider-range format) becomes infinite or zero in that dtype.
    """
    result = round_float64(
        x,
        fmt,
        mode,
        rbits=rbits,
        variant=variant,
        sat=sat,
        seed=seed,
        offset=offset,
        rand=rand,
        backend=backend,
    )
    return result.to(x.dtype)


def _code_dtype(bits: int) -> torch.dtype:
    """uint8 up to 8 bits; otherwise the signed type of the next width (as `Tensor.view`)."""
    for width, dtype in ((8, torch.uint8), (16, torch.int16), (32, torch.int32)):
        if bits <= width:
            return dtype
    return torch.int64


def encode_values(values: Tensor, fmt: Format) -> Tensor:
    """The codes of float64 values of the format, as int64 in [0, 2**bits)."""
    if fmt.nan == "none" and bool(torch.isnan(values).any()):
        raise ValueError(
            f"format {fmt.name} has no NaN code, and the rounded values contain NaN (a NaN "
            "input or an overflow); use sat='finite' or filter the input"
        )
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
    if fmt.has_nan:
        nan_code = _nan_code(fmt)
        code = torch.where(torch.isnan(values), nan_code, code)
    return code


def _nan_code(fmt: Format) -> int:
    """The canonical NaN code (reference.encode_value(nan)): quiet NaN, fn's all-ones, fnuz's -0."""
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
    rand: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """Round x to ``fmt`` (as `round`) and return the bit patterns.

    Codes are uint8 for formats of at most 8 bits, else int16/int32/int64 holding the bit
    pattern as `Tensor.view` would (``encode(x, "bf16") == x.to(bf16).view(int16)``).
    NaN becomes the canonical quiet NaN code; a format without NaN raises ValueError.
    """
    fmt = find_format(fmt)
    values = round_float64(
        x,
        fmt,
        mode,
        rbits=rbits,
        variant=variant,
        sat=sat,
        seed=seed,
        offset=offset,
        rand=rand,
        backend=backend,
    )
    return encode_values(values, fmt).to(_code_dtype(fmt.bits))


def _fits(fmt: Format, dtype: torch.dtype) -> bool:
    """Whether every value of fmt is exactly representable in the float dtype: no more
    mantissa bits, no larger maximum, no finer spacing at the bottom."""
    target = format_of_dtype(dtype)
    return (
        fmt.mbits <= target.mbits
        and fmt.max <= target.max
        and fmt.min_subnormal >= target.min_subnormal
    )


def decode(codes: Tensor, fmt: Format | str, dtype: torch.dtype = torch.float32) -> Tensor:
    """The values of bit patterns (any integer dtype; the low ``fmt.bits`` bits are used)."""
    fmt = find_format(fmt)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {FLOAT_DTYPES}; got {dtype}")
    if not _fits(fmt, dtype):
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
        negative = (code >> magnitude_bits) == 1
        value = torch.where(negative, -value, value)
        if fmt.nan == "fnuz":
            nan = nan | (negative & (magnitude_code == 0))
    return torch.where(nan, float("nan"), value).to(dtype)


def pack(codes: Tensor, bits: int) -> Tensor:
    """Pack 4-bit codes two per byte (first in the low nibble) or 6-bit codes four per three
    bytes (little-endian 24-bit groups: code i at bits 6i..6i+5), along the last dimension."""
    codes = _check_codes(codes, bits)
    group = {4: 2, 6: 4}[bits]
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
    group = {4: 2, 6: 4}[bits]
    nbytes = group * bits // 8
    if packed.shape[-1] % nbytes:
        raise ValueError(f"the last dimension must be a multiple of {nbytes} to unpack")
    grouped = packed.to(torch.int64).reshape(*packed.shape[:-1], -1, nbytes)
    word = (grouped << (torch.arange(nbytes, device=packed.device) * 8)).sum(-1)
    shifts = torch.arange(group, device=packed.device) * bits
    codes = (word.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def check_bits(bits: int) -> int:
    if bits not in (4, 6):
        raise ValueError(f"bits must be 4 or 6; got {bits!r}")
    return bits


def _check_codes(codes: Tensor, bits: int) -> Tensor:
    check_bits(bits)
    if not isinstance(codes, Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError("codes must be an integer torch.Tensor")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2**bits):
        raise ValueError(f"codes must be in [0, 2**{bits})")
    return codes


CAST_DTYPES: tuple[torch.dtype, ...] = tuple(
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
    rand: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """Round x to the format of a torch dtype and return the result in that dtype.

    ``float4_e2m1fn_x2`` packs two e2m1 codes per byte along the last dimension (which
    must be even), the first in the low nibble.
    """
    if dtype not in CAST_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(str, CAST_DTYPES))}; got {dtype}")
    fmt = format_of_dtype(dtype)
    options = dict(
        rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset, rand=rand, backend=backend
    )
    if fmt.bits == 4:
        _check_input(x)
        if x.shape[-1:] == () or x.shape[-1] % 2:
            raise ValueError("float4_e2m1fn_x2 packs pairs: x's last dimension must be even")
        return pack(encode(x, fmt, mode, **options), 4).view(dtype)
    return round_float64(x, fmt, mode, **options).to(dtype)


__all__ = [
    "BACKENDS",
    "CAST_DTYPES",
    "cast",
    "decode",
    "encode",
    "pack",
    "round",
    "round_float64",
    "unpack",
]
