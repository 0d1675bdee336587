"""stochround.optim: SR optimizers (the PyTorch path)."""

from __future__ import annotations

import copy

import pytest
import torch

import stochround as sr
from stochround.optim import SGD, AdamW, stream_offset


@pytest.fixture(autouse=True)
def one_thread():
    # the tensors are tiny: thread start-up costs more than the work on a shared 2-core box
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_params(dtype, seed=0, shapes=((7, 5), (5,), (3, 7))):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator).to(dtype).requires_grad_() for s in shapes]


def set_grads(params, step, dtype=None):
    generator = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator).to(dtype or p.dtype)


CONFIGS = [
    (AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.8, 0.99), "maximize": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2}),
]


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CONFIGS)
def test_fp32_matches_torch_bit_for_bit(ours, theirs, kwargs):
    # same operation order as torch's single-tensor path, so identical, not just close
    mine, reference = make_params(torch.float32), make_params(torch.float32)
    opt = ours(mine, rounding="rne", **kwargs)
    ref = theirs(reference, foreach=False, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, 5, gamma=0.5)
    for step in range(20):
        set_grads(mine, step)
        set_grads(reference, step)
        opt.step()
        ref.step()
        sched.step()
        ref_sched.step()
        for a, b in zip(mine, reference, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    name = "exp_avg" if ours is AdamW else "momentum_buffer"
    if name in ref.state[reference[0]]:
        assert torch.equal(opt.state[mine[0]][name], ref.state[reference[0]][name])
    opt.zero_grad()
    assert all(p.grad is None for p in mine)


def fp32_update(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, wd):
    """One AdamW step (step 1) in float32, torch's order."""
    value = param.float() * (1 - lr * wd)
    m = exp_avg.float().lerp(grad.float(), 1 - beta1)
    v = exp_avg_sq.float().mul(beta2).addcmul_(grad.float(), grad.float(), value=1 - beta2)
    denom = (v.sqrt() / (1 - beta2) ** 0.5).add_(eps)
    return value.addcdiv_(m, denom, value=-lr / (1 - beta1)), m, v


def one_bf16_step(rounding, seed, n=2048):
    generator = torch.Generator().manual_seed(5)
    param = torch.randn(n, generator=generator).to(torch.bfloat16).requires_grad_()
    param.grad = torch.randn(n, generator=generator).to(torch.bfloat16)
    opt = AdamW([param], lr=1e-2, weight_decay=0.1, state_dtype=torch.bfloat16,
                rounding=rounding, seed=seed)  # fmt: skip
    before = param.detach().clone()
    opt.step()
    state = opt.state[param]
    return before, param, state


def test_bf16_rne_is_deterministic_round_to_nearest():
    before, param, state = one_bf16_step("rne", seed=1)
    zeros = torch.zeros_like(before)
    value, m, v = fp32_update(before, param.grad, zeros, zeros, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    for stored, exact in ((param, value), (state["exp_avg"], m), (state["exp_avg_sq"], v)):
        assert stored.dtype == torch.bfloat16
        assert torch.equal(stored.detach(), exact.to(torch.bfloat16))
        assert torch.equal(stored.detach(), sr.cast(exact, torch.bfloat16, "rne"))
    _, param_again, _ = one_bf16_step("rne", seed=2)
    assert torch.equal(param.detach(), param_again.detach())


def test_bf16_sr_is_unbiased_and_seed_dependent():
    seeds = range(40)
    before, first, _ = one_bf16_step("sr", seed=0)
    zeros = torch.zeros_like(before)
    exact = fp32_update(before, first.grad, zeros, zeros, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    names = ("param", "exp_avg", "exp_avg_sq")
    sums = {name: torch.zeros(before.shape, dtype=torch.float64) for name in names}
    stored_params = []
    for seed in seeds:
        _, param, state = one_bf16_step("sr", seed=seed)
        stored_params.append(param.detach().clone())
        tensors = (param.detach(), state["exp_avg"], state["exp_avg_sq"])
        for name, stored, value in zip(names, tensors, exact, strict=True):
            assert stored.dtype == torch.bfloat16
            low = sr.cast(value, torch.bfloat16, "rd").float()
            high = sr.cast(value, torch.bfloat16, "ru").float()
            assert bool(((stored.float() == low) | (stored.float() == high)).all())
            sums[name] += stored.double() - value.double()
    assert not torch.equal(stored_params[0], stored_params[1])
    for name, value in zip(names, exact, strict=True):
        low = sr.cast(value, torch.bfloat16, "rd").double()
        high = sr.cast(value, torch.bfloat16, "ru").double()
        # Bernoulli between the neighbours: variance (high - x)(x - low) per draw
        variance = ((high - value.double()) * (value.double() - low)).sum() * len(seeds)
        assert variance > 0
        z = float(sums[name].sum() / variance.sqrt())
        assert abs(z) < 5, (name, z)


def train_steps(opt, params, steps, start):
    for step in range(start, start + steps):
        opt.zero_grad()
        set_grads(params, step, torch.bfloat16)
        opt.step()


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [(AdamW, {"lr": 1e-2}), (SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True})],
)
def test_checkpoint_resumes_bit_for_bit(cls, kwargs):
    def build():
        params = make_params(torch.bfloat16)
        opt = cls(params, state_dtype=torch.bfloat16, rounding="sr", seed=123, **kwargs)
        return params, opt

    straight, straight_opt = build()
    train_steps(straight_opt, straight, 10, 0)

    first, first_opt = build()
    train_steps(first_opt, first, 5, 0)
    checkpoint = copy.deepcopy(
        {"model": [p.detach() for p in first], "opt": first_opt.state_dict()}
    )
    resumed, resumed_opt = build()
    resumed_opt.param_groups[0]["seed"] = 999  # the checkpoint's seed must win
    with torch.no_grad():
        for p, saved in zip(resumed, checkpoint["model"], strict=True):
            p.copy_(saved)
    resumed_opt.load_state_dict(checkpoint["opt"])
    for p in resumed:
        for name, tensor in resumed_opt.state[p].items():
            if name != "step":
                assert tensor.dtype == torch.bfloat16
    train_steps(resumed_opt, resumed, 5, 5)
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a.detach().view(torch.int16), b.detach().view(torch.int16))


def test_fp32_states_survive_checkpoint_with_bf16_params():
    params = make_params(torch.bfloat16)
    opt = AdamW(params, state_dtype=torch.float32, seed=1)
    train_steps(opt, params, 2, 0)
    fresh = AdamW(make_params(torch.bfloat16), state_dtype=torch.float32)
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    for p, q in zip(params, fresh.param_groups[0]["params"], strict=True):
        assert fresh.state[q]["exp_avg"].dtype == torch.float32
        assert torch.equal(fresh.state[q]["exp_avg"], opt.state[p]["exp_avg"])


def test_stream_offsets_are_disjoint():
    offsets = {stream_offset(step, index, slot)
               for step in range(1, 4) for index in range(5) for slot in range(4)}  # fmt: skip
    assert len(offsets) == 3 * 5 * 4
    with pytest.raises(ValueError, match="param_index"):
        stream_offset(1, 2**30, 0)


def test_bytes_per_param():
    assert AdamW(make_params(torch.float32)).bytes_per_param() == 12
    assert AdamW(make_params(torch.bfloat16), state_dtype=torch.bfloat16).bytes_per_param() == 6
    assert SGD(make_params(torch.bfloat16)).bytes_per_param() == 2
    sgd = SGD(make_params(torch.float16), momentum=0.9, state_dtype=torch.float16)
    assert sgd.bytes_per_param() == 4


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "match"),
    [
        (AdamW, {"lr": -1.0}, ValueError, "lr"),
        (AdamW, {"lr": "fast"}, TypeError, "lr"),
        (AdamW, {"betas": (0.9, 1.0)}, ValueError, r"betas\[1\]"),
        (AdamW, {"betas": 0.9}, ValueError, "betas"),
        (AdamW, {"eps": float("nan")}, ValueError, "eps"),
        (AdamW, {"weight_decay": -0.1}, ValueError, "weight_decay"),
        (AdamW, {"rounding": "rz"}, ValueError, "rounding"),
        (AdamW, {"state_dtype": torch.float64}, ValueError, "state_dtype"),
        (AdamW, {"state_dtype": "bf16"}, TypeError, "state_dtype"),
        (AdamW, {"seed": -1}, ValueError, "seed"),
        (SGD, {"momentum": -0.5}, ValueError, "momentum"),
        (SGD, {"nesterov": True}, ValueError, "nesterov"),
    ],
)
def test_invalid_arguments(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(make_params(torch.float32), **kwargs)


def test_unsupported_param_dtype_and_sparse_gradients():
    with pytest.raises(TypeError, match="params"):
        AdamW([torch.zeros(3, dtype=torch.float64, requires_grad=True)])
    param = torch.zeros(4, requires_grad=True)
    opt = SGD([param], lr=0.1)
    param.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def teacher_student_loss(dtype, rounding, steps=400, lr=2e-2, hidden=32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=generator)
    teacher1 = torch.randn(8, hidden, generator=generator) / 8**0.5
    teacher2 = torch.randn(hidden, 1, generator=generator) / hidden**0.5
    y = torch.tanh(x @ teacher1) @ teacher2
    w1 = (torch.randn(8, hidden, generator=generator) / 8**0.5).to(dtype).requires_grad_()
    w2 = (torch.randn(hidden, 1, generator=generator) / hidden**0.5).to(dtype).requires_grad_()
    opt = AdamW([w1, w2], lr=lr, weight_decay=0.0, state_dtype=dtype, rounding=rounding, seed=0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)

    def loss():
        return ((torch.tanh(x @ w1.float()) @ w2.float() - y) ** 2).mean()

    for _ in range(steps):
        opt.zero_grad()
        loss().backward()
        opt.step()
        schedule.step()
    with torch.no_grad():
        return float(loss())


def test_teacher_student_sr_matches_fp32_and_beats_rne():
    fp32 = teacher_student_loss(torch.float32, "rne")
    bf16_sr = teacher_student_loss(torch.bfloat16, "sr")
    bf16_rne = teacher_student_loss(torch.bfloat16, "rne")
    # measured: fp32 0.00214, bf16 sr 0.00220, bf16 rne 0.00425
    assert bf16_sr < 2 * fp32
    assert bf16_sr < 0.7 * bf16_rne
