"""Offline data in torchtitan 0.3.0's components: `ByteTokenizer` (`ByteCodec` as its
tokenizer) and `StdlibDataLoader` (torchtitan's dataloader over `StdlibDataset`,
`stochround.integrations.torchtitan.corpus`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer

from .corpus import BOS, EOS, VOCAB_SIZE, ByteCodec, StdlibDataset, stdlib_files


class ByteTokenizer(ByteCodec, BaseTokenizer):
    """`ByteCodec` as torchtitan's tokenizer (built from its config)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        pass


class StdlibDataLoader(ParallelAwareDataloader):
    """torchtitan's dataloader over `StdlibDataset` (``dataset_path``: another source
    folder instead of the standard library)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "python_stdlib"
        infinite: bool = True
        """Loop over the files forever (False: stop after one pass)."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs: Any,
    ) -> None:
        dataset = StdlibDataset(
            tokenizer,
            seq_len,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            root=config.dataset_path,
            infinite=config.infinite,
        )
        super().__init__(
            dataset,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            num_workers=config.num_workers,
            snapshot_every_n_steps=snapshot_every_n_steps,
            batch_size=local_batch_size,
        )


__all__ = [
    "BOS",
    "EOS",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "StdlibDataLoader",
    "StdlibDataset",
    "stdlib_files",
]
