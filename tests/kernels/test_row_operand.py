"""The row-wise absmax GEMM operand kernel (int8 row-wise) equals the PyTorch path bit for
bit: `stochround.blocks.gemm_operand`'s reference for per-element words (every mode, the
random bits and variants), `stochround.nn.operands.row_noise_operand` for one word per row
or per column; rows of any length (several chunks a row), NaN, infinite and all-zero rows,
fp32/bf16/fp16 inputs; and a `QuantizedLinear` int8 step on the kernel gives the PyTorch
path's y, dx and dW."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import stochround as sr
import stochround.nn as srnn
from stochround.blocks.formats import BLOCK_FORMATS, BlockFormat
from stochround.blocks.rowwise import PreparedRowGemmOperand, row_operand_refusal
from stochround.kernels import row_operand
from stochround.kernels.availability import INTERPRETED
from stochround.nn import linear, operands
from stochround.random import random_words, seed_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)
INT8 = BLOCK_FORMATS["int8_rowwise"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def special_rows(cols: int, dtype: torch.dtype) -> Tensor:
    """Rows that reach every case: ordinary rows over six decades, an all-zero row, a row
    with a NaN, one with an infinity, one of exact ties (amax 127: the multiplier is 1, the
    values k + 1/2), one below torchao's eps (the floor scale), one of signed zeros and
    tiny values, and one where the scale rounds below amax / 127 (values past 127)."""
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(12, cols, generator=g) * torch.logspace(-3, 3, cols)
    x[1] = 0.0
    x[2, cols // 2] = float("nan")
    x[3, cols - 1] = -float("inf")
    x[4] = torch.arange(cols) * 0.5 - cols / 4
    x[4, 0] = -127.0
    x[5] *= 1e-14
    x[6] = -0.0
    x[6, ::3] = 1e-6
    x[7] = 126.75
    x[7, 1] = -127.9
    return x.to(dtype).to(DEVICE)


def assert_same_operand(got: sr.blocks.GemmOperand, expected: sr.blocks.GemmOperand) -> None:
    """Values, row scales and factor equal bit for bit (NaN where NaN: its payload is the
    arithmetic's, which differs between devices)."""
    assert got.values.dtype == expected.values.dtype
    assert got.tensor_scale is None and expected.tensor_scale is None
    assert got.factor == expected.factor
    integer = torch.int16 if got.values.dtype == torch.bfloat16 else torch.int32
    for mine, theirs in ((got.values, expected.values), (got.row_scale, expected.row_scale)):
        assert mine is not None and theirs is not None
        assert torch.equal(mine.isnan().cpu(), theirs.isnan().cpu())
        width = integer if mine.dtype == got.values.dtype else torch.int32
        mine_bits = mine.nan_to_num(0.0).view(width).cpu()
        theirs_bits = theirs.nan_to_num(0.0).view(width).cpu()
        assert torch.equal(mine_bits, theirs_bits)
    assert got.row_scale.shape == (got.values.shape[0], 1)  # type: ignore[union-attr]


ROUNDINGS = [
    ("rne", None, "c"),
    ("sr", None, "c"),
    ("sr", 3, "a"),
    ("sr", 5, "c"),
    ("sr", 4, "b"),
    ("sr", 6, "odd"),
    ("rz", None, "c"),
    ("ru", None, "c"),
    ("rd", None, "c"),
    ("rna", None, "c"),
    ("ro", None, "c"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mode", "rbits", "variant"), ROUNDINGS)
def test_the_kernel_has_the_pytorch_paths_bits_per_element(
    dtype: torch.dtype, mode: str, rbits: int | None, variant: str
) -> None:
    x = special_rows(70, dtype)  # 70: rows not a multiple of 4 (one Philox call per word)
    options = {"rbits": rbits, "variant": variant, "seed": 2**63 + 9, "offset": 11}
    expected = sr.blocks.gemm_operand(x, INT8, mode, backend="torch", **options)
    got = sr.blocks.gemm_operand(x, INT8, mode, backend="triton", **options)
    assert_same_operand(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [5, 64, 200])
def test_rows_of_several_chunks_have_the_bits_of_one(
    dtype: torch.dtype, cols: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row longer than a program holds is read twice, chunk by chunk (amax, then the
    elements): chunks of 16 here, the last one partial where 16 does not divide the row."""
    monkeypatch.setattr(row_operand, "CHUNK_ELEMENTS", 16)
    x = special_rows(cols, dtype)
    for mode in ("rne", "sr"):
        expected = sr.blocks.gemm_operand(x, INT8, mode, seed=3, offset=4, backend="torch")
        got = sr.blocks.gemm_operand(x, INT8, mode, seed=3, offset=4, backend="triton")
        assert_same_operand(got, expected)


def test_short_rows_share_a_program() -> None:
    """Rows of 8 elements, many a program, and a row count that leaves the last program
    part empty."""
    x = special_rows(8, torch.bfloat16)[:11]
    expected = sr.blocks.gemm_operand(x, INT8, "sr", seed=1, offset=2, backend="torch")
    got = sr.blocks.gemm_operand(x, INT8, "sr", seed=1, offset=2, backend="triton")
    assert_same_operand(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("role", ["dgrad_grad_output", "wgrad_grad_output"])
@pytest.mark.parametrize("chunk", [16, 2**14])
def test_row_noise_has_the_pytorch_paths_bits(
    dtype: torch.dtype, role: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwix's one word per row (dgrad's dy) or per column (wgrad's dy^T, a transposed
    role) as `row_noise_operand` with `row_words` computes it, the offset a device
    tensor."""
    monkeypatch.setattr(row_operand, "CHUNK_ELEMENTS", chunk)
    entry = linear.make_plan(srnn.int8(noise="row"), 0).operands[role]
    x = special_rows(70, dtype)
    offset = torch.tensor(11, device=DEVICE)
    words = operands.row_words(x, role, 5, offset)
    expected = operands.row_noise_operand(x, INT8, words)
    got = operands.row_kernel_operand_of(x, entry, 5, offset)
    assert got is not None or DEVICE == "cpu"
    if got is None:  # the interpreter: routed by hand, as "auto" routes a CUDA tensor
        monkeypatch.setattr(operands, "use_kernel", lambda *args: True)
        got = operands.row_kernel_operand_of(x, entry, 5, offset)
    assert got is not None
    assert_same_operand(got, expected)
    # and with the offset an int: the unprepared launch
    assert_same_operand(operands.row_kernel_operand_of(x, entry, 5, 11), expected)  # type: ignore[arg-type]


def test_a_prepared_operand_takes_the_stream_from_device_tensors() -> None:
    x = special_rows(64, torch.bfloat16)
    prepared = PreparedRowGemmOperand(x, INT8, "sr", rbits=7, variant="a", backend="triton")
    seed, offset = seed_tensor(2**64 - 1, "seed", x.device), torch.tensor([3], device=x.device)
    expected = sr.blocks.gemm_operand(
        x, INT8, "sr", rbits=7, variant="a", seed=2**64 - 1, offset=3, backend="torch"
    )
    assert_same_operand(prepared(x, seed, offset), expected)
    with pytest.raises(ValueError, match="as prepared"):
        prepared(x[:4].contiguous(), seed, offset)


def test_the_row_words_are_random_words_of_the_row_or_column_index() -> None:
    """The kernel's word per row (per column) is ``random_words(i, seed, offset)``: a row
    of 127s and halves rounds up exactly where its word's top bit is set."""
    x = torch.full((8, 8), 0.5).to(DEVICE)
    x[:, 0] = 127.0  # scale 1: the other values are exact halves
    for words, index in (("row", torch.arange(8)[:, None]), ("column", torch.arange(8)[None])):
        values, _ = row_operand.row_gemm_operand(
            x, INT8.element, mode="sr", n=1, variant="c", words=words, seed=4, offset=6
        )
        up = (random_words(index, 4, 6) >> 31).expand(8, 8).to(torch.float32)
        assert torch.equal(values[:, 1:].float().cpu(), up[:, 1:])


def test_the_kernel_refuses_what_it_does_not_compute() -> None:
    x = torch.zeros(4, 8)
    assert row_operand_refusal(x, BLOCK_FORMATS["mxfp8_e4m3"]) is not None
    assert "hardware" in str(row_operand_refusal(x, INT8, "nvidia-cvt-rs-e2m1"))
    assert "float32, bfloat16 or float16" in str(row_operand_refusal(x.double(), INT8))
    assert "contiguous 2-D" in str(row_operand_refusal(x.T, INT8))
    symmetric = BlockFormat("rows", BLOCK_FORMATS["mxint8"].element, None, INT8.scale, "absmax")
    assert "does not round ocp_int8" in str(row_operand_refusal(x, symmetric))
    with pytest.raises(ValueError, match="needs mode='sr'"):
        PreparedRowGemmOperand(x, INT8, "rne", words="row", backend="triton")
    # float64 and hardware presets keep the PyTorch path under "auto"
    wide = torch.randn(4, 8, dtype=torch.float64)
    expected = sr.blocks.gemm_operand(wide, INT8, "sr", seed=1, backend="torch")
    assert_same_operand(sr.blocks.gemm_operand(wide, INT8, "sr", seed=1), expected)
    with pytest.raises(ValueError, match="backend='triton' cannot serve"):
        sr.blocks.gemm_operand(wide, INT8, "sr", seed=1, backend="triton")


def int8_step(recipe: srnn.Recipe, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(y, dx, dW) of one QuantizedLinear step of a 64 x 96 layer on 48 tokens."""
    g = torch.Generator().manual_seed(1)
    layer = nn.Linear(96, 64).to(dtype)
    with torch.no_grad():
        layer.weight.copy_((torch.randn(64, 96, generator=g) / 8).to(dtype))
        layer.bias.copy_(torch.randn(64, generator=g).to(dtype))
    model = srnn.QuantizedLinear.from_linear(copy.deepcopy(layer), recipe).to(DEVICE)
    x = torch.randn(48, 96, generator=g).to(dtype).to(DEVICE).requires_grad_()
    grad = torch.randn(48, 64, generator=g).to(dtype).to(DEVICE)
    y = model(x)
    y.backward(grad)
    return y.detach(), x.grad, model.weight.grad  # type: ignore[return-value]


@pytest.mark.usefixtures("no_step_graphs")  # counts the eager route's kernel operands
@pytest.mark.parametrize("noise", ["element", "row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_step_on_the_kernel_gives_the_pytorch_paths_y_dx_and_dw(
    noise: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every operand of the step (the forward's, dgrad's and wgrad's, SR on dy) on the
    kernel, one launch each, against the same step on the PyTorch path."""
    recipe = srnn.int8(noise=noise, seed=3)
    launches: list[str] = []
    original = operands.row_kernel_operand_of

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = original(*args, **kwargs)
        launches.append("kernel" if result is not None else "torch")
        return result

    torch_path = operands.gemm_operand

    def on_torch(*args, **kwargs):  # type: ignore[no-untyped-def]
        return torch_path(*args, **{**kwargs, "backend": "torch"})

    with monkeypatch.context() as patch:  # the PyTorch path, as before the kernel
        patch.setattr(operands, "row_kernel_operand_of", lambda *args, **kwargs: None)
        patch.setattr(operands, "gemm_operand", on_torch)
        expected = int8_step(recipe, dtype)
    with monkeypatch.context() as patch:
        if DEVICE == "cpu":  # the interpreter: routed as "auto" routes a CUDA tensor
            patch.setattr(operands, "use_kernel", lambda *args: True)
        patch.setattr(operands, "row_kernel_operand_of", counted)
        got = int8_step(recipe, dtype)
    assert launches == ["kernel"] * 6
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine.cpu(), theirs.cpu())
