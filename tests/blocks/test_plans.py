"""A local `quantize` call's checks and routing are made once per set of choices and x's
shape, dtype and device (`stochround.blocks.dispatch`'s plans): a later call with the same
ones reuses the plan, with the same bits, and a bad argument is refused as on a first call."""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround.blocks import dispatch
from stochround.kernels.availability import INTERPRETED, cpu_as_cuda


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The plans built (x's shape and the call's format), with no plan kept before."""
    monkeypatch.setattr(dispatch, "_PLANS", {})
    calls: list[tuple] = []
    original = dispatch._quantize_plan

    def spy(x, args, swizzle):  # type: ignore[no-untyped-def]
        calls.append((tuple(getattr(x, "shape", ())), args.fmt))
        return original(x, args, swizzle)

    monkeypatch.setattr(dispatch, "_quantize_plan", spy)
    return calls


def x_of(rows: int = 4, cols: int = 64) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))


def same(a: sr.blocks.BlockTensor, b: sr.blocks.BlockTensor) -> bool:
    return torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8)) and torch.equal(
        a.scales.view(torch.uint8), b.scales.view(torch.uint8)
    )


@pytest.mark.parametrize(("fmt", "mode"), [("nvfp4", "sr"), ("mxfp8_e4m3", "rne")])
def test_a_second_call_with_the_same_choices_reuses_the_plan(
    built: list[tuple], fmt: str, mode: str
) -> None:
    x = x_of()
    first = sr.blocks.quantize(x, fmt, mode, seed=5, offset=2)
    second = sr.blocks.quantize(x.clone(), fmt, mode, seed=5, offset=2)
    assert built == [((4, 64), fmt)]
    assert same(first, second)
    sr.blocks.quantize(x_of(8), fmt, mode, seed=5)  # another shape: a plan of its own
    assert built == [((4, 64), fmt), ((8, 64), fmt)]


@pytest.mark.skipif(not INTERPRETED, reason="the CUDA route on the CPU needs the interpreter")
def test_the_cuda_route_has_plans_of_its_own_with_the_kernels_bits(built: list[tuple]) -> None:
    x = x_of()
    reference = sr.blocks.quantize(x, "nvfp4", "sr", seed=5)
    with cpu_as_cuda():
        first = sr.blocks.quantize(x, "nvfp4", "sr", seed=5)
        second = sr.blocks.quantize(x, "nvfp4", "sr", seed=5)
    assert len(built) == 2  # the CPU's route, then the kernel's
    assert same(first, reference) and same(second, reference)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"axis": True}, ValueError, "axis must be an int"),
        ({"axis": -1.0}, ValueError, "axis must be an int"),
        ({"rbits": True}, ValueError, "rbits"),
        ({"index_offset": True}, TypeError, "index_offset"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 1, "stream": sr.random.Stream(1)}, ValueError, r"stream= gives the seed"),
        ({"stream": 3}, TypeError, r"stream must be a stochround\.Stream"),
        ({"rht_bf16": 1}, TypeError, "rht_bf16 and swizzle must be bools"),
        ({"mode": "bogus"}, ValueError, "mode"),
    ],
)
def test_a_bad_argument_is_refused_after_the_good_call_was_planned(
    built: list[tuple], options: dict, error: type, message: str
) -> None:
    x = x_of()
    good = {"mode": "sr", "axis": -1, "rbits": 1, "index_offset": 1, "seed": 1}
    sr.blocks.quantize(x, "nvfp4", **good)
    sr.blocks.quantize(x, "nvfp4", **good)
    assert len(built) == 1
    with pytest.raises(error, match=message):
        sr.blocks.quantize(x, "nvfp4", **{**good, **options})


def test_x_is_checked_on_a_planned_call(built: list[tuple]) -> None:
    x = x_of()
    sr.blocks.quantize(x, "mxfp8_e4m3", "rne")
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        sr.blocks.quantize(x.tolist(), "mxfp8_e4m3", "rne")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating dtype"):
        sr.blocks.quantize(x.to(torch.int32), "mxfp8_e4m3", "rne")
    with pytest.raises(ValueError, match="must divide"):
        sr.blocks.quantize(x_of(4, 48), "mxfp8_e4m3", "rne")
