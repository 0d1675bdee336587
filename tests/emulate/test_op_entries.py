"""Each op overload's handling resolved once (`Emulation`'s entries): the fast path of a
plain op (run natively, its fresh outputs rounded) gives the bits the general path gave,
and each op, dtype and device gets its own entry and rounding."""

from __future__ import annotations

import hashlib

import pytest
import torch

from stochround.emulate import emulate

aten = torch.ops.aten


class _Block(torch.nn.Module):
    """Ops of every kind a step dispatches: products, a layer norm (several outputs), a
    softmax, a concatenation (a list argument), a conversion into bfloat16 and back, a
    reduction with indices (max.dim), in-place updates (SGD with momentum)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(16)
        self.last = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.first(x))
        h = torch.cat([h, torch.softmax(h, dim=-1)], dim=-1)
        h = self.norm(h).to(torch.bfloat16).to(torch.float32)
        return self.last(h) + h.max(dim=-1).values.unsqueeze(-1)


def _digest(mode: str) -> tuple[str, int]:
    """sha256 of the bytes of a small model's loss and parameters after two SGD steps (with
    momentum) under ``emulate("bfloat16", mode, seed=3)``, and the roundings made."""
    torch.manual_seed(0)
    model = _Block()
    inputs, targets = torch.randn(4, 8), torch.tensor([0, 2, 1, 0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    digest = hashlib.sha256()
    with emulate("bfloat16", mode, seed=3) as emulation:
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            digest.update(loss.detach().numpy().tobytes())
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    return digest.hexdigest(), emulation.calls


# the digests `_digest` gave before op entries (the commit before them): the fast path
# rounds the same tensors with the same offsets, in the same order
BEFORE = {
    "rne": "502521020b7114207b38ed148d9c5fec8baaf88f954ffead94e693ac993c4c39",
    "sr": "ab2ec6bb2cff3add6a33eabeb20eb11f357872c1c8326a3d92443c049e5b5d14",
    "rz": "f994b9bfa1336ddb3ef4c222e4e8abb1606deb9d83c940428da108cd9aedfbf3",
}


@pytest.mark.parametrize("mode", sorted(BEFORE))
def test_a_step_gives_the_bits_it_gave_before_op_entries(mode):
    assert _digest(mode) == (BEFORE[mode], 88)


def test_each_op_overload_gets_one_entry_resolved_at_its_first_call():
    a = torch.linspace(1, 2, 5)
    with emulate("bfloat16", "rne") as emulation:
        for _ in range(3):
            a * 1.001
        assert list(emulation._entries) == [aten.mul.Tensor]
        first = emulation._entries[aten.mul.Tensor]
        a.mul_(1.001)  # another overload: its own entry
        a.view(5)
    assert emulation._entries[aten.mul.Tensor] is first
    assert set(emulation._entries) == {aten.mul.Tensor, aten.mul_.Tensor, aten.view.default}
    assert first.plain and first.handled
    assert emulation._entries[aten.mul_.Tensor].plain  # its mutated argument rounded
    view = emulation._entries[aten.view.default]
    assert not view.handled and not view.plain
    assert emulation.calls == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"round_inputs": True},
        {"compute": "float64"},
        {"accumulate": "per_op"},
    ],
)
def test_an_entry_is_plain_only_where_the_op_runs_natively(kwargs):
    a = torch.linspace(1, 2, 5)
    with emulate("bfloat16", "rne", **kwargs) as emulation:
        a * 1.001
        a.to(torch.float64)
    assert emulation._entries[aten.mul.Tensor].handled
    assert not emulation._entries[aten.mul.Tensor].plain
    assert not emulation._entries[aten._to_copy.default].plain


def test_a_conversion_is_never_plain():
    a = torch.linspace(1, 2, 5)
    with emulate("bfloat16", "rne") as emulation:
        a.to(torch.float64)
    entry = emulation._entries[aten._to_copy.default]
    assert entry.handled and not entry.plain


def test_one_prepared_rounding_serves_every_dtype_and_routes_each_dtype_once():
    """One format, every dtype holding it: one `PreparedRounding`, which routes each input
    dtype (and device) of the ops it rounds once."""
    a32, a64 = torch.linspace(1, 2, 5), torch.linspace(1, 2, 5, dtype=torch.float64)
    with emulate("bfloat16", "sr", seed=1) as emulation:
        for _ in range(2):
            a32 * 1.001
            a64 * 1.001
    prepared = emulation.roundings[torch.float32]
    assert set(emulation.roundings) == {torch.bfloat16, torch.float32, torch.float64}
    assert all(rounding is prepared for rounding in emulation.roundings.values())
    assert set(prepared.routes) == {(torch.float32, False), (torch.float64, False)}
    assert emulation.calls == 4


@pytest.mark.parametrize(
    ("op", "lists"),
    [
        (aten.cat.default, (0,)),
        (aten.index.Tensor, (1,)),
        (aten.index_put_.default, (1,)),
        (aten.view.default, ()),  # int[]: no tensors
        (aten.mm.default, ()),
    ],
)
def test_op_kind_names_the_arguments_that_may_hold_tensor_lists(op, lists):
    from stochround.emulate.ops import op_kind

    assert op_kind(op).tensor_lists == lists


def test_a_complex_tensor_in_a_list_argument_raises():
    parts = [torch.ones(2), torch.ones(2, dtype=torch.complex64)]
    with emulate("bfloat16"), pytest.raises(TypeError, match="complex"):
        torch.cat(parts)
    with emulate("bfloat16"), pytest.raises(TypeError, match="complex"):
        torch.ones(2, dtype=torch.complex64).add_(1)  # a mutated argument, plain entry


def test_an_emulation_in_another_thread_rounds():
    """The flag that passes an emulation's own ops through is per thread, False in a new
    thread."""
    import threading

    a = torch.linspace(1, 2, 9)
    results: list[torch.Tensor] = []

    def run() -> None:
        with emulate("bfloat16", "rne"):
            results.append(a * 1.001)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    with emulate("bfloat16", "rne"):
        expected = a * 1.001
    assert torch.equal(results[0], expected)
    assert torch.equal(expected, (a * 1.001).to(torch.bfloat16).float())


def test_an_op_that_returns_no_tensor_is_called_as_it_is():
    """A plain op whose schema returns no tensor (``x.item()``: ``_local_scalar_dense``; a
    profiler's record) passes straight through: nothing rounded, nothing counted; under
    ``round_inputs`` it is handled and its input is rounded, as before."""
    x = torch.tensor([1.0 + 2.0**-20])
    with emulate("bfloat16", "rne") as emulation, torch.profiler.record_function("step"):
        value = x.item()
    entry = emulation._entries[aten._local_scalar_dense.default]
    assert entry.handled and entry.plain and entry.passes
    assert value == 1.0 + 2.0**-20
    assert emulation.calls == 0
    with emulate("bfloat16", "rne", round_inputs=True) as emulation:
        value = x.item()
    assert not emulation._entries[aten._local_scalar_dense.default].passes
    assert value == 1.0
    assert emulation.calls == 1


def test_a_view_passes_and_a_rounded_op_does_not():
    a = torch.linspace(1, 2, 6)
    with emulate("bfloat16", "rne") as emulation:
        b = a.view(2, 3) * 1.001
    assert emulation._entries[aten.view.default].passes
    assert not emulation._entries[aten.mul.Tensor].passes
    assert torch.equal(b, (a.view(2, 3) * 1.001).to(torch.bfloat16).float())
