"""Block-scaled formats: error and bias of round-to-nearest (rne) against SR, with and
without a random Hadamard transform (RHT), and the bias of a long sum of block products.

Quantization error.  Each named block format (and MXFP4 with the scale rule ``floor-3/4``)
quantizes the same ``rows x cols`` fp32 tensor x along its last axis, once with rne and
``copies`` times with SR (the copies stacked into one tensor: the SR words come from each
element's global index, so every copy draws its own bits).  Data: standard Gaussian, and
Student-t with 3 degrees of freedom (heavy tails: a few large values per row set the block
scales).  With RHT, x's groups of ``rht`` values (the block size: 32 for MX and the
row-wise format, 16 for NVFP4) are rotated by the orthonormal Walsh-Hadamard transform
with random signs before scaling, and the error is measured against the rotated x (the
rotation is orthonormal, so the error's norm is the same in either basis).  The table
gives the RMS relative error ``sqrt(mean (Q(x) - x)^2) / sqrt(mean x^2)`` and the bias
``sqrt(mean_i b_i^2) / sqrt(mean x^2)`` of the per-element mean error
``b_i = mean over copies of Q(x)_i - x_i``.  For rne the bias is the error itself.  For an
unbiased SR, ``E[b_i^2] = Var_i / copies``, so the ratio ``z = bias / (error / sqrt(copies))``
lies near 1; a z well above 1 is a bias: the SR step above the largest element value is
clamped (saturated) where the scale rule lets a block's amax land past the element's max
after scaling (``floor``: amax lands in ``[2^emax, 2^(emax + 1))``, beyond e2m1's 6 or
e4m3's 448; NVFP4's block scale rounded to nearest e4m3 can land a little below amax / 6),
which ``floor-3/4`` avoids by design.

Long sums.  ``rows`` dot products ``sum_k Q(a_k) Q(b_k)`` of length ``length``, with a
and b nonnegative (|Gaussian| and |Student-t|, like the magnitudes of activations and
gradients), quantized along k (the reduction axis of a GEMM), a and b with independent SR
streams, the products summed in float64: the relative error of each sum against the exact
one, its mean over the rows (the bias) and that mean's standard error.  SR's products are
unbiased where no element clamps (E[Q(a) Q(b)] = E[Q(a)] E[Q(b)] = a b), so its mean
error is zero up to its standard error; rne's errors do not average out over k.  With
RHT, a and b are rotated with the same signs (the rotation cancels in the product).

Random bits: every call takes ``seed``, and the case, data, RHT and operand select the
stream's offset (``STREAM_OFFSET + ...``); the data come from torch.Generator seeded with
``seed``; RHT signs from `stochround.blocks.random_signs` with ``seed``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..blocks.formats import BLOCK_FORMATS, BlockFormat
from ..blocks.hadamard import hadamard, random_signs
from ..blocks.quantize import quantize
from .report import Experiment, ProgressLike, Table, new_figure, save_figure

STREAM_OFFSET = 64
STUDENT_DOF = 3
DATA = ("gaussian", "student-t")
MODES = ("rne", "sr")


@dataclass(frozen=True)
class Case:
    """A row of the tables: a label, the block format's name and the options passed to
    `stochround.blocks.quantize` on top of it."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def format(self) -> BlockFormat:
        return BLOCK_FORMATS[self.name]


CASES = (
    *(Case(name, name) for name in BLOCK_FORMATS),
    Case("mxfp4 floor-3/4", "mxfp4", {"scale_rule": "floor-3/4"}),
)


@dataclass(frozen=True)
class Sizes:
    """The experiment's sizes: the error table's tensor (``rows x cols``) and SR copies,
    and the long sums' count (``sums``) and length."""

    rows: int
    cols: int
    copies: int
    sums: int
    length: int


QUICK = Sizes(rows=16, cols=256, copies=32, sums=64, length=2048)
FULL = Sizes(rows=64, cols=1024, copies=64, sums=256, length=16384)


def rht_size(fmt: BlockFormat) -> int:
    """The RHT group size used with ``fmt``: its block where that is one of 16 or 32
    consecutive values, 16 for a 2-D block, else 32 (a whole-row block)."""
    if isinstance(fmt.block, int) and fmt.block in (16, 32):
        return fmt.block
    return 16 if isinstance(fmt.block, tuple) else 32


def sample(kind: str, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """fp32 samples of ``kind``: "gaussian" (standard normal) or "student-t" (3 degrees of
    freedom: a normal over sqrt(chi^2_3 / 3), the chi-square a sum of 3 squared normals)."""
    normal = torch.randn(shape, generator=generator, dtype=torch.float64)
    if kind == "gaussian":
        return normal.float()
    if kind != "student-t":
        raise ValueError(f"kind must be one of {', '.join(DATA)}; got {kind!r}")
    chi2 = torch.randn((*shape, STUDENT_DOF), generator=generator, dtype=torch.float64)
    return (normal / torch.sqrt(chi2.square().sum(-1) / STUDENT_DOF)).float()


SUMS = len(DATA)  # the long sums' slot among the data kinds of `quantization_offset`


def quantization_offset(case: int, data: int, rht: bool, operand: int = 0) -> int:
    """The SR stream offset of one quantization: distinct for every case, data kind (an
    index into `DATA`, or `SUMS` for the long sums), RHT setting and operand (a and b of a
    dot product)."""
    return STREAM_OFFSET + ((case * (len(DATA) + 1) + data) * 2 + int(rht)) * 2 + operand


def quantized(
    x: Tensor,
    case: Case,
    mode: str,
    *,
    seed: int,
    offset: int,
    signs: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """(reference, Q(x)) in fp64: ``x`` quantized along its last axis to ``case`` with
    ``mode`` and dequantized; with ``signs``, x rotated by RHT (groups of ``len(signs)``)
    before scaling, and the reference the rotated x."""
    options: dict[str, Any] = dict(case.options)
    reference = x
    if signs is not None:
        size = signs.numel()
        options.update(rht=size, rht_signs=signs)
        reference = hadamard(x, size, signs=signs)
    if mode == "sr":
        options.update(seed=seed, offset=offset)
    q = quantize(x, case.name, mode, axis=-1, backend="torch", **options)
    # dequantize() keeps the rotated basis (unrotate=False), that of the reference
    return reference.double(), q.dequantize(torch.float64)


@dataclass
class ErrorResult:
    """One cell group of the error table: RMS relative error, relative bias, and (SR) the
    ratio of the bias to its value for an unbiased SR, ``bias / (error / sqrt(copies))``."""

    error: float
    bias: float
    z: float


def error_and_bias(
    x: Tensor,
    case: Case,
    mode: str,
    copies: int,
    *,
    seed: int,
    offset: int,
    signs: Tensor | None,
) -> ErrorResult:
    """Quantize ``x`` (2-D) to ``case`` with ``mode``: once for rne, as ``copies`` stacked
    copies for SR; the RMS relative error over every copy, the bias of the per-element mean
    over the copies relative to x's RMS, and z = bias / (error / sqrt(copies)) (module
    docstring; rne: copies = 1, so z = 1)."""
    count = copies if mode == "sr" else 1
    stacked = x.unsqueeze(0).expand(count, *x.shape).contiguous()
    reference, values = quantized(stacked, case, mode, seed=seed, offset=offset, signs=signs)
    errors = values - reference
    scale = math.sqrt(float(reference[0].square().mean()))
    error = math.sqrt(float(errors.square().mean())) / scale
    bias = math.sqrt(float(errors.mean(0).square().mean())) / scale
    z = bias / (error / math.sqrt(count)) if error > 0 else 0.0
    return ErrorResult(error, bias, z)


@dataclass
class SumResult:
    """The long sums of one case and mode: the mean relative error over the sums (the
    bias), its standard error, and the RMS relative error."""

    bias: float
    standard_error: float
    rms: float


def long_sums(
    a: Tensor,
    b: Tensor,
    case: Case,
    mode: str,
    *,
    seed: int,
    offsets: tuple[int, int],
    signs: Tensor | None,
) -> SumResult:
    """``sum_k Q(a)_k Q(b)_k`` of each row of ``a`` and ``b`` (2-D, equal shapes), quantized
    along the rows with independent streams (``offsets``), against the exact ``sum_k a_k
    b_k``; with ``signs``, both rotated by the same RHT (an orthonormal map keeps the dot
    product)."""
    _, qa = quantized(a, case, mode, seed=seed, offset=offsets[0], signs=signs)
    _, qb = quantized(b, case, mode, seed=seed, offset=offsets[1], signs=signs)
    exact = (a.double() * b.double()).sum(-1)
    relative = (qa * qb).sum(-1) / exact - 1
    standard_error = float(relative.std()) / math.sqrt(relative.numel())
    return SumResult(float(relative.mean()), standard_error, float(relative.square().mean()) ** 0.5)


def run(quick: bool, seed: int, out: Path, progress: ProgressLike) -> Experiment:
    started = time.perf_counter()
    sizes = QUICK if quick else FULL
    generator = torch.Generator().manual_seed(seed)
    data = {kind: sample(kind, (sizes.rows, sizes.cols), generator) for kind in DATA}
    a = sample("gaussian", (sizes.sums, sizes.length), generator).abs()
    b = sample("student-t", (sizes.sums, sizes.length), generator).abs()
    signs = {size: random_signs(size, seed) for size in (16, 32)}
    key: dict[str, float | int | str | bool] = {}
    errors: dict[tuple[str, str, bool, str], ErrorResult] = {}
    sums: dict[tuple[str, bool, str], SumResult] = {}
    error_rows: list[list[str]] = []
    sum_rows: list[list[str]] = []
    work = [(index, case, rht) for index, case in enumerate(CASES) for rht in (False, True)]
    for index, case, rht in progress.track(work, "block formats", len(work)):
        group = signs[rht_size(case.format)] if rht else None
        tag = f"{case.label}{' rht' if rht else ''}"
        for data_index, kind in enumerate(DATA):
            offset = quantization_offset(index, data_index, rht)
            for mode in MODES:
                found = error_and_bias(
                    data[kind], case, mode, sizes.copies, seed=seed, offset=offset, signs=group
                )
                errors[case.label, kind, rht, mode] = found
                name = f"{key_name(case.label)}{'_rht' if rht else ''}_{key_name(kind)}_{mode}"
                key[f"{name}_error"] = found.error
                key[f"{name}_bias"] = found.bias
                if mode == "sr":
                    key[f"{name}_z"] = found.z
            rn, sr = errors[case.label, kind, rht, "rne"], errors[case.label, kind, rht, "sr"]
            error_rows.append(
                [
                    tag,
                    kind,
                    f"{rn.error:.3e}",
                    f"{sr.error:.3e}",
                    f"{sr.error / rn.error:.2f}" if rn.error > 0 else "-",
                    f"{sr.bias:.2e}",
                    f"{sr.z:.2f}",
                ]
            )
        offsets = (
            quantization_offset(index, SUMS, rht, 0),
            quantization_offset(index, SUMS, rht, 1),
        )
        for mode in MODES:
            found_sum = long_sums(a, b, case, mode, seed=seed, offsets=offsets, signs=group)
            sums[case.label, rht, mode] = found_sum
            name = f"sum_{key_name(case.label)}{'_rht' if rht else ''}_{mode}"
            key[f"{name}_bias"] = found_sum.bias
            key[f"{name}_standard_error"] = found_sum.standard_error
            key[f"{name}_rms"] = found_sum.rms
        rn_sum, sr_sum = sums[case.label, rht, "rne"], sums[case.label, rht, "sr"]
        sum_rows.append(
            [
                tag,
                f"{rn_sum.bias:+.2e}",
                f"{sr_sum.bias:+.2e}",
                f"{sr_sum.standard_error:.1e}",
                f"{abs(sr_sum.bias) / sr_sum.standard_error:.2f}",
                f"{sr_sum.rms:.2e}",
            ]
        )
    key.update(copies=sizes.copies, sums=sizes.sums, length=sizes.length)
    key.update(rows=sizes.rows, cols=sizes.cols)
    error_table = Table(
        f"Block quantization of {sizes.rows}x{sizes.cols} values: RMS relative error and "
        f"bias (SR over {sizes.copies} copies)",
        ["format", "data", "rne error", "SR error", "SR / rne", "SR bias", "SR z"],
        error_rows,
        [
            "error: sqrt(mean (Q(x) - x)^2) / rms(x); SR bias: rms over elements of the mean "
            "error over the copies, / rms(x); z = bias / (error / sqrt(copies)): about 1 "
            "for an unbiased SR, above where elements clamp at the element's max.",
            "rht: groups of 32 values (16 for nvfp4) rotated by a random Hadamard transform "
            "before scaling; student-t: 3 degrees of freedom.",
        ],
    )
    sum_table = Table(
        f"Long sums: {sizes.sums} dot products of length {sizes.length}, |gaussian| . "
        "|student-t|, mean relative error",
        ["format", "rne bias", "SR bias", "SR std error", "|SR bias| / se", "SR rms error"],
        sum_rows,
        [
            "bias: the mean over the sums of (sum_k Q(a_k) Q(b_k)) / (sum_k a_k b_k) - 1; "
            "se: its standard error. Unbiased SR keeps |bias| / se of order 1.",
        ],
    )
    figures = [_plot_errors(errors, out), _plot_sums(sums, out)]
    return Experiment(
        name="block-formats",
        title="Block-scaled formats: rne against SR, with and without RHT",
        tables=[error_table, sum_table],
        figures=figures,
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings={
            "quick": quick,
            "seed": seed,
            "rows": sizes.rows,
            "cols": sizes.cols,
            "copies": sizes.copies,
            "sums": sizes.sums,
            "length": sizes.length,
        },
    )


def key_name(label: str) -> str:
    """A label as part of a key number's name: lower case, runs of other characters as
    one underscore ("mxfp4 floor-3/4" -> "mxfp4_floor_3_4")."""
    parts = "".join(c if c.isalnum() else " " for c in label.lower()).split()
    return "_".join(parts)


def _plot_errors(errors: dict[tuple[str, str, bool, str], ErrorResult], out: Path) -> Path:
    figure, axes = new_figure(9.0, 4.2)
    labels = [case.label for case in CASES]
    positions = np.arange(len(labels))
    bars = [(kind, rht, mode) for kind in DATA for rht in (False, True) for mode in MODES]
    width = 0.8 / len(bars)
    for number, (kind, rht, mode) in enumerate(bars):
        heights = [errors[label, kind, rht, mode].error for label in labels]
        axes.bar(
            positions + (number - len(bars) / 2 + 0.5) * width,
            heights,
            width,
            label=f"{kind}{' rht' if rht else ''} {mode}",
            color=f"C{number // 2}",
            alpha=0.55 if mode == "rne" else 1.0,
            hatch="" if mode == "rne" else "//",
        )
    axes.set_xticks(positions, labels, rotation=30, ha="right", fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("RMS relative error")
    axes.set_title("Block quantization error: rne (plain) and SR (hatched)")
    axes.legend(fontsize=7, ncol=2)
    return save_figure(figure, out, "block_formats_error")


def _plot_sums(sums: dict[tuple[str, bool, str], SumResult], out: Path) -> Path:
    figure, axes = new_figure(9.0, 4.2)
    labels = [case.label for case in CASES]
    positions = np.arange(len(labels))
    bars = [(rht, mode) for rht in (False, True) for mode in MODES]
    width = 0.8 / len(bars)
    for number, (rht, mode) in enumerate(bars):
        found = [sums[label, rht, mode] for label in labels]
        axes.bar(
            positions + (number - len(bars) / 2 + 0.5) * width,
            [abs(result.bias) for result in found],
            width,
            yerr=[result.standard_error for result in found] if mode == "sr" else None,
            label=f"{mode}{' rht' if rht else ''}",
            color=f"C{number}",
        )
    axes.set_xticks(positions, labels, rotation=30, ha="right", fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("|mean relative error| of the sums")
    axes.set_title("Long sums of block products: bias (SR: with its standard error)")
    axes.legend(fontsize=7)
    return save_figure(figure, out, "block_formats_sums")
