"""GEMM operands (`gemm_operand`, `gemm_operand_of`, `BlockFormat.gemm_dtype`) and the
emulated block-scaled GEMM (`scaled_mm`)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from stochround import blocks
from stochround.blocks import GemmOperand, gemm_operand, gemm_operand_of
from stochround.blocks.formats import BLOCK_FORMATS, BlockFormat
from stochround.blocks.gemm import scaled_mm
from stochround.kernels.availability import INTERPRETED

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on CPU

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "nvfp4": ("nvfp4", {}),
    "nvfp4-sr-torchao": ("nvfp4", {"mode": "sr", "seed": 4, "nvfp4_flavour": "torchao"}),
    "nvfp4-2d-tiles": ("nvfp4", {"block": (16, 16)}),
    "nvfp4-rht-bf16-sr": ("nvfp4", {"mode": "sr", "seed": 2, "rht": 16, "rht_bf16": True}),
    "nvfp4-single-level": ("nvfp4", {"tensor_scale": False, "mode": "rz"}),
    "nvfp4-pow2-sr-rht": ("nvfp4", {"mode": "sr", "seed": 6, "rht": 16, "nvfp4_flavour": "pow2"}),
    "nvfp4-pow2-2d": ("nvfp4", {"block": (16, 16), "nvfp4_flavour": "pow2"}),
    "mxfp4-floor34-rht": ("mxfp4", {"mode": "sr", "seed": 3, "scale_rule": "floor-3/4", "rht": 32}),
    "mxfp8-sr": ("mxfp8_e4m3", {"mode": "sr", "seed": 1}),
    "mxfp6-2d": ("mxfp6_e2m3", {"block": (32, 32)}),
    "int8-rowwise-sr": ("int8_rowwise", {"mode": "sr", "seed": 5}),
}


def _x(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Gaussian values with a spread of magnitudes across rows and tiles."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator)
    x[rows // 2 :, cols // 2 :] *= 1e-3
    return x.bfloat16()


def _product_in_bf16(value: float) -> bool:
    """A float64 product is exact in bf16 (or beyond fp32's range: infinite alike)."""
    if abs(value) > torch.finfo(torch.float32).max:
        return True
    widened = torch.tensor(value, dtype=torch.float64)
    return float(widened.to(torch.bfloat16).to(torch.float64)) == value


@pytest.mark.parametrize("name", list(BLOCK_FORMATS))
def test_gemm_dtype_is_bf16_exactly_where_every_element_scale_product_is_a_bf16_value(
    name: str,
) -> None:
    """Checked by enumeration with torch's own conversion: every finite element times every
    finite positive block scale (E8M0: 2**-127..2**127; E4M3: its 126 positive finite
    values; whole-row blocks: the element alone)."""
    fmt = BLOCK_FORMATS[name]
    elements = [v for v in fmt.element_table or () if math.isfinite(v)]
    if fmt.block is None:
        scales = [1.0]
    elif fmt.scale_rule == "nvfp4":
        table = BLOCK_FORMATS["mxfp8_e4m3"].element_table or ()
        scales = [v for v in table if math.isfinite(v) and v > 0]
    else:
        scales = [2.0**k for k in range(-127, 128)]
    exact = all(_product_in_bf16(e * s) for e in elements for s in scales)
    assert fmt.gemm_dtype == (torch.bfloat16 if exact else torch.float32)


def test_mxfp8_takes_fp32_operands_as_its_smallest_products_lie_below_bf16s_subnormals() -> None:
    """e4m3's smallest subnormal 2**-9 times E8M0's smallest scale 2**-127 is 2**-136, an
    fp32 value below bf16's smallest subnormal 2**-133; e2m1's 0.5 times it is 2**-128."""
    assert BLOCK_FORMATS["mxfp8_e4m3"].gemm_dtype == torch.float32
    assert not _product_in_bf16(2.0**-136)
    assert BLOCK_FORMATS["mxfp4"].gemm_dtype == BLOCK_FORMATS["nvfp4"].gemm_dtype == torch.bfloat16


def _values(operand: GemmOperand) -> torch.Tensor:
    """Q(x) in fp32 from a GEMM operand (float64 products, then fp32)."""
    values = operand.values.double()
    if operand.row_scale is not None:
        values = values * operand.row_scale.double()
    if operand.tensor_scale is not None:
        values = values * operand.tensor_scale.double()
    return (values * operand.factor).float()


@pytest.mark.parametrize("case", list(CASES))
def test_an_operand_times_its_factors_is_the_dequantized_tensor(case: str) -> None:
    """values * row_scale * tensor_scale * factor equals BlockTensor.dequantize (rotated
    basis) up to fp32's rounding of the product (the order of the factors differs); the
    values carry no factor where the format has none (bit for bit then)."""
    name, options = CASES[case]
    x = _x(64, 64)
    q = blocks.quantize(x, name, backend="torch", **options)
    operand = gemm_operand_of(q)
    assert operand.values.dtype == q.format.gemm_dtype
    dequantized = q.dequantize(torch.float32)
    plain = operand.row_scale is None and operand.tensor_scale is None and operand.factor == 1
    if plain:
        assert torch.equal(operand.values.float(), dequantized)
    else:
        torch.testing.assert_close(_values(operand), dequantized, rtol=2**-23, atol=0)


def _bits(values: torch.Tensor) -> torch.Tensor:
    """The values' bit patterns (bf16 or fp32) on the CPU."""
    integer = torch.int16 if values.dtype == torch.bfloat16 else torch.int32
    return values.cpu().view(integer)


@pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(), reason="needs Triton")
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernels_operand_is_the_pytorch_paths_bit_for_bit(case: str) -> None:
    """The kernel's "gemm" output (whole-row formats: the kernel's codes, then the PyTorch
    dequantization) against the PyTorch path's operand."""
    name, options = CASES[case]
    x = _x(64, 64)
    expected = gemm_operand(x, name, backend="torch", **options)
    got = gemm_operand(x.to(KERNEL_DEVICE), name, backend="triton", **options)
    assert got.values.dtype == expected.values.dtype
    assert torch.equal(_bits(got.values), _bits(expected.values))
    assert got.factor == expected.factor
    pairs = ((got.tensor_scale, expected.tensor_scale), (got.row_scale, expected.row_scale))
    for mine, theirs in pairs:
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert torch.equal(mine.cpu(), theirs)


@pytest.mark.parametrize("case", list(CASES))
def test_scaled_mm_is_the_product_of_the_dequantized_operands(case: str) -> None:
    """Q(a) Q(b)^T within fp32 accumulation's error bound: K * 2**-24 * sum |a_k b_k| for
    each output (and a few ulps for the scaling of the result)."""
    name, options = CASES[case]
    a, b = _x(32, 64, seed=1), _x(64, 64, seed=2)
    qa = gemm_operand(a, name, backend="torch", **options)
    qb = gemm_operand(b, name, backend="torch", **options)
    got = scaled_mm(qa, qb).double()
    va, vb = _values(qa).double(), _values(qb).double()
    exact = va @ vb.T
    bound = (64 + 4) * 2**-24 * (va.abs() @ vb.abs().T)
    assert bool(((got - exact).abs() <= bound).all())


def test_a_rotated_pair_multiplies_in_the_rotated_basis_and_the_rotation_cancels() -> None:
    """H is orthogonal: (H a)(H b)^T = a b^T; the product of two operands rotated alike is
    the product of the unrotated dequantized operands up to fp32 rounding."""
    a, b = _x(32, 64, seed=1), _x(48, 64, seed=2)
    qa = blocks.quantize(a, "nvfp4", rht=16, backend="torch")
    qb = blocks.quantize(b, "nvfp4", rht=16, backend="torch")
    got = scaled_mm(gemm_operand_of(qa), gemm_operand_of(qb)).double()
    plain_a = qa.dequantize(torch.float64, unrotate=True)
    plain_b = qb.dequantize(torch.float64, unrotate=True)
    unrotated = plain_a @ plain_b.T
    scale = float(unrotated.abs().max())
    torch.testing.assert_close(got, unrotated, rtol=1e-5, atol=1e-5 * scale)


def test_bad_operands_raise_naming_what_is_wrong() -> None:
    x = _x(32, 64)
    with pytest.raises(ValueError, match="x must be 2-D"):
        gemm_operand(x.reshape(2, 16, 64), "nvfp4")
    with pytest.raises(ValueError, match="quantized along its last axis"):
        gemm_operand_of(blocks.quantize(x, "mxfp4", axis=0))
    qa, qb = gemm_operand(x, "nvfp4"), gemm_operand(_x(32, 32), "nvfp4")
    with pytest.raises(ValueError, match="contraction axis last and of one length"):
        scaled_mm(qa, qb)


def test_a_custom_block_format_has_its_own_gemm_dtype() -> None:
    fmt = blocks.block_format("mxfp4")
    custom = BlockFormat("e5m2-blocks", BLOCK_FORMATS["mxfp8_e5m2"].element, 32, fmt.scale, "floor")
    assert custom.gemm_dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case", ["nvfp4", "nvfp4-pow2-sr-rht", "mxfp4-floor34-rht", "mxfp8-sr", "int8-rowwise-sr"]
)
def test_cuda_scaled_mm_agrees_with_the_cpus_up_to_accumulation_order(case: str) -> None:
    """On CUDA the bf16 operands go through torch's mm with an fp32 output (fp32
    accumulation in another order), within the same bound as the CPU's fp32 matmul."""
    name, options = CASES[case]
    a, b = _x(128, 256, seed=1), _x(64, 256, seed=2)
    qa = gemm_operand(a, name, backend="torch", **options)
    qb = gemm_operand(b, name, backend="torch", **options)
    on_cuda = [
        GemmOperand(*(t.cuda() if isinstance(t, torch.Tensor) else t for t in q)) for q in (qa, qb)
    ]
    got = scaled_mm(*on_cuda).double().cpu()
    va, vb = _values(qa).double(), _values(qb).double()
    bound = (256 + 4) * 2**-24 * (va.abs() @ vb.abs().T)
    assert bool(((got - va @ vb.T).abs() <= bound).all())


def test_native_fp8_mm_takes_float8_operands_with_one_scale_in_multiples_of_16() -> None:
    from stochround.blocks.gemm import native_fp8_mm

    scale = torch.tensor(0.5)
    a8 = GemmOperand(torch.zeros(16, 32).to(torch.float8_e4m3fn), scale, None, 1.0)
    with pytest.raises(ValueError, match=r"b\.values must be a 2-D float8 tensor"):
        native_fp8_mm(a8, GemmOperand(torch.zeros(16, 32), scale, None, 1.0))
    with pytest.raises(ValueError, match="b must carry one per-tensor scale"):
        native_fp8_mm(a8, a8._replace(tensor_scale=None))
    odd = GemmOperand(torch.zeros(16, 24).to(torch.float8_e4m3fn), scale, None, 1.0)
    with pytest.raises(ValueError, match="multiples of 16; got 16x24x16"):
        native_fp8_mm(odd, odd)


@pytest.mark.parametrize("device", sorted({"cpu", KERNEL_DEVICE}))
def test_native_fp8_mm_adds_a_bias_to_an_fp32_output_after_the_product(device: str) -> None:
    # cuBLAS refuses a bias with an fp32 output: the product, then the fp32 addition
    from stochround.blocks.gemm import native_fp8_mm

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(32, 48, generator=generator) for _ in range(2))
    bias = torch.randn(32, generator=generator).to(device)
    scale = torch.tensor(0.25, device=device)
    qa, qb = (GemmOperand(t.to(device).to(torch.float8_e4m3fn), scale, None, 1.0) for t in (a, b))
    plain = native_fp8_mm(qa, qb, out_dtype=torch.float32)
    got = native_fp8_mm(qa, qb, bias=bias, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, plain + bias)


@pytest.mark.parametrize("bias", [True, False])
def test_the_opaque_scaled_mm_op_compiles_and_gives_the_eager_result(bias: bool) -> None:
    """`stochround::kernel_scaled_mm` (what `scaled_mm` is when traced on CUDA: eager's
    kernels and their GEMM choice) compiles with inductor under ``fullgraph=True`` (its
    fake gives the output's shape and dtype) and returns eager `scaled_mm`'s values; here
    on CPU tensors, where its body takes the PyTorch sequence (a GPU runs the kernels:
    tests/nn/test_linear.py compares compiled and eager steps there)."""
    from stochround.blocks.gemm import kernel_scaled_mm_op

    g = torch.Generator().manual_seed(3)
    a = gemm_operand(torch.randn(32, 64, generator=g), "nvfp4")
    b = gemm_operand(torch.randn(48, 64, generator=g), "nvfp4")
    offset = torch.randn(48, generator=g) if bias else None
    expected = scaled_mm(a, b, bias=offset, out_dtype=torch.bfloat16)

    def product(*fields: Any) -> torch.Tensor:
        return kernel_scaled_mm_op(*fields)  # type: ignore[no-any-return]

    compiled = torch.compile(product, backend="inductor", fullgraph=True)
    got = compiled(*a, *b, offset, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (32, 48)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("magnitude", [1.0, 2.0**100, 2.0**-60, 2.0**-110, 2.0**-140])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_pow2_operand_holds_its_dequantized_values_exactly(
    magnitude: float, backend: str
) -> None:
    """Under nvfp4_flavour="pow2" the operand has no tensor scale: its bf16 values are the
    BlockTensor's dequantized values bit for bit, at every magnitude (the tensor scale's
    floor 2**-118 keeps the least product a bf16 value; 2**-140 leaves fp32's normal range),
    on the PyTorch path and the kernel's."""
    if backend == "triton" and not INTERPRETED and not torch.cuda.is_available():
        pytest.skip("needs Triton")
    device = "cpu" if backend == "torch" else KERNEL_DEVICE
    x = (_x(64, 64, seed=3).float() * magnitude).to(device)
    options: dict[str, Any] = {"mode": "sr", "seed": 9, "nvfp4_flavour": "pow2"}
    operand = gemm_operand(x, "nvfp4", backend=backend, **options)
    q = blocks.quantize(x.cpu(), "nvfp4", backend="torch", **options)
    assert operand.tensor_scale is None and operand.values.dtype == torch.bfloat16
    assert q.tensor_scale is not None and float(q.tensor_scale) >= 2.0**-118
    assert torch.equal(_bits(operand.values.float()), _bits(q.dequantize(torch.float32)))


def test_pow2_operands_multiply_without_scaling_their_product() -> None:
    """Two "pow2" operands: `unscaled`, so `scaled_mm` is the fp32 product rounded once
    (no scaling steps), the te flavour's operands are not."""
    from stochround.blocks.gemm import torch_scaled_mm, unscaled

    a, b = _x(32, 64, seed=4), _x(48, 64, seed=5)
    qa, qb = (gemm_operand(t, "nvfp4", nvfp4_flavour="pow2") for t in (a, b))
    assert unscaled(qa, qb, None) and not unscaled(qa, qb, torch.zeros(48))
    te = gemm_operand(a, "nvfp4")
    assert not unscaled(te, qb, None)
    product = qa.values.float() @ qb.values.float().T
    assert torch.equal(torch_scaled_mm(qa, qb, None, torch.bfloat16), product.bfloat16())
    assert torch.equal(scaled_mm(qa, qb, out_dtype=torch.bfloat16), product.bfloat16())


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cublas_rounds_an_unscaled_product_once_as_the_pytorch_path(
    out_dtype: torch.dtype,
) -> None:
    """Integer operands (every sum exact in fp32, in any order): cuBLAS's bf16 product
    (`rounded_matmul`, split-K partial sums in fp32) equals the fp32 product rounded once,
    and leaves PyTorch's reduced-precision setting as it found it; the prepared GEMM of
    unscaled operands takes that route where the kernels' GEMM does not serve the sizes."""
    from stochround.blocks.gemm import PreparedScaledMm, rounded_matmul, torch_scaled_mm

    generator = torch.Generator().manual_seed(6)
    # above the kernels' GEMM's sizes (`FUSED_GEMM_LIMIT`): cuBLAS's product
    a = torch.randint(-8, 9, (1024, 4096), generator=generator).bfloat16().cuda()
    b = torch.randint(-8, 9, (1024, 4096), generator=generator).bfloat16().cuda()
    setting = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    got = rounded_matmul(a, b.T, out_dtype)
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction == setting
    qa, qb = GemmOperand(a, None, None, 1.0), GemmOperand(b, None, None, 1.0)
    expected = torch_scaled_mm(qa, qb, None, out_dtype)
    assert got.dtype == out_dtype and torch.equal(got, expected)
    prepared = PreparedScaledMm(qa, qb, None, out_dtype)
    assert prepared.rounded and torch.equal(prepared(qa, qb, None, out_dtype), expected)
