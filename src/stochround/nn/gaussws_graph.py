"""GaussWS's rounded Gaussian ``R`` of every element as one graph op, which Inductor lowers
into the elementwise expression of the element's index that the sampled weight's kernel
computes in registers: no word stored to memory.

``R = -MAX_ROUNDED + #{j : x >= T_j}``, ``x`` the top ``noise_bits`` bits of the element's
Philox word (`stochround.random.random_words` of its row-major index) and ``T_j`` the
thresholds of `stochround.nn.gaussws_noise.gaussian_thresholds`: `count_thresholds` of the
shifted words, the PyTorch path's own function.

Traced op by op (the words, the shift, six comparisons), the words feed six reads;
Inductor stores a value that several nodes read when its expression is large, and
Philox's rounds are: every sampled weight would write and read back eight bytes an
element.  The op ``stochround_nn::gaussws_draws`` is one node read once; its lowering runs
the eager stream's rounds on Inductor's values (`stochround.emulate.graph_words.word_at`)
and compares in the same expression.  Its eager and fake bodies give the same int8 values,
bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..emulate.graph_words import (
    flat_index,
    flat_position,
    lowering_registrar,
    register_outside_modes,
    word_at,
)
from ..random import MASK32, random_words
from ..reference import WORD_BITS

MAX_ROUNDED = 3  # R's support is -3..3: |round(N/2)| >= 4 has less than one count at n = 32

_LIBRARY_NAME = "stochround_nn"
_library = torch.library.Library(_LIBRARY_NAME, "FRAGMENT")
_library.define(
    "gaussws_draws(Tensor like, int key_low, int key_high, Tensor offset, int noise_bits, "
    "int[] thresholds) -> Tensor"
)


def count_thresholds(words: Tensor, thresholds: Sequence[int]) -> Tensor:
    """``-MAX_ROUNDED + #{j : words >= thresholds[j]}`` as int8 (no checks)."""
    rounded = torch.full(words.shape, -MAX_ROUNDED, dtype=torch.int8, device=words.device)
    for threshold in thresholds:
        rounded = rounded + (words >= threshold).to(torch.int8)
    return rounded


def _eager_draws(
    like: Tensor,
    key_low: int,
    key_high: int,
    offset: Tensor,
    noise_bits: int,
    thresholds: list[int],
) -> Tensor:
    """R of like's row-major elements in stream ``(key, offset)`` (int8, contiguous)."""
    words = random_words(flat_index(like), key_low | (key_high << 32), offset)
    drawn = count_thresholds(words >> (WORD_BITS - noise_bits), thresholds)
    return drawn.expand(like.shape).contiguous()


def _fake_draws(like: Tensor, *stream_and_table: object) -> Tensor:
    """R's shape, dtype and device: an int8 tensor shaped like ``like`` (the stream and the
    table do not change them).  A trace runs it before Inductor lowers the graph, so it
    registers the lowering (once a process)."""
    register_outside_modes(register_draws_lowering)
    return torch.empty(like.shape, dtype=torch.int8, device=like.device)


_library.impl("gaussws_draws", _eager_draws, "CompositeExplicitAutograd")
torch.library.register_fake(f"{_LIBRARY_NAME}::gaussws_draws", _fake_draws, lib=_library)
GAUSSWS_DRAWS = torch.ops.stochround_nn.gaussws_draws.default


def gaussws_draws(
    like: Tensor, key: int, offset: Tensor, noise_bits: int, thresholds: Sequence[int]
) -> Tensor:
    """Element i of ``like`` (row-major) gets ``count_thresholds(random_words(i, key,
    offset) >> (32 - noise_bits), thresholds)``: one op a graph records, for a ``key`` in
    ``[0, 2**64)``, an int64 ``offset`` tensor, ``noise_bits`` in 1..32 and ints
    ``thresholds`` (checked by the caller)."""
    bounds = list(thresholds)
    return cast(
        Tensor,
        GAUSSWS_DRAWS(like, key & MASK32, key >> 32, offset.reshape(()), noise_bits, bounds),
    )


def _lowering(
    like: Any,
    key_low: int,
    key_high: int,
    offset: Any,
    noise_bits: int,
    thresholds: Sequence[int],
) -> Any:
    """Inductor's lowering of `GAUSSWS_DRAWS`: a pointwise int8 node over like's shape
    (like's values are not read) whose body is the word of the element's row-major index,
    shifted and compared with each threshold (module docstring)."""
    from torch._inductor.ir import Pointwise
    from torch._inductor.virtualized import ops

    sizes = list(like.get_size())
    load_offset = offset.make_loader()

    def body(indices: Sequence[Any]) -> Any:
        word = word_at(flat_position(indices, sizes), load_offset([]), key_low, key_high)
        drawn = ops.bitwise_right_shift(word, ops.constant(WORD_BITS - noise_bits, torch.int64))
        rounded = ops.constant(-MAX_ROUNDED, torch.int8)
        for threshold in thresholds:
            above = ops.ge(drawn, ops.constant(threshold, torch.int64))
            rounded = ops.add(rounded, ops.to_dtype(above, torch.int8))
        return rounded

    return Pointwise.create(device=like.get_device(), dtype=torch.int8, inner_fn=body, ranges=sizes)


# registers `_lowering` as Inductor's lowering of `GAUSSWS_DRAWS`
register_draws_lowering = lowering_registrar(GAUSSWS_DRAWS, _lowering)


__all__ = [
    "GAUSSWS_DRAWS",
    "MAX_ROUNDED",
    "count_thresholds",
    "gaussws_draws",
    "register_draws_lowering",
]
