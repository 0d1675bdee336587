"""The tiled transpose kernel: ``x.T`` bit for bit."""

from __future__ import annotations

import pytest
import torch

from stochround.kernels.availability import INTERPRETED
from stochround.kernels.transpose import TILE, transpose

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("shape", [(1, 1), (TILE, TILE), (70, 130), (3 * TILE + 1, 5)])
def test_the_kernel_copies_the_transpose_bit_for_bit(
    dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    """Ragged edges (shapes not multiples of the tile) included; NaN and -0 bit patterns
    survive (the values are moved as stored, not converted)."""
    bits = torch.randint(
        0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    width = torch.empty(0, dtype=dtype).element_size()
    raw = bits.repeat_interleave(width, dim=1) if width > 1 else bits
    x = raw.view(dtype).to(DEVICE)
    got = transpose(x, kernel=True)
    assert got.is_contiguous() and got.shape == (shape[1], shape[0])
    assert torch.equal(got.view(torch.uint8).cpu(), x.T.contiguous().view(torch.uint8).cpu())


def test_other_tensors_take_pytorchs_copy_and_bad_ones_raise() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(transpose(x.T), x)  # non-contiguous: PyTorch's copy
    assert torch.equal(transpose(x), x.T)  # a CPU tensor by default
    with pytest.raises(ValueError, match="x must be 2-D"):
        transpose(torch.arange(3.0))
