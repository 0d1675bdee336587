"""The Triton rounding kernels' host side, bit-identical to the PyTorch path
(`stochround.torch_path`): whether they serve a call (`rounding_refusal`) and `KernelPlan`,
which binds a call's choices to one of the kernels (`kernels.round_kernel`,
`kernels.stream_sr`) once; `kernel_plan` caches one plan per set of choices."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..formats import Format
from ..random import seed_tensor
from ..torch_path import checks_nan, nan_without_code, output_shape, refuse_capture
from .availability import current_device
from .common import INPUT_DTYPES, as_int64, kernel_supports
from .grid import cdiv, next_power_of_2
from .round_kernel import round_launch
from .row_tiles import TILE_ROWS
from .runtime import (
    SCRATCH,
    Launch,
    PartialLaunch,
    Varying,
    current_stream,
    persistent_programs,
)
from .stream_sr import CODES_LAYOUT, LIST_START, bf16_sr_launch, codes_launch

# where SR's random integers come from: the counter-based stream, explicit integers, or
# words hashed from each value and its index
SOURCES = ("stream", "rand", "data")


@functools.cache
def codes_supported(fmt: Format) -> bool:
    """Formats whose codes the kernels write: at most 8 bits, values normal in fp32."""
    return kernel_supports(fmt) and fmt.bits <= 8 and fmt.min_subnormal >= 2.0**-126


@functools.cache
def format_refusal(fmt: Format, output: str) -> str | None:
    """Why the kernels cannot round to ``fmt`` for ``output`` (None if they can)."""
    if not kernel_supports(fmt):
        return f"format {fmt.name} is wider than the kernels' fp32 arithmetic"
    if output != "value" and not codes_supported(fmt):
        return f"the kernels write codes of formats of at most 8 bits, not {fmt.name}"
    return None


def rounding_refusal(x_dtype: torch.dtype, fmt: Format, output: str) -> str | None:
    """Why the kernels cannot round x of this dtype to ``fmt`` for ``output`` (None if they
    can); where they can run at all is `kernels.availability.kernels_refusal`'s call."""
    if x_dtype not in INPUT_DTYPES:
        return f"the kernels read fp32/bf16/fp16 inputs, not {x_dtype}"
    return format_refusal(fmt, output)


# bytes of a row of four codes (the kernels store a row as one word, fp6 as three bytes)
ROW_BYTES = {"codes": 4, "fp4x2": 2, "fp6x4": 3}


def _empty(x: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An uninitialized tensor on x's device.  Sizes go as separate ints, which PyTorch
    parses faster than a shape tuple or a `torch.Size`, and `new_empty` takes x's device
    without building a `torch.device`: this runs on every call's host path."""
    return x.new_empty(*shape, dtype=dtype) if shape else x.new_empty((), dtype=dtype)


def _output_tensor(x: Tensor, output: str, out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(the result, the buffer the kernel writes): code outputs are written a row of four
    codes at a time, into a buffer padded to whole rows (the result itself when x holds
    whole rows)."""
    if output == "value":
        out = _empty(x, x.shape, out_dtype)
        return out, out
    count = x.numel()
    shape = output_shape(x.shape, output)
    if count % 4 == 0:
        out = _empty(x, shape, torch.uint8)
        return out, out
    row_bytes = ROW_BYTES[output]
    buffer = _empty(x, ((count + 3) // 4 * row_bytes,), torch.uint8)
    # the packings' last dimensions hold whole bytes: 8 bits a code, two, or four per three
    return buffer[: count * row_bytes // 4].view(shape), buffer


class KernelPlan:
    """How the Triton kernels round one set of request choices (`round`): the kernel path
    ("bf16", "codes" or "round", the general kernel), whether the call checks for NaN
    results, the rows of a tile, and the path's kernels bound to the choices (`Launch`es,
    made once per combination of the per-call constexprs FROM_TENSORS, ALIGNED and WIDE)."""

    def __init__(
        self,
        output: str,
        out_dtype: torch.dtype,
        nan: str,
        fmt: Format,
        mode: str,
        sat: str,
        n: int,
        variant: str,
        source: str,
    ) -> None:
        self.fmt, self.output, self.out_dtype, self.nan = fmt, output, out_dtype, nan
        self.mode, self.sat, self.n, self.variant, self.source = mode, sat, n, variant, source
        self.check_nan = checks_nan(fmt, nan, output)
        self.path = self._choose_path()
        self.rows = CODES_LAYOUT[0] if self.path == "codes" else TILE_ROWS
        # the kernels write codes as bytes; `cast` views them as its dtype
        self.view_dtype = None if output == "value" or out_dtype == torch.uint8 else out_dtype
        self.launches: dict[tuple, Launch] = {}
        # whether `in_place_rounding` may round x into itself: values by the general kernel,
        # unchecked (each program loads its tile before it stores the tile's results, and
        # no other program reads them; the codes path's exact kernel reads x again)
        self.in_place = output == "value" and self.path == "round" and not self.check_nan

    def round(
        self,
        x: Tensor,
        seed: int | Tensor,
        offset: int | Tensor,
        index_offset: int,
        rand: Tensor | None,
    ) -> Tensor:
        """Round x with these choices and a call's checked values (as `stochround.rounding`
        checks them): seed and offset of the stream, int or one-element int64 tensor; the
        flat position of x's first element; explicit integers for source "rand".

        The result: values in ``out_dtype`` (fp32, bf16 or fp16), or bytes viewed as it:
        "codes" (one a byte), "fp4x2" (two 4-bit codes per byte) or "fp6x4" (four 6-bit
        codes per three bytes), packing along the last dimension.  Work that needs no
        result of the launch (the view) is done while the kernel runs: a checked call's
        device idles through the host time before the launch and after the wait.  The
        kernels run on x's device (made current for the call where it is not) in that
        device's current stream.
        """
        device = x.get_device()  # -1 on the CPU (the interpreter)
        if device >= 0 and device != current_device():
            # Triton launches on the current device's current stream, PyTorch's ops on
            # their tensors' device: round x where it lies, in its device's stream order
            # (checked first, not a `torch.cuda.device` block around every call: x's
            # device is almost always current, and the block would cost host time)
            with torch.cuda.device(device):
                return self.round(x, seed, offset, index_offset, rand)
        check_nan = self.check_nan
        refuse_capture(check_nan, x, self.fmt)
        x = x.contiguous()
        out, buffer = _output_tensor(x, self.output, self.out_dtype)
        count = x.numel()
        if count == 0:
            return self._viewed(out)
        seed_pointer: Tensor | None
        offset_pointer: Tensor | None
        if isinstance(seed, Tensor) or isinstance(offset, Tensor):
            from_tensors = True
            seed_pointer = seed_tensor(seed, "seed", x.device)
            offset_pointer = seed_tensor(offset, "offset", x.device)
            seed_value = offset_value = 0
        else:  # two's complement above 2**63: the kernels read seeds as unsigned 64-bit
            from_tensors = False
            seed_value, offset_value = as_int64(seed), as_int64(offset)
            seed_pointer = offset_pointer = None  # no pointers: the kernels read the values
        stream = (seed_pointer, offset_pointer, seed_value, offset_value, count, index_offset)
        programs = cdiv(count, self.rows * 4)
        common = (from_tensors, index_offset % 4 == 0, _wide(count, index_offset, self.rows))
        if self.path == "bf16":
            self.launch(common)(device, programs, x, out, *stream)
            return out
        # in plain ints: arithmetic on a constexpr object goes through Triton's wrappers
        size = LIST_START.value + programs if self.path == "codes" else 1
        flag, note, note_view, key = SCRATCH.take(size, device, capturable=not check_nan)
        if self.path == "codes":
            self.launch(common)(
                device, programs, x, buffer, flag, note if check_nan else None, *stream
            )
            result = self._viewed(out)
            # the NaN check synchronizes anyway: it reads whether any tile was listed first,
            # and only listed tiles can hold NaN (no tile: no exact kernel, no flag read)
            if check_nan:
                # a checked call is never captured (`take` gave it a note)
                assert note_view is not None
                if device >= 0:
                    current_stream(key).synchronize()
                if note_view[0] == 0:
                    SCRATCH.give_back(flag, note, note_view, key)
                    return result
            iterations = next_power_of_2(cdiv(programs, persistent_programs(x.device)))
            self.launch(common, iterations)(
                device, cdiv(programs, iterations), x, buffer, flag, *stream
            )
        else:
            if rand is not None:
                rand = rand.to(device=x.device, dtype=torch.int64).expand(x.shape).contiguous()
            self.launch(common)(device, programs, x, buffer, flag, rand, *stream)
            result = self._viewed(out)
        if check_nan:
            if bool(flag[0].item()):  # waits for the kernels
                raise nan_without_code(self.fmt)
            if self.path == "codes":  # a tile was listed, and the note says so
                assert note_view is not None  # checked: never captured, so it has a note
                note_view[0] = 0
        # unchecked, the kernels clear what they wrote before the stream's next call
        SCRATCH.give_back(flag, note, note_view, key)
        return result

    def in_place_rounding(self, seed: int, draws: bool) -> InPlaceRounding:
        """This plan's rounding of x into itself with ``seed`` (`InPlaceRounding`), for a
        plan whose ``in_place`` is True; ``draws``: whether its calls read their offset
        (SR's; the other modes draw no words, and their calls pass offset 0)."""
        return InPlaceRounding(self, seed, draws)

    def _viewed(self, out: Tensor) -> Tensor:
        """The kernels' output as the result's dtype."""
        return out if self.view_dtype is None else out.view(self.view_dtype)

    def _choose_path(self) -> str:
        """ "bf16": fp32/fp16/bf16 -> bf16 SR (bf16 output) from the stream with n >= 16 bits
        (any variant) or variant a: from the fp32 bits exactly 16 bits are discarded, so
        adding and truncating is the contract.  "codes": SR from the stream to codes of a
        signed sign-magnitude format with zero (fp8, fp4, or binary16 for an fp16 result),
        variant a with any n or exact SR (variant c, n = 32).  "round": anything else."""
        fmt, output = self.fmt, self.output
        stream_sr = self.mode == "sr" and self.source == "stream"
        if (
            stream_sr
            and output == "value"
            and self.out_dtype == torch.bfloat16
            and fmt.name == "bfloat16"
            and (self.n >= 16 or self.variant == "a")
        ):
            return "bf16"
        fp16 = output == "value" and self.out_dtype == torch.float16 and fmt.name == "binary16"
        if (
            stream_sr
            and (output in ("codes", "fp4x2") or fp16)
            and (self.variant == "a" or (self.variant == "c" and self.n == 32))
            and fmt.signed
            and not fmt.twos_complement
            and fmt.has_zero
        ):
            return "codes"
        return "round"

    def launch(self, common: tuple[bool, bool, bool], iterations: int | None = None) -> Launch:
        """The path's kernel for the per-call constexprs (FROM_TENSORS, ALIGNED, WIDE); with
        ``iterations``, the codes path's `_exact_codes_kernel`, its grid walking the list of
        tiles that many times."""
        key = common if iterations is None else (*common, iterations)
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = self._bind(common, iterations)
        return launch

    def _bind(self, common: tuple[bool, bool, bool], iterations: int | None) -> Launch:
        stream = _stream_constants(common)
        if self.path == "bf16":
            return bf16_sr_launch(sat=self.sat, n=self.n, stream=stream)
        if self.path == "codes":
            return codes_launch(
                fmt=self.fmt,
                output=self.output,
                n=self.n,
                variant=self.variant,
                sat=self.sat,
                check_nan=self.check_nan,
                stream=stream,
                iterations=iterations,
            )
        return round_launch(
            fmt=self.fmt,
            output=self.output,
            out_dtype=self.out_dtype,
            mode=self.mode,
            sat=self.sat,
            n=self.n,
            variant=self.variant,
            source=self.source,
            check_nan=self.check_nan,
            stream=stream,
        )


class InPlaceRounding:
    """A `KernelPlan`'s rounding of x into itself with one int seed (made by
    `KernelPlan.in_place_rounding`): ``rounding(x, offset)`` overwrites x with the bits
    the plan's `KernelPlan.round` gives x for that seed and offset (an int in [0, 2**64)),
    index_offset 0 and no explicit integers, for a contiguous x of the plan's
    ``out_dtype`` that the caller owns (an op's fresh output in a dispatch mode, or the
    tensor the op just wrote), unchecked.  The same kernel as ``round``'s, given x as its
    output: no result tensor is made and no scratch taken (the unchecked kernel never
    writes its NaN flag, so it gets none).  What a call's host path can know before the
    call is bound here: the seed's 64-bit word, the tile, the first count that is WIDE,
    the kernel of each WIDE with every argument but x, the offset and the count fixed (a
    `PartialLaunch`: a call specializes those three alone)."""

    __slots__ = ("draws", "launches", "plan", "seed", "tile", "wide_from")

    def __init__(self, plan: KernelPlan, seed: int, draws: bool) -> None:
        self.plan, self.draws = plan, draws
        self.seed = as_int64(seed)
        self.tile = plan.rows * 4
        self.wide_from = _first_wide_count(0, plan.rows)  # `_wide(count, 0, rows)`
        # the kernel of each WIDE (FROM_TENSORS off, ALIGNED on), bound at its first call
        # with every argument fixed but x, the offset and the count
        self.launches: list[PartialLaunch | None] = [None, None]

    def __call__(self, x: Tensor, offset: int) -> None:
        device = x.get_device()  # -1 on the CPU (the interpreter)
        if device >= 0 and device != current_device():
            with torch.cuda.device(device):  # as `KernelPlan.round`: x's device, its stream
                self(x, offset)
                return
        count = x.numel()
        if not count:
            return
        wide = count >= self.wide_from
        launch = self.launches[wide]
        if launch is None:
            x_slot, offset_slot, count_slot = Varying(0), Varying(1), Varying(2)
            launch = self.launches[wide] = self.plan.launch((False, True, wide)).partial(
                (x_slot, x_slot, None, None, None, None, self.seed, offset_slot, count_slot, 0)
            )
        if not self.draws:
            offset = 0
        elif offset >= 2**63:  # (`as_int64`, called only where it changes the offset)
            offset = as_int64(offset)
        grid = -(-count // self.tile)  # (`cdiv`)
        launch(device, grid, x, offset, count)


# one plan per choices (`KernelPlan`'s arguments): a call looks its plan up once
kernel_plan = functools.cache(KernelPlan)


def _stream_constants(common: tuple[bool, bool, bool]) -> dict[str, bool]:
    """The per-call constexprs of every rounding kernel: (FROM_TENSORS, ALIGNED, WIDE)."""
    from_tensors, aligned, wide = common
    return {"FROM_TENSORS": from_tensors, "ALIGNED": aligned, "WIDE": wide}


def _wide(count: int, index_offset: int, rows: int) -> bool:
    """Whether a grid of ``rows x 4`` tiles over ``count`` values from ``index_offset``
    reaches positions beyond int32 (the last tile's masked lanes included)."""
    return count >= _first_wide_count(index_offset, rows)


def _first_wide_count(index_offset: int, rows: int) -> int:
    """The least count of values from ``index_offset`` whose grid of ``rows x 4`` tiles is
    `_wide`."""
    return 2**31 - index_offset - rows * 4


__all__ = [
    "CODES_LAYOUT",
    "LIST_START",
    "SOURCES",
    "InPlaceRounding",
    "KernelPlan",
    "codes_supported",
    "format_refusal",
    "kernel_plan",
    "rounding_refusal",
]
