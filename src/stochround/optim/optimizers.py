"""AdamW, SGD and Lion with parameters and states in float32, bfloat16 or float16.

Each step computes the update in float32, in the same order as torch's single-tensor
(``foreach=False``) implementations, then stores the parameter and each state rounded to
its dtype by ``rounding`` ("sr": exact stochastic rounding, "rne": round to nearest even,
"kahan": nearest plus a compensation buffer, "ecc": nearest plus an int8 residual; see
:mod:`stochround.optim.base`). ``master_weights=True`` keeps a float32 master copy of each
low-precision parameter, updates it, and stores the parameter as its rounded copy.
With float32 parameters and states the result is bit-identical to ``torch.optim``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .base import TENSOR_SLOTS, SROptimizer, check_float, store


class AdamW(SROptimizer):
    """AdamW (Loshchilov & Hutter) with rounded stores.

    ``p <- p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`` with
    ``m <- lerp(m, g, 1 - b1)``, ``v <- b2 v + (1 - b2) g^2``, all in float32; ``p``, ``m``
    and ``v`` are then each rounded once to their storage dtype.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        maximize: bool = False,
        state_dtype: torch.dtype = torch.float32,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "state_dtype": state_dtype,
            "rounding": rounding,
            "seed": seed,
            "master_weights": master_weights,
        }
        super().__init__(params, defaults)

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        check_float(group["lr"], "lr")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair of floats in [0, 1), got {betas!r}")
        group["betas"] = (
            check_float(betas[0], "betas[0]", below=1.0),
            check_float(betas[1], "betas[1]", below=1.0),
        )
        check_float(group["eps"], "eps")
        check_float(group["weight_decay"], "weight_decay")
        group["maximize"] = bool(group["maximize"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, index, param in self.indexed_params():
            state = self.state[param]
            if "exp_avg" not in state:
                for name in self.state_names:
                    state[name] = torch.zeros_like(
                        param, dtype=group["state_dtype"], memory_format=torch.preserve_format
                    )
            step = self.advance_step(param)
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            grad = param.grad.float()
            if group["maximize"]:
                grad = -grad
            value = self.load_param(group, param)
            value.mul_(1 - lr * group["weight_decay"])
            exp_avg = state["exp_avg"].float().lerp(grad, 1 - beta1)
            exp_avg_sq = state["exp_avg_sq"].float().mul(beta2)
            exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
            step_size = lr / (1 - beta1**step)
            bias_correction2_sqrt = math.sqrt(1 - beta2**step)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
            value.addcdiv_(exp_avg, denom, value=-step_size)
            rounding, seed = group["rounding"], group["seed"]
            self.store_param(group, param, value, step, index)
            for name in self.state_names:
                computed = exp_avg if name == "exp_avg" else exp_avg_sq
                store(state[name], computed, rounding, seed, step, index, TENSOR_SLOTS[name])
        return loss


class SGD(SROptimizer):
    """SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's update),
    with rounded stores.

    ``g <- g + wd p``; ``b <- mu b + (1 - dampening) g`` (``b <- g`` on the first step);
    ``g <- g + mu b`` (Nesterov) or ``g <- b``; ``p <- p - lr g``; in float32, then ``p`` and
    ``b`` are each rounded once to their storage dtype.
    """

    state_names = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        state_dtype: torch.dtype = torch.float32,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "state_dtype": state_dtype,
            "rounding": rounding,
            "seed": seed,
            "master_weights": master_weights,
        }
        super().__init__(params, defaults)

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        check_float(group["lr"], "lr")
        check_float(group["momentum"], "momentum")
        check_float(group["dampening"], "dampening")
        check_float(group["weight_decay"], "weight_decay")
        group["nesterov"] = bool(group["nesterov"])
        group["maximize"] = bool(group["maximize"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")

    def state_count(self, group: dict[str, Any]) -> int:
        return 1 if group["momentum"] != 0 else 0

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, index, param in self.indexed_params():
            step = self.advance_step(param)
            state = self.state[param]
            momentum = group["momentum"]
            grad = param.grad.float()
            if group["maximize"]:
                grad = -grad
            value = self.load_param(group, param)
            if group["weight_decay"] != 0:
                grad = grad.add(value, alpha=group["weight_decay"])
            rounding, seed = group["rounding"], group["seed"]
            if momentum != 0:
                if "momentum_buffer" not in state:
                    buffer = grad.clone()
                    state["momentum_buffer"] = torch.empty_like(
                        param, dtype=group["state_dtype"], memory_format=torch.preserve_format
                    )
                else:
                    buffer = state["momentum_buffer"].float().mul(momentum)
                    buffer.add_(grad, alpha=1 - group["dampening"])
                grad = grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer
                slot = TENSOR_SLOTS["momentum_buffer"]
                store(state["momentum_buffer"], buffer, rounding, seed, step, index, slot)
            value = value.add(grad, alpha=-float(group["lr"]))
            self.store_param(group, param, value, step, index)
        return loss


class Lion(SROptimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") with rounded
    stores.

    ``u = sign(b1 m + (1 - b1) g)``; ``p <- p (1 - lr wd) - lr u`` (decoupled weight decay,
    the mathematical ``p - lr (u + wd p)``); ``m <- b2 m + (1 - b2) g``; in float32, in that
    order (``p.mul_(1 - lr wd)``, ``p.add_(u, alpha=-lr)``, ``m.mul_(b2).add_(g,
    alpha=1 - b2)``), then ``p`` and ``m`` (state ``exp_avg``, stream slot 1) are each
    rounded once to their storage dtype. ``sign(0) = 0``.
    """

    state_names = ("exp_avg",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        state_dtype: torch.dtype = torch.float32,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "state_dtype": state_dtype,
            "rounding": rounding,
            "seed": seed,
            "master_weights": master_weights,
        }
        super().__init__(params, defaults)

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        check_float(group["lr"], "lr")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair of floats in [0, 1), got {betas!r}")
        group["betas"] = (
            check_float(betas[0], "betas[0]", below=1.0),
            check_float(betas[1], "betas[1]", below=1.0),
        )
        check_float(group["weight_decay"], "weight_decay")
        group["maximize"] = bool(group["maximize"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, index, param in self.indexed_params():
            state = self.state[param]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(
                    param, dtype=group["state_dtype"], memory_format=torch.preserve_format
                )
            step = self.advance_step(param)
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            grad = param.grad.float()
            if group["maximize"]:
                grad = -grad
            value = self.load_param(group, param)
            value.mul_(1 - lr * group["weight_decay"])
            exp_avg = state["exp_avg"].float()
            update = exp_avg.mul(beta1).add_(grad, alpha=1 - beta1).sign_()
            value.add_(update, alpha=-lr)
            exp_avg = exp_avg.mul(beta2).add_(grad, alpha=1 - beta2)
            rounding, seed = group["rounding"], group["seed"]
            self.store_param(group, param, value, step, index)
            slot = TENSOR_SLOTS["exp_avg"]
            store(state["exp_avg"], exp_avg, rounding, seed, step, index, slot)
        return loss
