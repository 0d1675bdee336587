"""FSDP2's reshard-after-forward policy of a stochround torchtitan run (both torchtitan
APIs: torchtitan's ``parallelism.fsdp_reshard_after_forward``).

torchtitan wraps the token embeddings, each transformer block, and the final norm with the
output head in one ``fully_shard`` group each, and passes each its ``reshard_after_forward``
(torch's `torch.distributed.fsdp.fully_shard`).  A resharded group frees its gathered
parameters after its forward and gathers them again for its backward: two all-gathers a
group a step.  The policies (`RESHARD_AFTER_FORWARD`):

- ``"default"``: the embeddings and the blocks reshard; the last group (norm and head) does
  not, since its backward follows its forward at once;
- ``"always"``: every group reshards, the last too;
- ``"never"``: no group reshards: each keeps its parameters unsharded from its forward to
  its backward, one all-gather a group a step instead of two (and fewer FSDP2 hooks with
  work to do), at the memory of the whole model's unsharded parameters held through the
  step.

(0.3.0's chunked loss runs the head's forward and backward chunk by chunk with the head
unsharded throughout and reshards it after, whatever the policy.)

The policy acts where torchtitan applies FSDP2 (`applies_fsdp2`): under 0.3.0 always, even
on one rank or with replicas only (HSDP with a one-rank shard: its unshard is a copy into
the compute dtype, not a collective); under 0.2.2 only when the model is sharded over more
than one rank (one GPU has no FSDP2 there, replicas are DDP).
"""

from __future__ import annotations

from ...reference import check_choice

RESHARD_AFTER_FORWARD: tuple[str, ...] = ("default", "always", "never")


def check_reshard_after_forward(policy: str) -> str:
    """``policy`` if it is one of `RESHARD_AFTER_FORWARD`, else ValueError naming them."""
    return check_choice("reshard_after_forward", policy, RESHARD_AFTER_FORWARD)


def applies_fsdp2(api: str, shard_degree: int) -> bool:
    """Whether torchtitan's API ``api`` (``"0.2"`` or ``"0.3"``) wraps the model in FSDP2,
    where the reshard policy acts, with the model sharded over ``shard_degree`` ranks (the
    world size over the replicas): 0.3 always, 0.2 above one rank (module docstring)."""
    return api == "0.3" or shard_degree > 1


__all__ = ["RESHARD_AFTER_FORWARD", "applies_fsdp2", "check_reshard_after_forward"]
