"""A GEMM operand's kernel launches prepared once (`PreparedGemmOperand`): a training layer's
operand of one shape, dtype, device and set of choices, checked and resolved at its first
call, so that each later call issues the launches alone.  The manual: docs/guide/blocks.md."""

from __future__ import annotations

import typing

import torch
from torch import Tensor

from ..block_constants import FOLDED_FLAVOURS
from ..kernels.availability import use_kernel
from .dispatch import block_kernel_refusal
from .formats import OCP_INT8
from .request import (
    BlockArguments,
    check_call,
    check_extras,
    default_signs,
    tensor_scale_choice,
)
from .tensor import GemmOperand, gemm_factor

__all__ = ["Decide", "PreparedGemmOperand"]

# what decides a call's tensor scales from x's current amax (one fp32 on the device): the
# scales (S_dec, S_enc) and the fp32 the quantize launch raises to the amax
Decide = typing.Callable[[Tensor], tuple[Tensor, Tensor]]


class PreparedGemmOperand:
    """`kernel_gemm_operand` for one shape, dtype and device and one set of choices (a
    training layer's operand), checked and resolved once: a call then issues the launches
    alone (the tensor scales, 2-D tiles' amax and the quantization) with the same bits.
    The stream is given per call as int64 tensors on x's device; the rotation's signs per
    call or, for None, the fixed ones of `default_signs`; ``exact_bf16``: `exact_bf16_operand`'s;
    ``record``: a call's ``record`` raised to x's amax, its tensor scales given or computed."""

    def __init__(
        self, x: Tensor, args: BlockArguments, exact_bf16: bool = False, record: bool = False
    ) -> None:
        # needs triton
        from ..kernels.blocks import PreparedGemmBlocks, PreparedTensorScale, PreparedTileAmax

        x_checked, request = check_call(x, args)
        if x_checked.dim() != 2 or request.fmt.block is None or args.stream is not None:
            raise ValueError(
                "a prepared operand takes a 2-D x of blocks with their own scales and a "
                "seed (not a stream)"
            )
        refusal = block_kernel_refusal(x_checked, request, args.rht, False)
        if refusal is not None or not use_kernel(args.backend, "x", x.is_cuda, refusal):
            raise ValueError(f"a prepared operand runs on the kernel, which refuses: {refusal}")
        check_extras(x_checked, request, args)
        self.choice = tensor_scale_choice(request.fmt, args.tensor_scale)
        # "pow2": the values hold a tensor scale computed by the call (none given, no record)
        self.folded = request.flavour in FOLDED_FLAVOURS
        refused = record and (self.choice != "amax" or self.folded)
        if self.choice not in ("amax", "none") or refused:
            raise ValueError("a prepared operand computes its tensor scale (or records) or none")
        fmt = request.fmt
        self.signs = None if args.rht is None else default_signs(args.rht, x.device)
        self.scale: PreparedTensorScale | None = None
        self.tiles: PreparedTileAmax | None = None  # 2-D tiles' amaxes (and tensor scales)
        self.tile = fmt.block if isinstance(fmt.block, tuple) else None
        if self.tile is not None:
            flavour = request.flavour if self.choice == "amax" else None
            self.tiles = PreparedTileAmax(x_checked, self.tile, flavour)
        elif self.choice == "amax":
            self.scale = PreparedTensorScale(
                x_checked, request.flavour, rht=args.rht, rht_signs=self.signs,
                rht_bf16=args.rht_bf16,
            )  # fmt: skip
        self.factor = gemm_factor(fmt)
        block = fmt.block[1] if isinstance(fmt.block, tuple) else fmt.block
        element = OCP_INT8 if fmt.element == OCP_INT8 else fmt.element.name
        self.kernel = PreparedGemmBlocks(
            x_checked,
            element,
            typing.cast(int, block),
            fmt.scale_rule,
            out_dtype=torch.bfloat16 if exact_bf16 else fmt.gemm_dtype,
            exact_bf16=exact_bf16,
            tensor_scales=2 if self.choice == "amax" else 0,
            amax_given=self.tile is not None,
            rht_signs=self.signs,
            mode=request.mode,
            n=request.n,
            variant=request.variant,
            index_offset=request.index_offset,
            nvfp4_flavour=request.flavour,
            rht=args.rht,
            rht_bf16=args.rht_bf16,
            record=record,
        )

    def __call__(
        self, x: Tensor, seed: Tensor, offset: Tensor, rht_signs: Tensor | None = None,
        scales: Tensor | None = None, record: Tensor | None = None,
        decide: Decide | None = None,
    ) -> GemmOperand:  # fmt: skip
        """The `GemmOperand` of x, as `kernel_gemm_operand` gives it for the prepared
        choices with this stream (one-element int64 tensors), these signs and these tensor
        scales (S_dec, S_enc; None: computed; none under the "pow2" flavour, whose values
        hold the scale: ValueError), ``record`` (one fp32) raised to x's amax.
        ``decide`` (no ``scales`` then): the scales and the record taken from x's current
        amax (one fp32 on the device, of the values the scales are computed from), which
        the tensor-scale or the tiles' launch gives: a delayed scale decided on the device
        without a pass of its own."""
        if scales is not None and self.folded:
            raise ValueError("a 'pow2' operand computes its tensor scales; none can be given")
        if decide is not None and (scales is not None or self.choice != "amax" or self.folded):
            raise ValueError("decide takes an operand whose scales are computed, none given")
        self.kernel.check(x)  # before any launch reads x
        if x.is_cuda and x.device.index != torch.cuda.current_device():
            with torch.cuda.device(x.device):  # Triton launches on the current device
                return self(x, seed, offset, rht_signs, scales, record, decide)
        signs = self.signs if rht_signs is None else rht_signs
        amax, computed = (None, None) if self.tiles is None else self.tiles(x)
        if scales is None:  # computed: by the tiles' launch, or the tensor-scale pass
            scales = computed if self.scale is None else self.scale(x, signs)
        if decide is not None:
            current = self.scale.amax if self.tiles is None else self.tiles.sink  # type: ignore[union-attr]
            scales, record = decide(current.reshape(1))
        kernel, stream = self.kernel, (seed, offset)
        if kernel.rows is None:  # x checked above
            values, unshift = kernel.launch(x, scales, signs, amax, *stream, None, record), None
        else:  # exact_bf16: the row scales 2**-s
            values, unshift = kernel.launch_exact(x, scales, signs, amax, *stream, record)
        decode = None if scales is None or self.folded else scales[0]
        return GemmOperand(values, decode, unshift, self.factor)
