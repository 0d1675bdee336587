"""How a parameter and its states are kept in bfloat16/float16 between steps: rounded
stores, and the extra state of "kahan", "ecc" and ``master_weights``.

Parameter storage (``rounding`` and ``master_weights``). The update is always computed in
float32 from the parameter's float32 value ``x``; how ``x`` is kept between steps:

- ``"sr"`` / ``"rne"``: ``x`` is the stored parameter; the new value is rounded once into
  it (stochastically on stream slot 0, or to nearest even).
- ``"kahan"``: compensated summation. A buffer ``c`` in the parameter's dtype (state
  ``"compensation"``) holds what the rounded store lost, ``c = rne(x_new - p)`` with
  ``p = rne(x_new)``; the next step starts from ``x = p + c``, so updates smaller than
  half an ulp of ``p`` accumulate in ``c`` until they move ``p``. +2 B/param for bf16.
- ``"ecc"``: HeavyBall's error correction: ``p = rne(x_new)`` plus an int8 residual
  (state ``"ecc_residual"``) ``q = round(254 (x_new - p) / ulp(p))`` clamped to
  [-127, 127], ``ulp(p)`` the spacing of the parameter's dtype at ``|p|``; the next step
  starts from ``x = p + q ulp(p) / 254``. +1 B/param. The scale is HeavyBall 3.2.1's
  (`_ULPState` with int8: ``ulp / 2`` per 127 units, ulp from the exponent field, the
  subnormal spacing at zero); HeavyBall rounds ``q`` stochastically with an unseeded
  ``torch.rand_like``, this rounds it to nearest (the difference is below ``ulp / 508``).
- ``master_weights=True`` (with "sr" or "rne"): an exact float32 copy of the parameter
  (state ``"master"``); ``x`` is the master, the update is applied to it, and the
  parameter is its rounded copy. +4 B/param. The master is the truth: a parameter written
  from outside the optimizer is overwritten at the next step.

All three extra states exist only for bfloat16/float16 parameters (a float32 parameter
is exact already). States (``exp_avg`` ...) are stored by "sr" when ``rounding="sr"`` and
to nearest even otherwise ("kahan" and "ecc" concern the parameter only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..rounding import cast
from .streams import TENSOR_SLOTS, state_stream_offset

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
MIN_NORMAL_EXPONENT = {torch.bfloat16: -126, torch.float16: -14}
ECC_SCALE = 254.0  # |x - rne(x)| <= ulp / 2  ->  |q| <= 127
# the extra parameter state each rounding keeps beside a low-precision parameter
ROUNDING_STATES = {"kahan": "compensation", "ecc": "ecc_residual"}
# bytes per element of each extra parameter state (None: the parameter's own size)
EXTRA_STATE_BYTES: dict[str, int | None] = {"master": 4, "compensation": None, "ecc_residual": 1}


def store(
    target: Tensor, value: Tensor, rounding: str, key: int, step: Tensor, index: int, slot: int
) -> None:
    """``target.copy_(rounded value)``: float32 ``value`` rounded to ``target``'s dtype.

    float32 targets take the value as computed; "sr" draws stream
    ``(key, state_stream_offset(step, index, slot))``, ``key`` the group's `group_key`; every
    other mode ("rne", and "kahan" and
    "ecc" for states) is torch's round-to-nearest-even cast (the same as
    ``stochround.cast(value, dtype, "rne")``).
    """
    if target.dtype == torch.float32:
        target.copy_(value)
    elif rounding != "sr":
        target.copy_(value.to(target.dtype))
    else:
        offset = state_stream_offset(step, index, slot)
        target.copy_(cast(value, target.dtype, "sr", seed=key, offset=offset))


def param_ulp(param: Tensor) -> Tensor:
    """float32 spacing of ``param``'s dtype (bfloat16/float16) at ``|param|``: ``2**(e - m)``
    with ``|param|`` in ``[2**e, 2**(e+1))`` and ``m`` the mantissa bits; the subnormal
    spacing ``2**(emin - m)`` for subnormals and zero."""
    mantissa, emin = MANTISSA_BITS[param.dtype], MIN_NORMAL_EXPONENT[param.dtype]
    _, exponent = torch.frexp(param.float())  # |p| = f 2**exponent, f in [0.5, 1)
    exponent = torch.where(param == 0, emin + 1, exponent).clamp_(min=emin + 1)
    ones = torch.ones_like(exponent, dtype=torch.float32)
    return torch.ldexp(ones, exponent - 1 - mantissa)


def ecc_encode(value: Tensor, param: Tensor) -> Tensor:
    """int8 ``round(254 (value - param) / param_ulp(param))`` clamped to [-127, 127]."""
    residual = (value - param.float()) / param_ulp(param) * ECC_SCALE
    return residual.round_().clamp_(-127, 127).to(torch.int8)


def ecc_decode(param: Tensor, residual: Tensor) -> Tensor:
    """float32 ``param + residual ulp(param) / 254``."""
    return param.float() + residual.float() * (param_ulp(param) / ECC_SCALE)


def param_state_name(group: dict[str, Any], param: Tensor) -> str | None:
    """The extra state that keeps ``param``'s exact value under ``group``'s options, if any:
    "master", "compensation" ("kahan"), "ecc_residual" ("ecc"); none for float32."""
    if param.dtype == torch.float32:
        return None
    if group.get("master_weights", False):
        return "master"
    return ROUNDING_STATES.get(group["rounding"])


def load_param_value(state: dict[str, Any], name: str | None, param: Tensor) -> Tensor:
    """A fresh float32 tensor: the parameter's value the update starts from (the master,
    ``p + c`` under "kahan", ``p + q ulp(p) / 254`` under "ecc", else ``p``), its extra
    state ``name`` created in ``state`` on first use."""
    if name is not None and name not in state:
        if name == "master":
            state[name] = param.detach().float().clone(memory_format=torch.preserve_format)
        else:
            dtype = torch.int8 if name == "ecc_residual" else param.dtype
            state[name] = torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
    if name == "master":
        return state["master"].clone()
    if name == "compensation":
        return param.float() + state["compensation"].float()
    if name == "ecc_residual":
        return ecc_decode(param, state["ecc_residual"])
    # float() returns the parameter itself when it is float32 already
    return param.float().clone() if param.dtype == torch.float32 else param.float()


def store_param_value(
    state: dict[str, Any],
    name: str | None,
    param: Tensor,
    value: Tensor,
    stream: tuple[str, int, Tensor, int],
) -> None:
    """Keep the float32 ``value`` as the parameter and its extra state ``name`` (the module
    docstring); ``stream``: the group's rounding and `group_key`, the step and the
    parameter's index, for a rounded store."""
    rounding, key, step, index = stream
    if name == "master":
        state["master"].copy_(value)
        store(param, value, rounding, key, step, index, TENSOR_SLOTS["param"])
    elif name == "compensation":
        param.copy_(value.to(param.dtype))
        state["compensation"].copy_((value - param.float()).to(param.dtype))
    elif name == "ecc_residual":
        param.copy_(value.to(param.dtype))
        state["ecc_residual"].copy_(ecc_encode(value, param))
    else:
        store(param, value, rounding, key, step, index, TENSOR_SLOTS["param"])


def extra_state_bytes(name: str, param: Tensor) -> int:
    """Bytes per element of ``param``'s extra state ``name``."""
    size = EXTRA_STATE_BYTES[name]
    return param.element_size() if size is None else size


__all__ = [
    "ECC_SCALE",
    "EXTRA_STATE_BYTES",
    "MANTISSA_BITS",
    "MIN_NORMAL_EXPONENT",
    "ROUNDING_STATES",
    "ecc_decode",
    "ecc_encode",
    "extra_state_bytes",
    "load_param_value",
    "param_state_name",
    "param_ulp",
    "store",
    "store_param_value",
]
