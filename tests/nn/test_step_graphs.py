"""The CUDA graphs of quantized layers' steps (`stochround.nn.step_graphs`): a graphed step
gives the eager step's bits, replays from a layer's third step, falls back where a graph
does not hold (new addresses, a user's capture in progress), and leaves the CPU alone."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_same_tensors, cuda_route, graphs_on_the_cpu
from torch import Tensor

import stochround.nn as srnn
from stochround.nn import graph_copies, opaque_matmul, operands, orientations
from stochround.nn import step_graphs as graphs_module
from stochround.nn.graph_copies import copy_grouped, fresh_copies
from stochround.nn.graph_notes import KEEPING, NOTES, host_note, kept_by_graphs, noting
from stochround.nn.linear import COMPILES
from stochround.nn.step_graphs import (
    STEP_GRAPHS,
    Captured,
    StepGraphs,
    call_key,
    enabled_by_environment,
    use_step_graphs,
)

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
RECIPES = ["nvfp4", "mxfp8", "int8", "fp8", "mxfp4_tseng"]
STEPS = 5


@contextlib.contextmanager
def step_graphs(enabled: bool) -> Iterator[None]:
    """The step graphs on or off inside the block, the previous setting restored (graphs
    dropped on either side, so that each run starts from no key seen)."""
    previous = use_step_graphs(False)
    use_step_graphs(enabled)
    try:
        yield
    finally:
        use_step_graphs(False)
        use_step_graphs(previous)


def train(
    name: str, device: torch.device, bias: bool = True, compiled: bool = False
) -> list[Tensor]:
    """`STEPS` steps of one quantized layer (64 tokens, 128 -> 256, bf16; compiled by
    inductor where ``compiled``) with SGD, fixed inputs a step; every step's output, x's
    gradient and the parameters' gradients, and for ``name`` "nvfp4_delayed" (delayed
    tensor scales over 2 steps) the amax history's buffers after each step."""
    torch.manual_seed(0)
    if name == "nvfp4_delayed":
        recipe = srnn.nvfp4(seed=7, tensor_scale="delayed", amax_history=2)
    else:
        recipe = srnn.RECIPES[name](seed=7)
    layer = srnn.QuantizedLinear(
        128, 256, bias=bias, device=device, dtype=torch.bfloat16, recipe=recipe
    )
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    run = torch.compile(layer, backend="inductor", fullgraph=True) if compiled else layer
    generator = torch.Generator().manual_seed(1)
    seen: list[Tensor] = []
    for _ in range(STEPS):
        x = torch.randn(64, 128, generator=generator).to(device, torch.bfloat16)
        x.requires_grad_()
        optimizer.zero_grad()
        y = run(x)
        y.float().square().mean().backward()
        # kept on the CPU: the device's allocations then repeat step after step, as in a
        # training loop, and the layer's calls find their graphs
        seen += [y.detach().cpu(), x.grad.cpu()]  # type: ignore[union-attr]
        seen += [parameter.grad.cpu() for parameter in layer.parameters()]  # type: ignore[union-attr]
        seen += [buffer.cpu() for name, buffer in layer.named_buffers() if "amax" in name]
        optimizer.step()
    return seen


def test_a_cpu_step_runs_as_it_is() -> None:
    """CPU tensors never reach a graph: the function runs at every call, nothing kept."""
    graphs = StepGraphs()
    calls: list[int] = []

    def function(x: Tensor, n: int) -> Tensor:
        calls.append(n)
        return x + n

    x = torch.zeros(4)
    for _ in range(3):
        assert torch.equal(graphs.run(function, (x,), (1,), 0), torch.ones(4))
    assert calls == [1, 1, 1] and not graphs.graphs and not graphs.seen


def test_the_key_tells_layouts_dtypes_and_arguments_apart_not_addresses() -> None:
    x = torch.zeros(4, 6)
    key = call_key((x, None), (3, [True, False]))
    assert key == call_key((x.clone(), None), (3, [True, False]))  # any address
    assert key != call_key((x.T, None), (3, [True, False]))  # another layout
    assert key != call_key((x.view(torch.int32), None), (3, [True, False]))
    assert key != call_key((x, None), (3, [True, True]))
    assert key != call_key((x[1:], None), (3, [True, False]))
    assert key != call_key((x, x), (3, [True, False]))


def test_the_environment_turns_them_on_and_names_its_values() -> None:
    assert enabled_by_environment(None) and enabled_by_environment("")
    assert enabled_by_environment("1") and not enabled_by_environment("0")
    with pytest.raises(ValueError, match='STOCHROUND_STEP_GRAPHS must be "0" or "1"'):
        enabled_by_environment("yes")


def test_a_cache_keeps_its_results_for_the_graph_being_captured() -> None:
    """`kept_by_graphs`: what a cached function returns while a graph is captured in this
    thread is kept for that graph, and nothing otherwise; the cache's methods stay."""
    import functools

    @kept_by_graphs
    @functools.lru_cache(maxsize=1)
    def cached(n: int) -> list[int]:
        return [n]

    first = cached(1)
    kept: list[object] = []
    KEEPING.objects = kept
    try:
        again, other = cached(1), cached(2)
    finally:
        KEEPING.objects = None
    cached(3)
    assert kept == [first, other] and kept[0] is first and again is first
    assert cached.cache_info().maxsize == 1  # type: ignore[attr-defined]
    cached.cache_clear()  # type: ignore[attr-defined]


def captured(nbytes: int, device: int) -> Captured:
    """A stand-in graph record whose copies hold ``nbytes`` (no CUDA graph: the keeping
    logic alone)."""
    return Captured(None, (torch.zeros(nbytes, dtype=torch.uint8), None), (), True, (), device)  # type: ignore[arg-type]


def test_graphs_beyond_the_count_go_least_recent_first_with_their_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond `MAX_GRAPHS` the least recently kept (or replayed) graph goes; a device's
    pool handle goes with its last graph, and stays while the device has one."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", 2)
    graphs = StepGraphs()
    graphs.pools = {0: "pool0", 1: "pool1"}
    graphs.keep(("a",), captured(8, 1))
    graphs.keep(("b",), captured(8, 0))
    graphs.keep(("c",), captured(8, 0))
    assert list(graphs.graphs) == [("b",), ("c",)] and graphs.pools == {0: "pool0"}
    graphs.graphs.move_to_end(("b",))  # replayed
    graphs.keep(("d",), captured(8, 0))
    assert list(graphs.graphs) == [("b",), ("d",)] and graphs.pools == {0: "pool0"}
    assert graphs.bytes == 16


def test_graphs_beyond_the_bytes_go_but_the_new_one_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond `MAX_GRAPH_BYTES` of copies the least recent graphs go; a graph larger than
    the bound alone is kept."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_BYTES", 100)
    graphs = StepGraphs()
    graphs.keep(("a",), captured(64, 0))
    graphs.keep(("b",), captured(30, 0))
    assert list(graphs.graphs) == [("a",), ("b",)] and graphs.bytes == 94
    graphs.keep(("c",), captured(64, 0))
    assert list(graphs.graphs) == [("b",), ("c",)] and graphs.bytes == 94
    graphs.keep(("d",), captured(500, 0))
    assert list(graphs.graphs) == [("d",)] and graphs.bytes == 500
    graphs.clear()
    assert graphs.bytes == 0 and not graphs.graphs


def test_an_in_place_graph_that_does_not_fit_is_not_kept_and_stops_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An in-place graph (its outputs only) that would take the graphs beyond
    `MAX_GRAPH_BYTES` or `MAX_GRAPHS` is not kept and evicts nothing, and no in-place graph
    is captured after it (each would evict another layer's, captured again next step);
    graphs of copies are kept as before, the least recent evicted; `clear` starts over."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_BYTES", 100)
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", 3)

    def in_place(nbytes: int) -> Captured:
        outputs = (torch.zeros(nbytes, dtype=torch.uint8),)
        return Captured(None, (None,), outputs, True, (), 0, (1234,))  # type: ignore[arg-type]

    graphs = StepGraphs()
    graphs.keep(("a", (1,)), in_place(60))
    assert graphs.room_in_place() and graphs.captures == 1
    graphs.keep(("b", (2,)), in_place(60))
    assert list(graphs.graphs) == [("a", (1,))] and graphs.bytes == 60
    assert not graphs.room_in_place() and graphs.captures == 1
    graphs.keep(("c", None), captured(60, 0))
    assert list(graphs.graphs) == [("c", None)] and graphs.bytes == 60
    graphs.clear()
    graphs.keep(("a", (1,)), in_place(10))
    graphs.keep(("b", (2,)), in_place(10))
    graphs.keep(("c", (3,)), in_place(10))
    assert len(graphs.graphs) == 3 and graphs.room_in_place() is False
    graphs.keep(("d", (4,)), in_place(10))
    assert len(graphs.graphs) == 3 and graphs.crowded


def test_an_in_place_graph_not_kept_takes_its_devices_last_pool_handle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An in-place graph that does not fit is not kept: once the call's replay is done it
    goes, and with it the last graph of its pool where no kept graph is on its device;
    PyTorch then releases that pool, and a capture into its handle again fails, so the
    handle goes (and stays while a kept graph on the device holds the pool)."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_BYTES", 100)

    def in_place(nbytes: int, device: int) -> Captured:
        outputs = (torch.zeros(nbytes, dtype=torch.uint8),)
        return Captured(None, (None,), outputs, True, (), device, (1234,))  # type: ignore[arg-type]

    graphs = StepGraphs()
    graphs.pools = {0: "pool0", 1: "pool1"}
    graphs.keep(("a", (1,)), in_place(60, 1))
    graphs.keep(("b", (2,)), in_place(60, 0))
    assert graphs.crowded and list(graphs.graphs) == [("a", (1,))]
    assert graphs.pools == {1: "pool1"}
    graphs.pools[0] = "pool0 again"
    graphs.keep(("c", (3,)), in_place(200, 1))
    assert graphs.pools == {0: "pool0 again", 1: "pool1"}


def test_a_key_seen_again_is_the_newest_and_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """`remember` of a key already seen makes it the newest: beyond `MAX_SEEN` the least
    recently seen goes, so keys that recur (a model's layers, step after step) stay."""
    monkeypatch.setattr(graphs_module, "MAX_SEEN", 3)
    graphs = StepGraphs()
    for key in ("a", "b", "c", "a", "d"):
        graphs.remember((key, None))
    assert list(graphs.seen) == [("c", None), ("a", None), ("d", None)]


class FakeGraph:
    """A stand-in CUDA graph whose replay counts (the run's bookkeeping alone)."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def served_on_the_cpu(
    graphs: StepGraphs, monkeypatch: pytest.MonkeyPatch, notes: tuple[object, ...] = ()
) -> list[tuple]:
    """``graphs`` serving CPU calls, each capture a `FakeGraph` whose outputs are the
    function's (run once) and whose notes are ``notes``: the graph keys captured, in
    order."""
    keys: list[tuple] = []

    def capture(
        function: Any, tensors: Any, rest: tuple, graph_key: tuple, mutates: tuple = ()
    ) -> Captured:
        keys.append(graph_key)
        with noting():  # as a capture's runs: their notes are the graph's
            outputs, single = graphs_module.graph_outputs(function(*tensors, *rest))
        copies = None if graph_key[1] is not None else tuple(t.clone() for t in tensors)
        copy_in = None if copies is None else graph_copies.copy_plan(copies)
        made = Captured(
            FakeGraph(),  # type: ignore[arg-type]
            copies or (None,) * len(tensors),
            outputs,
            single,
            (),
            0,
            graph_key[1],
            copy_in,
            graph_copies.copy_plan(outputs),
            notes,
        )
        graphs.keep(graph_key, made)
        return made

    monkeypatch.setattr(graphs, "serves", lambda *args: True)
    monkeypatch.setattr(graphs, "capture", capture)
    return keys


def test_a_mutating_call_s_graph_of_copies_writes_its_tensors_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that writes some of its tensors (``mutates``: their positions; a delayed
    layer's amax history) is served as any other: at new addresses each call by the key's
    graph of copies, which writes its static copies, copied back into the call's tensors
    after each replay (the capture's own runs leave the call's tensors as they were); at
    repeated addresses by a graph of its own reading them in place.  Every call leaves
    the tensors as the function run eagerly would."""

    def function(x: Tensor, total: Tensor) -> Tensor:
        total.add_(x)
        return total * 2

    graphs = StepGraphs()
    keys = graphs_on_the_cpu(monkeypatch, graphs)
    eager = torch.zeros(4)
    for step in range(4):  # new addresses each call
        x, total = torch.full((4,), float(step)), eager.clone()
        function(x, eager)
        got = graphs.run(function, (x, total), (), 0, mutates=(1,))
        assert torch.equal(total, eager) and torch.equal(got, eager * 2), step
    assert [key[1] for key in keys] == [None] and graphs.replays == 3
    captured = graphs.graphs[keys[0]]
    assert captured.copy_back is not None and captured.copy_back.groups[0][0] == (1,)
    x, total = torch.ones(4), eager.clone()
    for _ in range(3):  # the same addresses: in place from the second call
        function(x, eager)
        graphs.run(function, (x, total), (), 0, mutates=(1,))
        assert torch.equal(total, eager)
    assert keys[-1][1] == (x.data_ptr(), total.data_ptr())
    assert graphs.graphs[keys[-1]].copy_back is None


def test_a_layer_takes_a_bounded_number_of_in_place_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer (its weight's address) whose activations come at new addresses, each set
    twice, gets an in-place graph for each of the first `IN_PLACE_PER_LAYER` sets; later
    sets replay the key's graph of copies, capturing nothing (a model whose allocations do
    not settle would otherwise capture at every step).  Another layer of the key has its
    own count; `clear` starts the counts over.  Every call gives the function's values."""

    def function(x: Tensor, w: Tensor) -> Tensor:
        return x * 2 + w

    graphs = StepGraphs()
    keys = graphs_on_the_cpu(monkeypatch, graphs)
    weights = (torch.ones(4), torch.full((4,), 3.0))

    def calls(w: Tensor, sets: int) -> list[tuple | None]:
        addresses = []
        for step in range(sets):
            x = torch.full((4,), float(step))
            for _ in range(2):
                assert torch.equal(graphs.run(function, (x, w), (), 0, layer=w), x * 2 + w)
            addresses.append((x.data_ptr(), w.data_ptr()))
        return addresses

    bound = graphs_module.IN_PLACE_PER_LAYER
    first = calls(weights[0], bound + 2)
    assert [key[1] for key in keys] == [first[0], None, *first[1:bound]]
    before = graphs.captures
    second = calls(weights[1], bound + 1)
    assert [key[1] for key in keys[bound + 1 :]] == second[:bound]
    assert graphs.captures == before + bound
    graphs.clear()
    again = calls(weights[0], 1)
    assert keys[-1][1] == again[0]


def test_a_replay_gives_the_notes_its_capture_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step function's host notes (`host_note`) reach its caller inside `noting` when it
    runs, and each replay of its graph gives the notes the capture made (the function's
    Python does not run then); outside `noting` a note goes nowhere."""
    graphs = StepGraphs()
    served_on_the_cpu(graphs, monkeypatch, notes=("captured",))

    def function(x: Tensor) -> Tensor:
        host_note("ran")
        return x * 2

    x = torch.ones(3)
    seen = []
    for _ in range(4):
        with noting() as notes:
            graphs.run(function, (x,), (), 0, mutates=(0,))
        seen.append(list(notes))
    # run, captured (and replayed), replayed
    assert seen == [["ran"], ["captured"], ["captured"], ["captured"]]
    function(x)  # no caller noting: nothing kept
    assert NOTES.notes is None


def test_use_step_graphs_switches_and_checks_its_argument() -> None:
    previous = use_step_graphs(False)
    try:
        assert use_step_graphs(True) is False
        assert STEP_GRAPHS.enabled
        with pytest.raises(TypeError, match="enabled must be a bool, got int"):
            use_step_graphs(1)  # type: ignore[arg-type]
    finally:
        use_step_graphs(previous)


def layer_and_two_inputs(seed: int) -> tuple[srnn.QuantizedLinear, Tensor, Tensor]:
    """An ``nvfp4(seed=seed)`` layer (128 -> 96, bf16, CUDA) and two inputs at distinct
    addresses."""
    device = torch.device("cuda")
    layer = srnn.QuantizedLinear(
        128, 96, bias=False, device=device, dtype=torch.bfloat16, recipe=srnn.nvfp4(seed=seed)
    )
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    moved = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    return layer, x, moved


@GPU
@pytest.mark.parametrize("name", RECIPES)
def test_a_graphed_training_run_gives_the_eager_runs_bits(name: str) -> None:
    """Five SGD steps of a layer with the step graphs on (replayed from the third step)
    give the steps' outputs and gradients of the run with them off, bit for bit."""
    device = torch.device("cuda")
    with step_graphs(False):
        expected = train(name, device)
    with step_graphs(True):
        before = STEP_GRAPHS.replays
        got = train(name, device)
        assert STEP_GRAPHS.replays - before >= 2 * (STEPS - 2)
    assert_same_tensors(got, expected)


@GPU
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_delayed_layer_replays_its_graphs_with_the_ungraphed_bits(compiled: bool) -> None:
    """A layer with delayed tensor scales, eager or compiled by inductor (its delayed ops),
    replays its step functions' graphs (a graph per host decision, the first step's empty
    windows and the later steps' recorded ones; of copies, the history copied back, where
    the step's tensors lie elsewhere than at an earlier step, else in place) with the
    bits of the run with the graphs off: outputs, gradients and the amax history's
    buffers after each step, byte for byte; the host copy's marks keep up with the
    replays; no key's warm-up failed."""
    device = torch.device("cuda")
    with step_graphs(False):
        expected = train("nvfp4_delayed", device)
    torch._dynamo.reset()
    with step_graphs(True):
        captures, replays = STEP_GRAPHS.captures, STEP_GRAPHS.replays
        got = train("nvfp4_delayed", device, compiled=compiled)
        # a key whose warm-up read the host (or whose capture failed) runs eagerly for good
        assert not STEP_GRAPHS.failed, [key[0][1] for key in STEP_GRAPHS.failed]
        assert STEP_GRAPHS.captures > captures and STEP_GRAPHS.replays > replays
    torch._dynamo.reset()
    assert_same_tensors(got, expected)


@pytest.mark.parametrize(
    "compiled",
    [
        False,
        pytest.param(
            True,
            marks=[
                pytest.mark.compiles,
                pytest.mark.skipif(
                    not COMPILES, reason="QuantizedLinear compiles with torch >= 2.11"
                ),
            ],
        ),
    ],
    ids=["eager", "compiled"],
)
def test_a_delayed_layer_graphed_on_the_kernels_route_gives_the_ungraphed_bits(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU test above on the kernels' route wherever it runs (on the CPU, the
    interpreter's, with stand-in graphs that run the function at each replay:
    `graphs_on_the_cpu`, whose layers keep what a GPU's graphed layers keep): the delayed
    layer's step functions are captured and replayed although the test's tensors lie
    elsewhere at each step (the key's graph of copies, its history copied back), and the
    run's outputs, gradients and history buffers are those of the run without the graphs,
    the operands the backward reuses kept either way (a backward quantizing W again would
    record ``dgrad_weight``'s amax, which a run without the graphs never does)."""
    device, context = cuda_route()
    with context:
        with step_graphs(False):
            expected = train("nvfp4_delayed", device)
        torch._dynamo.reset()
        STEP_GRAPHS.clear()
        try:
            keys = graphs_on_the_cpu(monkeypatch, STEP_GRAPHS) if device.type != "cuda" else []
            with step_graphs(True) if device.type == "cuda" else contextlib.nullcontext():
                replays = STEP_GRAPHS.replays
                got = train("nvfp4_delayed", device, compiled=compiled)
                assert STEP_GRAPHS.replays > replays
                assert device.type == "cuda" or len(keys) >= 2
        finally:
            STEP_GRAPHS.clear()
            torch._dynamo.reset()
    assert_same_tensors(got, expected)


@GPU
def test_a_compiled_layer_replays_its_ops_graphs_with_the_eager_bits() -> None:
    """A layer compiled by inductor runs its two ops through the step graphs: the bits of
    the uncompiled run without graphs."""
    device = torch.device("cuda")
    with step_graphs(False):
        expected = train("nvfp4", device, bias=False)
    torch._dynamo.reset()
    with step_graphs(True):
        before = STEP_GRAPHS.replays
        got = train("nvfp4", device, bias=False, compiled=True)
        assert STEP_GRAPHS.replays > before
    torch._dynamo.reset()
    assert_same_tensors(got, expected)


@GPU
def test_any_address_replays_and_a_users_capture_takes_the_launches() -> None:
    """Once a layer's graphs are captured, a call with x at another address replays too
    (the key's graph of copies, x copied into its input) with the bits of the graphs off; and
    a user's CUDA graph of the whole step (warmed up and captured on side streams)
    captures the layer's launches, no step graph captured or replayed on those streams,
    and replays them."""
    layer, x, moved = layer_and_two_inputs(2)
    with step_graphs(False), torch.no_grad():
        expected = [layer(x), layer(moved)]
    with step_graphs(True), torch.no_grad():
        for _ in range(2):
            layer(x)
        before = STEP_GRAPHS.replays
        assert torch.equal(layer(x), expected[0])
        assert torch.equal(layer(moved), expected[1])
        assert STEP_GRAPHS.replays == before + 2
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            captured = layer(x)
        before = STEP_GRAPHS.replays
        graph.replay()
        assert STEP_GRAPHS.replays == before and len(STEP_GRAPHS.graphs) == 2
        assert torch.equal(captured, expected[0])


@GPU
def test_each_repeated_set_of_addresses_replays_in_place_others_copy() -> None:
    """A call whose tensors lie where a call of its key had them gets a graph reading them
    in place (no copies of its inputs held): a replay reads what lies there then (x
    overwritten in place gives the new values' bits); a call with x elsewhere replays the
    key's graph of copies, until its addresses repeat and it gets a graph of its own; every
    result has the bits of the graphs off."""
    layer, x, moved = layer_and_two_inputs(3)
    kept = x.clone()
    with step_graphs(False), torch.no_grad():
        expected = [layer(x), layer(moved)]

    def kinds() -> list[str]:
        return sorted(
            "copies" if each.addresses is None else "in place"
            for each in STEP_GRAPHS.graphs.values()
        )

    with step_graphs(True), torch.no_grad():
        for _ in range(2):
            layer(x)
        (captured,) = STEP_GRAPHS.graphs.values()
        assert captured.addresses is not None and captured.copy_in is None
        assert all(each is None for each in captured.inputs)
        before = STEP_GRAPHS.replays
        assert torch.equal(layer(x), expected[0])
        x.copy_(moved)
        assert torch.equal(layer(x), expected[1])
        x.copy_(kept)
        assert torch.equal(layer(moved), expected[1])
        assert kinds() == ["copies", "in place"]
        assert torch.equal(layer(x), expected[0])
        assert torch.equal(layer(moved), expected[1])
        assert kinds() == ["copies", "in place", "in place"]
        assert STEP_GRAPHS.replays == before + 5


def layers_settle(plain: bool) -> None:
    """Four layers of one shape trained together: their calls' addresses settle within
    sixteen steps (each capture moves the allocations of the steps after it for a while: on
    an H200 the captures stopped after the seventh step), each layer's forward and backward
    then replay a graph of its own reading in place, no graph is captured after that, and
    every step has the bits of the run with the graphs off.  Also with a plain bf16
    `nn.Linear` after each (cuBLAS on the default stream, whose workspace a capture's clear
    frees): there whether the addresses settle depends on the allocator's history (on an
    H200 they settled after the seventh step, and, after one more 16-byte buffer kept by
    each layer's prepared launches, never within 24 steps), so what is asserted is the
    bound: at most `IN_PLACE_PER_LAYER` in-place graphs for each layer's forward and
    backward besides the graphs of copies."""
    device = torch.device("cuda")

    def run(steps: int) -> tuple[list[Tensor], list[int]]:
        torch.manual_seed(0)
        layers = [
            srnn.QuantizedLinear(
                128, 128, bias=False, device=device, dtype=torch.bfloat16,
                recipe=srnn.nvfp4(seed=5), layer_index=index,
            )
            for index in range(4)
        ]  # fmt: skip

        def plain_linear() -> list[torch.nn.Module]:
            return [torch.nn.Linear(128, 128, device=device, dtype=torch.bfloat16)] if plain else []

        blocks = [[layer, torch.nn.ReLU(), *plain_linear()] for layer in layers]
        model = torch.nn.Sequential(*[m for block in blocks for m in block])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(1)
        seen, captures = [], []
        for _ in range(steps):
            x = torch.randn(64, 128, generator=generator).to(device, torch.bfloat16)
            optimizer.zero_grad()
            y = model(x)
            y.float().square().mean().backward()
            seen += [y.detach().cpu(), *(layer.weight.grad.cpu() for layer in layers)]  # type: ignore[union-attr]
            captures.append(STEP_GRAPHS.captures)
            optimizer.step()
        return seen, captures

    with step_graphs(False):
        expected, _ = run(24)
    with step_graphs(True):
        got, captures = run(24)
        in_place = [each for each in STEP_GRAPHS.graphs.values() if each.addresses is not None]
        copies = len(STEP_GRAPHS.graphs) - len(in_place)
        assert len(in_place) >= 8  # each layer's forward and backward
    if plain:
        bound = copies + graphs_module.IN_PLACE_PER_LAYER * 2 * 4  # forward, backward
        assert captures[-1] <= bound, f"captures after each step: {captures}"
    else:
        assert captures[-1] == captures[15], f"captures after each step: {captures}"
    assert_same_tensors(got, expected)


@GPU
@pytest.mark.parametrize("plain", [False, True], ids=["quantized", "with_plain_linears"])
def test_a_models_layers_settle_on_graphs_of_their_own(plain: bool) -> None:
    """`layers_settle` in a process of its own, as a training script starts.  In the test
    process the addresses depend on what the tests before left allocated: after one fixed
    sequence of the kernels' and layers' tests (an xdist worker's share on an H200) the
    plain Linears' variant kept capturing to its last step, the allocator's cache emptied
    first or not, and passed alone."""
    tests = Path(__file__).resolve().parents[1]
    code = (
        f"import sys; sys.path[:0] = [{str(tests)!r}, {str(tests / 'nn')!r}]\n"
        f"from test_step_graphs import layers_settle\nlayers_settle({plain})"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]


@GPU
def test_a_host_bound_step_above_the_work_bound_replays_in_place_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fp8(native=True)`` (its GEMMs on the FP8 tensor cores: host-bound at any size)
    above `GRAPHED_MAX_WORK` replays graphs that read its tensors in place, with the bits
    of the graphs off; a call with x elsewhere runs eagerly (no graph of copies: copying
    the inputs would cost more than it saves there); other recipes run eagerly there."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores: sm89+")
    monkeypatch.setattr(graphs_module, "GRAPHED_MAX_WORK", 0)
    device = torch.device("cuda")
    layers = {
        native: srnn.QuantizedLinear(
            128, 128, bias=False, device=device, dtype=torch.bfloat16,
            recipe=srnn.fp8(native=native, seed=1),
        )
        for native in (True, False)
    }  # fmt: skip
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    moved = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    with step_graphs(False), torch.no_grad():
        expected = [layers[True](x), layers[True](moved)]
    with step_graphs(True), torch.no_grad():
        before = STEP_GRAPHS.replays  # (other tests' replays on this worker)
        layers[False](x)
        layers[False](x)
        assert not STEP_GRAPHS.graphs and STEP_GRAPHS.replays == before
        for _ in range(2):
            layers[True](x)
        (captured,) = STEP_GRAPHS.graphs.values()
        assert captured.addresses is not None
        before = STEP_GRAPHS.replays
        assert torch.equal(layers[True](x), expected[0])
        assert torch.equal(layers[True](moved), expected[1])
        assert STEP_GRAPHS.replays == before + 1 and len(STEP_GRAPHS.graphs) == 1


@GPU
def test_a_capture_after_an_in_place_graph_not_kept_takes_a_new_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first graph on a device is an in-place one that does not fit (replayed once, not
    kept): its pool is released with it, and the key's graph of copies captured next takes
    a new pool (a capture into the released pool's handle fails inside PyTorch's
    allocator); every result has the bits of the graphs off."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_BYTES", 1)
    layer, x, moved = layer_and_two_inputs(4)
    with step_graphs(False), torch.no_grad():
        expected = [layer(x), layer(moved)]
    with step_graphs(True), torch.no_grad():
        assert torch.equal(layer(x), expected[0])
        assert torch.equal(layer(x), expected[0])  # in place, replayed once, not kept
        assert STEP_GRAPHS.crowded and not STEP_GRAPHS.graphs
        assert torch.equal(layer(moved), expected[1])  # the key's graph of copies
        (captured,) = STEP_GRAPHS.graphs.values()
        assert captured.addresses is None
        assert torch.equal(layer(moved), expected[1])


@GPU
def test_a_graph_keeps_the_cached_state_its_kernels_read() -> None:
    """The prepared operands, pairs, keys and step plans a graph's kernels read stay alive
    with the graph after their caches drop them (and the freed memory is written over):
    the replays still give the bits of no graphs."""
    device = torch.device("cuda")
    layer = srnn.QuantizedLinear(
        128, 256, bias=False, device=device, dtype=torch.bfloat16, recipe=srnn.nvfp4(seed=4)
    )
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)

    def drop_the_caches() -> None:
        for cache in (
            operands.prepared_operand, operands.prepared_row_operand, operands.seed_on,
            operands.tensor_rounding, orientations.prepared_pair, opaque_matmul._step_plan,
        ):  # fmt: skip
            cache.cache_clear()  # type: ignore[attr-defined]

    assert_replays_over_freed_memory(layer, x, drop_the_caches, 1 << 20, 8)


@GPU
def test_a_host_read_is_found_before_any_capture_and_runs_eagerly() -> None:
    """A step function that reads a device value on the host (CUDA graphs do not take it)
    raises in its warm-up under the sync debug mode, before any capture begins: its key is
    marked failed, every call runs eagerly with its own result, and PyTorch's CUDA state
    (the generator) is left usable."""
    graphs = StepGraphs()
    graphs.enabled = True

    def function(x: Tensor, n: int) -> Tensor:
        return x + float(x.sum()) + n

    x = torch.ones(4, device="cuda")
    results = [graphs.run(function, (x,), (1,), 0) for _ in range(3)]
    assert all(torch.equal(result, torch.full((4,), 6.0, device="cuda")) for result in results)
    assert not graphs.graphs and len(graphs.failed) == 1 and graphs.replays == 0
    assert graphs.enabled and torch.cuda.get_sync_debug_mode() == 0
    torch.randn(4, device="cuda")  # torch's generator usable


@GPU
def test_a_cublas_gemm_in_a_graph_owns_its_workspace() -> None:
    """A step large enough for cuBLAS's GEMM (4096 x 1024 x 1024, above the fused GEMM's
    limit): its graph's cuBLAS workspace is its own, so PyTorch dropping its workspaces
    (as inductor's graphs do around theirs) and the freed memory written over leave the
    replays' bits the eager ones."""
    device = torch.device("cuda")
    layer = srnn.QuantizedLinear(
        1024, 1024, bias=False, device=device, dtype=torch.bfloat16, recipe=srnn.mxfp8(seed=1)
    )
    x = torch.randn(4096, 1024, device=device, dtype=torch.bfloat16)
    assert_replays_over_freed_memory(layer, x, graphs_module.clear_cublas_workspaces, 1 << 22, 16)


def assert_replays_over_freed_memory(
    layer: srnn.QuantizedLinear, x: Tensor, drop: Callable[[], None], elements: int, count: int
) -> None:
    """``layer``'s forward of ``x`` captured, then ``drop()`` (something PyTorch or a cache
    may free), the freed memory handed back and written over (``count`` tensors of
    ``elements`` -1s), and a replay: the bits of the forward without graphs."""
    with step_graphs(False), torch.no_grad():
        expected = layer(x)
    with step_graphs(True), torch.no_grad():
        for _ in range(2):
            layer(x)
        drop()
        torch.cuda.empty_cache()
        litter = [torch.full((elements,), -1.0, device=x.device) for _ in range(count)]
        before = STEP_GRAPHS.replays
        assert torch.equal(layer(x), expected)
        assert STEP_GRAPHS.replays == before + 1
        del litter


def test_grouped_copies_move_each_dtypes_bits_and_skip_absent_or_empty_pairs() -> None:
    """`copy_grouped` copies every pair whose tensors exist (NaN payloads and -0.0 as they
    are; even element sizes as int16 words, others by their dtype, a 0-d tensor and a
    transposed one too),
    leaves a pair with a None alone; `fresh_copies` returns new tensors with the outputs'
    bits and an empty output as it is."""
    bits = torch.tensor([0x7FC1, -0x8000, 0x3F80, -0x007F], dtype=torch.int16)  # NaN, -0.0, 1, NaN
    words = torch.tensor([0x7FC00001, -0x80000000, 5], dtype=torch.int32)
    sources = [
        bits.view(torch.bfloat16),
        words.view(torch.float32),
        torch.arange(3, dtype=torch.int64).reshape(3, 1) - 2**40,
        torch.tensor([1, 255, 7], dtype=torch.uint8),
        torch.tensor(3, dtype=torch.int64),
        torch.arange(6, dtype=torch.float32).reshape(2, 3).T,  # last axis not dense
    ]
    targets = [torch.zeros_like(each) for each in sources]  # (strides kept)
    untouched = torch.full((2,), 7.0)
    copy_grouped([*targets, untouched, None], [*sources, None, torch.ones(2)])
    assert_copied_bits(targets, sources)
    assert torch.equal(untouched, torch.full((2,), 7.0))
    empty = torch.empty(0)
    outputs = [targets[0], empty, targets[2]]
    copies = fresh_copies(outputs)
    assert copies[1] is empty
    assert torch.equal(copies[0].view(torch.int16), bits)
    assert torch.equal(copies[2], sources[2])
    pairs = zip(copies, outputs, strict=True)
    assert all(c.data_ptr() != o.data_ptr() for c, o in pairs if o.numel())


def copy_sources() -> list[Tensor]:
    """Tensors of each kind `copy_grouped` copies: NaN payloads of both signs and -0.0 in
    bf16, fp16 and fp32, a transposed bf16 tensor holding a NaN, 0-d tensors, float8 and
    bool."""
    bits = torch.tensor([0x7FC1, -0x8000, 0x3F80, -0x007F], dtype=torch.int16)
    return [
        bits.view(torch.bfloat16),
        bits.view(torch.float16),
        torch.tensor([0x7FC00001, -0x80000000, 5], dtype=torch.int32).view(torch.float32),
        bits.repeat(3).view(torch.bfloat16).reshape(2, 6).T,  # last axis not dense
        torch.tensor(0x7F81, dtype=torch.int16).view(torch.bfloat16),  # a 0-d NaN
        torch.tensor(3, dtype=torch.int64),
        torch.tensor([0x7F, 0x80, 1], dtype=torch.uint8).view(torch.float8_e4m3fn),
        torch.tensor([True, False]),
    ]


def assert_copied_bits(targets: list[Tensor], sources: list[Tensor]) -> None:
    """Each target holds its source's bytes, in its dtype, shape and strides."""
    for target, source in zip(targets, sources, strict=True):
        assert target.dtype == source.dtype and target.shape == source.shape
        assert target.stride() == source.stride()
        raw = target.reshape(-1).view(torch.uint8), source.reshape(-1).view(torch.uint8)
        assert torch.equal(*raw)


def test_grouped_copies_copy_integers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group `copy_grouped` hands ``torch._foreach_copy_`` is of an integer dtype: on
    CUDA its kernel copies a floating dtype through the dtype's math type (a bf16 NaN's
    payload lost: not the eager step's bits) and refuses the float8 dtypes."""
    groups: list[torch.dtype] = []
    copy = torch._foreach_copy_

    def recorded(into: list[Tensor], of: list[Tensor]) -> None:
        groups.extend({each.dtype for each in into} | {each.dtype for each in of})
        copy(into, of)

    monkeypatch.setattr(torch, "_foreach_copy_", recorded)
    sources = copy_sources()
    targets = [torch.zeros_like(each) for each in sources]
    copy_grouped(targets, sources)
    assert_copied_bits(targets, sources)
    assert groups and all(not dtype.is_floating_point and dtype != torch.bool for dtype in groups)


@GPU
def test_grouped_copies_move_every_dtypes_bits_on_the_gpu() -> None:
    """On CUDA (``torch._foreach_copy_``'s own kernel): NaN payloads of a transposed and a
    0-d bf16 tensor, float8 and bool copied bit for bit, in and out (`fresh_copies`)."""
    sources = [each.cuda() for each in copy_sources()]
    targets = [torch.zeros_like(each) for each in sources]
    copy_grouped(targets, sources)
    assert_copied_bits(targets, sources)
    assert_copied_bits(fresh_copies(sources), sources)
