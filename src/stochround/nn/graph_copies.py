"""The grouped copies between a step graph's tensors and a call's (`stochround.nn.step_graphs`):
a call's tensors copied into a graph of copies' static inputs, and a graph's outputs copied
out of the graphs' shared pool, one ``torch._foreach_copy_`` launch a group of tensors,
every tensor moved as integers (its bits unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class CopyPlan(NamedTuple):
    """The grouped copies between a graph's tensors and a call's tensors of the same
    layouts, worked out once when the graph is captured: per group, the positions of the
    pairs it copies, the integer dtype both sides are viewed as (`bits_dtype`) and the
    graph side's views (`copy_plan`)."""

    groups: tuple[tuple[tuple[int, ...], torch.dtype, tuple[Tensor, ...]], ...]


def copy_grouped(targets: Sequence[Tensor | None], sources: Sequence[Tensor | None]) -> None:
    """Each source copied into its target of the same layout (pairs with a None skipped),
    by one ``torch._foreach_copy_`` a group (`copy_plan`'s groups): on CUDA one launch for
    a group's tensors, where a copy each would be a launch each (the host time a replay is
    there to save)."""
    pairs = [
        (target, source)
        for target, source in zip(targets, sources, strict=True)
        if target is not None and source is not None
    ]
    copy_into(copy_plan([target for target, _ in pairs]), [source for _, source in pairs])


def copy_plan(tensors: Sequence[Tensor | None]) -> CopyPlan:
    """The grouped copies between ``tensors`` (a graph's) and tensors of the same layouts.
    Every tensor is copied as integers (`bits_dtype`), so each copy moves the bits
    unchanged: the CUDA kernel copies a floating dtype through its math type (a bf16 or
    fp16 NaN comes back as the canonical NaN) and has no case for the float8 dtypes.
    Tensors of an even element size with a dense last axis (bf16, fp32, the int64 offsets
    column) are copied as int16 words, all in one group; any other (a 1-byte dtype, a 0-d
    tensor, a transposed output) as the integer dtype of its element size, in that
    dtype's group.  None and empty tensors are left out."""
    groups: dict[torch.dtype, tuple[list[int], list[Tensor]]] = {}
    for position, tensor in enumerate(tensors):
        if tensor is None or not tensor.numel():
            continue
        dtype = bits_dtype(tensor)
        positions, views = groups.setdefault(dtype, ([], []))
        positions.append(position)
        views.append(tensor.view(dtype))
    return CopyPlan(
        tuple((tuple(at), dtype, tuple(views)) for dtype, (at, views) in groups.items())
    )


def copy_into(plan: CopyPlan, sources: Sequence[Tensor | None]) -> None:
    """The plan's graph tensors set to ``sources`` (laid out as they are), a launch a group."""
    for positions, dtype, views in plan.groups:
        torch._foreach_copy_(views, [sources[at].view(dtype) for at in positions])  # type: ignore[union-attr]


def copy_from(plan: CopyPlan, targets: Sequence[Tensor]) -> None:
    """``targets`` (laid out as the plan's graph tensors) set to them, a launch a group."""
    for positions, dtype, views in plan.groups:
        torch._foreach_copy_([targets[at].view(dtype) for at in positions], views)


# the integer dtype of each element size, whose copies move bits (`bits_dtype`)
BITS_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_dtype(tensor: Tensor) -> torch.dtype:
    """The integer dtype ``tensor`` is copied as: int16 words where its element size is even
    and its last axis dense (``view`` then takes any such layout), else the integer dtype of
    its element size (a view any layout allows; a 16-byte complex stays as it is, its
    kernel copy exact)."""
    size = tensor.element_size()
    if size % 2 == 0 and tensor.dim() > 0 and tensor.stride(-1) == 1:
        return torch.int16
    return BITS_DTYPES.get(size, tensor.dtype)


def fresh_copies(outputs: Sequence[Tensor], plan: CopyPlan | None = None) -> list[Tensor]:
    """New tensors holding ``outputs``' values (a graph's outputs live in its pool, which
    the next replay overwrites), copied by ``plan`` (`copy_plan` of ``outputs``, made here
    where not given); an empty output (a gradient not wanted) holds no values to overwrite
    and is returned as it is."""
    copies = [out if out.numel() == 0 else torch.empty_like(out) for out in outputs]
    copy_from(copy_plan(outputs) if plan is None else plan, copies)
    return copies


__all__ = [
    "BITS_DTYPES",
    "CopyPlan",
    "bits_dtype",
    "copy_from",
    "copy_grouped",
    "copy_into",
    "copy_plan",
    "fresh_copies",
]
