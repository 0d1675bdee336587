"""AdamW, Adam, SGD and Lion with parameters and states in float32, bfloat16 or float16.

Each step computes the update in float32 (`stochround.optim.updates`: torch's single-tensor
updates with one rounding per operation), then stores the parameter and each state rounded
to its dtype by ``rounding`` ("sr": exact stochastic rounding, "rne": round to nearest
even, "kahan": nearest plus a compensation buffer, "ecc": nearest plus an int8 residual;
see `stochround.optim.encodings`). ``master_weights=True`` keeps a float32 master copy of
each low-precision parameter, updates it, and stores the parameter as its rounded copy.
With float32 parameters and states the result agrees with ``torch.optim`` to within
float32 rounding.  On CUDA one fused Triton launch updates all parameters of a group
(``backend``, `stochround.optim.fused`), bit-identical to the PyTorch path.  The keywords
every optimizer shares are described once, in the Optimizers guide
(docs/guide/optimizers.md).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import contains
from typing import Any

import torch
from torch import Tensor

from ..cpu_path import worth_compiling
from .base import SROptimizer
from .checks import check_betas, check_flag, check_float
from .cpu_adamw import adamw_step_cpu, cpu_step_refusal
from .encodings import param_state_name
from .fused import grad_of
from .streams import TENSOR_SLOTS, group_key, state_stream_offset
from .updates import (
    adamw_scalars,
    adamw_update,
    lion_scalars,
    lion_update,
    power_squares,
    sgd_scalars,
    sgd_update,
)


@functools.lru_cache(maxsize=64)
def cached_power_squares(beta: float) -> tuple[float, ...]:
    """`power_squares` of the float ``beta``, cached by its value."""
    return power_squares(beta)


def adam_defaults(
    lr: float | Tensor,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    state_dtype: torch.dtype | None,
    rounding: str,
    seed: int | None,
    master_weights: bool,
    *,
    decoupled_weight_decay: bool,
) -> dict[str, Any]:
    """The group defaults of Adam and AdamW (their constructors' arguments)."""
    return {
        "lr": lr,
        "betas": betas,
        "eps": eps,
        "weight_decay": weight_decay,
        "amsgrad": amsgrad,
        "maximize": maximize,
        "state_dtype": state_dtype,
        "rounding": rounding,
        "seed": seed,
        "master_weights": master_weights,
        "decoupled_weight_decay": decoupled_weight_decay,
    }


class AdamW(SROptimizer):
    """AdamW (Loshchilov & Hutter) with rounded stores.

    ``p <- p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`` with
    ``m <- m + (g - m)(1 - b1)``, ``v <- b2 v + (1 - b2) g^2``, all in float32
    (`stochround.optim.updates.adamw_update`); ``p``, ``m`` and ``v`` are then each rounded
    once to their storage dtype.

    Arguments, as ``torch.optim.AdamW``'s: ``params`` (parameters or parameter groups);
    ``lr`` (a float or a one-element tensor), ``betas`` (b1, b2), ``eps`` and
    ``weight_decay`` (wd), the formula's; ``amsgrad``: only False (ValueError otherwise:
    the max of the second moments is not implemented); ``maximize``: ascend the objective
    (``g <- -g``).

    The storage and implementation keywords (``state_dtype``, ``rounding``, ``seed``,
    ``master_weights``, ``backend``, and torch.optim's ``foreach``, ``fused``,
    ``capturable``, ``differentiable``) are every SR optimizer's: the Optimizers guide
    (docs/guide/optimizers.md) has their values and rules.  With the default
    ``state_dtype=None`` the states take the parameter's dtype, so bfloat16 parameters
    give the 6-byte AdamW without a flag.
    """

    algorithm = "adamw"
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        state_dtype: torch.dtype | None = None,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
        backend: str = "auto",
    ) -> None:
        hyperparameters = (lr, betas, eps, weight_decay, amsgrad, maximize)
        storage = (state_dtype, rounding, seed, master_weights)
        super().__init__(
            params,
            adam_defaults(*hyperparameters, *storage, decoupled_weight_decay=True),
            backend,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        group["betas"] = check_betas(group["betas"])
        check_float(group["eps"], "eps")
        check_float(group["weight_decay"], "weight_decay")
        if check_flag(group.get("amsgrad", False), "amsgrad"):
            raise ValueError(
                "amsgrad=True is not supported (the max of the second moments is not "
                "implemented); pass amsgrad=False"
            )
        group["amsgrad"] = False
        group["decoupled_weight_decay"] = self.decouples(group)

    def decouples(self, group: dict[str, Any]) -> bool:
        """Whether ``group``'s weight decay is decoupled (AdamW: always, as torch's AdamW
        sets on every group it loads)."""
        return True

    @staticmethod
    def coupled(group: dict[str, Any]) -> bool:
        """Whether the weight decay is L2, added to the gradient (Adam's)."""
        return not group["decoupled_weight_decay"]

    def scalars(self, group: dict[str, Any], steps: Tensor) -> Tensor:
        betas, eps, wd = group["betas"], group["eps"], group["weight_decay"]
        return adamw_scalars(group["lr"], betas, eps, wd, steps, coupled=self.coupled(group))

    def constants(self, group: dict[str, Any]) -> list[float]:
        beta1, beta2 = group["betas"]
        wd = group["weight_decay"]
        decoupled, l2 = (0.0, wd) if self.coupled(group) else (wd, 0.0)
        # eagerly from a cache (a step would otherwise spend more host time on the squares
        # than on a launch); torch.compile traces the computation instead of the cache
        squares_of = power_squares if torch.compiler.is_compiling() else cached_power_squares
        squares = (*squares_of(float(beta1)), *squares_of(float(beta2)))
        return [beta1, beta2, group["eps"], decoupled, *squares, l2]

    def kernel_options(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        return {"decay": self.coupled(group) and group["weight_decay"] != 0}

    def compiled_cpu_step(self, group: dict[str, Any], param: Tensor) -> bool:
        """Whether the compiled CPU step (`stochround.optim.cpu_adamw`, the PyTorch path's
        bits) updates ``param``: backend "auto", rounding "sr" with no extra parameter
        state, outside torch.compile (which compiles this path itself), a CPU parameter
        large enough to be worth a compilation (`stochround.cpu_path.worth_compiling`)
        whose tensors the step takes (`stochround.optim.cpu_adamw.cpu_step_refusal`)."""
        if self.backend != "auto" or group["rounding"] != "sr" or param.is_cuda:
            return False
        if param_state_name(group, param) is not None or torch.compiler.is_compiling():
            return False
        state = self.state[param]
        tensors = (param, grad_of(param), state["exp_avg"], state["exp_avg_sq"])
        return worth_compiling(param.numel()) and cpu_step_refusal(*tensors) is None

    def group_kernel_options(
        self, group: dict[str, Any], states: Sequence[dict[str, Any]]
    ) -> dict[str, Any] | None:
        return {"decay": self.coupled(group) and group["weight_decay"] != 0}

    def update(
        self, group: dict[str, Any], index: int, param: Tensor, scalars: Tensor, step: Tensor
    ) -> None:
        state = self.state[param]
        coupled = self.coupled(group) and group["weight_decay"] != 0
        if self.compiled_cpu_step(group, param):
            slots = (TENSOR_SLOTS[name] for name in ("param", "exp_avg", "exp_avg_sq"))
            p, m, v = (state_stream_offset(step, index, slot) for slot in slots)
            tensors = (param, grad_of(param), state["exp_avg"], state["exp_avg_sq"])
            maximize = group["maximize"]
            adamw_step_cpu(
                *tensors, scalars, group_key(group), (p, m, v), coupled=coupled, maximize=maximize
            )
            return
        value, exp_avg, exp_avg_sq = adamw_update(
            self.load_param(group, param),
            self.gradient(group, param),
            state["exp_avg"].float(),
            state["exp_avg_sq"].float(),
            scalars,
            coupled=coupled,
        )
        self.store_param(group, param, value, step, index)
        self.store_states(group, param, (exp_avg, exp_avg_sq), step, index)


class Adam(AdamW):
    """Adam (Kingma & Ba) with rounded stores; ``weight_decay`` is L2 regularization added to
    the gradient, as in ``torch.optim.Adam`` (AdamW decouples it).

    ``g <- g + wd p``, then AdamW's update without its decoupled decay
    (`stochround.optim.updates.adamw_update` with ``coupled=True``); ``p``, ``m`` and ``v``
    are each rounded once to their storage dtype.  The fused kernel is AdamW's.

    The arguments are AdamW's (the same order and defaults, except ``weight_decay``, 0
    here), plus torch.optim.Adam's ``decoupled_weight_decay``: True makes the step
    AdamW's, bit for bit.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        state_dtype: torch.dtype | None = None,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
        backend: str = "auto",
        decoupled_weight_decay: bool = False,
    ) -> None:
        hyperparameters = (lr, betas, eps, weight_decay, amsgrad, maximize)
        storage = (state_dtype, rounding, seed, master_weights)
        defaults = adam_defaults(
            *hyperparameters, *storage, decoupled_weight_decay=decoupled_weight_decay
        )
        # AdamW's constructor fixes the decoupled decay: the base class's takes the defaults
        SROptimizer.__init__(
            self,
            params,
            defaults,
            backend,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def decouples(self, group: dict[str, Any]) -> bool:
        """The group's ``decoupled_weight_decay`` (False when a checkpoint lacks it)."""
        value = check_flag(group.get("decoupled_weight_decay", False), "decoupled_weight_decay")
        return bool(value)


class SGD(SROptimizer):
    """SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's update),
    with rounded stores.

    ``g <- g + wd p``; ``b <- mu b + (1 - dampening) g`` (``b <- g`` on the first step);
    ``g <- g + mu b`` (Nesterov) or ``g <- b``; ``p <- p - lr g``; in float32, then ``p`` and
    ``b`` are each rounded once to their storage dtype.

    Arguments, as ``torch.optim.SGD``'s: ``params`` (parameters or parameter groups);
    ``lr`` (a float or a one-element tensor), ``momentum`` (mu), ``dampening``,
    ``weight_decay`` (wd) and ``nesterov``, the formula's (``nesterov`` needs momentum > 0
    and no dampening); ``maximize``: ascend the objective (``g <- -g``).  Without momentum
    SGD keeps no state.

    The storage and implementation keywords (``state_dtype``, ``rounding``, ``seed``,
    ``master_weights``, ``backend``, and torch.optim's ``foreach``, ``fused``,
    ``capturable``, ``differentiable``) are every SR optimizer's: the Optimizers guide
    (docs/guide/optimizers.md) has their values and rules.  With the default
    ``state_dtype=None`` the states take the parameter's dtype, so bfloat16 parameters
    give the 4-byte SGD with momentum without a flag.
    """

    algorithm = "sgd"
    state_names = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        state_dtype: torch.dtype | None = None,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
        backend: str = "auto",
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
        super().__init__(
            params,
            defaults,
            backend,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        check_float(group["momentum"], "momentum")
        check_float(group["dampening"], "dampening")
        check_float(group["weight_decay"], "weight_decay")
        group["nesterov"] = bool(group["nesterov"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")

    def state_count(self, group: dict[str, Any]) -> int:
        return 1 if group["momentum"] != 0 else 0

    def init_states(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        # the momentum buffer starts as the first gradient: created by the first update
        state = self.state[param]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.int64, device=param.device)
        return state

    def scalars(self, group: dict[str, Any], steps: Tensor) -> Tensor:
        momentum, dampening = group["momentum"], group["dampening"]
        return sgd_scalars(group["lr"], momentum, dampening, group["weight_decay"], steps)

    def constants(self, group: dict[str, Any]) -> list[float]:
        return [group["momentum"], group["dampening"], group["weight_decay"]]

    @staticmethod
    def momentum_kind(group: dict[str, Any]) -> str:
        """The kernel's MOMENTUM for ``group``: "none", "momentum" or "nesterov"."""
        if group["momentum"] == 0:
            return "none"
        return "nesterov" if group["nesterov"] else "momentum"

    def momentum_buffer(self, group: dict[str, Any], param: Tensor) -> bool:
        """Whether this is the buffer's first step (created here, uninitialized)."""
        state = self.state[param]
        first = "momentum_buffer" not in state
        if group["momentum"] != 0 and first:
            state["momentum_buffer"] = torch.empty_like(
                param, dtype=self.state_dtype(group, param), memory_format=torch.preserve_format
            )
        return first

    def kernel_options(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        """``momentum``: "none", "momentum" or "nesterov"; ``first_step``: the momentum
        buffer's first step (the buffer starts as the gradient); ``decay``: weight_decay != 0."""
        momentum = self.momentum_kind(group)
        first_step = momentum != "none" and self.momentum_buffer(group, param)
        return {
            "momentum": momentum,
            "first_step": first_step,
            "decay": group["weight_decay"] != 0,
        }

    def group_kernel_options(
        self, group: dict[str, Any], states: Sequence[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """`kernel_options` once every momentum buffer exists (None before: a buffer's first
        step is taken parameter by parameter, which creates it)."""
        momentum = self.momentum_kind(group)
        if momentum != "none" and not all(map(contains, states, repeat("momentum_buffer"))):
            return None
        return {"momentum": momentum, "first_step": False, "decay": group["weight_decay"] != 0}

    def update(
        self, group: dict[str, Any], index: int, param: Tensor, scalars: Tensor, step: Tensor
    ) -> None:
        first = self.momentum_buffer(group, param)
        buffer = self.state[param].get("momentum_buffer")
        value, buffer = sgd_update(
            self.load_param(group, param),
            self.gradient(group, param),
            None if buffer is None or first else buffer.float(),
            scalars,
            decay=group["weight_decay"] != 0,
            momentum=group["momentum"] != 0,
            nesterov=group["nesterov"],
            first=first,
        )
        self.store_param(group, param, value, step, index)
        if buffer is not None:
            self.store_states(group, param, (buffer,), step, index)


class Lion(SROptimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") with rounded
    stores.

    ``u = sign(b1 m + (1 - b1) g)``; ``p <- p (1 - lr wd) - lr u`` (decoupled weight decay,
    the mathematical ``p - lr (u + wd p)``); ``m <- b2 m + (1 - b2) g``; in float32, in that
    order (``p.mul_(1 - lr wd)``, ``p.add_(u, alpha=-lr)``, ``m.mul_(b2).add_(g,
    alpha=1 - b2)``), then ``p`` and ``m`` (state ``exp_avg``, stream slot 1) are each
    rounded once to their storage dtype. ``sign(0) = 0``.

    Arguments: ``params`` (parameters or parameter groups); ``lr`` (a float or a one-element
    tensor), ``betas`` (b1, b2) and ``weight_decay`` (wd), the formula's; ``maximize``:
    ascend the objective (``g <- -g``).

    The storage and implementation keywords (``state_dtype``, ``rounding``, ``seed``,
    ``master_weights``, ``backend``, and torch.optim's ``foreach``, ``fused``,
    ``capturable``, ``differentiable``) are every SR optimizer's: the Optimizers guide
    (docs/guide/optimizers.md) has their values and rules.  With the default
    ``state_dtype=None`` the states take the parameter's dtype, so bfloat16 parameters
    give the 4-byte Lion without a flag.
    """

    algorithm = "lion"
    state_names = ("exp_avg",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        state_dtype: torch.dtype | None = None,
        rounding: str = "sr",
        seed: int | None = None,
        master_weights: bool = False,
        backend: str = "auto",
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
        super().__init__(
            params,
            defaults,
            backend,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        group["betas"] = check_betas(group["betas"])
        check_float(group["weight_decay"], "weight_decay")

    def scalars(self, group: dict[str, Any], steps: Tensor) -> Tensor:
        return lion_scalars(group["lr"], group["betas"], group["weight_decay"], steps)

    def constants(self, group: dict[str, Any]) -> list[float]:
        return [*group["betas"], group["weight_decay"]]

    def update(
        self, group: dict[str, Any], index: int, param: Tensor, scalars: Tensor, step: Tensor
    ) -> None:
        state = self.state[param]
        value, exp_avg = lion_update(
            self.load_param(group, param),
            self.gradient(group, param),
            state["exp_avg"].float(),
            scalars,
        )
        self.store_param(group, param, value, step, index)
        self.store_states(group, param, (exp_avg,), step, index)
