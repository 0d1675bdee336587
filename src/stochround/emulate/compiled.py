"""Emulation at compiled speed: a `torch.compile` backend that rounds each floating op's
outputs as an eager emulation (`Emulation`) does, inside the kernels Inductor generates.

``torch.compile(model, backend=stochround.emulate.backend("bfloat16", "sr", seed=0))``:
AOTAutograd traces the forward and backward ATen graphs (no decomposition: the ops an
eager emulation sees), each graph is traced again with every rounded op followed by its
rounding written in tensor operations (`graph_rounding.rounded`), and Inductor compiles
the result, fusing each rounding into the kernel that produces its input.  The emulation
guide (docs/guide/emulate.md, "Compiled emulation") states the contract: the same bits as
the eager emulation of the same arguments, offset for offset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.fx import GraphModule, Interpreter, Node

from ..formats import Format
from .dispatch import Emulation
from .graph_rounding import Rounding, rounded
from .graph_words import register_lowering
from .opaque import KEPT_DECOMPOSITIONS, needs_opaque, opaque_op, register_lowerings
from .ops import aten, converts, each_output, op_kind

# a graph's ops whose outputs an eager emulation sees in another form: AOTAutograd writes an
# in-place op on a graph input as its functional op followed by this copy back, and the eager
# emulation rounds the in-place op once (the functional op's rounding here)
_COPY_BACK = aten.copy_.default

# ops whose floating output holds, element by element, either a value of the argument at
# the position given or zero: on an argument whose values its format holds (a rounding's
# output, or a view of one) and a format with a zero, their output is in the format too and
# its rounding returns it unchanged in every mode (no fraction to round; the format is
# one its dtype holds, `ops.target_formats`, so nothing is clamped), so the graph numbers
# that rounding (draws its offset) without computing it
_SELECTING = {aten.relu.default: 0, aten.threshold_backward.default: 0}


class EmulationBackend:
    """A `torch.compile` backend that emulates ``fmt`` with ``mode`` (the arguments as
    `emulate` takes them; `backend` checks them).  ``calls``: the tensors rounded so far,
    the counter an eager `Emulation` keeps: each run of a compiled graph rounding F tensors
    draws offsets ``calls .. calls + F - 1`` in graph order and advances it by F."""

    def __init__(self, emulation: Emulation) -> None:
        self.emulation = emulation
        self.rounding = Rounding(
            emulation.mode,
            32 if emulation.rbits is None else int(emulation.rbits),
            emulation.variant,
            emulation.key,
        )
        self._offsets: dict[torch.device, OffsetInputs] = {}

    def _offsets_on(self, device: torch.device) -> OffsetInputs:
        """The `OffsetInputs` of the graphs on ``device`` (one for all of them: a step's
        forward and backward graphs read one block)."""
        offsets = self._offsets.get(device)
        if offsets is None:
            offsets = self._offsets[device] = OffsetInputs(device)
        return offsets

    @property
    def calls(self) -> int:
        """The roundings drawn so far (the next one's offset)."""
        return self.emulation.calls

    def __call__(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._functorch import config as functorch_config
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._functorch.partitioners import default_partition

        # no common-subexpression elimination: two equal ops are two roundings eagerly
        with functorch_config.patch(cse=False):
            return aot_module_simplified(
                gm,
                example_inputs,
                fw_compiler=self._compile,
                bw_compiler=self._compile,
                partition_fn=default_partition,
                decompositions={},
                keep_inference_input_mutations=True,
            )

    def _compile(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """One ATen graph (forward, backward or inference) traced again with its roundings,
        compiled by Inductor; the callable it returns advances the counter per run."""
        from torch._inductor.compile_fx import compile_fx_inner

        traced, count, inputs = self._with_roundings(gm, example_inputs)
        register_lowering()  # SR's words: one compact elementwise node (graph_words)
        register_lowerings()  # the opaque ops: calls of their ATen ops
        compiled = compile_fx_inner(traced, inputs)
        offsets = self._offsets_on(_graph_device(example_inputs))

        def run(args: list[Any]) -> Any:
            base = offsets.at(self.emulation.calls)
            self.emulation.calls += count
            arguments = list(args)
            args.clear()  # a boxed call: the callee owns the inputs
            return compiled([*arguments, base])

        # the runtime's frames are not traced by Dynamo (a backward run after a graph break
        # would be): they call compiled code
        guarded = torch._disable_dynamo(run)
        guarded._boxed_call = True  # type: ignore[attr-defined]
        return guarded

    def _with_roundings(
        self, gm: GraphModule, example_inputs: Sequence[Any]
    ) -> tuple[GraphModule, int, list[Any]]:
        """``gm`` traced again (make_fx) with one more input, the offset of its first
        rounding, and each rounded output followed by its rounding; and how many it has."""
        from torch._guards import detect_fake_mode
        from torch._inductor.decomposition import select_decomp_table
        from torch.fx.experimental.proxy_tensor import make_fx

        interpreter = _RoundingInterpreter(gm, self)

        def body(*args: Any) -> Any:
            interpreter.count = 0
            interpreter.held = {}
            interpreter.base = args[-1]
            return interpreter.run(*args[:-1])

        table = {op: f for op, f in select_decomp_table().items() if op not in KEPT_DECOMPOSITIONS}
        fake_mode = detect_fake_mode(example_inputs)
        if fake_mode is None:
            inputs = [*example_inputs, _offset_example(example_inputs)]
            traced = make_fx(body, table, tracing_mode="fake")(*inputs)
        else:
            with fake_mode:
                inputs = [*example_inputs, _offset_example(example_inputs)]
                traced = make_fx(body, table, tracing_mode="real")(*inputs)
        return traced, interpreter.count, inputs

    def rounded(self, x: Tensor, target: Format, offset: Tensor) -> Tensor:
        """x rounded to ``target`` at stream offset ``offset`` (an int64 tensor)."""
        return rounded(x, target, self.rounding, offset)


class _RoundingInterpreter(Interpreter):
    """Runs an ATen graph op by op, rounding each op's floating outputs as
    `Emulation._emulated` does (mode "native", accumulate "once"), numbering the roundings
    from ``base`` in the order the graph runs them.  ``held``: the nodes whose output its
    format already holds (a rounding's output, a view of one, `_SELECTING` of one), the
    format each: an op of `_SELECTING` on one is not rounded again (same bits, less work)."""

    def __init__(self, gm: GraphModule, backend: EmulationBackend) -> None:
        super().__init__(gm)
        self.backend = backend
        self.emulation = backend.emulation
        self.count = 0
        self.base: Tensor | None = None
        self.node: Node | None = None
        self.held: dict[Node, Format] = {}

    def run_node(self, n: Node) -> Any:
        self.node = n
        return super().run_node(n)

    def _native(
        self, target: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """The op as the ATen kernel computes it (`opaque_op` where Inductor would not)."""
        assert self.node is not None
        if needs_opaque(target, self.node.meta.get("val")):
            return opaque_op(target)(*args, **kwargs)
        return target(*args, **kwargs)

    def _next(self, x: Tensor, target: Format) -> Tensor:
        assert self.base is not None
        offset = self.base + self.count
        self.count += 1
        return self.backend.rounded(x, target, offset)

    def _output(self, out: Tensor) -> Tensor:
        target = self.emulation.formats.get(out.dtype)
        return out if target is None else self._next(out, target)

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not isinstance(target, torch._ops.OpOverload) or target is _COPY_BACK:
            return super().call_function(target, args, kwargs)
        kind = op_kind(target)
        if kind.aliases_only:
            view = super().call_function(target, args, kwargs)
            self._hold_as(0, view)
            return view
        if not self.emulation.selected(target):
            return self._native(target, args, kwargs)
        if target in _SELECTING:
            return self._selected(target, args, kwargs)
        if kind.lays_out:
            if converts(target, args, kwargs):
                return self._converted(target, args, kwargs)
            return super().call_function(target, args, kwargs)
        if kind.mutated_positions:
            raise ValueError(
                f"the compiled emulation met {target}, an op that mutates its arguments, in "
                "a functional graph; run this program under the eager emulate"
            )
        out = each_output(self._output, self._native(target, args, kwargs))
        if isinstance(out, Tensor):
            self._hold(out)
        return out

    def _hold(self, out: Tensor) -> None:
        """Records that the current node's output, just rounded, is in its format."""
        target = self.emulation.formats.get(out.dtype)
        if target is not None and self.node is not None:
            self.held[self.node] = target

    def _hold_as(self, position: int, out: Any) -> None:
        """The current node's output ``out`` holds the values of its argument at
        ``position`` (a view, a selection): in that argument's format, if it is in one and
        ``out`` has its dtype (a view as another dtype reads other values from its bits)."""
        assert self.node is not None
        source = self.node.args[position] if len(self.node.args) > position else None
        if not (isinstance(source, Node) and source in self.held and isinstance(out, Tensor)):
            return
        value = self.env.get(source)
        if isinstance(value, Tensor) and value.dtype == out.dtype:
            self.held[self.node] = self.held[source]

    def _selected(
        self, target: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """An op of `_SELECTING`: rounded as any other unless its argument is in the output's
        format (one with a zero); then its offset drawn and the rounding, which would return
        the output unchanged, left out."""
        out = self._native(target, args, kwargs)
        target_format = self.emulation.formats.get(out.dtype)
        if target_format is None:
            return out
        self._hold_as(_SELECTING[target], out)
        assert self.node is not None
        if self.held.get(self.node) == target_format and target_format.subnormals:
            self.count += 1
            return out
        rounded_out = self._next(out, target_format)
        self._hold(rounded_out)
        return rounded_out

    def _converted(
        self, target: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A conversion (``_to_copy`` or ``copy`` into another dtype) as the eager emulation
        computes it: the source rounded once, in float64, to the destination's format (if
        its dtype has one), then converted exactly."""
        if target.overloadpacket is aten._to_copy:
            source, destination_dtype = args[0], kwargs["dtype"]
        else:
            source, destination_dtype = args[1], args[0].dtype
        cast_target = self.emulation.cast_format(destination_dtype)
        if cast_target is None:
            return target(*args, **kwargs)
        wide = self._next(source.to(torch.float64), cast_target)
        if target.overloadpacket is aten._to_copy:
            return target(wide, *args[1:], **kwargs)
        return target(args[0], wide, *args[2:], **kwargs)


# the offsets one block of `OffsetInputs` holds: a new block (three launches on a GPU) once in
# this many roundings; 16 bytes an offset, so a block costs 1 MiB of device memory
OFFSETS_PER_BLOCK = 2**16
# the bytes between two offsets of a block: Inductor's GPU code assumes an input aligned to
# 16 bytes where its example was, and copies one that is not before each run (a launch)
OFFSET_SPACING = 16 // torch.int64.itemsize


class OffsetInputs:
    """The offset input of a compiled graph's runs on one device, without a launch a run:
    ``at(k)`` is a 0-d int64 tensor holding k, a view into a block of consecutive offsets
    made once (``start .. start + OFFSETS_PER_BLOCK - 1``, one every `OFFSET_SPACING`
    elements so that each view is 16-byte aligned), made again where k is outside it (the
    counter moved past the block, or was set back).  A ``torch.full`` a run instead costs
    a GPU step a launch and an allocation per graph: two a training step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = self.count = 0  # the block's first offset, and how many it holds
        self.block = torch.empty(0, dtype=torch.int64, device=device)

    def at(self, offset: int) -> Tensor:
        """A 0-d int64 tensor on the device holding ``offset`` (an int in [0, 2**63))."""
        index = offset - self.start
        if not 0 <= index < self.count:
            self.block = offset_block(offset, self.device)
            self.start, self.count, index = offset, self.block.numel() // OFFSET_SPACING, 0
        return self.block[index * OFFSET_SPACING]


def offset_block(start: int, device: torch.device) -> Tensor:
    """Offsets ``start, start + 1, ...`` (`OFFSETS_PER_BLOCK` of them, fewer where they
    would pass 2**63 - 1), each repeated `OFFSET_SPACING` times: a 1-D int64 tensor."""
    count = min(OFFSETS_PER_BLOCK, 2**63 - start)
    if count <= 0:
        raise ValueError(f"the compiled emulation's offsets are int64: its counter reached {start}")
    steps = torch.arange(count * OFFSET_SPACING, dtype=torch.int64, device=device)
    return (steps // OFFSET_SPACING).add_(start)


def _graph_device(example_inputs: Sequence[Any]) -> torch.device:
    """The device of a graph's tensor inputs (the CPU for a graph without one)."""
    for value in example_inputs:
        if isinstance(value, Tensor) and value.device.type != "cpu":
            return value.device
    return torch.device("cpu")


def _offset_example(example_inputs: Sequence[Any]) -> Tensor:
    """An example of the offset input: an int64 scalar on the graph's device."""
    return torch.zeros((), dtype=torch.int64, device=_graph_device(example_inputs))


# the options of `emulate` that only the eager emulation computes, and the one value of each
# that the backend takes (the eager default)
_EAGER_ONLY: dict[str, object] = {
    "compute": "native",
    "accumulate": "once",
    "round_inputs": False,
    "hardware": None,
}


def backend(
    fmt: Any,
    mode: str = "rne",
    *,
    seed: int | None = None,
    ops: str | Callable[[torch._ops.OpOverload], bool] = "all",
    rbits: int | None = None,
    variant: str = "c",
    compute: str = "native",
    accumulate: str = "once",
    round_inputs: bool = False,
    hardware: object = None,
) -> EmulationBackend:
    """A `torch.compile` backend under which a compiled program computes as under
    ``emulate(fmt, mode, seed=seed, ops=ops, rbits=rbits, variant=variant)``, bit for bit,
    with Inductor's speed: ``torch.compile(model, backend=backend("bfloat16", "sr",
    seed=0))``.  ``compute``, ``accumulate``, ``round_inputs`` and ``hardware`` take their
    defaults only (ValueError naming the argument otherwise): the eager emulation alone
    computes the others."""
    given = {
        "compute": compute,
        "accumulate": accumulate,
        "round_inputs": round_inputs,
        "hardware": hardware,
    }
    for name, value in given.items():
        default = _EAGER_ONLY[name]
        if value != default:
            raise ValueError(
                f"the compiled emulation takes {name}={default!r} only; got {name}={value!r}: "
                f"run with {name}={value!r} under the eager emulate"
            )
    emulation = Emulation(fmt, mode, seed=seed, ops=ops, rbits=rbits, variant=variant)
    return EmulationBackend(emulation)


__all__ = ["EmulationBackend", "OffsetInputs", "backend", "offset_block"]
