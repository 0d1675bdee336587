"""The random streams of a `QuantizedLinear` step: the stream offset of each draw
(``step * 2**32 + layer * 16 + slot``) and a step's offsets of all slots (`step_column`),
made in one operation and split into the kernels' one-element offsets by one more; and the
key of a data-parallel rank's own operands (`data_rank_key`).

Data parallelism.  The ranks of a data-parallel run (DDP, FSDP2, and the context-parallel
ranks, which hold other tokens) quantize their own x and dy: data that differs by rank.
Drawn with the same words, two ranks' rounding errors would be correlated (a word decides
whether an element rounds up, whatever the value), and summing the ranks' gradients would
average the SR noise less than independent words do.  So the roles of x and dy
(`DATA_ROLES`) draw under the key `data_rank_key` of the layer's key and the layer's
data-parallel rank, while the weight roles keep the layer's key on every rank: each rank
quantizes the same all-gathered weight, and must do so identically.  The RHT signs keep the
layer's key too (a GEMM's two operands share them).
"""

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
# the operands of a rank's own data (x and dy); the other roles quantize the weight
DATA_ROLES = frozenset(("fprop_input", "dgrad_grad_output", "wgrad_grad_output", "wgrad_input"))
# a data-parallel rank fills the key's upper 32-bit word (`data_rank_key`)
DATA_RANK_SHIFT = 32
MAX_DATA_RANK = 1 << 32


def check_data_parallel_rank(rank: object) -> int:
    """``rank`` if it is an int in [0, 2**32): TypeError for another type, ValueError for
    another int."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"data_parallel_rank must be an int, got {type(rank).__name__}")
    if not 0 <= rank < MAX_DATA_RANK:
        raise ValueError(f"data_parallel_rank must be in [0, 2**32), got {rank}")
    return rank


def data_rank_key(key: int, rank: int) -> int:
    """The Philox key of data-parallel rank ``rank``'s data operands (`DATA_ROLES`) from a
    layer's key: ``key ^ (rank << 32)``, the key itself on rank 0.  Folded with a
    tensor-parallel rank t (`stochround.nn.tensor_parallel.rank_key`: ``key ^ (t *
    RANK_KEY_STEP mod 2**64)``), distinct ``(t, rank)`` below 2**32 give distinct keys:
    the low 32 bits, ``t`` times the constant's odd low word mod 2**32, name t, and then
    the high ones name the rank."""
    check_data_parallel_rank(rank)
    return key ^ (rank << DATA_RANK_SHIFT)


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


def column_step(offsets: Tensor) -> Tensor:
    """The step of a `step_column` column, a 0-d int64 tensor: its offsets' upper half
    (``offset >> 32``; the layer and slot fill the lower one)."""
    return offsets[0, 0] >> STEP_SHIFT


def bases_column(step: Tensor, bases: Tensor) -> Tensor:
    """`step_column` from a layer's `layer_bases` tensor instead of its number (a compiled
    layer reads its bases as a tensor: a number would be a constant of its graph, and each
    layer a graph of its own).  One operation: ``bases + step * 2**32`` is
    ``(step << 32) | bases``, the bases filling the low 32 bits, which the product leaves
    zero (int64 wraps alike in both)."""
    return torch.add(bases, step, alpha=1 << STEP_SHIFT)


__all__ = [
    "DATA_RANK_SHIFT",
    "DATA_ROLES",
    "MAX_DATA_RANK",
    "MAX_LAYERS",
    "ROLE_SLOTS",
    "SIGN_SLOTS",
    "SLOTS_PER_LAYER",
    "STEP_SHIFT",
    "bases_column",
    "check_data_parallel_rank",
    "column_step",
    "data_rank_key",
    "layer_bases",
    "slot_bases",
    "slot_offsets",
    "step_column",
    "stream_offset",
]
