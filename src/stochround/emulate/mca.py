"""Monte Carlo arithmetic on unmodified PyTorch code: run a function n times under
`stochround.emulate.emulate` with random rounding at a virtual precision and measure how many
significant decimal digits its results keep, and, with ``trace=True``, where (at which line
of the program) the digits are lost (Parker 1997; Verificarlo's and PyTracer's reports, at
the level of ATen operations).

A run rounds every floating ATen op's exact result (computed in float64; a float64 op's
residual by error-free transformations, `stochround.emulate.exact`), so its result is one
sample of the computation's random-rounding distribution; n samples give, elementwise, a
mean, a sample std and the significant digits (`stochround.emulate.mca_digits`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .. import random as streams
from ..formats import Format, format_of_dtype
from ..reference import check_choice, check_mode
from ..torch_path import FLOAT_DTYPES
from .dispatch import Emulation
from .mca_batched import BatchedEmulation
from .mca_digits import check_estimator, estimated_digits, significant_digits
from .mca_samples import SAMPLE_STRIDE, BatchingError, sample_values
from .mca_trace import NO_PYTHON_FRAME, SiteDigits, SiteStatistics, call_site, precision_of
from .ops import FormatSpec, target_formats

__all__ = [
    "MAX_PRECISION",
    "MCA_MODES",
    "NO_PYTHON_FRAME",
    "SAMPLE_STRIDE",
    "BatchingError",
    "MCAResult",
    "SiteDigits",
    "call_site",
    "mca",
    "own_precision",
    "significant_digits",
    "virtual_precision",
]

# float64, the widest dtype an emulation rounds, has 53 significant bits
MAX_PRECISION = 53

# Verificarlo's MCA modes: random rounding of outputs, precision bounding of inputs, both
MCA_MODES = ("rr", "pb", "mca")


@dataclass(frozen=True)
class MCAResult:
    """The n results of a function under Monte Carlo arithmetic, per output.

    The function's tensor outputs are flattened in order (a tuple's or list's items, a
    dict's values in insertion order, nested); ``labels`` names each one by its place
    (``"result"`` for a single tensor, ``"[0]"``, ``"['loss']"``, ``"['a'][1]"``).  For each
    output i: ``samples[i]`` (float64, shape ``(n, *shape)``), and elementwise ``mean[i]``,
    ``std[i]`` (sample std, n - 1; samples, mean and std carry fn's gradient, straight
    through the roundings) and ``digits[i]`` (``estimator``'s digits, clamped to the
    precision of the format the output's dtype was rounded to; for an integer or bool
    output, which no rounding touches, unclamped: inf where every run agrees).  ``sites``: with
    ``trace=True``, one `SiteDigits` per op call site, worst (fewest digits, NaN first)
    first; empty otherwise.  ``formats``: the format each dtype's results were rounded to;
    ``seed``: the stream's seed.  ``mca_mode``: "rr", "pb" or "mca" (`mca`);
    ``estimator``: how ``digits`` were estimated ("plain", "cnh", "bernoulli":
    `stochround.emulate.mca_digits.estimated_digits`), with ``probability`` and
    ``confidence`` (unused by "plain"); ``no_residual``: the float64 ops rounded at 53 bits
    whose exact result the emulation could not compute (their results unperturbed; the
    emulation guide lists the ops it covers), sorted.
    """

    labels: tuple[str, ...]
    samples: tuple[Tensor, ...]
    mean: tuple[Tensor, ...]
    std: tuple[Tensor, ...]
    digits: tuple[Tensor, ...]
    sites: tuple[SiteDigits, ...]
    formats: Mapping[torch.dtype, Format]
    seed: int
    mca_mode: str = "rr"
    estimator: str = "plain"
    probability: float = 0.99
    confidence: float = 0.95
    no_residual: tuple[str, ...] = ()


def virtual_precision(precision: int) -> dict[torch.dtype, Format]:
    """Verificarlo's virtual precision of t significant bits: for each floating dtype with
    at least t bits, the format with its exponent range (exponent bits and bias) and t - 1
    mantissa bits.  Dtypes with fewer bits are left out: their results already have at most
    t bits, so rounding them to t bits would change nothing.

    Args:
        precision: t, an int in 1..`MAX_PRECISION` (ValueError/TypeError otherwise).
    """
    if isinstance(precision, bool) or not isinstance(precision, int):
        raise TypeError(f"precision must be an int in 1..{MAX_PRECISION}; got {precision!r}")
    if not 1 <= precision <= MAX_PRECISION:
        raise ValueError(f"precision must be an int in 1..{MAX_PRECISION}; got {precision}")
    formats = {}
    for dtype in FLOAT_DTYPES:
        native = format_of_dtype(dtype)
        if native.precision >= precision:
            formats[dtype] = Format(
                ebits=native.ebits,
                mbits=precision - 1,
                bias=native.exponent_bias,
                name=f"{native.name}_t{precision}",
            )
    return formats


def own_precision() -> dict[torch.dtype, Format]:
    """Each floating dtype's own precision as a virtual precision (Verificarlo's defaults:
    t = 24 for float32, 53 for float64; 8 for bfloat16, 11 for float16): the format with
    the dtype's exponent range and significand, named like `virtual_precision`'s."""
    formats = {}
    for dtype in FLOAT_DTYPES:
        native = format_of_dtype(dtype)
        formats[dtype] = Format(
            ebits=native.ebits,
            mbits=native.precision - 1,
            bias=native.exponent_bias,
            name=f"{native.name}_t{native.precision}",
        )
    return formats


def returner(fn: Callable[..., object]) -> str:
    """How error messages name ``fn``: ``name()`` for a named function (``main()``), else
    ``fn`` (a lambda, a partial)."""
    name = getattr(fn, "__name__", "")
    return f"{name}()" if isinstance(name, str) and name.isidentifier() else "fn"


def flat_outputs(
    value: object, label: str = "", returned_by: str = "fn"
) -> list[tuple[str, Tensor]]:
    """The tensors of a function's result with their labels, in order: a tensor; a Python
    number (as a tensor); a tuple's or list's items; a dict's values; None holds none.
    Another type is a TypeError naming it, its place and what mca takes.

    Args:
        value: the result (or a part of it).
        label: its place in the whole result (``""`` for the whole).
        returned_by: the function's name for the error (`returner`).
    """
    if isinstance(value, Tensor):
        return [(label or "result", value)]
    if isinstance(value, bool | int | float):
        return [(label or "result", torch.as_tensor(value))]
    if value is None:
        return []
    if isinstance(value, tuple | list):
        items: list[tuple[object, object]] = list(enumerate(value))
    elif isinstance(value, Mapping):
        items = list(value.items())
    else:
        place = f" at {label}" if label else ""
        raise TypeError(
            f"{returned_by} returned {type(value).__name__}{place}; mca needs a tensor, a "
            "Python number (bool, int, float), None, or tuples, lists and dicts of them"
        )
    found = []
    for key, item in items:
        found += flat_outputs(item, f"{label}[{key!r}]", returned_by)
    return found


def mca(
    fn: Callable[..., object],
    *args: object,
    n: int = 32,
    precision: int | None = None,
    fmt: FormatSpec | Mapping[torch.dtype, FormatSpec] | None = None,
    mode: str = "sr",
    seed: int = 0,
    trace: bool = False,
    mca_mode: str = "rr",
    estimator: str = "plain",
    probability: float = 0.99,
    confidence: float = 0.95,
    batched: bool = True,
    **kwargs: object,
) -> MCAResult:
    """Monte Carlo arithmetic on an unmodified function: ``fn(*args, **kwargs)`` run n times
    under one `Emulation` that computes each floating ATen op from its exact result (in
    float64; a float64 op's residual by error-free transformations, `stochround.emulate.
    exact`) and rounds it with ``mode`` to the virtual precision, and per output its mean,
    sample std and significant digits (``estimator``), clamped to the p log10 2 digits of
    the format it was rounded to.

    ``mca_mode`` (Verificarlo's): "rr", random rounding of each op's exact result (its
    output); "pb", precision bounding: each op's floating inputs rounded with ``mode`` to
    the format, the op computed in float64 and stored to nearest in its dtype; "mca": both.

    Random words: one stream ``seed`` for the n runs, run j's counter starting at ``j
    SAMPLE_STRIDE`` (``j 2**40``; its i-th rounding draws offset ``j 2**40 + i``): every
    rounding draws fresh words, the whole is reproducible from ``seed``, run 0 is ``with
    Emulation(formats, mode, seed=seed, compute="float64", residuals=mode == "sr", ...):
    fn(*args, **kwargs)``, and the batched and serial runs agree bit for bit.

    ``batched=True`` (the default) runs fn once on the n samples together
    (`stochround.emulate.mca_batched`: each op once over all samples); a program that reads
    a value of its tensors (``.item()``, ``if x > 0``), draws from torch's generator or
    whose shapes depend on its values raises `BatchingError` naming the op and its line:
    run it with ``batched=False``, the n runs one after another.  The batched samples carry
    no gradient: an argument that requires one is a ValueError (pass ``batched=False``).

    Args:
        fn: the function; it returns tensors, Python numbers, None, or tuples, lists and
            dicts of them (`flat_outputs`; a TypeError naming another type and its place).
            Integer and bool outputs are not rounded: their digits are inf where every run
            gives the same value, else ``-log10(std / |mean|)`` unclamped above.
        args, kwargs: its arguments (not rounded; fn's ops round their results).
        n: the number of runs, an int >= 2 (a std needs two samples).
        precision: t, a virtual precision of t significant bits (Verificarlo's MCA): every
            dtype with at least t bits rounded to t bits in its own exponent range
            (`virtual_precision`).  Give ``precision`` or ``fmt``, not both; neither:
            each dtype's own precision (`own_precision`: 24 bits for float32, 53 for
            float64, Verificarlo's defaults).
        fmt: the format(s), as `emulate` takes them (a name, `Format` or dtype, or a dict
            {dtype: format}).
        mode: the rounding mode, one of `stochround.reference.MODES`, any case ("sr" for MCA;
            a deterministic mode gives std 0 and the format's full digits).
        seed: the stream's seed, an int in [0, 2**64).
        trace: also record, per op call site (`call_site`), the fewest significant digits
            of its outputs across the n runs, the calls matched by (site, call index within
            the run) (`MCAResult.sites`).
        mca_mode: one of `MCA_MODES`, "rr" (the default), "pb" or "mca".
        estimator: "plain", "cnh" or "bernoulli" (`stochround.emulate.mca_digits.
            estimated_digits`), with ``probability`` and ``confidence`` in (0, 1).

    Every argument error is a ValueError or TypeError naming the argument.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (a std needs two samples); got {n!r}")
    if precision is not None and fmt is not None:
        raise ValueError(
            "give at most one of precision (a virtual precision in bits) and fmt (a format); "
            f"got precision={precision!r}, fmt={fmt!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int in [0, 2**64); got {seed!r}")
    streams.check_seed(seed, "seed")
    mode = check_mode(mode)
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be a bool; got {trace!r}")
    mca_mode = check_choice("mca_mode", mca_mode, MCA_MODES)
    estimator = check_estimator(estimator, probability, confidence)
    if precision is not None:
        target: FormatSpec | Mapping[torch.dtype, FormatSpec] = virtual_precision(precision)
    else:
        target = own_precision() if fmt is None else fmt
    formats = target_formats(target)
    statistics = SiteStatistics(formats)
    if not isinstance(batched, bool):
        raise TypeError(f"batched must be a bool; got {batched!r}")
    name = returner(fn)
    if batched:
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        if any(t.requires_grad for t in inputs) and torch.is_grad_enabled():
            raise ValueError(
                "batched=True gives samples without a gradient; an argument requires one: "
                "pass batched=False for samples that carry fn's gradient"
            )
        batched_emulation = BatchedEmulation(
            n,
            target,
            mode,
            seed=seed,
            residuals=mode == "sr",
            round_inputs=mca_mode != "rr",
            round_outputs=mca_mode != "pb",
            on_samples=statistics.observe_samples if trace else None,
            before_write=statistics.settle if trace else None,
            site=call_site,
        )
        with batched_emulation:
            result = fn(*args, **kwargs)
        statistics.settle()  # the outputs it holds are the program's, which may change now
        found = flat_outputs(result, returned_by=name)
        layout = [(label, t.dtype) for label, t in found]
        samples = tuple(sample_values(t, n) for _, t in found)
        no_residual = batched_emulation.no_residual
    else:
        layout, samples, no_residual = _serial(
            fn, args, kwargs, n, target, mode, seed, mca_mode, statistics, trace
        )
    labels = tuple(label for label, _ in layout)
    dtypes = [dtype for _, dtype in layout]
    mean = tuple(s.mean(dim=0) for s in samples)
    std = tuple(s.std(dim=0, correction=1) for s in samples)
    digits = tuple(
        estimated_digits(s, precision_of(formats, dtype), estimator, probability, confidence)
        for s, dtype in zip(samples, dtypes, strict=True)
    )
    sites = statistics.sites() if trace else ()
    return MCAResult(
        labels,
        samples,
        mean,
        std,
        digits,
        sites,
        formats,
        seed,
        mca_mode,
        estimator,
        float(probability),
        float(confidence),
        tuple(sorted(no_residual)),
    )


def _serial(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    n: int,
    target: FormatSpec | Mapping[torch.dtype, FormatSpec],
    mode: str,
    seed: int,
    mca_mode: str,
    statistics: SiteStatistics,
    trace: bool,
) -> tuple[list[tuple[str, torch.dtype]], tuple[Tensor, ...], set[str]]:
    """`mca`'s n runs one after another, run j's counter from ``j SAMPLE_STRIDE``: the
    outputs' (label, dtype), their ``(n, *shape)`` float64 samples, the ops without a
    residual."""
    emulation = Emulation(
        target,
        mode,
        seed=seed,
        observer=statistics.observe if trace else None,
        compute="float64",
        residuals=mode == "sr",
        round_inputs=mca_mode != "rr",
        round_outputs=mca_mode != "pb",
    )
    runs = []
    name = returner(fn)
    for run in range(n):
        statistics.start_run()
        emulation.calls = run * SAMPLE_STRIDE
        with emulation:
            result = fn(*args, **kwargs)
        # copies, made outside the emulation (not rounded), and now: a later run may
        # overwrite a tensor this one returned.  Not detached: as `arith.monte_carlo`'s, the
        # samples carry fn's gradient (straight through every rounding)
        runs.append(
            [
                (label, t.dtype, t.to(torch.float64, copy=True))
                for label, t in flat_outputs(result, returned_by=name)
            ]
        )
    layout = [(label, dtype, t.shape) for label, dtype, t in runs[0]]
    if any([(label, dtype, t.shape) for label, dtype, t in run] != layout for run in runs):
        raise RuntimeError(
            f"{name} returned results of different structures, dtypes or shapes in different "
            "runs; mca compares the runs output by output"
        )
    samples = tuple(torch.stack([run[i][2] for run in runs]) for i in range(len(layout)))
    return [(label, dtype) for label, dtype, _ in layout], samples, emulation.no_residual
