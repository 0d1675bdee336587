"""What an emulation resolves once rather than per op: its rounding (checked and prepared
when the emulation is made, each op's outputs rounded by the prepared rounding directly,
never through `stochround.round`'s entry) and each op overload's handling (its kind and
whether ``ops`` picks it)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import stochround as sr
import stochround.rounding.entry as entry
import stochround.rounding.prepared as prepared_module
from stochround.emulate import emulate
from stochround.kernels.availability import cpu_as_cuda
from stochround.random import StreamDomain, stream_key


def _step(mode: str, seed: int) -> tuple[list[torch.Tensor], int]:
    """A small MLP's forward, backward and SGD update under ``emulate("bfloat16", mode)``:
    the updated parameters and the roundings it made."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    inputs, targets = torch.randn(4, 8), torch.tensor([0, 2, 1, 0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    with emulate("bfloat16", mode, seed=seed) as emulation:
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], emulation.calls


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_ops_are_rounded_without_calling_rounds_entry(mode, monkeypatch):
    """The entry's one body (`_round_call`, behind round, cast and encode) raises here: an
    emulated step still runs, with the bits it gives otherwise."""
    expected, expected_calls = _step(mode, seed=5)

    def refused(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("an emulated op called stochround.round's entry")

    monkeypatch.setattr(entry, "_round_call", refused)
    with pytest.raises(AssertionError, match="entry"):
        sr.round(torch.ones(2), "bfloat16")  # the patch holds
    got, calls = _step(mode, seed=5)
    assert calls == expected_calls > 0
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_prepared_rounding_gives_rounds_bits_for_each_dtype():
    """One format, every dtype that holds it: each dtype's results are rounded as
    `stochround.round` rounds them, at the counter's offsets."""
    key = int(stream_key(4, StreamDomain.EMULATE))
    a32, a64 = torch.linspace(1, 2, 9), torch.linspace(1, 2, 9, dtype=torch.float64)
    with emulate("bfloat16", "sr", seed=4) as emulation:
        r32, r64 = a32 * 1.001, a64 * 1.001
    assert emulation.calls == 2
    assert torch.equal(r32, sr.round(a32 * 1.001, "bfloat16", "sr", seed=key, offset=0))
    assert torch.equal(r64, sr.round(a64 * 1.001, "bfloat16", "sr", seed=key, offset=1))


def test_a_callable_ops_is_asked_once_per_op_overload():
    asked: list[torch._ops.OpOverload] = []

    def ops(func: torch._ops.OpOverload) -> bool:
        asked.append(func)
        return func.overloadpacket is torch.ops.aten.mul

    a = torch.linspace(1, 2, 5)
    with emulate("bfloat16", "rz", ops=ops) as emulation:
        for _ in range(3):
            a * 1.001 + 0.001
    assert sorted(map(str, asked)) == ["aten.add.Tensor", "aten.mul.Tensor"]
    assert emulation.calls == 3  # the products only


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "rne", "rbits": 4}, ValueError, "rbits"),
        ({"mode": "sr", "rbits": 0}, ValueError, "rbits"),
        ({"mode": "sr", "variant": "x"}, ValueError, "variant"),
        ({"hardware": "no-such-unit"}, ValueError, "unknown hardware preset"),
        ({"mode": "rz", "hardware": "amd-mi300-fp8"}, ValueError, "hardware="),
        ({"seed": "0"}, TypeError, "seed"),
    ],
)
def test_the_roundings_arguments_raise_when_the_emulation_is_made(kwargs, error, match):
    """At `emulate(...)`, before any op runs (no ``with`` block is entered here)."""
    with pytest.raises(error, match=match):
        emulate("e4m3fnuz" if "hardware" in kwargs else "bfloat16", **kwargs)


def _kernel_route() -> contextlib.AbstractContextManager[None]:
    """The route a CUDA tensor takes: a GPU's (nothing to do), else CPU tensors routed as
    CUDA ones under Triton's interpreter (`cpu_as_cuda`)."""
    return contextlib.nullcontext() if torch.cuda.is_available() else cpu_as_cuda()


def test_an_ops_fresh_output_is_rounded_without_the_calls_checks(monkeypatch):
    """An op's fresh output (a plain tensor the op just made inside the mode) is rounded
    by `PreparedRounding.round_plain`, without `check_input` (which costs about what the
    rounding's host side does, on every op), with the bits of `stochround.round`."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = int(stream_key(6, StreamDomain.EMULATE))
    a = torch.linspace(1, 2, 9, device=device)
    checked: list[torch.Tensor] = []
    original = prepared_module.check_input

    def counted(x: torch.Tensor) -> torch.Tensor:
        checked.append(x)
        return original(x)

    monkeypatch.setattr(prepared_module, "check_input", counted)
    with _kernel_route():
        expected = sr.round(sr.round(a * 1.001, "bfloat16", "sr", seed=key, offset=0).tanh(),
                            "bfloat16", "sr", seed=key, offset=1)  # fmt: skip
        checked.clear()
        with emulate("bfloat16", "sr", seed=6) as emulation:
            found = (a * 1.001).tanh()
    assert emulation.calls == 2 and checked == []
    assert torch.equal(found.view(torch.int32), expected.view(torch.int32))


def test_each_dtype_takes_its_own_route_on_the_kernels_route():
    """One format (one prepared rounding) for float32 and float64 results on the kernels'
    route: a float32 op's result goes to the kernel, the float64 op's after it (the
    kernels read fp32, bf16 and fp16) to the PyTorch path; each result keeps its dtype
    and has `stochround.round`'s bits.  A route cached without the dtype would give the
    float64 op the float32 kernel's float32 result."""
    key = int(stream_key(4, StreamDomain.EMULATE))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a32 = torch.linspace(1, 2, 9, device=device)
    a64 = torch.linspace(1, 2, 9, dtype=torch.float64, device=device)
    with _kernel_route():
        with emulate("bfloat16", "sr", seed=4) as emulation:
            r32, r64 = a32 * 1.001, a64 * 1.001
        e32 = sr.round(a32 * 1.001, "bfloat16", "sr", seed=key, offset=0)
        e64 = sr.round(a64 * 1.001, "bfloat16", "sr", seed=key, offset=1)
    assert emulation.calls == 2 and (r32.dtype, r64.dtype) == (torch.float32, torch.float64)
    assert torch.equal(r32.view(torch.int32), e32.view(torch.int32))
    assert torch.equal(r64.view(torch.int64), e64.view(torch.int64))
