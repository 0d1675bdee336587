"""The activation checkpointing a stochround torchtitan run may ask of torchtitan (both
torchtitan APIs): none, each transformer block whole (``checkpoint_wrapper``), or its
per-op selective policy.  A checkpointed block's recomputation reads the step its forward
read, eager or compiled, so the run is the un-checkpointed one bit for bit
(`stochround.nn.recompute`, `stochround.nn.step_ops`; docs/guide/recipes.md).
"""

from __future__ import annotations

ACTIVATION_CHECKPOINTS: tuple[str, ...] = ("none", "full", "selective")


def check_activation_checkpoint(mode: str) -> str:
    """``mode`` if it is one of `ACTIVATION_CHECKPOINTS`, else ValueError naming them."""
    if mode not in ACTIVATION_CHECKPOINTS:
        raise ValueError(
            f"activation_checkpoint must be one of {', '.join(ACTIVATION_CHECKPOINTS)}; "
            f"got {mode!r}"
        )
    return mode


__all__ = ["ACTIVATION_CHECKPOINTS", "check_activation_checkpoint"]
