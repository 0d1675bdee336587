"""A rounding resolved once for many calls: `prepare` checks a rounding's choices (format,
mode, random bits, variant, saturation, a hardware unit, the seed) as `round` checks them
and returns a `PreparedRounding`, whose ``round(x, offset)`` rounds each tensor with those
choices without `round`'s checks of the choices and its routing on every call (only the
tensor, new each call, is checked): the route of each input dtype and device is found
once, and a call goes to its path (the kernels' plan on CUDA, the PyTorch path or the
compiled CPU path on the CPU) directly.  For a caller that rounds many tensors with the
same choices, each at its own offset of one stream: `stochround.emulate` rounds every
op's outputs with one, prepared when the emulation is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from .. import random as streams
from ..formats import Format
from ..formats import format as find_format
from ..kernels.availability import check_backend, on_kernel_device
from ..presets import HardwarePreset, preset
from ..reference import check_mode
from ..torch_path import Request
from .checks import check_choices, check_input, check_sr_only
from .op import round_through_op
from .route import Route, call_route, routed, through_op

if TYPE_CHECKING:  # for annotations only: the kernels import Triton
    from ..kernels.rounding import InPlaceRounding


class CallTarget(NamedTuple):
    """A call's format and rounding choices after its ``hardware=`` preset (if any) has
    set them: the preset's operand format and flush threshold, and its backend."""

    fmt: Format | str | torch.dtype
    mode: str
    rbits: int | None
    variant: str
    sat: str
    operand: Format | None
    flush_below: float | None
    backend: str


def call_target(
    hardware: str | HardwarePreset | None,
    fmt: Format | str | torch.dtype | None,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    rand: object,
    backend: str,
) -> CallTarget:
    """The choices a call rounds with: its own, or those its ``hardware=`` preset fixes
    (``fmt`` picks the unit of a family or confirms it; the preset sets the mode, rbits,
    variant and saturation, and rounds on the PyTorch path, so the call may not set
    them); ValueError where neither ``fmt`` nor ``hardware`` is given."""
    if hardware is None:
        if fmt is None:
            raise ValueError("fmt is required (a format name or Format) unless hardware= is given")
        return CallTarget(fmt, mode, rbits, variant, sat, None, None, backend)
    if mode not in ("rne", "sr") or rbits is not None or variant != "c" or sat != "none":
        raise ValueError(
            f"hardware={hardware!r} sets the mode, rbits, variant and sat; pass only x, the "
            "format (to pick or confirm the unit's), seed, offset or stream, rand, "
            "index_offset and nan"
        )
    if isinstance(rand, str):
        raise ValueError("hardware presets take rand as an integer tensor, not 'data'")
    check_backend(backend)
    if backend == "triton":
        raise ValueError("hardware presets round on the PyTorch path: backend='triton' cannot")
    unit = preset(hardware, None if fmt is None else find_format(fmt))
    return CallTarget(
        unit.target, "sr", unit.rbits, unit.variant, unit.sat, unit.operand, unit.flush_below,
        "torch",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PreparedRounding:
    """A rounding's checked choices (`prepare`): ``request`` holds them as a call's
    `Request` would (the seed the stream's key; the offset a placeholder, each call's
    own), ``backend`` is "auto", or "torch" for a hardware unit (a preset rounds on the
    PyTorch path).  ``routes`` caches the route of each (input dtype, on CUDA) seen."""

    request: Request
    backend: str
    routes: dict[tuple[torch.dtype, bool], Route] = field(
        default_factory=dict, compare=False, repr=False
    )
    # the request's fields before and after its offset: a call's request is built from
    # them (a third of `_replace`'s host time, which maps its keywords by name)
    head: tuple = field(init=False, compare=False, repr=False)
    tail: tuple = field(init=False, compare=False, repr=False)
    # `round_in_place`'s kernels' rounding for each (input dtype, on CUDA) seen (None: it
    # cannot), bound to the seed
    in_place_roundings: dict[tuple[torch.dtype, bool], InPlaceRounding | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        offset = Request._fields.index("offset")
        object.__setattr__(self, "head", tuple(self.request[:offset]))
        object.__setattr__(self, "tail", tuple(self.request[offset + 1 :]))

    def round(self, x: Tensor, offset: int) -> Tensor:
        """x rounded with the prepared choices, SR drawing the words of ``offset`` in the
        seed's stream at x's flat indices (index_offset 0): the bits of ``round(x, fmt,
        mode, ..., seed=seed, offset=offset)``, in x's dtype.  x is checked as `round`
        checks it (`check_input`: a new tensor each call); ``offset`` is the caller's
        counter, an int in [0, 2**64), unchecked."""
        check_input(x)
        if through_op(x):  # traced, for autograd or a DTensor: the custom op, as round does
            return round_through_op(x, self._request(offset), self.backend, "value", x.dtype)
        return self.round_plain(x, offset)

    def round_plain(self, x: Tensor, offset: int) -> Tensor:
        """`round` of an x the caller vouches for, without its checks: a dense floating
        tensor with data that goes through no custom op (not traced, no gradient, not a
        DTensor; `through_op` is False), such as an ATen op's fresh output inside a
        dispatch mode.  The same bits as `round`."""
        request = self._request(offset)
        where = (x.dtype, on_kernel_device(x))
        route = self.routes.get(where)
        if route is None:
            route = self.routes[where] = call_route(self.choices(), *where, False)
        return routed(x, request, route)

    def round_in_place(self, x: Tensor, offset: int) -> bool:
        """`round_plain` of an x the caller also owns (an op's fresh output in a dispatch
        mode, or the tensor it just wrote), written into x itself where the kernels can
        (`KernelPlan.in_place_rounding`: the general kernel's values, a contiguous x, an int
        seed): True, x holds `round_plain`'s bits; else False and x is untouched (the
        caller rounds it with `round_plain`).  No result tensor is made and no scratch
        taken, host work that a hot path such as an emulation's pays on every op."""
        rounding = self.in_place_rounding((x.dtype, on_kernel_device(x)))
        if rounding is None or not x.is_contiguous():
            return False
        rounding(x, offset)
        return True

    def in_place_rounding(self, where: tuple[torch.dtype, bool]) -> InPlaceRounding | None:
        """The kernels' rounding in place (`round_in_place`'s) of a contiguous x of dtype
        and on a kernel device as ``where`` says (``(x.dtype, on_kernel_device(x))``), or
        None: no plan (the PyTorch path), one that cannot (`KernelPlan.in_place`), or a
        tensor seed; found once for each ``where`` (``in_place_roundings``).  A caller that
        holds it calls ``rounding(x, offset)`` itself, for the bits of ``round_in_place(x,
        offset)``, without its lookup.  Its calls read their offset in SR alone (the modes
        that draw no words read none: they pass `prepare`'s placeholder, 0)."""
        try:
            return self.in_place_roundings[where]
        except KeyError:
            rounding = self.in_place_roundings[where] = self._found_in_place(where)
            return rounding

    def _found_in_place(self, where: tuple[torch.dtype, bool]) -> InPlaceRounding | None:
        """`in_place_rounding` of a ``where`` not seen before."""
        route = self.routes.get(where)
        if route is None:
            route = self.routes[where] = call_route(self.choices(), *where, False)
        plan, seed = route.plan, self.request.seed
        if plan is None or not plan.in_place or not isinstance(seed, int):
            return None  # (a tensor seed: the in-place call takes ints)
        if route.out_dtype != where[0]:
            return None
        return plan.in_place_rounding(seed, self.request.mode == "sr")

    def _request(self, offset: int) -> Request:
        """The request of a call at ``offset`` (SR's; the others draw no words)."""
        if self.request.mode == "sr":
            return Request._make((*self.head, offset, *self.tail))
        return self.request

    def choices(self) -> tuple:
        """The choices as `call_route` takes them (values of x's dtype, from the stream)."""
        r = self.request
        return (r.fmt, r.mode, r.n, r.variant, r.sat, r.nan, r.source, self.backend, "value", None)


def prepare(
    fmt: Format | str | torch.dtype | None,
    mode: str = "rne",
    *,
    seed: int | Tensor,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    hardware: str | HardwarePreset | None = None,
) -> PreparedRounding:
    """The rounding ``round(x, fmt, mode, rbits=rbits, variant=variant, sat=sat, seed=seed,
    offset=k, hardware=hardware)`` for any x and k, prepared: every choice checked here as
    `round` checks it (ValueError/TypeError naming it), once."""
    fmt, mode, rbits, variant, sat, operand, flush_below, backend = call_target(
        hardware, fmt, check_mode(mode), rbits, variant, sat, None, "auto"
    )
    target, n = check_choices(fmt, mode, rbits, variant, sat, "raise")
    check_sr_only(mode, rbits, None)
    key = streams.check_seed(seed, "seed") if mode == "sr" else 0
    request = Request(
        target, mode, sat, n, variant, "stream", key, 0, 0, None, "raise", operand, flush_below
    )
    return PreparedRounding(request, backend)


__all__ = ["CallTarget", "PreparedRounding", "call_target", "prepare"]
