"""Emulation: unmodified PyTorch code run in any format and rounding mode.

- `stochround.emulate.mode`: `emulate`, the dispatch mode that rounds every floating ATen
  op's outputs to a format; `stochround.emulate.dispatch`: `Emulation`, its class;
  `stochround.emulate.ops`: which ops and dtypes it rounds, and how;
  `stochround.emulate.supported`: the check of every op's tensors (no complex, no sparse);
  `stochround.emulate.torch_hooks`: its per-op path's hooks into PyTorch (Dynamo kept out
  of the mode, each op called through its native function);
- `stochround.emulate.mca`: Monte Carlo arithmetic on an unmodified function, `mca`, and
  its result, `MCAResult`; `stochround.emulate.mca_trace`: its trace (``trace=True``),
  the digits per line of the program;
- `stochround.emulate.compiled`: `backend`, the `torch.compile` backend that emulates at
  compiled speed (`EmulationBackend`), with `graph_rounding` (the rounding as graph ops),
  `graph_words` (SR's random words as one op Inductor lowers compactly) and `opaque`
  (the ops Inductor may compute itself); `stochround.emulate.exact`: a float64 op's
  exact result as hi + lo and its SR; `stochround.emulate.mca_digits`: significant digits
  with a confidence (Sohier et al.).
"""

from __future__ import annotations

from .compiled import EmulationBackend, backend
from .dispatch import Emulation
from .mca import MCAResult, mca
from .mode import emulate

__all__ = ["Emulation", "EmulationBackend", "MCAResult", "backend", "emulate", "mca"]
