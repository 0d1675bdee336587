"""A stand-in for Hugging Face `datasets` on a GPU machine that has none (its pyarrow alone
is larger than what a device call carries): the names torchtitan 0.2.2 imports at start,
none of which `stochround titan`'s own dataset calls.  `benchmarks/run_gpu_titan.sh` puts
this folder on the path only where ``import datasets`` fails."""

from __future__ import annotations

from typing import NoReturn


class Dataset:
    """Imported by torchtitan's Hugging Face loaders, never made here."""


class IterableDataset:
    """Imported by torchtitan's Hugging Face loaders, never made here."""


def load_dataset(*args: object, **kwargs: object) -> NoReturn:
    """Refused: this machine has no Hugging Face `datasets`."""
    raise RuntimeError("the datasets stand-in loads nothing: install Hugging Face datasets")
