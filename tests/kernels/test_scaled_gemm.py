"""`stochround.kernels.scaled_gemm`: the epilogue pass equals `scaled_mm`'s PyTorch sequence
(`stochround.blocks.gemm.torch_scaled_mm`) bit for bit on any fp32 product, NaN, infinities
and subnormals included; the Triton GEMM equals it bit for bit where every partial sum is
exact (small integers times powers of two), and within fp32 accumulation's bound elsewhere;
`scaled_mm` routes bf16 operands to them."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
from helpers import cuda_route
from torch import Tensor

from stochround.blocks import GemmOperand, scaled_mm
from stochround.blocks.gemm import fp32_product, scale_product, torch_scaled_mm
from stochround.kernels.availability import INTERPRETED

pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernels need CUDA or the interpreter",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# present or absent: a's row scales, b's, a's tensor scale, b's, a's factor, b's, the bias
STEPS = list(itertools.product((False, True), repeat=7))


class Case(NamedTuple):
    a: GemmOperand
    b: GemmOperand
    bias: Tensor | None


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def wide_values(*shape: int, seed: int) -> Tensor:
    """fp32 values over most of fp32's range: signs, magnitudes 2**-140 .. 2**100 (fp32
    subnormals included), zeros of both signs, NaN and infinities."""
    g = generator(seed)
    x = torch.randn(*shape, generator=g) * 2.0 ** torch.randint(-140, 100, shape, generator=g)
    flat = x.view(-1)
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 2.0**-149])
    flat[: specials.numel() * 3 : 3] = specials
    return x


def scales(m: int, n: int, present: tuple[bool, ...], seed: int) -> dict:
    """The epilogue's scales and factors as `present` asks: row scales near one with a few
    tiny, huge and special values, tensor scales, floor-3/4's 4/3 and an odd factor."""
    g = generator(seed)
    row_a, row_b, scale_a, scale_b, factor_a, factor_b, bias = present

    def rows(count: int) -> Tensor:
        r = torch.rand(count, 1, generator=g) + 0.5
        r[0], r[-1] = 2.0**-100, 2.0**90
        return r

    return {
        "row_a": rows(m) if row_a else None,
        "row_b": rows(n) if row_b else None,
        "scale_a": torch.tensor(0.7 * 2.0**-20) if scale_a else None,
        "scale_b": torch.tensor(3.3 * 2.0**10) if scale_b else None,
        "factor_a": 4 / 3 if factor_a else 1.0,
        "factor_b": 0.1 if factor_b else 1.0,
        "bias": torch.randn(n, generator=g).to(torch.bfloat16) if bias else None,
    }


def case(values_a: Tensor, values_b: Tensor, present: tuple[bool, ...], seed: int) -> Case:
    m, n = values_a.shape[0], values_b.shape[0]
    s = scales(m, n, present, seed)
    a = GemmOperand(values_a, s["scale_a"], s["row_a"], s["factor_a"])
    b = GemmOperand(values_b, s["scale_b"], s["row_b"], s["factor_b"])
    return Case(a, b, s["bias"])


def to_device(c: Case) -> Case:
    def move(t: object) -> object:
        return t.to(DEVICE) if isinstance(t, Tensor) else t

    a, b = (GemmOperand(*map(move, operand)) for operand in (c.a, c.b))
    return Case(a, b, None if c.bias is None else c.bias.to(DEVICE))


def epilogue_of(c: Case, out_dtype: torch.dtype):  # -> Epilogue (imports triton)
    from stochround.kernels.scaled_gemm import Epilogue

    a, b = c.a, c.b
    return Epilogue(
        a.row_scale,
        b.row_scale,
        a.tensor_scale,
        b.tensor_scale,
        a.factor,
        b.factor,
        c.bias,
        out_dtype,
    )


def assert_same_bits(got: Tensor, expected: Tensor) -> None:
    """Equal bit patterns, a NaN's payload aside (the canonical NaN of the kernels; the
    spec leaves it open)."""
    got, expected = got.cpu(), expected.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan())
    width = {torch.float32: torch.int32}.get(got.dtype, torch.int16)
    kept = ~expected.isnan()
    assert torch.equal(got.view(width)[kept], expected.view(width)[kept])


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_the_epilogue_pass_is_the_pytorch_sequence_bit_for_bit(out_dtype: torch.dtype) -> None:
    """Every combination of the seven steps, on a product spanning fp32's range (the result
    overflows, underflows into subnormals and carries NaN and infinities)."""
    from stochround.kernels.scaled_gemm import fused_epilogue

    m, n = 24, 40
    product = wide_values(m, n, seed=1)
    for index, present in enumerate(STEPS):
        # the product is given: an identity-free stand-in for the operands' values
        c = case(torch.zeros(m, 1), torch.zeros(n, 1), present, seed=index)
        expected = scale_product(product, c.a, c.b, c.bias, out_dtype)
        got = fused_epilogue(product.to(DEVICE), epilogue_of(to_device(c), out_dtype))
        assert_same_bits(got, expected)


def exact_operands(m: int, n: int, k: int, seed: int) -> tuple[Tensor, Tensor]:
    """bf16 operands whose products and every partial sum are exact in fp32 in any order:
    integers in [-8, 8] times 2**e, e in [-3, 3] (products are multiples of 2**-6 below
    2**12, so sums of up to 2**11 of them need at most 24 bits)."""
    g = generator(seed)

    def draw(rows: int) -> Tensor:
        integers = torch.randint(-8, 9, (rows, k), generator=g).float()
        return (integers * 2.0 ** torch.randint(-3, 4, (rows, k), generator=g)).bfloat16()

    return draw(m), draw(n)


# shapes that mask every edge of the kernel's tiles (128 x 128 and 128 x 256, K steps of 64)
SHAPES = [(130, 260, 70), (1, 3, 5)]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_the_triton_gemm_is_scaled_mm_bit_for_bit_where_sums_are_exact(
    out_dtype: torch.dtype,
) -> None:
    """Every combination of the steps; a 64 x 128 tile (the interpreter's fastest) masked
    in M, N and K (the real tiles: `test_the_triton_gemm_masks_partial_tiles`)."""
    from stochround.kernels.scaled_gemm import GemmConfig, scaled_gemm

    m, n, k = 40, 72, 100
    config = GemmConfig(64, 128, 64, 8, 4, 1)
    values_a, values_b = exact_operands(m, n, k, seed=m)
    for index, present in enumerate(STEPS):
        c = case(values_a, values_b, present, seed=index)
        expected = torch_scaled_mm(c.a, c.b, c.bias, out_dtype)
        on_device = to_device(c)
        epilogue = epilogue_of(on_device, out_dtype)
        got = scaled_gemm(on_device.a.values, on_device.b.values, epilogue, config)
        assert_same_bits(got, expected)


@pytest.mark.parametrize("wide", [False, True], ids=["square", "wide"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_triton_gemm_masks_partial_tiles(shape: tuple[int, int, int], wide: bool) -> None:
    """Shapes below and across both tiles in every dimension, b a transposed view (dgrad's
    layout), every step present."""
    from stochround.kernels.scaled_gemm import SQUARE_TILE, WIDE_TILE, scaled_gemm

    m, n, k = shape
    values_a, values_b = exact_operands(m, n, k, seed=3)
    c = case(values_a, values_b.T.contiguous().T, (True,) * 7, seed=5)
    assert not c.b.values.is_contiguous() or min(n, k) == 1
    expected = torch_scaled_mm(c.a, c.b, c.bias, torch.bfloat16)
    on_device = to_device(c)
    b = on_device.b.values.T.contiguous().T  # the transposed layout on the device too
    config = WIDE_TILE if wide else SQUARE_TILE
    got = scaled_gemm(on_device.a.values, b, epilogue_of(on_device, torch.bfloat16), config)
    assert_same_bits(got, expected)


def test_the_triton_gemm_is_within_fp32_accumulations_bound_on_random_operands() -> None:
    """Sums in another order than the spec's: |got - exact| <= K 2**-24 sum |a_k b_k| (each
    of the K additions rounds once, in either order), then the scaling's four roundings
    (and a few units of fp32's smallest subnormal)."""
    from stochround.kernels.scaled_gemm import scaled_gemm

    m, n, k = 48, 80, 192
    g = generator(7)
    values_a = torch.randn(m, k, generator=g).bfloat16()
    values_b = torch.randn(n, k, generator=g).bfloat16()
    c = case(values_a, values_b, (True, True, True, True, True, False, False), seed=1)
    # row scales near one (the exact cases' also overflow and underflow)
    row_a, row_b = torch.rand(m, 1, generator=g) + 0.5, torch.rand(n, 1, generator=g) + 0.5
    c = c._replace(a=c.a._replace(row_scale=row_a), b=c.b._replace(row_scale=row_b))
    on_device = to_device(c)
    got = scaled_gemm(on_device.a.values, on_device.b.values, epilogue_of(on_device, torch.float32))
    a64, b64 = values_a.double(), values_b.double()
    scale = c.a.row_scale.double() * c.b.row_scale.double().T
    scale = scale * float(c.a.tensor_scale) * float(c.b.tensor_scale) * c.a.factor
    exact = (a64 @ b64.T) * scale
    bound = k * 2**-24 * (a64.abs() @ b64.abs().T) * scale + exact.abs() * 2**-21 + 2**-146
    assert bool(((got.cpu().double() - exact).abs() <= bound).all())
    assert not torch.equal(got.cpu(), torch.zeros_like(got.cpu()))


def test_scaled_mm_routes_bf16_operands_to_the_kernels_and_keeps_the_bits() -> None:
    """backend="triton" takes the kernels (the GEMM where the tile divides the shape, the
    epilogue pass elsewhere): the same bits as backend="torch" on exact operands."""
    from stochround.kernels.scaled_gemm import SQUARE_TILE, WIDE_TILE, gemm_config, gemm_kernel

    assert gemm_config(8192, 4096) == WIDE_TILE
    assert gemm_config(2048, 1024) == gemm_config(8192, 4224) == SQUARE_TILE
    assert gemm_kernel(256, 512, 128) == "triton_gemm"
    assert gemm_kernel(40, 72, 100) == gemm_kernel(2048, 1024, 1000) == "fused_epilogue"
    assert gemm_kernel(128, 256, 0) == "fused_epilogue"
    # large products: cuBLAS and the epilogue pass (FUSED_GEMM_LIMIT)
    assert gemm_kernel(2048, 1024, 1024) == "triton_gemm"
    assert gemm_kernel(8192, 4096, 4096) == "fused_epilogue"
    values_a, values_b = exact_operands(40, 72, 100, seed=2)
    c = to_device(case(values_a, values_b, (True,) * 7, seed=2))
    options = {"bias": c.bias, "out_dtype": torch.bfloat16}
    got = scaled_mm(c.a, c.b, backend="triton", **options)
    assert_same_bits(got, scaled_mm(c.a, c.b, backend="torch", **options))


def test_scaled_mm_names_what_keeps_the_kernels_from_a_call() -> None:
    a = GemmOperand(torch.ones(4, 8, device=DEVICE), None, None, 1.0)
    with pytest.raises(ValueError, match=r"a\.values and b\.values must be bf16 for the kernels"):
        scaled_mm(a, a, backend="triton")
    bf16 = GemmOperand(torch.ones(4, 8, device=DEVICE, dtype=torch.bfloat16), None, None, 1.0)
    wide = bf16._replace(row_scale=torch.ones(4, 1, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"a\.row_scale must be fp32 with 4 elements"):
        scaled_mm(wide, bf16, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        scaled_mm(bf16, bf16, backend="cuda")
    # the PyTorch path still serves them
    assert scaled_mm(wide, bf16).dtype == torch.float32


def test_the_fused_epilogue_serves_cublas_products() -> None:
    """The epilogue pass over `fp32_product` (cuBLAS's on CUDA) is the PyTorch sequence
    over the same product."""
    from stochround.kernels.scaled_gemm import fused_epilogue

    values_a, values_b = exact_operands(16, 24, 32, seed=4)
    c = to_device(case(values_a, values_b, (True,) * 7, seed=4))
    product = fp32_product(c.a.values, c.b.values)
    got = fused_epilogue(product, epilogue_of(c, torch.float16))
    assert_same_bits(got, torch_scaled_mm(c.a, c.b, c.bias, torch.float16))


def test_scaled_mm_takes_the_triton_gemm_where_its_tile_divides_the_shape() -> None:
    """A shape of whole tiles goes to the fused GEMM (the epilogue pass would serve it with
    the same bits too: the sums are exact), b a transposed view as in dgrad."""
    from stochround.kernels.scaled_gemm import gemm_kernel

    m, n, k = 256, 256, 128
    assert gemm_kernel(m, n, k) == "triton_gemm"
    values_a, values_b = exact_operands(m, n, k, seed=6)
    c = to_device(case(values_a, values_b, (True,) * 7, seed=6))
    c = c._replace(b=c.b._replace(values=c.b.values.T.contiguous().T))
    options = {"bias": c.bias, "out_dtype": torch.bfloat16}
    got = scaled_mm(c.a, c.b, backend="triton", **options)
    assert_same_bits(got, scaled_mm(c.a, c.b, backend="torch", **options))


@pytest.mark.parametrize("shape", [(256, 256, 128), (64, 96, 32)])
def test_a_prepared_gemm_reads_b_given_transposed_as_it_is(shape: tuple[int, int, int]) -> None:
    """b given as b^T (K, N) (``transposed``: dgrad's Q(W), kept from fprop, no view made)
    gives the bits of b's transposed view, on the fused GEMM's route (its strides swapped)
    and the epilogue pass's (cuBLAS given the (K, N) operand)."""
    from stochround.blocks.gemm import fp32_matmul
    from stochround.kernels.scaled_gemm import PreparedScaledGemm, gemm_kernel

    m, n, k = shape
    values_a, values_b = exact_operands(m, n, k, seed=7)
    c = to_device(case(values_a, values_b, (True,) * 7, seed=7))
    b_t = c.b.values.T.contiguous()  # (K, N), as fprop's Q(W) is to dgrad
    epilogue = epilogue_of(c, torch.bfloat16)
    prepared = PreparedScaledGemm(c.a.values, b_t.T, epilogue, fp32_matmul)
    assert prepared.fused == (gemm_kernel(m, n, k) == "triton_gemm") == (m == 256)
    got = prepared(c.a.values, b_t, epilogue, transposed=True)
    assert_same_bits(got, prepared(c.a.values, b_t.T, epilogue))
    assert_same_bits(got, torch_scaled_mm(c.a, c.b, c.bias, torch.bfloat16))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt runs on CUDA")


def test_cublas_reads_each_operand_as_it_lies() -> None:
    """Row-major memory is the column-major transpose, column-major memory the tensor
    itself; the operation asked for follows; a tensor with no unit stride is refused."""
    from stochround.kernels.cublaslt import (
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        StoredOperand,
        has_unit_stride,
        stored_operand,
    )

    rows = torch.empty(3, 5)
    assert stored_operand(rows, wanted_transposed=True) == StoredOperand(5, 3, 5, CUBLAS_OP_N)
    assert stored_operand(rows, wanted_transposed=False) == StoredOperand(5, 3, 5, CUBLAS_OP_T)
    columns = torch.empty(5, 3).T  # (3, 5), column-major
    assert stored_operand(columns, wanted_transposed=False) == StoredOperand(3, 5, 3, CUBLAS_OP_N)
    assert stored_operand(columns, wanted_transposed=True) == StoredOperand(3, 5, 3, CUBLAS_OP_T)
    padded = torch.empty(3, 8)[:, :5]
    assert stored_operand(padded, wanted_transposed=True) == StoredOperand(5, 3, 8, CUBLAS_OP_N)
    assert not has_unit_stride(torch.empty(4, 6)[:, ::2])


def test_cublaslt_applies_tensor_scales_alone() -> None:
    """The device-alpha route takes an epilogue of one or two tensor scales and a bf16 or
    fp32 result on CUDA; every other step, dtype or device is refused, with the reason."""
    from stochround.kernels.cublaslt import cublaslt_missing
    from stochround.kernels.scaled_gemm import alpha_refusal, cublas_route

    values_a, values_b = exact_operands(8, 16, 32, seed=9)
    for index, present in enumerate(STEPS):
        c = to_device(case(values_a, values_b, present, seed=index))
        only_scales = not any(present[:2] + present[4:]) and any(present[2:4])
        for out_dtype in OUT_DTYPES:
            refusal = alpha_refusal(c.a.values, c.b.values, epilogue_of(c, out_dtype))
            served = DEVICE == "cuda" and only_scales and out_dtype != torch.float16
            assert (refusal is None) == (served and cublaslt_missing() is None), refusal
            route = cublas_route(c.a.values, c.b.values, epilogue_of(c, out_dtype))
            assert route == ("device_alpha" if refusal is None else "fused_epilogue")
    if DEVICE == "cpu":
        assert "CUDA" in str(alpha_refusal(values_a, values_b, epilogue_of(c, torch.float32)))


# tensor scales: ordinary, one that overflows bf16, one that makes results subnormal,
# and zero, infinity and NaN
ALPHA_SCALES = [
    (0.7 * 2.0**-20, None),
    (None, 3.3 * 2.0**10),
    (0.7 * 2.0**-20, 3.3 * 2.0**10),
    (1.3 * 2.0**60, 1.1 * 2.0**60),
    (1.7 * 2.0**-70, 1.3 * 2.0**-60),
    (0.0, 5.0),
    (float("inf"), 1.0),
    (float("nan"), None),
]


@pytest.mark.parametrize("layout", ["plain", "b_transposed", "a_column_major"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cublaslt_scales_exact_sums_as_the_spec_does(out_dtype: torch.dtype, layout: str) -> None:
    """Exact partial sums (any order gives the spec's product): cuBLASLt's epilogue gives
    the spec's bits for every scale, overflow, subnormal results, zero, infinity and NaN
    included, whatever the output's memory held (beta is zero: never read); b given
    transposed (dgrad) and a column-major (wgrad's views); K whose rows are 8-byte
    aligned.  On the CPU, the stand-in that `cpu_as_cuda` routes to."""
    from stochround.kernels.scaled_gemm import alpha_scaled_gemm

    _, route = cuda_route()
    with route:
        check_alpha_scaling(alpha_scaled_gemm, out_dtype, layout)


def check_alpha_scaling(alpha_scaled_gemm, out_dtype: torch.dtype, layout: str) -> None:  # type: ignore[no-untyped-def]
    m, n, k = 96, 136, 100
    values_a, values_b = exact_operands(m, n, k, seed=11)
    for scale_a, scale_b in ALPHA_SCALES:
        a = GemmOperand(values_a, None if scale_a is None else torch.tensor(scale_a), None, 1.0)
        b = GemmOperand(values_b, None if scale_b is None else torch.tensor(scale_b), None, 1.0)
        expected = torch_scaled_mm(a, b, None, out_dtype)
        c = to_device(Case(a, b, None))
        x, w = c.a.values, c.b.values
        transposed = layout == "b_transposed"
        if transposed:
            w = w.T.contiguous()
        if layout == "a_column_major":
            x = x.T.contiguous().T
        torch.full((m, n), float("nan"), dtype=out_dtype, device=DEVICE)  # freed: reused
        got = alpha_scaled_gemm(x, w, epilogue_of(c, out_dtype), transposed)
        assert_same_bits(got, expected)


@CUDA
def test_cublaslt_is_within_fp32_accumulations_bound_on_random_operands() -> None:
    """Sums in cuBLAS's order: within K 2**-24 sum |a_k b_k| of the exact product, then the
    one rounding of the scaling (to fp32)."""
    from stochround.kernels.scaled_gemm import alpha_scaled_gemm

    m, n, k = 256, 384, 4096
    g = generator(13)
    values_a = torch.randn(m, k, generator=g).bfloat16()
    values_b = torch.randn(n, k, generator=g).bfloat16()
    a = GemmOperand(values_a, torch.tensor(0.37), None, 1.0)
    b = GemmOperand(values_b, torch.tensor(5.1), None, 1.0)
    c = to_device(Case(a, b, None))
    got = alpha_scaled_gemm(c.a.values, c.b.values, epilogue_of(c, torch.float32))
    a64, b64 = values_a.double(), values_b.double()
    scale = float(torch.tensor(0.37) * torch.tensor(5.1))
    exact = (a64 @ b64.T) * scale
    bound = k * 2**-24 * (a64.abs() @ b64.abs().T) * scale + exact.abs() * 2**-23
    assert bool(((got.cpu().double() - exact).abs() <= bound).all())


@CUDA
def test_a_captured_cublaslt_gemm_replays_eagers_bits() -> None:
    """cuBLASLt's GEMM under CUDA-graph capture: the replay over new operands and scales
    gives the eager call's bits."""
    from stochround.kernels.scaled_gemm import alpha_scaled_gemm

    m, n, k = 128, 256, 512
    g = generator(17)
    draw = [torch.randn(rows, k, generator=g).bfloat16().to(DEVICE) for rows in (m, n) * 2]
    scales = [torch.tensor(s, device=DEVICE) for s in (0.3, 7.0, 1.9, 0.01)]
    static = (
        GemmOperand(draw[0].clone(), scales[0].clone(), None, 1.0),
        GemmOperand(draw[1].clone(), scales[1].clone(), None, 1.0),
    )
    epilogue = epilogue_of(Case(*static, None), torch.bfloat16)
    alpha_scaled_gemm(static[0].values, static[1].values, epilogue)  # warm-up: the plan
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = alpha_scaled_gemm(static[0].values, static[1].values, epilogue)
    for operand, values, scale in zip(static, draw[2:], scales[2:], strict=True):
        operand.values.copy_(values)
        operand.tensor_scale.copy_(scale)
    graph.replay()
    fresh = Case(
        GemmOperand(draw[2], scales[2], None, 1.0), GemmOperand(draw[3], scales[3], None, 1.0), None
    )
    assert_same_bits(out, alpha_scaled_gemm(draw[2], draw[3], epilogue_of(fresh, torch.bfloat16)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cublaslt_runs_on_its_operands_device_when_another_is_current() -> None:
    """Operands on the second GPU while the first is current: the GEMM runs there, with
    the bits it gives when that GPU is current."""
    from stochround.kernels.scaled_gemm import alpha_scaled_gemm

    m, n, k = 128, 256, 512
    values_a, values_b = exact_operands(m, n, k, seed=19)
    a = GemmOperand(values_a.to("cuda:1"), torch.tensor(0.3, device="cuda:1"), None, 1.0)
    b = GemmOperand(values_b.to("cuda:1"), torch.tensor(7.0, device="cuda:1"), None, 1.0)
    epilogue = epilogue_of(Case(a, b, None), torch.bfloat16)
    with torch.cuda.device(1):
        expected = alpha_scaled_gemm(a.values, b.values, epilogue)
    with torch.cuda.device(0):
        got = alpha_scaled_gemm(a.values, b.values, epilogue)
        torch.cuda.synchronize(1)
    assert got.device == torch.device("cuda:1")
    assert_same_bits(got, expected)


def test_scaled_mm_and_its_prepared_gemm_take_cublaslt_for_tensor_scales() -> None:
    """A product that cuBLAS serves (its shape not of whole tiles) with tensor scales alone
    goes to cuBLASLt's epilogue, eager and prepared alike, with the spec's bits on exact
    sums; b given transposed too (on the CPU: `cpu_as_cuda`'s stand-in)."""
    _, route = cuda_route()
    with route:
        check_alpha_routes()


def check_alpha_routes() -> None:
    from stochround.blocks.gemm import fp32_matmul
    from stochround.kernels.scaled_gemm import PreparedScaledGemm, gemm_kernel

    m, n, k = 40, 72, 104
    assert gemm_kernel(m, n, k) == "fused_epilogue"
    values_a, values_b = exact_operands(m, n, k, seed=19)
    c = to_device(case(values_a, values_b, (False, False, True, True, False, False, False), 19))
    expected = torch_scaled_mm(c.a, c.b, None, torch.bfloat16)
    assert_same_bits(scaled_mm(c.a, c.b, backend="triton", out_dtype=torch.bfloat16), expected)
    epilogue = epilogue_of(c, torch.bfloat16)
    prepared = PreparedScaledGemm(c.a.values, c.b.values, epilogue, fp32_matmul)
    assert prepared.alpha and not prepared.fused
    assert_same_bits(prepared(c.a.values, c.b.values, epilogue), expected)
    b_t = c.b.values.T.contiguous()
    assert_same_bits(prepared(c.a.values, b_t, epilogue, transposed=True), expected)
