"""What a local `quantize` call resolves once per set of choices and x's shape, dtype and
device (`stochround.blocks.dispatch` keeps its plans): the key of those (`plan_key`), and
for an eager call that the kernel computes, its prepared launch (`PreparedQuantize`), so
that a call in a loop costs a dict look-up, its allocations and its launches on the host.
The manual: docs/guide/blocks.md."""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import Tensor

from ..block_constants import POWER_OF_TWO_RULES
from ..kernels.availability import on_kernel_device
from .formats import OCP_INT8
from .request import BlockArguments, BlockRequest, default_signs, tensor_scale_choice
from .tensor import BlockTensor

__all__ = ["PreparedQuantize", "plan_key", "prepared_quantize"]


def plan_key(x: object, choices: tuple, swizzle: bool) -> tuple | None:
    """What a call's checks and routing depend on beside the stream (``choices``:
    `BlockArguments.choices`), as one flat tuple: its choices, the types of those that a
    check reads by type or that the plan keeps (``axis=True`` is refused where ``axis=1``
    is not, yet they are equal and hash alike; the mode, variant, flavour and backend,
    checked by ``in``, need none), a 2-D tile's entries' types, x's shape, dtype, device and
    contiguity and where it is routed.  None where a call's checks read its values (a
    given tensor scale or signs), under torch.compile, or for an x that is not a plain
    dense local tensor: those calls are checked in full each time.  (A key of unhashable
    choices fails its look-up: the caller checks those in full.)"""
    if type(x) is not Tensor or x.layout is not torch.strided:
        return None
    # unpacked at once (cheaper than an attribute each)
    (
        fmt, mode, axis, block, scale_rule, tensor_scale, flavour, rht, rht_signs, rht_bf16,
        rbits, variant, hardware, index_offset, backend,
    ) = choices  # fmt: skip
    if rht_signs is not None or torch.compiler.is_compiling():
        return None
    if tensor_scale is not None and tensor_scale is not False:
        return None
    inner = tuple(map(type, block)) if type(block) is tuple else None
    return (
        fmt, mode, axis, block, scale_rule, tensor_scale, flavour, rht, rht_bf16, rbits,
        variant, hardware, index_offset, backend, swizzle,
        type(fmt), type(axis), type(block), inner, type(scale_rule), type(rht),
        type(rht_bf16), type(rbits), type(hardware), type(index_offset), type(swizzle),
        x.shape, x.dtype, x.device, x.is_contiguous(), on_kernel_device(x),
    )  # fmt: skip


class PreparedQuantize:
    """The kernel's route of a planned eager call (`quantize_local`'s `_quantize_kernel`
    with the same bits), resolved once: the kernel's prepared launch
    (`stochround.kernels.blocks.PreparedQuantizeBlocks`, NVFP4's tensor scales first where
    they are computed from x's amax) and everything of the `BlockTensor` that the choices
    and x's shape fix.  A call takes x (checked by its plan's key) and the stream."""

    def __init__(
        self, x: Tensor, request: BlockRequest, args: BlockArguments, options: dict[str, Any]
    ) -> None:
        from ..kernels.blocks import PreparedQuantizeBlocks  # needs triton

        fmt = request.fmt
        signs = None if args.rht is None else default_signs(args.rht, x.device)
        element = OCP_INT8 if options["element"] == OCP_INT8.name else options["element"]
        self.kernel = PreparedQuantizeBlocks(
            x,
            element,
            options["block"],
            options["scale_rule"],
            tensor_scales=tensor_scale_choice(fmt, args.tensor_scale) == "amax",
            mode=options["mode"],
            n=options["n"],
            variant=options["variant"],
            index_offset=options["index_offset"],
            nvfp4_flavour=options["flavour"],
            output=options["output"],
            rht=args.rht,
            rht_signs=signs,
            rht_bf16=args.rht_bf16,
        )
        element_dtype = fmt.element.torch_dtype
        # the stored codes' dtype (`stored_codes`'), or None: uint8 as the kernel writes them
        self.codes_dtype: torch.dtype | None = None
        if fmt.element.name in ("e4m3fn", "e5m2") and element_dtype is not None:
            self.codes_dtype = element_dtype
        elif fmt.element.twos_complement and fmt.element.bits == 8:
            self.codes_dtype = torch.int8
        # the scales' dtype: a view of the kernel's codes, or (absmax) a conversion of its fp32
        self.scales_view = fmt.scale_rule in POWER_OF_TWO_RULES or fmt.scale_rule == "nvfp4"
        self.scales_dtype = (
            torch.float8_e8m0fnu
            if fmt.scale_rule in POWER_OF_TWO_RULES
            else torch.float8_e4m3fn
            if fmt.scale_rule == "nvfp4"
            else x.dtype
        )
        # the result's fields but its tensors, made once by the constructor (a default of
        # any field included); a call puts them and its tensors in a new instance's dict,
        # where the frozen dataclass's __init__ would set each field anew at a call's cost
        none = typing.cast(Tensor, None)
        template = BlockTensor(
            none, none, None, fmt, request.axis, x.shape, x.dtype, args.rht, signs, False,
            self.kernel.scales_shape,
        )  # fmt: skip
        self.fields = dict(vars(template))

    def __call__(self, x: Tensor, seed: int | Tensor, offset: int | Tensor) -> BlockTensor:
        """The `BlockTensor` of x (of the planned shape, dtype and device) with this stream."""
        codes, scales, tensor_scales = self.kernel(x, seed, offset)
        if self.codes_dtype is not None:
            codes = codes.view(self.codes_dtype)
        scales = (
            scales.view(self.scales_dtype) if self.scales_view else scales.to(self.scales_dtype)
        )
        result = object.__new__(BlockTensor)
        fields = result.__dict__
        fields.update(self.fields)
        fields["codes"], fields["scales"] = codes, scales
        fields["tensor_scale"] = None if tensor_scales is None else tensor_scales[0]  # S_dec
        return result


def prepared_quantize(
    x: Tensor, request: BlockRequest, args: BlockArguments, options: dict[str, Any]
) -> PreparedQuantize | None:
    """The `PreparedQuantize` of a call that the kernel computes (``options``: its launch's,
    `_launch_options`), or None where the call takes the general route: under
    torch.compile (its custom ops), for 2-D tiles (their amax launch first), a given
    tensor scale or given signs (values read a call), an empty x."""
    if torch.compiler.is_compiling() or args.rht_signs is not None or x.numel() == 0:
        return None
    if isinstance(request.fmt.block, tuple):
        return None
    if tensor_scale_choice(request.fmt, args.tensor_scale) not in ("amax", "none"):
        return None
    return PreparedQuantize(x, request, args, options)
