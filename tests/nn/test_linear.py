"""QuantizedLinear: the three emulated GEMMs, where SR is applied, unbiased gradients,
2-D weights, random streams, checkpoints, no_grad, autocast and torch.compile."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import stochround as sr
import stochround.nn as srnn
from stochround.blocks.request import RHT_SEED
from stochround.kernels import availability
from stochround.nn import linear, matmul, operands
from stochround.nn.linear import COMPILES
from stochround.nn.recipes import ROLES, QuantSpec, Recipe
from stochround.random import StreamDomain, stream_key

# every named recipe fits 64 x 64 layers and 64 tokens (MXFP4's RHT-64 included)
SIZE = 64


@contextmanager
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Tensor]]]:
    """Every quantized operand the layer computes, as (role, fp32 values), in call order."""
    calls: list[tuple[str, Tensor]] = []
    original = operands.quantize_operand

    def spy(operand: Tensor, entry: operands.Operand, *args: Any, **kwargs: Any) -> Any:
        result = original(operand, entry, *args, **kwargs)
        calls.append((entry.role, operands.dequantized_operand(result).clone()))
        return result

    with monkeypatch.context() as patch:
        patch.setattr(matmul, "quantize_operand", spy)
        yield calls


def fixed_data(seed: int = 0) -> tuple[nn.Linear, Tensor, Tensor]:
    """A 64 x 64 fp32 layer, 64 tokens of input and an upstream gradient."""
    generator = torch.Generator().manual_seed(seed)
    layer = nn.Linear(SIZE, SIZE)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(SIZE, SIZE, generator=generator) / 8)
        layer.bias.copy_(torch.randn(SIZE, generator=generator))
    x = torch.randn(SIZE, SIZE, generator=generator)
    grad = torch.randn(SIZE, SIZE, generator=generator)
    return layer, x, grad


def one_step(layer: nn.Module, x: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(y, dx, dW) of one forward and backward with upstream gradient ``grad``."""
    inputs = x.clone().requires_grad_()
    layer.zero_grad()
    y = layer(inputs)
    y.backward(grad)
    return y.detach(), inputs.grad, layer.weight.grad.clone()  # type: ignore[union-attr, operator, return-value]


def test_a_passthrough_recipe_computes_what_nn_linear_computes() -> None:
    reference, x, grad = fixed_data()
    layer = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), srnn.bf16())
    y, dx, dw = one_step(layer, x, grad)
    y_ref, dx_ref, dw_ref = one_step(reference, x, grad)
    # fp32 GEMMs of the same operands: equal up to the order of accumulation
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer.bias.grad, reference.bias.grad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_tseng", "mxfp8", "fp8", "int8"])
def test_sr_is_applied_exactly_where_the_recipe_says(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each role is quantized once a step (dgrad's weight reuses fprop's where the plan
    says so); between two seeds the stochastic roles change and the round-to-nearest roles
    (and passthrough roles) are bit-identical."""
    recipe = srnn.RECIPES[name]()
    results = []
    for seed in (1, 2):
        reference, x, grad = fixed_data()
        layer = srnn.QuantizedLinear.from_linear(reference, recipe.replace(seed=seed))
        with recorded(monkeypatch) as calls:
            one_step(layer, x, grad)
        reused = {"dgrad_weight"} if layer.plan.weight_transposes else set()
        reused |= layer.plan.tensor_transposes  # fp8's: each transposed from its source
        assert sorted(role for role, _ in calls) == sorted(set(ROLES) - set(reused))
        results.append(dict(calls))
    for role in results[0]:
        spec = recipe.spec(role)
        same = torch.equal(results[0][role], results[1][role])
        assert same != spec.stochastic, f"{name} {role}: stochastic={spec.stochastic}"
    stochastic = any(recipe.spec(role).stochastic for role in ROLES)
    assert stochastic == (name in ("nvfp4", "mxfp4_tseng", "int8"))


def gradient_samples(
    layer: nn.Module, x: Tensor, grad: Tensor, steps: int
) -> tuple[Tensor, Tensor]:
    """dx and dW of ``steps`` consecutive steps (each draws fresh bits), stacked, float64."""
    dxs, dws = [], []
    for _ in range(steps):
        _, dx, dw = one_step(layer, x, grad)
        dxs.append(dx.double())
        dws.append(dw.double())
    return torch.stack(dxs), torch.stack(dws)


def assert_unbiased(samples: Tensor, exact: Tensor, what: str) -> None:
    """The mean of n samples lies within 6 standard errors (the sample standard deviation
    over sqrt(n), per element) of the exact value, plus fp32 accumulation slack.  The mean
    of n >= 100 bounded samples is close to normal: |Z| > 6 has probability 2e-9 an
    element, under 1e-5 over the 4096 elements of a test."""
    n = samples.shape[0]
    mean = samples.mean(0)
    error = (samples.std(0) / n**0.5).clamp_min(0)
    slack = 1e-5 * exact.abs().max()
    excess = (mean - exact).abs() - (6 * error + slack)
    assert float(excess.max()) <= 0, f"{what}: mean off by more than 6 standard errors"
    assert float((samples.std(0) > 0).double().mean()) > 0.9, f"{what}: SR looks off"


def test_mxfp4_tseng_gradients_are_unbiased_with_the_per_step_rht() -> None:
    """Every backward operand rounds stochastically (floor-3/4: nothing clips) after an RHT
    with fresh signs each step: E[dx] = dy W and E[dW] = dy^T x exactly."""
    reference, x, grad = fixed_data()
    exact_dx = grad.double() @ reference.weight.detach().double()
    exact_dw = grad.double().T @ x.double()
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.mxfp4_tseng(seed=7))
    dxs, dws = gradient_samples(layer, x, grad, steps=128)
    assert_unbiased(dxs, exact_dx, "dgrad")
    assert_unbiased(dws, exact_dw, "wgrad")


def block_maxima(values: Tensor, block: int = 16) -> Tensor:
    """``values`` with each block's first element set to +-4 max|values|: every NVFP4
    block then has the tensor's amax, its e4m3 scale is 448 exactly, and no element can
    round past e2m1's largest value (so SR is unbiased)."""
    out = values.clone()
    top = 4 * values.abs().max()
    out[..., ::block] = torch.where(values[..., ::block] < 0, -top, top)
    return out


def test_nvfp4_dgrad_is_unbiased_about_the_rn_weight_and_biased_with_rn_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvfp4(): dx = Q_sr(dy) Q_rn(W), whose mean is dy Q_rn(W) within the variance band;
    with stochastic_rounding=False every step gives the same dx, away from it."""
    reference, x, grad = fixed_data()
    grad = block_maxima(grad)
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.nvfp4(seed=3))
    with recorded(monkeypatch) as calls:
        one_step(layer, x, grad)
    weight_rn = dict(calls)["fprop_weight"].T.double()  # (in, out): Q(W)^T = Q(W^T)
    exact = grad.double() @ weight_rn.T
    dxs, _ = gradient_samples(layer, x, grad, steps=128)
    assert_unbiased(dxs, exact, "nvfp4 dgrad")
    rn = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.nvfp4(stochastic_rounding=False))
    rn_dxs, _ = gradient_samples(rn, x, grad, steps=3)
    assert torch.equal(rn_dxs[0], rn_dxs[1]) and torch.equal(rn_dxs[0], rn_dxs[2])
    bias = (rn_dxs[0] - exact).abs().max() / exact.abs().max()
    assert float(bias) > 1e-3  # round to nearest errs the same way at every step


def test_nvfp4_wgrad_is_unbiased_through_the_rht_and_biased_with_rn_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvfp4(): dW = Q_sr(r) Q_rn(H x^T)^T with r = bf16(H dy^T), both operands rotated by
    the same RHT-16 (fixed signs) and multiplied in the rotated basis; its mean is
    r Q_rn(H x^T)^T within the variance band.  dy is chosen so that each 16-block of r
    holds the tensor's amax (no element can round past e2m1's largest value).  With
    stochastic_rounding=False every step gives the same dW, away from it."""
    reference, x, _ = fixed_data()
    signs = sr.blocks.random_signs(16, RHT_SEED)
    generator = torch.Generator().manual_seed(5)
    wanted = block_maxima(torch.randn(SIZE, SIZE, generator=generator)).bfloat16()
    grad_t = sr.blocks.inverse_hadamard(wanted.double(), 16, signs=signs.double()).float()
    grad = grad_t.T.contiguous()  # (tokens, out): dy^T = grad_t, rotated along the tokens
    # what the layer rotates: r, as wanted up to the rounding of the round trip
    rotated = sr.blocks.hadamard(grad_t, 16, signs=signs).bfloat16().float()
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.nvfp4(seed=3))
    with recorded(monkeypatch) as calls:
        one_step(layer, x, grad)
    input_rn = dict(calls)["wgrad_input"].double()  # (in, tokens), rotated basis
    exact = rotated.double() @ input_rn.T
    _, dws = gradient_samples(layer, x, grad, steps=128)
    assert_unbiased(dws, exact, "nvfp4 wgrad")
    rn = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.nvfp4(stochastic_rounding=False))
    _, rn_dws = gradient_samples(rn, x, grad, steps=3)
    assert torch.equal(rn_dws[0], rn_dws[1]) and torch.equal(rn_dws[0], rn_dws[2])
    bias = (rn_dws[0] - exact).abs().max() / exact.abs().max()
    assert float(bias) > 1e-3  # round to nearest errs the same way at every step


def test_2d_weight_blocks_make_the_dgrad_weight_the_exact_transpose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Q(W^T) = Q(W)^T for 16x16 tiles, so the backward reuses fprop's operand (dgrad's
    weight is not quantized again) and dx is what quantizing W^T gives, bit for bit; with
    1-D weight blocks the two differ and dgrad quantizes W^T."""
    reference, x, grad = fixed_data()
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.nvfp4())
    assert layer.plan.weight_transposes
    with recorded(monkeypatch) as calls:
        _, dx, _ = one_step(layer, x, grad)
    quantized = dict(calls)
    assert "dgrad_weight" not in quantized
    entry = layer.plan.operands["dgrad_weight"]
    again = operands.quantize_operand(reference.weight.detach().T.contiguous(), entry, 0, 0, None)
    assert torch.equal(quantized["fprop_weight"].T, operands.dequantized_operand(again))
    # the step's dx equals the step that quantizes W^T itself
    plan = layer.plan._replace(weight_transposes=False)
    unshared = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.nvfp4())
    unshared.plan = plan
    assert torch.equal(one_step(unshared, x, grad)[1], dx)
    layer_1d = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.nvfp4(weight_2d=False))
    assert not layer_1d.plan.weight_transposes
    with recorded(monkeypatch) as calls:
        one_step(layer_1d, x, grad)
    quantized = dict(calls)
    assert not torch.equal(quantized["fprop_weight"].T, quantized["dgrad_weight"])


def test_the_streams_of_a_run_never_share_an_offset() -> None:
    offsets = {
        int(srnn.stream_offset(step, layer, slot))
        for step in range(3)
        for layer in range(4)
        for slot in range(16)
    }
    assert len(offsets) == 3 * 4 * 16
    assert int(srnn.stream_offset(torch.tensor(2), 1, 3)) == srnn.stream_offset(2, 1, 3)
    every_slot = linear.step_column(torch.tensor(5), 7).view(-1)
    assert every_slot.tolist() == [srnn.stream_offset(5, 7, slot) for slot in range(16)]
    # the column (one add) has the shift's and or's bits at the largest steps too, where
    # step << 32 wraps to a negative int64, and at the largest layer
    for step, layer in ((2**31 - 1, 3), (2**31, 5), (2**32 - 1, 2**28 - 1)):
        column = linear.step_column(torch.tensor(step), layer).view(-1)
        shifted = (torch.tensor(step) << 32) | (torch.arange(16) + layer * 16)
        assert torch.equal(column, shifted), step
    for _ in range(2):  # the layer index checked where its bases are made: none are kept
        with pytest.raises(ValueError, match=r"layer must be in \[0, 2\*\*28\)"):
            linear.step_column(torch.tensor(0), 2**28)
    for kwargs in ({"step": -1}, {"layer": 2**28}, {"slot": 16}):
        arguments = {"step": 0, "layer": 0, "slot": 0, **kwargs}
        with pytest.raises(ValueError, match="must be in"):
            srnn.stream_offset(**arguments)  # type: ignore[arg-type]


def test_layers_draw_their_own_bits_and_a_step_draws_fresh_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference, x, grad = fixed_data()
    recipe = srnn.nvfp4(seed=1)
    first = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe, layer_index=0)
    second = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe, layer_index=1)
    with recorded(monkeypatch) as calls:
        one_step(first, x, grad)
        one_step(second, x, grad)
        one_step(first, x, grad)
    dy = [values for role, values in calls if role == "dgrad_grad_output"]
    assert not torch.equal(dy[0], dy[1]) and not torch.equal(dy[0], dy[2])
    assert first.step.item() == 2 and second.step.item() == 1


def test_no_grad_inference_uses_the_step_without_advancing_it() -> None:
    stochastic_input = Recipe(fprop_input=QuantSpec("mxfp8_e4m3", "sr"), seed=4)
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=stochastic_input)
    x = torch.randn(2, SIZE, SIZE)
    with torch.no_grad():
        before = layer(x)
    assert layer.step.item() == 0
    trained = layer(x)
    assert layer.step.item() == 1 and torch.equal(trained.detach(), before)
    with torch.no_grad():
        after = layer(x)
    assert not torch.equal(after, before) and after.shape == (2, SIZE, SIZE)


def make_model(recipe: Recipe) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(SIZE, SIZE), nn.GELU(), nn.Linear(SIZE, SIZE))
    srnn.quantize_(model, recipe)
    return model


def train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[Tensor]) -> None:
    for batch in batches:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()


def test_a_checkpoint_resumes_bit_exactly() -> None:
    batches = [
        torch.randn(SIZE, SIZE, generator=torch.Generator().manual_seed(i)) for i in range(6)
    ]
    model = make_model(srnn.nvfp4(seed=9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, optimizer, batches[:3])
    checkpoint = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    assert checkpoint[0]["0.step"].item() == 3
    train(model, optimizer, batches[3:])

    resumed = make_model(srnn.nvfp4(seed=9))
    resumed_optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    resumed.load_state_dict(checkpoint[0])
    resumed_optimizer.load_state_dict(checkpoint[1])
    train(resumed, resumed_optimizer, batches[3:])
    for (name, value), other in zip(
        model.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(value, other), name


def test_from_linear_shares_the_parameters_and_loads_a_linear_state_dict() -> None:
    reference = nn.Linear(SIZE, 32, bias=False)
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.mxfp8())
    assert layer.weight is reference.weight and layer.bias is None
    assert set(layer.state_dict()) == {"weight", "step"}
    layer.step.fill_(5)
    fresh = nn.Linear(SIZE, 32, bias=False)
    layer.load_state_dict(fresh.state_dict())  # no step: the layer keeps its own
    assert torch.equal(layer.weight, fresh.weight) and layer.step.item() == 5
    assert "recipe=mxfp8" in repr(layer)
    with pytest.raises(TypeError, match=r"linear must be an nn\.Linear"):
        srnn.QuantizedLinear.from_linear(nn.Conv1d(1, 1, 1), srnn.mxfp8())  # type: ignore[arg-type]


def test_blocks_that_do_not_fit_a_gemm_raise_naming_the_role() -> None:
    with pytest.raises(ValueError, match=r"fprop_weight.*16"):
        srnn.QuantizedLinear(SIZE, 40, recipe=srnn.nvfp4())
    # wgrad pads the tokens; 2-D tiles over the tokens in fprop (a custom recipe) cannot
    tiled = srnn.QuantizedLinear(
        SIZE, SIZE, recipe=Recipe(fprop_input=QuantSpec("nvfp4", block=(16, 16)))
    )
    with pytest.raises(ValueError, match=r"fprop_input: the operand \(24, 64\).*24 rows"):
        tiled(torch.randn(24, SIZE))
    with pytest.raises(TypeError, match="recipe must be"):
        srnn.QuantizedLinear(SIZE, SIZE, recipe="nvfp4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer_index must be in"):
        srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.nvfp4(), layer_index=-1)


def test_autocast_runs_the_layer_in_the_autocast_dtype() -> None:
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.nvfp4())
    x = torch.randn(SIZE, SIZE, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_bf16_layers_accumulate_in_fp32_and_return_bf16() -> None:
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.nvfp4(), dtype=torch.bfloat16)
    x = torch.randn(SIZE, SIZE, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == layer.weight.grad.dtype == torch.bfloat16  # type: ignore[union-attr]


def test_per_tensor_fp8_has_one_scale_for_the_whole_tensor() -> None:
    x = torch.randn(8, SIZE) * torch.logspace(-2, 2, 8).unsqueeze(1)
    entry = linear.make_plan(srnn.fp8(), 0).operands["fprop_input"]
    got = operands.dequantized_operand(operands.quantize_operand(x, entry, 0, 0, None))
    scale = x.abs().max() / 448
    expected = sr.round(x * (1 / scale), "e4m3fn", sat="finite") * scale
    assert torch.equal(got, expected)


@pytest.mark.parametrize("role", ["fprop_input", "dgrad_grad_output"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_per_tensor_operands_equal_the_tensor_as_one_row_of_the_row_wise_rule(
    role: str, dtype: torch.dtype
) -> None:
    """The per-tensor path (one amax, one elementwise rounding) equals the block
    quantizer's whole-row rule on the tensor as one fp32 row, value for value, SR included
    (the words of each element's row-major index), with zeros, a NaN-free tail of tiny
    values and values that SR may take to the element's largest finite value."""
    torch.manual_seed(0)
    x = torch.randn(16, SIZE) * torch.logspace(-30, 3, 16).unsqueeze(1)
    x[3] = 0.0
    x[5, :4] = torch.tensor([448.0, -448.0, 1e-45, -1e-40])
    x = x.to(dtype)
    entry = linear.make_plan(srnn.fp8(), 0).operands[role]
    got = operands.quantize_operand(x, entry, 7, 3, None)
    flat = x.reshape(1, -1).to(torch.float32)
    spec = entry.spec
    expected = sr.blocks.gemm_operand(
        flat, entry.fmt, spec.mode, rbits=spec.rbits, variant=spec.variant, seed=7, offset=3
    )
    assert got.values.dtype == expected.values.dtype
    assert torch.equal(got.values, expected.values.reshape(x.shape))
    # the one scale of the whole tensor is the GEMM's tensor scale
    assert got.row_scale is None and expected.row_scale is not None
    assert torch.equal(got.tensor_scale, expected.row_scale.reshape(()))  # type: ignore[arg-type]


def test_row_noise_operands_match_blocks_given_the_blocks_words() -> None:
    x = torch.randn(8, SIZE)
    fmt = sr.blocks.BLOCK_FORMATS["int8_rowwise"]
    words = sr.random.random_words(torch.arange(x.numel()).reshape(x.shape), 5, 11)
    got = operands.row_noise_operand(x, fmt, words)
    expected = sr.blocks.gemm_operand(x, "int8_rowwise", "sr", seed=5, offset=11)
    assert torch.equal(got.values, expected.values)
    assert torch.equal(got.row_scale, expected.row_scale)  # type: ignore[arg-type]


def test_row_noise_is_one_word_per_token_in_both_backward_gemms() -> None:
    """Qwix's channelwise noise: dgrad's dy (tokens, out) shares a word along each row,
    wgrad's dy^T (out, tokens) along each column: token t draws word t."""
    dy = torch.randn(32, SIZE)
    fmt = sr.blocks.BLOCK_FORMATS["int8_rowwise"]
    plan = linear.make_plan(srnn.int8(noise="row"), 0)
    token_words = sr.random.random_words(torch.arange(32), 5, 11)
    dgrad = operands.quantize_operand(dy, plan.operands["dgrad_grad_output"], 5, 11, None)
    per_row = token_words[:, None].expand(32, SIZE).contiguous()
    assert torch.equal(dgrad.values, operands.row_noise_operand(dy, fmt, per_row).values)
    transposed = dy.T.contiguous()
    wgrad = operands.quantize_operand(transposed, plan.operands["wgrad_grad_output"], 5, 11, None)
    per_column = token_words[None, :].expand(SIZE, 32).contiguous()
    expected = operands.row_noise_operand(transposed, fmt, per_column)
    assert torch.equal(wgrad.values, expected.values)


def test_compiled_fullgraph_compiles_once_and_equals_eager() -> None:
    """torch.compile(fullgraph=True) with AOTAutograd (backend "aot_eager": the traced
    forward and backward graphs run by PyTorch's own kernels, so the comparison is bit for
    bit) gives eager's results for several steps and compiles once: the step is a tensor
    advanced by one op (`step_ops.advance_step`), which also keeps the backward graph from
    reading the step after the forward advanced it.  Inductor's own bits are compared in
    `test_inductor_on_the_cpu_gives_eagers_bits_for_every_named_recipe`."""
    from torch._dynamo.testing import CompileCounterWithBackend

    batches = [
        torch.randn(SIZE, SIZE, generator=torch.Generator().manual_seed(i)) for i in range(3)
    ]
    eager = make_model(srnn.nvfp4(seed=2))
    compiled_model = make_model(srnn.nvfp4(seed=2))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(compiled_model, fullgraph=True, backend=counter)
    if not COMPILES:  # older torch: a refusal instead of wrong gradients (under fullgraph
        # Dynamo reports it as an observed exception; without fullgraph it is the layer's)
        with pytest.raises(Exception):  # noqa: B017 - Dynamo's wrapper type varies
            compiled(batches[0])
        return
    for batch in batches:
        expected = eager(batch)
        expected.square().sum().backward()
        got = compiled(batch)
        got.square().sum().backward()
        assert torch.equal(got, expected)
    assert counter.frame_count == 1
    for a, b in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    assert int(compiled_model[0].step) == 3  # type: ignore[arg-type]


def test_sr_rounds_up_with_the_probability_of_the_discarded_fraction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dgrad's dy under an MXFP8 SR spec: over n steps each element takes its upper
    neighbour with frequency within 6 binomial standard deviations, sqrt(p (1 - p) / n),
    of p = (v - lower) / (upper - lower), its position between its two neighbours (the
    round-down and round-up results, read off the recorded values themselves)."""
    recipe = Recipe(dgrad_grad_output=QuantSpec("mxfp8_e4m3", "sr"), seed=6)
    reference, x, grad = fixed_data()
    layer = srnn.QuantizedLinear.from_linear(reference, recipe)
    steps = 200
    with recorded(monkeypatch) as calls:
        for _ in range(steps):
            one_step(layer, x, grad)
    samples = torch.stack([v for role, v in calls if role == "dgrad_grad_output"]).double()
    lower, upper = samples.min(0).values, samples.max(0).values
    moved = upper > lower
    assert float(moved.double().mean()) > 0.9  # nearly every element is inexact in e4m3
    p = ((grad.double() - lower) / (upper - lower))[moved]
    frequency = (samples == upper).double().mean(0)[moved]
    band = 6 * (p * (1 - p) / steps).sqrt() + 1e-12
    assert bool(((frequency - p).abs() <= band).all())


def test_bf16_parameters_with_the_sr_optimizer_train_under_nvfp4_and_resume_exactly() -> None:
    """The 6-byte configuration: bf16 parameters and bf16 AdamW states stored with SR
    (`stochround.optim.AdamW`), every linear layer under nvfp4(); the loss falls and a
    checkpoint resumes bit for bit."""

    def build() -> tuple[nn.Sequential, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(SIZE, SIZE), nn.GELU(), nn.Linear(SIZE, SIZE))
        model = model.to(torch.bfloat16)
        srnn.quantize_(model, srnn.nvfp4(seed=1))
        return model, sr.optim.AdamW(model.parameters(), lr=1e-2, seed=2)

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SIZE, SIZE, generator=generator).to(torch.bfloat16)
    target = torch.randn(SIZE, SIZE, generator=generator).to(torch.bfloat16)

    def steps(model: nn.Module, optimizer: torch.optim.Optimizer, count: int) -> list[float]:
        losses = []
        for _ in range(count):
            optimizer.zero_grad()
            loss = (model(inputs).float() - target.float()).square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    model, optimizer = build()
    losses = steps(model, optimizer, 10)
    assert losses[-1] < 0.8 * losses[0]
    state = optimizer.state[model[0].weight]  # type: ignore[index]
    assert model[0].weight.dtype == state["exp_avg"].dtype == torch.bfloat16
    checkpoint = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    steps(model, optimizer, 3)
    resumed, resumed_optimizer = build()
    resumed.load_state_dict(checkpoint[0])
    resumed_optimizer.load_state_dict(checkpoint[1])
    steps(resumed, resumed_optimizer, 3)
    for value, other in zip(
        model.state_dict().values(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(value, other)


def test_per_step_signs_are_fresh_each_step_and_shared_by_a_gemms_operands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[tuple[int, int]] = []
    original = matmul.random_signs

    def spy(size: int, seed: int, *, offset: Tensor, device: torch.device) -> Tensor:
        drawn.append((seed, int(offset)))
        return original(size, seed, offset=offset, device=device)

    monkeypatch.setattr(matmul, "random_signs", spy)
    reference, x, grad = fixed_data()
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.mxfp4_tseng(seed=8), layer_index=3)
    one_step(layer, x, grad)
    one_step(layer, x, grad)
    dgrad = [srnn.stream_offset(step, 3, linear.SIGN_SLOTS["dgrad"]) for step in (0, 1)]
    wgrad = [srnn.stream_offset(step, 3, linear.SIGN_SLOTS["wgrad"]) for step in (0, 1)]
    # one draw a GEMM a step, which both of its operands use
    key = stream_key(8, StreamDomain.RECIPE)  # the recipe's seed in its stream domain
    assert drawn == [(key, dgrad[0]), (key, wgrad[0]), (key, dgrad[1]), (key, wgrad[1])]


def test_training_steps_leave_torchs_global_generator_alone() -> None:
    reference, x, grad = fixed_data()
    layer = srnn.QuantizedLinear.from_linear(reference, srnn.nvfp4(seed=1))
    state = torch.get_rng_state()
    one_step(layer, x, grad)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.gpu
@pytest.mark.usefixtures("no_step_graphs")  # the eager route's operands, one by one
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_tseng", "mxfp8", "fp8", "int8"])
def test_cuda_quantizes_every_operand_as_the_cpu_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of the six operands bit for bit on CUDA (the Triton kernels) and on the CPU
    (the PyTorch path); y, dx and dW agree up to the GEMMs' order of accumulation.  Each
    operand quantized on its own: the two-orientation pair, which writes x's and dy's two
    at once, equals this path bit for bit (tests/kernels/test_two_orientation.py)."""
    from stochround.nn import orientations

    monkeypatch.setattr(orientations, "SERVES_STEPS", False)
    results = []
    for device in ("cpu", "cuda"):
        reference, x, grad = fixed_data()
        layer = srnn.QuantizedLinear.from_linear(reference.to(device), srnn.RECIPES[name]())
        with recorded(monkeypatch) as calls:
            outputs = one_step(layer, x.to(device), grad.to(device))
        results.append((dict(calls), [t.cpu() for t in outputs]))
    (cpu_calls, cpu_out), (cuda_calls, cuda_out) = results
    assert cpu_calls.keys() == cuda_calls.keys()
    for role, values in cpu_calls.items():
        assert torch.equal(cuda_calls[role].cpu(), values), role
    for mine, theirs in zip(cuda_out, cpu_out, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4 * float(theirs.abs().max()))


NAMED = ["nvfp4", "mxfp4_tseng", "mxfp8", "fp8", "int8"]
# the named recipes, and nvfp4() with power-of-two tensor scales (the GEMMs unscaled)
RECIPES = {**srnn.RECIPES, "nvfp4_pow2": functools.partial(srnn.nvfp4, tensor_scale="pow2")}


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("context", ["eval", "no_grad", "inference_mode"])
def test_inference_runs_one_token_and_checks_only_the_forward_gemm(name: str, context: str) -> None:
    """A batch of one token fits no block along the tokens, which only wgrad contracts: in
    eval mode (with grad mode on and x needing none), under no_grad and under
    inference_mode only fprop runs and only fprop is checked."""
    layer = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.RECIPES[name]())
    x = torch.randn(1, SIZE)
    if context == "eval":
        layer.weight.requires_grad_(False)
        y = layer.eval()(x)
    else:
        with torch.no_grad() if context == "no_grad" else torch.inference_mode():
            y = layer(x)
    assert y.shape == (1, SIZE) and bool(torch.isfinite(y).all())


@pytest.mark.parametrize("name", NAMED)
def test_a_frozen_weight_trains_the_input_with_any_token_count(name: str) -> None:
    """weight.requires_grad False: no wgrad runs, so 3 tokens (no block's multiple) give
    dx, and the weight no gradient."""
    layer = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.RECIPES[name]())
    layer.weight.requires_grad_(False)
    x = torch.randn(3, SIZE, requires_grad=True)
    layer(x).square().sum().backward()
    assert x.grad is not None and x.grad.shape == (3, SIZE) and layer.weight.grad is None
    assert int(layer.step) == 1


def padded_tokens(values: Tensor, tokens: int) -> Tensor:
    """``values`` (T, features) with zero rows appended up to ``tokens`` rows."""
    return torch.cat([values, values.new_zeros(tokens - values.shape[0], values.shape[1])])


@pytest.mark.parametrize(("name", "padded"), [("nvfp4", 32), ("mxfp4_tseng", 64), ("mxfp8", 32)])
def test_wgrad_pads_the_tokens_with_zeros_bit_for_bit_as_a_padded_batch(
    name: str, padded: int
) -> None:
    """20 tokens, no multiple of the wgrad blocks (and RHT): the layer pads dy^T and x^T
    with zero tokens up to the recipe's `token_multiple` (16, 64, 32), so y, dx, dW and the
    bias gradient equal, bit for bit, those of the same layer fed the batch padded with
    zero rows (whose y and dx rows are then dropped): zero tokens add nothing to dW's
    sums."""
    recipe = srnn.RECIPES[name](seed=3)
    assert linear.make_plan(recipe, 0).token_multiple == {"nvfp4": 16}.get(name, padded)
    reference, x, grad = fixed_data()
    x, grad = x[:20], grad[:20]
    layer = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe)
    y, dx, dw = one_step(layer, x, grad)
    bias_grad = layer.bias.grad.clone()  # type: ignore[union-attr]
    explicit = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe)
    y_pad, dx_pad, dw_pad = one_step(
        explicit, padded_tokens(x, padded), padded_tokens(grad, padded)
    )
    assert torch.equal(y, y_pad[:20]) and torch.equal(dx, dx_pad[:20])
    assert torch.equal(dw, dw_pad)
    assert torch.equal(bias_grad, explicit.bias.grad)  # type: ignore[arg-type]


def test_an_input_of_the_wrong_width_raises_showing_its_shape() -> None:
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.mxfp8())
    with pytest.raises(ValueError, match=r"in_features=64 .*shape \(3, 100\)"):
        layer(torch.randn(3, 100))
    with pytest.raises(ValueError, match=r"in_features=64 .*shape \(\)"):
        layer(torch.tensor(1.0))


@pytest.mark.parametrize("shape", [(SIZE,), (SIZE, SIZE), (2, 32, SIZE)])
def test_the_output_is_a_tensor_of_its_own_not_a_view(shape: tuple[int, ...]) -> None:
    """nn.Linear returns a fresh tensor for a matrix (FSDP2 warns at every forward whose
    output is a view: in-place use of it would drop its pre-backward hook); so does the
    quantized layer, for every input shape."""
    assert nn.Linear(SIZE, SIZE)(torch.randn(SIZE, SIZE))._base is None
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.mxfp8())
    x = torch.randn(*shape, requires_grad=True)
    y = layer(x)
    assert y._base is None and y.shape == (*shape[:-1], SIZE)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == shape


@pytest.mark.compiles
@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize(
    "name",
    [
        "nvfp4",
        "nvfp4_pow2",
        "mxfp4_tseng",
        "mxfp8",
        "fp8",
        "int8",
    ],
)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cpu_as_cuda",
            marks=pytest.mark.skipif(not availability.INTERPRETED, reason="GPU: the cuda row"),
        ),
        pytest.param("cuda", marks=pytest.mark.gpu),
        pytest.param("cuda_graphs", marks=pytest.mark.gpu),
    ],
)
def test_inductor_gives_eagers_bits_for_every_named_recipe(
    name: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile(backend="inductor", fullgraph=True) on the CPU, on the CUDA route
    (CUDA, and CPU tensors under `cpu_as_cuda`: the kernels in Triton's interpreter),
    forward and backward, two steps of 20 tokens (wgrad pads them): no graph break, and
    y, dx, dW and db equal eager's bit for bit: the layer compiles as two opaque ops run
    by the eager code (`stochround.nn.opaque_matmul`; traced op by op, the RHT signs'
    Philox rounds, db's reduction and cuBLAS's order had each changed bits or compile
    time).  Each step compiled first, in a process that has not yet asked whether Triton
    imports (a first ask inside a trace had broken it), and before any eager step (the
    ops' fakes warm the eager route's per-shape state).
    "cuda_graphs": ``mode="reduce-overhead"`` (inductor's graphs replayed as CUDA graphs;
    three steps: a warm-up, the recording, a replay), which refused the first step while
    an unprepared kernel call kept a tensor (a ticket counter, an amax) in the graphs'
    pool."""
    from torch._dynamo.utils import counters

    # a fresh cache: each case compiles the forward once more, and a cache that outlived
    # eight of them would refuse the next (Dynamo's recompile limit, fatal under fullgraph)
    torch._dynamo.reset()
    reference, _, _ = fixed_data()
    recipe = RECIPES[name](seed=1)
    route = device == "cpu_as_cuda"
    mode, steps = ("reduce-overhead", 3) if device == "cuda_graphs" else (None, 2)
    device = "cuda" if device == "cuda_graphs" else device
    monkeypatch.setattr(availability, "_TRITON_IMPORT", [])  # not asked yet
    reference = reference.to("cpu" if route else device)
    eager = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe)
    compiled_layer = srnn.QuantizedLinear.from_linear(copy.deepcopy(reference), recipe)
    compiled = torch.compile(compiled_layer, backend="inductor", fullgraph=True, mode=mode)
    counters.clear()
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(20, SIZE, generator=generator).to(reference.weight.device)
        grad = torch.randn(20, SIZE, generator=generator).to(reference.weight.device)
        with availability.cpu_as_cuda() if route else contextlib.nullcontext():
            got = (*one_step(compiled, x, grad), compiled_layer.bias.grad.clone())  # type: ignore[union-attr]
        with availability.cpu_as_cuda() if route else contextlib.nullcontext():
            expected = (*one_step(eager, x, grad), eager.bias.grad.clone())  # type: ignore[union-attr]
        for what, mine, theirs in zip(("y", "dx", "dW", "db"), got, expected, strict=True):
            assert torch.equal(mine, theirs), f"{name} step {step}: {what}"
    assert not counters["graph_break"], dict(counters["graph_break"])
    # reduce-overhead falls back to plain inductor, silently, where it cannot capture
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.skipif(not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11")
@pytest.mark.parametrize("route", ["cpu", "cuda_route"])
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_tseng", "mxfp8", "fp8", "int8"])
def test_the_compiled_graphs_run_the_layer_as_two_opaque_ops(name: str, route: str) -> None:
    """AOTAutograd's graphs of a compiled step hold the layer as two ops, the forward
    (`opaque_matmul.quantized_linear`) and the backward, beside the step's advance, and no
    other op of the layer's: traced op by op, a step was some fifteen opaque kernel ops and
    a dozen of inductor's kernels, each with its host cost (a compiled step was slower than
    eager), and the RHT signs' Philox rounds, inlined, had doubled at each butterfly stage
    (minutes of compiling).  On the CUDA route too (CUDA, or `cpu_as_cuda`)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def capture(module: torch.fx.GraphModule, inputs: Any) -> Any:
        graphs.append(module)
        return module.forward

    torch._dynamo.reset()
    gpu = route == "cuda_route" and torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    layer = srnn.QuantizedLinear(SIZE, SIZE, recipe=srnn.RECIPES[name](), device=device)
    compiled = torch.compile(
        layer, fullgraph=True, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture)
    )
    x = torch.randn(SIZE, SIZE, device=device, requires_grad=True)
    interpreted = route == "cuda_route" and not gpu
    with availability.cpu_as_cuda() if interpreted else contextlib.nullcontext():
        compiled(x).sum().backward()
    forward, backward = (
        [node.format_node() for node in graph.graph.nodes if node.op == "call_function"]
        for graph in graphs
    )
    assert sum("stochround.quantized_linear.default" in each for each in forward) == 1
    assert sum("stochround.nn_advance_step.default" in each for each in forward) == 1
    # the advance's functionalized form: getitems of its results, the buffer's copy; the
    # step's offsets column from the layer's stream_bases (an add)
    others = [each for each in forward if "stochround" not in each]
    allowed = ("getitem", "copy_", "aten.add")
    assert all(any(kind in each for kind in allowed) for each in others), others
    assert sum("aten.add" in each for each in forward) == 1
    assert sum("stochround.quantized_linear_backward.default" in each for each in backward) == 1
    assert all("stochround" not in each or "quantized_linear" in each for each in backward)
    assert not any("bitwise_xor" in each for each in forward + backward)


def test_native_fp8_gemms_need_fp8_tensor_cores() -> None:
    """gemm='native' refuses a CPU input (and a GPU without FP8 tensor cores) by name."""
    layer = srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.fp8(native=True))
    assert (
        layer.plan.native
        and not srnn.QuantizedLinear.from_linear(fixed_data()[0], srnn.fp8()).plan.native
    )
    with pytest.raises(ValueError, match="gemm='native' runs FP8 tensor-core GEMMs, on CUDA"):
        layer(torch.randn(4, SIZE))


@pytest.mark.gpu
def test_native_fp8_gemms_take_the_emulations_operands_and_agree_up_to_accumulation() -> None:
    """The same quantized operands (bit for bit) multiplied on the FP8 tensor cores: y, dx
    and dW within a relative error the accumulation order explains."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 tensor cores")
    reference, x, grad = fixed_data()
    results = []
    for native in (False, True):
        layer = srnn.QuantizedLinear.from_linear(
            copy.deepcopy(reference).cuda().bfloat16(), srnn.fp8(native=native)
        )
        results.append(one_step(layer, x.cuda().bfloat16(), grad.cuda().bfloat16()))
    for emulated, native in zip(*results, strict=True):
        error = (native.float() - emulated.float()).norm() / emulated.float().norm()
        assert float(error) < 2**-7


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*NAMED, "nvfp4_pow2"])
def test_a_training_step_captured_as_a_cuda_graph_replays_the_eager_steps_bits(name: str) -> None:
    """Three warm-up steps, then the fourth step captured as one CUDA graph and replayed:
    its y, dx and dW equal an eager layer's fourth step bit for bit (the step counter is
    read on the device, so the replay draws the fourth step's random bits)."""
    reference, x, grad = fixed_data()
    x, grad = x.cuda().bfloat16(), grad.cuda().bfloat16()
    eager = srnn.QuantizedLinear.from_linear(
        copy.deepcopy(reference).cuda().bfloat16(), RECIPES[name]()
    )
    for _ in range(3):
        one_step(eager, x, grad)
    expected = one_step(eager, x, grad)
    graphed = srnn.QuantizedLinear.from_linear(
        copy.deepcopy(reference).cuda().bfloat16(), RECIPES[name]()
    )
    inputs = x.clone().requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            inputs.grad = None
            graphed.zero_grad(set_to_none=True)
            graphed(inputs).backward(grad)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    inputs.grad = None
    graphed.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        y = graphed(inputs)
        y.backward(grad)
    graph.replay()
    torch.cuda.synchronize()
    got = (y.detach(), inputs.grad, graphed.weight.grad)
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)  # type: ignore[arg-type]
    assert int(graphed.step) == int(eager.step) == 4
