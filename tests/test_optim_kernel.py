"""The fused optimizer kernel against the PyTorch path, bit for bit.

Without a GPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1);
on the GPU machine the same tests run compiled on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from stochround.optim import SGD, AdamW, Lion

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = ((20000,), (3,), (70, 33), (1,))  # several programs, partial blocks, one element

OPTIMIZERS = [
    (AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (AdamW, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6, "maximize": True}),
    (SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}),
    (SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
    (SGD, {"lr": 1e-2, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    (SGD, {"lr": 1e-2, "weight_decay": 0.01}),
    (Lion, {"lr": 1e-3, "weight_decay": 0.1}),
    (Lion, {"lr": 1e-3, "betas": (0.8, 0.95), "maximize": True}),
]
STORAGE = [
    (torch.bfloat16, torch.bfloat16, "sr"),
    (torch.bfloat16, torch.bfloat16, "rne"),
    (torch.float32, torch.float32, "rne"),
    (torch.bfloat16, torch.float32, "sr"),
    (torch.float16, torch.float16, "sr"),
    (torch.float32, torch.bfloat16, "sr"),
]


def _params(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(shape, generator=generator).to(DEVICE, dtype).requires_grad_()
        for shape in SHAPES
    ]


def _gradients(step: int, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator).to(DEVICE, dtype) for shape in SHAPES]


def _run(cls, kwargs, param_dtype, state_dtype, rounding, backend, steps=3):
    params = _params(param_dtype)
    optimizer = cls(
        params, state_dtype=state_dtype, rounding=rounding, seed=2**40 + 7, backend=backend,
        **kwargs,
    )  # fmt: skip
    for step in range(steps):
        for param, grad in zip(params, _gradients(step, param_dtype), strict=True):
            param.grad = grad
        optimizer.step()
    return params, optimizer


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.element_size()]
    return tensor.detach().contiguous().view(width)


@pytest.mark.parametrize(("cls", "kwargs"), OPTIMIZERS)
@pytest.mark.parametrize(("param_dtype", "state_dtype", "rounding"), STORAGE)
def test_fused_kernel_equals_the_pytorch_path(cls, kwargs, param_dtype, state_dtype, rounding):
    fused, fused_optimizer = _run(cls, kwargs, param_dtype, state_dtype, rounding, "triton")
    torch_path, torch_optimizer = _run(cls, kwargs, param_dtype, state_dtype, rounding, "torch")
    for mine, theirs in zip(fused, torch_path, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))
        assert not torch.equal(mine.detach(), _params(param_dtype)[0].detach()[: mine.numel()])
        mine_state, their_state = fused_optimizer.state[mine], torch_optimizer.state[theirs]
        assert mine_state.keys() == their_state.keys()
        for name in cls.state_names if mine_state.get("momentum_buffer", 0) is not None else ():
            if name in mine_state:
                assert mine_state[name].dtype == state_dtype
                assert torch.equal(_bits(mine_state[name]), _bits(their_state[name])), name


def test_fused_sr_depends_on_the_seed_and_rounds_to_bf16():
    params, _ = _run(AdamW, {"lr": 1e-3}, torch.bfloat16, torch.bfloat16, "sr", "triton", 1)
    other = _params(torch.bfloat16)
    optimizer = AdamW(other, lr=1e-3, state_dtype=torch.bfloat16, seed=5, backend="triton")
    for param, grad in zip(other, _gradients(0, torch.bfloat16), strict=True):
        param.grad = grad
    optimizer.step()
    assert not torch.equal(params[0], other[0])  # another seed, other roundings
    assert params[0].dtype == torch.bfloat16


def test_backend_triton_refuses_what_the_kernel_cannot_do():
    for options in ({"master_weights": True}, {"rounding": "kahan"}, {"rounding": "ecc"}):
        params = _params(torch.bfloat16)
        optimizer = AdamW(params, backend="triton", **options)
        for param, grad in zip(params, _gradients(0, torch.bfloat16), strict=True):
            param.grad = grad
        with pytest.raises(ValueError, match="backend='triton' cannot update"):
            optimizer.step()
    with pytest.raises(ValueError, match="backend"):
        AdamW(_params(torch.float32), backend="cuda")


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU default")
def test_auto_takes_the_pytorch_path_for_cpu_parameters(monkeypatch):
    import stochround.kernels.optim as kernels

    def refuse(*args, **kwargs):
        raise AssertionError("the kernel ran for CPU parameters under backend='auto'")

    monkeypatch.setattr(kernels, "fused_step", refuse)
    _run(AdamW, {"lr": 1e-3}, torch.bfloat16, torch.bfloat16, "sr", "auto", 1)
