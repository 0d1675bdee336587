"""Both GEMM orientations of a `QuantizedLinear` tensor from one read: x (or dy) ``(T, F)``
quantized row-wise for fprop (dgrad) and, transposed and padded to ``T'`` tokens (rotated
along the tokens where the wgrad GEMM shares the rotation), column-wise for wgrad, by
`stochround.kernels.two_orientation` — the same bits as `quantize_operand` of x and of
``pad_tokens(x^T)``, each drawing from its own role's stream.  Where the pair cannot be
served (`pair_refusal`: specs other than NVFP4's 1x16 blocks, CPU tensors, torch.compile),
the layer quantizes each orientation on its own.  Delayed tensor scales: each orientation
takes its own role's window scales and records its own current amax (the column-wise
one's after its rotation) in its role's row of the layer's history (`PreparedPair.__call__`);
where the host does not decide both windows alike (no host copy: a compiled op's device
route; or one window recorded and one empty) each role's scales are computed on the device
as the spec computes them and given to the launch (`device_pair_scales`)."""

from __future__ import annotations

import functools
import typing

import torch
from torch import Tensor

from ..blocks.formats import BlockFormat
from ..blocks.request import default_signs
from ..blocks.tensor import GemmOperand
from ..kernels.availability import use_kernel
from .amax_history import (
    AmaxHistory,
    KernelScale,
    device_decided_scales,
    launched_window_scales,
    record_kernel_amaxes,
)
from .graph_notes import kept_by_graphs
from .operands import Operand, one_element, seed_on

if typing.TYPE_CHECKING:  # the kernel module imports Triton
    from ..kernels.two_orientation import PreparedTwoOrientations

# what the pair quantizer reads
PAIR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# the column-wise roles whose pair's operands are read before the pair's next call (dy's:
# both GEMMs that read them run in the backward that makes them), so that the pair's
# tensor scales can be its own buffer (`PreparedTwoOrientations`'s ``transient``)
TRANSIENT_ROLES = frozenset({"wgrad_grad_output"})

# whether a layer's step takes the pair: on since it is faster than the separate path on
# the GPUs measured (benchmarks/RESULTS.md, nvfp4_two_orientation); the tests turn it off
# to check that the separate path gives the pair's bits
SERVES_STEPS = True


def pair_refusal(row: Operand, column: Operand, rotated: bool) -> str | None:
    """Why one launch cannot quantize a tensor for both roles (None if it can): each role
    NVFP4 (e2m1 elements in 1x16 blocks, the "nvfp4" scale rule, one word an element, no
    hardware preset), both with the same tensor scale (none, the current amax's, or
    delayed: each role's own window, `PreparedPair.__call__`), the row-wise role without an
    RHT, and the column-wise role's RHT (if any) kept in the rotated basis (``rotated``:
    the wgrad GEMM's other operand is rotated alike)."""
    for entry in (row, column):
        spec, fmt = entry.spec, entry.fmt
        if fmt is None or fmt.block != 16 or fmt.scale_rule != "nvfp4":
            return f"{entry.role} is not NVFP4 in 1x16 blocks"
        if fmt.element.name != "e2m1" or not fmt.kernel_element:
            return f"{entry.role}'s elements are not e2m1"
        if spec.hardware is not None or spec.noise != "element":
            return f"{entry.role} rounds by a hardware preset or with row noise"
    if row.spec.tensor_scale != column.spec.tensor_scale:
        return "the roles' tensor scales differ (none, amax, delayed)"
    if row.spec.rht is not None:
        return f"{row.role} is rotated"
    if column.spec.rht is not None and not rotated:
        return (
            f"{column.role}'s rotation is undone in fp32 (its GEMM's other operand is not rotated)"
        )
    return None


class PreparedPair:
    """Both operands of a tensor of one shape, dtype and device: the row-wise role's
    ``(T, F)`` and the column-wise role's ``(F, padded)``, with the kernel's checks and
    launches resolved once."""

    def __init__(
        self,
        row: Operand,
        column: Operand,
        shape: torch.Size,
        dtype: torch.dtype,
        device: torch.device,
        padded: int,
    ) -> None:
        from ..kernels.pair_records import orientation
        from ..kernels.two_orientation import PreparedTwoOrientations

        sides = []
        scales = 0 if row.spec.tensor_scale == "none" else 2
        # delayed: each orientation's current amax raised into its own record
        self.delayed = row.spec.tensor_scale == "delayed"
        for entry in (row, column):
            spec, fmt = entry.spec, typing.cast(BlockFormat, entry.fmt)
            sides.append(
                orientation(
                    fmt.element,
                    spec.mode,
                    spec.rbits or 32,
                    spec.variant,
                    scales,
                    self.delayed,
                    spec.nvfp4_flavour,
                )
            )
        self.roles = (row, column)
        rht = column.spec.rht
        self.signs = None if rht is None else default_signs(rht, device)
        self.kernel = PreparedTwoOrientations(
            torch.empty(shape, dtype=dtype, device=device),
            padded,
            sides[0],
            sides[1],
            rht=rht,
            rht_signs=self.signs,
            rht_bf16=column.spec.rht_bf16 if rht is not None else False,
            # dy's operands are read within the backward that makes them; x's column-wise
            # operand and scales are kept for the backward, after later forwards
            transient=column.role in TRANSIENT_ROLES,
        )
        self.device, self.padded = device, padded

    def __call__(
        self,
        x: Tensor,
        seed: int,
        row_offset: Tensor,
        column_offset: Tensor,
        signs: Tensor | None,
        history: AmaxHistory | None = None,
    ) -> tuple[GemmOperand, GemmOperand] | None:
        """Q(x) of the row-wise role and Q(pad_tokens(x^T)) of the column-wise one, each
        from its offset (0-d int64 tensors on x's device) under the layer's ``seed``;
        ``signs``: the rotation's per-step signs (None: the fixed ones).  Delayed roles:
        each role's window scales given and each orientation's current amax recorded in
        its own row of the ``history`` (`delayed_pair_scales`), or None where the pair
        does not serve them at this step (the caller quantizes each orientation on its
        own); other roles never give None."""
        given, by_launch = None, True
        rotation = self.signs if signs is None else signs
        if self.delayed:
            if history is None:  # the separate path raises, naming the role
                return None
            given = delayed_pair_scales(history, *self.roles)
            if given is None:  # the spec's scales, recorded by it
                given, by_launch = device_pair_scales(x, self.roles, self.kernel, rotation, history)
        key = seed_on(seed, self.device)
        offsets = (one_element(row_offset), one_element(column_offset))
        scales, record = given or (None, None)
        # (the device route's amaxes are recorded already: the launch records nothing)
        pair = self.kernel(x, key, *offsets, rotation, scales, record if by_launch else None)
        if given is not None and history is not None and by_launch:
            record_kernel_amaxes(history, tuple(entry.role for entry in self.roles), given.record)
        row_scale, column_scale = (None, None) if pair.decodes is None else pair.decodes
        return (
            GemmOperand(pair.row, row_scale, None, 1.0),
            GemmOperand(pair.column, column_scale, None, 1.0),
        )


def delayed_pair_scales(history: AmaxHistory, row: Operand, column: Operand) -> KernelScale | None:
    """What the pair's launch takes at the history's step for two delayed roles, as
    `stochround.nn.amax_history.kernel_scale` gives it for one: each role's window scales
    (`window_scales`, 4 fp32 in the kernel's order) where the host knows both windows
    recorded, None for the scales where it knows both empty (the kernel's amax launch:
    current scaling's route, as the first step's), and a zeroed record of 2 fp32.  None
    where the host does not decide both alike (`device_pair_scales` then): no host
    decisions (the history's ``windows`` None: the device's route), or one window
    recorded and the other
    empty (the roles recorded at different steps, as after a step that ran dgrad without
    wgrad: one launch takes given scales for both orientations or for neither)."""
    if history.windows is None:
        return None
    entries = (row, column)
    recorded = {entry.role in history.windows for entry in entries}
    if len(recorded) > 1:
        return None
    if not recorded.pop():
        return KernelScale(None, history.amaxes.new_zeros(2))
    windows = tuple((entry.role, entry.spec.amax_history) for entry in entries)
    out = launched_window_scales(history, windows)
    return KernelScale(out[:4], out[4:])


def device_pair_scales(
    x: Tensor,
    roles: tuple[Operand, Operand],
    kernel: PreparedTwoOrientations,
    signs: Tensor | None,
    history: AmaxHistory,
) -> tuple[KernelScale, bool]:
    """Both roles' tensor scales at the history's step as the spec computes them
    (`stochround.nn.amax_history.delayed_tensor_scale`: the window's on the device, or the
    current amax's), each current amax recorded, in one launch
    (`stochround.nn.amax_history.device_decided_scales`), given to the pair's launch (4
    fp32); and False: the pair's launch is to record nothing.  The
    current amaxes, of x and of ``pad_tokens(x^T)`` rotated by ``signs``, come from the
    pair's amax launch (`PreparedTwoOrientations.amaxes`: one read of x), the values the
    spec's own pass over each orientation gives (`delayed_operand_scale`; tested equal, a
    NaN amax as a NaN).  So the pair serves every step of a delayed layer, its operands
    laid out alike whatever the host knows (a compiled forward op declares x's wgrad
    operand's layout at trace time, `stochround.nn.opaque_matmul.kept_layouts`), the same
    bits as each orientation quantized on its own with these scales."""
    current = kernel.amaxes(x, signs)
    windows = tuple((entry.role, entry.spec.amax_history) for entry in roles)
    return KernelScale(*device_decided_scales(history, windows, current)), False


@kept_by_graphs
@functools.lru_cache(maxsize=256)
def prepared_pair(
    row: Operand,
    column: Operand,
    shape: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    padded: int,
) -> PreparedPair:
    """The `PreparedPair` of these roles for a tensor of this shape, dtype and device,
    made once per combination (a layer's shapes repeat at every step)."""
    return PreparedPair(row, column, shape, dtype, device, padded)


def served_pair(
    row: Operand,
    column: Operand,
    rotated: bool,
    shape: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    contiguous: bool,
    padded: int,
) -> PreparedPair | None:
    """The `PreparedPair` that serves a tensor of this shape (tokens, features), dtype and
    device, or None where the pair is not served: `pair_refusal`, a tensor the kernel does
    not read (not a contiguous float matrix), an empty one, or `SERVES_STEPS` off.  The
    one decision of the eager step's pair, per call (`both_orientations`) or once per
    signature (`stochround.nn.step_plan.pair_route`)."""
    if not SERVES_STEPS or len(shape) != 2 or shape.numel() == 0:
        return None
    refusal = pair_refusal(row, column, rotated)
    if refusal is None and (dtype not in PAIR_DTYPES or not contiguous):
        refusal = "x is not a contiguous float32, bfloat16 or float16 tensor"
    if not use_kernel("auto", "x", device.type == "cuda", refusal):
        return None
    return prepared_pair(row, column, shape, dtype, device, padded)


def both_orientations(
    x: Tensor,
    row: Operand,
    column: Operand,
    rotated: bool,
    padded: int,
    seed: int,
    row_offset: Tensor,
    column_offset: Tensor,
    signs: Tensor | None,
    history: AmaxHistory | None = None,
) -> tuple[GemmOperand, GemmOperand] | None:
    """The row-wise and column-wise `GemmOperand`s of a 2-D ``x`` (tokens first) from one
    read (`PreparedPair.__call__`, delayed roles reading and recording in ``history``), or
    None where the pair does not serve x (`served_pair`, or a delayed step it refuses):
    the caller then quantizes each orientation itself."""
    contiguous = x.is_contiguous()
    prepared = served_pair(row, column, rotated, x.shape, x.dtype, x.device, contiguous, padded)
    if prepared is None:
        return None
    return prepared(x, seed, row_offset, column_offset, signs, history)


__all__ = [
    "PAIR_DTYPES",
    "SERVES_STEPS",
    "TRANSIENT_ROLES",
    "PreparedPair",
    "both_orientations",
    "delayed_pair_scales",
    "device_pair_scales",
    "pair_refusal",
    "prepared_pair",
    "served_pair",
]
