"""The step a training forward reads, kept for its recomputation under activation
checkpointing (docs/guide/recipes.md, "Activation checkpointing").

`QuantizedLinear` and `GaussWS` draw their random words at ``stream_offset(step, ...)``
and advance their ``step`` buffer at each training forward.  `torch.utils.checkpoint`
(reentrant or not, and the `checkpoint_wrapper` torchtitan wraps its blocks in) runs a
region's forward again in the backward; that recomputation must read the step the
original forward read and must not advance the counter again — as the checkpoint itself
keeps torch's RNG state for the recomputation (``preserve_rng_state``).  So each module
keeps a queue of the steps its checkpointed forwards read (`read_step`): an original
forward inside a region appends the step it reads, a recomputation takes the oldest.  A
region replays its forwards in their order, and a layer is called once per forward pass
in a transformer block, so the queue gives each recomputation its forward's step, for one
pass or several micro-batches before their backwards (pipeline schedules).

How the phases are told apart, from what torch's checkpoint does:

* a recomputation runs inside the backward (the autograd engine's graph task,
  ``torch._C._current_graph_task_id() != -1``) with grad mode on — non-reentrant from a
  saved tensor's unpack hook, reentrant from ``CheckpointFunction.backward``;
* an original forward inside a region runs below ``torch.utils.checkpoint.checkpoint``'s
  frame: the non-reentrant one under grad mode, the reentrant one inside
  ``CheckpointFunction.forward`` under ``no_grad`` — a training forward still when that
  function's node has edges (grad mode was on when the checkpoint was applied), which it
  lacks under a caller's ``no_grad``.

Under torch.compile the step is read by the opaque op `advance_step` once per compiled
forward, and a checkpointed region's compiled backward takes the value that read returned:
the op is saved for the backward, never recomputed, whatever the region's policy
(`stochround.nn.step_ops.save_the_step_read`, and on torch < 2.13 the read's own selective
checkpoint, `stochround.nn.step_ops.advance_step_traced`; docs/guide/recipes.md).
"""

from __future__ import annotations

import inspect
import sys
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Literal

import torch
from torch import Tensor
from torch.utils import checkpoint as torch_checkpoint

from .step_ops import advance_step_eagerly, advance_step_traced

Region = Literal["none", "non_reentrant", "reentrant"]

# the code objects whose frames mark an original forward inside a checkpointed region
_CHECKPOINT_CODE: CodeType = inspect.unwrap(torch_checkpoint.checkpoint).__code__
_REENTRANT_CODE: CodeType = torch_checkpoint.CheckpointFunction.forward.__code__


def recomputing() -> bool:
    """Whether this forward is a checkpoint's recomputation: grad mode on inside the
    autograd engine's backward, where nothing else runs a module's forward."""
    return torch.is_grad_enabled() and in_backward()


def in_backward() -> bool:
    """Whether this runs inside the autograd engine's backward: where a compiled layer's
    forward op runs again, as a checkpoint's recomputation (an op's body runs with grad
    mode off, so `recomputing` cannot tell it)."""
    return torch._C._current_graph_task_id() != -1


def checkpoint_region() -> Region:
    """The checkpointed region the current original forward runs in: "reentrant" inside a
    reentrant checkpoint's forward whose node has edges (grad mode was on when the region
    was applied, so the backward will recompute it), "non_reentrant" below
    `torch.utils.checkpoint.checkpoint` otherwise, "none" outside any region (or in a
    reentrant forward applied under ``no_grad``, which no backward recomputes)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _REENTRANT_CODE:
            ctx = frame.f_locals.get("ctx")
            return "reentrant" if ctx is not None and ctx.next_functions else "none"
        if frame.f_code is _CHECKPOINT_CODE:
            return "non_reentrant"
        frame = frame.f_back
    return "none"


def read_step(
    counter: Tensor,
    reads: deque[Tensor],
    training: bool = True,
    derive: Callable[[Tensor], Tensor] | None = None,
) -> Tensor | None:
    """The step a forward draws at from the 0-d int64 ``counter`` (or ``derive`` of it),
    or None where the forward is no training forward (grad mode off, outside a reentrant
    checkpoint's training forward): the caller reads the counter without advancing it.

    A training forward reads the counter's value and advances it by one, and inside a
    checkpointed region appends the value to ``reads``; a recomputation takes the oldest
    value of ``reads`` and leaves the counter (module docstring).  ``training``: whether
    the module can be in a reentrant checkpoint's training forward, which runs under
    ``no_grad`` (False spares a no-grad call the search of the stack).  ``derive``: what
    the forward reads of the step, a new tensor made from the counter's value (a layer's
    stream offsets: `streams.bases_column`), which is then returned and kept instead of
    the step; made eagerly from the counter before it advances, it spares the copy of the
    step.  RuntimeError where a recomputation finds no step: a forward recomputed by
    another checkpoint than torch's."""
    if torch.compiler.is_compiling():
        if not torch.is_grad_enabled():
            return None
        step = advance_step_traced(counter)
        return step if derive is None else derive(step)
    if recomputing():
        if not reads:
            raise RuntimeError(
                "a quantized or sampled layer's forward ran inside a backward with no step "
                "kept for it: stochround recomputes under torch.utils.checkpoint (and "
                "checkpoint_wrapper), whose original forward keeps the step it read; another "
                "activation checkpoint would draw the next step's random words"
            )
        value = reads.popleft()
        if checkpoint_region() != "none":
            # a nested region's forward replayed by its parent's recomputation: the nested
            # region recomputes again later, from the same step
            reads.append(value)
        return value
    grad = torch.is_grad_enabled()
    region = checkpoint_region() if grad or training else "none"
    if not grad and region != "reentrant":  # under no_grad only a reentrant region trains
        return None
    if derive is None:
        value = advance_step_eagerly(counter)
    else:  # a new tensor read from the counter before it advances: no copy of the step
        value = derive(counter)
        counter.add_(1)
    if region != "none":
        reads.append(value)
    return value


__all__ = ["Region", "checkpoint_region", "in_backward", "read_step", "recomputing"]
