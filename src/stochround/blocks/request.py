"""A block quantize call's vocabulary and argument checks: the record of its arguments
(`BlockArguments`), its checked choices (`BlockRequest`), and the checks that refuse a call
before any stream is drawn from.  The manual: docs/guide/blocks.md."""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..block_constants import FOLDED_FLAVOURS, HADAMARD_SIZES, SCALE_RULES
from ..kernels.availability import check_backend
from ..presets import preset
from ..random import check_index_offset
from ..reference import VARIANTS, check_choice, check_mode, check_rbits
from ..rounding import check_input
from .formats import Block, BlockFormat, block_format, check_block
from .hadamard import random_signs
from .scales import TensorScale, check_flavour, given_tensor_scale

__all__ = [
    "RHT_SEED",
    "BlockArguments",
    "BlockRequest",
    "check_blocks",
    "check_call",
    "check_extras",
    "default_signs",
    "given_scales",
    "random_source",
    "resolve_block_format",
    "tensor_scale_choice",
]


# the fixed sign vector of ``rht_signs=None``: random_signs(size, seed=RHT_SEED), one
# rotation shared by every call, so that two operands of a GEMM quantized with different
# rounding seeds still share their rotation (as Transformer Engine's fixed sign vector)
RHT_SEED = 0

# those sign vectors per (size, device), made once: drawing them takes dozens of small
# operations, a cost every eager call would pay again (under torch.compile they are drawn
# in the graph instead)
_DEFAULT_SIGNS: dict[tuple[int, torch.device], Tensor] = {}


def default_signs(size: int, device: torch.device) -> Tensor:
    """``random_signs(size, seed=RHT_SEED)`` on ``device``: the signs of ``rht_signs=None``."""
    if torch.compiler.is_compiling():
        return random_signs(size, RHT_SEED, device=device)
    key = (size, device)
    if key not in _DEFAULT_SIGNS:
        _DEFAULT_SIGNS[key] = random_signs(size, RHT_SEED, device=device)
    return _DEFAULT_SIGNS[key]


class BlockArguments(NamedTuple):
    """A call's arguments as the user passed them (unchecked): what the entry points hand
    to the local path (`dispatch`) and the sharded one (`sharded`), which check them."""

    fmt: str | BlockFormat
    mode: str
    axis: object
    block: Block
    scale_rule: str | None
    tensor_scale: Tensor | float | bool | TensorScale | None
    nvfp4_flavour: str
    rht: int | None
    rht_signs: Tensor | None
    rht_bf16: bool
    rbits: int | None
    variant: str
    seed: int | Tensor | None
    offset: int | Tensor | None
    stream: streams.Stream | None
    hardware: str | None
    index_offset: int
    backend: str

    @classmethod
    def of(
        cls,
        choices: tuple,
        seed: int | Tensor | None,
        offset: int | Tensor | None,
        stream: streams.Stream | None,
    ) -> BlockArguments:
        """The arguments of a call's ``choices`` (`choices`: every field but the stream's,
        in the fields' order) and its stream."""
        return cls._make((*choices[:_STREAM_START], seed, offset, stream, *choices[_STREAM_START:]))

    def choices(self) -> tuple:
        """Every field but the stream's (seed, offset, stream), in the fields' order: what a
        call's plan depends on (`stochround.blocks.quantize_plan.plan_key`)."""
        return self[:_STREAM_START] + self[_STREAM_START + 3 :]


# where the stream's fields (seed, offset, stream: one run) begin among `BlockArguments`'
_STREAM_START = BlockArguments._fields.index("seed")
assert BlockArguments._fields[_STREAM_START : _STREAM_START + 3] == ("seed", "offset", "stream")


class BlockRequest(NamedTuple):
    """A quantize call's checked choices (what the PyTorch path and the kernel take)."""

    fmt: BlockFormat
    mode: str
    n: int
    variant: str
    axis: int
    flavour: str
    hardware: str | None
    index_offset: int = 0


def _check_axis(axis: object, ndim: int) -> int:
    """axis as a nonnegative int below ndim (ValueError naming the range otherwise)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise ValueError(f"axis must be an int in [-{ndim}, {ndim}); got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis must be an int in [-{ndim}, {ndim}) for x of {ndim} dims; got {axis}"
        )
    return axis % ndim


def resolve_block_format(fmt: str | BlockFormat, block: object, scale_rule: object) -> BlockFormat:
    """The call's block format: ``fmt`` with ``block`` and ``scale_rule`` replaced where
    given (the replacement is validated as a `BlockFormat`)."""
    found = block_format(fmt)
    changes: dict[str, Any] = {}
    if block is not None:
        changes["block"] = check_block(block)
    if scale_rule is not None:
        check_choice("scale_rule", scale_rule, SCALE_RULES)
        changes["scale_rule"] = scale_rule
    return dataclasses.replace(found, **changes) if changes else found


def check_blocks(fmt: BlockFormat, shape: torch.Size, axis: int) -> None:
    """ValueError unless the block divides the quantized axis (2-D tiles: the last two axes,
    with axis the last one)."""
    block = fmt.block
    if isinstance(block, tuple):
        if len(shape) < 2:
            raise ValueError(
                f"2-D blocks {block} need x of at least 2 dims; got shape {tuple(shape)}"
            )
        if axis != len(shape) - 1:
            raise ValueError(
                f"2-D blocks {block} cover the last two axes: axis must be -1; got {axis}"
            )
        for size, length, name in zip(block, shape[-2:], ("rows", "columns"), strict=True):
            if length % size:
                raise ValueError(
                    f"block {block} must divide x's last two axes: {length} {name} is not a "
                    f"multiple of {size}"
                )
    elif block is not None and shape[axis] % block:
        raise ValueError(
            f"block {block} must divide the length {shape[axis]} of axis {axis} (no padding)"
        )
    if fmt.element.bits == 4:
        last = shape[-1] if isinstance(block, tuple) else shape[axis]
        if last % 2:
            raise ValueError(f"4-bit codes pack two per byte: the axis length {last} must be even")


def tensor_scale_choice(fmt: BlockFormat, tensor_scale: object) -> str:
    """What the call's tensor scale is: "none", "amax" (computed), "given" (a decoding
    scale, checked: `_check_tensor_scale`) or "pair" (a `TensorScale`: the whole tensor's,
    which a sharded call gives each rank)."""
    if tensor_scale is False:
        return "none"
    if tensor_scale is None:
        return "amax" if fmt.tensor_scale else "none"
    if isinstance(tensor_scale, TensorScale):
        return "pair"
    if isinstance(tensor_scale, bool):
        raise ValueError("tensor_scale must be None, False, a float or an fp32 tensor; got True")
    if not fmt.tensor_scale:
        raise ValueError(
            f"tensor_scale applies to formats with a per-tensor scale (nvfp4); {fmt.name} has none"
        )
    if isinstance(tensor_scale, numbers.Real) or (
        isinstance(tensor_scale, Tensor) and tensor_scale.numel() == 1
    ):
        _check_tensor_scale(tensor_scale)
        return "given"
    raise ValueError(
        "tensor_scale must be None (from the tensor's amax), False (single-level), a float "
        f"or a one-element fp32 tensor; got {tensor_scale!r}"
    )


def _check_tensor_scale(tensor_scale: numbers.Real | Tensor) -> None:
    """ValueError unless a given decoding tensor scale is positive and finite (a negative
    one flips every block scale's sign, 0 zeroes the tensor, NaN or inf poisons it): a
    number, or a tensor on the CPU, read at once; a tensor on an accelerator is not read
    (that would wait for the device: the guide says so), nor under torch.compile."""
    if isinstance(tensor_scale, Tensor):
        if tensor_scale.device.type != "cpu" or torch.compiler.is_compiling():
            return
        if not tensor_scale.is_floating_point():
            raise ValueError(f"tensor_scale must be a floating tensor; got {tensor_scale.dtype}")
        value = float(tensor_scale.reshape(()).to(torch.float32))
    else:
        value = float(tensor_scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"tensor_scale must be a positive finite decoding scale (as float32); got {value!r}"
        )


def given_scales(tensor_scale: object, device: torch.device) -> TensorScale:
    """The `TensorScale` of a checked "given" (a decoding scale) or "pair" tensor scale."""
    if isinstance(tensor_scale, TensorScale):
        return TensorScale(*(scale.to(device) for scale in tensor_scale))
    decode = torch.as_tensor(tensor_scale, dtype=torch.float32, device=device).reshape(())
    return given_tensor_scale(decode)


def check_extras(x: Tensor, request: BlockRequest, args: BlockArguments) -> None:
    """The tensor scale and RHT options checked before a stream is drawn from (a refused
    call takes nothing from it): ``rht`` one of `HADAMARD_SIZES`, dividing the axis; a
    given tensor scale not under the "pow2" flavour (whose GEMM operands hold a tensor
    scale computed as a power of two)."""
    choice = tensor_scale_choice(request.fmt, args.tensor_scale)
    if choice == "given" and request.flavour in FOLDED_FLAVOURS:
        raise ValueError(
            f"nvfp4_flavour={request.flavour!r} computes a power-of-two tensor scale from x's "
            "amax; a given tensor_scale takes 'te' or 'torchao'"
        )
    rht, rht_signs = args.rht, args.rht_signs
    if rht is None:
        if rht_signs is not None:
            raise ValueError("rht_signs applies with rht= (the Hadamard size); got rht=None")
        return
    if isinstance(rht, bool) or rht not in HADAMARD_SIZES:
        allowed = ", ".join(map(str, HADAMARD_SIZES))
        raise ValueError(f"rht must be None or a Hadamard size in {allowed}; got {rht!r}")
    length = x.shape[request.axis]
    if length % typing.cast(int, rht):
        raise ValueError(f"rht={rht} must divide the length {length} of axis {request.axis}")


def random_source(
    mode: str,
    seed: int | Tensor | None,
    offset: int | Tensor | None,
    stream: streams.Stream | None,
) -> tuple[int | Tensor, int | Tensor]:
    """The (seed, offset) of a call in the checked ``mode`` (from its arguments ``seed``,
    ``offset`` and ``stream``, each checked): for SR given, drawn from torch's default
    generator (seed None, as the core draws it), or taken from ``stream`` (advanced by
    one); (0, 0) otherwise."""
    if stream is not None:
        if not isinstance(stream, streams.Stream):
            raise TypeError(f"stream must be a stochround.Stream, got {type(stream).__name__}")
        if seed is not None or offset is not None:
            raise ValueError("stream= gives the seed and offset: pass stream= or seed=/offset=")
        if mode != "sr":
            return 0, 0
        return stream.take()
    if mode != "sr":
        return 0, 0
    offset = 0 if offset is None else streams.check_seed(offset, "offset")
    if seed is not None:
        return streams.check_seed(seed, "seed"), offset
    if torch.compiler.is_compiling():
        return streams.default_seed_tensor(), offset
    return streams.default_seed(), offset


def check_call(x: object, args: BlockArguments) -> tuple[Tensor, BlockRequest]:
    """x and the call's choices, each checked (an error naming it); the tensor scale, the
    rotation and the stream are checked apart (`check_extras`, `random_source`)."""
    fmt, mode, block, scale_rule = args.fmt, args.mode, args.block, args.scale_rule
    rbits, variant, hardware = args.rbits, args.variant, args.hardware
    x = check_input(x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to hold blocks; got a 0-d tensor")
    resolved = resolve_block_format(fmt, block, scale_rule)
    mode = check_mode(mode)
    check_choice("variant", variant, VARIANTS)
    check_backend(args.backend)
    flavour = check_flavour(args.nvfp4_flavour)
    if mode != "sr" and rbits is not None:
        raise ValueError(f"rbits applies to mode='sr' only; got mode={mode!r}")
    n = check_rbits(rbits)
    if hardware is not None:
        if mode != "sr" or rbits is not None or variant != "c":
            raise ValueError(
                f"hardware={hardware!r} is an SR unit that sets rbits and variant: pass "
                "mode='sr' and leave rbits and variant at their defaults"
            )
        unit = preset(hardware, resolved.element)
        if unit.target != resolved.element:
            raise ValueError(
                f"hardware={hardware!r} rounds to {unit.target.name}, not to {resolved.name}'s "
                f"elements ({resolved.element.name})"
            )
        n = unit.rbits
    axis_index = _check_axis(args.axis, x.dim())
    check_blocks(resolved, x.shape, axis_index)
    if resolved.block is None and x.shape[axis_index] == 0:
        # a row of nothing has no scale amax / max (and its blocks no length to divide by)
        raise ValueError(
            f"whole-row blocks (block=None: one scale per row along axis {axis_index}) need "
            "a nonempty axis; its length is 0"
        )
    hardware_name = None if hardware is None else str(hardware)
    index_offset = check_index_offset(args.index_offset)
    return x, BlockRequest(
        resolved, mode, n, variant, axis_index, flavour, hardware_name, index_offset
    )
