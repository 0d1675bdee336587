"""The GaussWS kernel against the PyTorch path, bit for bit: every target format, block
length and input dtype, special blocks (zero, NaN, infinite, fp32-subnormal amax), values
over many binades (subnormal spacings), seeds as ints and tensors, index offsets (aligned
and not) and noise resolutions.

Without a GPU the kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1); on
the GPU machine the same tests run compiled on CUDA tensors (a representative subset of the
sweeps: each choice compiles a kernel), plus the GPU-only test at the end (CUDA == CPU).
"""

from __future__ import annotations

import math

import pytest
import torch

from stochround.formats import format as sr_format
from stochround.kernels.gaussws import check_thresholds, gaussws_blocks
from stochround.nn.gaussws_noise import gaussian_thresholds, sample_weight_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# the interpreter evaluates NaN and infinite blocks with numpy, which warns of them
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)

FORMATS = ["e3m2", "e2m3", "e4m3fn", "e5m2", "e2m1"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BLOCKS: list[int | None] = [16, 32, None]


def _on_gpu_only(everything: list, representative: list) -> list:
    """Compiling a kernel per choice takes a second on a GPU, where the interpreter takes
    none: there the tests sweep a representative subset."""
    return representative if ON_GPU else everything


SWEEP_FORMATS = _on_gpu_only(FORMATS, ["e3m2", "e2m1"])
SWEEP_DTYPES = _on_gpu_only(DTYPES, [torch.bfloat16, torch.float32])


def _expected(
    w: torch.Tensor,
    fmt: str,
    block: int | None,
    noise_bits: int,
    seed: int | torch.Tensor,
    offset: int | torch.Tensor,
    index_offset: int = 0,
) -> torch.Tensor:
    """The PyTorch path's sample (the executable definition), on the CPU."""
    return sample_weight_torch(
        w.cpu(),
        fmt,
        block=block,
        noise="gaussws",
        noise_bits=noise_bits,
        seed=seed,
        offset=offset,
        index_offset=index_offset,
    )


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtypes, shapes and bit patterns, any NaN matching any NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(torch.where(nan, 0, a).view(width), torch.where(nan, 0, b).view(width))


def _special_blocks(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values in ``dtype`` over many binades: each run of 16 elements at its own scale (from
    the dtype's smallest subnormal to near its max), elements within a run spread over up to
    2**20; and pairs of runs (whole blocks of 16 and 32) that are all zero, hold a NaN, an
    infinity, signed zeros, one value far above the rest (the others then fall in the
    target's subnormal spacing), values so small that the block's scale exponent clamps at
    -126 (fp32 and bf16: subnormal spacings), and values up to the dtype's max (sums that
    overflow)."""
    generator = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    # the smallest subnormal: the smallest normal's exponent less the mantissa bits
    low = round(math.log2(info.smallest_normal)) + round(math.log2(info.eps))
    high = math.floor(math.log2(info.max)) - 1
    runs = rows * cols // 16
    scale = torch.randint(low, high + 1, (runs, 1), generator=generator)
    spread = torch.randint(-20, 1, (runs, 16), generator=generator)
    x = torch.randn(runs, 16, generator=generator, dtype=torch.float64)
    x = torch.ldexp(x, (scale + spread).clamp(low - 2, high))
    x[0:2] = 0.0
    x[2, 3] = math.nan
    x[5, 7] = -math.inf
    x[6:8] = torch.tensor([-0.0, 0.0] * 8)
    x[7, 5] = -1.5
    x[8, 1] = float(2.0 ** (high - 1)) * 1.75
    tiny = torch.randint(0, 9, (2, 16), generator=generator) + low
    x[10:12] = torch.ldexp(torch.randn(2, 16, generator=generator, dtype=torch.float64), tiny)
    x[12:14] = info.max * torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(2, 16)
    return x.reshape(rows, cols).to(dtype)


@pytest.mark.parametrize("fmt", SWEEP_FORMATS)
@pytest.mark.parametrize("dtype", SWEEP_DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_the_kernel_equals_the_pytorch_path_for_every_format_block_and_dtype(
    fmt: str, dtype: torch.dtype, block: int | None
) -> None:
    w = _special_blocks(24, 64, dtype, seed=FORMATS.index(fmt) + 7 * DTYPES.index(dtype))
    expected = _expected(w, fmt, block, 32, seed=5, offset=3)
    got = gaussws_blocks(w.to(DEVICE), fmt, block, gaussian_thresholds(32), 32, seed=5, offset=3)
    assert _same_values(got.cpu(), expected), (fmt, dtype, block)
    assert got.dtype == dtype and got.device == w.to(DEVICE).device


@pytest.mark.parametrize("noise_bits", [1, 8, 9, 32])
def test_the_kernel_reads_the_top_noise_bits_of_each_word_through_their_table(
    noise_bits: int,
) -> None:
    w = _special_blocks(16, 32, torch.bfloat16, seed=noise_bits)
    expected = _expected(w, "e3m2", 32, noise_bits, seed=17, offset=0)
    table = gaussian_thresholds(noise_bits)
    got = gaussws_blocks(w.to(DEVICE), "e3m2", 32, table, noise_bits, seed=17, offset=0)
    assert _same_values(got.cpu(), expected), noise_bits


@pytest.mark.parametrize("fmt", _on_gpu_only(["binary16", "p3109_k8p3se"], ["binary16"]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_targets_whose_spacing_falls_below_fp32s_subnormals_add_no_noise_there(
    fmt: str, dtype: torch.dtype
) -> None:
    """A binary16 target's spacing in a block of scale 2**-126 is 2**(emin - 10 - 126) =
    2**-150, which fp32 rounds to 0 (as ldexp does): those elements come back unchanged."""
    w = _special_blocks(24, 64, dtype, seed=41)
    expected = _expected(w, fmt, 32, 32, seed=6, offset=1)
    got = gaussws_blocks(w.to(DEVICE), fmt, 32, gaussian_thresholds(32), 32, 6, 1)
    assert _same_values(got.cpu(), expected), (fmt, dtype)


def test_seeds_and_offsets_as_ints_and_as_tensors_draw_the_same_words() -> None:
    """Seeds and offsets across the whole 64-bit range, given as ints or int64 tensors on
    the device (two's complement above 2**63)."""
    w = _special_blocks(8, 64, torch.bfloat16, seed=3)
    table = gaussian_thresholds(32)
    for seed, offset in [(0, 0), (2**40 + 3, 7), (2**64 - 1, 2**33 + 5), (12345, 2**63)]:
        expected = _expected(w, "e2m3", 16, 32, seed=seed, offset=offset)
        as_ints = gaussws_blocks(w.to(DEVICE), "e2m3", 16, table, 32, seed, offset)
        as_tensors = gaussws_blocks(
            w.to(DEVICE),
            "e2m3",
            16,
            table,
            32,
            torch.tensor(seed - 2**64 if seed >= 2**63 else seed, device=DEVICE),
            torch.tensor(offset - 2**64 if offset >= 2**63 else offset, device=DEVICE),
        )
        assert _same_values(as_ints.cpu(), expected), (seed, offset)
        assert _same_values(as_tensors.cpu(), expected), (seed, offset)
    different = gaussws_blocks(w.to(DEVICE), "e2m3", 16, table, 32, 1, 0)
    assert not torch.equal(different.cpu(), _expected(w, "e2m3", 16, 32, seed=0, offset=0))


@pytest.mark.parametrize("index_offset", [0, 4, 3, 2**31 + 1, 2**40])
def test_a_shard_with_its_index_offset_draws_the_words_of_the_whole_tensor(
    index_offset: int,
) -> None:
    """Rows [start, end) passed with index_offset + start * cols equal those rows of the
    whole tensor's sample; offsets that are no multiple of 4 take the per-element words."""
    w = _special_blocks(12, 32, torch.float32, seed=11)
    table = gaussian_thresholds(32)
    whole = gaussws_blocks(w.to(DEVICE), "e4m3fn", 32, table, 32, 9, 1, index_offset)
    assert _same_values(whole.cpu(), _expected(w, "e4m3fn", 32, 32, 9, 1, index_offset))
    start, end = 5, 9
    shard = gaussws_blocks(
        w[start:end].contiguous().to(DEVICE),
        "e4m3fn",
        32,
        table,
        32,
        9,
        1,
        index_offset + 32 * start,
    )
    assert _same_values(shard.cpu(), whole[start:end].cpu())


@pytest.mark.parametrize(("cols", "block"), [(12, 6), (12, 3), (48, None), (40, 40), (8, 1)])
def test_blocks_that_are_no_multiple_of_four_or_no_power_of_two(
    cols: int, block: int | None
) -> None:
    """Blocks of odd lengths take per-element words; rows of a length that is no power of
    two are padded in the tile and masked."""
    w = _special_blocks(32, cols, torch.bfloat16, seed=cols)
    expected = _expected(w, "e5m2", block, 32, seed=2, offset=0)
    got = gaussws_blocks(w.to(DEVICE), "e5m2", block, gaussian_thresholds(32), 32, 2, 0)
    assert _same_values(got.cpu(), expected), (cols, block)


def test_many_programs_and_an_empty_tensor() -> None:
    """More blocks than one program's tile (the interpreter's tile is 2**14 elements), and
    nothing to do for an empty tensor."""
    w = _special_blocks(160, 256, torch.bfloat16, seed=21)
    expected = _expected(w, "e3m2", 32, 32, seed=4, offset=8)
    got = gaussws_blocks(w.to(DEVICE), "e3m2", 32, gaussian_thresholds(32), 32, 4, 8)
    assert _same_values(got.cpu(), expected)
    empty = torch.empty(0, 32, dtype=torch.bfloat16, device=DEVICE)
    assert gaussws_blocks(empty, "e3m2", 32, gaussian_thresholds(32), 32, 4, 8).shape == (0, 32)


def test_zero_and_non_finite_blocks_pass_through_unchanged() -> None:
    w = torch.zeros(2, 64)
    w[0, :32] = torch.tensor([-0.0, 0.0] * 16)
    w[0, 40] = math.nan
    w[1, 3] = math.inf
    w[1, 33:] = 1.0
    got = gaussws_blocks(w.to(DEVICE), "e3m2", 32, gaussian_thresholds(32), 32, 0, 0).cpu()
    assert torch.equal(got[:, :32].view(torch.int32), w[:, :32].view(torch.int32))
    assert torch.isnan(got[0, 40]) and torch.equal(got[0, 32:40], w[0, 32:40])
    assert not torch.equal(got[1, 32:], w[1, 32:])


def test_torch_compile_traces_the_launch_as_one_op_with_the_eager_bits() -> None:
    """A full graph (no break) around the kernel: seeds as ints above 2**63 and as tensors,
    the format as a name and as a `Format`."""
    w = _special_blocks(8, 64, torch.bfloat16, seed=31).to(DEVICE)
    table = gaussian_thresholds(32)
    e2m1 = sr_format("e2m1")

    def sample(w: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        by_name = gaussws_blocks(w, "e3m2", 32, table, 32, 2**63 + 5, offset)
        by_format = gaussws_blocks(w, e2m1, None, table, 32, offset, 3, 4)
        return by_name, by_format

    compiled = torch.compile(sample, backend="aot_eager", fullgraph=True)
    by_name, by_format = compiled(w, torch.tensor(7, device=DEVICE))
    assert _same_values(by_name.cpu(), _expected(w.cpu(), "e3m2", 32, 32, 2**63 + 5, 7))
    assert _same_values(by_format.cpu(), _expected(w.cpu(), "e2m1", None, 32, 7, 3, 4))


def test_the_threshold_table_is_checked() -> None:
    assert check_thresholds(gaussian_thresholds(8), 8) == gaussian_thresholds(8)
    with pytest.raises(ValueError, match="thresholds must be 6 ints"):
        check_thresholds((1, 2, 3), 8)
    with pytest.raises(ValueError, match="nondecreasing ints in"):
        check_thresholds((1, 2, 3, 5, 4, 6), 8)
    with pytest.raises(ValueError, match="nondecreasing ints in"):
        check_thresholds((1, 2, 3, 4, 5, 257), 8)
    with pytest.raises(TypeError, match="thresholds must be a sequence"):
        check_thresholds(7, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"noise_bits must be an int in 1\.\.32"):
        check_thresholds(gaussian_thresholds(8), 33)
    with pytest.raises(TypeError, match=r"noise_bits must be an int in 1\.\.32"):
        check_thresholds(gaussian_thresholds(8), 8.0)  # type: ignore[arg-type]


def test_bad_arguments_raise_naming_them() -> None:
    w = torch.zeros(4, 32, device=DEVICE)
    table = gaussian_thresholds(32)
    with pytest.raises(ValueError, match="w must be a contiguous 2-D tensor"):
        gaussws_blocks(w.reshape(-1), "e3m2", 32, table, 32, 0, 0)
    with pytest.raises(ValueError, match="w must be a contiguous 2-D tensor"):
        gaussws_blocks(w.t(), "e3m2", 4, table, 32, 0, 0)
    with pytest.raises(TypeError, match="w must be float32, bfloat16 or float16"):
        gaussws_blocks(w.double(), "e3m2", 32, table, 32, 0, 0)
    with pytest.raises(ValueError, match="block must be None"):
        gaussws_blocks(w, "e3m2", 12, table, 32, 0, 0)
    with pytest.raises(ValueError, match="block must be None"):
        gaussws_blocks(w, "e3m2", 0, table, 32, 0, 0)
    with pytest.raises(ValueError, match="index_offset must be in"):
        gaussws_blocks(w, "e3m2", 32, table, 32, 0, 0, -1)
    with pytest.raises(ValueError, match="seed must be in"):
        gaussws_blocks(w, "e3m2", 32, table, 32, -1, 0)
    with pytest.raises(TypeError, match="offset must be an int or an int64 tensor"):
        gaussws_blocks(w, "e3m2", 32, table, 32, 0, torch.tensor(1.0))
    with pytest.raises(ValueError, match="unknown format 'e9m9'"):
        gaussws_blocks(w, "e9m9", 32, table, 32, 0, 0)


@pytest.mark.gpu
def test_cuda_kernel_equals_the_pytorch_path_on_the_cpu() -> None:
    """Compiled on the GPU, every format and dtype, with subnormal spacings and sums."""
    for fmt in FORMATS:
        for dtype in DTYPES:
            w = _special_blocks(64, 256, dtype, seed=FORMATS.index(fmt))
            for block, noise_bits in ((32, 32), (None, 8)):
                expected = _expected(w, fmt, block, noise_bits, seed=2**63 + 1, offset=5)
                table = gaussian_thresholds(noise_bits)
                got = gaussws_blocks(w.cuda(), fmt, block, table, noise_bits, 2**63 + 1, 5)
                assert _same_values(got.cpu(), expected), (fmt, dtype, block, noise_bits)
    # compiled kernels serve CUDA tensors alone (the interpreter is off here)
    with pytest.raises(ValueError, match="the GaussWS kernel cannot run"):
        gaussws_blocks(w, "e3m2", 32, gaussian_thresholds(32), 32, 0, 0)
