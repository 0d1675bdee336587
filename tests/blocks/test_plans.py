"""A local `quantize` call's checks and routing are made once per set of choices and x's
shape, dtype and device (`stochround.blocks.dispatch`'s plans): a later call with the same
ones reuses the plan, with the same bits, and a bad argument is refused as on a first call."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch

import stochround as sr
from stochround.blocks import dispatch
from stochround.blocks.quantize_plan import plan_key
from stochround.blocks.request import BlockArguments
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


BASE = {"mode": "sr", "seed": 3}


@pytest.mark.parametrize(
    ("x_shape", "dtype", "fmt", "options"),
    [
        ((8, 64), torch.float32, "nvfp4", {}),  # another shape
        ((4, 64), torch.bfloat16, "nvfp4", {}),  # another dtype
        ((4, 64), torch.float32, "mxfp4", {}),  # another format
        ((4, 64), torch.float32, "nvfp4", {"rbits": 4}),  # another option each
        ((4, 64), torch.float32, "nvfp4", {"index_offset": 64}),
        ((4, 64), torch.float32, "nvfp4", {"nvfp4_flavour": "torchao"}),
        ((4, 64), torch.float32, "nvfp4", {"tensor_scale": False}),
        ((4, 64), torch.float32, "nvfp4", {"axis": 1}),  # equal to -1's axis, not to -1
        ((4, 64), torch.float32, "nvfp4", {"block": 32}),
        ((4, 64), torch.float32, "nvfp4", {"rht": 16}),
        ((4, 64), torch.float32, "nvfp4", {"swizzle": True}),
        ((4, 64), torch.float32, "nvfp4", {"backend": "torch"}),
    ],
)
def test_a_call_with_another_shape_dtype_format_or_option_gets_a_plan_of_its_own(
    built: list[tuple], x_shape: tuple, dtype: torch.dtype, fmt: str, options: dict
) -> None:
    x = x_of()
    sr.blocks.quantize(x, "nvfp4", **BASE)
    other = x_of(*x_shape).to(dtype)
    planned = sr.blocks.quantize(other, fmt, **BASE, **options)
    assert len(built) == 2 and len(dispatch._PLANS) == 2
    dispatch._PLANS.clear()  # the same call planned afresh: the same bits
    assert same(planned, sr.blocks.quantize(other, fmt, **BASE, **options))
    sr.blocks.quantize(other, fmt, **BASE, **options)
    sr.blocks.quantize(x, "nvfp4", **BASE)
    assert len(built) == 4  # each kept plan served its own call again


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"fmt": "nvfp5"}, ValueError),
        ({"fmt": 4}, TypeError),
        ({"mode": "bogus"}, ValueError),
        ({"axis": True}, ValueError),
        ({"axis": 2}, ValueError),
        ({"block": 24}, ValueError),
        ({"block": 16.0}, ValueError),
        ({"scale_rule": "bogus"}, ValueError),
        ({"tensor_scale": -1.0}, ValueError),
        ({"tensor_scale": True}, ValueError),
        ({"nvfp4_flavour": "cutlass"}, ValueError),
        ({"rht": 3}, ValueError),
        ({"rht": True}, ValueError),
        ({"rht_signs": torch.ones(16)}, ValueError),
        ({"rht_bf16": 0}, TypeError),
        ({"rbits": 0}, ValueError),
        ({"rbits": 4.0}, ValueError),
        ({"variant": "z"}, ValueError),
        ({"hardware": "no-such-unit"}, ValueError),
        ({"index_offset": -1}, ValueError),
        ({"index_offset": 1.0}, TypeError),
        ({"backend": "gpu"}, ValueError),
        ({"swizzle": 1}, TypeError),
        ({"seed": 2**64}, ValueError),
        ({"offset": -1}, ValueError),
    ],
)
def test_a_bad_argument_gets_the_same_error_on_a_first_and_on_a_later_call(
    built: list[tuple], options: dict, error: type
) -> None:
    x = x_of()
    call = {"fmt": "nvfp4", **BASE}
    with pytest.raises(error) as first:
        sr.blocks.quantize(x, **{**call, **options})
    if not options.keys() & {"seed", "offset"}:  # the stream is checked each call, after
        assert dispatch._PLANS == {}  # a refused choice leaves no plan
    sr.blocks.quantize(x, **call)
    sr.blocks.quantize(x, **call)
    with pytest.raises(error) as later:
        sr.blocks.quantize(x, **{**call, **options})
    assert str(later.value) == str(first.value)
    assert len(dispatch._PLANS) == 1


def test_an_x_the_plan_does_not_cover_is_refused_on_a_planned_call(built: list[tuple]) -> None:
    x = x_of(32, 32)
    sr.blocks.quantize(x, "mxfp8_e4m3", "rne")
    with pytest.warns(UserWarning, match="Sparse CSR"), pytest.raises(TypeError, match="dense"):
        sr.blocks.quantize(x.to_sparse_csr(), "mxfp8_e4m3", "rne")
    with pytest.raises(TypeError, match="dense"):
        sr.blocks.quantize(x.to_sparse(), "mxfp8_e4m3", "rne")
    with pytest.raises(TypeError, match="meta tensors"):
        sr.blocks.quantize(x.to("meta"), "mxfp8_e4m3", "rne")
    assert len(dispatch._PLANS) == 1


def vmapped_codes(batched: torch.Tensor) -> torch.Tensor:
    """`quantize` under `torch.func.vmap`: each x it sees is a plain `Tensor` of a shape
    planned before, wrapped (its plan found: only the per-call check refuses it)."""
    return torch.func.vmap(lambda each: sr.blocks.quantize(each, "nvfp4", "rne").codes)(batched)


@pytest.mark.parametrize(
    "route",
    [
        contextlib.nullcontext,
        pytest.param(
            cpu_as_cuda,  # the prepared launch would read the wrapper's data unchecked
            marks=pytest.mark.skipif(not INTERPRETED, reason="the CUDA route: the interpreter"),
        ),
    ],
)
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_a_transformed_or_traced_x_is_refused_on_a_planned_call(
    built: list[tuple], route: Callable[[], contextlib.AbstractContextManager]
) -> None:
    x = x_of(32, 32)
    with route():
        sr.blocks.quantize(x, "nvfp4", "rne")
        with pytest.raises(TypeError, match=r"torch\.func transforms"):
            vmapped_codes(torch.stack([x, x]))
        assert len(built) == 1  # refused on its plan's route
        with pytest.raises(TypeError, match=r"torch\.jit\.trace"):  # x itself, traced
            torch.jit.trace(lambda each: sr.blocks.quantize(each, "nvfp4", "rne").codes, x)
    assert len(dispatch._PLANS) == 1


def test_the_plans_are_bounded_starting_again_when_full(
    built: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "_MAX_PLANS", 3)
    for rows in range(1, 8):
        sr.blocks.quantize(x_of(rows), "mxfp8_e4m3", "rne")
        assert 1 <= len(dispatch._PLANS) <= 3
    assert len(built) == 7
    sr.blocks.quantize(x_of(7), "mxfp8_e4m3", "rne")  # the last shape's plan was kept
    assert len(built) == 7


def test_the_key_holds_every_choice_and_the_types_of_the_checked_ones_not_the_stream() -> None:
    fields = BlockArguments._fields
    stream = {"seed", "offset", "stream", "rht_signs", "tensor_scale"}  # the last two: None
    # each choice a value of a class of its own, so that the key shows which it holds
    values = {name: type(name, (str,), {})(name) for name in fields if name not in stream}
    args = BlockArguments(**{name: values.get(name) for name in fields})
    key = plan_key(x_of(), args.choices(), swizzle=True)
    assert key is not None
    assert [value for value in key if isinstance(value, str)] == list(values.values())
    typed = {"fmt", "axis", "block", "scale_rule", "rht", "rht_bf16", "rbits", "hardware"}
    typed |= {"index_offset"}  # checked by type, not by ``in``
    assert BlockArguments.of(args.choices(), args.seed, args.offset, args.stream) == args
    assert {name for name, value in values.items() if type(value) in key} == typed
