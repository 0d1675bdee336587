"""Reductions (`arith/reductions.py`: `sum`, `dot`, `matmul`) against loops of the scalar
reference."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from helpers import assert_same_values

from stochround import arith, reference
from stochround import random as streams
from stochround.formats import format as find_format

FORMATS = ("bf16", "fp16", "e4m3fn")
ORDERS = arith.ORDERS
BLOCK = 8  # 33 terms: four full blocks and one of a single term
DETERMINISTIC_MODES = ("rne", "rz", "ru", "rd", "ro")
SR_CASES = ((4, "c"), (3, "a"), (None, "c"))  # (rbits, variant); None: exact SR


class Reference:
    """Scalar rounding of exact values, with the random integer of (step, row, lane)."""

    def __init__(self, fmt, mode, rbits=None, variant="c", rand=None):
        self.fmt, self.mode, self.variant = find_format(fmt), mode, variant
        self.n = reference.check_rbits(rbits)
        self.rand = rand  # nested lists [step][row][lane], or None

    def round(self, value, t, row, lane):
        r = None if self.rand is None else self.rand[t][row][lane]
        return reference.round_checked(value, self.fmt, self.mode, self.n, self.variant, "none", r)

    def add(self, a, b, t, row, lane):
        exact = Fraction(a) + Fraction(b)
        if exact == 0:  # IEEE 754 6.3: -0 when both are -0, or in rd unless both are +0
            both_negative = math.copysign(1, a) < 0 and math.copysign(1, b) < 0
            both_positive = math.copysign(1, a) > 0 and math.copysign(1, b) > 0
            negative = both_negative or (self.mode == "rd" and not both_positive)
            return self.round(-0.0 if negative else 0.0, t, row, lane)
        return self.round(exact, t, row, lane)

    def sub(self, a, b, t, row, lane):
        return self.add(a, -b, t, row, lane)


def reference_sum(terms, order, block, ref, row):
    """The order's definition (arith.sum's docstring), one addition at a time."""
    n = len(terms)
    if order == "recursive":
        total = ref.round(terms[0], 0, row, 0)
        for i in range(1, n):
            total = ref.add(total, terms[i], i, row, 0)
        return total
    if order == "pairwise":
        level = [ref.round(v, 0, row, lane) for lane, v in enumerate(terms)]
        t = 1
        while len(level) > 1:
            pairs = len(level) // 2
            sums = [ref.add(level[2 * k], level[2 * k + 1], t, row, k) for k in range(pairs)]
            level = sums + level[2 * pairs :]
            t += 1
        return level[0]
    if order == "blocked":
        blocks = [terms[k : k + block] for k in range(0, n, block)]
        partial = []
        for lane, part in enumerate(blocks):
            total = ref.round(part[0], 0, row, lane)
            for j in range(1, len(part)):
                total = ref.add(total, part[j], j, row, lane)
            partial.append(total)
        inner = min(block, n)
        total = partial[0]
        for u in range(1, len(partial)):
            total = ref.add(total, partial[u], inner + u - 1, row, 0)
        return total
    total, compensation = ref.round(terms[0], 0, row, 0), 0.0
    for i in range(1, n):
        base = 1 + 4 * (i - 1)
        corrected = ref.sub(terms[i], compensation, base, row, 0)
        new_total = ref.add(total, corrected, base + 1, row, 0)
        difference = ref.sub(new_total, total, base + 2, row, 0)
        compensation = ref.sub(difference, corrected, base + 3, row, 0)
        total = new_total
    return total


def _terms(rows: int, length: int, seed: int) -> torch.Tensor:
    """fp32 terms of both signs and spread magnitudes (cancellation, several binades)."""
    generator = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-3, 3, (rows, length), generator=generator)
    return torch.randn(rows, length, generator=generator) * scale


def _random_integers(shape, rbits, seed):
    generator = torch.Generator().manual_seed(seed)
    high = 2 ** reference.check_rbits(rbits)
    return torch.randint(0, high, shape, generator=generator, dtype=torch.int64)


def _expected_sums(x, order, ref):
    return [reference_sum(row, order, BLOCK, ref, i) for i, row in enumerate(x.tolist())]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("order", ORDERS)
def test_sum_deterministic_modes_match_reference(fmt, order):
    x = _terms(3, 33, seed=1)
    for mode in DETERMINISTIC_MODES:
        got = arith.sum(x, fmt, mode, order=order, block=BLOCK)
        assert got.dtype == x.dtype and got.shape == (3,)
        expected = _expected_sums(x, order, Reference(fmt, mode))
        assert_same_values(got, expected, f"{fmt} {order} {mode}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("order", ORDERS)
def test_sum_sr_with_explicit_rand_matches_reference(fmt, order):
    x = _terms(3, 33, seed=2)
    shape = arith.reduction_rand_shape((3,), 33, order, BLOCK)
    for k, (rbits, variant) in enumerate(SR_CASES):
        rand = _random_integers(shape, rbits, seed=10 + k)
        got = arith.sum(
            x, fmt, "sr", order=order, block=BLOCK, rbits=rbits, variant=variant, rand=rand
        )
        ref = Reference(fmt, "sr", rbits, variant, rand.tolist())
        assert_same_values(got, _expected_sums(x, order, ref), f"{fmt} {order} {rbits}{variant}")


@pytest.mark.parametrize("order", ORDERS)
def test_stream_mapping_is_the_documented_one(order):
    """Step t draws words (seed, offset + t, row-major index in its (*batch, w_t) tensor)."""
    x = _terms(4, 21, seed=3)
    seed, offset = 1234, 77
    steps, _, width = arith.reduction_rand_shape((4,), 21, order, BLOCK)
    words = torch.zeros(steps, 4, width, dtype=torch.int64)  # lanes past w_t are unread
    widths = _step_widths(21, order)
    for t, w in enumerate(widths):
        index = torch.arange(4 * w).reshape(4, w)
        words[t, :, :w] = streams.random_words(index, seed, offset + t)
    from_stream = arith.sum(x, "bf16", "sr", order=order, block=BLOCK, seed=seed, offset=offset)
    explicit = arith.sum(x, "bf16", "sr", order=order, block=BLOCK, rand=words)
    assert torch.equal(from_stream, explicit)


def _step_widths(length, order):
    if order in ("recursive", "compensated"):
        steps, _ = arith.reduction_rand_shape((), length, order, BLOCK)
        return [1] * steps
    if order == "blocked":
        blocks = -(-length // BLOCK)
        return [blocks] * min(BLOCK, length) + [1] * (blocks - 1)
    widths, width = [length], length
    while width > 1:
        widths.append(width // 2)
        width -= width // 2
    return widths


def test_sum_seed_reproducible_and_seeds_differ():
    x = _terms(8, 33, seed=4)
    for order in ORDERS:
        first = arith.sum(x, "bf16", "sr", order=order, seed=5)
        again = arith.sum(x, "bf16", "sr", order=order, seed=5)
        other = arith.sum(x, "bf16", "sr", order=order, seed=6)
        shifted = arith.sum(x, "bf16", "sr", order=order, seed=5, offset=1000)
        assert torch.equal(first, again), order
        assert not torch.equal(first, other), order
        assert not torch.equal(first, shifted), order


def test_sum_dim_and_batch_layout():
    x = _terms(6, 33, seed=5).reshape(2, 3, 33).movedim(-1, 1)  # reduce the middle dim
    got = arith.sum(x, "fp16", "rne", dim=1, order="pairwise")
    want = arith.sum(x.movedim(1, -1), "fp16", "rne", order="pairwise")
    assert got.shape == (2, 3) and torch.equal(got, want)


def _product(a: float, b: float) -> float | Fraction:
    return Fraction(a) * Fraction(b) if a * b != 0 else a * b


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("order", ("recursive", "blocked", "pairwise"))
def test_dot_matches_reference(fmt, order):
    x, y = _terms(2, 33, seed=6), _terms(2, 33, seed=7)
    for mode, rbits, product_fmt in (("rne", None, None), ("sr", 4, "fp16"), ("ru", None, "exact")):
        rand = None
        product_rand = None
        if mode == "sr":
            product_rand = _random_integers((2, 33), rbits, seed=8)
            sum_rand = _random_integers(arith.reduction_rand_shape((2,), 33, order, BLOCK), 4, 9)
            rand = (product_rand, sum_rand)
        got = arith.dot(
            x, y, fmt, mode, product_fmt=product_fmt, order=order, block=BLOCK,
            rbits=rbits, rand=rand,
        )  # fmt: skip
        pfmt = fmt if product_fmt is None else product_fmt
        expected = []
        for row, (xs, ys) in enumerate(zip(x.tolist(), y.tolist(), strict=True)):
            exact = [_product(a, b) for a, b in zip(xs, ys, strict=True)]
            if pfmt == "exact":
                products = exact
            else:
                words = None if product_rand is None else [[product_rand[row].tolist()]]
                product_ref = Reference(pfmt, mode, rbits, "c", words)
                products = [product_ref.round(p, 0, 0, i) for i, p in enumerate(exact)]
            sum_words = None if rand is None else rand[1].tolist()
            ref = Reference(fmt, mode, rbits, "c", sum_words)
            expected.append(reference_sum(products, order, BLOCK, ref, row))
        assert_same_values(got, expected, f"{fmt} {order} {mode} {product_fmt}")


@pytest.mark.parametrize("order", ("recursive", "blocked"))
def test_matmul_matches_dot_loop_of_reference(order):
    a, b = _terms(3, 10, seed=10), _terms(10, 4, seed=11)
    for mode in ("rne", "rz"):
        got = arith.matmul(a, b, "bf16", mode, order=order, block=4)
        assert got.shape == (3, 4)
        ref = Reference("bf16", mode)
        expected = []
        for i in range(3):
            for j in range(4):
                products = [ref.round(_product(a[i, k].item(), b[k, j].item()), 0, 0, 0)
                            for k in range(10)]  # fmt: skip
                expected.append(reference_sum(products, order, 4, ref, 0))
        assert_same_values(got, expected, f"matmul {order} {mode}")
    # SR: reproducible, seeds differ, and equal to the dot it is defined as
    sr_once = arith.matmul(a, b, "bf16", "sr", order=order, block=4, seed=3)
    assert torch.equal(sr_once, arith.matmul(a, b, "bf16", "sr", order=order, block=4, seed=3))
    assert not torch.equal(sr_once, arith.matmul(a, b, "bf16", "sr", order=order, seed=4))
    as_dot = arith.dot(a[:, None, :], b.T[None], "bf16", "sr", order=order, block=4, seed=3)
    assert torch.equal(sr_once, as_dot)


def test_long_bf16_sum_other_orders_beat_recursive():
    """Round-to-nearest, so deterministic.  2048 terms in [0, 1) (bf16 values), exact sum
    S ~ 1024.  Recursive stagnates: once s >= 256 the bf16 ulp is 2 and every term is below
    half an ulp, so s < 512 forever and its relative error exceeds 1 - 512 / S ~ 0.5.
    First-order bounds for the others (u = 2**-8, all terms positive): pairwise
    ceil(log2 n) u = 0.043, blocked (b + n / b) u = 0.375 (b = 32), Kahan 2u + n u**2 =
    0.039."""
    generator = torch.Generator().manual_seed(12)
    x = torch.rand(2048, generator=generator).to(torch.bfloat16).to(torch.float32)
    exact = float(x.double().sum())  # exact: 2048 terms of 8 bits, far below 53 bits
    errors = {
        order: abs(float(arith.sum(x, "bf16", "rne", order=order)) - exact) / exact
        for order in ORDERS
    }
    assert errors["recursive"] > 1 - 512 / exact > 0.4
    assert errors["pairwise"] <= 11 * 2**-8
    assert errors["blocked"] <= (32 + 64) * 2**-8
    assert errors["compensated"] <= 2 * 2**-8 + 2048 * 2**-16
    for order in ("pairwise", "blocked", "compensated"):
        assert errors[order] < errors["recursive"] / 4, errors


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda x: arith.sum(x, "bf16", order="sideways"), "order"),
        (lambda x: arith.sum(x, "bf16", order="blocked", block=0), "block"),
        (lambda x: arith.sum(x, "bf16", dim=2), "dim"),
        (lambda x: arith.sum(x[:, :0], "bf16"), "no elements"),
        (
            lambda x: arith.sum(x, "bf16", "sr", rand=torch.zeros(5, 3, 1, dtype=torch.int64)),
            "rand",
        ),
        (lambda x: arith.sum(x, "bf16", "fast"), "mode"),
        (lambda x: arith.dot(x, x[:, :3], "bf16"), "broadcast"),
        (lambda x: arith.matmul(x, x, "bf16"), "shapes"),
        (lambda x: arith.matmul(x[0], x.T, "bf16"), "a must have at least 2 dims"),
        (lambda x: arith.reduction_rand_shape((), 0), "length"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, name):
    x = _terms(2, 5, seed=14)
    with pytest.raises(ValueError, match=name):
        call(x)


def test_dot_stream_products_at_offset_then_sum_from_offset_plus_one():
    x, y = _terms(3, 17, seed=15), _terms(3, 17, seed=16)
    got = arith.dot(x, y, "bf16", "sr", order="pairwise", seed=9, offset=40)
    products = arith.mul(x, y, "bf16", "sr", seed=9, offset=40)
    want = arith.sum(products, "bf16", "sr", order="pairwise", seed=9, offset=41)
    assert torch.equal(got, want)


def test_matmul_backend_triton_refusal_names_the_reason_and_the_backends() -> None:
    """The kernel decision goes through `use_kernel`: backend="triton" on inputs the kernel
    cannot serve raises its one message, the refusal between its two halves (the tensors
    where the kernels run, so that the order is the refusal, not the device)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.ones(2, 3, device=device), torch.ones(3, 2, device=device)
    with pytest.raises(
        ValueError,
        match=r"^backend='triton' cannot serve this call: .*pairwise.*; use backend='torch' or "
        r"'auto'$",
    ):
        arith.matmul(a, b, "bf16", order="pairwise", backend="triton")


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_matmul_backend_auto_on_the_cpu_gives_the_torch_paths_bits(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 5, generator=gen), torch.randn(5, 3, generator=gen)
    torch_bits = arith.matmul(a, b, "e4m3fn", mode, seed=7, offset=2, backend="torch")
    auto_bits = arith.matmul(a, b, "e4m3fn", mode, seed=7, offset=2, backend="auto")
    assert torch.equal(torch_bits.view(torch.int32), auto_bits.view(torch.int32))
    torch.manual_seed(11)
    unseeded_torch = arith.matmul(a, b, "e4m3fn", mode, backend="torch")
    torch.manual_seed(11)
    unseeded_auto = arith.matmul(a, b, "e4m3fn", mode, backend="auto")
    assert torch.equal(unseeded_torch.view(torch.int32), unseeded_auto.view(torch.int32))
