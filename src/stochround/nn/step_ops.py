"""The small operations of a `QuantizedLinear` step: the step counter's advance (one opaque
node under torch.compile, saved, never recomputed, in a checkpointed region), with its
eager twin; db's sum and the wgrad operands' transposes (docs/guide/recipes.md)."""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.torch_version import TorchVersion
from torch.utils import checkpoint as torch_checkpoint

from ..emulate.graph_words import lowering_registrar, register_outside_modes
from ..kernels.availability import on_kernel_device, triton_missing


def advance_step_eagerly(step: Tensor) -> Tensor:
    """The step's value before it advances by one (in place): `advance_step` without its
    op's dispatch, which an eager forward need not pay."""
    current = step.clone()
    step.add_(1)
    return current


# One op that reads and advances the step: torch.compile's partitioner would otherwise
# recompute a copy of the step in the backward graph from the buffer, after the forward
# graph has advanced it, and the backward would draw the next step's bits
advance_step = torch.library.custom_op(
    "stochround::nn_advance_step", advance_step_eagerly, mutates_args=("step",)
)


def _advance_lowering(step: Any) -> Any:
    """Inductor's lowering of `advance_step`: the step's value copied to a buffer of its
    own, then ``step + 1`` stored into the step, both in Inductor's generated code.

    Left to Inductor's fallback, the op was a Python custom-op call at every step for every
    layer (the custom-op layers' dispatch, then the eager clone and add: two launches on
    CUDA), the host time a compiled step of a model of many sampled or quantized layers
    paid beside its kernels.  The partitioner and the checkpoint rules see the op as
    before (they run on the traced graph, before lowering), so its value is saved for the
    backward as before; only its code changes.  The copy is made (realized) before the
    store, which Inductor orders after every read of the step."""
    from torch._inductor.lowering import lowerings

    aten = torch.ops.aten
    current = lowerings[aten.clone.default](step)
    current.realize()
    lowerings[aten.copy_.default](step, lowerings[aten.add.Tensor](step, 1))
    return current


# registers `_advance_lowering` as Inductor's lowering of `advance_step` (at its first trace)
register_advance_lowering = lowering_registrar(
    torch.ops.stochround.nn_advance_step.default, _advance_lowering
)


@advance_step.register_fake
def _(step: Tensor) -> Tensor:
    # every trace runs this before Inductor lowers the graph (`register_outside_modes`)
    register_outside_modes(register_advance_lowering)
    return torch.empty_like(step)


def must_save(policy_context: object, op: object, *args: object, **kwargs: object) -> object:
    """The selective-checkpoint policy of `advance_step` in every checkpointed region:
    `CheckpointPolicy.MUST_SAVE`, whatever the region's own policy says of other ops."""
    return torch_checkpoint.CheckpointPolicy.MUST_SAVE


def save_the_step_read(
    mode: Any, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`advance_step` under a checkpointed region's forward mode: the region's own dispatch
    with `must_save` as its policy for this one call.

    Under torch.compile a non-reentrant checkpoint (and `checkpoint_wrapper`, and
    torchtitan's AC) traces its region through this mode, which tags each op's graph nodes
    with the region's policy — recompute, for a plain checkpoint — and the partitioner
    recomputes what is so tagged in the backward.  Recomputed, the step read would read the
    buffer the forward has advanced and draw the next step's words; saved, the backward
    takes the forward's step, as eager recomputation does (`stochround.nn.recompute`)."""
    policy = mode.policy_fn
    mode.policy_fn = must_save
    try:
        return mode.__torch_dispatch__(func, types, args, kwargs)
    finally:
        mode.policy_fn = policy


# the mode in which torch.utils.checkpoint runs a region's forward under selective (and,
# compiled on torch 2.13, plain) checkpointing: a private class of torch's (2.11, 2.13); a
# release that renamed it would leave the rule unregistered, which the compiled
# checkpointing tests (tests/nn/test_checkpointing.py) catch by the bits
_REGION_MODE = getattr(torch_checkpoint, "_CachingTorchDispatchMode", None)
if _REGION_MODE is not None:
    advance_step.register_torch_dispatch(_REGION_MODE, save_the_step_read)


# torch 2.13 traces a compiled plain checkpoint's region (torch.utils.checkpoint without a
# context_fn, checkpoint_wrapper) through that same mode, under a policy that recomputes
# every op, so the rule above saves the step read there too; torch 2.11 tags that region's
# graph nodes for recomputation without entering the mode, and the rule never runs
# (2.12 unverified: treated as 2.11)
PLAIN_REGIONS_RUN_THE_MODE = TorchVersion(torch.__version__) >= "2.13"


def saving_everything() -> tuple[Any, Any]:
    """A selective checkpoint's forward and recomputation contexts whose policy is
    `must_save` for every op."""
    return torch_checkpoint.create_selective_checkpoint_contexts(must_save)


def advance_step_traced(step: Tensor) -> Tensor:
    """`advance_step` as a traced (torch.compile) forward calls it, saved for the backward
    in any checkpointed region (docs/guide/recipes.md, "Activation checkpointing").

    Where a compiled plain checkpoint's region bypasses the selective-checkpoint mode
    (`PLAIN_REGIONS_RUN_THE_MODE` false), the op runs in a selective checkpoint of its own
    whose policy saves it: inside the region, the partitioner keeps that tag for the op's
    nodes instead of the region's "recompute"; outside any region, the backward needed
    the step read's value all the same."""
    if PLAIN_REGIONS_RUN_THE_MODE:
        return typing.cast(Tensor, advance_step(step))
    return typing.cast(
        Tensor,
        torch_checkpoint.checkpoint(
            advance_step, step, use_reentrant=False, context_fn=saving_everything
        ),
    )


@contextlib.contextmanager
def autocast_off(device_type: str) -> Iterator[None]:
    """Autocast disabled for ``device_type``: the emulated GEMMs choose their own dtypes
    (fp32 operands and accumulation) whatever autocast would pick."""
    with torch.autocast(device_type, enabled=False):
        yield


def bias_gradient(grad: Tensor) -> Tensor:
    """``db = sum_t dy[t]`` in fp32: torch's sum over the tokens, as nn.Linear's backward
    computes it."""
    return grad.to(torch.float32).sum(0)


def transposed(x: Tensor) -> Tensor:
    """``x.T.contiguous()`` of a 2-D tensor: by the tiled Triton kernel for a CUDA tensor
    where Triton is installed (`stochround.kernels.transpose`), else by PyTorch's copy; the
    same bits either way."""
    if on_kernel_device(x) and triton_missing() is None:
        from ..kernels.transpose import transpose  # needs triton: imported only here

        return transpose(x)
    return x.T.contiguous()


__all__ = [
    "PLAIN_REGIONS_RUN_THE_MODE",
    "advance_step",
    "advance_step_eagerly",
    "advance_step_traced",
    "autocast_off",
    "bias_gradient",
    "must_save",
    "register_advance_lowering",
    "save_the_step_read",
    "saving_everything",
    "transposed",
]
