"""Offline data in torchtitan 0.2.2's builders: `ByteTokenizer` (`ByteCodec` as its
tokenizer) and `build_stdlib_dataloader` (its dataloader over `StdlibDataset`,
`stochround.integrations.torchtitan.corpus`; ``training.dataset_path``: another source
folder instead of the standard library)."""

from __future__ import annotations

from typing import Any

from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer

from ..corpus import ByteCodec, StdlibDataset


class ByteTokenizer(ByteCodec, BaseTokenizer):
    """`ByteCodec` as torchtitan 0.2.2's tokenizer."""


def build_byte_tokenizer(job_config: Any) -> ByteTokenizer:
    """The train spec's tokenizer builder: nothing to read."""
    return ByteTokenizer()


def build_stdlib_dataloader(
    dp_world_size: int,
    dp_rank: int,
    tokenizer: BaseTokenizer,
    job_config: Any,
    infinite: bool = True,
) -> ParallelAwareDataloader:
    """The train spec's dataloader builder: this rank's `StdlibDataset` samples in batches
    of ``training.local_batch_size``."""
    training = job_config.training
    dataset = StdlibDataset(
        tokenizer,  # type: ignore[arg-type]
        training.seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        root=training.dataset_path or None,
        infinite=infinite,
    )
    return ParallelAwareDataloader(
        dataset,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        batch_size=training.local_batch_size,
    )


__all__ = ["ByteTokenizer", "build_byte_tokenizer", "build_stdlib_dataloader"]
