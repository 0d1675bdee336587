"""Monte Carlo arithmetic: rerun a computation whose roundings are random and measure how
many significant digits its result keeps (Parker 1997)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import random as streams
from .. import rounding
from ..formats import Format
from .checks import eager_only, format_and_mode

__all__ = ["MonteCarloResult", "monte_carlo"]


@dataclass(frozen=True)
class MonteCarloResult:
    """n results of a computation under random rounding (float64, shape (n, *result)) and,
    elementwise, their mean, sample std (n - 1) and significant decimal digits."""

    samples: Tensor
    mean: Tensor
    std: Tensor
    digits: Tensor


@eager_only
def monte_carlo(
    fn: Callable[..., object],
    *args: object,
    n: int = 32,
    fmt: Format | str,
    mode: str = "sr",
    seed: int = 0,
    **kwargs: object,
) -> MonteCarloResult:
    """Monte Carlo arithmetic (Parker 1997; as PyTracer and verificarlo use it): run
    ``fn(*args, rounding=rounding, **kwargs)`` n times, where ``rounding(t)`` is
    ``stochround.round(t, fmt, mode, seed=seed, offset=k)`` and k counts the calls over all
    n runs (0, 1, 2, ...), so every call draws fresh bits and the whole is reproducible.

    digits = -log10(std / |mean|), clamped to [0, p log10 2] with p = fmt.mbits + 1 the
    format's precision: std == 0 (every sample agrees, e.g. a deterministic mode) gives the
    format's p log10 2 digits, mean == 0 with std > 0 gives 0; NaN samples give NaN.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (a std needs two samples); got {n!r}")
    fmt, mode = format_and_mode(fmt, mode)
    streams.check_seed(seed, "seed")
    calls = 0

    def round_once(t: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        return rounding.round(t, fmt, mode, seed=seed, offset=calls - 1)

    results = [
        torch.as_tensor(fn(*args, rounding=round_once, **kwargs)).to(torch.float64)
        for _ in range(n)
    ]
    samples = torch.stack(results)
    mean = samples.mean(dim=0)
    std = samples.std(dim=0, correction=1)
    max_digits = (fmt.mbits + 1) * math.log10(2)
    with torch.no_grad():
        ratio = std / mean.abs()
        digits = torch.where(std == 0, max_digits, (-torch.log10(ratio)).clamp(0, max_digits))
    return MonteCarloResult(samples, mean, std, digits)
