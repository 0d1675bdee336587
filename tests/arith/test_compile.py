"""sr.ops under torch.compile: the operations run eagerly (a graph break), and with
fullgraph=True compiling raises one error that names the operation and what to do."""

from __future__ import annotations

import pytest
import torch

import stochround as sr

A = torch.linspace(-3, 3, 64)
B = torch.linspace(0.5, 2, 64)
CALLS = {
    "add": lambda a, b: sr.ops.add(a, b, "bf16", "sr", seed=0),
    "mul": lambda a, b: sr.ops.mul(a, b, "bf16", "rne"),
    "sum": lambda a, b: sr.ops.sum(a * b, "bf16", "sr", seed=0),
    "matmul": lambda a, b: sr.ops.matmul(a.view(8, 8), b.view(8, 8), "bf16", "sr", seed=0),
}


@pytest.mark.parametrize("name", CALLS)
def test_fullgraph_names_the_operation_and_what_to_do(name: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(CALLS[name], fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=rf"stochround\.ops\.{name} .*outside the compiled"):
        compiled(A, B)


@pytest.mark.parametrize("name", CALLS)
def test_without_fullgraph_the_operation_runs_eagerly_with_its_bits(name: str) -> None:
    torch._dynamo.reset()

    def around(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return CALLS[name](a * 1.0, b) + 0.0

    compiled = torch.compile(around, backend="aot_eager")
    assert torch.equal(compiled(A, B), around(A, B))
