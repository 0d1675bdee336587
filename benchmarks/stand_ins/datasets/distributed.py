"""The stand-in's `datasets.distributed` (`benchmarks/stand_ins/datasets`)."""

from __future__ import annotations

from typing import NoReturn


def split_dataset_by_node(*args: object, **kwargs: object) -> NoReturn:
    """Refused: this machine has no Hugging Face `datasets`."""
    raise RuntimeError("the datasets stand-in splits nothing: install Hugging Face datasets")
