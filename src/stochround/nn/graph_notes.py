"""What a quantized layer's step function tells the CUDA graph that captures it
(`stochround.nn.step_graphs`): the host notes its call makes (`host_note`, collected by
`noting`), which a graph keeps from its capture and gives again at each replay, and the
cached objects whose device memory its kernels read (`kept_by_graphs`), which the graph
keeps alive for its replays."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _Keeping(threading.local):
    """The objects the cached functions return while a graph is captured in this thread
    (None while none is)."""

    objects: list[object] | None = None


KEEPING = _Keeping()


class _Notes(threading.local):
    """The host notes of the step functions called in this thread inside `noting` (None
    outside it)."""

    notes: list[object] | None = None


NOTES = _Notes()


def host_note(value: object) -> None:
    """Tell the caller of a step function, inside `noting`, something the host must know
    of the call (a delayed layer's roles that recorded their amaxes).  A graph keeps the
    notes its capture made and gives them again at each replay (the function's Python does
    not run then): a note must be a function of the call's key, as its launches are."""
    notes = NOTES.notes
    if notes is not None:
        notes.append(value)


@contextlib.contextmanager
def noting() -> Iterator[list[object]]:
    """The notes (`host_note`) of the step functions called, run or replayed, inside the block,
    in order."""
    before = NOTES.notes
    collected: list[object] = []
    NOTES.notes = collected
    try:
        yield collected
    finally:
        NOTES.notes = before


def kept_by_graphs(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` (a bounded cache of objects that hold device memory the kernels read:
    prepared launches' scratch, Philox keys, step plans) with each result it returns while
    a step graph is captured kept by that graph.  The graph reads that memory at every
    replay; a cache that dropped the object would free it under the graph (a wrong key
    read, or a fault).  The cache's own methods (``cache_clear``) stay reachable."""

    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        result = function(*args, **kwargs)
        objects = KEEPING.objects
        if objects is not None:
            objects.append(result)
        return result

    for name in ("cache_clear", "cache_info"):  # an lru_cache's methods, kept reachable
        method = getattr(function, name, None)
        if method is not None:
            call.__dict__[name] = method
    return call


__all__ = ["KEEPING", "NOTES", "host_note", "kept_by_graphs", "noting"]
