"""The random Hadamard transform (`stochround.blocks.hadamard`): the matrix it applies, its
fixed float32 arithmetic, the inverse within a derived rounding bound, the signs drawn from
the core stream, errors, torch.compile.

The rounding bound used below (unit roundoff ``u``, ``gamma_m = m u / (1 - m u)``, Higham,
"Accuracy and Stability of Numerical Algorithms", Lemma 3.1 and section 4.2). Write
``M = H_n / sqrt(n)`` and ``k = log2(n)``. The butterfly forms each output as a sum of the
``n`` signed inputs through a tree of depth ``k``, so every input term carries ``k``
rounding factors ``(1 + delta)``; the normalization constant (rounded once for odd ``k``)
and the multiplication by it add two more. Hence the computed forward transform is
``y_hat = M D x + e1`` with ``|e1| <= gamma_{k+2} |M| |x|`` elementwise. The inverse,
computed from ``y_hat``, is ``x_hat = D M y_hat + e2`` with ``|e2| <= gamma_{k+2} |M|
|y_hat|``. Since ``D M M D = I`` and ``|M| |M|`` is the all-ones matrix (``n`` products of
``1/sqrt(n)`` each), for every element ``i`` of a group::

    |x_hat_i - x_i| <= |M| |e1| + |e2| <= gamma_{k+2} (2 + gamma_{k+2}) * sum_j |x_j|

(``|y_hat| <= |M| |x| + |e1|``). The forward transform alone is within ``gamma_{k+2}
(1/sqrt(n)) sum_j |x_j|`` of the exact ``M D x``.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import pytest
import torch

from stochround import random as streams
from stochround.block_constants import HADAMARD_SIZES
from stochround.blocks.hadamard import (
    NORMALIZATION,
    hadamard,
    hadamard_fp32,
    inverse_hadamard,
    inverse_hadamard_fp32,
    random_signs,
)
from stochround.blocks.quantize import quantize

FP32_UNIT_ROUNDOFF = 2.0**-24
FP64_UNIT_ROUNDOFF = 2.0**-53


def gamma(m: int, unit_roundoff: float = FP32_UNIT_ROUNDOFF) -> float:
    """Higham's ``gamma_m = m u / (1 - m u)``."""
    return m * unit_roundoff / (1 - m * unit_roundoff)


def sylvester(size: int) -> torch.Tensor:
    """The ±1 Sylvester Hadamard matrix by its recursion ``H_2m = [[H, H], [H, -H]]``."""
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float32 or float64 tensor, for exact comparison."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def heavy_tailed(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """float32 values of mixed magnitudes (a few outliers), reproducible."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    scale = torch.exp2(torch.randint(-6, 7, shape, generator=generator).to(torch.float64))
    return (values * scale).to(torch.float32)


# --- the matrix --------------------------------------------------------------------------


@pytest.mark.parametrize("size", HADAMARD_SIZES)
def test_the_transform_of_the_identity_is_the_scaled_sylvester_matrix(size: int) -> None:
    """hadamard(I) holds M = H/sqrt(n) column by column; H is Sylvester's (entry (i, j) is
    (-1)**popcount(i & j)), every entry is exactly ±NORMALIZATION[n], and the ±1 matrix
    satisfies H H^T = n I exactly."""
    identity = torch.eye(size, dtype=torch.float32)
    matrix = hadamard(identity, size, axis=0)  # column j: M e_j
    signs = torch.sign(matrix).to(torch.float64)
    assert torch.equal(matrix.abs(), torch.full_like(matrix, NORMALIZATION[size]))
    assert torch.equal(signs, sylvester(size))
    index = torch.arange(size)
    popcount = torch.tensor([bin(v).count("1") for v in (index[:, None] & index).flatten()])
    assert torch.equal(signs.flatten(), (1 - 2 * (popcount % 2)).to(torch.float64))
    assert torch.equal(signs @ signs.T, size * torch.eye(size, dtype=torch.float64))
    # the rows direction gives the same matrix (it is symmetric)
    assert torch.equal(hadamard(identity, size, axis=1), matrix)


def test_the_normalization_is_the_float32_nearest_to_one_over_sqrt_n() -> None:
    """Powers of two for n = 16, 64, 256; for 32 and 128 the float32 nearest to 1/sqrt(n)
    (checked exactly: within half a float32 ulp of the true value, whose square is 1/n)."""
    for size in HADAMARD_SIZES:
        constant = NORMALIZATION[size]
        assert torch.tensor(constant, dtype=torch.float32).item() == constant
        exact_square = Fraction(1, size)
        if math.log2(size) % 2 == 0:
            assert Fraction(constant) ** 2 == exact_square
            continue
        ulp = Fraction(2) ** (math.frexp(constant)[1] - 24)
        # |c - 1/sqrt(n)| < ulp/2  <=>  (c - ulp/2)^2 < 1/n < (c + ulp/2)^2  (c > ulp/2 > 0)
        assert (
            (Fraction(constant) - ulp / 2) ** 2 < exact_square < (Fraction(constant) + ulp / 2) ** 2
        )


# --- the fixed float32 arithmetic --------------------------------------------------------


def butterfly_by_loops(values: list[float], size: int) -> list[float]:
    """The module docstring's steps 2 and 3 one scalar at a time, each operation rounded to
    float32 (with torch 0-d float32 tensors): the spec, written independently."""

    def f32(value: float) -> float:
        return torch.tensor(value, dtype=torch.float32).item()

    v = [f32(value) for value in values]
    h = 1
    while h < size:
        for start in range(0, size, 2 * h):
            for j in range(start, start + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = f32(a + b), f32(a - b)
        h *= 2
    return [f32(value * NORMALIZATION[size]) for value in v]


@pytest.mark.parametrize("size", [16, 32, 128])
def test_the_float32_core_follows_the_scalar_butterfly_bit_for_bit(size: int) -> None:
    """hadamard_fp32 equals the butterfly done one scalar float32 operation at a time (Python
    floats are binary64, so a + b of two float32 values is exact before its rounding to
    float32: each step is one float32 operation)."""
    x = heavy_tailed((3, size), seed=size)
    signs = random_signs(size, seed=5)
    got = hadamard_fp32(x.reshape(1, -1), size, signs).reshape(3, size)
    for row in range(3):
        flipped = (x[row] * signs).tolist()
        expected = torch.tensor(butterfly_by_loops(flipped, size), dtype=torch.float32)
        assert torch.equal(bits(got[row]), bits(expected)), row
    # the inverse: the same butterfly, then the signs
    inverse = inverse_hadamard_fp32(x, size, signs)
    for row in range(3):
        unsigned = torch.tensor(butterfly_by_loops(x[row].tolist(), size), dtype=torch.float32)
        assert torch.equal(bits(inverse[row]), bits(unsigned * signs)), row


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_dtypes_transform_in_float32_and_round_back(dtype: torch.dtype) -> None:
    x = heavy_tailed((4, 64), seed=1).to(dtype)
    signs = random_signs(32, seed=2)
    y = hadamard(x, 32, signs=signs)
    assert y.dtype == dtype
    expected = hadamard_fp32(x.to(torch.float32), 32, signs).to(dtype)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    back = inverse_hadamard(y, 32, signs=signs)
    expected_back = inverse_hadamard_fp32(y.to(torch.float32), 32, signs).to(dtype)
    assert back.dtype == dtype and torch.equal(
        back.view(torch.int16), expected_back.view(torch.int16)
    )


def test_float64_transforms_in_float64_within_its_bound() -> None:
    """float64 keeps its precision: the result is float64 and within the float64 forward
    bound gamma_{k+2} sum|x| / sqrt(n) of the exact product (the reference's own float64
    matrix product error, at most gamma_n^{fp64} sum|x| / sqrt(n), is added)."""
    size = 128
    x = heavy_tailed((5, 2 * size), seed=3).to(torch.float64)
    signs = random_signs(size, seed=4)
    y = hadamard(x, size, signs=signs)
    assert y.dtype == torch.float64
    matrix = sylvester(size) / math.sqrt(size)
    groups = x.reshape(5, 2, size) * signs.to(torch.float64)
    exact = (groups @ matrix.T).reshape(5, 2 * size)
    k = size.bit_length() - 1
    sums = groups.abs().sum(-1, keepdim=True).expand(5, 2, size).reshape(5, 2 * size)
    bound = (gamma(k + 2, FP64_UNIT_ROUNDOFF) + gamma(size, FP64_UNIT_ROUNDOFF)) * sums
    assert bool(((y - exact).abs() <= bound / math.sqrt(size)).all())


# --- inverse and involution --------------------------------------------------------------


@pytest.mark.parametrize("size", HADAMARD_SIZES)
def test_the_inverse_gives_x_back_within_the_derived_bound(size: int) -> None:
    """inverse_hadamard(hadamard(x)) == x up to gamma_{k+2} (2 + gamma_{k+2}) sum_j |x_j| per
    group (module docstring), on heavy-tailed float32 data, with random signs; and the
    forward transform is within gamma_{k+2} sum|x| / sqrt(n) of the exact one."""
    x = heavy_tailed((6, 2 * size), seed=size)
    signs = random_signs(size, seed=11)
    y = hadamard(x, size, signs=signs)
    back = inverse_hadamard(y, size, signs=signs)
    k = size.bit_length() - 1
    g = gamma(k + 2)
    groups = x.to(torch.float64).reshape(6, 2, size)
    sums = groups.abs().sum(-1, keepdim=True).expand(6, 2, size).reshape(6, 2 * size)
    error = (back.to(torch.float64) - x.to(torch.float64)).abs()
    assert bool((error <= g * (2 + g) * sums).all())
    exact = ((groups * signs.to(torch.float64)) @ (sylvester(size) / math.sqrt(size)).T).reshape(
        6, 2 * size
    )
    # the float64 reference's own error is below gamma_n^{fp64} sum|x| / sqrt(n)
    forward_bound = (g + gamma(size, FP64_UNIT_ROUNDOFF)) * sums / math.sqrt(size)
    assert bool(((y.to(torch.float64) - exact).abs() <= forward_bound).all())


def test_without_signs_the_transform_is_its_own_inverse() -> None:
    """M is symmetric and orthogonal: with signs=None, hadamard and inverse_hadamard are the
    same computation (bit for bit), and applying it twice gives x within the bound."""
    x = heavy_tailed((3, 64), seed=7)
    assert torch.equal(bits(hadamard(x, 64)), bits(inverse_hadamard(x, 64)))
    twice = hadamard(hadamard(x, 64), 64)
    g = gamma(6 + 2)
    bound = g * (2 + g) * x.to(torch.float64).abs().sum(-1, keepdim=True)
    assert bool(((twice.to(torch.float64) - x.to(torch.float64)).abs() <= bound).all())


def test_powers_of_two_with_few_terms_round_trip_exactly() -> None:
    """Where no rounding happens the round trip is exact: small integers through n = 16
    (sums of 16 integers below 2**20 and the normalization 1/4 are exact in float32)."""
    generator = torch.Generator().manual_seed(8)
    x = torch.randint(-1000, 1000, (4, 32), generator=generator).to(torch.float32)
    signs = random_signs(16, seed=9)
    assert torch.equal(inverse_hadamard(hadamard(x, 16, signs=signs), 16, signs=signs), x)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_the_groups_run_along_the_given_axis(axis: int) -> None:
    """Any axis gives the transform of the tensor with that axis moved last, moved back."""
    x = heavy_tailed((32, 32, 32), seed=10)
    signs = random_signs(32, seed=1)
    expected = hadamard(x.movedim(axis, -1), 32, signs=signs).movedim(-1, axis)
    assert torch.equal(bits(hadamard(x, 32, signs=signs, axis=axis)), bits(expected))
    y = hadamard(x, 16, signs=signs[:16], axis=axis)
    expected_inverse = inverse_hadamard(y.movedim(axis, -1), 16, signs=signs[:16]).movedim(-1, axis)
    assert torch.equal(
        bits(inverse_hadamard(y, 16, signs=signs[:16], axis=axis)), bits(expected_inverse)
    )


def test_groups_are_independent_consecutive_runs() -> None:
    """An axis of 3 groups: each group of 16 consecutive values is transformed on its own."""
    x = heavy_tailed((2, 48), seed=12)
    whole = hadamard(x, 16)
    for group in range(3):
        part = slice(16 * group, 16 * group + 16)
        assert torch.equal(bits(whole[:, part]), bits(hadamard(x[:, part].contiguous(), 16)))


def test_empty_tensors_transform_to_empty_tensors() -> None:
    x = torch.empty(0, 32)
    assert hadamard(x, 16).shape == (0, 32)
    assert hadamard(torch.empty(3, 0), 16).shape == (3, 0)


# --- the signs ---------------------------------------------------------------------------


def test_random_signs_are_the_top_bits_of_the_stream() -> None:
    """sign i = +1 when the top bit of random_words(i, seed, offset) is 0, -1 when it is 1,
    for ints and tensor seeds and offsets beyond 2**63."""
    for seed, offset in ((0, 0), (7, 3), (2**64 - 1, 2**63)):
        signs = random_signs(256, seed, offset=offset)
        words = streams.random_words(torch.arange(256), seed, offset)
        expected = torch.where(words >= 2**31, -1.0, 1.0)
        assert signs.dtype == torch.float32 and signs.shape == (256,)
        assert torch.equal(signs, expected), (seed, offset)
        as_tensors = random_signs(
            256,
            torch.tensor(streams.as_signed64(seed)),
            offset=torch.tensor(streams.as_signed64(offset)),
        )
        assert torch.equal(as_tensors, signs)


def test_random_signs_are_fixed_values() -> None:
    """The stream is a pure function of (seed, offset, i): these values hold on every
    device and every run (a change of the mapping would show here)."""
    signs = random_signs(16, seed=0)
    assert signs.tolist() == [
        1 - 2 * (int(w) >> 31) for w in streams.random_words(torch.arange(16), 0, 0).tolist()
    ]
    # a prefix of a longer draw: sign i depends on i only
    assert torch.equal(random_signs(64, seed=3)[:16], random_signs(16, seed=3))
    assert not torch.equal(random_signs(64, seed=3), random_signs(64, seed=4))
    assert not torch.equal(random_signs(64, seed=3), random_signs(64, seed=3, offset=1))
    assert random_signs(16, seed=0, device="cpu").device == torch.device("cpu")


def test_random_signs_are_balanced() -> None:
    """Over 2**16 signs the count of -1 is Binomial(n, 1/2): mean n/2, standard deviation
    sqrt(n)/2 = 128; the test allows 6 standard deviations (a false alarm with probability
    below 2e-9)."""
    count = 2**16
    negatives = int((random_signs(count, seed=123) < 0).sum())
    assert abs(negatives - count / 2) <= 6 * math.sqrt(count) / 2


# --- errors ------------------------------------------------------------------------------


def test_bad_arguments_raise_errors_naming_them() -> None:
    x = torch.randn(4, 64)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        hadamard(torch.ones(4, 64, dtype=torch.int32), 16)
    with pytest.raises(TypeError, match="x must be a torch\\.Tensor"):
        hadamard([1.0] * 16, 16)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="y must have a floating dtype"):
        inverse_hadamard(torch.ones(16, dtype=torch.int64), 16)
    for size in (8, 24, 512, 0, -16):
        with pytest.raises(ValueError, match="size must be a power of two in 16, 32, 64, 128, 256"):
            hadamard(x, size)
    with pytest.raises(TypeError, match="size must be an int"):
        hadamard(x, 16.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="size=32 must divide the length of axis 0 of x; got length 4"
    ):
        hadamard(x, 32, axis=0)
    with pytest.raises(ValueError, match="axis must be in \\[-2, 2\\)"):
        hadamard(x, 16, axis=2)
    with pytest.raises(ValueError, match="axis must be in \\[0, 0\\)"):
        hadamard(torch.tensor(1.0), 16)
    with pytest.raises(ValueError, match="signs must have shape \\(16,\\)"):
        hadamard(x, 16, signs=torch.ones(32))
    with pytest.raises(ValueError, match="signs must hold only \\+1 and -1"):
        hadamard(x, 16, signs=torch.full((16,), 0.5))
    with pytest.raises(TypeError, match="signs must be a real tensor"):
        hadamard(x, 16, signs=torch.ones(16, dtype=torch.bool))
    with pytest.raises(TypeError, match="signs must be a torch\\.Tensor or None"):
        hadamard(x, 16, signs=[1.0] * 16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="signs must be on x's device"):
        hadamard(x, 16, signs=torch.ones(16, device="meta"))
    with pytest.raises(ValueError, match="size must be a positive int"):
        random_signs(0)
    with pytest.raises(ValueError, match="seed must be in"):
        random_signs(16, seed=-1)
    # integer signs are fine (converted exactly)
    ints = torch.tensor([1, -1] * 8)
    assert torch.equal(hadamard(x, 16, signs=ints), hadamard(x, 16, signs=ints.float()))


# --- torch.compile -----------------------------------------------------------------------


def test_compiled_transforms_equal_eager_and_warn_nothing_from_stochround() -> None:
    """fullgraph=True through inductor: the forward and inverse transforms, float32 and
    bfloat16, along a non-last axis, give the eager bits, and no warning comes from
    stochround. (The bfloat16 tensor is an input: inductor does not round a bfloat16
    intermediate made inside the graph unless torch._inductor.config.emulate_precision_casts
    is set, so ``x.bfloat16()`` inside the graph would not be the eager bfloat16.)"""
    x = heavy_tailed((64, 6), seed=13)
    signs = random_signs(32, seed=14)

    def call(x: torch.Tensor, signs: torch.Tensor, x16: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = hadamard(x, 32, signs=signs, axis=0)
        return y, inverse_hadamard(y, 32, signs=signs, axis=0), hadamard(x16, 64, axis=0)

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(call, fullgraph=True)(x, signs, x.bfloat16())
    eager = call(x, signs, x.bfloat16())
    for got, want in zip(compiled, eager, strict=True):
        assert got.dtype == want.dtype
        view = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(got.view(view), want.view(view))
    assert [str(w.message) for w in caught if "stochround" in w.filename] == []


# --- variance reduction of SR on heavy-tailed blocks (measured) ---------------------------


def student_t(shape: tuple[int, int], df: float, seed: int) -> torch.Tensor:
    """Student-t samples, Z / sqrt(V / df) with V ~ chi-squared(df) = Gamma(df/2, 2),
    drawn from a seeded generator (torch's _standard_gamma takes none: for df = 2, V is
    Exp(1/2) = -2 log U)."""
    assert df == 2.0
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(shape, generator=generator, dtype=torch.float64)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64).clamp_min(2.0**-60)
    chi2 = -2.0 * torch.log(uniform)
    return (normal / torch.sqrt(chi2 / df)).to(torch.float32)


@pytest.mark.parametrize("scale_rule", ["floor", "floor-3/4"])
def test_rht_lowers_the_sr_error_of_mxfp4_on_heavy_tailed_blocks(scale_rule: str) -> None:
    """Tseng et al. 2025 (Thm 3.2): rotating a block spreads its outliers, so its amax and
    scale shrink relative to its norm, and SR's error (whose variance grows with the
    scale) falls. Measured here, not assumed: Student-t (df = 2) rows of 32 values,
    quantized to MXFP4 with SR, with and without rht=32; error of each row's dequantized
    values after the inverse rotation, relative to the row's squared norm,
    ``e_i = ||Q(x_i) - x_i||^2 / ||x_i||^2`` (the relative error is bounded, since every
    element's error is at most a few scales and amax is at least one; the absolute
    error's mean does not exist for df = 2).

    Margin: the rows are independent (data and SR words), so the differences ``d_i =
    e_i(no RHT) - e_i(RHT)`` are i.i.d. and bounded; their mean over n rows has standard
    deviation sigma / sqrt(n), sigma estimated by the sample standard deviation. The test
    asserts mean(d) > 6 sigma_hat / sqrt(n): were E[d] <= 0, a normal mean would pass
    with probability below 1e-9."""
    rows = 2048
    x = student_t((rows, 32), 2.0, seed=40)
    options = {"mode": "sr", "seed": 41, "scale_rule": scale_rule, "backend": "torch"}
    plain = quantize(x, "mxfp4", **options).dequantize(torch.float32)
    rotated = quantize(x, "mxfp4", rht=32, **options).dequantize(torch.float32, unrotate=True)
    x64 = x.to(torch.float64)
    norm = (x64**2).sum(-1)
    error_plain = ((plain.to(torch.float64) - x64) ** 2).sum(-1) / norm
    error_rotated = ((rotated.to(torch.float64) - x64) ** 2).sum(-1) / norm
    difference = error_plain - error_rotated
    margin = 6 * difference.std() / math.sqrt(rows)
    assert difference.mean() > margin, (float(difference.mean()), float(margin))


@pytest.mark.gpu
def test_cuda_transforms_equal_cpu_bit_for_bit() -> None:
    """The fixed butterfly gives the CPU's bits on CUDA, eager and compiled (inductor's
    Triton code), for float32 and bfloat16, forward and inverse; the signs too."""
    signs = random_signs(128, seed=15)
    assert torch.equal(random_signs(128, seed=15, device="cuda").cpu(), signs)
    x = heavy_tailed((128, 96), seed=16)
    for size in HADAMARD_SIZES[:4]:
        part = signs[:size]
        for data in (x, x.bfloat16()):
            view = torch.int16 if data.dtype == torch.bfloat16 else torch.int32
            on_cpu = hadamard(data, size, signs=part, axis=0)
            on_gpu = hadamard(data.cuda(), size, signs=part.cuda(), axis=0).cpu()
            assert torch.equal(on_gpu.view(view), on_cpu.view(view)), (size, data.dtype)
            back_cpu = inverse_hadamard(on_cpu, size, signs=part, axis=0)
            back_gpu = inverse_hadamard(on_cpu.cuda(), size, signs=part.cuda(), axis=0).cpu()
            assert torch.equal(back_gpu.view(view), back_cpu.view(view)), (size, data.dtype)
    compiled = torch.compile(lambda v, s: hadamard(v, 256, signs=s), fullgraph=True)
    full = random_signs(256, seed=17)
    eager_cpu = hadamard(x.reshape(48, 256), 256, signs=full)
    assert torch.equal(compiled(x.reshape(48, 256).cuda(), full.cuda()).cpu(), eager_cpu)
