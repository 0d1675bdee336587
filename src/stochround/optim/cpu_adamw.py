"""AdamW's update of one CPU parameter in two compiled loops, bit-identical to the PyTorch
path of `stochround.optim.AdamW` (`stochround.optim.updates.adamw_update`, then each
bfloat16 store rounded stochastically from its own stream).

The first loop (`stochround.cpu_path.sr_noise`, vectorized) draws the 16-bit SR noise of
every bfloat16 store, one Philox block per four elements and store; the second
(`adamw_groups`) reads the parameter, its gradient and states four elements a row, runs
the float32 update (the same function the PyTorch path runs, traced), adds each store's
noise to its result's fp32 pattern, truncates to bfloat16 (`stochround.cpu_path.bf16_sr_bits`)
and writes the parameter and states in place.  The second loop is left scalar: it moves
values between float and integer types, which inductor vectorizes one element at a time.

Elements past the last whole block of four (at most three) are updated by the same
functions run eagerly, and tensors of fewer than two blocks entirely so: a compiled loop
of one block would be compiled again for that size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cpu_path import (
    LANES,
    MASK32,
    bf16_sr_bits,
    compile_refusal,
    compiled,
    lane_noise,
    normal_mode,
    sr_noise,
)
from .updates import adamw_update

__all__ = ["GRAD_DTYPES", "TARGET_DTYPES", "adamw_groups", "adamw_step_cpu", "cpu_step_refusal"]

# what the loops read and write: parameters and states in bfloat16 (rounded
# stochastically) or float32 (stored as computed); gradients in any float type
TARGET_DTYPES = (torch.bfloat16, torch.float32)
GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NO_SATURATION = 0  # `bf16_sr_bits`' limit for the optimizers' stores (sat="none")


def _rounded(values: Tensor, noise: Tensor, lane: int) -> Tensor:
    """float32 ``values`` rounded stochastically to bfloat16 by lane ``lane`` of the packed
    ``noise`` (one int64 a block)."""
    bits = values.view(torch.int32).to(torch.int64) & MASK32
    rounded = bf16_sr_bits(bits, lane_noise(noise, lane), NO_SATURATION)
    return rounded.to(torch.int16).view(torch.bfloat16)


def adamw_groups(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    param_noise: Tensor | None,
    exp_avg_noise: Tensor | None,
    exp_avg_sq_noise: Tensor | None,
    coupled: bool,
    maximize: bool,
) -> None:
    """The second loop: one AdamW update of blocks of four, in place.

    ``param``, ``grad``, ``exp_avg``, ``exp_avg_sq``: ``(blocks, 4)`` views; the float32
    values of each go through ``adamw_update`` with the `adamw_scalars` row ``scalars``
    (``grad`` negated under ``maximize``; ``coupled``: Adam's L2 decay), and each new
    value is stored as computed into a float32 tensor, or into a bfloat16 one rounded by
    its store's packed noise (`stochround.cpu_path.sr_noise`, one word a block):
    ``param_noise``, ``exp_avg_noise``, ``exp_avg_sq_noise``, None for a float32
    tensor."""
    targets = (param, exp_avg, exp_avg_sq)
    results: list[list[Tensor]] = [[], [], []]
    for lane in range(LANES):
        gradient = grad[:, lane].float()
        if maximize:
            gradient = -gradient
        new = adamw_update(
            param[:, lane].float(),
            gradient,
            exp_avg[:, lane].float(),
            exp_avg_sq[:, lane].float(),
            scalars,
            coupled=coupled,
        )
        for values, result in zip(results, new, strict=True):
            values.append(result)
    noises = (param_noise, exp_avg_noise, exp_avg_sq_noise)
    for target, values, noise in zip(targets, results, noises, strict=True):
        if noise is not None:
            values = [_rounded(v, noise, lane) for lane, v in enumerate(values)]
        target.copy_(torch.stack(values, dim=1))


def cpu_step_refusal(
    param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor
) -> str | None:
    """Why `adamw_step_cpu` cannot update these tensors (None if it can): the compiled CPU
    path unavailable (`stochround.cpu_path.compile_refusal`), a tensor off the CPU, not a
    plain contiguous tensor (a DTensor, a view with strides), another shape, or a dtype
    outside `TARGET_DTYPES` (parameter, states) and `GRAD_DTYPES` (gradient)."""
    reason = compile_refusal()
    if reason is not None:
        return reason
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    for name, tensor in tensors.items():
        if tensor.device.type != "cpu":
            return f"{name} is not on the CPU"
        if type(tensor.detach()) is not Tensor or not tensor.is_contiguous():
            return f"{name} is not a plain contiguous tensor"
        if tensor.shape != param.shape:
            return f"{name} is not shaped like the parameter"
        allowed = GRAD_DTYPES if name == "grad" else TARGET_DTYPES
        if tensor.dtype not in allowed:
            return f"{name} is {tensor.dtype}, not one of {allowed}"
    return None


@normal_mode
def adamw_step_cpu(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    seed: int,
    offsets: tuple[int | Tensor, int | Tensor, int | Tensor],
    *,
    coupled: bool,
    maximize: bool,
    eager: bool = False,
) -> None:
    """One AdamW step of a CPU parameter, in place: the bits of `stochround.optim.AdamW`'s
    PyTorch path with ``rounding="sr"`` and no extra parameter state.

    ``param``, ``exp_avg``, ``exp_avg_sq``: bfloat16 or float32, ``grad``: float32,
    bfloat16 or float16, all contiguous CPU tensors of one shape (`cpu_step_refusal` says whether
    they are); ``scalars``: the parameter's `adamw_scalars` row; ``seed`` and ``offsets``:
    the streams of the parameter's and the states' stores (ints or 0-d int64 tensors, as
    `stochround.optim.streams.state_stream_offset` gives them), read for the bfloat16 ones only;
    ``coupled``: Adam's L2 decay (``grad + wd x``); ``maximize``: ascend; ``eager``: run the
    same functions uncompiled (by default the compiled loops run; the first call in a
    process builds them)."""
    flats = [t.detach().view(-1) for t in (param, grad, exp_avg, exp_avg_sq)]
    count = flats[0].numel()
    whole = count // LANES  # blocks of four the compiled loop updates
    # a compiled loop of one block would compile again for that size: tiny tensors run eagerly
    eager = eager or whole < 2
    noise = _store_noise((param, exp_avg, exp_avg_sq), seed, offsets, -(-count // LANES), eager)
    if whole:
        p, g, m, v = (flat[: whole * LANES].view(whole, LANES) for flat in flats)
        heads = _blocks_of(noise, slice(None, whole))
        loop = adamw_groups if eager else compiled(adamw_groups, scalar=True)
        loop(p, g, m, v, scalars, *heads, coupled, maximize)
    if count > whole * LANES:  # the last, partial block: its lanes padded with zeros
        p, g, m, v = (_padded(flat[whole * LANES :]) for flat in flats)
        adamw_groups(p, g, m, v, scalars, *_blocks_of(noise, slice(whole, None)), coupled, maximize)
        for flat, padded in zip((flats[0], flats[2], flats[3]), (p, m, v), strict=True):
            flat[whole * LANES :] = padded.view(-1)[: count - whole * LANES]


Noise = tuple[Tensor | None, Tensor | None, Tensor | None]


def _store_noise(
    targets: tuple[Tensor, Tensor, Tensor],
    seed: int,
    offsets: tuple[int | Tensor, int | Tensor, int | Tensor],
    blocks: int,
    eager: bool,
) -> Noise:
    """The packed noise (`sr_noise`, one kernel for all) of each bfloat16 target's store,
    None for float32 ones."""
    rounded = [target.dtype == torch.bfloat16 for target in targets]
    streams = [(seed, offset) for offset, sr in zip(offsets, rounded, strict=True) if sr]
    rows = iter(sr_noise(streams, 0, blocks, eager=eager) if streams else ())
    p, m, v = (next(rows) if sr else None for sr in rounded)
    return p, m, v


def _blocks_of(noise: Noise, blocks: slice) -> Noise:
    """The ``blocks`` of each store's noise."""
    p, m, v = (None if words is None else words[blocks] for words in noise)
    return p, m, v


def _padded(values: Tensor) -> Tensor:
    """The one ``(1, 4)`` block holding ``values`` (fewer than four), padded with zeros."""
    block = values.new_zeros(LANES)
    block[: values.numel()] = values
    return block.view(1, LANES)
