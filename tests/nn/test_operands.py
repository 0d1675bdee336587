"""`stochround.nn.operands`' per-tensor scales: the eager three-operation form equals the
rule's (`stochround.blocks.scales.absmax_scales`) bit for bit."""

from __future__ import annotations

import torch

from stochround.blocks.scales import absmax_scales
from stochround.nn.operands import tensor_scales


def amaxes() -> torch.Tensor:
    """fp32 amaxes over the whole range: random bit patterns of every sign-free exponent
    (normals, subnormals, inf, NaN), the floor's neighbourhood and the edge values."""
    bits = torch.randint(0, 2**31, (20000,), generator=torch.Generator().manual_seed(0))
    edges = torch.tensor([0.0, 1e-45, 1e-12, 4.48e-10, 448.0, 57344.0, 3.0e38, float("inf")])
    near = torch.tensor(1e-12 * 448.0).expand(64) * torch.linspace(0.99, 1.01, 64)
    return torch.cat(
        [bits.to(torch.int32).view(torch.float32), edges, near, torch.tensor([float("nan")])]
    )


def test_tensor_scales_equal_the_absmax_rule_bit_for_bit() -> None:
    for max_value in (448.0, 57344.0):
        for amax in amaxes():
            scale, multiplier = tensor_scales(amax, max_value)
            want_scale, want_multiplier = absmax_scales(amax, max_value)
            assert scale.shape == multiplier.shape == torch.Size([])
            assert scale.dtype == multiplier.dtype == torch.float32
            got = torch.stack([scale, multiplier]).view(torch.int32)
            want = torch.stack([want_scale, want_multiplier]).view(torch.int32)
            assert torch.equal(got, want), (amax.item(), max_value)
