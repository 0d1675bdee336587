"""The float32 update of each optimizer, one rounding per operation: the spec of the fused
kernel (`stochround.kernels.optim`), which computes the same operations in the same order.

Every operation is a single IEEE float32 multiply, add, subtract, divide (of two tensors)
or correctly rounded square root, with float32 scalars: no ``lerp``,
``addcmul``, ``addcdiv`` or ``add(alpha=)``, which torch's CPU kernels evaluate with fused
multiply-adds (so their results depend on the instruction set) while GPU kernels may not.
The results therefore agree with ``torch.optim``'s single-tensor updates to within float32
rounding, and bit for bit between CPU, CUDA and the Triton kernel.

The scalars of a step (``*_scalars``: one float32 row per parameter) are computed from the
step counts and ``lr`` as tensors, in float64 and rounded once, so that nothing a step
reads changes a Python value: ``torch.compile`` does not recompile when a scheduler moves
a tensor ``lr`` (a float ``lr`` becomes a graph input after one recompile, as in
torch.optim), and a CUDA graph replaying a step reads the current ``lr`` and step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def correctly_rounded_sqrt(x: Tensor) -> Tensor:
    """float32 sqrt rounded to nearest even.  torch's CPU float32 sqrt is not always (its
    vectorized kernels can be one ulp off); the float64 root rounded once more to float32 is
    (double rounding is innocuous for sqrt when the wider precision is at least 2p + 2
    bits: 53 >= 50, Figueroa 1995)."""
    return x.double().sqrt().float()


STEP_BITS = 32  # step counts below 2**32 (the stream offset holds them in 32 bits)


def power_squares(beta: float) -> tuple[float, ...]:
    """``beta ** (2 ** k)`` for ``k = 0 .. 31``, each the float64 square of the one before."""
    squares = [float(beta)]
    for _ in range(STEP_BITS - 1):
        squares.append(squares[-1] * squares[-1])
    return tuple(squares)


def bias_power(squares: Tensor, steps: Tensor) -> Tensor:
    """``beta ** t`` in float64 for the int64 ``steps`` t: the product of ``squares[k]``
    (`power_squares`) over the set bits ``k`` of ``t``, with 1 for the clear bits, multiplied
    as a fixed pairwise tree (``(f0 f1)(f2 f3)...``, five levels).  Only IEEE float64
    multiplications, in an order that does not depend on the backend: the Triton kernel
    computes the same bits (``torch.pow`` and libm's ``pow`` differ by an ulp at times)."""
    k = torch.arange(STEP_BITS, device=steps.device)
    bits = (steps.unsqueeze(-1) >> k) & 1
    factors = torch.where(bits == 1, squares.to(steps.device), 1.0)
    while factors.shape[-1] > 1:
        factors = factors[..., 0::2] * factors[..., 1::2]
    return factors.squeeze(-1)


def _as_float64(value: float | Tensor, like: Tensor) -> Tensor:
    """A float or tensor as a float64 tensor broadcast to ``like``'s shape.  A float is
    added to zeros: torch.compile then reads a float that changes between calls (an ``lr``
    a scheduler moves) as a graph input, where ``torch.as_tensor`` or ``torch.full`` would
    bake it in as a constant and recompile at every change (adding to +0 changes no value
    but -0's sign)."""
    if not isinstance(value, Tensor):
        return torch.zeros(like.shape, dtype=torch.float64, device=like.device) + value
    tensor = value.to(device=like.device, dtype=torch.float64)
    return (tensor.reshape(()) if tensor.numel() == 1 else tensor).expand(like.shape)


def _rows(columns: list[float | Tensor], steps: Tensor) -> Tensor:
    """float32 ``(len(steps), len(columns))``: each float64 column rounded once."""
    return torch.stack([_as_float64(c, steps) for c in columns], dim=-1).to(torch.float32)


def adamw_scalars(
    lr: float | Tensor,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    steps: Tensor,
    *,
    coupled: bool = False,
) -> Tensor:
    """Rows (1 - lr wd, 1 - b1, b2, 1 - b2, 1 / sqrt(1 - b2^t), eps, lr / (1 - b1^t), 0) for
    the int64 ``steps`` t, with ``betas`` (b1, b2) and ``weight_decay`` wd: computed in
    float64 (``b^t`` by `bias_power`), each rounded once to float32.  ``coupled`` (Adam's
    L2 decay, added to the gradient): the first column is 1 and the last wd.  ``lr`` may be
    a tensor (so a scheduler changing it changes no Python value).  The bias correction
    multiplies by a reciprocal: torch divides a tensor by a scalar that way (so its CPU and
    CUDA kernels agree only on the multiplication)."""
    beta1, beta2 = betas
    lr = _as_float64(lr, steps)
    power1 = bias_power(torch.tensor(power_squares(beta1), dtype=torch.float64), steps)
    power2 = bias_power(torch.tensor(power_squares(beta2), dtype=torch.float64), steps)
    decoupled, l2 = (0.0, weight_decay) if coupled else (weight_decay, 0.0)
    columns: list[float | Tensor] = [
        1 - lr * decoupled,
        1 - beta1,
        beta2,
        1 - beta2,
        1 / torch.sqrt(1 - power2),
    ]
    return _rows([*columns, eps, lr / (1 - power1), l2], steps)


def adamw_update(
    value: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    *,
    coupled: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """``g + x wd`` (``coupled``: Adam's L2 decay); ``x d``; ``m + (g - m)(1 - b1)``;
    ``v b2 + ((1 - b2) g) g``; ``x - s (m / (sqrt(v) r + eps))`` with the `adamw_scalars`
    ``d, r, s, wd``: new (parameter, exp_avg, exp_avg_sq).  ``x``, ``g``, ``m``, ``v``:
    the float32 ``value``, ``grad``, ``exp_avg``, ``exp_avg_sq``; ``scalars``: one
    `adamw_scalars` row."""
    decay, weight1, beta2, weight2, reciprocal2, eps, step_size, weight_decay = scalars
    if coupled:
        grad = grad + value * weight_decay
    value = value * decay
    exp_avg = exp_avg + (grad - exp_avg) * weight1
    exp_avg_sq = exp_avg_sq * beta2 + (grad * weight2) * grad
    denom = correctly_rounded_sqrt(exp_avg_sq) * reciprocal2 + eps
    return value - (exp_avg / denom) * step_size, exp_avg, exp_avg_sq


def sgd_scalars(
    lr: float | Tensor, momentum: float, dampening: float, weight_decay: float, steps: Tensor
) -> Tensor:
    """Rows (lr, momentum, 1 - dampening, weight_decay), one per int64 step count in
    ``steps``, rounded to float32."""
    return _rows([lr, momentum, 1 - dampening, weight_decay], steps)


def sgd_update(
    value: Tensor,
    grad: Tensor,
    buffer: Tensor | None,
    scalars: Tensor,
    *,
    decay: bool,
    momentum: bool,
    nesterov: bool,
    first: bool,
) -> tuple[Tensor, Tensor | None]:
    """``g + wd x`` (``decay``: wd != 0); momentum ``b mu + (1 - dampening) g`` (``g`` on
    the first step); ``g + mu b`` (Nesterov) or ``b``; ``x - lr g``: new (parameter,
    buffer), with the `sgd_scalars` row ``scalars``.  No momentum: buffer None out.
    ``x``, ``g``, ``b``: the float32 ``value``, ``grad``, ``buffer`` (None on the first
    step and without momentum); ``momentum``: mu != 0; ``nesterov``: the Nesterov form;
    ``first``: the buffer's first step."""
    lr, mu, weight, weight_decay = scalars
    if decay:
        grad = grad + value * weight_decay
    if momentum:
        buffer = grad if first else buffer * mu + grad * weight
        grad = grad + buffer * mu if nesterov else buffer
    return value - grad * lr, buffer


def lion_scalars(
    lr: float | Tensor, betas: tuple[float, float], weight_decay: float, steps: Tensor
) -> Tensor:
    """Rows (1 - lr wd, b1, 1 - b1, b2, 1 - b2, lr) with ``betas`` (b1, b2) and
    ``weight_decay`` wd, one per int64 step count in ``steps``, rounded to float32."""
    beta1, beta2 = betas
    lr = _as_float64(lr, steps)
    return _rows([1 - lr * weight_decay, beta1, 1 - beta1, beta2, 1 - beta2, lr], steps)


def lion_update(
    value: Tensor, grad: Tensor, exp_avg: Tensor, scalars: Tensor
) -> tuple[Tensor, Tensor]:
    """``x d - lr sign(m b1 + (1 - b1) g)``; ``m b2 + (1 - b2) g``: new (parameter,
    exp_avg); ``sign`` is torch.sign (+0 for zeros and NaN).  ``x``, ``g``, ``m``: the
    float32 ``value``, ``grad``, ``exp_avg``; ``scalars``: one `lion_scalars` row (``d`` its
    first column)."""
    decay, beta1, weight1, beta2, weight2, lr = scalars
    direction = exp_avg * beta1 + grad * weight1
    value = value * decay - torch.sign(direction) * lr
    return value, exp_avg * beta2 + grad * weight2
