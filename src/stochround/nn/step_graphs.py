"""CUDA graphs of a quantized layer's two step functions (`stochround.nn.opaque_matmul`'s
forward and backward), captured per call signature and replayed: a step's dozen launches,
and the host time around each, become one graph launch and a copy or two
(docs/guide/recipes.md, "CUDA graphs of a layer's step"), and a delayed layer's
(`stochround.nn.delayed_steps`).  On by default; off with ``use_step_graphs(False)`` or
``STOCHROUND_STEP_GRAPHS=0`` (they cost device memory: below).

The functions are pure functions of their tensors and hashable arguments: no host state
changes and no host read of a device value; what the host must learn of a call it is told
by notes (`host_note`), a function of the call's key, which a graph keeps from its capture
and gives again at each replay.  So a graph captured on static input tensors computes,
replayed, what the function computes for whatever those tensors hold then.  A function
that writes some of its tensors (``mutates``: their positions, a delayed layer's amax
history) has them copied back from a graph of copies after each replay (one grouped
launch), so that every graph leaves the call's tensors as the function would.  A call's key
is its tensors' shapes, strides and dtypes and its ints; the first call of a key runs
eagerly, the second captures (on a side stream, after one eager run there so that
per-stream state is made outside the capture) and every later one replays: the eager bits
(the same kernels on the same values; tested equal).  That graph holds copies of its
inputs, which each replay copies the call's tensors into (one grouped launch).  Besides,
a call whose tensors lie where a call of its key had them before (a training loop's
allocations repeat step after step) gets a graph of its own that reads them in place, with
no copy in: each layer of a shape then replays its own graph, and the key's graph of copies
serves the calls whose addresses do not repeat, and a layer's calls once it has
`IN_PLACE_PER_LAYER` graphs of its own (a model whose allocations do not settle would
otherwise capture at every step).  The outputs live in the graphs' shared
pool, which the next replay overwrites: a call returns copies (one grouped launch).

A graph keeps what its replays read: its static inputs, its pool, the cached objects its
kernels read (`kept_by_graphs`), its own cuBLAS workspace (PyTorch's workspaces are
dropped around a capture, as inductor's graphs do).  That costs device memory: each graph
holds its outputs and, unless it reads in place, a copy of its inputs (x, W, dy), up to
`MAX_GRAPHS` graphs and `MAX_GRAPH_BYTES` of copies (the least recently replayed dropped
first), one per signature (a new token count is a new signature).

Not graphed (run as they are): CPU tensors; non-contiguous tensors; calls on any stream
but the device's default one (a user's CUDA graph and its warm-up, torch.compile's
``mode="reduce-overhead"``, whose warm-up allocates from its own pool on its own stream,
where a graph captured then would leave its inputs for later replays to read once freed,
and whose recording captures the launches into its graph); steps of more than
`GRAPHED_MAX_WORK` (device-bound: a graph saves nothing there and the copies cost), except
host-bound ones (`fp8(native=True)`: its GEMMs on the FP8 tensor cores leave the device
idle behind the host), which replay graphs reading in place, never copies; keys
whose warm-up synchronized (run under PyTorch's sync debug mode "error": a host read
would break the capture) or failed; anything while `use_step_graphs` is off.  A capture
that fails inside CUDA leaves PyTorch's allocator and generator in their capture state
(PyTorch ends it only on success): the graphs turn themselves off, with a warning.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .graph_copies import CopyPlan, copy_from, copy_into, copy_plan, fresh_copies
from .graph_notes import KEEPING, host_note, noting

# tokens * in_features * out_features of a step above which its layer runs eagerly: the
# step's device time then exceeds its host time, and a graph would only add its copies
GRAPHED_MAX_WORK = 2**35
# graphs kept (the least recently replayed dropped first), the device memory their copies
# of inputs and outputs may hold together, and keys remembered as seen once
MAX_GRAPHS = 256
MAX_GRAPH_BYTES = 2**32
MAX_SEEN = 1024
# in-place graphs captured for one layer and key (one set of its tensors' addresses each):
# a model whose allocations have not settled (each capture moves those of the steps after
# it) gives a layer's activations new addresses step after step, each of which would be
# captured in turn; past this many its key's graph of copies serves it
IN_PLACE_PER_LAYER = 3


class Captured(NamedTuple):
    """A captured call: its graph, the static copies it reads (None where the call had no
    tensor, and every entry None where the graph reads the call's own tensors in place),
    the output tensors it writes (in the graphs' pool), whether the function returned one
    tensor (else a list), the cached objects whose device memory its kernels read
    (`kept_by_graphs`), its device's index, the addresses an in-place graph reads (None
    for a graph of copies), the plans of its copies in (None in place) and out, the
    host notes its capture made (`host_note`), which each replay gives again, and the plan
    of the copies back into the call's tensors the function writes (None in place or
    where it writes none: `captured_call`)."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor | None, ...]
    outputs: tuple[Tensor, ...]
    single: bool
    kept: tuple[object, ...]
    device: int
    addresses: tuple[int, ...] | None = None
    copy_in: CopyPlan | None = None
    copy_out: CopyPlan = CopyPlan(())
    notes: tuple[object, ...] = ()
    copy_back: CopyPlan | None = None


def call_key(tensors: Sequence[Tensor | None], rest: tuple[object, ...]) -> tuple:
    """What a graph of the call is valid for: each tensor's shape, strides, dtype and
    device (None where absent), and the other arguments (lists as tuples)."""
    layouts = tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors
    )
    return (layouts, tuple(tuple(r) if isinstance(r, list) else r for r in rest))


def graph_outputs(result: Tensor | list[Tensor]) -> tuple[tuple[Tensor, ...], bool]:
    """A function's result as a tuple of tensors and whether it was one tensor."""
    if isinstance(result, Tensor):
        return (result,), True
    return tuple(result), False


class StepGraphs:
    """The captured graphs of the step functions, by call key (module docstring)."""

    def __init__(self) -> None:
        self.enabled = False
        self.graphs: OrderedDict[tuple, Captured] = OrderedDict()
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.failed: set[tuple] = set()
        self.replays = 0
        self.captures = 0  # graphs captured and kept, ever (a model's churn shows here)
        # in-place captures by (key, layer address), the least recently counted forgotten
        # beyond `MAX_SEEN` (`claim_in_place`)
        self.in_place_by_layer: OrderedDict[tuple, int] = OrderedDict()
        self.crowded = False  # an in-place graph did not fit: no more are captured
        self.bytes = 0  # held by the kept graphs' copies (`captured_bytes`)
        self.lock = threading.Lock()  # forwards and the autograd engine's backward thread
        self.pools: dict[int, Any] = {}  # each device's pool handle (torch's own type)
        self.streams: dict[int, torch.cuda.Stream] = {}

    def clear(self) -> None:
        """Drop every graph and every key seen.  Their pools go with them: a pool whose
        graphs are all gone is released, and capturing into its handle again fails."""
        with self.lock:
            self.graphs.clear()
            self.bytes = 0
            self.seen.clear()
            self.failed.clear()
            self.in_place_by_layer.clear()
            self.crowded = False
            self.pools.clear()

    def run(
        self,
        function: Callable[..., Any],
        tensors: Sequence[Tensor | None],
        rest: tuple[object, ...],
        work: int,
        host_bound: bool = False,
        mutates: tuple[int, ...] = (),
        layer: Tensor | None = None,
    ) -> Any:
        """``function(*tensors, *rest)``, replayed from a graph captured for the call's key
        where one is kept, run eagerly otherwise (outside the lock: the forward's and the
        backward engine's threads do not wait on it).  ``host_bound``: whether the step's
        device time stays below its host time above `GRAPHED_MAX_WORK` too (`serves`);
        ``mutates``: the positions of the tensors the function writes in place (a delayed
        layer's amax history): a graph of copies writes its static copies of them, which
        each replay copies back into the call's (`captured_call`), so that any graph serves
        the call as its run would (a graph reading in place writes them where they lie);
        what a capture's own runs write is undone before its first replay
        (`capture_call`); ``layer``: the tensor whose address names the calling layer (its
        weight), whose key takes at most `IN_PLACE_PER_LAYER` in-place graphs.

        A key has a graph of copies, captured at its second call, which serves any call;
        and a graph reading the call's tensors in place for each set of addresses seen
        twice (a training loop's allocations repeat step after step, so each layer of a
        shape finds its own), until one would not fit under `MAX_GRAPHS` and
        `MAX_GRAPH_BYTES` (`keep`; from then on the graphs of copies serve: in-place
        graphs evicting each other would capture at every step), and up to
        `IN_PLACE_PER_LAYER` for one layer (`claim_in_place`)."""
        if not self.serves(tensors, work, host_bound):
            return function(*tensors, *rest)
        # above the bound, in place only (no copy of the inputs)
        copies = work <= GRAPHED_MAX_WORK
        # the host setting the captured fp32 products were made under (TF32 or not)
        key = (call_key(tensors, rest), torch.get_float32_matmul_precision())
        here, anywhere = (key, tensor_addresses(tensors)), (key, None)
        owner = None if layer is None else (key, layer.data_ptr())
        with self.lock:
            captured = None if key in self.failed else self.graphs.get(here)
            if captured is not None:
                self.graphs.move_to_end(here)
            elif key not in self.failed:
                if here in self.seen and self.room_in_place() and self.claim_in_place(owner):
                    captured = self.capture_call(function, tensors, rest, here, mutates)
                else:
                    self.remember(here)
                    if copies:
                        captured = self.graphs.get(anywhere)
                        if captured is not None:
                            self.graphs.move_to_end(anywhere)
                            copy_into(captured.copy_in, tensors)  # type: ignore[arg-type]
                        elif anywhere in self.seen:
                            captured = self.capture_call(function, tensors, rest, anywhere, mutates)
                        else:
                            self.remember(anywhere)
            if captured is not None:
                captured.graph.replay()
                self.replays += 1
                if captured.copy_back is not None:  # what the function wrote, written back
                    copy_from(captured.copy_back, tensors)  # type: ignore[arg-type]
                for value in captured.notes:
                    host_note(value)
                outputs = fresh_copies(captured.outputs, captured.copy_out)
                return outputs[0] if captured.single else outputs
        return function(*tensors, *rest)

    def serves(self, tensors: Sequence[Tensor | None], work: int, host_bound: bool = False) -> bool:
        """Whether a call may be graphed (module docstring): `serves_layouts`, and on the
        device's default stream."""
        return self.serves_layouts(tensors, work, host_bound) and on_default_stream(
            device_index(tensors)
        )

    def serves_layouts(
        self, tensors: Sequence[Tensor | None], work: int, host_bound: bool = False
    ) -> bool:
        """Whether a call of these tensors may be graphed on the device's default stream:
        on, CUDA, not above `GRAPHED_MAX_WORK` unless ``host_bound`` (a step whose device
        time stays below its host time there: FP8 tensor-core GEMMs; graphed in place only,
        since copies of its inputs would cost more than they save), and every tensor
        contiguous (a graph's static copy of a strided or expanded tensor would be laid out
        otherwise, and a sum over it could run in another order).  It reads no stream, so
        torch.compile traces it (`opaque_matmul.keeps_operands`)."""
        first = tensors[0]
        return (
            first is not None
            and first.is_cuda
            and self.enabled  # read after the device: a CPU trace does not guard it
            and (work <= GRAPHED_MAX_WORK or host_bound)
            and all(t is None or t.is_contiguous() for t in tensors)
        )

    def room_in_place(self) -> bool:
        """Whether an in-place graph may be captured: none has failed to fit yet (`keep`),
        fewer than `MAX_GRAPHS` are kept and their copies hold less than
        `MAX_GRAPH_BYTES`."""
        return not self.crowded and len(self.graphs) < MAX_GRAPHS and self.bytes < MAX_GRAPH_BYTES

    def claim_in_place(self, owner: tuple | None) -> bool:
        """Whether the layer ``owner`` names (its call's key and its weight's address; None:
        no layer, no bound) may have one more in-place graph: fewer than
        `IN_PLACE_PER_LAYER` captured for it so far.  Counts the capture it allows (the
        count stays when a graph is dropped: a layer whose graphs evict each other would
        otherwise capture at every step)."""
        if owner is None:
            return True
        count = self.in_place_by_layer.get(owner, 0)
        if count >= IN_PLACE_PER_LAYER:
            return False
        put_newest(self.in_place_by_layer, owner, count + 1)
        return True

    def remember(self, graph_key: tuple) -> None:
        """Note ``graph_key`` (a key and its tensors' addresses, or None for any) as seen
        once, as the newest (the least recently seen forgotten beyond `MAX_SEEN`: a key seen
        at every step stays while fewer than `MAX_SEEN` others come between)."""
        put_newest(self.seen, graph_key, None)

    def capture_call(
        self,
        function: Callable[..., Any],
        tensors: Sequence[Tensor | None],
        rest: tuple[object, ...],
        graph_key: tuple,
        mutates: tuple[int, ...],
    ) -> Captured | None:
        """`capture`, the call's tensors at ``mutates`` left as the call gave them and a
        graph of copies' static copies set to them again: the capture's warm-up run writes
        the tensors its graph reads (the call's own, in place), and the replay (or the run,
        where the capture failed) that serves the call follows, which would otherwise write
        them a second time (a history's record is the same twice; another function's need
        not be)."""
        before = [
            (at, t.clone()) for at, t in enumerate(tensors) if at in mutates and t is not None
        ]
        captured = self.capture(function, tensors, rest, graph_key, mutates)
        for at, value in before:
            tensors[at].copy_(value)  # type: ignore[union-attr]
        if captured is not None and captured.copy_in is not None and before:
            copy_into(captured.copy_in, tensors)  # type: ignore[arg-type]
        return captured

    def capture(
        self,
        function: Callable[..., Any],
        tensors: Sequence[Tensor | None],
        rest: tuple[object, ...],
        graph_key: tuple,
        mutates: tuple[int, ...] = (),
    ) -> Captured | None:
        """The call captured as a graph on the device's capture stream into the shared
        pool, kept under ``graph_key`` (the call's key and its tensors' addresses, or
        None), reading the call's tensors where they lie (addresses given) or copies of
        them that each replay copies the call's tensors into (and those at ``mutates``
        back out: `captured_call`); None, and the key marked
        failed, where anything before the capture fails (a synchronizing
        operation in the warm-up, which runs under PyTorch's sync debug mode "error", or
        memory).  A capture that fails inside CUDA leaves PyTorch's allocator and
        generator in their capture state (PyTorch ends it only on success): the graphs are
        turned off, with a warning."""
        key, in_place = graph_key[0], graph_key[1] is not None
        device = device_index(tensors)
        stream = self.streams.get(device)
        if stream is None:
            stream = self.streams[device] = torch.cuda.Stream(device)
        if device not in self.pools:
            self.pools[device] = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(device)
        graph = torch.cuda.CUDAGraph()
        kept: list[object] = []
        try:
            # the graph's inputs: the call's tensors, or copies of them in the regular
            # allocator's memory (contiguous: `serves`), then one eager run on the capture
            # stream so that per-stream state is made outside the capture
            inputs = tuple(
                t if in_place or t is None else torch.empty_like(t).copy_(t) for t in tensors
            )
            stream.wait_stream(current)
            # (its notes dropped: the replay after the capture gives the capture's)
            with torch.cuda.stream(stream), synchronizing_raises(), noting():
                function(*inputs, *rest)
        except Exception:  # not capturable (a host read), or out of memory: eager
            current.wait_stream(stream)
            self.failed.add(key)
            return None
        with torch.cuda.stream(stream):
            # cuBLAS's workspace for this stream made inside the capture, in the graph's
            # pool, and not kept in PyTorch's map after it (as inductor's graphs do): a
            # workspace the map owns could be freed under the graph's replays
            clear_cublas_workspaces()
            graph.capture_begin(self.pools[device], capture_error_mode="thread_local")
            KEEPING.objects = kept
            try:
                with noting() as notes:
                    result = function(*inputs, *rest)
            except Exception:
                result = None
            finally:
                KEEPING.objects = None
            try:
                graph.capture_end()
            except RuntimeError as error:
                result = None
                self.enabled = False
                warnings.warn(
                    f"a quantized layer's step graph failed to capture ({error}); step "
                    "graphs are off from now on, and PyTorch's CUDA state may be left "
                    "mid-capture",
                    RuntimeWarning,
                    stacklevel=4,
                )
            clear_cublas_workspaces()
        current.wait_stream(stream)
        if result is None:
            self.failed.add(key)
            self.release_pool(device)  # the graph goes, and with it maybe the pool's last
            return None
        outputs, single = graph_outputs(result)
        captured = captured_call(
            graph, inputs, outputs, single, tuple(kept), device, graph_key[1], tuple(notes),
            mutates,
        )  # fmt: skip
        self.keep(graph_key, captured)
        return captured

    def keep(self, graph_key: tuple, captured: Captured) -> None:
        """``captured`` kept under ``graph_key``, the least recently replayed graphs dropped
        while more than `MAX_GRAPHS` are kept or their copies exceed `MAX_GRAPH_BYTES` (the
        new one stays).  An in-place graph that does not fit is not kept (the call replays
        it once), and no in-place graph is captured after it (`room_in_place`): each would
        evict another layer's, which would be captured again at the next step; its device's
        pool handle goes where no kept graph is on that device (`release_pool`)."""
        self.seen.pop(graph_key, None)
        size = captured_bytes(captured)
        if captured.addresses is not None and (
            len(self.graphs) >= MAX_GRAPHS or self.bytes + size > MAX_GRAPH_BYTES
        ):
            self.crowded = True
            self.release_pool(captured.device)
            return
        self.graphs[graph_key] = captured
        self.captures += 1
        self.bytes += size
        while len(self.graphs) > 1 and (
            len(self.graphs) > MAX_GRAPHS or self.bytes > MAX_GRAPH_BYTES
        ):
            self.drop(next(iter(self.graphs)))

    def drop(self, graph_key: tuple) -> None:
        """The graph kept under ``graph_key`` dropped; its device's pool handle goes with the
        device's last graph (`release_pool`)."""
        dropped = self.graphs.pop(graph_key)
        self.bytes -= captured_bytes(dropped)
        self.release_pool(dropped.device)

    def release_pool(self, device: int) -> None:
        """``device``'s pool handle forgotten where no kept graph is on it: once every graph
        captured into a pool is gone, PyTorch releases the pool, and a capture into its
        handle again fails (an internal assertion of the allocator); the next capture
        takes a new handle.  Called as a graph goes: dropped, not kept, or its capture
        failed."""
        if all(each.device != device for each in self.graphs.values()):
            self.pools.pop(device, None)


def put_newest(entries: OrderedDict[tuple, Any], key: tuple, value: object) -> None:
    """``entries[key] = value``, the key made the newest, the oldest forgotten beyond
    `MAX_SEEN` (the graphs' bounded memory of keys seen and of each layer's captures)."""
    entries[key] = value
    entries.move_to_end(key)
    if len(entries) > MAX_SEEN:
        entries.popitem(last=False)


def captured_call(
    graph: torch.cuda.CUDAGraph,
    inputs: tuple[Tensor | None, ...],
    outputs: tuple[Tensor, ...],
    single: bool,
    kept: tuple[object, ...],
    device: int,
    addresses: tuple[int, ...] | None,
    notes: tuple[object, ...],
    mutates: tuple[int, ...] = (),
) -> Captured:
    """The `Captured` of a graph that read ``inputs`` (the call's own tensors where
    ``addresses`` are given, else its static copies) and wrote ``outputs``: its plans of
    copies in and out and, for a graph of copies of a function that writes the tensors at
    positions ``mutates``, of the copies of those back into the call's tensors."""
    in_place = addresses is not None
    written = [t if at in mutates else None for at, t in enumerate(inputs)]
    return Captured(
        graph,
        (None,) * len(inputs) if in_place else inputs,  # no hold on the call's tensors
        outputs,
        single,
        kept,
        device,
        addresses,
        None if in_place else copy_plan(inputs),
        copy_plan(outputs),
        notes,
        None if in_place or not mutates else copy_plan(written),
    )


def tensor_addresses(tensors: Sequence[Tensor | None]) -> tuple[int, ...]:
    """Each tensor's address (0 for None): where an in-place graph reads them."""
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def captured_bytes(captured: Captured) -> int:
    """The device memory a graph's copies hold: its static inputs and its outputs."""
    tensors = [t for t in captured.inputs if t is not None] + list(captured.outputs)
    return sum(t.numel() * t.element_size() for t in tensors)


@contextlib.contextmanager
def synchronizing_raises() -> Iterator[None]:
    """PyTorch's CUDA sync debug mode "error" inside the block: an operation that waits
    for the device (a host read of a device value) raises, as it would break a capture."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def clear_cublas_workspaces() -> None:
    """PyTorch's cuBLAS and cuBLASLt workspaces dropped (the call inductor's CUDA graphs
    make around a capture); nothing where this PyTorch has no such call."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def on_default_stream(device: int) -> bool:
    """Whether the current stream of ``device`` is its default stream (module docstring:
    only there are steps graphed)."""
    # PyTorch's (stream id, device, type) triple, without the Stream object
    # `torch.cuda.current_stream` builds at each call (three calls a step)
    return torch._C._cuda_getCurrentStream(device)[0] == 0


def device_index(tensors: Sequence[Tensor | None]) -> int:
    """The CUDA device index of the call's first tensor."""
    first = tensors[0]
    assert first is not None
    return first.get_device()


# the environment variable that turns the step graphs off for a process (`use_step_graphs`)
ENVIRONMENT = "STOCHROUND_STEP_GRAPHS"


def enabled_by_environment(value: str | None) -> bool:
    """The step graphs' setting a process starts with: off where ``$STOCHROUND_STEP_GRAPHS``
    is "0", on where it is unset or "1" (ValueError for anything else)."""
    if value not in (None, "", "0", "1"):
        raise ValueError(f'{ENVIRONMENT} must be "0" or "1" (or unset); got {value!r}')
    return value != "0"


# the process's graphs: one set for every layer (keys are call signatures)
STEP_GRAPHS = StepGraphs()
STEP_GRAPHS.enabled = enabled_by_environment(os.environ.get(ENVIRONMENT))


def use_step_graphs(enabled: bool) -> bool:
    """Turn the CUDA graphs of quantized layers' steps on or off (on by default, or as
    ``$STOCHROUND_STEP_GRAPHS`` says); returns the previous setting.  Turning them off
    drops the captured graphs."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous = STEP_GRAPHS.enabled
    STEP_GRAPHS.enabled = enabled
    if not enabled:
        STEP_GRAPHS.clear()
    return previous


__all__ = [
    "ENVIRONMENT",
    "GRAPHED_MAX_WORK",
    "STEP_GRAPHS",
    "StepGraphs",
    "call_key",
    "captured_call",
    "enabled_by_environment",
    "on_default_stream",
    "tensor_addresses",
    "use_step_graphs",
]
