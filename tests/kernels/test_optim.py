"""The fused optimizer kernel against the PyTorch path, bit for bit.

Without a GPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1);
on the GPU machine the same tests run compiled on CUDA tensors.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

import pytest
import torch

import stochround
from stochround.optim import SGD, Adam, AdamW, Lion

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = ((20000,), (3,), (70, 33), (1,))  # several programs, partial blocks, one element

OPTIMIZERS = [
    (AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (AdamW, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6, "maximize": True}),
    (Adam, {"lr": 1e-2, "weight_decay": 0.1}),
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
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
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


# 0.00144949...: lr / (1 - b1^t) rounds to another float32 at steps 1 and 2 when lr is
# first rounded to float32
@pytest.mark.parametrize("lr", [0.0, 5e-324, 0.0014494910647887382, 2.0])
def test_a_float_lr_reaches_the_kernel_exactly(lr):
    """A float lr travels as its float64 bits (whatever their size): kernel == PyTorch path
    (in float32 storage, where an ulp of a scalar shows in the parameters)."""
    kwargs = {"lr": lr, "weight_decay": 0.1}
    fused, _ = _run(AdamW, kwargs, torch.float32, torch.float32, "rne", "triton", 2)
    torch_path, _ = _run(AdamW, kwargs, torch.float32, torch.float32, "rne", "torch", 2)
    for mine, theirs in zip(fused, torch_path, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))


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
        with pytest.raises(ValueError, match="backend='triton' cannot serve this call"):
            optimizer.step()
    with pytest.raises(ValueError, match="backend"):
        AdamW(_params(torch.float32), backend="cuda")
    buffer = torch.randn(4097, device=DEVICE).to(torch.bfloat16)
    misaligned = buffer[1:].requires_grad_()  # 2 bytes past an allocation
    misaligned.grad = torch.randn(4096, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        AdamW([misaligned], backend="triton").step()


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU default")
def test_auto_takes_the_pytorch_path_for_cpu_parameters(monkeypatch):
    import stochround.kernels.optim as kernels

    def refuse(*args, **kwargs):
        raise AssertionError("the kernel ran for CPU parameters under backend='auto'")

    monkeypatch.setattr(kernels, "fused_step", refuse)
    _run(AdamW, {"lr": 1e-3}, torch.bfloat16, torch.bfloat16, "sr", "auto", 1)


def _steps_from(cls, backend, starts, lr, steps=2):
    """``steps`` steps after one that creates the states, from step counts ``starts``."""
    params, optimizer = _run(cls, {"lr": lr}, torch.bfloat16, torch.bfloat16, "sr", backend, 1)
    for param, start in zip(params, starts, strict=True):
        optimizer.state[param]["step"].fill_(start)
    for step in range(steps):
        for param, grad in zip(params, _gradients(1 + step, torch.bfloat16), strict=True):
            param.grad = grad
        optimizer.step()
    return params, optimizer


@pytest.mark.parametrize("cls", [AdamW, Adam, SGD, Lion])
def test_kernel_scalars_equal_the_pytorch_path_at_any_step(cls):
    """Each parameter of one launch has its own step count (the bias correction's b^t
    from its bits, the stream from its value) and a tensor lr: kernel == PyTorch path."""
    starts = (2**32 - 3, 10**9 + 7, 12345, 1)
    lr = torch.tensor(3e-3, dtype=torch.float32, device=DEVICE)
    fused, fused_optimizer = _steps_from(cls, "triton", starts, lr)
    torch_path, torch_optimizer = _steps_from(cls, "torch", starts, lr.clone())
    for mine, theirs, start in zip(fused, torch_path, starts, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))
        for name, value in fused_optimizer.state[mine].items():
            assert torch.equal(value, torch_optimizer.state[theirs][name]), name
        assert int(fused_optimizer.state[mine]["step"]) == start + 2


@pytest.mark.parametrize("scheduler", [True, False])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_compiled_step_follows_lr_without_recompiling(backend, scheduler):
    """lr as a tensor and the step counts as tensors: the compiled step compiles once (after
    the step that creates the states) while lr moves, and stores the bits of the eager
    step.  lr moved by a scheduler (which wraps ``step`` in a function torch.compile
    skips, so the step compiles in pieces), or filled by hand: then the step compiles as
    one graph (``fullgraph=True``: the fused launch is one custom op)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    runs = []
    for compiled in (True, False):
        params = _params(torch.bfloat16)
        lr = torch.tensor(1e-2, device=DEVICE)
        optimizer = AdamW(params, lr=lr, state_dtype=torch.bfloat16, seed=3, backend=backend)
        if scheduler:
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
        counter = CompileCounter()
        compile_ = functools.partial(torch.compile, backend=counter, fullgraph=not scheduler)
        step = compile_(optimizer.step) if compiled else optimizer.step
        frames = []
        for index in range(5):
            for param, grad in zip(params, _gradients(index, torch.bfloat16), strict=True):
                param.grad = grad
            step()
            if scheduler:
                schedule.step()
            else:
                lr.fill_(1e-2 / (2 + index))
            frames.append(counter.frame_count)
        runs.append((params, frames))
    (compiled_params, frames), (eager_params, _) = runs
    assert frames[1] > 0 and frames[1:] == [frames[1]] * 4
    assert float(lr) == pytest.approx(1e-2 / 6)  # the tensor itself moved
    for compiled_param, eager_param in zip(compiled_params, eager_params, strict=True):
        assert torch.equal(_bits(compiled_param), _bits(eager_param))


def _on_a_side_stream(work) -> None:
    """Run ``work`` on a side stream, ordered after and before the current one (the
    warm-up CUDA graphs ask for before a capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [AdamW, SGD, Lion])
def test_cuda_graph_replays_a_step(cls):
    """A captured step replayed with new gradients and a new lr (tensors) gives the bits of
    eager steps: the step counts, the streams and the bias corrections advance on the
    device."""
    eager_params = _params(torch.bfloat16)
    graph_params = _params(torch.bfloat16)
    kwargs = {"state_dtype": torch.bfloat16, "seed": 9, "backend": "triton"}
    if cls is SGD:
        kwargs["momentum"] = 0.9
    eager = cls(eager_params, lr=torch.tensor(1e-2, device=DEVICE), **kwargs)
    lr = torch.tensor(1e-2, device=DEVICE)
    captured = cls(graph_params, lr=lr, **kwargs)
    for param in graph_params:
        param.grad = torch.zeros_like(param)

    def warm_up() -> None:  # states, tables and kernels exist before the capture
        for step in range(2):
            lr.fill_(1e-2 / (1 + step))
            for param, grad in zip(graph_params, _gradients(step, torch.bfloat16), strict=True):
                param.grad.copy_(grad)
            captured.step()

    _on_a_side_stream(warm_up)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured.step()
    for step in range(6):
        rate = 1e-2 / (1 + step)
        if step >= 2:
            lr.fill_(rate)
            for param, grad in zip(graph_params, _gradients(step, torch.bfloat16), strict=True):
                param.grad.copy_(grad)
            graph.replay()
        eager.param_groups[0]["lr"].fill_(rate)
        for param, grad in zip(eager_params, _gradients(step, torch.bfloat16), strict=True):
            param.grad = grad
        eager.step()
    torch.cuda.synchronize()
    for mine, theirs in zip(graph_params, eager_params, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))
        assert int(captured.state[mine]["step"]) == 6


@pytest.mark.gpu
def test_capturing_a_step_needs_lr_on_the_device():
    """A CPU lr tensor would need a host-to-device copy, which a CUDA graph cannot capture:
    a ValueError that says so, not the driver's capture error."""
    params = _params(torch.bfloat16)
    optimizer = AdamW(params, lr=torch.tensor(1e-2), state_dtype=torch.bfloat16, seed=1)
    for param, grad in zip(params, _gradients(0, torch.bfloat16), strict=True):
        param.grad = grad
    _on_a_side_stream(optimizer.step)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="lr must be a tensor on cuda"), torch.cuda.graph(graph):
        optimizer.step()


@pytest.mark.parametrize("cls", [AdamW, SGD, Lion])
def test_default_state_dtypes_follow_each_parameter_in_one_launch_group(cls):
    """``state_dtype=None``: one group of bf16, fp16 and fp32 parameters keeps each one's
    states in its own dtype; the kernel (asked for by torch's ``fused=True``) launches per
    dtype and stores the PyTorch path's bits (``fused=False``)."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16)
    runs = []
    for fused in (True, False):
        params = [p.to(dtype).detach().requires_grad_()
                  for p, dtype in zip(_params(torch.float32), dtypes, strict=True)]  # fmt: skip
        kwargs = {"momentum": 0.9} if cls is SGD else {}
        optimizer = cls(params, lr=1e-2, seed=4, fused=fused, **kwargs)
        assert optimizer.backend == ("triton" if fused else "torch")
        for step in range(2):
            for param, grad in zip(params, _gradients(step, torch.float32), strict=True):
                param.grad = grad.to(param.dtype)
            optimizer.step()
        runs.append((params, optimizer))
    (fused_params, fused_optimizer), (torch_params, torch_optimizer) = runs
    for mine, theirs, dtype in zip(fused_params, torch_params, dtypes, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))
        for name in cls.state_names:
            state = fused_optimizer.state[mine][name]
            assert state.dtype == dtype
            assert torch.equal(_bits(state), _bits(torch_optimizer.state[theirs][name]))


def test_compiled_fused_step_reads_a_scheduled_float_lr_as_an_input():
    """A float lr that a scheduler moves: the compiled step (the fused launch, as a custom
    op) compiles twice, as torch.optim's does, not once per value, and stores the eager
    step's bits."""
    from torch._dynamo.testing import CompileCounterWithBackend

    runs = []
    for compiled in (True, False):
        torch._dynamo.reset()
        params = _params(torch.bfloat16)
        optimizer = AdamW(params, lr=1e-2, seed=3, backend="triton")
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)
        counter = CompileCounterWithBackend("aot_eager")  # compiles as inductor does
        step = torch.compile(optimizer.step, backend=counter) if compiled else optimizer.step
        for index in range(5):
            for param, grad in zip(params, _gradients(index, torch.bfloat16), strict=True):
                param.grad = grad
            step()
            schedule.step()
        runs.append((params, counter.frame_count))
    (compiled_params, graphs), (eager_params, _) = runs
    assert graphs == 2
    for compiled_param, eager_param in zip(compiled_params, eager_params, strict=True):
        assert torch.equal(_bits(compiled_param), _bits(eager_param))


def _our_python_calls(call) -> int:
    """How many Python functions of stochround (comprehensions included) ``call()`` runs."""
    root = os.path.dirname(stochround.__file__)
    calls = 0

    def profile(frame, event, arg) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [(AdamW, {}), (Adam, {"weight_decay": 0.1}), (SGD, {"momentum": 0.9}), (SGD, {}), (Lion, {})],
)
def test_an_eager_fused_step_runs_no_python_call_per_parameter(cls, kwargs, monkeypatch):
    """Once the states exist, an eager step of a group runs as many Python functions of
    stochround for 40 parameters as for 3: its checks and its launch's table read the
    parameters over lists, so the host time a step adds barely grows with their number.
    (Launches stubbed: the interpreter would run the kernel's programs in Python.)"""
    import stochround.kernels.optim as kernels

    monkeypatch.setattr(kernels, "_launch", lambda *args: None)
    calls = []
    for count in (3, 40):
        params = [
            torch.zeros(8 * (1 + i % 5), dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
            for i in range(count)
        ]
        optimizer = cls(params, lr=1e-2, seed=1, backend="triton", **kwargs)
        for param in params:
            param.grad = torch.ones_like(param)
        optimizer.step()  # creates the states (and the launch's tables)
        optimizer.step()
        calls.append(_our_python_calls(optimizer.step))
    assert calls[0] == calls[1]


@pytest.mark.parametrize("cls", [AdamW, SGD, Lion])
def test_groups_and_missing_gradients_step_as_the_pytorch_path(cls):
    """Two groups, some parameters without a gradient at some steps: each launch finds the
    global index of every parameter (the stream), steps only those with a gradient, and
    stores the PyTorch path's bits; the others keep their values and step counts."""
    kwargs = {"momentum": 0.9} if cls is SGD else {}
    runs = []
    for backend in ("triton", "torch"):
        params = _params(torch.bfloat16)
        groups = [{"params": params[:1]}, {"params": params[1:], "lr": 3e-3}]
        optimizer = cls(groups, lr=1e-2, seed=11, backend=backend, **kwargs)
        for step in range(4):
            for index, (param, grad) in enumerate(
                zip(params, _gradients(step, torch.bfloat16), strict=True)
            ):
                param.grad = None if (index + step) % 3 == 0 else grad
            optimizer.step()
        runs.append((params, optimizer))
    (fused, fused_optimizer), (torch_path, torch_optimizer) = runs
    for mine, theirs in zip(fused, torch_path, strict=True):
        assert torch.equal(_bits(mine), _bits(theirs))
        mine_state, their_state = fused_optimizer.state[mine], torch_optimizer.state[theirs]
        assert mine_state.keys() == their_state.keys()
        for name, value in mine_state.items():
            assert torch.equal(_bits(value), _bits(their_state[name])), name
    # no gradient: parameter 0 at steps 0 and 3, 1 at step 2, 2 at step 1, 3 at 0 and 3
    steps = [int(fused_optimizer.state[param]["step"]) for param in fused]
    assert steps == [2, 3, 3, 2]


def test_a_gradient_the_kernel_cannot_take_after_the_first_step():
    """The group's one-launch path checks every step what the kernel needs: a gradient
    that is not contiguous, or a parameter moved off a 16-byte boundary, after the states
    exist raises under backend="triton", as at the first step."""
    params = _params(torch.bfloat16)
    optimizer = AdamW(params, lr=1e-2, seed=2, backend="triton")
    for param, grad in zip(params, _gradients(0, torch.bfloat16), strict=True):
        param.grad = grad
    optimizer.step()
    params[2].grad = torch.zeros(33, 70, dtype=torch.bfloat16, device=DEVICE).T
    with pytest.raises(ValueError, match="must be contiguous"):
        optimizer.step()
    params[2].grad = torch.zeros_like(params[2])
    buffer = torch.zeros(params[0].numel() + 1, dtype=torch.bfloat16, device=DEVICE)
    params[0].data = buffer[1:]  # 2 bytes past an allocation
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        optimizer.step()


def test_a_compiled_fused_step_warns_nothing_from_stochround():
    """torch.compile warns about lru_cache-wrapped functions in the code it traces: the
    compiled step's own code has none (the kernels' availability check included)."""
    torch._dynamo.reset()
    params = _params(torch.bfloat16)
    optimizer = AdamW(params, lr=1e-2, seed=3, backend="triton")
    step = torch.compile(optimizer.step, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index in range(2):
            for param, grad in zip(params, _gradients(index, torch.bfloat16), strict=True):
                param.grad = grad
            step()
    ours = [w for w in caught if "lru_cache" in str(w.message) or "stochround" in w.filename]
    assert not ours, [str(w.message) for w in ours]
