"""`SROptimizer`, the base of the SR optimizers: a step over parameter groups, parameter
by parameter on the PyTorch path or a group at a time by the fused kernel (`fused`), with
rounded stores (`encodings`), random streams (`streams`), checked arguments (`checks`)
and torch.optim's state_dict (`loading`).

State dtype. ``state_dtype=None`` (the default) keeps each parameter's states in the
parameter's own dtype, as torch.optim and torchao's low-bit AdamW do: bfloat16 parameters
give the 6-byte AdamW without a flag. Under ``master_weights=True`` the states follow the
float32 master, the value the update advances (a bfloat16 moment beside it would drop
the precision the master keeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import torch
from torch import Tensor

from ..shards import is_dtensor
from .checks import (
    IMPLEMENTATION_KEYS,
    MAX_PARAMS,
    PARAM_DTYPES,
    ROUNDINGS,
    STATE_DTYPES,
    check_float,
    check_param_indices,
    check_rounding,
    check_seed_argument,
    check_state_dtype,
    resolve_backend,
)
from .encodings import (
    extra_state_bytes,
    load_param_value,
    param_state_name,
    store,
    store_param_value,
)
from .fused import FusedSteps, grad_of, setup_refusal
from .loading import StateDictLoading
from .streams import TENSOR_SLOTS, agreed_seed, generator_seed, group_key, state_stream_offset


class SROptimizer(FusedSteps, StateDictLoading):
    """Base class: groups carry ``state_dtype``, ``rounding`` and ``seed``; each parameter's
    step count is ``state[p]["step"]``, a 0-d int64 tensor on the parameter's device, and
    ``lr`` may be a float or a one-element tensor.  Nothing a step reads is a Python value
    that changes from step to step, so ``torch.compile`` compiles a step once and a CUDA
    graph can capture it (with a tensor ``lr`` on the device, replays read its current
    value; the step counts advance on the device).  A float ``lr`` that a scheduler moves
    compiles as torch.optim's does: a second graph reads it as an input.

    ``params`` (parameters or parameter groups, as in ``torch.optim``) and ``defaults``
    (the subclass's group defaults); the keywords every optimizer takes (``state_dtype``,
    ``rounding``, ``seed``, ``master_weights``, ``backend`` and torch.optim's ``foreach``,
    ``fused``, ``capturable``, ``differentiable``) are described once, in the Optimizers
    guide (docs/guide/optimizers.md); `stochround.optim.checks.resolve_backend` resolves
    the last five to one ``backend``.

    Subclasses provide what `stochround.optim.hooks.OptimizerHooks` lists: their
    ``algorithm`` (the kernel's), their ``state_names``, `scalars`, `constants` and
    `update`."""

    # `set_param_indices`'s numbering (None: positions); a class default for pickles
    # made before it existed
    param_indices: tuple[int, ...] | None = None

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        backend: str = "auto",
        *,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        self.backend = resolve_backend(backend, foreach, fused, capturable, differentiable)
        self.fused_required = fused is True
        self.shared_seed: int | None = None  # `default_seed`, once asked for
        self.param_indices = None
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        """torch's state (defaults, state, groups) and the options of the whole optimizer,
        which torch's omits: a pickled or deep-copied optimizer keeps its backend."""
        options = ("backend", "fused_required", "shared_seed", "param_indices")
        return {**super().__getstate__(), **{name: getattr(self, name) for name in options}}

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; returns the closure's loss.

        Eagerly each group first tries `fused_group_step` (one launch for the whole group,
        its checks made over lists); a group it declines takes the general path
        (`group_step`), parameter by parameter."""
        compiling = torch.compiler.is_compiling()
        if compiling and any(is_dtensor(p) for group in self.param_groups for p in group["params"]):
            return self.eager_step(closure)
        loss = self.evaluate(closure)
        if compiling:  # eagerly the loop below creates the states, at no extra cost
            for group in self.param_groups:
                self._init_group(group)
        start = 0  # the position of the group's first parameter among all groups'
        for group in self.param_groups:
            params = group["params"]
            indices = self.group_param_indices(start, len(params))
            if compiling or not self.fused_group_step(group, params, indices):
                self.group_step(group, self.group_entries(group, indices), compiling)
            start += len(params)
        return loss

    def group_param_indices(self, start: int, count: int) -> Sequence[int]:
        """The stream indices (``param_index`` of `state_stream_offset`) of the ``count``
        parameters at positions ``start ..`` of all groups: the positions themselves,
        unless `set_param_indices` gave others."""
        if self.param_indices is None:
            return range(start, start + count)
        return self.param_indices[start : start + count]

    def set_param_indices(self, indices: Sequence[int]) -> None:
        """Draw each parameter's words as the parameter of stream index ``indices[i]``
        (``i``: its position among all groups' parameters, in order) instead of ``i``:
        distinct integers in [0, 2**30), one per parameter.  A part of a model (a pipeline
        stage) numbered as the whole model numbers it draws the whole model's words
        (`stochround.integrations.torchtitan.sr_optimizers`).  The numbering is no part of
        ``state_dict``: whoever builds the optimizer sets it again."""
        count = sum(len(group["params"]) for group in self.param_groups)
        self.param_indices = check_param_indices(indices, count)

    def eager_step(self, closure: Callable[[], float] | None) -> float | None:
        """`step` run eagerly inside a compiled region: a step over DTensor parameters
        (FSDP2) is not compiled, because inductor was seen to compile the sharded PyTorch
        path's stream offsets into float arithmetic; eagerly the fused kernel updates the
        shards (on CUDA) and the bits are the eager step's."""
        # disabled here, where Dynamo traces (so has been imported), not by a decorator,
        # which would import Dynamo with stochround; making it breaks the graph as well
        return torch.compiler.disable(self.step)(closure)

    def group_step(
        self, group: dict[str, Any], entries: list[tuple[int, Tensor]], compiling: bool
    ) -> None:
        """Update the (global index, parameter) ``entries`` of ``group``, each by the fused
        kernel where it can (`fused`, one launch per bucket: `fused_steps`), else on the
        PyTorch path (one scalar computation per device); ``compiling``: whether
        torch.compile traces the step."""
        fused, unfused = [], []
        for index, param in entries:
            state = self.init_states(group, param)
            if self.fused(group, param, compiling):
                fused.append((index, param, state))
            else:
                unfused.append((index, param))
        by_device: dict[torch.device, list[tuple[int, Tensor]]] = {}
        for index, param in unfused:
            by_device.setdefault(param.device, []).append((index, param))
        for members in by_device.values():  # one scalar computation per device
            steps = [self.state[param]["step"].add_(1) for _, param in members]
            rows = self.scalars(group, torch.stack(steps))
            for (index, param), row, step in zip(members, rows, steps, strict=True):
                self.update(group, index, param, row, step)
        self.fused_steps(group, fused)

    def init_states(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        """The parameter's state, with step 0 and zero states in its `state_dtype` on first
        use."""
        state = self.state[param]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.int64, device=param.device)
        for name in self.state_names:
            if name not in state:
                state[name] = torch.zeros_like(
                    param, dtype=self.state_dtype(group, param), memory_format=torch.preserve_format
                )
        return state

    def _init_group(self, group: dict[str, Any]) -> None:
        """Create the states of ``group``'s parameters that have a gradient (`init_states`),
        for a compiled step.  The name is torch.optim's: torch.compile runs a method of that
        name eagerly when it traces a step, so a step compiled before the first one sees
        the states and is not compiled again once they exist."""
        for param in group["params"]:
            if param.grad is not None:
                self.init_states(group, param)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if isinstance(param_group, dict):
            for key in IMPLEMENTATION_KEYS:
                if key in param_group:
                    raise ValueError(
                        f"{key} is an option of the whole optimizer, not of a parameter group: "
                        "pass it to the constructor"
                    )
        if self.param_indices is not None:
            raise ValueError(
                "add_param_group after set_param_indices: set the indices again, with the "
                "new group's"
            )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self.check_group(group)
        for param in group["params"]:
            if param.dtype not in PARAM_DTYPES:
                raise TypeError(
                    f"params must have a dtype in {PARAM_DTYPES}; got a {param.dtype} parameter"
                )
            refusal = setup_refusal(param, group) if self.fused_required else None
            if refusal is not None:
                raise ValueError(f"fused=True cannot update this parameter: {refusal}")
        if sum(len(g["params"]) for g in self.param_groups) > MAX_PARAMS:
            raise ValueError("at most 2**30 parameters are supported")

    def default_seed(self) -> int:
        """The seed of the groups given ``seed=None``: `generator_seed`, agreed with rank 0
        (`agreed_seed`) when torch.distributed is initialized; derived once per optimizer,
        so it costs one broadcast, made when the first such group is added (in the
        constructor, unless every group there has its own seed)."""
        if self.shared_seed is None:
            self.shared_seed = agreed_seed(generator_seed())
        return self.shared_seed

    def check_group(self, group: dict[str, Any]) -> None:
        group["state_dtype"] = check_state_dtype(group["state_dtype"])
        group["rounding"] = check_rounding(group["rounding"])
        seed = group["seed"]
        group["seed"] = self.default_seed() if seed is None else check_seed_argument(seed)
        group["master_weights"] = bool(group.get("master_weights", False))
        if group["master_weights"] and group["rounding"] not in ("sr", "rne"):
            raise ValueError(
                "master_weights=True needs rounding 'sr' or 'rne' (the master is exact; "
                f"'kahan' and 'ecc' are alternatives to it), got {group['rounding']!r}"
            )
        check_float(group["lr"], "lr")
        group["maximize"] = bool(group["maximize"])

    @staticmethod
    def evaluate(closure: Callable[[], float] | None) -> float | None:
        """The loss of ``closure`` (re-evaluated with gradients enabled), or None."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def load_param(self, group: dict[str, Any], param: Tensor) -> Tensor:
        """A fresh float32 tensor: the parameter's value the update starts from
        (`stochround.optim.encodings.load_param_value`)."""
        return load_param_value(self.state[param], param_state_name(group, param), param)

    def store_param(
        self, group: dict[str, Any], param: Tensor, value: Tensor, step: Tensor, index: int
    ) -> None:
        """Keep the float32 ``value`` as the parameter
        (`stochround.optim.encodings.store_param_value`)."""
        stream = (group["rounding"], group_key(group), step, index)
        store_param_value(self.state[param], param_state_name(group, param), param, value, stream)

    def group_entries(
        self, group: dict[str, Any], indices: Sequence[int]
    ) -> list[tuple[int, Tensor]]:
        """The (stream index, parameter) pairs of ``group`` that have a gradient, ``indices``
        being its parameters' (`group_param_indices`); RuntimeError for a sparse
        gradient."""
        entries = []
        for index, param in zip(indices, group["params"], strict=True):
            if param.grad is not None:
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                entries.append((index, param))
        return entries

    @staticmethod
    def gradient(group: dict[str, Any], param: Tensor) -> Tensor:
        """The float32 gradient, negated under ``maximize``."""
        grad = grad_of(param).float()
        return -grad if group["maximize"] else grad

    def store_states(
        self,
        group: dict[str, Any],
        param: Tensor,
        values: tuple[Tensor, ...],
        step: Tensor,
        index: int,
    ) -> None:
        """Store the float32 ``values`` of the states ``state_names`` (in order), rounded."""
        state = self.state[param]
        rounding, key = group["rounding"], group_key(group)
        for name, value in zip(self.state_names, values, strict=False):
            store(state[name], value, rounding, key, step, index, TENSOR_SLOTS[name])

    def bytes_per_param(self) -> float:
        """Bytes per parameter element: the parameter, its states and the extra parameter
        state (fp32 master 4, kahan compensation the parameter's size, ecc residual 1),
        averaged."""
        total_bytes = 0
        total_elements = 0
        for group in self.param_groups:
            for param in group["params"]:
                state_size = torch.empty((), dtype=self.state_dtype(group, param)).element_size()
                total_elements += param.numel()
                total_bytes += param.numel() * (
                    param.element_size() + self.state_count(group) * state_size
                )
                name = param_state_name(group, param)
                if name is not None:
                    total_bytes += param.numel() * extra_state_bytes(name, param)
        return total_bytes / total_elements if total_elements else 0.0


__all__ = ["ROUNDINGS", "STATE_DTYPES", "SROptimizer", "state_stream_offset"]
