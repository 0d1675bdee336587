"""SR's random words in a compiled emulation (`emulate/graph_words.py`): the op
``stream_words`` compiled by Inductor through its lowering gives `random_words` of the
row-major index bit for bit (keys and offsets with high halves, views, a scalar), and a
traced SR rounding records the words as that one op, not Philox's rounds node by node."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from stochround.emulate.graph_rounding import Rounding, rounded
from stochround.emulate.graph_words import (
    STREAM_WORDS,
    flat_index,
    register_lowering,
    stream_words,
)
from stochround.formats import format as to_format
from stochround.random import random_words

pytestmark = pytest.mark.compiles

KEY = 2**64 - 0x1234_5678_9ABC  # both halves of the key above 2**31
OFFSET = 2**33 + 5  # a high half of the offset


def _inputs() -> list[torch.Tensor]:
    block = torch.arange(24.0).reshape(2, 3, 4)
    return [torch.tensor(2.0), torch.zeros(7), torch.zeros(5, 6).t(), block, block[:, ::2]]


@pytest.mark.parametrize("index", range(5))
def test_stream_words_lowered_by_inductor_are_random_words(index):
    register_lowering()
    torch._dynamo.reset()
    x = _inputs()[index]
    offset = torch.tensor(OFFSET)

    def words(t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return stream_words(t * 2, KEY, o) + 0  # fused with a producer and a consumer

    compiled = torch.compile(words, backend="inductor", fullgraph=True)(x, offset)
    expected = random_words(flat_index(x), KEY, OFFSET).expand(x.shape)
    assert compiled.dtype == torch.int64 and compiled.shape == x.shape
    assert torch.equal(compiled, expected)
    assert torch.equal(words(x, offset), expected)  # the op's eager body


def test_a_traced_sr_rounding_records_its_words_as_one_op():
    x = torch.randn(4, 6)
    offset = torch.tensor(3)
    fmt = to_format("bfloat16")

    def nodes(mode: str) -> list[object]:
        rounding = Rounding(mode, 32, "c", KEY)
        graph = make_fx(lambda t, o: rounded(t, fmt, rounding, o))(x, offset).graph
        return [node.target for node in graph.nodes if node.op == "call_function"]

    sr_nodes, rne_nodes = nodes("sr"), nodes("rne")
    assert sr_nodes.count(STREAM_WORDS) == 1
    # Philox's ten rounds were ~200 nodes of their own
    assert len(sr_nodes) - len(rne_nodes) < 30
