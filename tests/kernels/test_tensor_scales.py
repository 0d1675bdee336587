"""NVFP4's tensor scales in the amax launch itself (`stochround.kernels.tensor_scales`):
the program that takes the last ticket reduces the partial maxima, so the scales of one
launch equal the two-launch path's (`tensor_scale_launch`) and the PyTorch path's
(`stochround.blocks.scales.nvfp4_tensor_scales`) bit for bit, for each flavour, with one
program and many, and the counter is 0 again after every launch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from stochround import blocks
from stochround.blocks.scales import nvfp4_tensor_scales
from stochround.kernels import block_amax, tensor_scales
from stochround.kernels import blocks as kernel_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLAVOURS = ["te", "torchao", "pow2"]
# one program (the default tiling's block holds the tensor), and more programs than the
# last program reads at a time (1024 partial maxima a step: two steps)
ONE_PROGRAM = block_amax.AmaxTiling(2**14, 1, 4)
MANY_PROGRAMS = block_amax.AmaxTiling(16, 1, 4)
FEW_PROGRAMS = block_amax.AmaxTiling(256, 1, 4)


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal dtypes, shapes and bit patterns (NaN payloads included) of fp32 tensors."""
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape, (a, b)
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal bit patterns, any NaN matching any NaN (an amax of NaN is a NaN pattern)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and same_bits(
        torch.where(nan, 0, a), torch.where(nan, 0, b)
    )


def special_cases(count: int) -> list[Tensor]:
    """An ordinary tensor of ``count`` elements, all zeros, NaN, +-inf, fp32-subnormal
    (TE's S_enc saturates) and huge values (S_enc underflows toward 0)."""
    generator = torch.Generator().manual_seed(42)
    base = torch.randn(count, generator=generator) * 3
    cases = [base, base * 0, base * 1e-42, base * 1e37, base.clone(), base.clone(), base.clone()]
    cases[4][count // 2] = math.nan
    cases[5][-1] = -math.inf
    cases[6][0] = math.inf
    return [case.to(DEVICE) for case in cases]


def two_launch_scales(x: Tensor, flavour: str) -> tuple[Tensor, Tensor]:
    """The scales and amax by `tensor_scale_launch`'s own launch over partial maxima made
    here (each element's magnitude bits: many partial maxima)."""
    partial = x.float().abs().view(torch.int32).contiguous()
    amax = x.new_empty((), dtype=torch.float32)
    scales = x.new_empty(2, dtype=torch.float32)
    launch, count = tensor_scales.tensor_scale_launch(partial.numel(), flavour)
    launch(x.device.index if x.is_cuda else -1, 1, partial, amax, scales, count)
    return scales, amax


def check_one_launch(x: Tensor, flavour: str, tiling: block_amax.AmaxTiling) -> None:
    """`nvfp4_tensor_scale`'s one launch under ``tiling`` against the two-launch path and
    the PyTorch path."""
    expected_amax = x.abs().amax().float()
    expected = torch.stack(tuple(nvfp4_tensor_scales(expected_amax, flavour)))
    scales, amax = kernel_blocks.nvfp4_tensor_scale(x, flavour, tiling=tiling)
    two_scales, two_amax = two_launch_scales(x, flavour)
    context = (flavour, tiling, x.dtype, float(expected_amax))
    assert same_bits(scales, expected), context
    assert same_bits(scales, two_scales), context
    assert same_values(amax, expected_amax) and same_values(two_amax, expected_amax), context


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_launch_scales_equal_the_two_launch_and_pytorch_paths(
    flavour: str, dtype: torch.dtype
) -> None:
    """One program, on every special case."""
    for x in special_cases(3000):
        check_one_launch(x.to(dtype), flavour, ONE_PROGRAM)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_last_of_many_programs_reduces_every_partial_maximum(flavour: str) -> None:
    """1030 programs (two steps of the last program's reads); the largest magnitude, a NaN
    or an infinity in the first, a middle or the last program.  The reduction is the same
    for every flavour (each then maps the amax to its scales): those three placements
    under the first flavour, the ordinary tensor under each."""
    count = 1030 * MANY_PROGRAMS.CHUNK - 5
    base, *_ = special_cases(count)
    placements = [(0, 1e6), (count // 2, math.nan), (count - 1, -math.inf)]
    for position, value in placements if flavour == FLAVOURS[0] else []:
        x = base.clone()
        x[position] = value
        check_one_launch(x, flavour, MANY_PROGRAMS)
    check_one_launch(base, flavour, MANY_PROGRAMS)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_one_launch_scales_of_a_rotated_tensor_are_those_of_its_rotated_amax(
    flavour: str,
) -> None:
    """With the RHT, the prepared and the unprepared launch give the scales of the
    rotated tensor's amax (`tensor_amax`, which takes no tickets)."""
    generator = torch.Generator().manual_seed(7)
    x = (torch.randn(16, 256, generator=generator) * 4).to(DEVICE)
    x[3, 9] = 1000.0
    signs = blocks.random_signs(16, 3, device=DEVICE)
    for rht_bf16 in (False, True):
        rotation = {"rht": 16, "rht_signs": signs, "rht_bf16": rht_bf16}
        amax = kernel_blocks.tensor_amax(x, **rotation, tiling=ONE_PROGRAM)
        expected = torch.stack(tuple(nvfp4_tensor_scales(amax, flavour)))
        got, got_amax = kernel_blocks.nvfp4_tensor_scale(
            x, flavour, **rotation, tiling=FEW_PROGRAMS
        )
        assert same_bits(got, expected) and same_bits(got_amax, amax), rht_bf16
        prepared = kernel_blocks.PreparedTensorScale(x, flavour, **rotation, tiling=FEW_PROGRAMS)
        assert same_bits(prepared(x, signs), expected), rht_bf16


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_repeated_calls_find_the_counter_reset_and_give_each_tensors_scales(
    flavour: str,
) -> None:
    """Three calls of each entry on three tensors: each call's last program fires (the
    counter is 0 again after each launch), so each result is its own tensor's scales (and
    the prepared tile amax's buffer its own tensor's tile amaxes)."""
    tensors = special_cases(4096)[:4]
    prepared = kernel_blocks.PreparedTensorScale(tensors[0], flavour, tiling=FEW_PROGRAMS)
    tiles = kernel_blocks.PreparedTileAmax(tensors[0].view(64, 64), (16, 16), flavour)
    for x in tensors * 2:
        amax = x.abs().amax()
        expected = torch.stack(tuple(nvfp4_tensor_scales(amax, flavour)))
        assert same_bits(prepared(x, None), expected)
        result = tiles(x.view(64, 64))
        assert same_bits(result.scales, expected)  # type: ignore[arg-type]
        # the tiles' amaxes in the object's own buffer, overwritten by each call
        assert result.amax.data_ptr() == tiles.amax.data_ptr()
        assert same_bits(result.amax, kernel_blocks.tile_amax(x.view(64, 64), (16, 16)).amax)
        got, _ = kernel_blocks.nvfp4_tensor_scale(x, flavour, tiling=FEW_PROGRAMS)
        assert same_bits(got, expected)
        got = kernel_blocks.tile_amax(x.view(64, 64), (16, 16), flavour).scales
        assert got is not None and same_bits(got, expected)
        for used in (prepared.tickets.counter, tiles.tickets.counter):  # type: ignore[union-attr]
            assert used.tolist() == [0]


def test_an_empty_tensor_has_the_scales_of_amax_zero_from_one_program() -> None:
    x = torch.ones(0, device=DEVICE)
    for flavour in FLAVOURS:
        expected = torch.stack(tuple(nvfp4_tensor_scales(torch.tensor(0.0), flavour)))
        scales, amax = kernel_blocks.nvfp4_tensor_scale(x, flavour)
        assert same_bits(scales, expected.to(DEVICE)) and amax.item() == 0.0


def test_the_partials_tiling_covers_the_count_in_power_of_two_steps() -> None:
    assert tensor_scales.partials_tiling(1) == (1, 1)
    assert tensor_scales.partials_tiling(300) == (512, 1)
    assert tensor_scales.partials_tiling(1024) == (1024, 1)
    assert tensor_scales.partials_tiling(1025) == (1024, 2)
    assert tensor_scales.partials_tiling(5000) == (1024, 8)


def test_a_prepared_object_owns_its_counter_and_an_unprepared_call_takes_a_fresh_one() -> None:
    """No unprepared call keeps a tensor: torch.compile's CUDA graphs (reduce-overhead)
    refuse a pool that holds one after their first run (a kept counter and amax did)."""
    x = torch.ones(4096, device=DEVICE)
    one = kernel_blocks.PreparedTensorScale(x, "te")
    two = kernel_blocks.PreparedTensorScale(x, "te")
    assert one.tickets.counter.data_ptr() != two.tickets.counter.data_ptr()
    first = tensor_scales.ticket_counter(x.device)
    assert first.tolist() == [0] and tensor_scales.ticket_counter(x.device) is not first
    _, amax = kernel_blocks.nvfp4_tensor_scale(x, "te")
    _, again = kernel_blocks.nvfp4_tensor_scale(x, "te")
    assert amax.data_ptr() != again.data_ptr()  # both alive: two allocations


def test_a_streams_scratch_is_made_once_a_size_and_left_clean_by_its_launches() -> None:
    x = torch.ones(4096, device=DEVICE) * 3
    device_index = x.device.index if x.is_cuda else -1
    first = tensor_scales.stream_scratch(x.device, device_index, 4)
    assert tensor_scales.stream_scratch(x.device, device_index, 4) is first
    assert tensor_scales.stream_scratch(x.device, device_index, 5) is not first
    assert first.counter.tolist() == [0] and first.amax.dtype == torch.float32
    # a ticket-taking launch on it leaves its counter at 0 (the last program resets it)
    prepared = kernel_blocks.PreparedTensorScale(x, "te")
    scratch = tensor_scales.stream_scratch(x.device, device_index, prepared.programs)
    prepared.tickets = tensor_scales.Tickets(scratch.partial, scratch.counter)
    scales = prepared(x, None)
    assert scratch.counter.tolist() == [0]
    assert same_bits(scales, kernel_blocks.nvfp4_tensor_scale(x, "te")[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams and graphs")
def test_two_streams_and_a_capture_take_their_own_scratch() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    index = device.index
    first = tensor_scales.stream_scratch(device, index, 8)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        second = tensor_scales.stream_scratch(device, index, 8)
    assert second is not first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tensor_scales.stream_scratch(device, index, 8)
    assert captured is not first and captured is not second


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams")
def test_two_streams_take_two_counters() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    first = tensor_scales.ticket_counter(device)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        second = tensor_scales.ticket_counter(device)
        x = torch.randn(1 << 20, device=device)
        scales, _ = kernel_blocks.nvfp4_tensor_scale(x, "te")
    side.synchronize()
    assert first is not second and second.tolist() == [0]
    expected = torch.stack(tuple(nvfp4_tensor_scales(x.abs().amax(), "te")))
    assert same_bits(scales, expected)
