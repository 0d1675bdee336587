"""The language-model experiment's data: the standard library's own Python source read as
bytes (`TRAIN_FILES`, `VALIDATION_FILES`), the training windows at random offsets and the
validation windows at evenly spaced ones (`stochround.experiments.language_model` states
the protocol).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

VOCAB = 256

# Large pure-Python modules present in every CPython 3.10+ (none removed by PEP 594, none
# turned into a package since 3.10), as paths relative to the stdlib folder
TRAIN_FILES: tuple[str, ...] = (
    "_pydecimal.py",
    "inspect.py",
    "typing.py",
    "pydoc.py",
    "email/_header_value_parser.py",
    "tarfile.py",
    "doctest.py",
    "unittest/mock.py",
    "urllib/request.py",
    "argparse.py",
    "_pyio.py",
    "pickletools.py",
    "subprocess.py",
    "difflib.py",
    "logging/__init__.py",
    "locale.py",
    "enum.py",
    "mailbox.py",
    "asyncio/base_events.py",
    "xml/etree/ElementTree.py",
    "importlib/_bootstrap_external.py",
    "xml/dom/minidom.py",
    "pickle.py",
    "pdb.py",
    "logging/handlers.py",
    "ast.py",
    "optparse.py",
    "unittest/case.py",
    "dataclasses.py",
    "threading.py",
    "http/client.py",
    "shutil.py",
    "configparser.py",
    "imaplib.py",
    "ssl.py",
    "collections/__init__.py",
    "http/server.py",
    "email/message.py",
    "multiprocessing/managers.py",
    "statistics.py",
)
VALIDATION_FILES: tuple[str, ...] = (
    "smtplib.py",
    "platform.py",
    "urllib/parse.py",
    "os.py",
    "traceback.py",
    "functools.py",
)


@dataclass
class Data:
    """The training and validation text, as uint8 tensors of bytes."""

    train: Tensor
    validation: Tensor


def stdlib_folder() -> Path:
    """The running interpreter's standard-library folder (``sysconfig``'s ``stdlib``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _read_files(names: Sequence[str], root: Path) -> Tensor:
    """The files ``names`` (paths relative to ``root``) concatenated, as a uint8 tensor.

    A missing file is a ValueError naming it and ``root``.
    """
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise ValueError(
            f"the language-model data needs the standard-library files {', '.join(missing)}, "
            f"not found in {root}"
        )
    text = b"".join((root / name).read_bytes() for name in names)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def load_data(
    root: Path | None = None,
    train_files: Sequence[str] = TRAIN_FILES,
    validation_files: Sequence[str] = VALIDATION_FILES,
) -> Data:
    """The training and validation text: the files of each list under ``root`` (default:
    `stdlib_folder`).  A file in both lists is a ValueError (the split is by file)."""
    shared = sorted(set(train_files) & set(validation_files))
    if shared:
        raise ValueError(f"train_files and validation_files share {', '.join(shared)}")
    folder = stdlib_folder() if root is None else root
    return Data(_read_files(train_files, folder), _read_files(validation_files, folder))


def batch_starts(
    length: int, steps: int, batch: int, context: int, generator: torch.Generator
) -> Tensor:
    """The offsets of every training window of a run, drawn at once from ``generator``:
    int64 ``(steps, batch)``, uniform in [0, length - context - 1] (a window holds
    ``context + 1`` bytes of a text of ``length`` bytes).  Drawn up front so that a run on
    a GPU copies them once, not at every step."""
    if length < context + 1:
        raise ValueError(f"the text ({length} bytes) is shorter than context + 1")
    return torch.randint(0, length - context, (steps, batch), generator=generator)


def windows_at(text: Tensor, starts: Tensor, context: int) -> tuple[Tensor, Tensor]:
    """The windows of ``context + 1`` bytes of ``text`` at ``starts`` (on text's device):
    (inputs, targets), int64 ``(*starts.shape, context)``, the targets the inputs shifted
    by one byte."""
    offsets = torch.arange(context + 1, device=text.device)
    windows = text[starts[..., None] + offsets].long()
    return windows[..., :-1], windows[..., 1:]


def validation_windows(text: Tensor, count: int, context: int) -> Tensor:
    """``count`` windows of ``context + 1`` bytes at evenly spaced offsets of ``text``
    (the first at 0, the last at ``len - context - 1``), int64 ``(count, context + 1)``."""
    if text.numel() < context + 1:
        raise ValueError(f"the text ({text.numel()} bytes) is shorter than context + 1")
    starts = torch.linspace(0, text.numel() - context - 1, count).long()
    return text[starts[:, None] + torch.arange(context + 1)].long()


__all__ = [
    "VOCAB",
    "Data",
    "batch_starts",
    "load_data",
    "validation_windows",
    "windows_at",
]
