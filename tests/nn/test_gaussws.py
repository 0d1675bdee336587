"""Tests of `stochround.nn.gaussws`: the rounded-Gaussian table (exact distribution), the
target spacing, the sampled weight (dtype, unbiasedness by enumeration, unchanged blocks,
streams), the straight-through gradient, the `GaussWS` parametrization and `gaussws_`, the
"diffq" and "sr" noise choices, torch.compile, and the argument checks."""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import pytest
import torch
from helpers import OpCounter, cuda_route
from torch import Tensor, nn
from torch.nn.utils import parametrize

import stochround as sr
import stochround.nn as srnn
from stochround.kernels.availability import kernels_refusal
from stochround.nn import gaussws, gaussws_noise, linear
from stochround.random import StreamDomain, random_words, random_words_like, stream_key

ALL_BITS = range(1, 33)


def key(seed: int) -> int:
    """The Philox key a `GaussWS` of ``seed`` samples with (its stream domain)."""
    return int(stream_key(seed, StreamDomain.GAUSSWS))


def sampled_from_parts(w: Tensor, fmt: str, block: int | None, seed: int, offset: int) -> Tensor:
    """``cast(fp32(w) + fp32(R) * u)`` from the public pieces: the stream's words,
    `rounded_gaussian` and `noise_spacing` (blocks with u = 0 are the kept ones)."""
    words = random_words_like(w, seed, offset)
    rounded = gaussws_noise.rounded_gaussian(words, 32)
    u = gaussws_noise.noise_spacing(w, fmt, block)
    return (w.to(torch.float32) + rounded.to(torch.float32) * u).to(w.dtype)


# ---------------------------------------------------------------------------------------
# the rounded Gaussian
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise_bits", ALL_BITS)
def test_the_table_maps_each_threshold_boundary_to_the_next_value_of_r(noise_bits: int) -> None:
    """R = -3 + #{j : x >= T_j}: at ``T_j - 1`` the lookup gives ``-4 + j``, at ``T_j`` it
    gives ``-3 + j`` (empty counts make thresholds coincide: then both sides of the last
    of them decide), and 0 and ``2**n - 1`` give the ends; so the values of ``x`` giving
    ``R = k`` are the interval ``[T_(k+3), T_(k+4))`` whose length is ``c_k``: ``P(R = k) =
    c_k / 2**n`` exactly."""
    thresholds = gaussws_noise.gaussian_thresholds(noise_bits)
    counts = gaussws_noise.gaussian_counts(noise_bits)
    top = 2**noise_bits
    assert len(thresholds) == 6 and list(thresholds) == sorted(thresholds)
    assert sum(counts) == top and thresholds[-1] <= top
    edges = [0, *thresholds, top]
    for k, count in zip(range(-3, 4), counts, strict=True):
        assert edges[k + 4] - edges[k + 3] == count
    probes = sorted({0, top - 1, *(t - 1 for t in thresholds if t > 0), *thresholds} - {top})
    words = torch.tensor(probes, dtype=torch.int64)
    got = gaussws_noise.rounded_gaussian(words, noise_bits).tolist()
    expected = [-3 + sum(x >= t for t in thresholds) for x in probes]
    assert got == expected
    for x, r in zip(probes, got, strict=True):
        assert edges[r + 3] <= x < edges[r + 4]


@pytest.mark.parametrize("noise_bits", range(1, 17))
def test_every_word_of_up_to_16_bits_gives_r_with_its_count(noise_bits: int) -> None:
    """Enumerating every ``x`` in ``[0, 2**n)``: R takes value ``k`` exactly ``c_k`` times,
    and the counts are symmetric, so E[R] = 0 exactly."""
    words = torch.arange(2**noise_bits, dtype=torch.int64)
    rounded = gaussws_noise.rounded_gaussian(words, noise_bits)
    assert rounded.dtype == torch.int8
    histogram = torch.bincount(rounded.to(torch.int64) + 3, minlength=7).tolist()
    counts = gaussws_noise.gaussian_counts(noise_bits)
    assert histogram == list(counts)
    assert counts == counts[::-1]


@pytest.mark.parametrize("noise_bits", ALL_BITS)
def test_the_counts_are_within_half_a_count_of_the_rounded_normal(noise_bits: int) -> None:
    """``|c_k / 2**n - p_k| <= 2**-(n+1)`` for ``k != 0`` (each count is rounded to
    nearest), and ``c_0`` takes the other six counts' errors and the tail ``P(|R| >= 4) =
    2 (1 - Phi(7))``: ``|c_0 / 2**n - p_0| <= 3 * 2**-n + tail``.  Checked in exact
    fractions of the float64 probabilities, whose own error (below 1e-15) is far below
    these bounds."""
    counts = gaussws_noise.gaussian_counts(noise_bits)
    top = 2**noise_bits
    tail = math.erfc(7 / math.sqrt(2))
    for k, count in zip(range(-3, 4), counts, strict=True):
        p = Fraction(gaussws_noise.normal_probability(k))
        error = abs(Fraction(count, top) - p)
        bound = Fraction(1, 2 * top) if k else Fraction(3, top) + Fraction(tail)
        assert error <= bound, (k, float(error), float(bound))


def test_the_32_bit_table_gives_r_its_full_support_and_the_tail_no_count() -> None:
    """At 32 bits every value -3..3 has a count (c_3 > 0), while the mass of |R| >= 4 is
    below half a count: R's support -3..3 loses nothing a 32-bit table could hold."""
    counts = gaussws_noise.gaussian_counts(32)
    assert all(count > 0 for count in counts)
    assert 2**32 * math.erfc(7 / math.sqrt(2)) < 0.5
    assert gaussws_noise.gaussian_counts(20)[0] == 0 and gaussws_noise.gaussian_counts(21)[0] > 0


# ---------------------------------------------------------------------------------------
# the spacing u
# ---------------------------------------------------------------------------------------


def test_u_is_the_targets_ulp_relative_to_the_block_scale() -> None:
    """e3m2 (emin -2, emax 4, 2 mantissa bits), one block with amax 16: e = 4 - 4 = 0, so
    u = 2**(floor(log2 |w|) - 2) for |w| >= 1/4 and 2**(-2 - 2) below (subnormal), zeros
    included; doubling the block's values doubles every u."""
    w = torch.tensor([[16.0, 12.0, 5.0, 1.0, 0.3, 0.25, 0.1, 0.0]], dtype=torch.bfloat16)
    u = gaussws_noise.noise_spacing(w, "e3m2", None)
    expected = [4.0, 2.0, 1.0, 0.25, 2.0**-4, 2.0**-4, 2.0**-4, 2.0**-4]
    assert u.dtype == torch.float32 and u.flatten().tolist() == expected
    doubled = gaussws_noise.noise_spacing(w * 2, "e3m2", None)
    assert torch.equal(doubled, u * 2)


@pytest.mark.parametrize("fmt", ["e3m2", "e2m3", "e4m3fn", "e5m2", "e2m1"])
def test_doubling_a_weight_across_a_binade_doubles_its_noise(fmt: str) -> None:
    """Within one block (its amax, hence its scale, fixed by a larger element), an element
    x in the target's normal range and 2x lie in consecutive binades: u(2x) = 2 u(x)."""
    target = sr.format(fmt)
    top = 2.0**target.emax
    values = [top * 2.0**-i * 1.25 for i in range(1, target.emax - target.emin)]
    for value in values:
        w = torch.tensor([[top * 1.5, value, 2 * value, 0.0]], dtype=torch.bfloat16)
        u = gaussws_noise.noise_spacing(w, fmt, 4)[0]
        assert u[2] == 2 * u[1], (fmt, value)
        assert u[1] == 2.0 ** (math.floor(math.log2(value)) - target.mbits)


def test_u_handles_fp32_subnormal_blocks_and_underflows_to_zero() -> None:
    """An fp32-subnormal amax (2**-140) takes the clamped scale 2**-126, so its elements are
    in e3m2's subnormal range: u = 2**(-2 - 2 - 126) = 2**-130 (an fp32 subnormal, built
    from bits).  A target whose spacing there lies below 2**-149 (fp16 as the target:
    2**(-14 - 10 - 126)) gives u = 0, and the sample is w itself."""
    w = torch.tensor([[2.0**-140, 2.0**-145, 0.0, 2.0**-149]], dtype=torch.float32)
    u = gaussws_noise.noise_spacing(w, "e3m2", 4)
    assert u.flatten().tolist() == [2.0**-130] * 4
    assert gaussws_noise.noise_spacing(w, "binary16", 4).flatten().tolist() == [0.0] * 4
    sampled = gaussws_noise.sample_weight_torch(w, "binary16", block=4, seed=1, offset=2)
    assert torch.equal(sampled, w)


def test_floor_log2_of_fp32_bits_is_exact_for_normals_and_subnormals() -> None:
    exponents = list(range(-149, 128))
    values = torch.tensor([2.0**k for k in exponents], dtype=torch.float64).to(torch.float32)
    just_below = torch.nextafter(values[1:], torch.zeros(()))
    assert gaussws_noise.floor_log2_bits(values).tolist() == exponents
    assert gaussws_noise.floor_log2_bits(just_below).tolist() == exponents[:-1]
    assert gaussws_noise.power_of_two(torch.tensor(exponents, dtype=torch.int32)).tolist() == [
        2.0**k for k in exponents
    ]
    assert gaussws_noise.power_of_two(torch.tensor([-150, -200], dtype=torch.int32)).tolist() == [
        0,
        0,
    ]


# ---------------------------------------------------------------------------------------
# the sampled weight
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fmt", ["e3m2", "e2m3", "e4m3fn", "e2m1"])
def test_the_sample_is_w_plus_r_times_u_cast_to_ws_dtype(dtype: torch.dtype, fmt: str) -> None:
    """The sampled weight is ``cast(fp32(w) + fp32(R) * u)`` with R the table lookup of
    the stream's words of the row-major indices, in w's dtype."""
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    sampled = gaussws_noise.sample_weight_torch(w, fmt, block=32, seed=7, offset=9)
    assert sampled.dtype == dtype and sampled.shape == w.shape
    assert torch.equal(sampled, sampled_from_parts(w, fmt, 32, 7, 9))


def expectation(w: Tensor, fmt: str, block: int | None) -> list[Fraction]:
    """E[w~] per element, exactly: ``sum_k c_k / 2**32 * cast(w + k u)`` over R's
    distribution (the formula `test_the_sample_is_w_plus_r_times_u_cast_to_ws_dtype`
    checks the path against)."""
    counts = gaussws_noise.gaussian_counts(32)
    u = gaussws_noise.noise_spacing(w, fmt, block)
    total = [Fraction(0)] * w.numel()
    for k, count in zip(range(-3, 4), counts, strict=True):
        values = (w.to(torch.float32) + k * u).to(w.dtype).flatten().tolist()
        share = Fraction(count, 2**32)
        total = [t + share * Fraction(v) for t, v in zip(total, values, strict=True)]
    return total


def test_the_sample_is_unbiased_where_every_w_plus_k_u_is_representable() -> None:
    """E[w~] = w exactly, by enumerating R's distribution: bf16 weights in [1, 1.25) of an
    e3m2 block (u = 1/4, so w + k u stays in [1/4, 2): every value representable), elements
    of a block of amax 4 in the target's subnormal range (below 2**(emin + e) = 1/16, u =
    2**-6), and fp32 weights with 20 significant bits."""
    ones = torch.tensor([[1 + j / 128 for j in range(32)]], dtype=torch.bfloat16)
    small = torch.tensor([[4.0, 2.0**-5, -3 / 64, 0.0]], dtype=torch.bfloat16)
    fp32 = torch.tensor([[3.0 + j * 2.0**-18 for j in range(8)]], dtype=torch.float32)
    for w, block in ((ones, 32), (small, 4), (fp32, 8)):
        assert expectation(w, "e3m2", block) == [Fraction(v) for v in w.flatten().tolist()]


def test_a_sum_that_crosses_into_a_higher_binade_at_a_tie_is_biased() -> None:
    """The documented exception: bf16 w = 1 + 127/128 with u = 1/4 gives w + u = 2 +
    31/128, a tie between bf16 neighbours (spacing 1/64 in [2, 4)), rounded to even, so
    E[w~] differs from w."""
    w = torch.tensor([[1 + 127 / 128]], dtype=torch.bfloat16)
    assert expectation(w, "e3m2", 1) != [Fraction(w.item())]


def test_zero_nan_and_infinite_blocks_are_returned_unchanged() -> None:
    """Blocks whose amax is 0, NaN or infinite keep every bit (signed zeros too); the
    other blocks of the tensor are sampled."""
    nan, inf = float("nan"), float("inf")
    w = torch.tensor(
        [[0.0, -0.0] * 4, [1.0, nan, 2.0, 3.0] * 2, [inf, 1.0, -1.0, 0.5] * 2, [*range(1, 9)]],
        dtype=torch.bfloat16,
    )
    sampled = gaussws_noise.sample_weight_torch(w, "e2m1", block=8, seed=0, offset=0)
    assert torch.equal(sampled[:3].view(torch.int16), w[:3].view(torch.int16))
    assert not torch.equal(sampled[3], w[3])
    assert gaussws_noise.noise_spacing(w, "e2m1", 8)[:3].eq(0).all()


def test_a_shard_draws_the_words_of_its_global_indices() -> None:
    """Rows 4.. of a weight sampled alone with ``index_offset = 4 * cols`` equal those rows
    of the whole weight's sample."""
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for noise in gaussws_noise.NOISES:
        whole = gaussws_noise.sample_weight_torch(w, "e3m2", noise=noise, seed=3, offset=4)
        shard = gaussws_noise.sample_weight_torch(
            w[4:], "e3m2", noise=noise, seed=3, offset=4, index_offset=4 * 32
        )
        assert torch.equal(shard, whole[4:]), noise


def test_the_same_seed_and_offset_reproduce_the_sample_and_others_change_it() -> None:
    w = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    first = gaussws_noise.sample_weight_torch(w, "e3m2", seed=5, offset=6)
    assert torch.equal(first, gaussws_noise.sample_weight_torch(w, "e3m2", seed=5, offset=6))
    offset = torch.tensor(6, dtype=torch.int64)
    assert torch.equal(first, gaussws_noise.sample_weight_torch(w, "e3m2", seed=5, offset=offset))
    assert not torch.equal(first, gaussws_noise.sample_weight_torch(w, "e3m2", seed=6, offset=6))
    assert not torch.equal(first, gaussws_noise.sample_weight_torch(w, "e3m2", seed=5, offset=7))


def test_fewer_noise_bits_use_the_top_bits_of_each_word() -> None:
    """With ``noise_bits = n`` R is the table lookup of ``word >> (32 - n)``."""
    w = torch.randn(2, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    sampled = gaussws_noise.sample_weight_torch(w, "e3m2", noise_bits=9, seed=1, offset=2)
    rounded = gaussws_noise.rounded_gaussian(random_words_like(w, 1, 2) >> 23, 9)
    u = gaussws_noise.noise_spacing(w, "e3m2")
    assert torch.equal(sampled, (w.float() + rounded.float() * u).to(w.dtype))


def test_sample_weight_passes_the_gradient_straight_through() -> None:
    w = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    weights = torch.randn(4, 32, dtype=torch.bfloat16)
    sampled = srnn.sample_weight(w, "e3m2", seed=1, offset=0, backend="torch")
    assert torch.equal(sampled, gaussws_noise.sample_weight_torch(w, "e3m2", seed=1, offset=0))
    (sampled * weights).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, weights)


@pytest.mark.skipif(
    kernels_refusal("w", torch.cuda.is_available()) is not None,
    reason="the Triton kernel needs Triton and a GPU or the interpreter",
)
def test_the_kernel_backend_gives_the_pytorch_paths_bits_in_a_training_step() -> None:
    """`sample_weight` and a model parametrized with ``backend="triton"`` (the kernel; on
    the CPU under Triton's interpreter) give the PyTorch path's weights, outputs and
    gradients (tests/kernels/test_gaussws.py compares the kernel over many shapes)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(8, 64, device=device).to(torch.bfloat16)
    kernel = srnn.sample_weight(w, "e3m2", seed=3, offset=4, backend="triton")
    assert torch.equal(kernel, gaussws_noise.sample_weight_torch(w, "e3m2", seed=3, offset=4))
    models = [
        srnn.gaussws_(make_model().to(device), "e2m3", seed=2, backend=backend)
        for backend in ("triton", "torch")
    ]
    x = torch.randn(8, 64, device=device).to(torch.bfloat16)
    outputs = [model(x) for model in models]
    for out in outputs:
        out.float().square().sum().backward()
    assert torch.equal(outputs[0], outputs[1])
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    # the eager kernel path is the prepared launch, which copies leave behind
    weight = models[0][0].parametrizations.weight
    assert weight[0].prepared is not None and weight[0].prepared.matches(weight.original)
    assert copy.deepcopy(models[0])[0].parametrizations.weight[0].prepared is None


@pytest.mark.skipif(
    kernels_refusal("w", torch.cuda.is_available()) is not None,
    reason="the Triton kernel needs Triton and a GPU or the interpreter",
)
def test_a_prepared_launch_gives_the_kernels_bits_and_refuses_other_weights() -> None:
    from stochround.kernels.gaussws import PreparedSample

    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(8, 64, device=device).to(torch.bfloat16)
    table = gaussws_noise.gaussian_thresholds(32)
    prepared = PreparedSample(w, "e3m2", 32, table, 32)
    seed = torch.tensor([5], device=device)
    offset = torch.tensor([2**40 + 7], device=device)
    expected = gaussws_noise.sample_weight_torch(w, "e3m2", seed=5, offset=2**40 + 7)
    assert torch.equal(prepared(w, seed, offset), expected)
    with pytest.raises(ValueError, match="as prepared"):
        prepared(w.float(), seed, offset)
    with pytest.raises(ValueError, match="one-element int64"):
        prepared(w, seed.int(), offset)


# ---------------------------------------------------------------------------------------
# the other noise choices
# ---------------------------------------------------------------------------------------


def test_diffq_noise_is_box_muller_of_two_words_times_the_block_range() -> None:
    """The "diffq" noise: ``w + (N/2) (max - min) / (2**b - 1)``, N = sqrt(-2 ln U1) cos(2 pi U2)
    from the words of indices 2i and 2i + 1 (top 24 bits each), b = 6 for e3m2."""
    w = torch.randn(3, 16, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    sampled = gaussws_noise.sample_weight_torch(w, "e3m2", block=8, noise="diffq", seed=2, offset=3)
    index = torch.arange(w.numel() * 2, dtype=torch.int64)
    words = (random_words(index, 2, 3) >> 8).to(torch.float32).reshape(3, 16, 2)
    first = (words[..., 0] + 1.0) * 2.0**-24
    second = words[..., 1] * 2.0**-24
    normal = torch.sqrt(-2.0 * torch.log(first)) * torch.cos((2.0 * math.pi) * second)
    blocks = w.float().reshape(3, 2, 8)
    span = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 63
    expected = (blocks + (normal * 0.5).reshape(3, 2, 8) * span).to(w.dtype).reshape(3, 16)
    assert torch.equal(sampled, expected)


def test_sr_noise_is_the_block_formats_sr_fake_quantization() -> None:
    """The "sr" noise: `stochround.blocks.fake_quantize` into blocks of e2m3 elements with an E8M0
    scale (rule "floor") in mode "sr", from the same stream, bit for bit."""
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    sampled = gaussws_noise.sample_weight_torch(w, "e2m3", block=32, noise="sr", seed=8, offset=1)
    block_format = sr.blocks.BlockFormat(
        name="mine",
        element=sr.format("e2m3"),
        block=32,
        scale=sr.format("e8m0"),
        scale_rule="floor",
    )
    expected = sr.blocks.fake_quantize(w, block_format, "sr", seed=8, offset=1, backend="torch")
    assert torch.equal(sampled, expected)
    named = sr.blocks.fake_quantize(w, "mxfp6_e2m3", "sr", seed=8, offset=1, backend="torch")
    assert torch.equal(sampled, named)


# ---------------------------------------------------------------------------------------
# the parametrization
# ---------------------------------------------------------------------------------------


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64)).to(torch.bfloat16)


def sampling_of(layer: nn.Module) -> gaussws.GaussWS:
    parametrization = layer.parametrizations.weight[0]  # type: ignore[index,union-attr]
    assert isinstance(parametrization, gaussws.GaussWS)
    return parametrization


def test_a_training_forward_samples_with_its_layers_step_offset() -> None:
    """Each training forward under grad mode uses ``sample_weight(w, offset=stream_offset(
    step, layer, 12))`` and advances the step: consecutive steps draw fresh weights, and
    two layers their own."""
    model = srnn.gaussws_(make_model(), "e3m2", seed=11)
    first, second = model[0], model[2]
    raw = first.parametrizations.weight.original  # type: ignore[union-attr]
    seen = []
    for step in range(2):
        offset = linear.stream_offset(step, 0, gaussws.GAUSSWS_SLOT)
        expected = gaussws_noise.sample_weight_torch(raw, "e3m2", seed=key(11), offset=offset)
        got = first.weight
        assert torch.equal(got, expected)
        assert int(sampling_of(first).step) == step + 1
        seen.append(got)
    assert not torch.equal(seen[0], seen[1])
    offset = linear.stream_offset(0, 1, gaussws.GAUSSWS_SLOT)
    raw_second = second.parametrizations.weight.original  # type: ignore[union-attr]
    expected = gaussws_noise.sample_weight_torch(raw_second, "e3m2", seed=key(11), offset=offset)
    assert torch.equal(second.weight, expected)


def test_an_eager_forward_makes_its_offset_by_one_add_on_the_cuda_route() -> None:
    """On the CUDA route (the prepared kernel) a training forward dispatches one add for
    its stream offset (from the step before it advances) and one in-place add for the
    step: no copy of the step, no shift or ``or``; the weight is the one sampled at
    ``stream_offset(0, 0, 12)``, and the step advances."""
    device, route = cuda_route()
    model = srnn.gaussws_(nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16)), "e3m2", seed=5)
    layer = model.to(device)[0]
    raw = layer.parametrizations.weight.original  # type: ignore[union-attr]
    with route, OpCounter() as counter:
        got = layer.weight
    assert counter.ops["aten.add.Tensor"] == 1 and counter.ops["aten.add_.Tensor"] == 1
    left_out = {"aten.clone.default", "aten.__lshift__.Scalar", "aten.bitwise_or.Scalar"}
    assert not left_out & set(counter.ops)
    offset = linear.stream_offset(0, 0, gaussws.GAUSSWS_SLOT)
    expected = gaussws_noise.sample_weight_torch(raw, "e3m2", seed=key(5), offset=offset)
    assert torch.equal(got, expected) and int(sampling_of(layer).step) == 1


def test_the_slot_is_one_quantized_linear_leaves_free() -> None:
    used = {*linear.ROLE_SLOTS.values(), *linear.SIGN_SLOTS.values()}
    assert gaussws.GAUSSWS_SLOT not in used and gaussws.GAUSSWS_SLOT < linear.SLOTS_PER_LAYER


def test_eval_mode_and_no_grad_use_the_weight_itself_and_keep_the_step() -> None:
    model = srnn.gaussws_(make_model(), "e3m2")
    layer = model[0]
    raw = layer.parametrizations.weight.original  # type: ignore[union-attr]
    with torch.no_grad():
        assert torch.equal(layer.weight, raw)
    model.eval()
    assert torch.equal(layer.weight, raw)
    assert int(sampling_of(layer).step) == 0
    model.train()
    assert not torch.equal(layer.weight, raw)
    assert int(sampling_of(layer).step) == 1


def test_a_layers_weight_gradient_is_the_sampled_weights_and_a_state_dict_resumes() -> None:
    """The parameter's gradient is nn.Linear's dL/dW taken at the sampled weight W~
    (straight through), and a copy loaded from the state dict (which holds each layer's
    step) continues bit for bit."""
    model = srnn.gaussws_(nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16)), "e3m2", seed=3)
    layer = model[0]
    raw = layer.parametrizations.weight.original  # type: ignore[union-attr]
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    model(x).float().square().sum().backward()
    offset = linear.stream_offset(0, 0, gaussws.GAUSSWS_SLOT)
    sampled = gaussws_noise.sample_weight_torch(raw, "e3m2", seed=key(3), offset=offset)
    weight = sampled.detach().requires_grad_()
    nn.functional.linear(x, weight, layer.bias).float().square().sum().backward()
    assert raw.grad is not None and torch.equal(raw.grad, weight.grad)
    clone = srnn.gaussws_(nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16)), "e3m2", seed=3)
    clone.load_state_dict(model.state_dict())
    assert torch.equal(model(x), clone(x))


def test_gaussws_parametrizes_the_layers_the_filter_keeps_in_module_order() -> None:
    model = nn.Sequential(
        nn.Linear(32, 32), nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)), nn.Linear(32, 8)
    )
    srnn.gaussws_(model, "e2m1", lambda module, fqn: fqn != "1.0", block=16, noise_bits=12)
    assert not parametrize.is_parametrized(model[1][0])
    indexed = [model[0], model[1][1], model[2]]
    assert [sampling_of(layer).layer_index for layer in indexed] == [0, 1, 2]
    sampling = sampling_of(model[2])
    assert (sampling.sampler.block, sampling.sampler.noise_bits) == (16, 12)
    # the same settings again: sampled layers are skipped, the rest numbered after them
    # (layer 0's stream is model[0]'s)
    srnn.gaussws_(model, "e2m1", block=16, noise_bits=12)
    assert sampling_of(model[1][0]).layer_index == 3
    assert len(model[0].parametrizations.weight) == 1  # type: ignore[union-attr,arg-type]


def test_a_second_call_with_other_settings_raises_naming_both() -> None:
    """gaussws_ does not silently keep the first settings: another target (or block,
    noise, bits, seed, backend) raises, naming the layer, what it has and what was asked;
    unquantize_ removes the sampling, after which the new settings apply."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    srnn.gaussws_(model, "e3m2")
    srnn.gaussws_(model, "e3m2")  # the same settings: nothing changes
    assert [sampling_of(layer).layer_index for layer in model] == [0, 1]
    with pytest.raises(ValueError, match=r"0 is already sampled by GaussWS\(fmt=e3m2.*fmt=e2m1"):
        srnn.gaussws_(model, "e2m1")
    with pytest.raises(ValueError, match=r"already sampled.*seed=0.*seed=5"):
        srnn.gaussws_(model, "e3m2", seed=5)
    srnn.unquantize_(model)
    srnn.gaussws_(model, "e2m1")
    assert sampling_of(model[1]).sampler.target.format.name == "e2m1"


def test_a_weight_with_another_parametrization_raises_naming_it() -> None:
    """A layer whose weight has a parametrization of another kind (here weight norm) is not
    silently skipped: gaussws_ raises naming the layer and the parametrization, before
    sampling any layer; filter_fn leaves the layer out."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    nn.utils.parametrizations.weight_norm(model[1])
    with pytest.raises(ValueError, match=r"1's weight has another parametrization \(_WeightNorm\)"):
        srnn.gaussws_(model, "e3m2")
    assert not nn.utils.parametrize.is_parametrized(model[0])
    srnn.gaussws_(model, "e3m2", filter_fn=lambda module, path: path != "1")
    assert sampling_of(model[0]) is not None


def test_a_torch_dtype_names_the_target_as_everywhere_else() -> None:
    model = srnn.gaussws_(nn.Sequential(nn.Linear(32, 32)), torch.float8_e4m3fn)
    assert sampling_of(model[0]).sampler.target.format == sr.format("e4m3fn")
    w = torch.randn(4, 32)
    by_dtype = srnn.sample_weight(w, torch.float8_e4m3fn, seed=1, offset=2)
    assert torch.equal(by_dtype, srnn.sample_weight(w, "e4m3fn", seed=1, offset=2))


def test_the_attention_output_projection_is_sampled_when_the_attention_reads_it() -> None:
    """nn.MultiheadAttention multiplies by out_proj.weight without calling out_proj; a
    parametrization runs when the weight is read, so gaussws_ samples it (once a training
    forward), unlike quantize_, which leaves it."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
    srnn.gaussws_(layer, "e3m2")
    layer(torch.randn(2, 16, 32)).square().sum().backward()
    steps = {path: int(m.step) for path, m in layer.named_modules() if isinstance(m, srnn.GaussWS)}
    assert steps == {
        "self_attn.out_proj.parametrizations.weight.0": 1,
        "linear1.parametrizations.weight.0": 1,
        "linear2.parametrizations.weight.0": 1,
    }


def test_a_layer_that_does_not_fit_leaves_the_model_untouched() -> None:
    """Every layer is checked before the first is parametrized: a weight whose last axis
    the block does not divide, or of a dtype that cannot be sampled, raises naming the
    layer, and no layer is parametrized."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(24, 32))
    with pytest.raises(ValueError, match="1: block=32 must divide w's last dimension 24"):
        srnn.gaussws_(model, "e3m2")
    assert not parametrize.is_parametrized(model[0])
    srnn.gaussws_(model, "e3m2", block=8)
    assert parametrize.is_parametrized(model[0]) and parametrize.is_parametrized(model[1])
    with pytest.raises(TypeError, match="model: w must be a float32, bfloat16 or float16"):
        srnn.gaussws_(nn.Linear(8, 8).double(), "e3m2", block=8)


def test_a_quantized_linear_takes_the_parametrization_too() -> None:
    """A `QuantizedLinear` is an nn.Linear: its weight is sampled, then quantized by its
    recipe (from another slot of its stream)."""
    model = srnn.quantize_(nn.Sequential(nn.Linear(32, 32)), srnn.mxfp8(seed=1))
    srnn.gaussws_(model, "e3m2", seed=1)
    out = model(torch.randn(32, 32))
    assert out.shape == (32, 32) and int(sampling_of(model[0]).step) == 1


def test_compiled_fullgraph_equals_eager_and_compiles_once() -> None:
    """torch.compile(fullgraph=True) with AOTAutograd ("aot_eager": the traced graphs run
    by PyTorch's own kernels, so bit for bit) of a parametrized model gives eager's outputs
    and gradients for three steps, compiling once (the step is a tensor advanced by
    `stochround.nn.step_ops.advance_step`)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    eager = srnn.gaussws_(make_model(), "e3m2", seed=5)
    compiled_model = srnn.gaussws_(make_model(), "e3m2", seed=5)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(compiled_model, fullgraph=True, backend=counter)
    for i in range(3):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
        expected = eager(x)
        expected.float().square().sum().backward()
        got = compiled(x)
        got.float().square().sum().backward()
        assert torch.equal(got, expected)
    assert counter.frame_count == 1
    for a, b in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    assert int(sampling_of(compiled_model[0]).step) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_a_cuda_model_samples_the_cpus_weights(compiled: bool) -> None:
    """On CUDA ``backend="auto"`` takes the Triton kernel: the sampled weights of three
    training forwards equal the CPU's PyTorch path's bit for bit, eagerly and under
    torch.compile (Inductor, fullgraph)."""
    cpu = srnn.gaussws_(make_model(), "e3m2", seed=9)
    cuda = srnn.gaussws_(make_model().cuda(), "e3m2", seed=9)
    layers = (cpu[0], cuda[0])

    def sampled(layer: nn.Module) -> Tensor:
        return layer.weight

    run = torch.compile(sampled, fullgraph=True) if compiled else sampled
    for _ in range(3):
        assert torch.equal(run(layers[1]).cpu(), layers[0].weight)
    assert int(sampling_of(cuda[0]).step) == 3


# ---------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------


W = torch.zeros(2, 32, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: gaussws_noise.sample_weight_torch(W, 3, seed=0, offset=0), TypeError, "fmt must"),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e9m9", seed=0, offset=0),
            ValueError,
            "unknown format",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W.double(), "e3m2", seed=0, offset=0),
            TypeError,
            "w must be a float32",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W[0, 0], "e3m2", seed=0, offset=0),
            ValueError,
            "at least one dimension",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", block=24, seed=0, offset=0),
            ValueError,
            "block=24 must divide",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", block=0, seed=0, offset=0),
            ValueError,
            "block must be a positive int",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", block=2.0, seed=0, offset=0),  # type: ignore[arg-type]
            TypeError,
            "block must be",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", noise="uniform", seed=0, offset=0),
            ValueError,
            "noise must be one of",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", noise_bits=33, seed=0, offset=0),
            ValueError,
            "noise_bits must be in 1..32",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", noise_bits=True, seed=0, offset=0),
            TypeError,
            "noise_bits must be an int",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", seed=-1, offset=0),
            ValueError,
            "seed",
        ),
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", seed=0, offset=1.5),
            TypeError,
            "offset",
        ),  # type: ignore[arg-type]
        (
            lambda: gaussws_noise.sample_weight_torch(W, "e3m2", seed=0, offset=0, index_offset=-1),
            ValueError,
            "index_offset",
        ),
        (
            lambda: srnn.sample_weight(W, "e3m2", seed=0, offset=0, backend="cuda"),
            ValueError,
            "backend must be one of",
        ),
        (
            lambda: srnn.sample_weight(
                W, "e3m2", noise="diffq", seed=0, offset=0, backend="triton"
            ),
            ValueError,
            "backend='triton' cannot serve this call: noise='diffq' runs on the PyTorch path",
        ),
        (lambda: gaussws_noise.rounded_gaussian(torch.zeros(2), 8), TypeError, "integer tensor"),
        (lambda: gaussws_noise.gaussian_thresholds(0), ValueError, "noise_bits"),
        (lambda: srnn.GaussWS(layer_index=2**28), ValueError, "layer_index"),
        (lambda: srnn.GaussWS(layer_index=1.0), TypeError, "layer_index"),  # type: ignore[arg-type]
        (lambda: srnn.GaussWS(seed=2**64), ValueError, "seed"),
        (lambda: srnn.GaussWS(backend="gpu"), ValueError, "backend"),
        (lambda: srnn.gaussws_(W, "e3m2"), TypeError, "model must be an nn.Module"),  # type: ignore[arg-type]
        (lambda: srnn.gaussws_(nn.Linear(32, 32), "e3m2", 3), TypeError, "filter_fn"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_raise_naming_them(call: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]
