"""Offline data for torchtitan (both APIs): the Python standard library's source as bytes.

`ByteCodec` is a byte-level tokenizer (token ``b`` is the byte ``b``, 256 is BOS, 257
EOS): nothing to download or train.  `StdlibDataset` reads the ``.py`` files under
``sysconfig.get_paths()["stdlib"]`` (``site-packages`` left out) in sorted path order, rank
``r`` of ``n`` data-parallel ranks taking the files ``r, r + n, ...``, and packs their
tokens into ``seq_len`` samples as torchtitan's text loader does: within one file the
labels are the inputs shifted by one, positions restart at each file, and a file's last
token never predicts the next file's first.  Its state (file, epoch, leftover tokens) is
a ``Stateful``'s, so a DCP checkpoint of torchtitan's loader saves the position and a
resumed run reads the same samples, and passes through the same states (a restored
buffer's samples come before the next file is read).  The corpus is the interpreter's
own (about 30 MB of source on CPython 3.11): two machines with the same Python read the
same tokens.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

BOS = 256
EOS = 257
VOCAB_SIZE = 258
TOKEN = np.int64  # the buffers' dtype: the samples' (torch.long)


class Encoder(Protocol):
    """What `StdlibDataset` needs of a tokenizer."""

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...


class ByteCodec:
    """UTF-8 bytes as tokens (0..255), with BOS 256 and EOS 257 (each torchtitan API's
    tokenizer is this codec in its tokenizer class)."""

    bos_id: int | None
    eos_id: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # torchtitan passes a config, or its hf_assets_path as tokenizer_path: none is needed
        super().__init__()
        self.bos_id = BOS
        self.eos_id = EOS

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """The UTF-8 bytes of ``text``, with BOS before and EOS after if asked."""
        tokens = list(text.encode("utf-8"))
        return [BOS] * add_bos + tokens + [EOS] * add_eos

    def decode(self, tokens: list[int], **kwargs: Any) -> str:
        """The text of ``tokens`` (BOS/EOS dropped; invalid UTF-8 replaced)."""
        return bytes(t for t in tokens if t < BOS).decode("utf-8", errors="replace")

    def get_vocab_size(self) -> int:
        return VOCAB_SIZE


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The ``.py`` files under ``root`` (default: the standard library), ``site-packages``
    left out, sorted by path."""
    base = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    files = [p for p in base.rglob("*.py") if "site-packages" not in p.parts and p.is_file()]
    if not files:
        raise ValueError(f"root {str(base)!r} holds no .py file")
    return sorted(files)


class StdlibDataset(IterableDataset[tuple[dict[str, torch.Tensor], torch.Tensor]], Stateful):
    """The packed samples of this rank's files (module docstring); loops over them forever
    if ``infinite``, in the same order each epoch."""

    def __init__(
        self,
        tokenizer: Encoder,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        root: str | None = None,
        infinite: bool = True,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.files = stdlib_files(root)[dp_rank::dp_world_size]
        if not self.files:
            raise ValueError(f"dp_world_size={dp_world_size} leaves rank {dp_rank} no file")
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.infinite = infinite
        self.file_index = 0
        self.epoch = 0
        # the tokens read and not yet taken: inputs, labels (inputs shifted by one within
        # a file) and positions within their file
        self.inputs, self.labels, self.positions = (np.zeros(0, TOKEN) for _ in range(3))

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            # the buffered samples first: a restored state's are the ones its run yields next
            while len(self.inputs) >= self.seq_len:
                yield self.take()
            if self.file_index == len(self.files):
                if not self.infinite:
                    return
                self.file_index = 0
                self.epoch += 1
            text = self.files[self.file_index].read_text(encoding="utf-8", errors="replace")
            tokens = np.asarray(self.tokenizer.encode(text, add_bos=True, add_eos=True), TOKEN)
            self.inputs = np.concatenate((self.inputs, tokens[:-1]))
            self.labels = np.concatenate((self.labels, tokens[1:]))
            self.positions = np.concatenate((self.positions, np.arange(len(tokens) - 1)))
            self.file_index += 1

    def take(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The next sample off the buffers.  The positions of a file that began in an
        earlier sample restart at 0 (as torchtitan's text loader does), so none reaches
        ``seq_len``.  The buffers are arrays, not lists: a sample is three slices and
        copies, where a tensor built from a list converts each Python int (the loader
        runs on the training process's host, between its steps)."""
        n = self.seq_len
        inputs, labels, positions = (
            torch.from_numpy(buffer[:n].copy())
            for buffer in (self.inputs, self.labels, self.positions)
        )
        starts = (positions == 0).nonzero()
        head = int(starts[0, 0]) if len(starts) else n
        positions[:head] -= positions[0].clone()
        self.inputs, self.labels, self.positions = (
            self.inputs[n:],
            self.labels[n:],
            self.positions[n:],
        )
        return {"input": inputs, "positions": positions}, labels

    def state_dict(self) -> dict[str, Any]:
        return {
            "file_index": self.file_index,
            "epoch": self.epoch,
            "inputs": self.inputs.tolist(),
            "labels": self.labels.tolist(),
            "positions": self.positions.tolist(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.file_index = state_dict["file_index"]
        self.epoch = state_dict["epoch"]
        self.inputs, self.labels, self.positions = (
            np.asarray(state_dict[key], TOKEN) for key in ("inputs", "labels", "positions")
        )


__all__ = [
    "BOS",
    "EOS",
    "VOCAB_SIZE",
    "ByteCodec",
    "Encoder",
    "StdlibDataset",
    "stdlib_files",
]
