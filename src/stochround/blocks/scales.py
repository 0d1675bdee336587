"""Scale rules: a block's scale from its largest magnitude ``amax``, exactly.

Each rule returns the stored scale and the fp32 *multiplier* that takes x's values to the
element grid (``v = x * multiplier``, rounded to the element format, saturating).

Power-of-two rules (E8M0 scales ``2**e``, ``e`` clamped to E8M0's range [-127, 127]; the
multiplier is ``2**-e``, exact): with ``emax`` the element format's largest exponent and
``max`` its largest value,

* ``floor``: ``e = floor(log2 amax) - emax``: OCP Microscaling Formats v1.0, section 6.3,
  and torchao's ``ScaleCalculationMode.FLOOR``.
* ``ceil``: ``e = ceil(log2 amax) - emax`` (torchao ``CEIL``).
* ``even``: ``e = floor(log2 amax') - emax`` with ``amax'`` amax rounded to the element's
  precision (``mbits`` fraction bits), ties away from zero (torchao ``EVEN``, which adds half
  an element ulp to amax's bits and truncates).
* ``rceil``: ``e = ceil(log2 d)`` with ``d = amax * fp32(1 / max)``, the product with the
  fp32 reciprocal of the element max, as Transformer Engine computes it (``amax *
  max_norm_rcp``; cuBLAS's rule; torchao ``RCEIL``, whose eager path divides by max on the
  CPU and multiplies by the reciprocal on CUDA).
* ``floor-3/4``: the floor scale, and the multiplier ``2**-e`` times 3/4 (Tseng et al.,
  "Training LLMs with MXFP4", 2025): ``amax * 2**-e < 2**(emax + 1)``, so that the scaled
  values stay below ``1.5 * 2**emax``, which every element format of the MX family holds
  (e2m1: 6; e2m3: 7.5; e3m2: 28; e4m3fn: 448; e5m2: 57344): stochastic rounding can never
  clip.  The 3/4 multiplies the scaled elements (``x * 2**-e`` in fp32, then ``* 0.75``
  in fp32, exact for inputs of at most 22 significant bits such as bf16 and fp16); the
  stored scale is the floor scale, and dequantization multiplies by 4/3 (`RESCALE`).

Edge cases, decided: an all-zero block takes the smallest scale ``2**-127`` (its elements
are 0); a block whose amax is NaN or infinite takes the NaN scale (E8M0 code 0xFF, as the
OCP spec's NaN scale) and a NaN multiplier, so that its elements are NaN in element formats
with a NaN code and code 0 in those without (the block dequantizes to NaN either way); an
fp32-subnormal amax is handled exactly (``floor(log2)`` from `torch.frexp`, not from the
exponent field).  At the bottom of E8M0's range the multiplier is exactly ``2**127``:
torchao's FLOOR/CEIL/EVEN divide by ``max(2**e, 2**-126)`` instead, which halves the
elements of blocks whose scale is ``2**-127``, and its RCEIL multiplies those blocks by
1 instead of ``2**127``; we do not copy either.

NVFP4 (``nvfp4``, an E4M3 block scale under an FP32 tensor scale), in three flavours:

* ``"te"`` (Transformer Engine's ``quantize_transpose_nvfp4`` and its reference quantizer,
  ``core_nvfp4.cuh``): ``S_enc = min(448 * 6 / amax_tensor, FLT_MAX)``, 1 where amax_tensor
  is 0 or not finite; ``S_dec = 1 / S_enc``; block scale ``s = e4m3(min(amax * (S_enc *
  fp32(1/6)), FLT_MAX))`` (saturating at 448, no lower clamp), from ``S_enc`` itself (not
  ``1 / S_dec``, which differs from it for many amax: `TensorScale` keeps both);
  multiplier ``min(1 / (s * S_dec), FLT_MAX)``.  Single-level (no tensor scale): ``S_enc =
  S_dec = 1``.  A decoding scale the caller gives takes ``S_enc = fp32(1 / S_dec)``.
* ``"torchao"`` (torchao's ``nvfp4_quantize``): tensor scale ``t = amax_tensor / 2688``
  (``per_tensor_amax_to_scale``); block scale ``s = e4m3(clamp(amax / 6 / t, 2**-6, 448))``;
  multiplier ``(1 / t) / s``.  Single-level: ``s = e4m3(clamp(amax / 6, 2**-6, 448))``,
  multiplier ``1 / s``.  An all-zero tensor takes ``t = 1`` (torchao would divide 0 by 0).
* ``"pow2"`` (ours): TE's order with ``S_dec = 2**max(ceil(log2(amax_tensor / 2688)),
  -118)`` (the quotient correctly rounded; 1 where amax_tensor is 0 or not finite) and
  ``S_enc = 1 / S_dec``, both exact.  The block scales then reach at most 448 as TE's do
  (at least 224 for the largest block), and a GEMM operand carries the tensor scale in
  its values, exactly in bf16 (an element times its block scale times a power of two at
  least ``2**-118``), so that the GEMM has no tensor scale to apply to its result.

``absmax`` (int8 row-wise, torchao's ``quantize_int8_rowwise``): scale ``amax / max`` in
x's dtype, multiplier ``1 / max(fp32(scale), 1e-12)``.

All quotients and products are fp32 operations rounded to nearest-even, in the order
written: that order is what makes the results bit-identical to the peers'.  Every quotient
is a correctly rounded division of two tensors (`quotient`) on every device: PyTorch's CUDA
kernels divide by a Python number as a product with its reciprocal, so torchao's eager
``amax / 6``, ``amax / 2688`` and ``amax / 127`` differ between its CPU and CUDA runs in
rare blocks; ours follow its CPU arithmetic (the written division) everywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..block_constants import (
    ABSMAX_FLOORS,
    E2M1_MAX,
    E4M3_EPS,
    E4M3_MAX,
    FLT_MAX,
    NVFP4_FLAVOURS,
    POW2_LEAST_EXPONENT,
    POWER_OF_TWO_RULES,
    SHRINK,
)
from ..torch_path import scale_by_power_of_two

E8M0_MIN_EXPONENT = -127
E8M0_MAX_EXPONENT = 127
E8M0_BIAS = 127
E8M0_NAN_CODE = 0xFF


def quotient(numerator: Tensor | float, denominator: Tensor | float, like: Tensor) -> Tensor:
    """numerator / denominator correctly rounded in ``like``'s dtype, on every device,
    eager and compiled.

    Both operands become tensors of ``like``'s dtype and device first: PyTorch computes
    ``tensor / python_float`` on CUDA as a product with the float's reciprocal (two
    roundings) and ``python_float / tensor`` everywhere as ``reciprocal * float``, so that
    a quotient written with a Python number differs between devices.  Narrower operands
    are divided in float64 and the quotient rounded once to ``like``'s dtype: correctly
    rounded (53 >= 2p + 2 bits for p = 24), and what inductor compiles for CUDA, whose fp32
    division in Triton is not correctly rounded, while its float64 division is.

    Eagerly a Python number is a 0-d float64 tensor on the device, made once
    (`device_constant`), which the division broadcasts: the same elementwise division as a
    full tensor of it, without a fill and a conversion a call."""
    wide = torch.float64
    if not torch.compiler.is_compiling():
        quotients = torch.div(_wide(numerator, like), _wide(denominator, like))
        if quotients.shape == like.shape:
            return quotients.to(like.dtype)
    quotients = torch.div(_full(numerator, like, wide), _full(denominator, like, wide))
    return quotients.to(like.dtype)


def _wide(value: Tensor | float, like: Tensor) -> Tensor:
    """value in float64 on ``like``'s device, rounded to ``like``'s dtype first (a Python
    number as a cached 0-d tensor), in ``value``'s own shape."""
    if isinstance(value, Tensor):
        return value.to(dtype=like.dtype, device=like.device).to(torch.float64)
    return device_constant(value, like.dtype, like.device)


# `device_constant`'s tensors (a dict read by a plain function, as torch.compile wants)
_CONSTANTS: dict[tuple[float, torch.dtype, torch.device, torch.dtype], Tensor] = {}


def device_constant(
    value: float, dtype: torch.dtype, device: torch.device, wide: torch.dtype = torch.float64
) -> Tensor:
    """``wide(dtype(value))``, a 0-d tensor on ``device``, made once per value, dtypes and
    device: a constant operand broadcast by the operations that read it (on the device, not
    a CPU scalar, which CUDA's division would turn into a product with its reciprocal)."""
    key = (value, dtype, device, wide)
    constant = _CONSTANTS.get(key)
    if constant is None:
        rounded = torch.tensor(value, dtype=dtype).to(wide)
        constant = _CONSTANTS[key] = rounded.to(device)
    return constant


def _full(value: Tensor | float, like: Tensor, dtype: torch.dtype) -> Tensor:
    """value as a tensor of ``like``'s shape and device, in ``dtype``: a Python number
    rounded to ``like``'s dtype first, as the operand it stands for."""
    if isinstance(value, Tensor):
        return value.to(dtype=like.dtype, device=like.device).to(dtype).expand(like.shape)
    return torch.full_like(like, value).to(dtype)


def exact_floor_log2(value: Tensor) -> Tensor:
    """floor(log2 value) for positive finite fp32 values (subnormals included), exactly,
    as int32: `torch.frexp`'s exponent less one (frexp's mantissa lies in [0.5, 1))."""
    _, exponent = torch.frexp(value)
    return exponent.to(torch.int32) - 1


def power_of_two_fp32(exponent: Tensor) -> Tensor:
    """``2**e`` in fp32, exactly, for int32 exponents in [-126, 127] (the bits of the
    exponent field)."""
    return ((exponent + 127) << 23).view(torch.float32)


def exact_ceil_log2(value: Tensor) -> Tensor:
    """ceil(log2 value) for positive finite fp32 values, exactly, as int32: the floor
    (`exact_floor_log2`), one more unless the value is a power of two."""
    return exact_floor_log2(value) + (~is_power_of_two(value)).to(torch.int32)


def is_power_of_two(value: Tensor) -> Tensor:
    """Whether positive finite values are powers of two (frexp's mantissa is 0.5)."""
    mantissa, _ = torch.frexp(value)
    return mantissa == 0.5


def power_of_two_exponent(
    amax: Tensor, rule: str, *, emax: int, mbits: int, max_value: float
) -> Tensor:
    """The exponent e of the E8M0 scale ``2**e`` of blocks with largest magnitudes ``amax``
    (fp32) under a power-of-two rule (module docstring), clamped to [-127, 127], int32,
    for an element format with largest exponent ``emax``, ``mbits`` fraction bits and
    largest value ``max_value``.  Zero (and non-finite) amax gives -127: the caller marks
    non-finite blocks NaN."""
    if rule not in POWER_OF_TWO_RULES:
        raise ValueError(
            f"rule must be one of {', '.join(map(repr, POWER_OF_TWO_RULES))}; got {rule!r}"
        )
    amax = amax.to(torch.float32)
    if rule == "rceil":
        # TE's `amax * max_norm_rcp`: the product with the fp32 reciprocal of the max
        amax = amax * torch.tensor(1.0 / max_value, dtype=torch.float32, device=amax.device)
    regular = torch.isfinite(amax) & (amax > 0)
    safe = torch.where(regular, amax, 1.0)
    exponent = exact_ceil_log2(safe) if rule in ("ceil", "rceil") else exact_floor_log2(safe)
    if rule == "even":
        mantissa, _ = torch.frexp(safe)
        # rounding the significand 2m in [1, 2) to mbits fraction bits, ties away, reaches 2
        up = mantissa >= 1.0 - 2.0 ** -(mbits + 2)
        exponent = exponent + up.to(torch.int32)
    if rule != "rceil":
        exponent = exponent - emax
    exponent = torch.where(regular, exponent, E8M0_MIN_EXPONENT)
    return exponent.clamp(E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT)


def e8m0_codes(exponent: Tensor, amax: Tensor) -> Tensor:
    """E8M0 codes (uint8) of exponents in [-127, 127]: the biased code ``e + 127``, and
    the NaN code 0xFF where amax is NaN or infinite."""
    code = (exponent + E8M0_BIAS).to(torch.int32)
    code = torch.where(torch.isfinite(amax), code, E8M0_NAN_CODE)
    return code.to(torch.uint8)


def e8m0_scales(exponent: Tensor, amax: Tensor) -> Tensor:
    """E8M0 scales (torch.float8_e8m0fnu) of exponents in [-127, 127] (`e8m0_codes`)."""
    return as_e8m0(e8m0_codes(exponent, amax))


def as_e8m0(codes: Tensor) -> Tensor:
    """uint8 E8M0 codes as torch.float8_e8m0fnu: a view, or under torch.compile a copy by
    an op the compiler does not look into (inductor's CPU code has no type for e8m0, so
    e8m0 tensors cross a compiled graph only through this op and `e8m0_bits`)."""
    if torch.compiler.is_compiling():
        return _as_e8m0_op(codes)
    return codes.view(torch.float8_e8m0fnu)


def e8m0_bits(scales: Tensor) -> Tensor:
    """torch.float8_e8m0fnu scales as their uint8 codes: a view, or under torch.compile a
    copy by an opaque op (`as_e8m0`)."""
    if torch.compiler.is_compiling():
        return _e8m0_bits_op(scales)
    return scales.view(torch.uint8)


def _as_e8m0_copy(codes: Tensor) -> Tensor:
    return codes.view(torch.float8_e8m0fnu).clone()


def _e8m0_bits_copy(scales: Tensor) -> Tensor:
    return scales.view(torch.uint8).clone()


_as_e8m0_op = torch.library.custom_op("stochround::as_e8m0", _as_e8m0_copy, mutates_args=())
_e8m0_bits_op = torch.library.custom_op("stochround::e8m0_bits", _e8m0_bits_copy, mutates_args=())


@_as_e8m0_op.register_fake
def _(codes: Tensor) -> Tensor:
    return torch.empty_like(codes, dtype=torch.float8_e8m0fnu)


@_e8m0_bits_op.register_fake
def _(scales: Tensor) -> Tensor:
    return torch.empty_like(scales, dtype=torch.uint8)


def power_of_two_multiply(x: Tensor, exponent: Tensor, amax: Tensor, rule: str) -> Tensor:
    """x (fp32) times ``2**-exponent`` (exactly, wherever the product is an fp32 normal
    number), times 3/4 for ``floor-3/4``; NaN where the block's amax is not finite."""
    scaled = scale_by_power_of_two(x, -exponent.to(torch.int64))
    if rule == "floor-3/4":
        scaled = scaled * SHRINK
    return torch.where(torch.isfinite(amax), scaled, float("nan"))


def check_flavour(flavour: object) -> str:
    """nvfp4_flavour, checked: one of `NVFP4_FLAVOURS`."""
    if flavour not in NVFP4_FLAVOURS:
        raise ValueError(
            f"nvfp4_flavour must be one of {', '.join(map(repr, NVFP4_FLAVOURS))}; got {flavour!r}"
        )
    return flavour  # type: ignore[return-value]


class TensorScale(NamedTuple):
    """NVFP4's two per-tensor scales, 0-d fp32 tensors: ``decode`` (``S_dec``, what
    dequantization multiplies by: `BlockTensor.tensor_scale`) and ``encode`` (``S_enc``,
    what the "te" flavour computes the block scales with).  Computed from the amax, both
    are kept: ``fp32(1 / fp32(1 / S_enc))`` differs from ``S_enc`` for many amax values,
    and TE computes the block scales from ``S_enc`` itself."""

    decode: Tensor
    encode: Tensor


def nvfp4_tensor_scales(amax_tensor: Tensor, flavour: str) -> TensorScale:
    """NVFP4's per-tensor scales of a tensor with largest magnitude ``amax_tensor`` (a
    one-element fp32 tensor): TE's ``S_enc = min(2688 / amax, FLT_MAX)`` (1 where amax is
    0 or not finite) and ``S_dec = 1 / S_enc``, or torchao's ``S_dec = amax / 2688`` (1
    where amax is 0 or not finite) and ``S_enc = 1 / S_dec`` (which torchao's order does
    not read), or "pow2"'s ``S_dec = 2**max(ceil(log2(amax / 2688)), -118)`` (1 where amax
    is 0 or not finite) and its exact inverse."""
    amax = amax_tensor.to(torch.float32).reshape(())
    bad = (amax == 0) | ~torch.isfinite(amax)
    if check_flavour(flavour) == "pow2":
        wanted = quotient(amax, E4M3_MAX * E2M1_MAX, amax)
        positive = torch.where(wanted > 0, wanted, 1.0)
        exponent = exact_ceil_log2(positive)
        # a quotient of 0 (an amax below 2688 times fp32's least subnormal) takes the least
        exponent = torch.where(wanted > 0, exponent, POW2_LEAST_EXPONENT)
        exponent = torch.where(bad, 0, exponent.clamp(min=POW2_LEAST_EXPONENT))
        return TensorScale(power_of_two_fp32(exponent), power_of_two_fp32(-exponent))
    if flavour == "te":
        encode = torch.clamp(quotient(E4M3_MAX * E2M1_MAX, amax, amax), max=FLT_MAX)
        encode = torch.where(bad | (encode == 0), 1.0, encode)
        return TensorScale(quotient(1.0, encode, encode), encode)
    decode = torch.where(bad, 1.0, quotient(amax, E4M3_MAX * E2M1_MAX, amax))
    return TensorScale(decode, quotient(1.0, decode, decode))


def given_tensor_scale(decode: Tensor) -> TensorScale:
    """The `TensorScale` of a decoding scale the caller gives (delayed scaling): ``S_enc =
    fp32(1 / S_dec)``, the only encoding scale it implies."""
    decode = decode.to(torch.float32).reshape(())
    return TensorScale(decode, quotient(1.0, decode, decode))


def nvfp4_scales(
    amax: Tensor, tensor_scale: TensorScale | None, flavour: str
) -> tuple[Tensor, Tensor]:
    """NVFP4 block scales (torch.float8_e4m3fn) and fp32 multipliers of blocks with
    largest magnitudes ``amax`` (fp32), under the per-tensor scales ``tensor_scale``
    (None: single-level scaling), in TE's or torchao's operation order (module
    docstring)."""
    amax = amax.to(torch.float32)
    if check_flavour(flavour) in ("te", "pow2"):  # pow2: TE's order, its own tensor scale
        if tensor_scale is None:
            encode = decode = torch.ones((), dtype=torch.float32, device=amax.device)
        else:
            decode = tensor_scale.decode.to(device=amax.device, dtype=torch.float32)
            encode = tensor_scale.encode.to(device=amax.device, dtype=torch.float32)
        sixth = torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32, device=amax.device)
        wanted = torch.clamp(amax * (encode * sixth), max=FLT_MAX)
        scales = torch.clamp(wanted, max=E4M3_MAX).to(torch.float8_e4m3fn)
        decoded = scales.to(torch.float32) * decode
        return scales, torch.clamp(quotient(1.0, decoded, decoded), max=FLT_MAX)
    block = quotient(amax, E2M1_MAX, amax)
    if tensor_scale is not None:
        block = quotient(block, tensor_scale.decode, block)
    scales = torch.clamp(block, min=E4M3_EPS, max=E4M3_MAX).to(torch.float8_e4m3fn)
    values = scales.to(torch.float32)
    if tensor_scale is None:
        return scales, quotient(1.0, values, values)
    inverse = quotient(1.0, tensor_scale.decode, values)
    return scales, quotient(inverse, values, values)


def absmax_floor(dtype: torch.dtype) -> float:
    """The least value of ``dtype`` (the scales' dtype, x's) at or above torchao's eps
    ``fp32(1e-12)``: the smallest row scale stored and divided by."""
    return ABSMAX_FLOORS[dtype]


def absmax_scales(amax: Tensor, max_value: float) -> tuple[Tensor, Tensor]:
    """Row-wise absmax scales ``max(amax / max, floor)`` in amax's dtype (x's) and the fp32
    multipliers ``1 / fp32(scale)`` (torchao's ``quantize_int8_rowwise`` for every scale at or
    above its eps; below it torchao divides by eps but stores the smaller scale, which
    shrinks the row: here the stored scale is the one divided by, so that dequantizing
    gives x back on average under SR — `absmax_floor`, docs/guide/blocks.md)."""
    scales = quotient(amax, max_value, amax)
    floor = absmax_floor(scales.dtype)
    if torch.compiler.is_compiling():
        scales = torch.where(scales < floor, torch.full_like(scales, floor), scales)  # keeps NaN
    else:  # the same: maximum keeps NaN, and the floor is a value of the scales' dtype
        constant = device_constant(floor, scales.dtype, scales.device, scales.dtype)
        scales = torch.maximum(scales, constant)
    wide = scales.to(torch.float32)
    return scales, quotient(1.0, wide, wide)


__all__ = [
    "E8M0_BIAS",
    "E8M0_MAX_EXPONENT",
    "E8M0_MIN_EXPONENT",
    "E8M0_NAN_CODE",
    "TensorScale",
    "absmax_floor",
    "absmax_scales",
    "as_e8m0",
    "check_flavour",
    "device_constant",
    "e8m0_bits",
    "e8m0_codes",
    "e8m0_scales",
    "exact_ceil_log2",
    "exact_floor_log2",
    "given_tensor_scale",
    "is_power_of_two",
    "nvfp4_scales",
    "nvfp4_tensor_scales",
    "power_of_two_exponent",
    "power_of_two_fp32",
    "power_of_two_multiply",
    "quotient",
]
