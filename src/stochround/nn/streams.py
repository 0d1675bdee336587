"""The random streams of a `QuantizedLinear` step: the stream offset of each draw
(``step * 2**32 + layer * 16 + slot``) and a step's offsets of all slots (`step_column`),
made in one operation and split into the kernels' one-element offsets by one more."""

from __future__ import annotations

import torch
from torch import Tensor

from .recipes import GEMMS, ROLES

# offset = step * 2**32 + layer * 16 + slot: the roles take slots 0..5, the per-step RHT
# signs of each GEMM slots 8..10, so no two draws of a run share an offset (a Philox
# counter's upper half): no random word is used twice
SLOTS_PER_LAYER = 16
ROLE_SLOTS = {role: slot for slot, role in enumerate(ROLES)}
SIGN_SLOTS = {gemm: 8 + index for index, gemm in enumerate(GEMMS)}
MAX_LAYERS = 1 << 28
STEP_SHIFT = 32


def stream_offset(step: int | Tensor, layer: int, slot: int) -> int | Tensor:
    """``step * 2**32 + layer * 16 + slot``: the stream offset of one draw.  ``step``: an
    int in [0, 2**32) or an int64 tensor (giving a tensor); ``layer`` in [0, 2**28);
    ``slot`` in [0, 16) (`ROLE_SLOTS`, `SIGN_SLOTS`)."""
    if not 0 <= layer < MAX_LAYERS:
        raise ValueError(f"layer must be in [0, 2**28), got {layer}")
    if not 0 <= slot < SLOTS_PER_LAYER:
        raise ValueError(f"slot must be in [0, 16), got {slot}")
    low = layer * SLOTS_PER_LAYER + slot
    if isinstance(step, Tensor):
        return (step << STEP_SHIFT) | low
    if not 0 <= step < 1 << STEP_SHIFT:
        raise ValueError(f"step must be in [0, 2**32), got {step}")
    return (step << STEP_SHIFT) | low


# `slot_bases`' tensors by layer and device (a dict read by a plain function: torch.compile
# warns about lru_cache-wrapped functions in the code it traces)
_SLOT_BASES: dict[tuple[int, torch.device], Tensor] = {}


def layer_bases(layer: int, device: torch.device | str | None = None) -> Tensor:
    """``layer * 16 + slot`` for each slot, a new int64 ``(SLOTS_PER_LAYER, 1)`` tensor on
    ``device`` (a layer's own copy: `QuantizedLinear.stream_bases`)."""
    stream_offset(0, layer, 0)  # checks the layer index
    slots = torch.arange(SLOTS_PER_LAYER, dtype=torch.int64, device=device)
    return (slots + layer * SLOTS_PER_LAYER).view(-1, 1)


def slot_bases(layer: int, device: torch.device) -> Tensor:
    """``layer * 16 + slot`` for each slot, an int64 ``(SLOTS_PER_LAYER, 1)`` tensor on
    ``device``: the low half of the layer's offsets at every step, made once per layer and
    device (an arange and an add a step otherwise)."""
    if torch.compiler.is_compiling():
        return layer_bases(layer, device)
    bases = _SLOT_BASES.get((layer, device))
    if bases is None:  # the layer index checked once, as its bases are made
        bases = _SLOT_BASES[layer, device] = layer_bases(layer, device)
    return bases


def slot_offsets(offsets: Tensor) -> tuple[Tensor, ...]:
    """The one-element offset tensor of each slot (views), from `step_column`'s column: one
    operation for all slots, where indexing each would be one each (and a reshape more for
    the kernels, which read one-element tensors)."""
    return offsets.unbind(0)


def step_column(step: Tensor, layer: int) -> Tensor:
    """The stream offsets of all `SLOTS_PER_LAYER` slots of ``layer`` at ``step`` (a 0-d
    int64 tensor) as an int64 ``(SLOTS_PER_LAYER, 1)`` column: row ``slot`` is
    ``stream_offset(step, layer, slot)``, made by one operation (`slot_bases` made once)
    however many operands a step quantizes; `slot_offsets` splits it into the slots'
    one-element offsets."""
    return bases_column(step, slot_bases(layer, step.device))


def bases_column(step: Tensor, bases: Tensor) -> Tensor:
    """`step_column` from a layer's `layer_bases` tensor instead of its number (a compiled
    layer reads its bases as a tensor: a number would be a constant of its graph, and each
    layer a graph of its own).  One operation: ``bases + step * 2**32`` is
    ``(step << 32) | bases``, the bases filling the low 32 bits, which the product leaves
    zero (int64 wraps alike in both)."""
    return torch.add(bases, step, alpha=1 << STEP_SHIFT)


__all__ = [
    "MAX_LAYERS",
    "ROLE_SLOTS",
    "SIGN_SLOTS",
    "SLOTS_PER_LAYER",
    "STEP_SHIFT",
    "bases_column",
    "layer_bases",
    "slot_bases",
    "slot_offsets",
    "step_column",
    "stream_offset",
]
