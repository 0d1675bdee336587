"""A fused Triton block quantizer, bit-identical to the PyTorch path of `stochround.blocks`:
`quantize_blocks`, `fake_quantize_blocks` and `gemm_blocks` quantize the 1-D blocks of a
2-D tensor in one pass (`quantize_blocks_kernel` says how).  The amax and tensor-scale
kernels (`kernels.block_amax`) are re-exported here, where the blocks package calls them."""

from __future__ import annotations

import torch
from torch import Tensor

from ..block_constants import POWER_OF_TWO_RULES
from ..formats import Format
from ..random import seed_tensor
from .availability import current_device
from .block_amax import (
    AmaxTiling,
    PreparedTensorScale,
    PreparedTileAmax,
    nvfp4_tensor_scale,
    tensor_amax,
    tile_amax,
)
from .block_kernel import (
    BLOCK_OUTPUTS,
    QuantizeTiling,
    quantize_tiling,
)
from .block_launch import (
    BlockCall,
    block_grid,
    check_block_call,
    check_block_tensors,
    gemm_partial,
    launch_blocks,
    quantize_partial,
)
from .block_math import fast_bits
from .block_rotation import rht_normalization
from .common import as_int64
from .operand_bf16 import FlaggedRows, flag_bits
from .runtime import check_prepared
from .single_launch import (
    SINGLE_LAUNCH_COUNTERS,
    SingleLaunchGrid,
    single_launch_grid,
    takes_single_launch,
)
from .tensor_scales import stream_scratch

# `stand_in`'s tensors by dtype and device (a dict read by a plain function)
_STAND_INS: dict[tuple[torch.dtype, torch.device], Tensor] = {}


def stand_in(dtype: torch.dtype, device: torch.device) -> Tensor:
    """An empty tensor of ``dtype`` on ``device`` for the kernel's outputs a call does not
    write (the codes and scales of a dequantizing call, the values of a quantizing one):
    never read or written, so made once and shared, where a fresh one would cost an
    allocation a call."""
    empty = _STAND_INS.get((dtype, device))
    if empty is None:
        empty = _STAND_INS[dtype, device] = torch.empty(0, dtype=dtype, device=device)
    return empty


def _stream_arguments(
    seed: int | Tensor, offset: int | Tensor, device: torch.device
) -> tuple[bool, Tensor | int, Tensor | int]:
    """How a prepared launch takes a stream: whether from tensors (its launch's index),
    then the seed and offset as its partial launch takes them (`stream_template`): tensors
    on ``device``, or ints."""
    if isinstance(seed, Tensor) or isinstance(offset, Tensor):
        return True, seed_tensor(seed, "seed", device), seed_tensor(offset, "offset", device)
    # two's complement above 2**63: the kernel reads seeds as unsigned 64-bit
    return False, as_int64(seed), as_int64(offset)


def quantize_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    output: str = "codes",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Quantize the 1-D blocks of ``block`` consecutive elements along the last axis of a
    contiguous 2-D ``x`` (fp32, bf16 or fp16) in one pass (module docstring), as
    `stochround.blocks.reference`'s PyTorch path computes them, bit for bit.

    Arguments: ``element`` the element format (a `Format` or its name; its codes at most
    8 bits); ``block`` the block length, dividing x's last dimension (the row's length for
    row-wise scales); ``scale_rule`` one of `SCALE_RULES` (E8M0 scales for the
    power-of-two rules, E4M3 for "nvfp4", fp32 for "absmax");  ``tensor_scale`` NVFP4's
    fp32 tensor scales on x's device that the kernel reads (no host synchronization):
    one element (S_dec; S_enc = 1 / S_dec) or two (S_dec, S_enc: `nvfp4_tensor_scale`'s),
    or None (single-level); ``mode`` (`stochround.reference.MODES`),
    ``n`` (random bits, 32 for exact SR) and ``variant`` (a, b, c, odd) the core's rounding
    choices for the elements, which saturate to the element's finite range; ``seed`` and
    ``offset`` the stream (ints in [0, 2**64) or one-element int64 tensors); ``index_offset``
    the global row-major index of x's first element (SR draws the word of index
    ``index_offset + i`` for x's flat element i); ``nvfp4_flavour`` one of NVFP4_FLAVOURS;
    ``output`` "codes" (one code a byte) or "fp4x2" (two 4-bit codes a byte, low nibble
    first, along the last axis; ``block`` a multiple of 4); ``rht`` the size of a random
    Hadamard transform applied along the rows first (`stochround.blocks.hadamard`'s fp32
    arithmetic, the result rounded to x's dtype and with ``rht_bf16`` to bf16), one of
    `HADAMARD_SIZES`, with ``block`` a power of two and not the "absmax" rule; ``rht_signs``
    its fp32 ±1 signs on x's device; ``amax`` each block's amax (fp32, one a block, on
    x's device) to use instead of the block's own: 2-D tiles quantized as the 1-D blocks
    of their rows, each given its tile's amax (no ``rht``).

    Returns (codes, scales): codes uint8 [rows, cols] ([rows, cols / 2] for "fp4x2"),
    scales [rows, cols / block]: uint8 E8M0 or E4M3 codes, or for "absmax" fp32 values (of
    the scale held in x's dtype).
    """
    if output not in ("codes", "fp4x2"):
        raise ValueError(f"output must be 'codes' or 'fp4x2'; got {output!r}")
    fmt = check_block_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    if fmt.bits > 8:
        raise ValueError(f"element codes are at most 8 bits; {fmt.name} has {fmt.bits}")
    if output == "fp4x2" and (block % 4 or fmt.bits != 4):
        raise ValueError(
            f"fp4x2 packs 4-bit codes of blocks of a multiple of 4; got {fmt.name}, block {block}"
        )
    rows, cols = x.shape
    codes = x.new_empty(rows, cols // 2 if output == "fp4x2" else cols, dtype=torch.uint8)
    scale_dtype = torch.float32 if scale_rule == "absmax" else torch.uint8
    scales = x.new_empty(rows, cols // block, dtype=scale_dtype)
    call = BlockCall(
        fmt=fmt,
        block=block,
        scale_rule=scale_rule,
        output=output,
        tensor_scale=tensor_scale,
        mode=mode,
        n=n,
        variant=variant,
        flavour=nvfp4_flavour,
        seed=seed,
        offset=offset,
        index_offset=index_offset,
        rht=rht,
        rht_signs=rht_signs,
        rht_bf16=rht_bf16,
        amax=amax,
    )
    launch_blocks(x, codes, scales, stand_in(x.dtype, x.device), call)
    return codes, scales


def fake_quantize_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
) -> Tensor:
    """Quantize and dequantize in one pass: the values ``element * scale`` (times the
    tensor scale; times fp32(4/3) for "floor-3/4") in fp32, rounded to nearest-even into
    x's dtype, as `stochround.blocks.BlockTensor.dequantize` computes them from the
    PyTorch path's codes and scales; with ``rht``, rotated back (the inverse transform in
    fp32) before the rounding to x's dtype, as ``dequantize(unrotate=True)``.  Arguments
    as `quantize_blocks`'s; returns a tensor shaped like x, in x's dtype."""
    fmt = check_block_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    out = torch.empty_like(x)
    empty = stand_in(torch.uint8, x.device)
    call = BlockCall(
        fmt=fmt,
        block=block,
        scale_rule=scale_rule,
        output="dequantized",
        tensor_scale=tensor_scale,
        mode=mode,
        n=n,
        variant=variant,
        flavour=nvfp4_flavour,
        seed=seed,
        offset=offset,
        index_offset=index_offset,
        rht=rht,
        rht_signs=rht_signs,
        rht_bf16=rht_bf16,
        amax=amax,
    )
    launch_blocks(x, empty, empty, out, call)
    return out


def gemm_blocks(
    x: Tensor,
    element: Format | str,
    block: int,
    scale_rule: str,
    *,
    out_dtype: torch.dtype,
    tensor_scale: Tensor | None = None,
    mode: str = "rne",
    n: int = 32,
    variant: str = "c",
    seed: int | Tensor = 0,
    offset: int | Tensor = 0,
    index_offset: int = 0,
    nvfp4_flavour: str = "te",
    rht: int | None = None,
    rht_signs: Tensor | None = None,
    rht_bf16: bool = False,
    amax: Tensor | None = None,
    tiling: QuantizeTiling | None = None,
    record: Tensor | None = None,
) -> Tensor:
    """Quantize in one pass and store what a block-scaled GEMM multiplies: each element
    times its block's scale, ``element * scale`` in fp32 (the E4M3 or E8M0 value, without
    NVFP4's tensor scale or floor-3/4's 4/3, which scale the GEMM's result), in the
    rotated basis where ``rht`` is given, stored in ``out_dtype`` (torch.bfloat16, which
    the caller asks for only where every such product is a bf16 value, or torch.float32).
    Arguments as `quantize_blocks`'s, ``tiling`` the launch's (None: `quantize_tiling`'s)
    and ``record`` one fp32 on x's device (zeroed) that the launch raises by an atomic max
    to the amax "amax" takes (after the RHT: `block_kernel.raise_record`), a delayed
    tensor scale's current amax as a by-product; returns a tensor shaped like x."""
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32; got {out_dtype}")
    fmt = check_block_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
    out = torch.empty_like(x, dtype=out_dtype)
    empty = stand_in(torch.uint8, x.device)
    call = BlockCall(
        fmt=fmt,
        block=block,
        scale_rule=scale_rule,
        output="gemm",
        tensor_scale=tensor_scale,
        mode=mode,
        n=n,
        variant=variant,
        flavour=nvfp4_flavour,
        seed=seed,
        offset=offset,
        index_offset=index_offset,
        rht=rht,
        rht_signs=rht_signs,
        rht_bf16=rht_bf16,
        amax=amax,
        tiling=tiling,
        record=record,
    )
    launch_blocks(x, empty, empty, out, call)
    return out


class PreparedGemmBlocks:
    """`gemm_blocks` for one shape, dtype and device and one set of choices, checked and
    resolved once (the kernel's constexprs, its bound launch and its grid), so that a
    call costs the launch alone: a training layer quantizes the same operand shapes at
    every step.  The stream comes as one-element int64 tensors on x's device; the tensor
    scales (one or two elements, or None), the rotation's signs and the tiles' amax as
    `gemm_blocks` takes them, of the kinds given here (``tensor_scales``: their count,
    ``amax_given``), and with ``record`` the one fp32 each call raises to the amax
    (`gemm_blocks`' ``record``); ``tiling`` the launch's (None: `quantize_tiling`'s).
    ``exact_bf16`` (power-of-two scales, bf16 ``out_dtype``): `launch_exact` gives the operand as
    `stochround.kernels.operand_bf16.exact_bf16_rows` gives it from the fp32 one."""

    def __init__(
        self,
        x: Tensor,
        element: Format | str,
        block: int,
        scale_rule: str,
        *,
        out_dtype: torch.dtype,
        tensor_scales: int,
        amax_given: bool,
        rht_signs: Tensor | None,
        mode: str = "rne",
        n: int = 32,
        variant: str = "c",
        index_offset: int = 0,
        nvfp4_flavour: str = "te",
        rht: int | None = None,
        rht_bf16: bool = False,
        tiling: QuantizeTiling | None = None,
        exact_bf16: bool = False,
        record: bool = False,
    ) -> None:
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32; got {out_dtype}")
        if x.numel() == 0:
            raise ValueError("x must hold elements")
        fmt = check_block_call(x, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
        if exact_bf16 and (out_dtype != torch.bfloat16 or scale_rule not in POWER_OF_TWO_RULES):
            raise ValueError(
                "exact_bf16 takes out_dtype torch.bfloat16 and a power-of-two scale rule; got "
                f"{out_dtype}, {scale_rule!r}"
            )
        self.rows = FlaggedRows(x.shape[0], x.shape[1], block, fmt.mbits) if exact_bf16 else None
        scale = None if tensor_scales == 0 else x.new_empty(tensor_scales, dtype=torch.float32)
        amax = x.new_empty(x.numel() // block, dtype=torch.float32) if amax_given else None
        call = BlockCall(
            fmt=fmt,
            block=block,
            scale_rule=scale_rule,
            output="gemm",
            tensor_scale=scale,
            mode=mode,
            n=n,
            variant=variant,
            flavour=nvfp4_flavour,
            seed=0,
            offset=0,
            index_offset=index_offset,
            rht=rht,
            rht_signs=rht_signs,
            rht_bf16=rht_bf16,
            amax=amax,
            tiling=tiling,
            flag_below=flag_bits(fmt.mbits) if exact_bf16 else 0,
            record=x.new_empty(1, dtype=torch.float32) if record else None,
        )
        check_block_tensors(x, call)
        self.record = record
        self.grid = grid = block_grid(x, out_dtype, call, from_tensors=True)
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.out_dtype, self.index_offset = out_dtype, index_offset
        self.device_index = x.device.index if x.is_cuda else -1
        self.empty = x.new_empty(0, dtype=torch.uint8)
        self.partial = gemm_partial(grid, self.empty, index_offset)

    def check(self, x: Tensor) -> None:
        """ValueError unless x is a contiguous tensor of the prepared shape, dtype and
        device (`check_prepared`)."""
        check_prepared(x, "x", self.shape, self.dtype, self.device)

    def __call__(
        self,
        x: Tensor,
        tensor_scale: Tensor | None,
        rht_signs: Tensor | None,
        amax: Tensor | None,
        seed: Tensor,
        offset: Tensor,
        record: Tensor | None = None,
    ) -> Tensor:
        """The operand of x (of the prepared shape, dtype and device, contiguous), as
        `gemm_blocks` computes it with these arguments (``record``: where prepared so)."""
        self.check(x)
        if self.device_index >= 0 and current_device() != self.device_index:
            with torch.cuda.device(self.device):
                return self.launch(x, tensor_scale, rht_signs, amax, seed, offset, None, record)
        return self.launch(x, tensor_scale, rht_signs, amax, seed, offset, None, record)

    def launch(
        self,
        x: Tensor,
        tensor_scale: Tensor | None,
        rht_signs: Tensor | None,
        amax: Tensor | None,
        seed: Tensor,
        offset: Tensor,
        flags: Tensor | None = None,
        record: Tensor | None = None,
    ) -> Tensor:
        """`__call__` for a caller that has checked x (`check`) and made its device
        current: the launch alone (``flags``: where an ``exact_bf16`` launch stores each
        block's flag, `launch_exact`'s; ``record``: `__call__`'s)."""
        if (record is not None) != self.record:
            raise ValueError("record is given exactly where the launch was prepared with one")
        out = torch.empty_like(x, dtype=self.out_dtype)
        grid = self.grid
        self.partial(
            self.device_index,
            grid.programs,
            x,
            self.empty if flags is None else flags,
            out,
            tensor_scale,
            rht_signs if rht_signs is not None else grid.signs,
            amax,
            record,
            seed,
            offset,
        )
        return out

    def launch_exact(
        self,
        x: Tensor,
        tensor_scale: Tensor | None,
        rht_signs: Tensor | None,
        amax: Tensor | None,
        seed: Tensor,
        offset: Tensor,
        record: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """With ``exact_bf16``, for a caller as `launch`'s: (bf16 ``v * 2**s``, fp32 ``2**-s``
        (M, 1)) as `exact_bf16_rows` gives them for `launch`'s fp32 operand v: the
        quantization (bf16 values, each block's flag), then `FlaggedRows`' pass."""
        if self.rows is None:
            raise ValueError("launch_exact needs a PreparedGemmBlocks made with exact_bf16=True")
        flags = x.new_empty(self.rows.flags_shape, dtype=torch.uint8)
        values = self.launch(x, tensor_scale, rht_signs, amax, seed, offset, flags, record)
        return self.rows(values, flags)


class PreparedQuantizeBlocks:
    """`quantize_blocks` for one shape, dtype and device and one set of choices, checked and
    resolved once (the kernel's constexprs, its bound launches for a stream of ints and one
    of tensors, its grid, the outputs' shapes and dtypes), NVFP4's tensor scales computed
    first where ``tensor_scales`` is True (`nvfp4_tensor_scale`'s launch, bound once): a
    call then costs its allocations and launches alone, with the bits of
    `nvfp4_tensor_scale` and `quantize_blocks`.  x is any contiguous tensor of blocks along
    its last axis (the kernel reads it as its [rows, last axis] matrix); the codes and
    scales come in x's leading shape.  It keeps no tensor of its own on x's device: each
    call allocates its outputs (the tensor scales among them), and the tensor scales'
    launch takes its stream's counter, partial maxima and amax (`stream_scratch`: kept
    clean by the launches, fresh under CUDA-graph capture), so that its calls may run on
    any stream and inside CUDA graphs.

    With computed tensor scales, ``single_launch`` (None: `takes_single_launch`, by x's
    size) computes them and quantizes in one launch (`kernels.single_launch`: the same
    bits), else in two; ``amax_tiling`` the amax programs' work (None: the route's
    default), which changes no bit."""

    def __init__(
        self,
        x: Tensor,
        element: Format | str,
        block: int,
        scale_rule: str,
        *,
        tensor_scales: bool,
        mode: str = "rne",
        n: int = 32,
        variant: str = "c",
        index_offset: int = 0,
        nvfp4_flavour: str = "te",
        output: str = "codes",
        rht: int | None = None,
        rht_signs: Tensor | None = None,
        rht_bf16: bool = False,
        single_launch: bool | None = None,
        amax_tiling: AmaxTiling | None = None,
    ) -> None:
        if output not in ("codes", "fp4x2"):
            raise ValueError(f"output must be 'codes' or 'fp4x2'; got {output!r}")
        if x.dim() == 0 or x.numel() == 0:
            raise ValueError("x must hold elements")
        matrix = x.reshape(-1, x.shape[-1])  # once: the launches take x itself
        fmt = check_block_call(matrix, element, block, scale_rule, mode, n, variant, nvfp4_flavour)
        if fmt.bits > 8 or (output == "fp4x2" and (block % 4 or fmt.bits != 4)):
            raise ValueError(f"output {output!r} cannot hold {fmt.name} codes of blocks of {block}")
        # the tensor scales' launch, bound on a meta tensor of x's size: nothing allocated
        meta = torch.empty(x.shape, dtype=x.dtype, device="meta")
        signs = None if rht_signs is None else torch.empty(rht_signs.shape, device="meta")
        scale = None
        if single_launch is None:
            single_launch = takes_single_launch(x)
        if tensor_scales and not single_launch:
            scale = PreparedTensorScale(
                meta, nvfp4_flavour, rht=rht, rht_signs=signs, rht_bf16=rht_bf16, tiling=amax_tiling
            )
        call = BlockCall(
            fmt=fmt,
            block=block,
            scale_rule=scale_rule,
            output=output,
            tensor_scale=torch.empty(2, device="meta") if tensor_scales else None,
            mode=mode,
            n=n,
            variant=variant,
            flavour=nvfp4_flavour,
            seed=0,
            offset=0,
            index_offset=index_offset,
            rht=rht,
            rht_signs=rht_signs,
            rht_bf16=rht_bf16,
            amax=None,
        )
        # by whether the stream comes as ints (False) or tensors (True)
        self.grids = (
            block_grid(matrix, torch.uint8, call, False),
            block_grid(matrix, torch.uint8, call, True),
        )
        self.signs = self.grids[0].signs
        # the tensor scales' launch and its programs, where they take a launch of their own
        self.amax = None if scale is None else (scale.partial_launch(self.signs), scale.programs)
        self.single: tuple[SingleLaunchGrid, SingleLaunchGrid] | None = None
        if tensor_scales and single_launch:
            self.single = (
                single_launch_grid(matrix, call, False, amax_tiling),
                single_launch_grid(matrix, call, True, amax_tiling),
            )
        self.count = x.numel()
        cols = x.shape[-1]
        lead = tuple(x.shape[:-1])
        self.codes_shape = (*lead, cols // 2 if output == "fp4x2" else cols)
        self.scales_shape = (*lead, cols // block)
        self.scale_dtype = torch.float32 if scale_rule == "absmax" else torch.uint8
        self.device, self.index_offset = x.device, index_offset
        self.device_index = x.device.index if x.is_cuda else -1
        self.values = stand_in(
            x.dtype, x.device
        )  # the values, which a quantizing call does not write
        # the partial launches of `grids`, by whether the stream comes as tensors
        self.launches = tuple(
            quantize_partial(grid, self.values, index_offset, from_tensors)
            for from_tensors, grid in zip((False, True), self.grids, strict=True)
        )

    def __call__(
        self, x: Tensor, seed: int | Tensor, offset: int | Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(codes, scales, the tensor scales S_dec and S_enc or None) of x, as
        `quantize_blocks` (after `nvfp4_tensor_scale`) gives them for this stream (ints in
        [0, 2**64), checked, or one-element int64 tensors).  x must be of the prepared
        shape, dtype and device, contiguous: the caller has checked it (an O(1) look-up
        of its plan), which this call does not repeat."""
        device = self.device_index
        if device >= 0 and current_device() != device:
            with torch.cuda.device(device):  # Triton launches on the current device
                return self(x, seed, offset)
        if self.single is not None:
            return self.launch_single(x, seed, offset)
        new_empty = x.new_empty
        scales2 = None  # S_dec and S_enc
        if self.amax is not None:
            launch, programs = self.amax
            partial, counter, amax = stream_scratch(self.device, device, programs)
            scales2 = new_empty(2, dtype=torch.float32)
            launch(device, programs, x, partial, counter, amax, scales2)
        codes = new_empty(self.codes_shape, dtype=torch.uint8)
        scales = new_empty(self.scales_shape, dtype=self.scale_dtype)
        from_tensors, seed, offset = _stream_arguments(seed, offset, self.device)
        programs = self.grids[from_tensors].programs
        self.launches[from_tensors](device, programs, x, codes, scales, scales2, seed, offset)
        return codes, scales, scales2

    def launch_single(
        self, x: Tensor, seed: int | Tensor, offset: int | Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`__call__`'s single launch (its device current): the tensor scales and the
        quantization in one launch, on its stream's scratch."""
        assert self.single is not None
        new_empty = x.new_empty
        scales2 = new_empty(2, dtype=torch.float32)  # S_dec and S_enc
        codes = new_empty(self.codes_shape, dtype=torch.uint8)
        scales = new_empty(self.scales_shape, dtype=self.scale_dtype)
        from_tensors, seed, offset = _stream_arguments(seed, offset, self.device)
        grid = self.single[from_tensors]
        partial, counters, amax = stream_scratch(
            self.device, self.device_index, grid.amax_programs, SINGLE_LAUNCH_COUNTERS
        )
        grid.partial(
            self.device_index, grid.programs, x, codes, scales, scales2, seed, offset, partial,
            counters, amax,
        )  # fmt: skip
        return codes, scales, scales2


__all__ = [
    "BLOCK_OUTPUTS",
    "PreparedGemmBlocks",
    "PreparedQuantizeBlocks",
    "PreparedTensorScale",
    "PreparedTileAmax",
    "QuantizeTiling",
    "fake_quantize_blocks",
    "fast_bits",
    "gemm_blocks",
    "nvfp4_tensor_scale",
    "quantize_blocks",
    "quantize_tiling",
    "rht_normalization",
    "stand_in",
    "tensor_amax",
    "tile_amax",
]
