"""Gradients of `stochround.ops` (`arith/gradients.py`): every operation carries the exact
operation's derivative, straight through the rounding, and keeps its rounded values bit for
bit.  The forward is rounded, so finite differences (gradcheck) do not apply: the gradients
are compared with torch's analytic gradients of the exact operation on the same inputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from stochround import arith

# the Triton matmul runs on CUDA tensors on the GPU machine, in the interpreter elsewhere
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_INTS = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _bits(x: Tensor) -> Tensor:
    """x's bit patterns (every dtype here is a float of 16, 32 or 64 bits)."""
    return x.detach().contiguous().view(_INTS[x.element_size() * 8]).cpu()


def _same_bits(actual: Tensor, expected: Tensor) -> bool:
    return actual.dtype == expected.dtype and torch.equal(_bits(actual), _bits(expected))


def _inputs(
    *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> list[Tensor]:
    """Leaves requiring grad, positive where an op needs it (sqrt) and away from zero (div)."""
    generator = torch.Generator().manual_seed(sum(map(len, shapes)))
    tensors = []
    for shape in shapes:
        values = torch.randn(shape, generator=generator)
        values = torch.where(values.abs() < 0.25, values.sign() + values, values)
        tensors.append(values.to(dtype).to(device).requires_grad_())
    return tensors


# name -> (the sr.ops call with rounding arguments, the exact torch operation, input shapes)
_OPERATIONS: dict[str, tuple[Callable[..., Tensor], Callable[..., Tensor], list[tuple]]] = {
    "add": (arith.add, torch.add, [(3, 4), (4,)]),
    "sub": (arith.sub, torch.sub, [(3, 4), (3, 4)]),
    "mul": (arith.mul, torch.mul, [(3, 4), (3, 1)]),
    "div": (arith.div, torch.div, [(3, 4), (3, 4)]),
    "fma": (arith.fma, lambda x, y, z: x * y + z, [(3, 4), (4,), (3, 4)]),
    "sqrt": (lambda x, *r, **k: arith.sqrt(x.abs(), *r, **k), lambda x: x.abs().sqrt(), [(3, 4)]),
    "sum": (arith.sum, lambda x: x.sum(-1), [(3, 5)]),
    "sum dim 0": (
        lambda x, *r, **k: arith.sum(x, *r, dim=0, order="pairwise", **k),
        lambda x: x.sum(0),
        [(5, 3)],
    ),
    "sum compensated": (
        lambda x, *r, **k: arith.sum(x, *r, order="compensated", **k),
        lambda x: x.sum(-1),
        [(2, 6)],
    ),
    "dot": (arith.dot, lambda x, y: (x * y).sum(-1), [(3, 5), (5,)]),
    "dot exact products": (
        lambda x, y, *r, **k: arith.dot(x, y, *r, product_fmt="exact", dim=0, **k),
        lambda x, y: (x * y).sum(0),
        [(5, 3), (5, 3)],
    ),
    "matmul": (arith.matmul, torch.matmul, [(2, 3, 5), (5, 4)]),
}


def _gradients(output: Tensor, inputs: list[Tensor], upstream: Tensor) -> tuple[Tensor, ...]:
    return torch.autograd.grad(output, inputs, upstream)


@pytest.mark.parametrize("mode", ["rne", "sr"])
@pytest.mark.parametrize("name", sorted(_OPERATIONS))
def test_gradients_are_the_exact_operations(name: str, mode: str) -> None:
    """d op / d input = torch's gradient of the exact op, bit for bit (the old code gave
    zeros: the rounding steps' gradients)."""
    op, exact, shapes = _OPERATIONS[name]
    inputs = _inputs(*shapes)
    output = op(*inputs, "bf16", mode, seed=5)
    reference = exact(*inputs)
    assert output.requires_grad and output.shape == reference.shape
    upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(1))
    got = _gradients(output, inputs, upstream)
    want = _gradients(reference, inputs, upstream)
    for index, (actual, expected) in enumerate(zip(got, want, strict=True)):
        assert _same_bits(actual, expected), f"{name}: input {index}"
        assert bool((actual != 0).any()), f"{name}: input {index} has zero gradient"


@pytest.mark.parametrize("name", sorted(_OPERATIONS))
def test_values_are_the_rounded_values_bit_for_bit(name: str) -> None:
    """Recording autograd changes no bit of the result."""
    op, _, shapes = _OPERATIONS[name]
    inputs = _inputs(*shapes)
    recorded = op(*inputs, "e4m3fn", "sr", seed=2)
    plain = op(*(x.detach() for x in inputs), "e4m3fn", "sr", seed=2)
    assert recorded.requires_grad and not plain.requires_grad
    assert _same_bits(recorded, plain)


def test_specials_keep_their_bits_under_autograd() -> None:
    """-0, infinities and NaN come back as the rounding gives them (a straight-through
    ``exact + (rounded - exact).detach()`` would turn inf into NaN and -0 into +0)."""
    x = torch.tensor([-0.0, float("inf"), 1.0, float("nan"), 3e38], requires_grad=True)
    y = torch.tensor([-0.0, 1.0, float("-inf"), 1.0, 3e38], requires_grad=True)
    for mode in ("rne", "rd", "sr"):
        recorded = arith.add(x, y, "bf16", mode, seed=0)
        plain = arith.add(x.detach(), y.detach(), "bf16", mode, seed=0)
        assert _same_bits(recorded, plain), mode
        # -0 + -0 is -0; 3e38 + 3e38 is inf in fp32, bf16's max in rd: never NaN
        assert torch.signbit(recorded[0]) and not torch.isnan(recorded[4])
        (dx, dy) = torch.autograd.grad(recorded.sum(), (x, y))
        assert torch.equal(dx, torch.ones(5)) and torch.equal(dy, torch.ones(5))


def test_no_gradient_recorded_without_autograd() -> None:
    """Under no_grad, or with no input requiring grad, the result requires no grad."""
    x, y = _inputs((4,), (4,))
    with torch.no_grad():
        assert not arith.mul(x, y, "bf16", "sr", seed=0).requires_grad
        assert not arith.matmul(x[None], y[:, None], "bf16").requires_grad
    assert not arith.sum(x.detach(), "bf16").requires_grad
    # one input requiring grad: only it gets a gradient
    output = arith.mul(x, y.detach(), "bf16", "sr", seed=0)
    (dx,) = torch.autograd.grad(output.sum(), (x,))
    assert _same_bits(dx, y.detach())


def test_mixed_dtypes_give_each_input_its_own_dtype() -> None:
    """The exact op runs in the result dtype (float32 here); each gradient returns in its
    input's dtype and shape, as torch's own promotion and broadcasting give."""
    (x,) = _inputs((3, 4), dtype=torch.bfloat16)
    (y,) = _inputs((4,), dtype=torch.float32)
    output = arith.mul(x, y, "bf16", "sr", seed=0)
    assert output.dtype == torch.float32
    upstream = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    got = _gradients(output, [x, y], upstream)
    want = _gradients(x.float() * y, [x, y], upstream)
    assert got[0].dtype == torch.bfloat16 and got[1].shape == (4,)
    assert all(_same_bits(a, b) for a, b in zip(got, want, strict=True))


def test_zero_dim_operands_promote_as_the_result_dtype() -> None:
    """A 0-d float64 operand promotes the result (unlike torch's own promotion): the exact
    op runs in float64 and the fp32 operand's gradient comes back in fp32."""
    x = torch.tensor([1.5, -2.0], requires_grad=True)
    y = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    output = arith.mul(x, y, "bf16")
    assert output.dtype == torch.float64
    dx, dy = torch.autograd.grad(output.sum(), (x, y))
    assert dx.dtype == torch.float32 and torch.equal(dx, torch.full((2,), 3.0))
    assert dy.dtype == torch.float64 and dy.item() == -0.5


def test_result_can_be_updated_in_place() -> None:
    """The result is no view of an internal tensor: an in-place update records normally."""
    (x,) = _inputs((4,))
    output = arith.mul(x, x, "bf16", "sr", seed=0)
    output += 1
    (dx,) = torch.autograd.grad(output.sum(), (x,))
    assert _same_bits(dx, 2 * x.detach())


def test_second_derivatives_are_the_exact_operations() -> None:
    """The exact op's graph is differentiated as torch's: d2 (x y) / dx dy = 1, and the
    Hessian of sum(x * x) is 2."""
    x, y = _inputs((4,), (4,))
    output = arith.mul(x, y, "bf16", "sr", seed=0)
    (dx,) = torch.autograd.grad(output.sum(), (x,), create_graph=True)
    (dxdy,) = torch.autograd.grad(dx.sum(), (y,))
    assert torch.equal(dxdy, torch.ones(4))
    square = arith.dot(x, x, "bf16", "sr", seed=0)
    (gradient,) = torch.autograd.grad(square, (x,), create_graph=True)
    (curvature,) = torch.autograd.grad(gradient.sum(), (x,))
    assert torch.equal(curvature, torch.full((4,), 2.0))


def test_round_pair_passes_the_gradient_to_both_halves() -> None:
    hi = torch.tensor([1.0, 2.0**-30, -3.0], dtype=torch.float64, requires_grad=True)
    lo = torch.tensor([2.0**-60, 0.0, -(2.0**-70)], dtype=torch.float64, requires_grad=True)
    output = arith.round_pair(hi, lo, "bf16", "sr", seed=0)
    plain = arith.round_pair(hi.detach(), lo.detach(), "bf16", "sr", seed=0)
    assert _same_bits(output, plain)
    dhi, dlo = torch.autograd.grad(output, (hi, lo), torch.tensor([1.0, 2.0, 3.0]).double())
    assert torch.equal(dhi, torch.tensor([1.0, 2.0, 3.0]).double()) and torch.equal(dhi, dlo)


def test_triton_matmul_carries_the_gradient() -> None:
    """The kernel's result (interpreted on CPU) carries torch.matmul's gradient too; the old
    code returned a result that required no grad."""
    a, b = _inputs((2, 3, 5), (5, 4), device=DEVICE)
    output = arith.matmul(a, b, "bf16", "sr", seed=3, backend="triton")
    plain = arith.matmul(a.detach(), b.detach(), "bf16", "sr", seed=3, backend="triton")
    assert output.requires_grad and _same_bits(output, plain)
    upstream = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    got = _gradients(output, [a, b], upstream)
    want = _gradients(torch.matmul(a, b), [a, b], upstream)
    assert all(_same_bits(x, y) for x, y in zip(got, want, strict=True))
