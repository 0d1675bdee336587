"""stochround.optim as a drop-in for torch.optim: the default seed draws nothing from torch's
generator, states default to the parameter's dtype, torch checkpoints migrate, torch's
keywords are accepted (or refused with a reason), and a scheduled float lr compiles no more
graphs than torch.optim's."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from stochround.optim import SGD, Adam, AdamW, Lion
from stochround.optim.updates import adamw_scalars, adamw_update


@pytest.fixture(autouse=True)
def one_thread():
    # the tensors are tiny: thread start-up costs more than the work on a shared 2-core box
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SHAPES = ((7, 5), (5,), (3, 7))


def make_params(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator).to(dtype).requires_grad_() for s in SHAPES]


def set_grads(params, step):
    generator = torch.Generator().manual_seed(1000 + step)
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator).to(param.dtype)


def bits(tensor):
    width = {2: torch.int16, 4: torch.int32}[tensor.element_size()]
    return tensor.detach().view(width)


ALL = (AdamW, Adam, SGD, Lion)


# --- the default seed --------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_the_default_seed_draws_nothing_from_the_global_generator(cls):
    """Building an optimizer with ``seed=None`` leaves torch's generator where it was: the
    user's next draws (data order, dropout) are those they would get with torch.optim."""
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    state = torch.get_rng_state()
    cls(make_params(torch.bfloat16))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(4), expected)


def test_the_default_seed_is_reproducible_under_manual_seed():
    def seed_after(manual_seed, draws=0):
        torch.manual_seed(manual_seed)
        torch.rand(draws)
        return AdamW(make_params(torch.bfloat16)).param_groups[0]["seed"]

    assert seed_after(3) == seed_after(3)
    assert seed_after(3, draws=10) == seed_after(3, draws=10)
    assert len({seed_after(3), seed_after(4), seed_after(3, draws=10)}) == 3
    torch.manual_seed(3)
    groups = [{"params": make_params(torch.bfloat16)}, {"params": make_params(torch.float32)}]
    optimizer = AdamW(groups)  # one default seed per optimizer, shared by its groups
    assert [group["seed"] for group in optimizer.param_groups] == [seed_after(3)] * 2
    assert 0 <= seed_after(3) < 2**64


# --- state_dtype defaults to the parameter's dtype ---------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_state_dtype_defaults_to_each_parameters_dtype(cls):
    assert inspect.signature(cls).parameters["state_dtype"].default is None
    groups = [
        {"params": make_params(torch.bfloat16)},
        {"params": make_params(torch.float16)},
        {"params": make_params(torch.float32)},
        {"params": make_params(torch.bfloat16), "state_dtype": torch.float32},
        {"params": make_params(torch.bfloat16), "master_weights": True},
    ]
    expected = (torch.bfloat16, torch.float16, torch.float32, torch.float32, torch.float32)
    kwargs = {"momentum": 0.9} if cls is SGD else {}
    optimizer = cls(groups, lr=1e-3, seed=0, **kwargs)
    for step in range(2):  # SGD's buffer is created by the first step
        for group in optimizer.param_groups:
            set_grads(group["params"], step)
        optimizer.step()
    names = cls.state_names
    for group, dtype in zip(optimizer.param_groups, expected, strict=True):
        assert group["state_dtype"] in (None, torch.float32)
        for param in group["params"]:
            assert [optimizer.state[param][name].dtype for name in names] == [dtype] * len(names)


def test_bf16_parameters_give_the_small_optimizers_without_a_flag():
    assert AdamW(make_params(torch.bfloat16)).bytes_per_param() == 6
    assert Adam(make_params(torch.float16)).bytes_per_param() == 6
    assert SGD(make_params(torch.bfloat16), momentum=0.9).bytes_per_param() == 4
    assert Lion(make_params(torch.bfloat16)).bytes_per_param() == 4
    assert AdamW(make_params(torch.float32)).bytes_per_param() == 12
    assert AdamW(make_params(torch.bfloat16), master_weights=True).bytes_per_param() == 14
    mixed = AdamW([*make_params(torch.bfloat16), *make_params(torch.float32)])
    assert mixed.bytes_per_param() == (6 + 12) / 2


# --- torch.optim checkpoints -------------------------------------------------------------

PAIRS = [
    (AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}),
]


def torch_run(theirs, kwargs, dtype, steps, **options):
    params = make_params(dtype)
    optimizer = theirs(params, **kwargs, **options)
    for step in range(steps):
        set_grads(params, step)
        optimizer.step()
    return params, optimizer


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), PAIRS)
def test_a_torch_checkpoint_continues_in_ours(ours, theirs, kwargs):
    """fp32: torch's moments and step count are taken as they are, so the next steps agree
    with torch's own continuation to within float32 rounding; the keys torch lacks come
    from the constructor."""
    reference, reference_optimizer = torch_run(theirs, kwargs, torch.float32, 5, foreach=False)
    checkpoint = copy.deepcopy(reference_optimizer.state_dict())
    params = [p.detach().clone().requires_grad_() for p in reference]
    optimizer = ours(params, rounding="rne", seed=11, **kwargs)
    optimizer.load_state_dict(checkpoint)
    group = optimizer.param_groups[0]
    assert (group["rounding"], group["seed"], group["state_dtype"]) == ("rne", 11, None)
    for key in ("foreach", "fused", "capturable", "differentiable"):
        assert key not in group
    for mine, theirs_param in zip(params, reference, strict=True):
        state = optimizer.state[mine]
        for name, value in reference_optimizer.state[theirs_param].items():
            if name == "step":
                assert state["step"].dtype == torch.int64 and int(state["step"]) == 5
            else:
                assert torch.equal(state[name], value) and state[name] is not value
    for step in range(5, 15):
        set_grads(params, step)
        set_grads(reference, step)
        optimizer.step()
        reference_optimizer.step()
        for mine, theirs_param in zip(params, reference, strict=True):
            torch.testing.assert_close(mine, theirs_param, rtol=2**-17, atol=2**-24)


@pytest.mark.parametrize("state_dtype", [None, torch.float32])
def test_a_torch_bf16_checkpoint_continues_from_the_same_moments(state_dtype):
    """bf16 parameters (torch keeps their states in bf16): the states load cast to the
    state dtype (exactly: bf16 into bf16 or float32) and the next step is AdamW's update at
    step 4 from them, rounded to nearest."""
    reference, reference_optimizer = torch_run(
        torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}, torch.bfloat16, 3
    )
    params = [p.detach().clone().requires_grad_() for p in reference]
    optimizer = AdamW(params, lr=1e-2, weight_decay=0.1, rounding="rne", state_dtype=state_dtype)
    optimizer.load_state_dict(copy.deepcopy(reference_optimizer.state_dict()))
    dtype = state_dtype or torch.bfloat16
    scalars = adamw_scalars(1e-2, (0.9, 0.999), 1e-8, 0.1, torch.tensor([4]))[0]
    expected = []
    set_grads(params, 3)
    for param, theirs in zip(params, reference, strict=True):
        saved = reference_optimizer.state[theirs]
        state = optimizer.state[param]
        for name in ("exp_avg", "exp_avg_sq"):
            assert state[name].dtype == dtype
            assert torch.equal(state[name], saved[name].to(dtype))
        value, *_ = adamw_update(
            param.detach().float(),
            param.grad.float(),
            state["exp_avg"].float(),
            state["exp_avg_sq"].float(),
            scalars,
        )
        expected.append(value.to(torch.bfloat16))
    optimizer.step()
    for param, value in zip(params, expected, strict=True):
        assert int(optimizer.state[param]["step"]) == 4
        assert torch.equal(bits(param), bits(value))


def test_fp32_states_of_a_torch_checkpoint_are_cast_to_nearest():
    """A checkpoint of float32 training loaded for bf16 parameters: each state is rounded
    once to nearest even into bf16 (the default state dtype)."""
    reference, reference_optimizer = torch_run(torch.optim.AdamW, {"lr": 1e-2}, torch.float32, 3)
    params = [p.detach().to(torch.bfloat16).requires_grad_() for p in reference]
    optimizer = AdamW(params, lr=1e-2)
    optimizer.load_state_dict(copy.deepcopy(reference_optimizer.state_dict()))
    for param, theirs in zip(params, reference, strict=True):
        for name in ("exp_avg", "exp_avg_sq"):
            saved = reference_optimizer.state[theirs][name]
            assert torch.equal(bits(optimizer.state[param][name]), bits(saved.to(torch.bfloat16)))
    set_grads(params, 3)
    optimizer.step()


def test_checkpoints_that_cannot_continue_fail_at_load_and_change_nothing():
    cases = [
        (torch_run(torch.optim.AdamW, {"amsgrad": True}, torch.float32, 2)[1], "amsgrad"),
        (torch_run(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, torch.float32, 2)[1],
         "momentum_buffer"),
    ]  # fmt: skip
    for theirs, match in cases:
        params = make_params(torch.float32)
        optimizer = AdamW(params, lr=1e-3, seed=5)
        before = copy.deepcopy(optimizer.state_dict())
        with pytest.raises(ValueError, match=match):
            optimizer.load_state_dict(copy.deepcopy(theirs.state_dict()))
        assert optimizer.state_dict() == before
    two_groups = AdamW(
        [{"params": make_params(torch.float32)}, {"params": make_params(torch.float32)}]
    )
    with pytest.raises(ValueError, match="parameter groups"):
        AdamW(make_params(torch.float32)).load_state_dict(two_groups.state_dict())


def test_a_torch_adam_checkpoint_loads_into_adamw_as_in_torch():
    """torch.optim.AdamW sets decoupled_weight_decay on every group it loads; so does ours."""
    _, theirs = torch_run(torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}, torch.float32, 2)
    optimizer = AdamW(make_params(torch.float32))
    optimizer.load_state_dict(theirs.state_dict())
    assert optimizer.param_groups[0]["decoupled_weight_decay"] is True


def test_our_checkpoint_loads_into_torch_optim():
    """The reverse direction: torch.optim.AdamW takes our state_dict (int64 step counts,
    states in float32 here) and continues as ours does."""
    params = make_params(torch.float32)
    optimizer = AdamW(params, lr=1e-2, weight_decay=0.1, rounding="rne", seed=1)
    for step in range(3):
        set_grads(params, step)
        optimizer.step()
    reference = [p.detach().clone().requires_grad_() for p in params]
    theirs = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.1, foreach=False)
    theirs.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for step in range(3, 8):
        set_grads(params, step)
        set_grads(reference, step)
        optimizer.step()
        theirs.step()
        for mine, other in zip(params, reference, strict=True):
            torch.testing.assert_close(mine, other, rtol=2**-17, atol=2**-24)


# --- torch.optim's keywords --------------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(AdamW, torch.optim.AdamW), (Adam, torch.optim.Adam), (SGD, torch.optim.SGD)],
)
def test_every_torch_keyword_is_a_keyword_here(ours, theirs):
    torch_parameters = inspect.signature(theirs).parameters
    our_parameters = inspect.signature(ours).parameters
    for name, parameter in torch_parameters.items():
        assert name in our_parameters, name
        assert our_parameters[name].kind == parameter.kind, name
    positional = [n for n, p in torch_parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert list(our_parameters)[: len(positional)] == positional


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize(
    "options",
    [
        {"foreach": True},
        {"foreach": False},
        {"capturable": True},
        {"differentiable": False},
        {"fused": False},
        {"fused": None, "foreach": None, "capturable": False},
    ],
)
def test_torch_keywords_that_change_nothing_give_the_same_bits(cls, options):
    def run(**extra):
        params = make_params(torch.bfloat16)
        optimizer = cls(params, lr=1e-2, seed=3, **extra)
        for step in range(3):
            set_grads(params, step)
            optimizer.step()
        return params, optimizer

    plain, _ = run()
    params, optimizer = run(**options)
    assert optimizer.backend == ("torch" if options.get("fused") is False else "auto")
    for mine, theirs in zip(params, plain, strict=True):
        assert torch.equal(bits(mine), bits(theirs))


@pytest.mark.parametrize("cls", ALL)
def test_fused_true_asks_for_the_kernel(cls, monkeypatch):
    """fused=True is backend="triton" (here in Triton's interpreter); a parameter the
    kernel can never update raises when the optimizer is built, as torch's fused=True does."""
    import stochround.kernels.availability as availability

    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernels run
    params = [p.detach().to(device).requires_grad_() for p in make_params(torch.bfloat16)]
    assert cls(params, fused=True).backend == "triton"
    with pytest.raises(ValueError, match=r"fused=True cannot update.*extra parameter state"):
        cls(params, fused=True, master_weights=True)
    monkeypatch.setattr(availability, "INTERPRETED", False)  # CPU tensors, no interpreter
    with pytest.raises(ValueError, match=r"fused=True cannot update.*not a CUDA tensor"):
        cls(make_params(torch.bfloat16), fused=True)


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "match"),
    [
        (AdamW, {"amsgrad": True}, ValueError, "amsgrad=True is not supported"),
        (Adam, {"amsgrad": True}, ValueError, "amsgrad=True is not supported"),
        (AdamW, {"amsgrad": 1}, TypeError, "amsgrad must be a bool"),
        (SGD, {"differentiable": True}, ValueError, "differentiable=True is not supported"),
        (Lion, {"foreach": True, "fused": True}, ValueError, "cannot be set together"),
        (AdamW, {"fused": True, "backend": "torch"}, ValueError, "fused=True asks for"),
        (AdamW, {"fused": False, "backend": "triton"}, ValueError, "fused=False asks for"),
        (Adam, {"foreach": "yes"}, TypeError, "foreach must be a bool or None"),
        (Lion, {"capturable": None}, TypeError, "capturable must be a bool"),
        (Adam, {"decoupled_weight_decay": 1}, TypeError, "decoupled_weight_decay must be a bool"),
    ],
)
def test_torch_keywords_refused_with_a_reason(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(make_params(torch.float32), **kwargs)


def test_implementation_keywords_are_not_group_options():
    with pytest.raises(ValueError, match="fused is an option of the whole optimizer"):
        AdamW([{"params": make_params(torch.float32), "fused": True}])


def test_a_copied_or_pickled_optimizer_keeps_its_options_and_steps_alike():
    """torch's pickled state holds the groups and states only; ours adds the backend (from
    ``fused``) and the default seed, so a deep copy steps as the original does."""
    import pickle

    params = make_params(torch.bfloat16)
    optimizer = AdamW(params, lr=1e-2, fused=False)
    set_grads(params, 0)
    optimizer.step()
    for copied in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert copied.backend == "torch"
        assert copied.default_seed() == optimizer.default_seed()
        twins = [p for group in copied.param_groups for p in group["params"]]
        set_grads(twins, 1)
        copied.step()
    set_grads(params, 1)
    optimizer.step()
    for mine, twin in zip(params, twins, strict=True):
        assert torch.equal(bits(mine), bits(twin))


def test_adam_with_decoupled_weight_decay_is_adamw():
    runs = []
    for cls, options in ((Adam, {"decoupled_weight_decay": True}), (AdamW, {})):
        params = make_params(torch.bfloat16)
        optimizer = cls(params, lr=1e-2, weight_decay=0.1, seed=2, **options)
        for step in range(3):
            set_grads(params, step)
            optimizer.step()
        runs.append(params)
    for mine, theirs in zip(*runs, strict=True):
        assert torch.equal(bits(mine), bits(theirs))


# --- torch.compile with a scheduled float lr ---------------------------------------------


def compiled_run(make, steps=20):
    """``steps`` compiled steps of a small model, lr moved by a scheduler every 2 steps: the
    graphs compiled and the final parameters."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = make(model.parameters())
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.7)
    counter = CompileCounterWithBackend("aot_eager")  # specializes floats as inductor does
    step = torch.compile(optimizer.step, backend=counter)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).square().sum().backward()
        step()
        schedule.step()
        optimizer.zero_grad()
    return counter.frame_count, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [
        (AdamW, torch.optim.AdamW, {"lr": 1e-2}),
        (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
        (Lion, None, {"lr": 1e-3}),
    ],
)
def test_a_scheduled_float_lr_compiles_no_more_graphs_than_torch_optim(ours, theirs, kwargs):
    """torch.optim compiles AdamW's step twice (the second time reading lr as an input; its
    SGD recompiles at every change here); ours twice, SGD three times (its momentum
    buffer's first step is one more graph), where baking the float in recompiled at every
    change and fell back to eager after 8.  The compiled steps store the eager steps'
    bits."""
    graphs, compiled = compiled_run(lambda p: ours(p, seed=0, **kwargs))
    torch_graphs = compiled_run(lambda p: theirs(p, **kwargs))[0] if theirs else 2
    assert graphs <= torch_graphs
    assert graphs == (3 if ours is SGD else 2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = ours(model.parameters(), seed=0, **kwargs)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.7)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(20):
        model(x).square().sum().backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    for mine, eager in zip(compiled, model.parameters(), strict=True):
        assert torch.equal(mine, eager.detach())
