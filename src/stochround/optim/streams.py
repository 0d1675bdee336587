"""The optimizers' random streams: which words a store draws, and the default seed.

Every store draws the words of stream ``(key, offset)`` at the element
indices ``0 .. numel - 1`` of the tensor (:mod:`stochround.random`), with ``key =
stream_key(seed, StreamDomain.OPTIMIZER)`` (`group_key`: the optimizers' own domain, so a
recipe or a rounding call given the same seed draws other words) and::

    offset = step * 2**32 + param_index * 4 + tensor_slot

``step`` is the parameter's step count after this update (1, 2, ..., below 2**32),
``param_index`` its position in the optimizer's parameters (all groups, in order, fewer
than 2**30; or the index `SROptimizer.set_param_indices` gave it: a pipeline stage's
optimizer numbers its parameters as the whole model's does) and ``tensor_slot`` 0 for
the parameter, 1 and 2 for the states (``TENSOR_SLOTS``). Distinct offsets fill distinct
upper counter halves, so no two stores of a run share a random word, and the mapping does
not move when a parameter group is added. The step lives in the optimizer state
(``state[p]["step"]``, a 0-d int64 tensor on the parameter's device) and the seed in the
parameter group, so a run restored from ``state_dict`` continues bit for bit.

Default seed. ``seed=None`` takes `generator_seed`: a hash of the state of torch's default
CPU generator, read without drawing from it. Constructing an optimizer therefore moves no
draw of the user's data order, initialization or dropout (swapping ``torch.optim`` for
these optimizers changes nothing else), and a program that calls ``torch.manual_seed``
gets the same seed on every run. When torch.distributed is initialized, the seed is rank
0's, broadcast over the default process group when the optimizer is built (`agreed_seed`),
so replicated parameters round identically on every rank even when each rank seeds torch
differently (for its data order and dropout).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..random import StreamDomain, stream_key
from .checks import MAX_PARAMS

TENSOR_SLOTS = {"param": 0, "exp_avg": 1, "exp_avg_sq": 2, "momentum_buffer": 1}
# what `generator_seed` hashes with: its seeds are not another hash's outputs
SEED_PERSONALIZATION = b"stochround.optim"


def state_stream_offset(step: int | Tensor, param_index: int, tensor_slot: int) -> int | Tensor:
    """``step * 2**32 + param_index * 4 + tensor_slot``: the stream of one store.  A tensor
    ``step`` (int64, as the optimizer state holds it) gives an int64 tensor, two's
    complement at and above 2**63 as `stochround.random` reads offsets."""
    if not 0 <= param_index < MAX_PARAMS:
        raise ValueError(f"param_index must be in [0, 2**30), got {param_index}")
    if not 0 <= tensor_slot < 4:
        raise ValueError(f"tensor_slot must be in [0, 4), got {tensor_slot}")
    low = (param_index << 2) | tensor_slot
    if isinstance(step, Tensor):
        return (step << 32) | low
    if not 0 <= step < 1 << 32:
        raise ValueError(f"step must be in [0, 2**32), got {step}")
    return (step << 32) | low


def generator_seed() -> int:
    """A seed in [0, 2**64) read from torch's default CPU generator without drawing from it:
    the first 8 bytes (little-endian) of the BLAKE2b hash of its state.  The state is a
    function of the last ``torch.manual_seed`` and of the draws made since, so the seed is
    as reproducible as the user's own draws, and reading it leaves their sequence as it
    was.  (``torch.initial_seed()`` alone would give every optimizer of a program the same
    seed; the state differs between optimizers built with draws between them.)"""
    state = torch.default_generator.get_state().numpy().tobytes()
    digest = hashlib.blake2b(state, digest_size=8, person=SEED_PERSONALIZATION).digest()
    return int.from_bytes(digest, "little")


def agreed_seed(seed: int) -> int:
    """Rank 0's ``seed`` when torch.distributed's default process group is initialized (a
    broadcast that every rank of the group must join), else ``seed`` itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return seed
    # an object broadcast picks the device the group's backend needs (CPU for gloo, the
    # current CUDA device for NCCL)
    box: list[Any] = [seed]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def group_key(group: dict[str, Any]) -> int:
    """The Philox key of ``group``'s streams: its seed in the optimizers' domain,
    ``stream_key(group["seed"], StreamDomain.OPTIMIZER)`` (`stochround.random`).  The group
    (and so ``state_dict``) keeps the seed; the key is derived where a step draws."""
    return int(stream_key(group["seed"], StreamDomain.OPTIMIZER))


__all__ = [
    "SEED_PERSONALIZATION",
    "TENSOR_SLOTS",
    "agreed_seed",
    "generator_seed",
    "group_key",
    "state_stream_offset",
]
