"""The rounding an emulation applies to one op's output, written as tensor operations a
graph tracer records and Inductor lowers into the producing kernel: no data-dependent
branch, no host read, the random words computed from the element's row-major index by
the project's Philox (`stochround.random.random_words`), the stream's offset a tensor.

It computes the bits `stochround.rounding.round` computes for the same arguments (the
PyTorch path, `stochround.torch_path.round_values`, with its special inputs selected
rather than branched on), so that a compiled emulation (`stochround.emulate.compiled`)
gives an eager emulation's results bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..formats import Format
from ..random import random_words
from ..reference import WORD_BITS
from ..torch_path import canonical_nan, round_values, saturation_bounds


class Rounding(NamedTuple):
    """The choices of an emulation's rounding (checked by `Emulation`): the mode, the
    random bits ``n`` (32: exact SR), the SR variant, and the stream's key."""

    mode: str
    n: int
    variant: str
    key: int


def flat_index(x: Tensor) -> Tensor:
    """The row-major flat index of each element of x (int64), as a broadcast sum of one
    ``arange`` per dimension: ``i = sum_d i_d * prod(shape[d+1:])``.  Broadcast, it costs a
    compiled kernel no memory read, and its result follows x's strides, whatever they are."""
    index = torch.zeros((), dtype=torch.int64, device=x.device)
    stride = 1
    for dim in reversed(range(x.ndim)):
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        steps = torch.arange(x.shape[dim], dtype=torch.int64, device=x.device)
        index = index + steps.view(shape) * stride
        stride = stride * x.shape[dim]
    return index


def rounded(x: Tensor, fmt: Format, rounding: Rounding, offset: Tensor) -> Tensor:
    """``round(x, fmt, mode, rbits, variant, seed=key, offset=offset)`` in x's dtype, for
    an int64 ``offset`` tensor: SR draws element i's word at ``(key, offset, i)``, i its
    row-major index; values then narrow to x's dtype as `torch_path.rounded_output` does
    (clamped to the format's bounds where x's dtype cannot hold them, NaN canonical)."""
    r = None
    if rounding.mode == "sr":
        words = random_words(flat_index(x), rounding.key, offset)
        r = words >> (WORD_BITS - rounding.n)
    values = round_values(
        x, fmt, rounding.mode, "none", rounding.n, rounding.variant, r, branch_free=True
    )
    narrowed = values.to(x.dtype)
    if x.dtype != values.dtype:
        bounds = saturation_bounds(fmt, x.dtype, "none")
        if bounds is not None:
            low, high = bounds
            narrowed = torch.where(torch.isfinite(values), narrowed.clamp(low, high), narrowed)
    return torch.where(torch.isnan(values), canonical_nan(x.dtype, x.device), narrowed)


__all__ = ["Rounding", "flat_index", "rounded"]
