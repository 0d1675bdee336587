"""The random words of n samples of one tensor, each sample in its own stream offset, in
one launch: the kernel twin of `stochround.emulate.mca_samples.sample_words` (batched
Monte Carlo arithmetic draws, for sample j, the words its serial run j draws)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..random import seed_tensor
from .grid import cdiv
from .philox import random_word


@triton.jit
def _sample_words_kernel(out_ptr, bases_ptr, seed_ptr, offset, count, BLOCK: tl.constexpr):
    sample = tl.program_id(1).to(tl.int64)
    positions = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = positions < count
    seed = tl.load(seed_ptr)
    start = tl.load(bases_ptr + sample) + offset
    word = random_word(seed, start, positions)
    tl.store(out_ptr + sample * count + positions, word.to(tl.int64), mask=in_range)


def sample_words_triton(
    shape: torch.Size, key: int, bases: Tensor, offset: int, block: int = 1024
) -> Tensor:
    """``out[j]``: the words of a tensor of ``shape`` in stream ``(key, bases[j] +
    offset)`` at its row-major flat indices (`stochround.random.random_words_like`); int64
    in [0, 2**32), shape ``(n, *shape)``.  ``bases``: int64 of n <= 65535 values (one
    program column a sample), ``bases[j] + offset`` below 2**63."""
    n = bases.shape[0]
    count = shape.numel()
    out = torch.empty((n, count), dtype=torch.int64, device=bases.device)
    if count and n:
        seed = seed_tensor(key, "seed", bases.device)
        grid = (cdiv(count, block), n)
        _sample_words_kernel[grid](out, bases, seed, offset, count, BLOCK=block)
    return out.reshape(n, *shape)


__all__ = ["sample_words_triton"]
