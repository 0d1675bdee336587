"""A planned eager `quantize` call that the kernel computes runs its prepared launch
(`stochround.blocks.quantize_plan.PreparedQuantize`): the bits, dtypes and fields of the
unprepared kernel route and of the PyTorch path, fresh outputs a call and the stream's
clean ticket counters (the plan keeps no tensor), and the general route where no launch is
prepared."""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround.blocks import dispatch
from stochround.kernels import blocks as kernel_blocks
from stochround.kernels import tensor_scales
from stochround.kernels.availability import INTERPRETED
from stochround.random import seed_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)


@pytest.fixture(autouse=True)
def no_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_PLANS", {})


def x_of(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(*shape, generator=generator) * 5).to(DEVICE, dtype)


def same(a: sr.blocks.BlockTensor, b: sr.blocks.BlockTensor) -> None:
    """Equal bit for bit (`BlockTensor.__eq__`), with the same dtypes and fields."""
    assert a == b
    assert (a.codes.dtype, a.scales.dtype, a.codes.shape, a.scales.shape) == (
        b.codes.dtype,
        b.scales.dtype,
        b.codes.shape,
        b.scales.shape,
    )
    assert (a.shape, a.dtype, a.axis, a.rht, a.scale_shape, a.swizzled) == (
        b.shape,
        b.dtype,
        b.axis,
        b.rht,
        b.scale_shape,
        b.swizzled,
    )
    assert (a.tensor_scale is None) == (b.tensor_scale is None)
    if a.tensor_scale is not None:
        assert a.tensor_scale.shape == b.tensor_scale.shape == ()


def the_plan() -> dispatch._QuantizePlan:
    """The one plan made (`dispatch._PLANS` emptied before)."""
    (plan,) = dispatch._PLANS.values()
    return plan


CASES = [
    ("nvfp4", "sr", (64, 64), {"seed": 7, "offset": 3}),
    ("nvfp4", "rne", (2, 8, 32), {}),
    ("nvfp4", "sr", (32, 64), {"seed": 2**64 - 1, "offset": 2**63, "rbits": 8}),
    ("nvfp4", "sr", (32, 64), {"tensor_scale": False, "seed": 1}),
    ("nvfp4", "sr", (16, 64), {"rht": 16, "seed": 4}),
    ("nvfp4", "rne", (16, 64), {"nvfp4_flavour": "torchao", "index_offset": 3}),
    ("mxfp8_e4m3", "rne", (64, 64), {}),
    ("mxfp8_e5m2", "sr", (3, 4, 64), {"seed": 9}),
    ("mxfp4", "sr", (16, 64), {"seed": 5, "variant": "odd", "rbits": 4}),
    ("mxint8", "rne", (16, 64), {}),
    ("int8_rowwise", "sr", (16, 96), {"seed": 5}),
    ("int8_rowwise", "rne", (2, 4, 32), {"block": 16}),
]


@pytest.mark.parametrize(("fmt", "mode", "shape", "options"), CASES)
def test_the_prepared_launch_gives_the_kernel_route_and_the_pytorch_path(
    fmt: str, mode: str, shape: tuple[int, ...], options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = x_of(*shape)
    first = sr.blocks.quantize(x, fmt, mode, backend="triton", **options)
    plan = the_plan()
    assert plan.routed and plan.prepared is not None
    second = sr.blocks.quantize(x, fmt, mode, backend="triton", **options)  # planned
    # the kernel route without a prepared launch (as before it had one)
    monkeypatch.setattr(dispatch, "_PLANS", {})
    monkeypatch.setattr(dispatch, "prepared_quantize", lambda *args: None)
    unprepared = sr.blocks.quantize(x, fmt, mode, backend="triton", **options)
    assert the_plan().prepared is None
    reference = sr.blocks.quantize(x, fmt, mode, backend="torch", **options)
    for got in (first, second):
        same(got, unprepared)
        same(got, reference)


def test_a_stream_of_tensors_takes_the_launch_that_reads_them() -> None:
    x = x_of(32, 64)
    ints = sr.blocks.quantize(x, "nvfp4", "sr", seed=11, offset=5, backend="triton")
    seed = seed_tensor(11, "seed", x.device)
    offset = seed_tensor(5, "offset", x.device)
    tensors = sr.blocks.quantize(x, "nvfp4", "sr", seed=seed, offset=offset, backend="triton")
    mixed = sr.blocks.quantize(x, "nvfp4", "sr", seed=11, offset=offset, backend="triton")
    assert len(dispatch._PLANS) == 1
    same(tensors, ints)
    same(mixed, ints)
    stream = sr.random.Stream(11, offset=5)
    from_stream = sr.blocks.quantize(x, "nvfp4", "sr", stream=stream, backend="triton")
    same(from_stream, ints)
    assert stream.offset == 6


def test_each_call_allocates_its_outputs_and_takes_its_streams_clean_ticket_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[tensor_scales.LaunchScratch] = []

    def scratch(*args: object) -> tensor_scales.LaunchScratch:
        got = tensor_scales.stream_scratch(*args)  # type: ignore[arg-type]
        taken.append(got)
        return got

    monkeypatch.setattr(kernel_blocks, "stream_scratch", scratch)
    x = x_of(32, 64)
    results = [sr.blocks.quantize(x, "nvfp4", "sr", seed=1, backend="triton") for _ in range(3)]
    # one set for the stream, reused: no allocation and no fill a call, the counters left 0
    # (at this size the single launch's three: `kernels.single_launch`)
    assert len(taken) == 3 and len({s.counter.data_ptr() for s in taken}) == 1
    assert taken[-1].counter.tolist() == [0, 0, 0]
    for name in ("codes", "scales", "tensor_scale"):
        pointers = {getattr(result, name).data_ptr() for result in results}
        assert len(pointers) == 3, name
    # the plan keeps no tensor of x's device that holds memory (CUDA graphs refuse a tensor
    # left in their pool): the stream's scratch is kept by `tensor_scales`, not the plan
    kernel = the_plan().prepared.kernel
    kept = [value for value in vars(kernel).values() if isinstance(value, torch.Tensor)]
    assert all(value.numel() == 0 for value in kept)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [
        ("nvfp4", {"block": (16, 16)}),  # 2-D tiles: their amax launch first
        ("mxfp8_e4m3", {"axis": 0}),  # not the last axis: the PyTorch path
    ],
)
def test_calls_the_kernel_takes_otherwise_have_no_prepared_launch(fmt: str, options: dict) -> None:
    x = x_of(32, 64)
    got = sr.blocks.quantize(x, fmt, "rne", backend="auto", **options)
    assert the_plan().prepared is None
    same(got, sr.blocks.quantize(x, fmt, "rne", backend="torch", **options))


def test_a_given_tensor_scale_is_not_planned() -> None:
    x = x_of(32, 64)
    sr.blocks.quantize(x, "nvfp4", "rne", tensor_scale=0.5, backend="triton")
    assert dispatch._PLANS == {}


def test_the_prepared_kernel_launch_refuses_what_it_cannot_take() -> None:
    x = x_of(4, 64)
    with pytest.raises(ValueError, match="x must hold elements"):
        kernel_blocks.PreparedQuantizeBlocks(x[:0], "e2m1", 16, "nvfp4", tensor_scales=True)
    with pytest.raises(ValueError, match="output must be 'codes' or 'fp4x2'"):
        kernel_blocks.PreparedQuantizeBlocks(
            x, "e2m1", 16, "nvfp4", tensor_scales=True, output="gemm"
        )
    with pytest.raises(ValueError, match="cannot hold e4m3fn codes"):
        kernel_blocks.PreparedQuantizeBlocks(
            x, "e4m3fn", 32, "floor", tensor_scales=False, output="fp4x2"
        )
    with pytest.raises(ValueError, match="block must be a positive int dividing"):
        kernel_blocks.PreparedQuantizeBlocks(x, "e4m3fn", 48, "floor", tensor_scales=False)
