"""Shared test helpers: format lists, exact tensor comparison against scalar results, and the
`stochround` command run in-process with its tables read back."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

import stochround as sr
from stochround.kernels import availability
from stochround.nn import graph_copies, graph_notes, linear, opaque_matmul, step_graphs
from stochround.nn.layer_plan import running_gemms

# Every registered format, plus P3109 and CFloat8 formats that exercise p = 1, unsigned
# formats with infinities, all-subnormal grids and configurable biases.
TEST_FORMATS = [
    *sr.FORMATS,
    "p3109_k8p1se",
    "p3109_k8p3ue",
    "p3109_k8p4se",
    "p3109_k8p4sf",
    "p3109_k8p8sf",
    "p3109_k6p3sf",
    "p3109_k3p2sf",
    "cfloat8_e4m3_b20",
    "cfloat8_e5m2_b40",
]


def module_from_file(name: str, path: Path) -> types.ModuleType:
    """The Python file at ``path`` imported as module ``name`` (registered in
    ``sys.modules`` under that name, as an imported module is)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def assert_same_tensors(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Two runs' lists of tensors equal bit for bit, naming the first that is not."""
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(mine, theirs), f"tensor {index}"


def assert_same_values(actual: torch.Tensor, expected: list[float], context: str = "") -> None:
    """Bit-exact equality of float64 values: NaN matches NaN, zeros match by sign."""
    actual = actual.to(torch.float64).flatten().cpu()
    wanted = torch.tensor(expected, dtype=torch.float64)
    same = (actual.view(torch.int64) == wanted.view(torch.int64)) | (
        torch.isnan(actual) & torch.isnan(wanted)
    )
    if not bool(same.all()):
        bad = torch.nonzero(~same).flatten()[:5].tolist()
        detail = ", ".join(f"#{i}: got {actual[i].item()!r} want {wanted[i].item()!r}" for i in bad)
        raise AssertionError(f"{context}: {int((~same).sum())} mismatches; {detail}")


def all_bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 16-bit float dtype, in code order."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


def invoke(*args: str, columns: int = 200):
    """Run the `stochround` command in-process (typer's CliRunner); rich reads COLUMNS at
    each command, so wide tables do not wrap."""
    from stochround.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})


def ok(*args: str, columns: int = 200) -> str:
    """The command's standard output, after checking that it succeeded."""
    result = invoke(*args, columns=columns)
    assert result.exit_code == 0, result.output
    return result.stdout


def row(output: str, first_cell: str) -> list[str]:
    """The cells (split on runs of 2+ spaces) of the first table row starting with first_cell."""
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row starting with {first_cell!r} in:\n{output}")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_demo_report(output: str, out: Path) -> None:
    """What `stochround demo` printed (``output``, 200 columns wide) and wrote to ``out``:
    the numbers of the quick experiments with the default seed, in the experiments' own
    bands (tests/experiments/test_experiments.py derives them), and every registered
    experiment, in order, in results.json and report.md with its figures as PNG files.
    Checked on the demo run in-process (tests/cli/test_experiments.py) and on the
    README's main job in a fresh environment (tests/test_packaging.py, CI's first run)."""
    from stochround.experiments import EXPERIMENTS

    assert row(output, "sr")[3] == "+0.000000"  # exact SR is unbiased
    assert row(output, "rne")[1] == "1.25"
    # stagnation: 1 + 0.001, 1000 times, bf16 (the first "bf16" row)
    stagnation = row(output, "bf16")
    assert stagnation[1] == "1.0"
    mean, std = (float(v) for v in stagnation[2].split(" ± "))
    assert 1.9 <= mean <= 2.1
    assert 0 < std < 0.2  # per-step variance <= ulp^2 / 4, ulp <= 2^-6: std <= 0.25
    # summation: rne's slope ~1 (n u), SR's ~0.5 (sqrt(n) u)
    assert 0.9 <= float(row(output, "bf16 rne")[2]) <= 1.35
    assert 0.35 <= float(row(output, "bf16 sr")[2]) <= 0.65
    # hardware units: documented exact SR, zero bias
    assert row(output, "amd-mi300-fp8")[3] == "0"
    # the time is printed, not asserted: speed goals live in benchmarks, and a loaded CI
    # machine runs the demo several times slower than an idle one
    assert re.search(r"demo took \d+\.\d s", output)
    payload = json.loads((out / "results.json").read_text())
    # gradient descent (from the JSON: its wide table wraps in a narrow terminal): SR's
    # final loss at least 10x below rne's in bf16
    descent = payload["gradient-descent"]["key_numbers"]
    assert descent["bf16_sr_final_loss"] * 10 <= descent["bf16_rne_final_loss"]
    assert list(payload) == list(EXPERIMENTS)
    assert payload["stagnation"]["key_numbers"]["add_bf16_sr_mean"] == pytest.approx(mean, 1e-4)
    report = (out / "report.md").read_text()
    assert report.startswith("# stochround demo")
    assert "## Some formats" in report
    assert f"| bf16 | 1.0 | {stagnation[2]} |" in report
    assert "| e4m3fn | 8 | 4 | 3 | 7 | 4 | -6 | 8 | 448 |" in report
    for name in EXPERIMENTS:
        assert f"## {payload[name]['title']}\n" in report, name
        assert payload[name]["figures"], name
        for figure in payload[name]["figures"]:
            assert (out / figure).read_bytes()[:8] == PNG_SIGNATURE, figure
            assert f"({figure})" in report, figure


def kahan_sum(x: torch.Tensor) -> torch.Tensor:
    """Kahan's compensated sum of x's terms in x's dtype: a known-answer program for MCA
    (it keeps the digits naive summation loses)."""
    total = torch.zeros((), dtype=x.dtype)
    carry = torch.zeros((), dtype=x.dtype)
    for term in x:
        y = term - carry
        t = total + y
        carry = (t - total) - y
        total = t
    return total


def muller_values(steps: int) -> torch.Tensor:
    """The ``steps`` terms after u1 of Muller's recurrence u_(n+1) = 111 - 1130 / u_n +
    3000 / (u_n u_(n-1)) from u0 = 2, u1 = -4, in float64: exactly it tends to 6, rounded
    to 100 (a known-answer program for MCA: its digits collapse at a known step)."""
    a = torch.tensor(2.0, dtype=torch.float64)
    b = torch.tensor(-4.0, dtype=torch.float64)
    values = []
    for _ in range(steps):
        a, b = b, 111 - 1130 / b + 3000 / (a * b)
        values.append(b)
    return torch.stack(values)


def cuda_route(route: bool = True) -> tuple[torch.device, contextlib.AbstractContextManager]:
    """Where the CUDA route runs (``route``) and the context it needs: a GPU's CUDA tensors
    where there is one, else CPU tensors under `cpu_as_cuda` (the interpreter); the CPU
    path's CPU tensors without ``route``."""
    if route and torch.cuda.is_available():
        return torch.device("cuda"), contextlib.nullcontext()
    cpu = torch.device("cpu")
    return cpu, availability.cpu_as_cuda() if route else contextlib.nullcontext()


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched under it by name (a mode entered inside it, such as
    an emulation, shows the ops its handlers run)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def seeded_sr_steps(
    build: Callable[[torch.nn.Module, int], torch.optim.Optimizer],
) -> list[tuple[int, list[torch.Tensor]]]:
    """A bf16 linear's first step under the SR optimizer ``build(model, seed)`` makes, for
    (seed, draws from torch's generator before the build) (5, 1), (5, 7) and (6, 1): each
    step's group seed and the bits of the weight and its AdamW states (a run's seed must
    give the same words whatever the generator did, another seed other words)."""
    steps = []
    for seed, draws in ((5, 1), (5, 7), (6, 1)):
        torch.manual_seed(0)
        model = torch.nn.Linear(32, 16).to(torch.bfloat16)
        torch.manual_seed(draws)
        torch.rand(draws)
        optimizer = build(model, seed)
        model(torch.ones(4, 32, dtype=torch.bfloat16)).float().sum().backward()
        optimizer.step()
        state = optimizer.state[model.weight]
        tensors = [model.weight, state["exp_avg"], state["exp_avg_sq"]]
        group_seed = optimizer.param_groups[0]["seed"]
        steps.append((group_seed, [t.detach().view(torch.int16) for t in tensors]))
    return steps


def assert_seeded_sr_steps(steps: list[tuple[int, list[torch.Tensor]]]) -> None:
    """`seeded_sr_steps`' steps: seeds 5, 5, 6; the two of seed 5 equal bit for bit, the
    one of seed 6 not."""
    (seed, first), (again_seed, again), (other_seed, other) = steps
    assert (seed, again_seed, other_seed) == (5, 5, 6)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def record_first_arguments(monkeypatch, owner: object, name: str) -> list[object]:
    """``owner.name`` (a function) replaced, for the test, by one that calls it and appends
    its first argument to the list returned."""
    original = getattr(owner, name)
    seen: list[object] = []

    def recording(first: object, *args: object, **kwargs: object) -> object:
        seen.append(first)
        return original(first, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return seen


class KeepingGraphedMatmul:
    """`GraphedMatmul` told to keep the operands the backward reuses for the GEMMs it will
    run, as a compiled step whose trace kept them (`opaque_matmul.keeps_operands`) runs the
    ops' functions, graphed or not; a layer's eager graphed step keeps nothing."""

    @staticmethod
    def apply(*args: object) -> torch.Tensor:
        x, weight = args[:2]
        gemms = running_gemms(x, weight)  # type: ignore[arg-type]
        keep = ("wgrad" in gemms, "dgrad" in gemms)
        return opaque_matmul.GraphedMatmul.apply(*args[:6], *keep)  # type: ignore[no-any-return]


def graphed_route(patched: pytest.MonkeyPatch, keep: bool) -> None:
    """Quantized layers' eager steps by `GraphedMatmul` (as a CUDA step takes them where the
    step graphs serve it; on the CPU its functions run as they are), keeping the operands
    the backward reuses where ``keep`` (`KeepingGraphedMatmul`), else nothing."""
    patched.setattr(linear, "graphed_step", lambda *args: True)
    if keep:
        patched.setattr(linear, "GraphedMatmul", KeepingGraphedMatmul)


class RunningGraph:
    """A stand-in CUDA graph for the CPU: each replay runs the captured function on the
    graph's inputs (the call's own tensors in place, else its static copies) and writes
    its results into the graph's outputs, as a replay of the real graph would; its notes
    (`graph_notes.host_note`) dropped, as a replay runs no Python."""

    def __init__(self, function: Callable, inputs: tuple, rest: tuple, outputs: tuple) -> None:
        self.function, self.inputs, self.rest, self.outputs = function, inputs, rest, outputs

    def replay(self) -> None:
        with graph_notes.noting():
            result, _ = step_graphs.graph_outputs(self.function(*self.inputs, *self.rest))
        graph_copies.copy_grouped(self.outputs, result)


def graphs_on_the_cpu(patched: pytest.MonkeyPatch, graphs: step_graphs.StepGraphs) -> list[tuple]:
    """``graphs`` on and serving CPU calls (and said to serve them: the layers' eager and
    compiled steps keep what a GPU's graphed step keeps), each capture a `RunningGraph` (the
    capture's run makes its outputs and notes; every replay runs the function again), the
    graphs' bookkeeping, copies in and out as on a GPU: the graph keys captured, in order."""
    keys: list[tuple] = []

    def capture(
        function: Callable, tensors: tuple, rest: tuple, graph_key: tuple, mutates: tuple = ()
    ) -> object:
        keys.append(graph_key)
        in_place = graph_key[1] is not None
        inputs = tuple(t if in_place or t is None else t.clone() for t in tensors)
        with graph_notes.noting() as notes:
            outputs, single = step_graphs.graph_outputs(function(*inputs, *rest))
        made = step_graphs.captured_call(
            RunningGraph(function, inputs, rest, outputs),  # type: ignore[arg-type]
            inputs, outputs, single, (), 0, graph_key[1], tuple(notes), mutates,
        )  # fmt: skip
        graphs.keep(graph_key, made)
        return made

    patched.setattr(graphs, "enabled", True)
    patched.setattr(graphs, "serves", lambda *args: True)
    patched.setattr(graphs, "serves_layouts", lambda *args: True)
    patched.setattr(graphs, "capture", capture)
    return keys
