"""The Triton matmul kernel (`kernels/matmul.py`) against `arith.matmul`'s PyTorch path, bit
for bit.

Without a GPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1);
on the GPU machine the same tests run compiled on CUDA tensors, plus the GPU-only test at
the end (the CUDA kernel against the CPU PyTorch path).  Sizes stay small: the interpreter
runs the reduction loop step by step.
"""

from __future__ import annotations

import pytest
import torch

from stochround import arith
from stochround.kernels import availability
from stochround.kernels import matmul as kernel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (rbits, variant) of the SR cases: exact SR, and limited bits with variants a and c
SR_CASES = ((None, "c"), (3, "a"), (5, "c"))


def _on_gpu_only(everything: list, representative: list) -> list:
    """Compiling the kernel for a (format, mode, ...) takes seconds on a GPU, where the
    interpreter takes none: there the tests sweep a representative subset."""
    return representative if DEVICE == "cuda" else everything


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtypes, shapes and bit patterns (NaN payloads and zero signs included)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.contiguous().view(width).cpu(), b.contiguous().view(width).cpu())


def _values(shape: tuple[int, ...], dtype: torch.dtype, seed: int, spread: int = 0) -> torch.Tensor:
    """Normal values times 2**U(-spread, spread), so sums cancel, carry and lose bits."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    exponents = torch.randint(-spread, spread + 1, shape, generator=generator)
    return (values * torch.pow(2.0, exponents.double())).to(dtype).to(DEVICE)


def _check(a: torch.Tensor, b: torch.Tensor, fmt: str, mode: str, **options) -> torch.Tensor:
    """Assert the kernel's bits are the PyTorch path's; return them."""
    want = arith.matmul(a, b, fmt, mode, backend="torch", **options)
    got = arith.matmul(a, b, fmt, mode, backend="triton", **options)
    assert _same_bits(got, want), f"{fmt} {mode} {options}: {got} != {want}"
    return got


def _mode_options(mode: str, case: int) -> dict:
    if mode != "sr":
        return {}
    rbits, variant = SR_CASES[case]
    return {"rbits": rbits, "variant": variant, "seed": 11 + case, "offset": 3}


@pytest.mark.parametrize(
    "fmt", _on_gpu_only(["bfloat16", "binary16", "e4m3fn", "e5m2"], ["bfloat16", "e4m3fn"])
)
@pytest.mark.parametrize(("mode", "case"), [("rne", 0), ("rz", 0), ("sr", 0), ("sr", 1), ("sr", 2)])
def test_formats_modes_and_product_formats(fmt: str, mode: str, case: int) -> None:
    """Odd M, N, K (the tile is masked), a batch dim; products rounded to fmt, to another
    format and exact."""
    a = _values((2, 5, 5), torch.bfloat16, seed=1, spread=3)
    b = _values((5, 6), torch.bfloat16, seed=2, spread=3)
    other = "e5m2" if fmt != "e5m2" else "bfloat16"
    options = _mode_options(mode, case)
    for product_fmt in (None, other if case != 1 else "exact"):
        result = _check(a, b, fmt, mode, product_fmt=product_fmt, **options)
        assert result.shape == (2, 5, 6) and result.dtype == torch.bfloat16


@pytest.mark.parametrize("order", ["recursive", "blocked", "compensated"])
@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_orders(order: str, mode: str) -> None:
    """Blocked with a short last block (K = 7, block = 3); Kahan's four roundings a term."""
    a = _values((3, 7), torch.float16, seed=3, spread=6)
    b = _values((7, 5), torch.float16, seed=4, spread=6)
    options = {"seed": 5, "offset": 9} if mode == "sr" else {}
    _check(a, b, "bfloat16", mode, order=order, block=3, **options)


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((1, 1), (1, 1)),  # one term: only step 0 (the product rounded into fmt)
        ((3, 1), (1, 5)),  # K = 1
        ((2, 1, 3, 4), (3, 4, 5)),  # broadcast batch dims (2, 3)
        ((6, 2), (2, 9)),  # several programs, of 2 x 4 outputs (below)
    ],
)
def test_shapes(shape_a: tuple, shape_b: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Odd shapes; small tiles, so words are drawn across program boundaries."""
    if shape_a == (6, 2):
        monkeypatch.setattr(kernel, "INTERPRETER_ROWS", 2)
        monkeypatch.setattr(kernel, "GPU_ROWS", 2)
    a = _values(shape_a, torch.float32, seed=5, spread=4)
    b = _values(shape_b, torch.bfloat16, seed=6, spread=4)
    result = _check(a, b, "e4m3fn", "sr", seed=7, product_fmt="bfloat16")
    assert result.dtype == torch.float32
    batch = torch.broadcast_shapes(shape_a[:-2], shape_b[:-2])
    assert result.shape == (*batch, shape_a[-2], shape_b[-1])


def test_empty_outputs_and_mixed_16_bit_inputs() -> None:
    """M = 0 gives an empty result; bf16 times fp16 promotes to fp32."""
    a, b = _values((0, 3), torch.float32, 8), _values((3, 2), torch.float32, 9)
    empty = arith.matmul(a, b, "bf16", backend="triton")
    assert empty.shape == (0, 2)
    a, b = _values((3, 4), torch.bfloat16, 10), _values((4, 3), torch.float16, 11)
    assert _check(a, b, "e5m2", "sr", seed=1).dtype == torch.float32


@pytest.mark.parametrize("sat", _on_gpu_only(["none", "propagate", "finite"], ["propagate"]))
@pytest.mark.parametrize(("fmt", "mode"), [("e4m3fn", "rne"), ("bfloat16", "rd"), ("e5m2", "ru")])
def test_special_values_wide_exponents_and_cancellation(fmt: str, mode: str, sat: str) -> None:
    """fp32 inputs from 2**-149 to 2**127 (products far outside fp32), infinities, NaN,
    signed zeros and exact cancellation (zero sums take rd's sign); exact products."""
    a = _values((4, 6), torch.float32, seed=12, spread=100)
    b = _values((6, 5), torch.float32, seed=13, spread=100)
    a[0, :3] = torch.tensor([float("inf"), 0.0, -0.0])
    a[1, 1] = float("nan")
    a[2, :] = torch.tensor([1e-45, -1e-45, 3e38, -3e38, 2.0**-126, -(2.0**-140)])
    b[:, 4] = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, -0.0])  # a row of 2 terms cancelling
    a[3, :] = 1.0
    for product_fmt in ("exact", None):
        _check(a, b, fmt, mode, sat=sat, product_fmt=product_fmt)


@pytest.mark.parametrize(("mode", "options"), [("rne", {}), ("sr", {"rbits": 27, "seed": 2})])
def test_fp32_accumulator_of_exact_products(mode: str, options: dict) -> None:
    """48-bit exact products added to a 24-bit accumulator: the widest sums the kernel
    rounds (the target ulp 37 or more bits above the bits folded into the sticky bit)."""
    a = _values((3, 9), torch.float32, seed=14, spread=30)
    b = _values((9, 4), torch.float32, seed=15, spread=30)
    _check(a, b, "binary32", mode, product_fmt="exact", **options)


def test_seed_and_offset_tensors_and_offset_wrapping() -> None:
    """Seeds and offsets in device tensors give the bits of ints; offsets wrap mod 2**64."""
    a = _values((3, 4), torch.bfloat16, seed=16, spread=2)
    b = _values((4, 3), torch.bfloat16, seed=17, spread=2)
    high = 2**64 - 2  # the reduction's steps use offsets 2**64 - 1, 0, 1, 2
    as_ints = _check(a, b, "e4m3fn", "sr", seed=2**63 + 5, offset=high)
    seed, offset = torch.tensor(2**63 + 5 - 2**64), torch.tensor(-2)  # two's complement
    as_tensors = arith.matmul(a, b, "e4m3fn", "sr", seed=seed, offset=offset, backend="triton")
    assert _same_bits(as_ints, as_tensors)
    assert not _same_bits(as_ints, arith.matmul(a, b, "e4m3fn", "sr", seed=6, backend="triton"))


def test_default_seed_is_drawn_once_as_on_the_torch_path() -> None:
    a = _values((2, 5), torch.bfloat16, seed=18, spread=2)
    b = _values((5, 3), torch.bfloat16, seed=19, spread=2)
    torch.manual_seed(123)
    kernel_bits = arith.matmul(a, b, "e5m2", "sr", backend="triton")
    torch.manual_seed(123)
    assert _same_bits(kernel_bits, arith.matmul(a, b, "e5m2", "sr", backend="torch"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a, b: arith.matmul(a, b, "bf16", order="pairwise", backend="triton"), "pairwise"),
        (lambda a, b: arith.matmul(a, b, "bf16", "sr", rand="data", backend="triton"), "rand"),
        (lambda a, b: arith.matmul(a, b, "e8m0", backend="triton"), "fmt=e8m0 is wider"),
        (
            lambda a, b: arith.matmul(a, b, "bf16", product_fmt="binary64", backend="triton"),
            "product_fmt=binary64",
        ),
        (lambda a, b: arith.matmul(a.double(), b, "bf16", backend="triton"), "torch.float64"),
        (lambda a, b: arith.matmul(a, b, "binary32", "sr", backend="triton"), "rbits <= 27"),
        (lambda a, b: arith.matmul(a, b, "bf16", backend="cuda"), "backend"),
        (lambda a, b: arith.matmul(a, b, "bf16", "rne", rbits=4, backend="triton"), "rbits"),
        (lambda a, b: arith.matmul(a, b, "bf16", variant="z", backend="triton"), "variant"),
        (lambda a, b: arith.matmul(a, b, "bf16", order="blocked", block=0), "block"),
        (lambda a, b: arith.matmul(a[:, :0], b[:0], "bf16", backend="triton"), "no elements"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, message: str) -> None:
    a, b = _values((2, 3), torch.float32, 20), _values((3, 2), torch.float32, 21)
    with pytest.raises(ValueError, match=message):
        call(a, b)


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the interpreter, backend='triton' refuses CPU tensors; 'auto' computes them on
    the PyTorch path (the interpreter flag is read once, where the kernels read it)."""
    monkeypatch.setattr(availability, "INTERPRETED", False)
    a, b = torch.ones(2, 3), torch.ones(3, 2)
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        arith.matmul(a, b, "bf16", backend="triton")
    assert torch.equal(arith.matmul(a, b, "bf16"), torch.full((2, 2), 3.0))


# --- GPU only ----------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_kernel_equals_the_cpu_torch_path() -> None:
    """backend='auto' on CUDA tensors runs the kernel; its bits are the CPU PyTorch path's.
    What the kernel cannot do (pairwise) falls back to the PyTorch path on the GPU."""
    a = _values((2, 33, 40), torch.bfloat16, seed=22, spread=3)
    b = _values((40, 35), torch.bfloat16, seed=23, spread=3)
    for fmt, mode, options in (
        ("bfloat16", "sr", {"seed": 3}),
        ("e4m3fn", "sr", {"seed": 4, "rbits": 4, "variant": "a", "product_fmt": "bf16"}),
        ("e5m2", "rne", {"order": "blocked", "block": 16}),
        ("bfloat16", "sr", {"seed": 5, "order": "pairwise"}),
    ):
        on_cuda = arith.matmul(a, b, fmt, mode, **options)
        on_cpu = arith.matmul(a.cpu(), b.cpu(), fmt, mode, **options)
        assert on_cuda.is_cuda and _same_bits(on_cuda, on_cpu), (fmt, mode, options)
