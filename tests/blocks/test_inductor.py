"""`quantize`, `fake_quantize` and `BlockTensor.dequantize` compiled by inductor on the CPU
(and on CUDA, through the kernels' custom ops) give the eager bits, for every named block
format: round to nearest, SR, a ``scale_rule=`` (or block, flavour) override, in one
compiled function per format (an inductor build takes seconds on a small CPU, so the
variants share one graph), and SR along a moved axis.

E8M0 scales cross a compiled graph only through opaque ops (inductor's CPU code has no
type for float8_e8m0fnu), and a rule override builds its `BlockFormat` in the graph."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from stochround import blocks

pytestmark = pytest.mark.compiles

# each format's override: a scale rule of its scale format, and for the formats with one
# rule another option of theirs
OVERRIDES: dict[str, dict[str, Any]] = {
    "mxfp8_e4m3": {"scale_rule": "rceil", "swizzle": True},
    "mxfp8_e5m2": {"scale_rule": "ceil"},
    "mxfp6_e2m3": {"scale_rule": "even"},
    "mxfp6_e3m2": {"scale_rule": "floor-3/4"},
    "mxfp4": {"scale_rule": "rceil", "swizzle": True},
    "mxint8": {"scale_rule": "ceil"},
    "nvfp4": {"block": (16, 16), "nvfp4_flavour": "torchao"},
    "int8_rowwise": {"block": 32},
}


def _x() -> torch.Tensor:
    """32 x 64 values over a few decades, a zero block and a huge one (MXINT8's scale
    2**127: its symmetric clamp)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(32, 64, generator=generator) * torch.logspace(-3, 2, 32).unsqueeze(1)
    x[1, :32] = 0.0
    x[2, :32] = -1.999 * 2.0**127
    return x


def _calls(name: str) -> Any:
    override = OVERRIDES[name]

    def calls(x: torch.Tensor) -> tuple[Any, ...]:
        nearest = blocks.quantize(x, name)
        stochastic = blocks.quantize(x, name, "sr", seed=11)
        other = blocks.quantize(x, name, "sr", seed=12, **override)
        faked = blocks.fake_quantize(x, name, "sr", seed=13)
        values = tuple(q.dequantize() for q in (nearest, stochastic, other))
        return nearest, stochastic, other, faked, values

    return calls


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32) if tensor.dtype == torch.float32 else tensor


@pytest.mark.parametrize("name", list(OVERRIDES))
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inductor_gives_the_eager_bits(name: str, device: str) -> None:
    torch._dynamo.reset()
    x = _x().to(device)
    calls = _calls(name)
    compiled = torch.compile(calls, backend="inductor", fullgraph=True)
    got, want = compiled(x), calls(x)
    for index in range(3):  # BlockTensor == compares codes, scales and tensor scale bits
        assert got[index] == want[index], (name, index)
        assert got[index].scales.dtype == want[index].scales.dtype
    assert torch.equal(_bits(got[3]), _bits(want[3])), name
    for compiled_values, eager_values in zip(got[4], want[4], strict=True):
        assert torch.equal(_bits(compiled_values), _bits(eager_values)), name


@pytest.mark.parametrize("name", list(OVERRIDES))
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inductor_gives_the_eager_bits_along_a_moved_axis(name: str, device: str) -> None:
    """SR along axis 0 (the PyTorch path, also on CUDA): each element keeps the word of
    its index in x, and the scales' quotients their correctly rounded bits."""
    torch._dynamo.reset()
    x = _x().to(device)

    def moved(x: torch.Tensor) -> tuple[Any, torch.Tensor]:
        q = blocks.quantize(x, name, "sr", seed=14, axis=0)
        return q, q.dequantize()

    got, want = torch.compile(moved, backend="inductor", fullgraph=True)(x), moved(x)
    assert got[0] == want[0], name
    assert torch.equal(_bits(got[1]), _bits(want[1])), name
