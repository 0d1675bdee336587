"""A tensor's amax in one read (`tensor_amax`) and NVFP4's tensor scales from it in one more
launch (`nvfp4_tensor_scale`), on the device, without host synchronization."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..block_constants import FLT_MAX, NVFP4_FLAVOURS
from ..reference import check_choice
from .availability import INTERPRETED
from .block_rotation import Rotation, checked_rotation, rotated, rotation_rounded
from .common import INPUT_DTYPES, NAN16_BITS, fp32_bits_of
from .grid import cdiv, next_power_of_2
from .runtime import Launch, bound_launch, current_device

# elements an amax program reads
AMAX_BLOCK = 2**14 if INTERPRETED else 2**13
_FLT_MAX = tl.constexpr(FLT_MAX)


@triton.jit
def _amax_kernel(
    x_ptr,
    partial_ptr,
    signs_ptr,
    count,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    ROTATION: tl.constexpr,
    NAN16: tl.constexpr,
):
    """Each program's max |x| over BLOCK elements (of x rotated as the quantize kernel
    rotates it, with ROTATION.SIZE > 0), as fp32 bits (int32): an integer max of the
    magnitudes' bits, so a NaN anywhere gives a NaN pattern."""
    program = tl.program_id(0)
    if WIDE:
        program = program.to(tl.int64)
    group = tl.arange(0, BLOCK // 4)[None, :, None]
    lane = tl.arange(0, 4)[None, None, :]
    position = program * BLOCK + group * 4 + lane
    x = tl.load(x_ptr + position, mask=position < count, other=0.0)
    bits = fp32_bits_of(x)
    if ROTATION.SIZE > 0:
        value = rotated(
            bits.to(tl.float32, bitcast=True), signs_ptr, position, ROTATION, INVERSE=False
        )
        value = rotation_rounded(value, NAN16, x.dtype, ROTATION)
        bits = value.to(tl.int32, bitcast=True)
    tl.store(
        partial_ptr + program, tl.max(tl.max(tl.max(bits & 0x7FFFFFFF, axis=2), axis=1), axis=0)
    )


@triton.jit
def _tensor_scale_kernel(
    partial_ptr,
    amax_ptr,
    scale_ptr,
    count,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    FLAVOUR: tl.constexpr,
):
    """One program: the max of ``count`` partial maxima (fp32 bits, int32; STEPS x BLOCK
    of them cover ``count``), stored as the tensor's amax, and NVFP4's tensor scales from
    it, S_dec then S_enc (`stochround.blocks.scales.nvfp4_tensor_scales`): "te" S_enc =
    min(2688 / amax, FLT_MAX), 1 where amax is 0 or not finite (or S_enc is 0), and S_dec
    = 1 / S_enc; "torchao" S_dec = amax / 2688, 1 where amax is 0 or not finite, and
    S_enc = 1 / S_dec."""
    best = tl.zeros((BLOCK,), dtype=tl.int32)
    for step in tl.static_range(STEPS):
        position = step * BLOCK + tl.arange(0, BLOCK)
        best = tl.maximum(best, tl.load(partial_ptr + position, mask=position < count, other=0))
    amax_bits = tl.max(best, axis=0)
    amax = amax_bits.to(tl.float32, bitcast=True)
    bad = (amax_bits == 0) | (amax_bits >= 0x7F800000)
    if FLAVOUR == "te":
        encode = tl.math.div_rn(2688.0, amax)
        encode = tl.where(encode > _FLT_MAX, _FLT_MAX, encode)
        encode = tl.where(bad | (encode == 0.0), 1.0, encode)
        scale = tl.math.div_rn(1.0, encode)
    else:
        tl.static_assert(FLAVOUR == "torchao", "FLAVOUR must be te or torchao")
        scale = tl.where(bad, 1.0, tl.math.div_rn(amax, 2688.0))
        encode = tl.math.div_rn(1.0, scale)
    tl.store(amax_ptr, amax)
    tl.store(scale_ptr, scale)
    tl.store(scale_ptr + 1, encode)


def _device(x: Tensor) -> int:
    """x's CUDA device index (the current one), -1 on the CPU (the interpreter)."""
    return x.device.index if x.is_cuda else -1


def _partial_maxima(x: Tensor, rht: int | None, rht_signs: Tensor | None, rht_bf16: bool) -> Tensor:
    """Each `_amax_kernel` program's max |x| (rotated with ``rht``), fp32 bits as int32
    (one 0 for an empty x)."""
    if not isinstance(x, Tensor) or x.dtype not in INPUT_DTYPES or not x.is_contiguous():
        raise ValueError("x must be a contiguous float32, bfloat16 or float16 tensor")
    signs, rotation = checked_rotation(x, rht, rht_signs, rht_bf16, AMAX_BLOCK)
    count = x.numel()
    if count == 0:
        return x.new_zeros(1, dtype=torch.int32)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return _partial_maxima(x, rht, rht_signs, rht_bf16)
    programs = cdiv(count, AMAX_BLOCK)
    partial = x.new_empty(programs, dtype=torch.int32)
    _amax_launch(x, rotation)(_device(x), programs, x, partial, signs, count)
    return partial


def _amax_launch(x: Tensor, rotation: Rotation) -> Launch:
    """`_amax_kernel` bound for x's size and dtype and the rotation."""
    constants: dict[str, int | bool | Rotation] = {
        "BLOCK": AMAX_BLOCK,
        "WIDE": x.numel() + AMAX_BLOCK >= 2**31,
        "ROTATION": rotation,
        "NAN16": NAN16_BITS.get(x.dtype, 0),
        "enable_fp_fusion": False,
    }
    return bound_launch(_amax_kernel, tuple(constants.items()))


def tensor_scale_launch(partials: int, flavour: str) -> tuple[Launch, int]:
    """`_tensor_scale_kernel` bound for ``partials`` partial maxima and the flavour."""
    block = min(next_power_of_2(partials), 1024)
    steps = cdiv(partials, block)
    constants: dict[str, int | str | bool] = {
        "BLOCK": block,
        "STEPS": next_power_of_2(steps),
        "FLAVOUR": flavour,
        "enable_fp_fusion": False,
    }
    return bound_launch(_tensor_scale_kernel, tuple(constants.items())), partials


def tensor_amax(
    x: Tensor,
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
) -> Tensor:
    """max |x| of a contiguous fp32, bf16 or fp16 tensor as a 0-d fp32 tensor on x's
    device (NaN if x holds NaN, 0 for an empty x), equal to ``x.abs().amax()`` in fp32:
    one read of x (partial maxima of the magnitudes' bits, then their max), no
    temporary |x| and no host synchronization.  With ``rht``, ``rht_signs`` and
    ``rht_bf16`` (as `quantize_blocks` takes them): the max of x rotated along its last
    axis, as `quantize_blocks` rotates it.  `nvfp4_tensor_scale` also gives NVFP4's
    tensor scale from it, in one more launch."""
    return _partial_maxima(x, rht, rht_signs, rht_bf16).amax().view(torch.float32)


def nvfp4_tensor_scale(
    x: Tensor,
    flavour: str = "te",
    *,
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
    keep_amax: bool = True,
) -> tuple[Tensor, Tensor]:
    """NVFP4's tensor scales of x, S_dec and S_enc (a 2-element fp32 tensor), and x's amax
    (0-d fp32), on x's device, in two launches and one read of x (no host
    synchronization): `tensor_amax`'s partial maxima, then one program reducing them and
    computing the flavour's scales, equal to the `decode` and `encode` of
    ``stochround.blocks.scales.nvfp4_tensor_scales(x.abs().amax(), flavour)``.  ``flavour``
    "te" or "torchao"; the rotation as `tensor_amax` takes it.  Returns (scales, amax):
    `quantize_blocks` takes the scales as its ``tensor_scale``; with ``keep_amax`` False
    the amax is written to the device's `amax_sink` (and returned as it: a caller that
    takes the scales alone spares an allocation a call)."""
    check_choice("flavour", flavour, NVFP4_FLAVOURS)
    if x.is_cuda and x.device.index != current_device():
        with torch.cuda.device(x.device):
            return nvfp4_tensor_scale(
                x, flavour, rht=rht, rht_signs=rht_signs, rht_bf16=rht_bf16, keep_amax=keep_amax
            )
    partial = _partial_maxima(x, rht, rht_signs, rht_bf16)
    amax = x.new_empty((), dtype=torch.float32) if keep_amax else amax_sink(x.device)
    scale = x.new_empty(2, dtype=torch.float32)
    launch, partials = tensor_scale_launch(partial.numel(), flavour)
    launch(_device(x), 1, partial, amax, scale, partials)
    return scale, amax


# `amax_sink`'s tensors by device (a dict read by a plain function)
_SINKS: dict[torch.device, Tensor] = {}


def amax_sink(device: torch.device) -> Tensor:
    """A 0-d fp32 tensor on ``device`` for the tensor-scale kernel's amax output where no
    caller reads it: written by every such launch and never read, so that launches on any
    stream (or captured in a CUDA graph: it is never freed) share it, where a fresh one
    would cost an allocation a call."""
    sink = _SINKS.get(device)
    if sink is None:
        sink = _SINKS[device] = torch.empty((), dtype=torch.float32, device=device)
    return sink


class PreparedTensorScale:
    """`nvfp4_tensor_scale` for one shape, dtype and device, flavour and rotation size,
    checked and bound once (a training layer's operand): a call issues the two launches
    alone, with the same bits.  The rotation's signs come with each call."""

    def __init__(
        self,
        x: Tensor,
        flavour: str,
        *,
        rht: int | None = None,
        rht_signs: Tensor | None = None,
        rht_bf16: bool = False,
    ) -> None:
        check_choice("flavour", flavour, NVFP4_FLAVOURS)
        if not isinstance(x, Tensor) or x.dtype not in INPUT_DTYPES or not x.is_contiguous():
            raise ValueError("x must be a contiguous float32, bfloat16 or float16 tensor")
        if x.numel() == 0:
            raise ValueError("x must hold elements")
        _, rotation = checked_rotation(x, rht, rht_signs, rht_bf16, AMAX_BLOCK)
        self.count = x.numel()
        self.programs = cdiv(self.count, AMAX_BLOCK)
        self.amax_launch = _amax_launch(x, rotation)
        self.scale_launch, _ = tensor_scale_launch(self.programs, flavour)
        self.device, self.device_index = x.device, _device(x)
        self.amax = amax_sink(x.device)  # the scale kernel's amax, which no caller reads

    def __call__(self, x: Tensor, rht_signs: Tensor | None) -> Tensor:
        """S_dec and S_enc of x (the prepared size, on the prepared device, current), a
        2-element fp32 tensor, as `nvfp4_tensor_scale` gives them."""
        partial = x.new_empty(self.programs, dtype=torch.int32)
        scale = x.new_empty(2, dtype=torch.float32)
        self.amax_launch(self.device_index, self.programs, x, partial, rht_signs, self.count)
        self.scale_launch(self.device_index, 1, partial, self.amax, scale, self.programs)
        return scale


__all__ = [
    "AMAX_BLOCK",
    "PreparedTensorScale",
    "amax_sink",
    "nvfp4_tensor_scale",
    "tensor_amax",
    "tensor_scale_launch",
]
