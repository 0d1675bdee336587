"""SR arithmetic emulation: operations whose exact result is rounded once to a format.

- `stochround.arith.elementwise`: ``add``, ``sub``, ``mul``, ``div``, ``fma``, ``sqrt`` and
  `round_pair`, which rounds an exact value held as a float64 pair ``hi + lo``;
- `stochround.arith.reductions`: ``sum``, ``dot`` and ``matmul`` with an accumulator in a
  chosen format and a chosen accumulation order (`ORDERS`);
- `stochround.arith.montecarlo`: Monte Carlo arithmetic, ``monte_carlo``;
- `stochround.arith.gradients`: the gradient rule every operation follows, the exact
  operation's derivative straight through the rounding.

The package is `stochround.ops` too.
"""

from __future__ import annotations

from .elementwise import add, div, fma, mul, round_pair, sqrt, sub
from .montecarlo import MonteCarloResult, monte_carlo

# `sum` is the reduction's public name, as torch.sum's: here it shadows the builtin on purpose
from .reductions import ORDERS, dot, matmul, reduction_rand_shape, sum  # noqa: A004

__all__ = ["add", "div", "fma", "mul", "round_pair", "sqrt", "sub"]
__all__ += ["ORDERS", "MonteCarloResult", "dot", "matmul", "monte_carlo"]
__all__ += ["reduction_rand_shape", "sum"]
