"""The float32 update of each optimizer, one rounding per operation: the spec of the fused
kernel (`stochround.kernels.optim`), which computes the same operations in the same order.

Every operation is a single IEEE float32 multiply, add, subtract, divide (of two tensors)
or correctly rounded square root, with Python scalars rounded to float32: no ``lerp``,
``addcmul``, ``addcdiv`` or ``add(alpha=)``, which torch's CPU kernels evaluate with fused
multiply-adds (so their results depend on the instruction set) while GPU kernels may not.
The results therefore agree with ``torch.optim``'s single-tensor updates to within float32
rounding, and bit for bit between CPU, CUDA and the Triton kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def correctly_rounded_sqrt(x: Tensor) -> Tensor:
    """float32 sqrt rounded to nearest even.  torch's CPU float32 sqrt is not (seen: 0.7%
    of uniform inputs one ulp off on an AVX-512 build); the float64 root rounded once more
    to float32 is (double rounding is innocuous for sqrt when the wider precision is at
    least 2p + 2 bits: 53 >= 50, Figueroa 1995)."""
    return x.double().sqrt().float()


def adamw_scalars(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float, step: int
) -> list[float]:
    """(1 - lr wd, 1 - b1, b2, 1 - b2, 1 / sqrt(1 - b2^t), eps, lr / (1 - b1^t)), in
    float64; each operation rounds it to float32.  The bias correction multiplies by a
    reciprocal: torch divides a tensor by a scalar that way (so its CPU and CUDA kernels
    agree only on the multiplication)."""
    beta1, beta2 = betas
    return [
        1 - lr * weight_decay,
        1 - beta1,
        beta2,
        1 - beta2,
        1 / math.sqrt(1 - beta2**step),
        eps,
        lr / (1 - beta1**step),
    ]


def adamw_update(
    value: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, scalars: list[float]
) -> tuple[Tensor, Tensor, Tensor]:
    """``x d``; ``m + (g - m)(1 - b1)``; ``v b2 + ((1 - b2) g) g``; ``x - s (m / (sqrt(v) r
    + eps))`` with the `adamw_scalars` ``d, r, s``: new (parameter, exp_avg, exp_avg_sq)."""
    decay, weight1, beta2, weight2, reciprocal2, eps, step_size = scalars
    value = value * decay
    exp_avg = exp_avg + (grad - exp_avg) * weight1
    exp_avg_sq = exp_avg_sq * beta2 + (grad * weight2) * grad
    denom = correctly_rounded_sqrt(exp_avg_sq) * reciprocal2 + eps
    return value - (exp_avg / denom) * step_size, exp_avg, exp_avg_sq


def sgd_scalars(lr: float, momentum: float, dampening: float, weight_decay: float) -> list[float]:
    """(lr, momentum, 1 - dampening, weight_decay)."""
    return [lr, momentum, 1 - dampening, weight_decay]


def sgd_update(
    value: Tensor,
    grad: Tensor,
    buffer: Tensor | None,
    scalars: list[float],
    *,
    nesterov: bool,
    first: bool,
) -> tuple[Tensor, Tensor | None]:
    """``g + wd x`` (when wd != 0); momentum ``b mu + (1 - dampening) g`` (``g`` on the first
    step); ``g + mu b`` (Nesterov) or ``b``; ``x - lr g``: new (parameter, buffer).  No
    momentum: ``buffer`` None in and out."""
    lr, momentum, weight, weight_decay = scalars
    if weight_decay != 0:
        grad = grad + value * weight_decay
    if momentum != 0:
        buffer = grad if first else buffer * momentum + grad * weight
        grad = grad + buffer * momentum if nesterov else buffer
    return value - grad * lr, buffer


def lion_scalars(lr: float, betas: tuple[float, float], weight_decay: float) -> list[float]:
    """(1 - lr wd, b1, 1 - b1, b2, 1 - b2, lr)."""
    beta1, beta2 = betas
    return [1 - lr * weight_decay, beta1, 1 - beta1, beta2, 1 - beta2, lr]


def lion_update(
    value: Tensor, grad: Tensor, exp_avg: Tensor, scalars: list[float]
) -> tuple[Tensor, Tensor]:
    """``x d - lr sign(m b1 + (1 - b1) g)``; ``m b2 + (1 - b2) g``: new (parameter,
    exp_avg); ``sign`` is torch.sign (+0 for zeros and NaN)."""
    decay, beta1, weight1, beta2, weight2, lr = scalars
    direction = exp_avg * beta1 + grad * weight1
    value = value * decay - torch.sign(direction) * lr
    return value, exp_avg * beta2 + grad * weight2
