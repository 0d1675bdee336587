"""The rounding an emulation applies to one op's output, written as tensor operations a
graph tracer records and Inductor lowers into the producing kernel: no data-dependent
branch, no host read, the random words of the element's row-major index by the project's
Philox (`stochround.random.random_words`) as one op that Inductor lowers compactly
(`graph_words.stream_words`), the stream's offset a tensor.

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
from ..reference import WORD_BITS
from ..torch_path import canonical_nan, round_values, saturation_bounds
from .graph_words import stream_words


class Rounding(NamedTuple):
    """The choices of an emulation's rounding (checked by `Emulation`): the mode, the
    random bits ``n`` (32: exact SR), the SR variant, and the stream's key."""

    mode: str
    n: int
    variant: str
    key: int


def rounded(x: Tensor, fmt: Format, rounding: Rounding, offset: Tensor) -> Tensor:
    """``round(x, fmt, mode, rbits, variant, seed=key, offset=offset)`` in x's dtype, for
    an int64 ``offset`` tensor: SR draws element i's word at ``(key, offset, i)``, i its
    row-major index; values then narrow to x's dtype as `torch_path.rounded_output` does
    (clamped to the format's bounds where x's dtype cannot hold them, NaN canonical)."""
    r = None
    if rounding.mode == "sr":
        words = stream_words(x, rounding.key, offset)
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


__all__ = ["Rounding", "rounded"]
