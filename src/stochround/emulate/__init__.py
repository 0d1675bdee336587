"""Emulation: unmodified PyTorch code run in any format and rounding mode.

- `stochround.emulate.mode`: `emulate`, the dispatch mode that rounds every floating ATen
  op's outputs to a format, and `Emulation`, its class;
- `stochround.emulate.mca`: Monte Carlo arithmetic on an unmodified function, `mca`, and
  its result, `MCAResult`.
"""

from __future__ import annotations

from .mca import MCAResult, mca
from .mode import Emulation, emulate

__all__ = ["Emulation", "MCAResult", "emulate", "mca"]
