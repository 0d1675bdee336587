"""What an SR optimizer provides to the steps that run it: its algorithm's name and states,
the scalars and constants of an update, the update itself on the PyTorch path, and the
fused kernel's options (`stochround.optim.base.SROptimizer` and its subclasses)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


class OptimizerHooks(torch.optim.Optimizer):
    """The methods and attributes the parts of `SROptimizer` (its fused path, its
    state_dict loading) call on it.  A subclass names its ``algorithm`` (the kernel's) and
    its ``state_names``, and implements `scalars`, `constants` and `update`; ``backend``
    is the optimizer's (`stochround.optim.checks.resolve_backend`).  In the methods,
    ``group`` is a parameter group, ``index`` a parameter's global index (the stream's
    ``param_index``) and ``step`` its step count after this update."""

    algorithm: str = ""
    state_names: tuple[str, ...] = ()
    backend: str

    def scalars(self, group: dict[str, Any], steps: Tensor) -> Tensor:
        """float32 rows of the update's scalars, one per int64 step count in ``steps``."""
        raise NotImplementedError

    def constants(self, group: dict[str, Any]) -> list[float]:
        """The group's hyperparameters besides ``lr``, in the kernel's order."""
        raise NotImplementedError

    def update(
        self, group: dict[str, Any], index: int, param: Tensor, scalars: Tensor, step: Tensor
    ) -> None:
        """Update ``param`` and its states on the PyTorch path (``scalars``: its row)."""
        raise NotImplementedError

    def check_group(self, group: dict[str, Any]) -> None:
        """Check ``group``'s options, completing them in place (ValueError/TypeError)."""
        raise NotImplementedError

    def kernel_options(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        """Constexpr options of the fused kernel for ``param`` (called before it runs)."""
        return {}

    def group_kernel_options(
        self, group: dict[str, Any], states: Sequence[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The constexpr options of the fused kernel shared by every parameter of ``group``,
        whose states are ``states`` (all created), or None where they may differ between
        parameters (`kernel_options` then decides for each).  A subclass that overrides
        `kernel_options` overrides this too."""
        return {}

    def state_count(self, group: dict[str, Any]) -> int:
        """How many state tensors each parameter of ``group`` holds."""
        return len(self.state_names)

    @staticmethod
    def state_dtype(group: dict[str, Any], param: Tensor) -> torch.dtype:
        """The dtype of ``param``'s states: the group's ``state_dtype``, or, when that is
        None, the parameter's own dtype (float32 under ``master_weights``)."""
        dtype: torch.dtype | None = group["state_dtype"]
        if dtype is not None:
            return dtype
        return torch.float32 if group["master_weights"] else param.dtype


__all__ = ["OptimizerHooks"]
