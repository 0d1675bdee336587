"""stochround.optim: SR optimizers (the PyTorch path)."""

from __future__ import annotations

import copy

import pytest
import torch

import stochround as sr
from stochround import cpu_path
from stochround.optim import SGD, Adam, AdamW, Lion, state_stream_offset
from stochround.optim.encodings import ecc_decode, ecc_encode, param_ulp


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
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "betas": (0.8, 0.99), "maximize": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2}),
]


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CONFIGS)
def test_fp32_matches_torch_within_float32_rounding(ours, theirs, kwargs):
    # torch's single-tensor update, one rounding per operation where torch's CPU kernels
    # fuse multiply-adds (stochround.optim.updates): a few ulps apart after 20 steps
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
            torch.testing.assert_close(a, b, rtol=2**-17, atol=2**-24)
    name = "momentum_buffer" if ours is SGD else "exp_avg"
    if name in ref.state[reference[0]]:
        ours_state, torch_state = opt.state[mine[0]][name], ref.state[reference[0]][name]
        torch.testing.assert_close(ours_state, torch_state, rtol=2**-17, atol=2**-24)
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


EXTRA_STATE_DTYPES = {"master": torch.float32, "compensation": torch.bfloat16,
                      "ecc_residual": torch.int8}  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (AdamW, {"lr": 1e-2}),
        (Adam, {"lr": 1e-2, "weight_decay": 0.1}),
        (SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
        (Lion, {"lr": 1e-3, "weight_decay": 0.1}),
        (AdamW, {"lr": 1e-2, "master_weights": True}),
        (Lion, {"lr": 1e-3, "master_weights": True}),
        (AdamW, {"lr": 1e-2, "rounding": "kahan"}),
        (SGD, {"lr": 1e-2, "momentum": 0.9, "rounding": "kahan"}),
        (AdamW, {"lr": 1e-2, "rounding": "ecc"}),
        (Lion, {"lr": 1e-3, "rounding": "ecc"}),
    ],
)
def test_checkpoint_resumes_bit_for_bit(cls, kwargs):
    def build():
        params = make_params(torch.bfloat16)
        opt = cls(params, state_dtype=torch.bfloat16, seed=123, **{"rounding": "sr", **kwargs})
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
                assert tensor.dtype == EXTRA_STATE_DTYPES.get(name, torch.bfloat16), name
    train_steps(resumed_opt, resumed, 5, 5)
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a.detach().view(torch.int16), b.detach().view(torch.int16))
    for a, b in zip(straight, resumed, strict=True):
        for name, value in straight_opt.state[a].items():
            if name == "step":
                assert int(value) == int(resumed_opt.state[b][name]) == 10
            else:
                assert torch.equal(value, resumed_opt.state[b][name]), name


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
    offsets = {state_stream_offset(step, index, slot)
               for step in range(1, 4) for index in range(5) for slot in range(4)}  # fmt: skip
    assert len(offsets) == 3 * 5 * 4
    with pytest.raises(ValueError, match="param_index"):
        state_stream_offset(1, 2**30, 0)


def test_set_param_indices_draws_the_words_of_those_positions():
    """A parameter given stream index k draws the words the parameter at position k of a
    larger optimizer draws (the pipeline stages' numbering rests on it), survives a deep
    copy, and bad numberings raise."""
    torch.manual_seed(0)
    values = [torch.randn(8, 4).bfloat16() for _ in range(3)]
    grads = [torch.randn(8, 4).bfloat16() for _ in range(3)]
    whole = [torch.nn.Parameter(v.clone()) for v in values]
    part = [torch.nn.Parameter(v.clone()) for v in values[1:]]
    full, stage = AdamW(whole, lr=1e-2, seed=3), AdamW(part, lr=1e-2, seed=3)
    stage.set_param_indices([1, 2])
    stage = copy.deepcopy(stage)
    part = stage.param_groups[0]["params"]
    for _ in range(2):
        for params, offset in ((whole, 0), (part, 1)):
            for i, param in enumerate(params, offset):
                param.grad = grads[i].clone()
        full.step()
        stage.step()
    assert all(torch.equal(p, q) for p, q in zip(whole[1:], part, strict=True))
    for indices, error in (([1], ValueError), ([1, 1], ValueError), ([0, 2**30], ValueError),
                           ([0, 1.0], TypeError), (5, TypeError)):  # fmt: skip
        with pytest.raises(error, match="indices"):
            stage.set_param_indices(indices)
    with pytest.raises(ValueError, match="set_param_indices"):
        stage.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})


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
        (Adam, {"weight_decay": -0.1}, ValueError, "weight_decay"),
        (Adam, {"betas": (1.5, 0.9)}, ValueError, r"betas\[0\]"),
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


# --- Lion ------------------------------------------------------------------------------


def lion_reference(params, grads_per_step, lr, betas, wd, maximize=False):
    """Plain fp32 Lion, written out one rounding per operation: p (1 - lr wd) - sign(m b1 +
    g (1 - b1)) lr; m = m b2 + g (1 - b2). The parameters after each step and the final m."""
    params = [p.detach().float().clone() for p in params]
    moments = [torch.zeros_like(p) for p in params]
    history = []
    for grads in grads_per_step:
        for p, m, g in zip(params, moments, grads, strict=True):
            g = -g.float() if maximize else g.float()
            p.copy_(p * (1 - lr * wd) - (m * betas[0] + g * (1 - betas[0])).sign() * lr)
            m.copy_(m * betas[1] + g * (1 - betas[1]))
        history.append([p.clone() for p in params])
    return history, moments


def grads_for(params, step, dtype=None):
    generator = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=generator).to(dtype or p.dtype) for p in params]


@pytest.mark.parametrize(
    "kwargs", [{"weight_decay": 0.1}, {"betas": (0.8, 0.95), "maximize": True}]
)
def test_lion_fp32_matches_reference_bit_for_bit(kwargs):
    params = make_params(torch.float32)
    lr, betas = 1e-2, kwargs.get("betas", (0.9, 0.99))
    opt = Lion(params, lr=lr, rounding="rne", **kwargs)
    grads = [grads_for(params, step) for step in range(20)]
    history, moments = lion_reference(
        params, grads, lr, betas, kwargs.get("weight_decay", 0.0), kwargs.get("maximize", False)
    )
    for step in range(20):
        for p, g in zip(params, grads[step], strict=True):
            p.grad = g
        opt.step()
        for a, b in zip(params, history[step], strict=True):
            assert torch.equal(a.detach(), b)
    for p, m in zip(params, moments, strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], m)


def test_lion_bf16_rne_and_sr_unbiased():
    n, lr, wd = 2048, 1e-2, 0.1
    generator = torch.Generator().manual_seed(5)
    start = torch.randn(n, generator=generator).to(torch.bfloat16)
    grad = torch.randn(n, generator=generator).to(torch.bfloat16)
    exact_p = start.float() * (1 - lr * wd) - lr * grad.float().mul(0.1).sign()
    exact_m = grad.float() * (1 - 0.99)  # m = b2 * 0 + (1 - b2) g

    def run(rounding, seed):
        param = start.clone().requires_grad_()
        param.grad = grad.clone()
        opt = Lion([param], lr=lr, weight_decay=wd, state_dtype=torch.bfloat16,
                   rounding=rounding, seed=seed)  # fmt: skip
        opt.step()
        return param.detach(), opt.state[param]["exp_avg"]

    param, m = run("rne", 0)
    assert torch.equal(param, exact_p.to(torch.bfloat16))
    assert torch.equal(m, exact_m.to(torch.bfloat16))
    seeds = range(40)
    sums = [torch.zeros(n, dtype=torch.float64) for _ in range(2)]
    firsts = []
    for seed in seeds:
        stored = run("sr", seed)
        firsts.append(stored[0].clone())
        for total, value, exact in zip(sums, stored, (exact_p, exact_m), strict=True):
            low = sr.cast(exact, torch.bfloat16, "rd").float()
            high = sr.cast(exact, torch.bfloat16, "ru").float()
            assert bool(((value.float() == low) | (value.float() == high)).all())
            total += value.double() - exact.double()
    assert not torch.equal(firsts[0], firsts[1])
    for total, exact in zip(sums, (exact_p, exact_m), strict=True):
        low = sr.cast(exact, torch.bfloat16, "rd").double()
        high = sr.cast(exact, torch.bfloat16, "ru").double()
        variance = ((high - exact.double()) * (exact.double() - low)).sum() * len(seeds)
        assert variance > 0
        assert abs(float(total.sum() / variance.sqrt())) < 5


def test_lion_invalid_arguments_and_bytes():
    with pytest.raises(ValueError, match=r"betas\[0\]"):
        Lion(make_params(torch.float32), betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="weight_decay"):
        Lion(make_params(torch.float32), weight_decay=-1.0)
    with pytest.raises(TypeError, match="lr"):
        Lion(make_params(torch.float32), lr="fast")
    assert Lion(make_params(torch.float32)).bytes_per_param() == 8
    assert Lion(make_params(torch.bfloat16), state_dtype=torch.bfloat16).bytes_per_param() == 4


# --- master weights, kahan, ecc --------------------------------------------------------


@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (Adam, {"lr": 1e-2, "weight_decay": 0.1}),
        (SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}),
        (Lion, {"lr": 1e-3, "weight_decay": 0.1}),
    ],
)
def test_master_weights_are_the_fp32_run(cls, kwargs, rounding):
    # bf16 params + fp32 master + fp32 states, against fp32 params + fp32 states starting
    # from the same (bf16-representable) values with the same (bf16) gradients. Asserted:
    # the master equals the fp32 run's parameter bit for bit at every step, whatever the
    # rounding; the bf16 parameter is rne(master) exactly under "rne", and one of the two
    # bf16 neighbours of the master under "sr".
    mine = make_params(torch.bfloat16)
    reference = [p.detach().float().requires_grad_() for p in mine]
    opt = cls(mine, rounding=rounding, seed=3, master_weights=True, **kwargs)
    ref = cls(reference, rounding="rne", **kwargs)
    for step in range(15):
        set_grads(mine, step, torch.bfloat16)
        for p, q in zip(reference, mine, strict=True):
            p.grad = q.grad.float()
        opt.step()
        ref.step()
        for p, q in zip(mine, reference, strict=True):
            master = opt.state[p]["master"]
            assert master.dtype == torch.float32
            assert torch.equal(master, q.detach())
            if rounding == "rne":
                assert torch.equal(p.detach(), master.to(torch.bfloat16))
            else:
                low = sr.cast(master, torch.bfloat16, "rd")
                high = sr.cast(master, torch.bfloat16, "ru")
                assert bool(((p.detach() == low) | (p.detach() == high)).all())


def test_extra_states_bytes_and_arguments():
    bf16 = make_params(torch.bfloat16)
    adamw = AdamW(bf16, state_dtype=torch.bfloat16, master_weights=True)
    assert adamw.bytes_per_param() == 10  # bf16 param + fp32 master + 2 bf16 states
    assert AdamW(bf16, state_dtype=torch.bfloat16, rounding="kahan").bytes_per_param() == 8
    assert AdamW(bf16, state_dtype=torch.bfloat16, rounding="ecc").bytes_per_param() == 7
    # a float32 parameter is exact: no master, compensation or residual
    assert AdamW(make_params(torch.float32), master_weights=True).bytes_per_param() == 12
    assert AdamW(make_params(torch.float32), rounding="kahan").bytes_per_param() == 12
    for rounding in ("kahan", "ecc"):
        with pytest.raises(ValueError, match="master_weights"):
            SGD(bf16, rounding=rounding, master_weights=True)


def tiny_updates(rounding, steps=1000, dtype=torch.bfloat16):
    # p = 1.0, each step moves it by -1e-3: under a quarter of bf16's ulp at 1 (2**-7)
    param = torch.ones(64, dtype=dtype, requires_grad=True)
    opt = SGD([param], lr=1e-3, rounding=rounding, seed=0)
    for _ in range(steps):
        param.grad = torch.ones(64, dtype=dtype)
        opt.step()
    return param.detach().clone(), opt


@pytest.mark.parametrize("rounding", ["kahan", "ecc"])
def test_compensated_rounding_keeps_updates_rne_loses(rounding):
    rne, _ = tiny_updates("rne")
    assert bool((rne == 1).all())  # every update under half an ulp: rne never moves
    kept, opt = tiny_updates(rounding)
    again, _ = tiny_updates(rounding)
    assert torch.equal(kept.view(torch.int16), again.view(torch.int16))  # reproducible
    # the fp32 run reaches 1 - 1000 * 1e-3 = 0 (up to its own rounding); rne is off by 1.
    # kahan/ecc keep the lost part in 8 more bits (bf16 compensation / int8 residual), so
    # each step can still lose ~ulp(p) 2**-9: measured |error| ~4e-4, asserted < 2e-3
    exact = torch.ones(())
    for _ in range(1000):
        exact = exact - torch.tensor(1e-3)
    assert bool(((kept.float() - exact).abs() < 2e-3).all()), kept[:4]
    name = "compensation" if rounding == "kahan" else "ecc_residual"
    assert opt.state[opt.param_groups[0]["params"][0]][name].dtype == (
        torch.bfloat16 if rounding == "kahan" else torch.int8
    )


def test_kahan_compensation_is_what_the_store_lost():
    param = torch.full((8,), 1.0, dtype=torch.bfloat16, requires_grad=True)
    opt = SGD([param], lr=1.0, rounding="kahan")
    param.grad = torch.full((8,), -1e-3, dtype=torch.bfloat16)
    opt.step()
    exact = 1.0 - param.grad.float()  # the float32 update: 1.001
    assert torch.equal(param.detach(), exact.to(torch.bfloat16))
    comp = opt.state[param]["compensation"]
    assert torch.equal(comp, (exact - param.detach().float()).to(torch.bfloat16))


def test_ecc_residual_restores_more_bits():
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=generator) * 10.0 ** torch.randint(
        -20, 20, (4096,), generator=generator
    )
    exact = torch.cat([exact, torch.tensor([0.0, 1e-40, -3e-39, 1.0 - 2**-12, 2.0])])
    param = exact.to(torch.bfloat16)
    residual = ecc_encode(exact, param)
    restored = ecc_decode(param, residual)
    # rne alone errs by up to ulp/2; the residual leaves at most ulp/508 (its rounding)
    bound = param_ulp(param) / 508 * (1 + 1e-6)
    assert bool(((restored - exact).abs() <= bound).all())
    assert float((param.float() - exact).abs().max() / (restored - exact).abs().max()) > 100


def test_teacher_student_kahan_and_ecc_beat_rne():
    fp32 = teacher_student_loss(torch.float32, "rne")
    bf16_rne = teacher_student_loss(torch.bfloat16, "rne")
    # measured: fp32 0.00214, bf16 rne 0.00425, kahan 0.00227 (8 B), ecc 0.00227 (7 B);
    # bf16 rne + fp32 master weights 0.00227 (10 B) -- deterministic, no random bits
    for rounding in ("kahan", "ecc"):
        loss = teacher_student_loss(torch.bfloat16, rounding)
        assert loss < 0.7 * bf16_rne, (rounding, loss)
        assert loss < 1.2 * fp32, (rounding, loss)


def _compiled_steps(seed: int, rounding: str, compiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    param = torch.randn(4096, generator=generator).to(torch.bfloat16).requires_grad_()
    param.grad = torch.randn(4096, generator=generator).to(torch.bfloat16)
    opt = AdamW([param], lr=1e-3, state_dtype=torch.bfloat16, rounding=rounding, seed=seed)
    step = torch.compile(opt.step) if compiled else opt.step
    for _ in range(2):
        step()
    return param.detach().clone(), opt.state[param]["exp_avg"].clone()


def test_rounding_survives_torch_compile():
    """A compiler that fuses the bf16 round trip away (seen in a peer) would store values
    equal across seeds, or rne values off the eager ones: compiled steps store what eager
    steps store, and SR stores differ between seeds."""
    sr_compiled = _compiled_steps(1, "sr", compiled=True)
    assert all(
        torch.equal(a, b) for a, b in zip(sr_compiled, _compiled_steps(1, "sr", False), strict=True)
    )
    assert not torch.equal(sr_compiled[0], _compiled_steps(2, "sr", compiled=True)[0])
    rne = zip(_compiled_steps(1, "rne", True), _compiled_steps(1, "rne", False), strict=True)
    assert all(torch.equal(a, b) for a, b in rne)


def test_bias_power_is_within_its_rounding_bound():
    """b^t from the squares of b over the bits of t: squaring doubles a relative error, so
    b^(2^k) is within (2^k - 1) u and the product of the set bits' factors within
    (t + 31) u (u = 2**-53, to first order; the test allows twice that), against exact
    rationals; t = 0 gives 1 exactly, and b^t underflows to 0 where exact b^t < 2**-1075."""
    from fractions import Fraction

    from stochround.optim.updates import bias_power, power_squares

    steps = torch.tensor([0, 1, 2, 3, 1000, 12345, 2**31 + 5, 2**32 - 1])
    for beta in (0.9, 0.999, 0.5, 0.0):
        powers = bias_power(torch.tensor(power_squares(beta), dtype=torch.float64), steps)
        assert powers[0] == 1.0 and powers[1] == beta
        for step, power in zip(steps.tolist(), powers.tolist(), strict=True):
            if step > 20000:  # exact b^t < 2**-1075 for these b
                assert power == 0.0
                continue
            exact = Fraction(beta) ** step
            bound = max(exact * Fraction(step + 31, 2**52), Fraction(62, 2**1074))
            assert abs(Fraction(power) - exact) <= bound, (beta, step)


def test_checkpoints_with_int_step_counts_still_load():
    params = make_params(torch.bfloat16)
    opt = AdamW(params, state_dtype=torch.bfloat16, seed=1)
    train_steps(opt, params, 2, 0)
    saved = copy.deepcopy(opt.state_dict())
    for state in saved["state"].values():
        state["step"] = int(state["step"])  # as written before steps were tensors
    fresh = AdamW(params, state_dtype=torch.bfloat16)
    fresh.load_state_dict(saved)
    for param in params:
        step = fresh.state[param]["step"]
        assert step.dtype == torch.int64 and step.shape == () and int(step) == 2


def test_steps_are_device_tensors_and_lr_may_be_a_tensor():
    params = make_params(torch.bfloat16)
    floats = make_params(torch.bfloat16)
    lr = torch.tensor(1e-2, dtype=torch.float64)  # the float's value: the same scalars
    opt = AdamW(params, lr=lr, state_dtype=torch.bfloat16, seed=4)
    reference = AdamW(floats, lr=1e-2, state_dtype=torch.bfloat16, seed=4)
    train_steps(opt, params, 3, 0)
    train_steps(reference, floats, 3, 0)
    for a, b in zip(params, floats, strict=True):
        assert torch.equal(a, b)
        assert opt.state[a]["step"].dtype == torch.int64 and int(opt.state[a]["step"]) == 3


COMPILED_CPU = pytest.mark.skipif(
    cpu_path.compile_refusal() is not None, reason="no C++ compiler for the compiled CPU path"
)


@COMPILED_CPU
@pytest.mark.compiles
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_adamw_on_a_large_cpu_parameter_takes_the_compiled_step_with_the_same_bits() -> None:
    shape = (cpu_path.MIN_COMPILED_ELEMENTS // 64 + 1, 64)
    g = torch.Generator().manual_seed(1)
    initial = torch.randn(shape, generator=g).bfloat16()
    grads = [torch.randn(shape, generator=g).bfloat16() for _ in range(3)]
    params = [torch.nn.Parameter(initial.clone()) for _ in range(2)]
    opts = [
        sr.optim.AdamW([p], lr=0.01, seed=9, backend=b)
        for p, b in zip(params, ("auto", "torch"), strict=True)
    ]
    assert opts[0].param_groups[0]["params"][0] is params[0]
    for grad in grads:
        for p, opt in zip(params, opts, strict=True):
            p.grad = grad.clone()
            opt.step()
        assert torch.equal(params[0].view(torch.int16), params[1].view(torch.int16))
        for name in ("exp_avg", "exp_avg_sq"):
            a, b = (opt.state[p][name] for p, opt in zip(params, opts, strict=True))
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert opts[0].compiled_cpu_step(opts[0].param_groups[0], params[0])
    assert not opts[1].compiled_cpu_step(opts[1].param_groups[0], params[1])


def test_backend_triton_says_why_the_fused_kernel_cannot_serve_a_parameter() -> None:
    """The optimizers route through `use_kernel`: its one message, with the reason."""
    param = torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)
    param.grad = torch.ones(8, dtype=torch.bfloat16)
    optimizer = AdamW([param], rounding="kahan", seed=0, backend="triton")
    with pytest.raises(ValueError) as error:
        optimizer.step()
    assert str(error.value) == (
        "backend='triton' cannot serve this call: master_weights, 'kahan' and 'ecc' keep an "
        "extra parameter state; use backend='torch' or 'auto'"
    )
