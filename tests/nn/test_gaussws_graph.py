"""GaussWS's draws as one graph op (`nn/gaussws_graph.py`): ``gaussws_draws`` compiled by
Inductor through its lowering gives the eager R bit for bit (keys with high halves, tables
of several widths, a 3-D shape), a traced sample records its words as that one op, and a
sampled model compiled by plain Inductor (``fullgraph=True``) trains three steps with
eager's bits, compiling once, its sample computed by Inductor's own kernel (no opaque op,
no Philox word in memory) and its step advanced in Inductor's code (no Python op)."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import stochround.nn as srnn
from stochround.emulate.graph_words import flat_index
from stochround.kernels.availability import INTERPRETED, cpu_as_cuda
from stochround.nn import gaussws_noise
from stochround.nn.gaussws_graph import GAUSSWS_DRAWS, count_thresholds, gaussws_draws
from stochround.random import random_words

pytestmark = pytest.mark.compiles

KEY = 2**64 - 0x1234_5678_9ABC  # both halves of the key above 2**31
OFFSET = 2**33 + 5  # a high half of the offset


@pytest.mark.parametrize("noise_bits", [1, 9, 32])
def test_the_lowered_draws_are_the_eager_ones(noise_bits: int) -> None:
    thresholds = gaussws_noise.gaussian_thresholds(noise_bits)
    like = torch.zeros(3, 4, 40)
    offset = torch.tensor(OFFSET)

    def draws(t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return gaussws_draws(t * 2, KEY, o, noise_bits, thresholds) * 1  # fused around

    torch._dynamo.reset()
    compiled = torch.compile(draws, backend="inductor", fullgraph=True)(like, offset)
    words = random_words(flat_index(like), KEY, OFFSET).expand(like.shape)
    expected = count_thresholds(words >> (32 - noise_bits), thresholds)
    assert compiled.dtype == torch.int8 and torch.equal(compiled, expected)
    assert torch.equal(draws(like, offset), expected)  # the op's eager body


def test_a_traced_sample_records_its_draws_as_one_op() -> None:
    """Dynamo's graph of a sample holds the draws as one node (Philox's ten rounds would be
    some 200) and computes the eager sample."""
    w = torch.randn(8, 64, dtype=torch.bfloat16)
    offset = torch.tensor(OFFSET)
    sampler = gaussws_noise.make_sampler("e3m2", 32, "gaussws", 32)
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, inputs: object) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    def sample(t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return gaussws_noise.sample_resolved(t, sampler, KEY, o, 0)

    torch._dynamo.reset()
    got = torch.compile(sample, backend=record, fullgraph=True)(w, offset)
    assert torch.equal(got, sample(w, offset))
    nodes = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert nodes.count(GAUSSWS_DRAWS) == 1 and len(nodes) < 100


def bias_free_model() -> nn.Sequential:
    """Two bias-free Linears around a ReLU in bf16: a compiled forward computes eager's
    bits (the GEMMs are the same extern calls, the ReLU exact)."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 64, bias=False)]
    return nn.Sequential(*layers).to(torch.bfloat16)


@pytest.mark.parametrize("route", ["cpu", "cuda_route"])
def test_inductor_trains_three_steps_with_eagers_bits_compiling_once(route: str) -> None:
    """``route="cuda_route"``: "auto" routes the CPU as CUDA (`cpu_as_cuda`, Triton's
    interpreter), so the eager model samples with the Triton kernel, which the compiled
    one must leave for Inductor's fused code."""
    if route == "cuda_route" and not INTERPRETED:
        pytest.skip("routing the CPU as CUDA needs Triton's interpreter")
    context = cpu_as_cuda() if route == "cuda_route" else contextlib.nullcontext()
    eager = srnn.gaussws_(bias_free_model(), "e3m2", seed=5)
    compiled_model = srnn.gaussws_(bias_free_model(), "e3m2", seed=5)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(compiled_model, fullgraph=True, backend=counter)
    code: list[str] = []
    with context, fresh_cache():  # the code generated now, not a cached one
        for i in range(3):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
            expected = eager(x)
            expected.float().square().sum().backward()

            def run(x: torch.Tensor = x) -> torch.Tensor:
                out = compiled(x)
                out.float().square().sum().backward()
                return out

            if i == 0:  # run_and_get_code resets dynamo: the first step's compilation
                counters.clear()
                got, code = run_and_get_code(run)
            else:
                got = run()
            assert torch.equal(got, expected)
    assert counter.frame_count == 1 and not counters["graph_break"]
    for a, b in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    for layer in (compiled_model[0], compiled_model[2]):
        assert int(layer.parametrizations.weight[0].step) == 3
    calls = re.findall(r"torch\.ops\.(\w+\.\w+)", "".join(code))
    assert "stochround.gaussws_blocks" not in calls  # not the opaque kernel op
    assert "stochround_nn.gaussws_draws" not in calls  # lowered, not called
    # the step read and advanced in Inductor's code: no Python op a layer and step
    assert "stochround.nn_advance_step" not in calls
