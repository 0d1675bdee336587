"""The optimizers' argument checks: each an error naming the argument and the values it
takes, and torch.optim's implementation keywords resolved to a ``backend``."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from ..kernels.availability import check_backend
from ..random import check_seed

ROUNDINGS: tuple[str, ...] = ("sr", "rne", "kahan", "ecc")
STATE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
PARAM_DTYPES = STATE_DTYPES
MAX_PARAMS = 1 << 30
# torch.optim's implementation choices: options of the whole optimizer here (``backend``),
# dropped from the groups of a loaded torch checkpoint
IMPLEMENTATION_KEYS: tuple[str, ...] = ("foreach", "fused", "capturable", "differentiable")


def check_float(value: object, name: str, *, low: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float ``>= low`` (and ``< below`` when given), else a
    ValueError/TypeError naming it ``name``; a one-element tensor is read as its value."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not (value >= low and (below is None or value < below)):  # also rejects NaN
        bound = f"in [{low}, {below})" if below is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_betas(betas: object) -> tuple[float, float]:
    """A pair of floats in [0, 1), else ValueError/TypeError naming ``betas``."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair of floats in [0, 1), got {betas!r}")
    return (
        check_float(betas[0], "betas[0]", below=1.0),
        check_float(betas[1], "betas[1]", below=1.0),
    )


def check_rounding(rounding: object) -> str:
    """``rounding`` if it is one of `ROUNDINGS`, else ValueError."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}; got {rounding!r}")
    return str(rounding)


def check_state_dtype(state_dtype: object) -> torch.dtype | None:
    """``state_dtype`` if it is None or one of `STATE_DTYPES`, else TypeError/ValueError."""
    if state_dtype is None:
        return None
    if not isinstance(state_dtype, torch.dtype):
        raise TypeError(
            f"state_dtype must be None or a torch.dtype, got {type(state_dtype).__name__}"
        )
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype must be None or one of {STATE_DTYPES}; got {state_dtype}")
    return state_dtype


def check_seed_argument(seed: object) -> int:
    """An int seed in [0, 2**64), else ValueError/TypeError naming ``seed``."""
    if isinstance(seed, Tensor):
        raise TypeError("seed must be an int in [0, 2**64) (tensor seeds are not supported yet)")
    return int(check_seed(seed, "seed"))


def check_param_indices(indices: object, count: int) -> tuple[int, ...]:
    """``indices`` as a tuple of ``count`` distinct ints in [0, 2**30) (the stream index of
    each parameter: two equal indices would draw one stream), else ValueError/TypeError."""
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
        raise TypeError(f"indices must be a sequence of ints, got {type(indices).__name__}")
    if any(isinstance(value, bool) or not isinstance(value, numbers.Integral) for value in indices):
        raise TypeError("indices must be ints")
    values = tuple(int(value) for value in indices)
    if len(values) != count:
        raise ValueError(f"indices must give each of the {count} parameters one, got {len(values)}")
    if any(not 0 <= value < MAX_PARAMS for value in values):
        raise ValueError("indices must be in [0, 2**30)")
    if len(set(values)) != len(values):
        raise ValueError("indices must be distinct: two parameters would draw the same words")
    return values


def check_flag(value: object, name: str, *, optional: bool = False) -> bool | None:
    """``value`` if it is a bool (or None when ``optional``), else TypeError naming ``name``."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    allowed = "a bool or None" if optional else "a bool"
    raise TypeError(f"{name} must be {allowed}, got {type(value).__name__}")


def resolve_backend(
    backend: str, foreach: object, fused: object, capturable: object, differentiable: object
) -> str:
    """The backend that ``backend`` and torch.optim's implementation keywords ask for.

    ``foreach`` and ``capturable`` change nothing (every implementation gives the same bits
    and every step can be captured); ``fused=True`` is ``backend="triton"``, ``fused=False``
    ``backend="torch"`` (another explicit backend raises ValueError); ``differentiable=True``
    and ``foreach=fused=True`` raise ValueError."""
    check_backend(backend)
    check_flag(foreach, "foreach", optional=True)
    check_flag(fused, "fused", optional=True)
    check_flag(capturable, "capturable")
    check_flag(differentiable, "differentiable")
    if differentiable:
        raise ValueError(
            "differentiable=True is not supported: the step runs under torch.no_grad and a "
            "rounded store has no useful derivative; pass differentiable=False"
        )
    if foreach and fused:
        raise ValueError("foreach=True and fused=True cannot be set together (as in torch.optim)")
    if fused is None:
        return backend
    wanted = "triton" if fused else "torch"
    if backend not in ("auto", wanted):
        raise ValueError(
            f"fused={fused} asks for backend={wanted!r}, but backend={backend!r} was passed: "
            "pass one of them"
        )
    return wanted


__all__ = [
    "IMPLEMENTATION_KEYS",
    "MAX_PARAMS",
    "PARAM_DTYPES",
    "ROUNDINGS",
    "STATE_DTYPES",
    "check_betas",
    "check_flag",
    "check_float",
    "check_param_indices",
    "check_rounding",
    "check_seed_argument",
    "check_state_dtype",
    "resolve_backend",
]
