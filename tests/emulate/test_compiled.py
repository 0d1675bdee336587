"""The compiled emulation (`emulate/compiled.py`): a program compiled with
`stochround.emulate.backend` (AOTAutograd, then Inductor on the CPU) gives the bits of the
same program run eagerly under `emulate` with the same arguments, forward outputs and
gradients, for every mode, compiled whole (no graph break, no recompilation); and its
refusals."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import record_first_arguments
from torch import nn

import stochround as sr
from stochround.emulate import backend, emulate

pytestmark = pytest.mark.compiles


class Block(nn.Module):
    """A small transformer block in the parallel form (GPT-J's, PaLM's): attention by
    matmuls and softmax over transposed heads, and an MLP, both reading one layer norm of
    the input."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        normed = self.norm(x)
        q, k, v = self.qkv(normed).chunk(3, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / (width // self.heads) ** 0.5, dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(batch, length, width)
        return x + self.proj(attended) + self.mlp(normed)


# Each case's time is Inductor's code generation, which grows with the rounded ops of the
# forward and backward graphs (each rounding is tens of operations, SR's hundreds), not
# with the tensors' sizes: the models hold each kind of op once or twice.
def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh())


def convnet() -> nn.Module:
    """Two convolutions (padded, strided) with a ReLU between: the second one's backward
    computes the gradient of its input too."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (5, 12)),
    "transformer": (Block, (2, 4, 8)),
    "conv": (convnet, (2, 2, 8, 8)),
}


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return (out * out).mean()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32)


class Counted:
    """A backend that counts the graphs Dynamo hands it (one per graph break, plus one per
    recompilation)."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner, self.graphs = inner, 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs += 1
        return self.inner(gm, example_inputs)


def run_both(name: str, mode: str, steps: int = 2):
    """Each step's loss and gradients, eager under `emulate` and compiled with `backend`,
    over ``steps`` steps (the counter carries on; gradients set to None before each
    step, as ``zero_grad()`` does: an accumulation into an existing ``.grad`` runs
    outside the compiled graphs)."""
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make()
    inputs = [torch.randn(shape) for _ in range(steps)]
    eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    eager, compiled = [], []
    with emulate("bfloat16", mode, seed=5) as emulation:
        for x in inputs:
            eager_model.zero_grad()
            loss = loss_of(eager_model, x)
            loss.backward()
            eager.append([loss.detach(), *(p.grad for p in eager_model.parameters())])
    emulating = backend("bfloat16", mode, seed=5)
    counted = Counted(emulating)
    compiled_loss = torch.compile(loss_of, backend=counted, fullgraph=True)
    for x in inputs:
        compiled_model.zero_grad()
        loss = compiled_loss(compiled_model, x)
        loss.backward()
        compiled.append([loss.detach(), *(p.grad for p in compiled_model.parameters())])
    return eager, compiled, emulation.calls, emulating.calls, counted.graphs


CASES = [("mlp", mode) for mode in sr.MODES] + [
    (name, mode) for name in ("transformer", "conv") for mode in ("rne", "sr")
]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_compiled_emulation_is_eager_emulation_bit_for_bit(name, mode):
    """Two steps, forward and backward: every loss and gradient bit for bit, the same
    offsets drawn, one graph (fullgraph=True: no break; the second step reuses it)."""
    torch._dynamo.reset()
    eager, compiled, eager_calls, compiled_calls, graphs = run_both(name, mode)
    assert compiled_calls == eager_calls > 0
    assert graphs == 1
    for step, (e, c) in enumerate(zip(eager, compiled, strict=True)):
        for index, (a, b) in enumerate(zip(e, c, strict=True)):
            assert torch.equal(bits(a), bits(b)), (step, index)
    if mode == "sr":  # the rounding did something: not the plain fp32 loss
        torch.manual_seed(0)
        make, shape = MODELS[name]
        plain = loss_of(make(), torch.randn(shape))
        assert not torch.equal(plain, eager[0][0])


def test_a_conversion_and_copies_in_a_graph_number_as_eagerly():
    """In a compiled graph as eagerly: ``.to(bfloat16)`` rounds its source once with the
    mode (then converts exactly), a same-dtype copy and a constant fill draw no offset."""

    def program(x: torch.Tensor) -> torch.Tensor:
        y = (x * 3).to(torch.bfloat16).float()
        return torch.cat([y.t().contiguous().t(), torch.full_like(y, 0.1)]) * 5

    x = torch.linspace(1, 2, 12).reshape(3, 4)
    with emulate("bfloat16", "sr", seed=2) as emulation:
        eager = program(x)
    emulating = backend("bfloat16", "sr", seed=2)
    torch._dynamo.reset()
    compiled = torch.compile(program, backend=emulating, fullgraph=True)(x)
    assert emulation.calls == emulating.calls == 4  # mul, the conversion, float(), mul
    assert torch.equal(bits(compiled), bits(eager))


def test_backend_refuses_what_it_does_not_compile():
    """ValueError naming the argument, for a bad value and for the eager-only options."""
    with pytest.raises(ValueError, match="mode"):
        backend("bfloat16", "nearest")
    with pytest.raises(ValueError, match="ops"):
        backend("bfloat16", "rne", ops="convs")
    refused = {
        "compute": "float64",
        "accumulate": "per_op",
        "round_inputs": True,
        "hardware": "amd-mi300-fp8",
    }
    for argument, value in refused.items():
        with pytest.raises(ValueError, match=f"{argument}=") as error:
            backend("bfloat16", "sr", **{argument: value})
        assert "eager" in str(error.value)


def test_the_backend_is_public_as_sr_emulate_backend():
    assert sr.emulate_backend is backend


def test_a_relu_of_a_rounded_value_draws_its_offset_without_computing_words(monkeypatch):
    """``relu`` and its backward (``threshold_backward``) select values of a rounded input
    or zero: their rounding would return them unchanged, so the graphs Inductor compiles
    compute SR's words only for the other roundings, while the offsets drawn and the bits
    stay the eager emulation's; a relu of a graph input (not rounded) is rounded."""
    from torch._inductor import compile_fx

    from stochround.emulate.graph_words import STREAM_WORDS

    words: list[int] = []
    inner = compile_fx.compile_fx_inner

    def counting(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        words.append(sum(node.target is STREAM_WORDS for node in gm.graph.nodes))
        return inner(gm, *args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", counting)

    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x * 3) * torch.relu(y)).sum()

    x, y = torch.linspace(-2, 2, 24).reshape(4, 6), torch.linspace(3, -1, 24).reshape(4, 6)
    results = []
    for run in ("eager", "compiled"):
        a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
        if run == "eager":
            with emulate("bfloat16", "sr", seed=3) as emulating:
                loss = program(a, b)
                loss.backward()
        else:
            emulating = backend("bfloat16", "sr", seed=3)
            torch._dynamo.reset()
            loss = torch.compile(program, backend=emulating, fullgraph=True)(a, b)
            loss.backward()
        assert a.grad is not None and b.grad is not None
        results.append((emulating.calls, [bits(t) for t in (loss, a.grad, b.grad)]))
    (eager_calls, eager), (compiled_calls, compiled) = results
    assert compiled_calls == eager_calls
    for e, c in zip(eager, compiled, strict=True):
        assert torch.equal(e, c)
    # forward: x * 3, relu(y) (of an input), the product and the sum rounded, relu(x * 3)
    # not; backward: the product's two gradients and the one times 3 rounded, the two
    # threshold_backward (each of a rounded gradient) not
    assert words == [4, 3]


def test_a_relu_of_a_rounded_value_viewed_as_another_dtype_is_rounded():
    """A view as another dtype reads other values from the rounded bits: its relu is
    rounded as eagerly (e4m3's values are bf16 and fp16 values both)."""

    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.relu((x * 3).view(torch.float16)).float()

    x = torch.linspace(-2, 2, 24, dtype=torch.bfloat16).reshape(4, 6)
    with emulate("float8_e4m3fn", "sr", seed=4) as emulation:
        eager = program(x)
    emulating = backend("float8_e4m3fn", "sr", seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(program, backend=emulating, fullgraph=True)(x)
    assert emulation.calls == emulating.calls
    assert torch.equal(bits(compiled), bits(eager))


def test_an_opaque_op_runs_as_a_direct_call_of_its_aten_kernel():
    """An op Inductor would compute its own way (here ``_log_softmax``) runs the ATen
    kernel, called directly from the compiled program (no custom op's Python body on the
    way), with the eager emulation's bits."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x * 3, dim=-1)

    x = torch.linspace(-2, 2, 24).reshape(4, 6)
    with emulate("bfloat16", "sr", seed=6) as emulation:
        eager = program(x)
    emulating = backend("bfloat16", "sr", seed=6)
    torch._dynamo.reset()
    compiled_program = torch.compile(program, backend=emulating, fullgraph=True)
    with inductor_config.patch(force_disable_caches=True):
        compiled, codes = run_and_get_code(compiled_program, x)
    assert emulation.calls == emulating.calls == 2
    assert torch.equal(bits(compiled), bits(eager))
    code = "\n".join(codes)
    assert "torch.ops.aten._log_softmax.default(" in code
    assert "stochround_emulate._log_softmax_default.default(" not in code


def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An elementwise program of products and sums alone (IEEE-exact ops: the same bits from
    any kernel that computes them in this order, on any device)."""
    return (x * w + w) * 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_graph_run_reads_its_offset_from_a_block_made_once(monkeypatch, device):
    """The offset input of each run is a view into one block of offsets (no tensor made a
    run): two steps of a forward and a backward graph make one block; a counter set past
    the block's end makes a new one within the step, and every bit and offset stays the
    eager emulation's.  On a GPU no offset is copied for its alignment (odd offsets
    included: the first backward's is 3)."""
    from torch._inductor import utils as inductor_utils

    from stochround.emulate import compiled as compiled_module

    blocks = record_first_arguments(monkeypatch, compiled_module, "offset_block")
    clones = record_first_arguments(monkeypatch, inductor_utils, "clone_preserve_strides")
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(0)
    x, w = (torch.randn(6, 8, generator=generator).to(device) for _ in range(2))
    gradient = torch.randn(6, 8, generator=generator).to(device)
    # the third step starts one offset before the first block's end: its forward reads the
    # first block, its backward a new one
    late = compiled_module.OFFSETS_PER_BLOCK - 1
    results = []
    for run in ("eager", "compiled"):
        if run == "eager":
            counter = emulate("bfloat16", "sr", seed=5)
        else:
            emulating = backend("bfloat16", "sr", seed=5)
            counter = emulating.emulation
            program = torch.compile(scaled, backend=emulating, fullgraph=True)
        outputs, calls = [], []
        for step in range(3):
            if step == 2:
                counter.calls = late
            a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
            if run == "eager":
                with counter:
                    out = scaled(a, b)
                    out.backward(gradient)
            else:
                out = program(a, b)
                out.backward(gradient)
            assert a.grad is not None and b.grad is not None
            outputs.append([bits(t) for t in (out, a.grad, b.grad)])
            calls.append(counter.calls)
        results.append((outputs, calls))
    (eager, eager_calls), (compiled, compiled_calls) = results
    forward = 3  # roundings: x * w, + w, * 3
    assert blocks == [0, late + forward]
    assert clones == []
    assert compiled_calls == eager_calls
    for e, c in zip(eager, compiled, strict=True):
        for one, other in zip(e, c, strict=True):
            assert torch.equal(one, other)


def test_offset_inputs_are_aligned_views_of_one_block():
    """`OffsetInputs.at(k)` holds k, as a 0-d int64 view 16-byte aligned (Inductor's GPU
    code copies a misaligned input before each run), of one block while k stays in it;
    a k before or past the block makes a new block from k; a block stops at 2**63 - 1,
    and an offset past it is refused (the graphs read offsets as int64)."""
    from stochround.emulate.compiled import OFFSETS_PER_BLOCK, OffsetInputs

    offsets = OffsetInputs(torch.device("cpu"))
    first = offsets.at(7)
    block = first.untyped_storage().data_ptr()
    for k in (7, 8, 40, 7 + OFFSETS_PER_BLOCK - 1):
        view = offsets.at(k)
        assert view.shape == () and view.dtype == torch.int64 and int(view) == k
        assert view.untyped_storage().data_ptr() == block
        assert view.data_ptr() % 16 == 0
    for k in (7 + OFFSETS_PER_BLOCK, 6):
        view = offsets.at(k)
        assert int(view) == k and view.untyped_storage().data_ptr() != block
        assert (offsets.start, offsets.count) == (k, OFFSETS_PER_BLOCK)
        block = view.untyped_storage().data_ptr()
    last = 2**63 - 1
    assert int(offsets.at(last - 2)) == last - 2
    assert (offsets.start, offsets.count) == (last - 2, 3)
    assert int(offsets.at(last)) == last
    with pytest.raises(ValueError, match="counter reached 9223372036854775808"):
        offsets.at(2**63)
