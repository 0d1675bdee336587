"""Kernels on a CUDA device that is not the current one (two-GPU machines only).

Triton launches on the current device's current stream; PyTorch's ops run on their
tensors' device.  With x on the second device and the first current, every kernel entry
point (`cast`, `round` on each kernel path, `arith.matmul`, the fused optimizer step)
gives the PyTorch path's bits, on x's device, and leaves the first device current.
"""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround import arith
from stochround.optim import AdamW

pytestmark = pytest.mark.gpus2
OTHER = torch.device("cuda", 1)


def _both_backends(call) -> tuple[torch.Tensor, torch.Tensor]:
    """call(backend) by the kernels and by the PyTorch path, device 0 current."""
    torch.cuda.set_device(0)
    kernels = call("triton")
    assert torch.cuda.current_device() == 0
    return kernels, call("torch")


def _values(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, generator=generator).to(OTHER)


@pytest.mark.parametrize(
    ("dtype", "kwargs"),
    [
        (torch.float4_e2m1fn_x2, {}),  # the codes path, checked: waits on x's stream
        (torch.float4_e2m1fn_x2, {"nan": "zero"}),
        (torch.float8_e4m3fn, {"rbits": 5, "variant": "b"}),  # the general kernel
        (torch.bfloat16, {}),  # the bf16 path
    ],
)
def test_cast_rounds_on_the_device_of_x(dtype: torch.dtype, kwargs: dict) -> None:
    x = _values(1 << 20)
    x[12345] = 100.0  # beyond e2m1's 6: the exact codes kernel runs too (saturating)
    mine, expected = _both_backends(
        lambda backend: sr.cast(x, dtype, "sr", seed=3, sat="finite", backend=backend, **kwargs)
    )
    assert mine.device == OTHER
    assert torch.equal(mine.view(torch.uint8), expected.view(torch.uint8))


def test_a_nan_result_raises_on_the_device_of_x() -> None:
    x = _values(1 << 16)
    x[7] = float("nan")
    torch.cuda.set_device(0)
    with pytest.raises(ValueError, match="no NaN code"):
        sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=3, backend="triton")
    assert torch.cuda.current_device() == 0


def test_seed_and_offset_tensors_on_the_device_of_x() -> None:
    # (on x's device: a copy from another would enable peer access between the two, which
    # lets a kernel launched on the wrong device read and write x's memory unnoticed)
    x = _values(1 << 20)
    seed, offset = torch.tensor(5, device=OTHER), torch.tensor(2, device=OTHER)
    mine, expected = _both_backends(
        lambda backend: sr.round(x, "e4m3", "sr", seed=seed, offset=offset, backend=backend)
    )
    assert mine.device == OTHER and torch.equal(mine, expected)


def test_matmul_runs_on_the_device_of_its_operands() -> None:
    a, b = _values(24 * 40).view(24, 40), _values(40 * 16, seed=1).view(40, 16)
    mine, expected = _both_backends(
        lambda backend: arith.matmul(a, b, "bfloat16", "sr", seed=9, backend=backend)
    )
    assert mine.device == OTHER and torch.equal(mine, expected)


def test_the_fused_step_runs_on_the_device_of_the_parameters() -> None:
    def steps(backend: str) -> torch.Tensor:
        param = _values(5000).to(torch.bfloat16).requires_grad_()
        optimizer = AdamW([param], lr=1e-2, rounding="sr", seed=4, backend=backend)
        for step in range(3):
            param.grad = _values(5000, seed=10 + step).to(torch.bfloat16)
            optimizer.step()
        return param.detach()

    mine, expected = _both_backends(steps)
    assert torch.equal(mine.view(torch.int16), expected.view(torch.int16))
