"""NVFP4's computed tensor scales and quantization in one launch
(`stochround.kernels.single_launch`): its codes, scales and tensor scales equal the two
launches' and the PyTorch path's bit for bit (partial last tiles and amax slices, one
amax program and many, SR and RN, both flavours, with the RHT), it leaves its stream's
scratch clean, two launches in a row give the same bits, the roles come from the
tickets and not the program ids, and the size rule picks it for small tensors alone."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

import stochround as sr
from stochround.kernels import block_amax, single_launch, tensor_scales
from stochround.kernels import blocks as kernel_blocks
from stochround.kernels.availability import INTERPRETED

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)

# A: one amax program for the tensor, a few, and many (a partial last slice each)
ONE_AMAX = block_amax.AmaxTiling(2**14, 1, 4)
FEW_AMAX = block_amax.AmaxTiling(1024, 2, 4)
MANY_AMAX = block_amax.AmaxTiling(256, 1, 4)


@pytest.fixture(autouse=True)
def no_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, a program that would spin fails the test instead of hanging
    it: programs run one after another in ticket order there, so a quantization program
    finds the ready flag set at its first look (a volatile load reading 0 is a broken
    protocol: a counter left set by the last launch, a flag never set)."""
    if not INTERPRETED:
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = builder.create_load

    def create_load(ptr: object, cache: object, eviction: object, is_volatile: bool) -> object:
        value = original(ptr, cache, eviction, is_volatile)
        if is_volatile and not value.data.any():
            raise AssertionError("a quantization program would spin on an unset flag")
        return value

    monkeypatch.setattr(builder, "create_load", create_load)


def x_of(rows: int, cols: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=generator) * 5).to(DEVICE, dtype)


def prepared(
    x: Tensor, single: bool, tiling: block_amax.AmaxTiling | None = None, **options: object
) -> kernel_blocks.PreparedQuantizeBlocks:
    """NVFP4's prepared launch of x with computed tensor scales (e2m1 codes two a byte,
    blocks of 16), in one launch (``single``) or two."""
    options.setdefault("output", "fp4x2")
    return kernel_blocks.PreparedQuantizeBlocks(
        x, "e2m1", 16, "nvfp4", tensor_scales=True, single_launch=single, amax_tiling=tiling,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip


def bits(t: Tensor) -> Tensor:
    return t.contiguous().view(torch.uint8)


def assert_same(got: tuple, want: tuple) -> None:
    """Equal codes, scales and tensor scales, byte for byte (NaN payloads included)."""
    assert len(got) == len(want) == 3
    for a, b, name in zip(got, want, ("codes", "scales", "tensor scales"), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(bits(a), bits(b)), name


def single_and_two(
    x: Tensor, seed: int | Tensor, offset: int | Tensor, tiling: block_amax.AmaxTiling, **options
) -> tuple[tuple, tuple]:
    one = prepared(x, True, tiling, **options)
    assert one.single is not None and one.amax is None
    two = prepared(x, False, tiling, **options)
    assert two.single is None and two.amax is not None
    return one(x, seed, offset), two(x, seed, offset)


# rows x cols: the quantization's last tile partial (2**14 elements a tile under the
# interpreter, 2**11 compiled) and the amax programs' last slice partial
SHAPES = [(40, 96), (136, 256), (3, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tiling", [ONE_AMAX, FEW_AMAX, MANY_AMAX], ids=["A1", "Afew", "Amany"])
@pytest.mark.parametrize("mode", ["sr", "rne"])
def test_one_launch_equals_the_two_launches_and_the_pytorch_path(
    shape: tuple[int, int], tiling: block_amax.AmaxTiling, mode: str
) -> None:
    x = x_of(*shape)
    got, want = single_and_two(x, 7, 3, tiling, mode=mode)
    assert_same(got, want)
    options = {"seed": 7, "offset": 3} if mode == "sr" else {}
    reference = sr.blocks.quantize(x, "nvfp4", mode, backend="torch", **options)
    codes, scales, tensor_scale = got
    assert torch.equal(codes, bits(reference.codes).view(codes.shape))
    assert torch.equal(scales, bits(reference.scales).view(scales.shape))
    assert reference.tensor_scale is not None
    assert torch.equal(bits(tensor_scale[:1]), bits(reference.tensor_scale.reshape(1)))


@pytest.mark.parametrize("flavour", ["te", "torchao", "pow2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_flavours_dtypes_byte_codes_and_a_stream_of_tensors(
    flavour: str, dtype: torch.dtype
) -> None:
    x = x_of(24, 160, dtype, seed=1)
    seed, offset = torch.tensor([5], device=DEVICE), torch.tensor([9], device=DEVICE)
    for output in ("codes", "fp4x2"):
        options = {"nvfp4_flavour": flavour, "output": output, "n": 8, "variant": "a"}
        got, want = single_and_two(x, seed, offset, MANY_AMAX, mode="sr", index_offset=5, **options)
        assert_same(got, want)


@pytest.mark.parametrize("rht_bf16", [False, True])
@pytest.mark.parametrize("tiling", [ONE_AMAX, MANY_AMAX], ids=["A1", "Amany"])
def test_with_the_random_hadamard_transform(rht_bf16: bool, tiling: block_amax.AmaxTiling) -> None:
    x = x_of(48, 256, torch.bfloat16, seed=2)
    x[5, 17] = 300.0
    signs = sr.blocks.random_signs(16, 3, device=DEVICE)
    rotation = {"rht": 16, "rht_signs": signs, "rht_bf16": rht_bf16}
    got, want = single_and_two(x, 11, 0, tiling, mode="sr", **rotation)
    assert_same(got, want)
    reference = sr.blocks.quantize(
        x, "nvfp4", "sr", seed=11, rht=16, rht_signs=signs, rht_bf16=rht_bf16, backend="torch"
    )
    assert torch.equal(got[0], bits(reference.codes).view(got[0].shape))


@pytest.mark.parametrize("special", ["zeros", "nan", "inf", "tiny", "huge"])
def test_special_amaxes(special: str) -> None:
    """amax 0, NaN, infinity, fp32-subnormal and huge: the tensor scales' edge cases."""
    x = x_of(40, 96)
    if special == "zeros":
        x.zero_()
    elif special == "nan":
        x[39, 95] = math.nan
    elif special == "inf":
        x[0, 0] = -math.inf
    elif special == "tiny":
        x *= 1e-42
    else:
        x *= 1e37
    for tiling in (ONE_AMAX, MANY_AMAX):
        got, want = single_and_two(x, 1, 2, tiling, mode="rne")
        assert_same(got, want)


def scratch_of(launch: kernel_blocks.PreparedQuantizeBlocks) -> tensor_scales.LaunchScratch:
    """The stream scratch the single launch takes (the current stream's)."""
    assert launch.single is not None
    device_index = launch.device_index
    programs = launch.single[0].amax_programs
    return tensor_scales.stream_scratch(
        launch.device, device_index, programs, single_launch.SINGLE_LAUNCH_COUNTERS
    )


def test_the_scratch_is_clean_after_a_launch_and_launches_in_a_row_agree() -> None:
    """The three counters are 0 after every launch (ticket, amax done, ready: each reset
    by the last program to use it), two launches on one tensor give the same bits, and
    launches on other tensors in between give each tensor's own."""
    x, other = x_of(136, 256), x_of(136, 256, seed=5) * 1000
    launch = prepared(x, True, MANY_AMAX, mode="sr")
    scratch = scratch_of(launch)
    assert scratch.counter.tolist() == [0, 0, 0]
    first = launch(x, 3, 4)
    assert scratch.counter.tolist() == [0, 0, 0]
    between = launch(other, 3, 4)
    assert scratch.counter.tolist() == [0, 0, 0]
    second = launch(x, 3, 4)
    assert scratch.counter.tolist() == [0, 0, 0]
    assert_same(first, second)
    assert_same(between, prepared(other, False, MANY_AMAX, mode="sr")(other, 3, 4))
    assert not torch.equal(between[2], first[2])


@pytest.fixture
def reversed_program_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The interpreter runs program ``P - 1`` first, then ``P - 2``, ...: tickets then
    differ from program ids (a role taken from the program id would find the tensor scales
    unwritten, or spin forever)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = builder.set_grid_idx

    def set_grid_idx(x: int, y: int, z: int) -> None:
        original(builder.grid_dim[0] - 1 - x, y, z)

    monkeypatch.setattr(builder, "set_grid_idx", set_grid_idx)
    yield


@pytest.mark.skipif(not INTERPRETED, reason="reorders the interpreter's programs")
def test_the_roles_come_from_the_tickets_not_the_program_ids(reversed_program_ids: None) -> None:
    x = x_of(136, 256)
    launch = prepared(x, True, MANY_AMAX, mode="sr")
    got = launch(x, 3, 4)
    assert scratch_of(launch).counter.tolist() == [0, 0, 0]
    want = prepared(x, False, MANY_AMAX, mode="sr")(x, 3, 4)
    assert_same(got, want)


def test_the_size_rule_takes_the_single_launch_for_small_tensors_alone() -> None:
    limit = single_launch.SINGLE_LAUNCH_MAX_BYTES
    small = torch.empty(limit // 4, device="meta")
    large = torch.empty(limit // 4 + 16, device="meta")
    assert single_launch.takes_single_launch(small)
    assert single_launch.takes_single_launch(small.to(torch.bfloat16).repeat(2))
    assert not single_launch.takes_single_launch(large)
    x = x_of(40, 96)
    assert (
        kernel_blocks.PreparedQuantizeBlocks(x, "e2m1", 16, "nvfp4", tensor_scales=True).single
        is not None
    )
    # single-level NVFP4 and other formats take their one quantize launch
    for fmt, rule, scales in (("e2m1", "nvfp4", False), ("e4m3fn", "floor", False)):
        launch = kernel_blocks.PreparedQuantizeBlocks(x, fmt, 32, rule, tensor_scales=scales)
        assert launch.single is None and launch.amax is None


@pytest.mark.gpu
def test_on_a_gpu_with_many_more_programs_than_sms_the_single_launch_agrees() -> None:
    """8192 x 8192 bf16 (16384 amax and 32768 quantization programs, far more than a GPU
    holds at once: the quantization programs that start early spin while the amax
    programs run), forced onto the single launch, against the two launches, on two
    tensors in turn of other amaxes: a quantization program that read the tensor scales
    before the last amax program wrote them would find another tensor's (or nothing)."""
    tensors = [x_of(8192, 8192, torch.bfloat16, seed=3), x_of(8192, 8192, torch.bfloat16, seed=4)]
    tensors[0][4000, 17] = 1e4
    tensors[1] *= 1e-3
    for mode in ("sr", "rne"):
        one = prepared(tensors[0], True, mode=mode)
        two = prepared(tensors[0], False, mode=mode)
        wanted = [two(x, 13, 1) for x in tensors]
        for _ in range(3):
            for x, want in zip(tensors, wanted, strict=True):
                assert_same(one(x, 13, 1), want)
        assert scratch_of(one).counter.tolist() == [0, 0, 0]
