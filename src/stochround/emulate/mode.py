"""`emulate`: unmodified PyTorch code run in any format and rounding mode, by an
`Emulation` dispatch mode that rounds the floating outputs of every ATen operation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..presets import HardwarePreset
from .dispatch import Emulation
from .ops import FormatSpec


def emulate(
    fmt: FormatSpec | Mapping[torch.dtype, FormatSpec],
    mode: str = "rne",
    *,
    seed: int | None = None,
    ops: str | Callable[[torch._ops.OpOverload], bool] = "all",
    rbits: int | None = None,
    variant: str = "c",
    hardware: str | HardwarePreset | None = None,
    round_inputs: bool = False,
    compute: str = "native",
    accumulate: str = "once",
) -> Emulation:
    """A dispatch mode under which unmodified PyTorch code computes in ``fmt`` with ``mode``:
    ``with emulate("bfloat16", "sr", seed=0): y = model(x)``.

    Every floating output y of an ATen op, forward and backward, whose dtype holds the
    format becomes ``round(y, fmt, mode, seed=key, offset=k)`` (`stochround.rounding.round`),
    ``key = stream_key(seed, StreamDomain.EMULATE)`` and k counting the rounded tensors, so
    that a program needs no change and a run is a pure function of its seed; views, layout
    ops and constant fills (`stochround.emulate.ops.LAYOUT_OPS`) compute nothing and are not
    rounded.  For compiled speed: `stochround.emulate.backend`.  The emulation
    guide (docs/guide/emulate.md) states each argument's rule: what is rounded, ``ops``,
    ``compute``, ``accumulate``, conversions, nesting and torch.compile.
    """
    return Emulation(
        fmt,
        mode,
        seed=seed,
        ops=ops,
        rbits=rbits,
        variant=variant,
        hardware=hardware,
        round_inputs=round_inputs,
        compute=compute,
        accumulate=accumulate,
    )


__all__ = ["emulate"]
