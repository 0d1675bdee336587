"""A prepared rounding (`stochround.rounding.prepared`): its choices checked once, at
`prepare`, with `round`'s errors; each call's bits those of `stochround.round` with the
same choices and the call's offset, on every path it routes to."""

from __future__ import annotations

import pytest
import torch

import stochround as sr
from stochround.rounding.prepared import prepare

SEED = 0x1234_5678_9ABC_DEF0


def _values(dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """Values with bits below every format's, around 1, tiny and large, of ``dtype``."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    x = torch.cat([x.flatten(), torch.tensor([2.0**-130, 3e38, -(2.0**-140), 0.0])])
    return x.to(dtype).to(device)


_INTS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaNs included)."""
    return a.dtype == b.dtype and torch.equal(a.view(_INTS[a.dtype]), b.view(_INTS[b.dtype]))


@pytest.mark.parametrize("mode", sr.MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_prepared_calls_give_rounds_bits_at_each_offset(mode, dtype):
    x = _values(dtype)
    prepared = prepare("bfloat16" if dtype != torch.bfloat16 else "e4m3fn", mode, seed=SEED)
    fmt = prepared.request.fmt
    for offset in (0, 1, 2**40):
        expected = sr.round(x, fmt, mode, seed=SEED, offset=offset)
        assert _same_bits(prepared.round(x, offset), expected)


@pytest.mark.parametrize(("rbits", "variant"), [(None, "c"), (3, "a"), (8, "b"), (5, "odd")])
def test_prepared_sr_takes_rbits_and_variant(rbits, variant):
    x = _values(torch.float32)
    prepared = prepare("e5m2", "sr", seed=SEED, rbits=rbits, variant=variant, sat="finite")
    expected = sr.round(
        x, "e5m2", "sr", rbits=rbits, variant=variant, sat="finite", seed=SEED, offset=9
    )
    assert _same_bits(prepared.round(x, 9), expected)


def test_a_prepared_hardware_unit_rounds_as_round_does():
    x = _values(torch.float32)
    prepared = prepare("e4m3fnuz", "sr", seed=SEED, hardware="amd-mi300")
    expected = sr.round(x, "e4m3fnuz", seed=SEED, offset=4, hardware="amd-mi300")
    assert prepared.backend == "torch"
    assert _same_bits(prepared.round(x, 4), expected)


def test_a_tensor_that_requires_grad_goes_through_the_op_with_the_same_bits():
    x = _values(torch.float32).requires_grad_()
    prepared = prepare("bfloat16", "sr", seed=SEED)
    rounded = prepared.round(x, 5)
    rounded.sum().backward()
    assert _same_bits(rounded.detach(), sr.round(x.detach(), "bfloat16", "sr", seed=SEED, offset=5))
    assert torch.equal(x.grad, torch.ones_like(x))  # straight through, as round's


def test_the_route_is_resolved_once_per_dtype_and_device():
    prepared = prepare("bfloat16", "rne", seed=SEED)
    for _ in range(3):
        prepared.round(_values(torch.float32), 0)
    prepared.round(_values(torch.float64), 0)
    assert sorted(str(dtype) for dtype, _ in prepared.routes) == ["torch.float32", "torch.float64"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_prepared_cuda_calls_give_the_kernels_bits(mode):
    x = _values(torch.float32, "cuda")
    prepared = prepare("bfloat16", mode, seed=SEED)
    assert _same_bits(prepared.round(x, 11), sr.round(x, "bfloat16", mode, seed=SEED, offset=11))
    assert prepared.routes[(torch.float32, True)].plan is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fmt": "bfloat17"}, ValueError, "unknown format"),
        ({"mode": "nearest"}, ValueError, "mode"),
        ({"mode": "rne", "rbits": 4}, ValueError, "rbits"),
        ({"mode": "sr", "rbits": 40}, ValueError, "rbits"),
        ({"mode": "sr", "variant": "z"}, ValueError, "variant"),
        ({"sat": "clip"}, ValueError, "sat"),
        ({"mode": "sr", "seed": -1}, ValueError, "seed"),
        ({"mode": "sr", "seed": 1.5}, TypeError, "seed"),
        ({"fmt": None}, ValueError, "fmt is required"),
        ({"hardware": "no-such-unit"}, ValueError, "unknown hardware preset"),
        ({"mode": "rz", "hardware": "amd-mi300-fp8", "fmt": None}, ValueError, "hardware="),
    ],
)
def test_prepare_checks_each_choice_naming_it(kwargs, error, match):
    arguments = {"fmt": "bfloat16", "mode": "rne", "seed": SEED, **kwargs}
    with pytest.raises(error, match=match):
        prepare(arguments.pop("fmt"), arguments.pop("mode"), **arguments)


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.zeros(2, device="meta"), "meta"),
        (torch.eye(2).to_sparse(), "sparse"),
        (torch.zeros(2, dtype=torch.int32), "floating dtype"),
    ],
)
def test_each_calls_tensor_is_checked_as_round_checks_it(x, match):
    with pytest.raises(TypeError, match=match):
        prepare("bfloat16", "rne", seed=SEED).round(x, 0)


def _kernel_route():  # type: ignore[no-untyped-def]
    """The kernels' route: CUDA tensors on a GPU, else `cpu_as_cuda` (the interpreter)."""
    import contextlib

    from stochround.kernels.availability import cpu_as_cuda

    return contextlib.nullcontext() if torch.cuda.is_available() else cpu_as_cuda()


_KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("mode", sr.MODES)
@pytest.mark.parametrize(
    ("dtype", "fmt"), [(torch.float32, "bfloat16"), (torch.bfloat16, "e4m3fn")]
)
def test_round_in_place_writes_round_plains_bits_into_x(mode, dtype, fmt):
    x = _values(dtype, _KERNEL_DEVICE)
    prepared = prepare(fmt, mode, seed=SEED)
    with _kernel_route():
        expected = prepared.round_plain(x, 2**40 + 3)
        written = x.clone()
        assert prepared.round_in_place(written, 2**40 + 3)
    assert _same_bits(written, expected)
    assert _same_bits(expected, sr.round(x, fmt, mode, seed=SEED, offset=2**40 + 3))


@pytest.mark.parametrize(
    ("x", "fmt", "mode", "seed"),
    [
        (_values(torch.float32).reshape(3, 13).t(), "bfloat16", "rne", SEED),  # not contiguous
        (_values(torch.float64), "bfloat16", "sr", SEED),  # the kernels read no float64
        (_values(torch.bfloat16), "bfloat16", "sr", SEED),  # bf16 values: the bf16 path
        (_values(torch.float32), "bfloat16", "sr", torch.tensor(SEED - 2**63)),  # a tensor seed
    ],
)
def test_round_in_place_declines_what_its_kernel_cannot_write_and_leaves_x(x, fmt, mode, seed):
    x = x.to(_KERNEL_DEVICE)
    before = x.clone()
    with _kernel_route():
        assert not prepare(fmt, mode, seed=seed).round_in_place(x, 1)
    assert _same_bits(x, before)


def test_round_in_place_declines_the_pytorch_paths_tensors():
    x = _values(torch.float32)
    assert not prepare("bfloat16", "rne", seed=SEED).round_in_place(x, 0)
    assert _same_bits(x, _values(torch.float32))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_the_in_place_rounding_a_caller_holds_writes_round_in_places_bits(mode):
    """`PreparedRounding.in_place_rounding` is `round_in_place`'s rounding, found once: a
    caller that holds it and calls it gets the same bits; None off the kernels' route."""
    x = _values(torch.float32, _KERNEL_DEVICE)
    prepared = prepare("bfloat16", mode, seed=SEED)
    with _kernel_route():
        rounding = prepared.in_place_rounding((torch.float32, True))
        assert rounding is not None
        assert prepared.in_place_rounding((torch.float32, True)) is rounding
        held, called = x.clone(), x.clone()
        rounding(held, 2**40 + 5)
        assert prepared.round_in_place(called, 2**40 + 5)
    assert _same_bits(held, called)
    assert prepared.in_place_rounding((torch.float32, False)) is None
