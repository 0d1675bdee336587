"""AdamW's compiled CPU step (`stochround.optim.cpu_adamw`) gives the bits of
`stochround.optim.AdamW`'s PyTorch path, step after step.

Each test runs ``sr.optim.AdamW`` (or ``Adam``) with ``backend="torch"`` beside
`adamw_step_cpu` on copies of the same parameter, gradients and states, with the scalars
and streams the optimizer gives its PyTorch path (``optimizer.scalars``,
``state_stream_offset``), and compares the parameter and both states bit for bit after every
step.  The eager tests run the step's functions uncompiled; one test compiles the loops.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import stochround as sr
from stochround import cpu_path
from stochround.optim.cpu_adamw import adamw_step_cpu, cpu_step_refusal
from stochround.optim.streams import state_stream_offset
from stochround.random import StreamDomain, stream_key

SEED = 2**64 - 5
STEPS = 3


def _values(shape: tuple[int, ...], scale: float, seed: int) -> Tensor:
    """Normal values times ``scale``, with zeros of both signs, tiny and huge values among
    them (subnormal in bf16, near its largest)."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale
    flat = values.view(-1)
    specials = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 3e38, -1e-3, 2.0**-126])
    flat[: min(flat.numel(), specials.numel())] = specials[: flat.numel()]
    return values


def _same(a: Tensor, b: Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _compare(
    shape: tuple[int, ...],
    param_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype | None = None,
    grad_dtype: torch.dtype | None = None,
    *,
    optimizer: type[sr.optim.AdamW] = sr.optim.AdamW,
    maximize: bool = False,
    weight_decay: float = 0.1,
    eager: bool = True,
    index: int = 0,
) -> None:
    """Run both for `STEPS` steps and compare after each (``index``: the parameter's
    position in the optimizer, a frozen parameter before it)."""
    initial = _values(shape, 3.0, 1).to(param_dtype)
    grads = [_values(shape, 0.5, 10 + step).to(grad_dtype or param_dtype) for step in range(STEPS)]
    reference = torch.nn.Parameter(initial.clone())
    reference.grad_dtype = grad_dtype  # None: any gradient dtype
    frozen = [torch.nn.Parameter(torch.zeros(2)) for _ in range(index)]
    options = {"lr": 0.01, "weight_decay": weight_decay, "seed": SEED, "maximize": maximize}
    opt = optimizer([*frozen, reference], state_dtype=state_dtype, backend="torch", **options)
    param = initial.clone()
    exp_avg, exp_avg_sq = (torch.zeros(shape, dtype=state_dtype or param_dtype) for _ in range(2))
    group = opt.param_groups[0]
    coupled = optimizer is sr.optim.Adam and weight_decay != 0
    for step in range(1, STEPS + 1):
        reference.grad = grads[step - 1]
        opt.step()
        scalars = opt.scalars(group, torch.tensor([step]))[0]
        count = torch.tensor(step)
        offsets = (
            state_stream_offset(count, index, 0),
            state_stream_offset(count, index, 1),
            state_stream_offset(count, index, 2),
        )
        assert cpu_step_refusal(param, grads[step - 1], exp_avg, exp_avg_sq) is None
        adamw_step_cpu(
            param,
            grads[step - 1],
            exp_avg,
            exp_avg_sq,
            scalars,
            int(stream_key(SEED, StreamDomain.OPTIMIZER)),  # the optimizer's key
            offsets,
            coupled=coupled,
            maximize=maximize,
            eager=eager,
        )
        state = opt.state[reference]
        assert _same(param, reference), step
        assert _same(exp_avg, state["exp_avg"]), step
        assert _same(exp_avg_sq, state["exp_avg_sq"]), step


@pytest.mark.parametrize("shape", [(37, 11), (16,), (3,), (2, 5), (9,)])
def test_bf16_parameter_and_states_any_size(shape: tuple[int, ...]) -> None:
    """Sizes with and without a partial last block of four, and under two blocks."""
    _compare(shape)


@pytest.mark.parametrize(
    ("param_dtype", "state_dtype", "grad_dtype"),
    [
        (torch.bfloat16, torch.float32, None),
        (torch.bfloat16, None, torch.float32),
        (torch.bfloat16, torch.bfloat16, torch.float16),
        (torch.float32, torch.bfloat16, None),
        (torch.float32, None, torch.bfloat16),
    ],
)
def test_every_dtype_of_parameter_state_and_gradient(
    param_dtype: torch.dtype, state_dtype: torch.dtype | None, grad_dtype: torch.dtype | None
) -> None:
    _compare((13, 7), param_dtype, state_dtype, grad_dtype)


def test_maximize_adams_coupled_decay_no_decay_and_a_later_parameter() -> None:
    _compare((40,), maximize=True)
    _compare((40,), optimizer=sr.optim.Adam)
    _compare((40,), weight_decay=0.0)
    _compare((40,), index=5)


def test_what_the_step_refuses() -> None:
    bf16 = torch.zeros(8, dtype=torch.bfloat16)
    assert cpu_step_refusal(bf16, bf16, bf16, bf16) in (None, cpu_path.compile_refusal())
    assert cpu_step_refusal(bf16.half(), bf16, bf16, bf16) is not None  # an fp16 parameter
    assert cpu_step_refusal(bf16, bf16, bf16.reshape(2, 4), bf16) is not None  # another shape
    assert (
        cpu_step_refusal(bf16, bf16, torch.zeros(2, 8, dtype=torch.bfloat16)[:, 0], bf16)
        is not None
    )
    assert cpu_step_refusal(bf16, bf16.double(), bf16, bf16) is not None  # a float64 gradient
    assert cpu_step_refusal(bf16, bf16, bf16, bf16.to("meta")) is not None


@pytest.mark.skipif(cpu_path.compile_refusal() is not None, reason="no compiled CPU path here")
# importing inductor imports torch's TorchScript modules, which warn about themselves
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_step() -> None:
    """Compiles the noise kernel and the update loop for bf16 parameters and states (once
    per process), then runs a size with a partial last block."""
    _compare((37, 11), eager=False)
    _compare((1000,), torch.bfloat16, torch.float32, torch.float32, eager=False)
