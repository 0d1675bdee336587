"""The trace of `stochround.emulate.mca` (``trace=True``): the line of the program that ran
each floating ATen op (`call_site`), and per call site the fewest significant digits of its
ops' outputs across the n samples (`SiteStatistics`, reported as `SiteDigits`).

What a traced op costs.  The batched run (`stochround.emulate.mca_batched`) gives each op's
outputs as ``(n, *shape)`` samples; its observer holds them (no copy, no ATen op) as the
next columns of an ``(n, columns)`` float64 buffer of its device, into which they are
copied together (one concatenation, one copy: no arithmetic, nothing read back to the
host) when the buffer is full or before an op writes into a tensor of the run (which
could be one held), and notes the call's site and precision on the host.  The moments and
digits of a full buffer's columns are computed together, and each output's fewest digits
kept as one element of a device tensor (`stochround.emulate.mca_digits.fewest_digits`);
the report reads them back once (`SiteStatistics.sites`).  The site is the first frame
outside torch and stochround, whether a file is theirs decided once per file.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..formats import Format, format_of_dtype
from ..torch_path import FLOAT_DTYPES
from .mca_digits import fewest_digits

__all__ = [
    "NO_PYTHON_FRAME",
    "TRACE_BUFFER_BYTES",
    "SiteDigits",
    "SiteStatistics",
    "call_site",
    "precision_of",
]

# the site of an op run where no Python frame outside torch and stochround is on the stack
# (an autograd engine thread running a backward pass on an accelerator)
NO_PYTHON_FRAME = "<no Python frame>"

# the bytes of a device's buffer of float64 samples (`SiteStatistics.observe_samples`):
# the ops copied into it have their digits computed together, a few ops for the lot
TRACE_BUFFER_BYTES = 2**20

# the folders whose frames `call_site` skips: the library's and torch's own code
_LIBRARY_FOLDERS = tuple(
    str(folder) + os.sep for folder in (Path(torch.__file__).parent, Path(__file__).parents[1])
)

# per source file: whether it is torch's or stochround's (its frames skipped)
_LIBRARY_FILES: dict[str, bool] = {}


@dataclass(frozen=True)
class SiteDigits:
    """The digits of one op call site over the n runs of `mca` with ``trace=True``.

    ``site``: ``"file:line function"`` of the first Python frame outside torch and
    stochround (`call_site`); ``calls``: the ATen ops that site ran in a run (the most over
    the runs); ``digits``: the minimum, over those calls and over every element
    of their floating outputs, of the significant digits across the n runs (NaN where a
    call's outputs hold NaN, or where it happened in only one run).
    """

    site: str
    calls: int
    digits: float


def call_site() -> str:
    """``"file:line function"`` of the innermost Python frame outside torch's and
    stochround's folders: the line of the user's program that ran the current op (for an
    ``nn.Module``, the line that called it); `NO_PYTHON_FRAME` where there is none."""
    frame = sys._getframe(1)  # this function's caller: call_site itself is stochround's
    library = _LIBRARY_FILES
    while frame is not None:
        code = frame.f_code
        inside = library.get(code.co_filename)
        if inside is None:
            inside = library[code.co_filename] = code.co_filename.startswith(_LIBRARY_FOLDERS)
        if not inside:
            return f"{code.co_filename}:{frame.f_lineno} {code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return NO_PYTHON_FRAME


def precision_of(formats: Mapping[torch.dtype, Format], dtype: torch.dtype) -> int | None:
    """The significant bits of ``dtype``'s results under the emulation: its target format's,
    its own where it has none (its ops are unrounded); None for integer and bool values,
    which no rounding touches (`significant_digits` does not clamp them)."""
    if dtype in formats:
        return formats[dtype].precision
    if dtype in FLOAT_DTYPES:
        return format_of_dtype(dtype).precision
    return None


class _Columns:
    """A device's buffer of samples not yet reduced: ``values`` ``(n, columns)`` float64,
    its first ``used`` columns taken, output ``outputs[k]`` in the next ``lengths[k]``:
    the first ``settled`` copied, the others' samples held in ``pending`` (``(n, width)``
    tensors, the ops' own outputs: no copy until one is needed, `SiteStatistics.settle`)."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.n, self.columns = n, max(1, TRACE_BUFFER_BYTES // (8 * n))
        self.values = torch.empty((n, self.columns), dtype=torch.float64, device=device)
        self.used = self.settled = 0
        self.pending: list[Tensor] = []
        self.lengths: list[int] = []
        self.outputs: list[int] = []

    def settle(self) -> None:
        """Copy the pending samples into their columns (one copy of them all)."""
        if not self.pending:
            return
        pending = self.pending
        values = pending[0] if len(pending) == 1 else torch.cat(pending, dim=1)
        self.values[:, self.settled : self.used].copy_(values)
        self.settled = self.used
        self.pending = []

    def filled(self) -> Tensor:
        """The ``(n, used)`` float64 samples of the taken columns (the pending settled)."""
        self.settle()
        return self.values[:, : self.used]


class SiteStatistics:
    """The digits of each op call's outputs, gathered as an `Emulation`'s observer and
    reported per call site (`sites`).

    The serial run (`observe`) keeps, per (site, call index within the run), the running
    mean and sum of squared deviations (Welford) of each floating output over the runs
    (float64, the output's shape).  The batched run (`observe_samples`) sees all n samples
    of a call at once: it holds them as columns of a buffer, copied in together, whose
    columns' digits are computed when it is full (module docstring), so it keeps one
    number an output, not its values.  The run calls `settle` before an op writes into
    one of its tensors.
    """

    def __init__(self, formats: Mapping[torch.dtype, Format]) -> None:
        self.formats = formats
        # serial: (site, index) -> per floating output: [count, mean, squared deviations, p]
        self.moments: dict[tuple[str, int], list[list[Any]]] = {}
        self.calls_in_run: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        # batched: per output observed, in order, its (site, precision); its fewest digits
        # in `_reduced` once its buffer is reduced
        self.outputs: list[tuple[str, int | None]] = []
        self._open: dict[torch.device, _Columns] = {}
        self._reduced: list[tuple[list[int], Tensor]] = []
        self._precisions: dict[torch.dtype, int | None] = {}

    def start_run(self) -> None:
        """Restart the call indices: the next run's calls match this run's by index."""
        self.calls_in_run = {}

    def _call(self) -> tuple[str, int]:
        """The current op call's key: its site and its index among the site's calls."""
        site = call_site()
        index = self.calls_in_run.get(site, 0)
        self.calls_in_run[site] = index + 1
        if index >= self.calls.get(site, 0):
            self.calls[site] = index + 1
        return site, index

    def observe_samples(self, func: torch._ops.OpOverload, outputs: object) -> None:
        """The batched run's observer: the op's floating outputs hold the n samples
        (``(n, *shape)``); each is copied into its device's buffer (`_Columns`), one copy
        and no read back to the host."""
        site, _ = self._call()
        for samples in (outputs,) if isinstance(outputs, Tensor) else _tensors(outputs):
            dtype = samples.dtype
            count = samples.numel()
            if not dtype.is_floating_point or count == 0:
                continue  # an empty output has no digits
            self._add(samples, count, len(self.outputs))
            precision = self._precisions.get(dtype, 0)
            if precision == 0:  # none is 0 bits: not yet looked up
                precision = self._precisions[dtype] = precision_of(self.formats, dtype)
            self.outputs.append((site, precision))

    def _add(self, samples: Tensor, count: int, output: int) -> None:
        """Hold ``samples`` (``count`` values) as the next columns of its device's buffer
        (reduced first if they do not fit; samples wider than a buffer reduced on their
        own)."""
        n = samples.shape[0]
        width = count // n
        device = samples.device
        columns = self._open.get(device)
        if columns is None or columns.n != n:
            if columns is not None:
                self._reduce(device)
            columns = self._open[device] = _Columns(n, device)
        if width > columns.columns:
            values = samples.detach().reshape(n, width).to(torch.float64)
            self._reduced.append(([output], _digits_of_columns(values, [width])))
            return
        if columns.used + width > columns.columns:
            self._reduce(device)
            columns = self._open[device] = _Columns(n, device)
        # the output itself, held: the run calls `settle` before any op writes into a tensor
        columns.pending.append(samples if samples.ndim == 2 else samples.reshape(n, width))
        columns.used += width
        columns.lengths.append(width)
        columns.outputs.append(output)

    def _reduce(self, device: torch.device) -> None:
        """The fewest digits of each output in ``device``'s buffer (kept on the device),
        the buffer closed."""
        columns = self._open.pop(device)
        if columns.used:
            values = columns.filled()
            self._reduced.append((columns.outputs, _digits_of_columns(values, columns.lengths)))

    def settle(self) -> None:
        """Copy every output held (`observe_samples`) into its buffer: the batched run
        calls it before an op writes into a tensor (which may be one held), and after the
        run."""
        for columns in self._open.values():
            columns.settle()

    def observe(self, func: torch._ops.OpOverload, outputs: object) -> None:
        """The observer: fold the op's floating outputs into its call's moments.  The
        emulation calls it with its rounding turned off, so these float64 ops are not
        rounded to the emulated format."""
        site, index = self._call()
        tensors = [
            t
            for t in _tensors(outputs)
            if t.is_floating_point() and t.numel() > 0  # an empty output has no digits
        ]
        entries = self.moments.setdefault((site, index), [])
        if entries and len(entries) != len(tensors):
            raise RuntimeError(
                f"trace: the op call #{index} at {site} gave {len(tensors)} outputs in one "
                f"run and {len(entries)} in another; fn must run the same ops in every run"
            )
        for position, tensor in enumerate(tensors):
            value = tensor.detach().to(torch.float64, copy=True)
            if position == len(entries):
                p = precision_of(self.formats, tensor.dtype)
                entries.append([1, value, torch.zeros_like(value), p])
                continue
            entry = entries[position]
            if entry[1].shape != value.shape:
                raise RuntimeError(
                    f"trace: the op call #{index} at {site} gave shapes "
                    f"{tuple(entry[1].shape)} and {tuple(value.shape)} in two runs; fn must "
                    "run the same ops in every run"
                )
            entry[0] += 1
            delta = value - entry[1]
            entry[1] = entry[1] + delta / entry[0]
            entry[2] = entry[2] + delta * (value - entry[1])

    def sites(self) -> tuple[SiteDigits, ...]:
        """Per site, the fewest digits of any element of any of its calls' outputs (NaN if
        any is NaN); sorted worst first (NaN first, then ascending), ties in order of first
        call.  Sites whose outputs are all non-floating or empty have no digits: left out.

        An output's digits are `significant_digits` of its elements' mean and std clamped
        to its precision's p log10 2; their minimum is computed as the minimum of the
        unclamped ones (`fewest_digits`), then clamped: the same number, as clamping
        commutes with the minimum.  Read back to the host here, once a device."""
        per_site: dict[str, list[float]] = {}
        for site, precision, fewest in self._serial_digits() + self._batched_digits():
            bound = math.inf if precision is None else precision * math.log10(2)
            clamped = fewest if math.isnan(fewest) else min(fewest, bound)
            per_site.setdefault(site, []).append(clamped)
        found = [
            SiteDigits(site, self.calls[site], math.nan if math.isnan(sum(d)) else min(d))
            for site, d in per_site.items()
        ]
        return tuple(sorted(found, key=lambda s: -math.inf if math.isnan(s.digits) else s.digits))

    def _batched_digits(self) -> list[tuple[str, int | None, float]]:
        """Each batched output's (site, precision, fewest unclamped digits), in order."""
        for device in list(self._open):
            self._reduce(device)
        fewest = [math.nan] * len(self.outputs)
        per_device: dict[torch.device, list[tuple[list[int], Tensor]]] = {}
        for outputs, digits in self._reduced:
            per_device.setdefault(digits.device, []).append((outputs, digits))
        for chunks in per_device.values():
            values = torch.cat([digits for _, digits in chunks]).tolist()
            outputs = [output for chunk, _ in chunks for output in chunk]
            for output, value in zip(outputs, values, strict=True):
                fewest[output] = value
        return [(site, p, d) for (site, p), d in zip(self.outputs, fewest, strict=True)]

    def _serial_digits(self) -> list[tuple[str, int | None, float]]:
        """Each serial output's (site, precision, fewest unclamped digits), in order: the
        std ``sqrt(squares / (count - 1))``, NaN for one run; computed together per
        device."""
        entries = [
            (site, count, mean, squares, p)
            for (site, _), per_call in self.moments.items()
            for count, mean, squares, p in per_call
        ]
        fewest = [math.nan] * len(entries)
        devices = {mean.device for _, _, mean, _, _ in entries}
        for device in devices:
            chosen = [i for i, entry in enumerate(entries) if entry[2].device == device]
            means, stds = [], []
            for i in chosen:
                _, count, mean, squares, _ = entries[i]
                std = (squares / (count - 1)).sqrt() if count > 1 else mean * math.nan
                means.append(mean.reshape(-1))
                stds.append(std.reshape(-1))
            lengths = [entries[i][2].numel() for i in chosen]
            digits = fewest_digits(torch.cat(means), torch.cat(stds), lengths).tolist()
            for i, value in zip(chosen, digits, strict=True):
                fewest[i] = value
        return [(site, p, d) for (site, _, _, _, p), d in zip(entries, fewest, strict=True)]


def _digits_of_columns(values: Tensor, lengths: list[int]) -> Tensor:
    """Per run of ``lengths`` consecutive columns of ``values`` (``(n, m)`` float64, n
    samples), the fewest unclamped digits of its columns (`fewest_digits`): each column's
    mean and sample std ``sqrt(sum((x - mean)**2) / (n - 1))``, computed for all columns
    at once."""
    n = values.shape[0]
    with torch.no_grad():
        mean = values.mean(dim=0)
        squares = ((values - mean) ** 2).sum(dim=0)
        std = (squares / (n - 1)).sqrt() if n > 1 else mean * math.nan
        return fewest_digits(mean, std, lengths)


def _tensors(value: object) -> list[Tensor]:
    """The tensors in an op's result (a tensor, or a tuple or list of them, nested)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    return []
