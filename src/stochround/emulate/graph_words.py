"""The random words of a compiled emulation's SR rounding as one graph op that Inductor
lowers into a single elementwise expression, so that each rounding's Philox costs the
compiler its rounds once.

Written as tensor operations (`stochround.random.random_words` traced), the words of one
rounding are some 200 graph nodes whose values are each read twice or more (a round's
product gives both its halves); Inductor lowers every node to a function that calls its
inputs' functions again, so each read re-derives the whole chain of rounds before it, and
the lane's ``gather`` from the four stacked words stores them to memory.  The op
``stochround_emulate::stream_words`` is one node; its lowering (`register_lowering`)
computes the flat index from the loop indices and runs `stochround.random.philox_rounds`,
the eager stream's own rounds, once on Inductor's values (`_Word`), with the key's
schedule folded into constants; the lane is a select, not a load.  Its eager and fake
bodies are `random_words` of the row-major index: the same words, bit for bit.  The fake
body registers the lowering, as a trace runs it before Inductor lowers the graph.
`word_at` is the lowering's word, for other ops' lowerings (`stochround.nn.gaussws_graph`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..random import MASK32, group_counters, philox_rounds, random_words

_LIBRARY_NAME = "stochround_emulate"
_library = torch.library.Library(_LIBRARY_NAME, "FRAGMENT")
_library.define("stream_words(Tensor like, int key_low, int key_high, Tensor offset) -> Tensor")


def flat_index(x: Tensor) -> Tensor:
    """The row-major flat index of each element of x (int64), as a broadcast sum of one
    ``arange`` per dimension: ``i = sum_d i_d * prod(shape[d+1:])``.  Broadcast, it costs a
    compiled kernel no memory read, and its result follows x's strides, whatever they are."""
    index = torch.zeros((), dtype=torch.int64, device=x.device)
    stride = 1
    for dim in reversed(range(x.ndim)):
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        steps = torch.arange(x.shape[dim], dtype=torch.int64, device=x.device)
        index = index + steps.view(shape) * stride
        stride = stride * x.shape[dim]
    return index


def _eager_words(like: Tensor, key_low: int, key_high: int, offset: Tensor) -> Tensor:
    """`random_words` of like's row-major index in stream ``(key, offset)`` (contiguous)."""
    words = random_words(flat_index(like), key_low | (key_high << 32), offset)
    return words.expand(like.shape).contiguous()


def _fake_words(like: Tensor, key_low: int, key_high: int, offset: Tensor) -> Tensor:
    """The words' shape, dtype and device: an int64 tensor shaped like ``like``.  A trace
    runs it before Inductor lowers the graph, so it registers the lowering (once a
    process): a model compiled by plain ``torch.compile`` gets it too."""
    register_outside_modes(register_lowering)
    return torch.empty(like.shape, dtype=torch.int64, device=like.device)


def register_outside_modes(register: Callable[[], None]) -> None:
    """``register()``, a lowering's cached registration, with the trace's dispatch modes
    set aside: its first call imports Inductor's lowerings, whose module code must not run
    on fake tensors.  An op's fake implementation calls it, as every trace of the op runs
    that before Inductor lowers the graph."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        register()


_library.impl("stream_words", _eager_words, "CompositeExplicitAutograd")
torch.library.register_fake(f"{_LIBRARY_NAME}::stream_words", _fake_words, lib=_library)
STREAM_WORDS = torch.ops.stochround_emulate.stream_words.default


def stream_words(like: Tensor, key: int, offset: Tensor) -> Tensor:
    """Element i of ``like`` (row-major) gets ``random_words(i, key, offset)``: one op a
    graph records, for a ``key`` in ``[0, 2**64)`` and an int64 ``offset`` tensor."""
    return cast(Tensor, STREAM_WORDS(like, key & MASK32, key >> 32, offset.reshape(())))


class _Word:
    """An int64 value of Inductor's kernel language with the operators `philox_rounds`
    applies (Python ints become int64 constants), so its rounds run on kernel values."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @staticmethod
    def _operand(other: _Word | int) -> Any:
        from torch._inductor.virtualized import ops

        if isinstance(other, _Word):
            return other.value
        return ops.constant(other, torch.int64)

    def _apply(self, name: str, other: _Word | int) -> _Word:
        from torch._inductor.virtualized import ops

        return _Word(getattr(ops, name)(self.value, self._operand(other)))

    def __mul__(self, other: _Word | int) -> _Word:
        return self._apply("mul", other)

    def __add__(self, other: _Word | int) -> _Word:
        return self._apply("add", other)

    def __and__(self, other: _Word | int) -> _Word:
        return self._apply("bitwise_and", other)

    def __xor__(self, other: _Word | int) -> _Word:
        return self._apply("bitwise_xor", other)

    def __rshift__(self, other: _Word | int) -> _Word:
        return self._apply("bitwise_right_shift", other)


def _word_of_lane(index: _Word, words: Sequence[_Word]) -> Any:
    """``words[index & 3]`` as selects (Philox's four outputs, one per lane)."""
    from torch._inductor.virtualized import ops

    lane = (index & 3).value
    chosen = words[3].value
    for position in (2, 1, 0):
        equal = ops.eq(lane, ops.constant(position, torch.int64))
        chosen = ops.where(equal, words[position].value, chosen)
    return chosen


def flat_position(indices: Sequence[Any], sizes: Sequence[Any]) -> Any:
    """The row-major flat index of a lowering body's loop ``indices`` over ``sizes``: an
    index expression, ``sum_d i_d * prod(sizes[d+1:])`` (as `flat_index`)."""
    flat: Any = 0
    stride: Any = 1
    for position, size in zip(reversed(indices), reversed(sizes), strict=True):
        flat = flat + position * stride
        stride = stride * size
    return flat


def word_at(flat: Any, offset: Any, key_low: int, key_high: int) -> Any:
    """Inside an Inductor lowering's body: ``random_words(flat, key, offset)`` as kernel
    values, for the index expression ``flat`` and the loaded int64 ``offset``; the key's
    schedule stays in Python ints, constants of the kernel (module docstring)."""
    from torch._inductor.virtualized import ops

    index = _Word(ops.index_expr(flat, torch.int64))
    stream = _Word(offset)
    counters = (*group_counters(index), stream & MASK32, (stream >> 32) & MASK32)
    rounds = cast(Callable[..., Sequence[_Word]], philox_rounds)
    return _word_of_lane(index, rounds(*counters, key_low, key_high))


def _lowering(like: Any, key_low: int, key_high: int, offset: Any) -> Any:
    """Inductor's lowering of `STREAM_WORDS`: a pointwise node over like's shape whose
    body is `random_words` of the element's row-major index (module docstring)."""
    from torch._inductor.ir import Pointwise

    sizes = list(like.get_size())
    load_offset = offset.make_loader()

    def body(indices: Sequence[Any]) -> Any:
        return word_at(flat_position(indices, sizes), load_offset([]), key_low, key_high)

    return Pointwise.create(
        device=like.get_device(), dtype=torch.int64, inner_fn=body, ranges=sizes
    )


def lowering_registrar(op: Any, lowering: Callable[..., Any]) -> Callable[[], None]:
    """A function that registers ``lowering`` as Inductor's lowering of the op overload
    ``op`` at its first call, once a process (Inductor imported then, not when this module
    is)."""

    @functools.cache
    def register() -> None:
        from torch._inductor.lowering import register_lowering as inductor_register

        inductor_register(op, type_promotion_kind=None)(lowering)

    return register


# registers `_lowering` as Inductor's lowering of `STREAM_WORDS`
register_lowering = lowering_registrar(STREAM_WORDS, _lowering)


__all__ = [
    "STREAM_WORDS",
    "flat_index",
    "flat_position",
    "lowering_registrar",
    "register_lowering",
    "register_outside_modes",
    "stream_words",
    "word_at",
]
