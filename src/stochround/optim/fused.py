"""The fused path of the SR optimizers: one Triton launch updates a group's parameters
(`stochround.kernels.optim`), bit-identical to the PyTorch path, where the kernel can
serve them (`use_kernel`, given `setup_refusal`, `shard_refusal` and the parameter's own
checks).

Sharded parameters (torch.distributed: FSDP2's ``fully_shard``, DTensor placements). The
element indices are those of the whole parameter, in row-major order: a rank updates its
shard with the words of its elements' global indices, so a sharded run rounds every
element as the single-device run does, whatever the number of ranks, and its states
(DTensors like their parameters) save and resume through torch.distributed.checkpoint
onto any number of ranks. The fused kernel updates each rank's local shards in place (no
gather) when a shard is one range of the parameter's elements (placements Replicate or
Shard(0): whole rows) starting at a multiple of 4 elements (`shard_refusal`); the
PyTorch path updates any other shard (Shard of another dimension: each element's words
computed at its global index) — with ``backend="triton"`` such a shard raises ValueError
instead. Replicated parameters (DDP) round identically on every rank from the agreed
seed (below).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, is_not, itemgetter
from typing import Any

import torch
from torch import Tensor

from ..kernels.availability import kernels_refusal, use_kernel
from ..shards import first_index, is_dtensor
from .checks import PARAM_DTYPES
from .encodings import ROUNDING_STATES, param_state_name
from .hooks import OptimizerHooks
from .streams import group_key

# per-tensor reads of a group's fast path (`FusedSteps.fused_group_step`), each mapped over
# the group's list at C speed (methods unbound: a subclass's __torch_function__ still sees
# them, as it sees a bound call)
GRAD = attrgetter("grad")
DTYPE = attrgetter("dtype")
IS_CUDA = attrgetter("is_cuda")
IS_SPARSE = attrgetter("is_sparse")
IS_CONTIGUOUS = Tensor.is_contiguous
GET_DEVICE = Tensor.get_device
STEP = itemgetter("step")


def grad_of(param: Tensor) -> Tensor:
    """``param.grad`` of a parameter a step updates: steps update only parameters that have
    a gradient (`SROptimizer.group_entries`)."""
    grad = param.grad
    assert grad is not None  # group_entries yields no parameter without a gradient
    return grad


def local_tensor(tensor: Tensor) -> Tensor:
    """A DTensor's local tensor (this rank's shard, what the fused kernel updates), or the
    tensor itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def holds_dtensors(tensors: list[Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor (their types looked at once each: a step
    over plain parameters pays one pass at C speed)."""
    return any(kind.__name__ == "DTensor" for kind in set(map(type, tensors)))


def shard_refusal(param: Tensor) -> str | None:
    """Why the fused kernel cannot update the local shard of DTensor ``param`` (None if it
    can, and for a plain tensor): the kernel draws each row of four elements' words as one
    Philox block, from the block of the shard's first element, so a shard must be one
    range of the whole parameter's elements (`stochround.shards.first_index`: whole rows,
    placements Replicate or Shard(0)) starting at a multiple of 4. The PyTorch path
    updates any other shard on its DTensor, each element with the words of its global
    index."""
    start = first_index(param)
    if start is None:
        return (
            f"its local shard (placements {getattr(param, 'placements', None)}) is not a "
            "range of whole rows of the parameter"
        )
    if start % 4:
        return f"its local shard starts at global element {start}, not a multiple of 4"
    return None


def _state_refusal(param: Tensor, group: dict[str, Any]) -> str | None:
    """Why the fused kernel cannot keep ``param``'s storage under ``group``'s options (None
    if it can): it keeps no extra parameter state."""
    if param_state_name(group, param) is not None:
        return "master_weights, 'kahan' and 'ecc' keep an extra parameter state"
    return None


def setup_refusal(param: Tensor, group: dict[str, Any]) -> str | None:
    """Why the fused kernel can never update ``param`` of ``group`` (None if it may): its
    device, a missing Triton, or an extra parameter state."""
    return kernels_refusal("the parameter", param.is_cuda) or _state_refusal(param, group)


def _param_refusal(param: Tensor, group: dict[str, Any], compiling: bool) -> str | None:
    """Why the fused kernel cannot update ``param`` with its gradient (None if it can;
    where the kernels run is `use_kernel`'s question); ``compiling``: whether
    torch.compile traces the step."""
    refusal = _state_refusal(param, group) or shard_refusal(param)
    if refusal is not None:
        return refusal
    param, grad = local_tensor(param), local_tensor(grad_of(param))
    if not (param.is_contiguous() and grad.is_contiguous()):
        return "the parameter and its gradient must be contiguous"
    # torch.compile cannot trace addresses: compiled, the launch checks them (and raises)
    aligned = compiling or not (param.data_ptr() % 16 or grad.data_ptr() % 16)
    if not aligned:
        return "the parameter and its gradient must start on a multiple of 16 bytes"
    if grad.dtype not in PARAM_DTYPES:
        return f"gradients must be float32, bfloat16 or float16, not {grad.dtype}"
    return None


class FusedSteps(OptimizerHooks):
    """The fused path of `SROptimizer`'s step: which parameters the kernel updates
    (`fused`), and the launches that update them (`fused_group_step`, `fused_steps`)."""

    def fused_group_step(
        self, group: dict[str, Any], params: list[Tensor], indices: Sequence[int]
    ) -> bool:
        """An eager step of ``group`` (its ``params``, of stream indices ``indices``)
        in one launch, when every parameter that has a gradient is one the fused kernel
        updates and they share one launch: one device, one parameter dtype and one
        gradient dtype, contiguous and 16-byte aligned, their states created and their
        kernel options shared (`group_kernel_options`).  The checks are `fused`'s, made
        over the whole list (the alignment by the launch, once for these tensors); a step's
        host time then grows by a few attribute reads a parameter.  Returns whether it stepped;
        when it did not, nothing has changed (beyond the empty state dicts that
        `group_step` creates as well), and `group_step` takes the group, parameter by
        parameter (its errors and fallbacks included)."""
        if self.backend == "torch" or not params:
            return False
        grads = list(map(GRAD, params))
        present = list(map(is_not, grads, repeat(None)))
        if not all(present):  # parameters without a gradient are not stepped
            params = list(compress(params, present))
            grads = list(compress(grads, present))
            indices = list(compress(indices, present))
            if not params:
                return True
        if any(map(IS_SPARSE, grads)):  # group_step raises
            return False
        keys = params  # the states are the parameters' (DTensors' for sharded ones)
        first_indices = None
        if holds_dtensors(params):  # the kernel updates each rank's shards
            starts = list(map(first_index, params))
            # `shard_refusal`'s rule: a range of the parameter, from a multiple of 4
            if any(start is None or start % 4 for start in starts):
                return False
            first_indices = [start for start in starts if start is not None]
            params, grads = list(map(local_tensor, params)), list(map(local_tensor, grads))
        # `fused` for each parameter: "auto" takes CUDA parameters, "triton" also those the
        # interpreter runs; the others, and an extra parameter state, go to group_step
        on_cuda = all(map(IS_CUDA, params))
        if self.backend == "auto" and not on_cuda:
            return False
        if kernels_refusal("the parameter", on_cuda) is not None:
            return False
        if group.get("master_weights", False) or group["rounding"] in ROUNDING_STATES:
            return False
        dtypes, grad_dtypes = set(map(DTYPE, params)), set(map(DTYPE, grads))
        if len(dtypes) != 1 or len(grad_dtypes) != 1 or not grad_dtypes <= set(PARAM_DTYPES):
            return False
        if len(set(map(GET_DEVICE, params))) != 1:
            return False
        if not (all(map(IS_CONTIGUOUS, params)) and all(map(IS_CONTIGUOUS, grads))):
            return False
        states = list(map(self.state.__getitem__, keys))
        options = self.group_kernel_options(group, states)
        if options is None:
            return False
        names = self.state_names[: self.state_count(group)]
        try:  # the first step creates the states, on group_step
            steps = list(map(STEP, states))
            state_lists = [list(map(itemgetter(name), states)) for name in names]
        except KeyError:
            return False
        if first_indices is not None:
            state_lists = [list(map(local_tensor, column)) for column in state_lists]
        from ..kernels.optim import MisalignedError, fused_step  # needs triton: imported here

        try:  # the alignment is checked there, once for these tensors (their table)
            fused_step(
                self.algorithm,
                params,
                grads,
                state_lists,
                steps,
                list(indices),
                group["lr"],  # as `launch_lr` passes it eagerly
                self.constants(group),
                seed=group_key(group),
                sr=group["rounding"] == "sr",
                maximize=group["maximize"],
                first_indices=first_indices,
                **options,
            )
        except MisalignedError:  # raised before anything changed: group_step decides
            return False
        return True

    def fused(self, group: dict[str, Any], param: Tensor, compiling: bool) -> bool:
        """Whether the fused kernel updates ``param`` (`use_kernel` given `_param_refusal`;
        ``compiling``: whether torch.compile traces the step): "auto" where it can, on
        CUDA; "triton" always, or a ValueError saying why it cannot."""
        if self.backend == "torch" or (self.backend == "auto" and not param.is_cuda):
            return False  # use_kernel's answer, without the checks of the parameter
        refusal = _param_refusal(param, group, compiling)
        return use_kernel(self.backend, "the parameter", param.is_cuda, refusal)

    def fused_steps(
        self, group: dict[str, Any], entries: list[tuple[int, Tensor, dict[str, Any]]]
    ) -> None:
        """One launch per (dtypes, kernel options) bucket of ``entries`` (index, param,
        state)."""
        buckets: dict[tuple, list[tuple[int, Tensor, dict[str, Any]]]] = {}
        for entry in entries:
            param = entry[1]
            options = tuple(self.kernel_options(group, param).items())
            # one launch reads every state through one typed pointer: the parameter's dtype
            # fixes its states' within a group (`state_dtype`; init_states and
            # load_state_dict create them so)
            key = (param.dtype, grad_of(param).dtype, param.device, options)
            buckets.setdefault(key, []).append(entry)
        if not buckets:
            return
        from ..kernels.optim import fused_step  # needs triton: imported only when used

        names = self.state_names[: self.state_count(group)]
        for (_, _, device, options), members in buckets.items():
            params = [param for _, param, _ in members]
            sharded = holds_dtensors(params)
            fused_step(
                self.algorithm,
                list(map(local_tensor, params)),
                [local_tensor(grad_of(param)) for param in params],
                [[local_tensor(state[name]) for _, _, state in members] for name in names],
                [state["step"] for _, _, state in members],
                [index for index, _, _ in members],
                self.launch_lr(group["lr"], device),
                self.constants(group),
                seed=group_key(group),
                sr=group["rounding"] == "sr",
                maximize=group["maximize"],
                first_indices=[first_index(param) or 0 for param in params] if sharded else None,
                **dict(options),
            )

    @staticmethod
    def launch_lr(lr: float | Tensor, device: torch.device) -> float | Tensor:
        """``lr`` as the fused launch takes it: a float travels as a kernel argument, but a
        compiled step passes it as a float64 tensor on ``device`` (zeros plus the float, so
        torch.compile reads the float as a graph input instead of a constant that
        recompiles the step when a scheduler moves it)."""
        if isinstance(lr, Tensor) or not torch.compiler.is_compiling():
            return lr
        return torch.zeros((), dtype=torch.float64, device=device) + lr


__all__ = [
    "FusedSteps",
    "grad_of",
    "holds_dtensors",
    "local_tensor",
    "setup_refusal",
    "shard_refusal",
]
