"""The emulation mode (`emulate/mode.py`): every floating ATen op's outputs rounded as
`stochround.round` rounds them, bit for bit, in the counter's order; views, in-place ops,
autograd, nesting, seeds, the ops filter, float64 compute, torch.compile and the errors."""

from __future__ import annotations

import warnings

import pytest
import torch

import stochround as sr
from stochround.emulate import Emulation, emulate
from stochround.emulate.ops import MATMUL_OPS
from stochround.random import StreamDomain, stream_key


def key(seed: int) -> int:
    """The Philox key an emulation of ``seed`` draws with (its stream domain)."""
    return int(stream_key(seed, StreamDomain.EMULATE))


# a + b exact in fp32 and with bits below bf16's 8: every mode rounds something
A = torch.tensor([1.0, 1.0 + 2**-10, 3.0, -1.5, 2.0**-130])
B = torch.tensor([2**-9 + 2**-12, 2**-20, 0.5, -(2**-11), 2.0**-133])


@pytest.mark.parametrize("mode", sr.MODES)
@pytest.mark.parametrize("compute", ["native", "float64"])
def test_a_plus_b_is_the_exact_sum_rounded_bit_for_bit(mode, compute):
    """The native fp32 sum is exact for these inputs, so both computes round the exact sum
    once; offset 0 is the first rounding's."""
    with emulate("bfloat16", mode, seed=7, compute=compute) as emulation:
        total = A + B
    expected = sr.round(A.double() + B.double(), "bfloat16", mode, seed=key(7), offset=0).float()
    assert total.dtype == torch.float32
    assert torch.equal(total.view(torch.int32), expected.view(torch.int32))
    assert emulation.calls == 1


def test_float64_compute_rounds_an_inexact_fp32_sum_once():
    """bf16's ulp at 1 is 2**-7.  fp32 rounds 1 + 2**-8 + 2**-30 to 1 + 2**-8, a bf16 tie,
    which rne takes to 1; the exact sum is above the tie: one rounding gives 1 + 2**-7."""
    a, b = torch.tensor([1.0]), torch.tensor([2**-8 + 2**-30])
    with emulate("bfloat16", "rne", compute="native"):
        native = a + b
    with emulate("bfloat16", "rne", compute="float64"):
        wide = a + b
    assert native.item() == 1.0
    assert wide.item() == 1.0 + 2**-7
    assert wide.item() == sr.round(a.double() + b.double(), "bfloat16").item()


def test_bf16_code_gets_sr_from_float64_compute():
    """A bf16 op rounds to nearest itself: natively, SR to bf16 is then the identity;
    under compute="float64" the exact sum is rounded with SR."""
    a = torch.full((256,), 1.0, dtype=torch.bfloat16)
    b = torch.full((256,), 2**-9, dtype=torch.bfloat16)  # a quarter of the ulp at 1
    with emulate("bfloat16", "sr", seed=8):
        native = a + b
    with emulate("bfloat16", "sr", seed=8, compute="float64"):
        wide = a + b
    expected = sr.round(a.double() + b.double(), "bfloat16", "sr", seed=key(8), offset=0)
    assert torch.equal(native, a)
    assert torch.equal(wide, expected.bfloat16())
    assert 0 < int((wide != a).sum()) < 256


def test_float32_rne_leaves_fp32_code_bit_unchanged():
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 3, generator=generator)

    def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ w) * 0.7 + x[:, :3].exp()
        return torch.softmax(h, dim=-1).cumsum(0) / 3

    plain = program(x, w)
    with emulate("float32", "rne") as emulation:
        emulated = program(x, w)
    assert torch.equal(emulated.view(torch.int32), plain.view(torch.int32))
    assert emulation.calls > 0


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_an_mlp_forward_equals_explicit_rounding_calls(mode):
    """nn.Linear on a 2-D input is addmm(bias, x, weight.t()) (t is a view, not rounded):
    three rounded outputs, offsets 0, 1, 2 in program order."""
    model = _mlp()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with emulate("bfloat16", mode, seed=11) as emulation:
            emulated = model(x)
        first, second = model[0], model[2]

        def r(t: torch.Tensor, k: int) -> torch.Tensor:
            return sr.round(t, "bfloat16", mode, seed=key(11), offset=k)

        h = r(torch.addmm(first.bias, x, first.weight.t()), 0)
        h = r(torch.relu(h), 1)
        explicit = r(torch.addmm(second.bias, h, second.weight.t()), 2)
    assert emulation.calls == 3
    assert torch.equal(emulated.view(torch.int32), explicit.view(torch.int32))


def _harmonic(fmt: str, mode: str, limit: int, compute: str = "native") -> tuple[int, float]:
    """The harmonic sum as plain PyTorch, s = s + 1/k on a 0-d fp32 tensor, under emulate:
    (the first k with s_k == s_{k-1}, or limit + 1; the final sum)."""
    s = torch.tensor(0.0)
    with emulate(fmt, mode, seed=0, compute=compute):
        for k in range(1, limit + 1):
            new = s + 1 / k
            if bool(new == s):
                return k, float(s)
            s = new
    return limit + 1, float(s)


@pytest.mark.parametrize("compute", ["native", "float64"])
@pytest.mark.parametrize(("fmt", "stagnates_at"), [("bfloat16", 65), ("float16", 513)])
def test_the_harmonic_sum_stagnates_under_rne_as_the_experiment_finds(fmt, compute, stagnates_at):
    """The n of `stochround.experiments.stagnation.harmonic_rne` (its explicit rounding
    calls), from unmodified code."""
    from stochround.experiments.stagnation import harmonic_rne

    assert harmonic_rne(fmt, 2 * stagnates_at, round_terms=False)[0] == stagnates_at
    assert _harmonic(fmt, "rne", 2 * stagnates_at, compute)[0] == stagnates_at


def test_the_harmonic_sum_keeps_growing_under_sr():
    """bf16 rne stops at s = 5.0625 (n = 65); SR's expected sum is H_n's, and a step that
    leaves s unchanged is no stagnation there.  H_400 = 6.57 and one run's std is below
    0.2 (ulp 2**-5 at 4..8, at most 400 roundings of variance ulp**2 / 4 each: 0.31 at
    most): 5.0625 is more than 4 such std below."""
    s = torch.tensor(0.0)
    with emulate("bfloat16", "sr", seed=0):
        for k in range(1, 401):
            s = s + 1 / k
    assert float(s) > 5.5


def test_in_place_ops_round_the_mutated_tensor_and_views_keep_aliasing():
    base = torch.tensor([1.0, 2.0, 3.0, 4.0])
    with emulate("bfloat16", "rne") as emulation:
        view = base.view(2, 2)
        column = view[:, 1]  # views: not rounded
        assert emulation.calls == 0
        column.add_(2**-12)  # 2 + 2**-12 and 4 + 2**-12 round back under rne
        assert emulation.calls == 1
        view.mul_(1.0 + 2**-7)
    assert view.data_ptr() == base.data_ptr()
    assert column.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    expected = sr.round(torch.tensor([1.0, 2.0, 3.0, 4.0]).double() * (1 + 2**-7), "bfloat16")
    assert torch.equal(base, expected.float())
    assert emulation.calls == 2


@pytest.mark.parametrize("compute", ["native", "float64"])
def test_layout_ops_and_constant_fills_are_not_rounded_and_draw_no_offset(compute):
    """Copies, reshapes of transposed tensors (clone + _unsafe_view), concatenations,
    gathers, same-dtype copies and constant fills compute no value: the fp32 values
    1 + 2**-12 (not bf16 values) come out unchanged and no offset is drawn; the first
    arithmetic op then takes offset 0."""
    x = torch.full((2, 3), 1.0 + 2**-12)
    with emulate("bfloat16", "sr", seed=1, compute=compute) as emulation:
        copies = [
            x.clone(),
            x.t().contiguous().t(),
            x.t().reshape(6),
            torch.cat([x, x]),
            torch.stack([x, x]),
            x.index_select(0, torch.tensor([1])),
            x[torch.tensor([0, 0])],
            x.to(torch.float32, copy=True),
            torch.empty(2, 3).copy_(x),
            torch.nn.functional.pad(x, (1, 1)),
        ]
        fills = [torch.full((3,), 0.1), torch.ones(3), torch.zeros_like(x).fill_(0.1)]
        assert emulation.calls == 0
        product = x * 3
    for copy in copies:
        assert torch.equal(copy[copy != 0], torch.full_like(copy[copy != 0], 1.0 + 2**-12))
    assert all(torch.equal(t, torch.full_like(t, t.flatten()[0].item())) for t in fills)
    assert fills[0][0].item() == float(torch.tensor(0.1))
    exact = x.double() * 3
    assert torch.equal(product, sr.round(exact, "bfloat16", "sr", seed=key(1), offset=0).float())
    assert emulation.calls == 1


def test_a_conversion_to_another_dtype_still_rounds():
    """A layout op that changes the dtype (x.double(), copy_ into a bf16 tensor) is a
    conversion: its source is rounded once to the destination's format."""
    x = torch.full((3,), 1.0 + 2**-12)
    with emulate("bfloat16", "rne") as emulation:
        wide = x.double()
        stored = torch.empty(3, dtype=torch.bfloat16).copy_(x)
    assert torch.equal(wide, torch.ones(3, dtype=torch.float64))
    assert torch.equal(stored, torch.ones(3, dtype=torch.bfloat16))
    assert emulation.calls == 2


def test_backward_draws_no_offset_for_its_seed_gradient():
    """loss.backward() makes its seed gradient with ones_like: a constant fill, not rounded,
    so backward() and backward(torch.ones(())) made outside draw the same offsets (and a
    compiled program, whose seed gradient is made outside its graphs, matches both)."""
    x = torch.tensor([1.0 + 2**-12, 3.0 + 2**-10])
    counts = []
    for seed_gradient in (None, torch.ones(())):
        w = torch.ones(2, requires_grad=True)
        with emulate("bfloat16", "rne") as emulation:
            (w * x).sum().backward(seed_gradient)
        counts.append(emulation.calls)
    assert counts == [3, 3]  # mul, sum; the backward's mul


@pytest.mark.parametrize("compute", ["native", "float64"])
def test_a_cast_rounds_its_source_once_with_the_mode(compute):
    """x.to(bf16) would round to nearest itself; under emulate the source is rounded with
    the mode (SR here) and converted exactly; copy_ into a bf16 tensor alike."""
    x = torch.linspace(1, 2, 257)
    with emulate("bfloat16", "sr", seed=4, compute=compute):
        cast = x.to(torch.bfloat16)
        stored = torch.zeros(257, dtype=torch.bfloat16).copy_(x)
    expected = [sr.round(x, "bfloat16", "sr", seed=key(4), offset=k).bfloat16() for k in (0, 1)]
    assert torch.equal(cast, expected[0])
    assert torch.equal(stored, expected[1])  # zeros: a constant fill, no offset
    assert not torch.equal(cast, x.bfloat16())


def test_a_cast_into_an_8_bit_float_dtype_rounds_with_the_mode():
    """Values in e4m3fn's normal range (ulp 2**-3 on [1, 2)): SR to e4m3fn, then the exact
    conversion; the plain cast rounds to nearest."""
    x = torch.linspace(1, 2, 129)
    with emulate("e4m3fn", "sr", seed=6) as emulation:
        cast = x.to(torch.float8_e4m3fn)
    expected = sr.round(x, "e4m3fn", "sr", seed=key(6), offset=0)
    assert torch.equal(cast.float(), expected)
    assert not torch.equal(cast.float(), x.to(torch.float8_e4m3fn).float())
    assert torch.float8_e4m3fn in emulation.cast_formats


@pytest.mark.parametrize("compute", ["native", "float64"])
def test_in_place_and_foreach_ops_round_each_mutated_tensor(compute):
    one = torch.ones(2)
    first, second = torch.full((2,), 1.0), torch.full((2,), 2.0)
    with emulate("bfloat16", "rz", compute=compute) as emulation:
        torch._foreach_add_([first, second], [one * 2**-9, one * 2**-9])
        returned = first.add_(2**-8)
    assert returned is first
    assert first.tolist() == [1.0, 1.0]  # 1 + 2**-9 -> 1; 1 + 2**-8 -> 1 (ulp 2**-7)
    assert second.tolist() == [2.0, 2.0]
    assert emulation.calls == 2 + 2 + 1  # one * 2**-9 twice, two foreach, add_


def test_an_optimizer_step_under_emulate_keeps_parameters_in_the_format():
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    with emulate("bfloat16", "sr", seed=0):
        for _ in range(2):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for parameter in model.parameters():
        assert torch.equal(parameter.detach(), sr.round(parameter.detach(), "bfloat16"))


def test_integer_and_bool_outputs_are_not_rounded():
    values = torch.tensor([1.0 + 2**-10, 3.0])
    with emulate("bfloat16", "rne") as emulation:
        counts = torch.arange(300) * 3
        above = values > 1.0
        index = values.argmax()
    assert counts[-1].item() == 897
    assert above.tolist() == [True, True]
    assert index.item() == 1
    assert emulation.calls == 0


def test_backward_under_emulate_rounds_the_gradients_too():
    """d(sum(w * x))/dw = x: the gradient's arithmetic (mul) is rounded, so it is x
    rounded to bf16; without the mode it is x exactly."""
    x = torch.tensor([1.0 + 2**-12, 3.0 + 2**-10])
    w = torch.ones(2, requires_grad=True)
    with emulate("bfloat16", "rne"):
        (w * x).sum().backward()
    assert w.grad is not None
    assert torch.equal(w.grad, sr.round(x, "bfloat16"))
    w.grad = None
    (w * x).sum().backward()
    assert torch.equal(w.grad, x)


def test_nested_emulations_use_the_innermost_and_exiting_restores_arithmetic():
    a, b = torch.tensor([1.0]), torch.tensor([2**-9 + 2**-13])  # fp16 keeps it, bf16 not
    exact = (a.double() + b.double()).float()
    in_bf16, in_fp16 = sr.round(exact, "bfloat16"), sr.round(exact, "float16")
    assert not torch.equal(in_bf16, in_fp16)
    with emulate("bfloat16", "rne") as outer:
        before = a + b
        with emulate("float16", "rne") as inner:
            inside = a + b
        after = a + b
    assert [before, inside, after] == [in_bf16, in_fp16, in_bf16]
    assert (outer.calls, inner.calls) == (2, 1)
    assert torch.equal(a + b, exact)


def test_seeds_reproduce_and_differ():
    x = torch.linspace(1, 2, 1000)

    def run(seed: int) -> torch.Tensor:
        with emulate("bfloat16", "sr", seed=seed):
            return (x * 1.01 + 0.001).sin()

    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
    torch.manual_seed(9)
    drawn = emulate("bfloat16", "sr").seed
    torch.manual_seed(9)
    assert emulate("bfloat16", "sr").seed == drawn


def test_per_dtype_formats_round_each_dtype_to_its_own():
    x32 = torch.tensor([1.0 + 2**-12])
    x64 = torch.tensor([1.0 + 2**-40], dtype=torch.float64)
    x16 = torch.tensor([1.0 + 2**-10], dtype=torch.float16)
    with emulate({torch.float32: "bfloat16", torch.float64: "float32"}, "rz"):
        assert (x32 * 1).item() == 1.0
        assert (x64 * 1).item() == 1.0
        assert (x16 * 1).item() == 1.0 + 2**-10  # float16: no format given, not rounded


def test_one_format_applies_to_every_dtype_that_holds_it():
    emulation = emulate("float16", "rne")
    assert set(emulation.formats) == {torch.float16, torch.float32, torch.float64}
    assert set(emulate("bfloat16").formats) == {torch.bfloat16, torch.float32, torch.float64}


def test_the_matmul_filter_rounds_products_only():
    x = torch.full((2, 2), 1.0 + 2**-12)
    with emulate("bfloat16", "rz", ops="matmul") as emulation:
        summed = x + 0.0
        product = x @ torch.eye(2)
    assert torch.equal(summed, x)
    assert torch.equal(product, torch.ones(2, 2))
    assert emulation.calls == 1
    assert torch.ops.aten.mm in MATMUL_OPS


def test_the_matmul_filter_rounds_convolutions_forward_and_backward():
    generator = torch.Generator().manual_seed(5)
    image = torch.randn(1, 2, 5, 5, generator=generator)
    kernel = torch.randn(3, 2, 3, 3, generator=generator, requires_grad=True)
    seen = []
    emulation = Emulation("bfloat16", ops="matmul", observer=lambda f, out: seen.append(f))
    with emulation:
        out = torch.nn.functional.conv2d(image, kernel)
        (out * 1.5).sum().backward()
    assert [f.overloadpacket for f in seen] == [
        torch.ops.aten.convolution,
        torch.ops.aten.convolution_backward,
    ]
    assert torch.equal(out, sr.round(out.detach(), "bfloat16"))
    assert kernel.grad is not None
    assert torch.equal(kernel.grad, sr.round(kernel.grad, "bfloat16"))


def test_a_callable_filter_picks_ops():
    x = torch.full((3,), 1.0 + 2**-12)
    with emulate("bfloat16", "rz", ops=lambda func: func.overloadpacket is torch.ops.aten.exp):
        kept = x * 1.0
        rounded = torch.exp(x * 0.0)  # exp(0) = 1 exactly; x * 0 not rounded
    assert torch.equal(kept, x)
    assert torch.equal(rounded, torch.ones(3))


def test_round_inputs_rounds_arguments_without_changing_the_callers_tensors():
    x = torch.tensor([1.0 + 2**-12])
    with emulate("bfloat16", "rz", round_inputs=True) as emulation:
        doubled = x * 2.0
    assert doubled.item() == 2.0
    assert x.item() == 1.0 + 2**-12
    assert emulation.calls == 2  # the input, then the output


def test_an_observer_sees_each_rounded_op():
    seen = []
    x = torch.ones(3)
    emulation = Emulation("bfloat16", observer=lambda func, out: seen.append(str(func)))
    with emulation:
        (x.view(3) * 2).sum()
    assert seen == ["aten.mul.Tensor", "aten.sum.default"]


def test_torch_compile_inside_an_emulation_runs_eagerly_and_rounds_every_op():
    """Dynamo does not compile frames under an active dispatch mode: a compiled function
    (compiled before or first called inside) runs op by op, each op rounded, the same
    bits as the plain function under the same emulation."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 1.1 + 0.3).sin()

    x = torch.linspace(-2, 2, 64)
    compiled = torch.compile(f, backend="eager")
    with emulate("bfloat16", "sr", seed=1) as emulation:
        expected = f(x)
    with emulate("bfloat16", "sr", seed=1) as compiled_emulation:
        got = compiled(x)
    assert torch.equal(got, expected)
    assert compiled_emulation.calls == emulation.calls == 3


def test_an_emulation_entered_inside_a_compiled_function_gives_the_eager_bits():
    def f(x: torch.Tensor) -> torch.Tensor:
        with emulate("bfloat16", "sr", seed=2):
            return (x * 1.1 + 0.3).sin()

    x = torch.linspace(-2, 2, 64)
    with warnings.catch_warnings():  # Dynamo's: it cannot trace the mode's entry
        warnings.simplefilter("ignore")
        compiled = torch.compile(f, backend="eager")(x)
    assert torch.equal(compiled, f(x))


def test_complex_and_sparse_tensors_raise():
    with emulate("bfloat16"):
        with pytest.raises(TypeError, match="complex"):
            torch.ones(2, dtype=torch.complex64) * 2
        with pytest.raises(TypeError, match="sparse"):
            torch.eye(2).to_sparse() * 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fmt": "bfloat17"}, ValueError, "unknown format"),
        ({"fmt": "bfloat16", "mode": "nearest"}, ValueError, "mode"),
        ({"fmt": "bfloat16", "ops": "conv"}, ValueError, "ops"),
        ({"fmt": "bfloat16", "ops": 3}, TypeError, "ops"),
        ({"fmt": "bfloat16", "compute": "float32"}, ValueError, "compute"),
        ({"fmt": "bfloat16", "round_inputs": 1}, TypeError, "round_inputs"),
        ({"fmt": "bfloat16", "mode": "sr", "rbits": 40}, ValueError, "rbits"),
        ({"fmt": "bfloat16", "mode": "sr", "variant": "z"}, ValueError, "variant"),
        ({"fmt": "bfloat16", "seed": -1}, ValueError, "seed"),
        ({"fmt": {torch.float16: "bfloat16"}}, ValueError, "cannot hold"),
        ({"fmt": {torch.int32: "bfloat16"}}, TypeError, "floating dtypes"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        emulate(**kwargs)


def test_a_hardware_preset_rounds_as_the_unit_does():
    x = torch.linspace(1, 2, 16)
    with emulate("e4m3fnuz", "sr", seed=3, hardware="amd-mi300-fp8"):
        got = x * 1.0001
    product = (x.double() * 1.0001).float()  # fp32's product, which the native op gives
    expected = sr.round(product, "e4m3fnuz", "sr", seed=key(3), offset=0, hardware="amd-mi300-fp8")
    assert torch.equal(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_cuda_rounds_elementwise_code_as_the_cpu_does(mode: str) -> None:
    """IEEE's + and * give the same fp32 results on both devices, and the core rounds
    them to the same bits there (its kernel on CUDA, its PyTorch path on the CPU), with
    the same counter-based words: the emulated results agree bit for bit."""
    generator = torch.Generator().manual_seed(3)
    x, y, z = (torch.randn(4096, generator=generator) for _ in range(3))
    results = []
    for device in ("cpu", "cuda"):
        a, b, c = (t.to(device) for t in (x, y, z))
        with emulate("bfloat16", mode, seed=11):
            out = a * b + c
            out = out * out - a
        results.append(out.cpu())
    assert torch.equal(results[0], results[1])


# accumulate="per_op": matmuls and sums computed by stochround.arith, every addition rounded


def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(5, 9, generator=generator), torch.randn(9, 4, generator=generator)


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_per_op_matmul_equals_arith_matmul_at_the_documented_offsets(mode):
    """a @ b at counter k = 0 takes offsets 0 (products) and 1..K (additions): the next
    op starts at K + 1 = 10."""
    a, b = _operands()
    with emulate("bfloat16", mode, seed=11, accumulate="per_op") as emulation:
        product = a @ b
        again = a @ b
    assert emulation.calls == 2 * (a.shape[1] + 1)
    expected = sr.ops.matmul(a, b, "bfloat16", mode, seed=key(11), offset=0)
    expected_again = sr.ops.matmul(a, b, "bfloat16", mode, seed=key(11), offset=a.shape[1] + 1)
    assert torch.equal(product.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(again.view(torch.int32), expected_again.view(torch.int32))


def test_per_op_mv_dot_and_linear_use_arith():
    """mv and dot as arith.matmul/arith.dot; linear with a bias (addmm) adds the bias
    with arith.add at the offset after the matmul's, K + 1."""
    a, b = _operands()
    v, bias, inputs = b[:, 0].clone(), torch.linspace(-1, 1, 5), b.T.contiguous()
    with emulate("bfloat16", "sr", seed=3, accumulate="per_op"):
        mv = a @ v
        dot = v @ v
        linear = torch.nn.functional.linear(inputs, a, bias)
    k = a.shape[1] + 1
    expected_mv = sr.ops.matmul(a, v[:, None], "bfloat16", "sr", seed=key(3), offset=0)[:, 0]
    expected_dot = sr.ops.dot(v, v, "bfloat16", "sr", seed=key(3), offset=k)
    product = sr.ops.matmul(b.T, a.T, "bfloat16", "sr", seed=key(3), offset=2 * k)
    expected_linear = sr.ops.add(bias, product, "bfloat16", "sr", seed=key(3), offset=3 * k)
    assert torch.equal(mv.view(torch.int32), expected_mv.view(torch.int32))
    assert torch.equal(dot.view(torch.int32), expected_dot.view(torch.int32))
    assert torch.equal(linear.view(torch.int32), expected_linear.view(torch.int32))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_per_op_sum_and_mean_equal_arith_sum_at_the_documented_offsets(mode):
    """x.sum() over n terms: offsets 0..n-1; x.sum(1, keepdim=True): n..n+m-1 (m per
    row); x.mean(0): the sum over dim 0 at the next 5 offsets, the division after."""
    a, _ = _operands()
    n, rows, columns = a.numel(), a.shape[0], a.shape[1]
    with emulate("bfloat16", mode, seed=5, accumulate="per_op") as emulation:
        total = a.sum()
        per_row = a.sum(1, keepdim=True)
        mean = a.mean(0)
    assert emulation.calls == n + columns + rows + 1
    expected = sr.ops.sum(a.flatten(), "bfloat16", mode, seed=key(5), offset=0)
    expected_rows = sr.ops.sum(a, "bfloat16", mode, dim=1, seed=key(5), offset=n)[:, None]
    column_sums = sr.ops.sum(a.T, "bfloat16", mode, dim=1, seed=key(5), offset=n + columns)
    divisor = torch.full_like(column_sums, float(rows))
    expected_mean = sr.ops.div(
        column_sums, divisor, "bfloat16", mode, seed=key(5), offset=n + columns + rows
    )
    assert torch.equal(total.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(per_row.view(torch.int32), expected_rows.view(torch.int32))
    assert torch.equal(mean.view(torch.int32), expected_mean.view(torch.int32))


def test_per_op_rne_sum_of_the_harmonic_terms_stagnates_and_once_does_not():
    """x.sum() of 1/k, k = 1..2000 (fp32 terms made outside the block): per_op rne adds
    them one by one in bf16 and stops at 5.0625 (the sum of the first 65 terms, as the
    loop above finds); once rounds the fp32 sum 8.178... once, to bf16's 8.1875."""
    terms = 1.0 / torch.arange(1, 2001, dtype=torch.float32)
    with emulate("bfloat16", "rne", accumulate="per_op"):
        per_op = terms.sum()
        first = terms[:65].sum()
    with emulate("bfloat16", "rne"):
        once = terms.sum()
    assert float(per_op) == float(first) == 5.0625
    assert float(once) == 8.1875


def test_per_op_raises_for_accumulating_ops_it_cannot_compute():
    a, b = _operands()
    with emulate("bfloat16", "rne", accumulate="per_op"):
        with pytest.raises(ValueError, match="cumsum"):
            a.cumsum(0)
        with pytest.raises(ValueError, match="addmm"):
            torch.addmm(a[:, :4], a, b, beta=2.0)
        with pytest.raises(ValueError, match="_softmax"):
            a.softmax(0)
        elementwise = a + 1  # one op, one rounding, as under "once"
    assert torch.equal(elementwise, sr.round(a + 1, "bfloat16", "rne"))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"accumulate": "per_add"}, ValueError, "accumulate"),
        ({"accumulate": "per_op", "hardware": "amd-mi300-fp8"}, ValueError, "hardware"),
    ],
)
def test_bad_accumulate_arguments_raise_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        emulate("bfloat16", **kwargs)


def test_per_op_backward_computes_the_gradients_per_operation_too():
    """The backward's mm and bias sums are per_op ops as well: the weight gradient of a
    linear layer is grad.T @ x by arith.matmul, a bf16 value."""
    torch.manual_seed(0)
    layer, inputs = torch.nn.Linear(4, 3, bias=False), torch.randn(5, 4)
    with emulate("bfloat16", "rne", accumulate="per_op"):
        layer(inputs).sum().backward()
    assert layer.weight.grad is not None
    grad = layer.weight.grad
    assert torch.equal(grad, sr.round(grad, "bfloat16", "rne"))
    # d sum / d W = ones(5, 3).T @ inputs: every product and addition rounded to bf16
    expected = sr.ops.matmul(torch.ones(3, 5), inputs, "bfloat16", "rne")
    assert torch.equal(grad.view(torch.int32), expected.view(torch.int32))
