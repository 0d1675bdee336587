"""Optimizer steps on the GPU: stochround's SR optimizers against their peers, in one run.

Parameters are drawn as 0.02 * randn and gradients as randn (float32 draws from one seeded
generator, then cast to the row's parameter dtype; gradients are filled once, never zero),
so every row starts from the same values; each row allocates its own and frees them.
Rows (``--only`` picks some by key):

- device copy of 2**copy_log2n fp32 values, measured first and again last (noise);
- AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01) over ``count`` parameters
  of ``dim x dim`` (default 16 x 4096**2 = 268M): stochround ``AdamW(bf16 params,
  state_dtype=bf16, rounding="sr", seed=0)`` (the headline row) and ``rounding="rne"``;
  ``torch.optim.AdamW(fused=True)`` on fp32 and on bf16 parameters; torchao
  ``_AdamW(bf16 params, bf16_stochastic_round=True)``; HeavyBall ``AdamW(bf16 params,
  storage_dtype="bfloat16")``;
- SGD (momentum 0.9) and Lion on the same bf16 parameters: stochround with bf16 states and
  SR, and ``torch.optim.SGD(momentum=0.9, fused=True)`` on bf16 as a reference;
- many small parameters, ``small_count`` tensors of ``small_numel`` bf16 values (default
  1000 x 65536): stochround AdamW SR against torch fused AdamW bf16 (the launch overhead),
  and both again with the step captured in a CUDA graph and replayed (CUDA only; torch's
  with ``capturable=True``), which leaves the GPU's time without the host's.

Checks before timing: after the first step every parameter is finite and the first one
changed; stochround's rows also step a copy of the first parameter twice, with seeds 0 and
1: under "sr" the stored parameter and each state must differ between the seeds (SR really
happened), under "rne" they must be equal.  Peers are checked for finite and changed.

Times are medians of ``optimizer.step()`` over >= 20 steps (CUDA events around each step,
:func:`gpu_timing.time_function`) after the first step (compilation, state allocation)
and warm-up steps; steps keep changing the parameters.  B/param counts what the step moves
as the implementation stores things: parameter read and written, gradient read, each state
(every state tensor of more than one element, found in ``optimizer.state``) read and
written.  TB/s = B/param x parameters / median.  The floor of a step is its minimal bytes
(AdamW 14 B/param: read p, g, m, v, write p, m, v in bf16; SGD-momentum and Lion 10 B/param)
at the copy bandwidth (bytes read + written; the faster of the two copy measurements);
"x floor" = median / floor.  "stochround speed-up" = this row's median / the median of the
stochround row it is compared with.  "states B/param": the bytes of those state tensors per
parameter.  "peak B/param" (CUDA only): ``max_memory_allocated`` while creating the
optimizer and taking its first step, above ``memory_allocated`` before (parameters and
gradients), per parameter: states plus temporaries plus a peer's compilation; the JSON
also has what stays allocated after ("kept_bytes_per_param").  A peer that is not installed
prints "not installed" and is skipped; torchao and HeavyBall (compiled peers) are skipped
on the CPU.  ``--quick`` (smoke test): 4 x 256**2 and 10 x 4096 parameters, a 2**20 copy,
3 timed steps after 1 warm-up.

    python benchmarks/bench_optim.py --out DIR                    # on the GPU
    python benchmarks/bench_optim.py --device cpu --quick --out DIR   # smoke test, tiny sizes

Exit status: 1 if a stochround row failed its check (or raised before passing it), else 0
(missed targets are reported, not fatal).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import operator
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from gpu_timing import (
    Timing,
    bandwidth_bytes_per_s,
    device_description,
    free,
    package_version,
    reason,
    shorten,
    synchronize,
    time_function,
)
from rich.console import Console
from rich.table import Table
from torch import Tensor

import stochround
from stochround.experiments.report import markdown_table

PEERS = ("torchao", "heavyball", "rich")
PARAM_SCALE = 0.02
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
MOMENTUM = 0.9
LION_LR = 1e-4
ADAMW_FLOOR = 14.0  # read p, g, m, v (8 B) + write p, m, v (6 B), all bf16
SGD_FLOOR = 10.0  # read p, g, b + write p, b
LION_FLOOR = 10.0  # read p, g, m + write p, m
HEADLINE = "ours_adamw_sr"
DASH = "—"

Make = Callable[[list[Tensor], int], torch.optim.Optimizer]  # (params, seed) -> optimizer


@dataclass(frozen=True)
class Params:
    """``count`` tensors of ``shape`` in ``dtype``."""

    count: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return self.count * math.prod(self.shape)

    def describe(self) -> str:
        return f"{self.count}x" + "x".join(str(size) for size in self.shape)


@dataclass
class Case:
    key: str
    label: str
    step: str  # the update the floor is for: "AdamW", "SGD-momentum", "Lion"
    params: Params
    make: Make
    floor_bytes: float
    ours: bool = False
    rounding: str | None = None  # stochround rows: "sr" or "rne" (the seed check)
    compare: str | None = None  # the stochround row whose speed-up over this one is shown
    package: str | None = None  # a peer's package: missing -> "not installed"
    cuda_only: bool = False
    note: str = ""


@dataclass
class Result:
    key: str
    label: str
    size: str
    numel: int
    ours: bool
    step: str | None = None
    floor_bytes: float | None = None
    compare: str | None = None
    status: str = "ok"
    stage: str = "setup"  # how far the row got (for a failure's message)
    notes: list[str] = field(default_factory=list)
    check: str = DASH
    check_ok: bool | None = None
    setup_s: float | None = None
    first_step_s: float | None = None
    timing: Timing | None = None
    bytes_per_param: float | None = None  # moved by one step
    state_bytes_per_param: float | None = None  # as stored in optimizer.state
    kept_bytes_per_param: float | None = None  # memory_allocated after - before
    peak_bytes_per_param: float | None = None  # max_memory_allocated - before
    bandwidth: float | None = None
    floor_us: float | None = None
    floor_ratio: float | None = None
    speedup: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.timing is not None


# --------------------------------------------------------------------------------------
# parameters, states and checks
# --------------------------------------------------------------------------------------


def make_params(spec: Params, device: torch.device) -> list[Tensor]:
    """``spec.count`` leaf tensors 0.02 randn with randn gradients, the same for every row."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for _ in range(spec.count):
        draw = torch.randn(spec.shape, generator=generator, device=device)
        param = draw.mul_(PARAM_SCALE).to(spec.dtype)
        param.grad = torch.randn(spec.shape, generator=generator, device=device).to(spec.dtype)
        params.append(param)
    return params


def walk_tensors(value: object) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from walk_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from walk_tensors(item)


def state_tensors(optimizer: torch.optim.Optimizer, param: Tensor) -> list[Tensor]:
    """The state tensors of ``param`` with more than one element (not step counters)."""
    found, seen = [], set()
    for tensor in walk_tensors(optimizer.state.get(param, {})):
        identity = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if tensor.numel() > 1 and identity not in seen:
            seen.add(identity)
            found.append(tensor)
    return found


def moved_bytes_per_param(optimizer: torch.optim.Optimizer, params: list[Tensor]) -> float:
    """Bytes one step moves per parameter: p read + written, g read, each state read + written."""
    total = 0
    for param in params:
        states = sum(t.numel() * t.element_size() for t in state_tensors(optimizer, param))
        total += param.numel() * (2 * param.element_size() + param.grad.element_size())
        total += 2 * states
    return total / sum(p.numel() for p in params)


def stored_state_bytes_per_param(optimizer: torch.optim.Optimizer, params: list[Tensor]) -> float:
    total = sum(t.numel() * t.element_size() for p in params for t in state_tensors(optimizer, p))
    return total / sum(p.numel() for p in params)


def differing_fraction(a: Tensor, b: Tensor) -> float:
    """The fraction of elements whose stored bits differ."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return float((a.view(width) != b.view(width)).float().mean())


def seed_check(case: Case, params: list[Tensor]) -> tuple[bool, str]:
    """Two steps on a copy of the first parameter with seeds 0 and 1; compare what is stored.

    (Two: SGD's first step stores the bf16 gradient as its buffer, exactly.)"""
    stored = []
    for seed in (0, 1):
        copy = params[0].detach().clone()
        copy.grad = params[0].grad.clone()
        optimizer = case.make([copy], seed)
        optimizer.step()
        optimizer.step()
        stored.append([copy, *state_tensors(optimizer, copy)])
    fractions = [differing_fraction(a, b) for a, b in zip(*stored, strict=True)]
    text = "/".join(f"{100 * f:.0f}%" for f in fractions)
    if case.rounding == "sr":
        return all(f > 0 for f in fractions), f"seeds 0/1 differ on p/states {text}"
    return all(f == 0 for f in fractions), f"seeds 0/1 {'agree' if max(fractions) == 0 else text}"


def step_check(params: list[Tensor], before: Tensor) -> tuple[bool, str]:
    """After a step: every parameter finite, and the first one changed."""
    finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
    changed = differing_fraction(params[0], before)
    ok = finite and changed > 0
    return ok, f"{'finite' if finite else 'NOT FINITE'}, p0 {100 * changed:.1f}% changed"


# --------------------------------------------------------------------------------------
# the rows
# --------------------------------------------------------------------------------------


def ours_adamw(rounding: str) -> Make:
    def make(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
        return stochround.optim.AdamW(
            params,
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WEIGHT_DECAY,
            state_dtype=torch.bfloat16,
            rounding=rounding,
            seed=seed,
        )

    return make


def ours_sgd(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return stochround.optim.SGD(
        params, lr=LR, momentum=MOMENTUM, state_dtype=torch.bfloat16, rounding="sr", seed=seed
    )


def ours_lion(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return stochround.optim.Lion(
        params, lr=LION_LR, state_dtype=torch.bfloat16, rounding="sr", seed=seed
    )


def torch_adamw(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True
    )


def torch_sgd(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, fused=True)


def torchao_adamw(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    from torchao.optim import _AdamW

    return _AdamW(
        params,
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=WEIGHT_DECAY,
        bf16_stochastic_round=True,
    )


def heavyball_adamw(compile_step: bool) -> Make:
    def make(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
        import heavyball
        import heavyball.utils

        if not compile_step:
            heavyball.utils.compile_mode = None
        return heavyball.AdamW(
            params,
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WEIGHT_DECAY,
            storage_dtype="bfloat16",
            consume_grad=False,
        )

    return make


class CapturedStep:
    """An optimizer whose ``step()`` replays a CUDA graph of the wrapped one's step, captured
    after two eager warm-up steps on a side stream (states and tables then exist)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.state = optimizer.state
        self.param_groups = optimizer.param_groups
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            optimizer.step()

    def step(self) -> None:
        self.graph.replay()


def captured(make: Make) -> Make:
    def make_captured(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
        return CapturedStep(make(params, seed))  # type: ignore[return-value]

    return make_captured


def torch_adamw_capturable(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True,
        capturable=True,
    )  # fmt: skip


def cases(big: Params, small: Params, compile_peers: bool, device: torch.device) -> list[Case]:
    bf16 = Params(big.count, big.shape, torch.bfloat16)
    fp32 = Params(big.count, big.shape, torch.float32)
    heavyball_note = "consume_grad=False; " + (
        "compiled by heavyball" if compile_peers else "eager (--no-compile)"
    )
    sgd_note = "torch <= 2.13 on CPU: no update for bf16 (pytorch#191763)"
    return [
        Case(
            HEADLINE,
            "stochround AdamW bf16, bf16 states, SR",
            "AdamW",
            bf16,
            ours_adamw("sr"),
            ADAMW_FLOOR,
            ours=True,
            rounding="sr",
        ),
        Case(
            "ours_adamw_rne",
            "stochround AdamW bf16, bf16 states, rne",
            "AdamW",
            bf16,
            ours_adamw("rne"),
            ADAMW_FLOOR,
            ours=True,
            rounding="rne",
        ),
        Case(
            "torch_adamw_fp32",
            "torch AdamW fused, fp32 params + states",
            "AdamW",
            fp32,
            torch_adamw,
            ADAMW_FLOOR,
            compare=HEADLINE,
        ),
        Case(
            "torch_adamw_bf16",
            "torch AdamW fused, bf16 params + states (no SR)",
            "AdamW",
            bf16,
            torch_adamw,
            ADAMW_FLOOR,
            compare=HEADLINE,
        ),
        Case(
            "torchao_adamw",
            "torchao _AdamW(bf16_stochastic_round=True)",
            "AdamW",
            bf16,
            torchao_adamw,
            ADAMW_FLOOR,
            compare=HEADLINE,
            package="torchao",
            cuda_only=True,
            note="SR on p only, states rne; one compiled call per parameter (CPU-bound)",
        ),
        Case(
            "heavyball_adamw",
            'HeavyBall AdamW(storage_dtype="bfloat16")',
            "AdamW",
            bf16,
            heavyball_adamw(compile_peers),
            ADAMW_FLOOR,
            compare=HEADLINE,
            package="heavyball",
            cuda_only=True,
            note=heavyball_note,
        ),
        Case(
            "ours_sgd_sr",
            "stochround SGD momentum 0.9, bf16, SR",
            "SGD-momentum",
            bf16,
            ours_sgd,
            SGD_FLOOR,
            ours=True,
            rounding="sr",
        ),
        Case(
            "torch_sgd_bf16",
            "torch SGD momentum 0.9 fused, bf16 (no SR)",
            "SGD-momentum",
            bf16,
            torch_sgd,
            SGD_FLOOR,
            compare="ours_sgd_sr",
            note=sgd_note if device.type == "cpu" else "",
        ),
        Case(
            "ours_lion_sr",
            "stochround Lion bf16, bf16 state, SR",
            "Lion",
            bf16,
            ours_lion,
            LION_FLOOR,
            ours=True,
            rounding="sr",
        ),
        Case(
            "ours_adamw_sr_small",
            "stochround AdamW bf16 SR, many small tensors",
            "AdamW",
            small,
            ours_adamw("sr"),
            ADAMW_FLOOR,
            ours=True,
            rounding="sr",
        ),
        Case(
            "torch_adamw_bf16_small",
            "torch AdamW fused bf16, many small tensors",
            "AdamW",
            small,
            torch_adamw,
            ADAMW_FLOOR,
            compare="ours_adamw_sr_small",
        ),
        Case(
            "ours_adamw_sr_small_graph",
            "stochround AdamW bf16 SR, many small tensors, CUDA graph",
            "AdamW",
            small,
            captured(ours_adamw("sr")),
            ADAMW_FLOOR,
            ours=True,
            rounding="sr",
            cuda_only=True,
        ),
        Case(
            "torch_adamw_bf16_small_graph",
            "torch AdamW fused bf16 capturable, many small tensors, CUDA graph",
            "AdamW",
            small,
            captured(torch_adamw_capturable),
            ADAMW_FLOOR,
            compare="ours_adamw_sr_small_graph",
            cuda_only=True,
        ),
    ]


# --------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------


def skip_reason(case: Case, device: torch.device) -> str | None:
    if case.package is not None and importlib.util.find_spec(case.package) is None:
        return "not installed"
    if case.cuda_only and device.type != "cuda":
        return "skipped: needs CUDA (a compiled peer or a CUDA graph)"
    return None


def first_step(
    case: Case, params: list[Tensor], result: Result, device: torch.device
) -> torch.optim.Optimizer:
    """Create the optimizer and take its first step, measuring time and memory around them."""
    numel = sum(p.numel() for p in params)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    optimizer = case.make(params, 0)
    optimizer.step()
    synchronize(device)
    result.first_step_s = time.perf_counter() - started
    if device.type == "cuda":
        result.peak_bytes_per_param = (torch.cuda.max_memory_allocated(device) - before) / numel
        result.kept_bytes_per_param = (torch.cuda.memory_allocated(device) - before) / numel
    return optimizer


def measure(case: Case, result: Result, device: torch.device, timing_options: dict) -> None:
    """Fill ``result``: parameters, checks, first step, bytes moved and stored, timing."""
    started = time.perf_counter()
    params = make_params(case.params, device)
    synchronize(device)
    result.setup_s = time.perf_counter() - started
    checks, ok = [], True
    if case.rounding is not None:
        result.stage = "seed check"
        ok, text = seed_check(case, params)
        checks.append(text)
    before = params[0].clone()
    result.stage = "first step"
    optimizer = first_step(case, params, result, device)
    result.stage = "check"
    step_ok, text = step_check(params, before)
    del before
    result.check_ok = ok and step_ok
    result.check = ("ok " if result.check_ok else "BAD ") + "; ".join([text, *checks])
    result.bytes_per_param = moved_bytes_per_param(optimizer, params)
    result.state_bytes_per_param = stored_state_bytes_per_param(optimizer, params)
    result.stage = "timing"
    result.timing = time_function(optimizer.step, device, **timing_options)


def run_case(case: Case, device: torch.device, timing_options: dict) -> Result:
    spec = case.params
    result = Result(case.key, case.label, spec.describe(), spec.numel, case.ours)
    result.step, result.floor_bytes, result.compare = case.step, case.floor_bytes, case.compare
    if case.note:
        result.notes.append(case.note)
    skipped = skip_reason(case, device)
    if skipped is not None:
        result.status = skipped
        return result
    try:
        measure(case, result, device, timing_options)
    except Exception as error:  # one failing row must not end the run
        if isinstance(error, ImportError) and case.package is not None:
            result.status = f"not installed ({reason(error)})"
            return result
        result.status = f"failed: {reason(error)} (during {result.stage})"
        result.notes.append(traceback.format_exc(limit=4))
        if case.ours and result.check_ok is None:
            result.check_ok, result.check = False, f"BAD: raised during {result.stage}"
    finally:
        free(device)
    return result


def run_copy(key: str, elements: int, device: torch.device, timing_options: dict) -> Result:
    """Device copy of ``elements`` fp32 values: 8 bytes moved per element."""
    label = "device copy fp32" + (" again (noise)" if key == "copy_repeat" else "")
    size = f"2^{elements.bit_length() - 1}"
    result = Result(key, label, size, elements, ours=False, notes=["dst.copy_(src)"])
    try:
        source = torch.randn(elements, device=device)
        destination = torch.empty_like(source)
        result.timing = time_function(lambda: destination.copy_(source), device, **timing_options)
        result.bytes_per_param = 8.0
        result.check = "exact" if torch.equal(destination, source) else "BAD copy differs"
    except Exception as error:
        result.status = f"failed: {reason(error)}"
    finally:
        free(device)
    return result


def copy_bandwidth(results: dict[str, Result]) -> float | None:
    """The faster of the two copy measurements, bytes per second."""
    found = [
        bandwidth_bytes_per_s(r.numel * r.bytes_per_param, r.timing.median_us)
        for r in (results.get("copy"), results.get("copy_repeat"))
        if r is not None and r.ok
    ]
    return max(found) if found else None


def fill_comparisons(results: dict[str, Result]) -> float | None:
    bandwidth = copy_bandwidth(results)
    for result in results.values():
        if not result.ok:
            continue
        result.bandwidth = bandwidth_bytes_per_s(
            result.numel * result.bytes_per_param, result.timing.median_us
        )
        if bandwidth and result.floor_bytes:
            result.floor_us = result.numel * result.floor_bytes / bandwidth * 1e6
            result.floor_ratio = result.timing.median_us / result.floor_us
        mine = results.get(result.compare) if result.compare else None
        if mine is not None and mine.ok:
            result.speedup = result.timing.median_us / mine.timing.median_us
    return bandwidth


# --------------------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    verdict: str  # PASS, FAIL or N/A
    detail: str


TARGETS = (
    # name, peer row (None: the headline row's x floor, else the headline's speed-up over it)
    ("AdamW SR <= 1.15x the 14 B/param floor", None, "<=", 1.15),
    ("AdamW SR >= 2x faster than torch fused fp32", "torch_adamw_fp32", ">=", 2.0),
    ("AdamW SR faster than torch fused bf16 (no SR)", "torch_adamw_bf16", ">", 1.0),
    ("AdamW SR >= 4x torchao _AdamW", "torchao_adamw", ">=", 4.0),
    ("AdamW SR >= 2.5x HeavyBall AdamW", "heavyball_adamw", ">=", 2.5),
)
COMPARE = {"<=": operator.le, ">=": operator.ge, ">": operator.gt}


def target(
    results: dict[str, Result], name: str, peer: str | None, relation: str, threshold: float
) -> Target:
    """Judge the headline row's x floor (``peer`` None) or its speed-up over ``peer``."""
    mine = results.get(HEADLINE)
    if mine is None:
        return Target(name, "N/A", f"row {HEADLINE} not run (--only)")
    if not mine.ok:
        return Target(name, "FAIL", f"not measured: {shorten(mine.status, 100)}")
    if mine.check_ok is False:
        return Target(name, "FAIL", f"check failed: {shorten(mine.check, 100)}")
    row = mine if peer is None else results.get(peer)
    if row is None:
        return Target(name, "N/A", f"row {peer} not run (--only)")
    if not row.ok:
        return Target(name, "N/A", f"{row.key}: {shorten(row.status, 100)}")
    value = row.floor_ratio if peer is None else row.speedup
    if value is None:
        return Target(name, "N/A", "copy not measured" if peer is None else "no comparison")
    verdict = "PASS" if COMPARE[relation](value, threshold) else "FAIL"
    return Target(name, verdict, f"{value:.3g}x (need {relation} {threshold:g}x)")


def targets(results: dict[str, Result]) -> list[Target]:
    return [target(results, *spec) for spec in TARGETS]


# --------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------

HEADERS = (
    "#",
    "implementation",
    "params",
    "median ms",
    "B/param",
    "TB/s",
    "x floor",
    "stochround speed-up",
    "states B/param",
    "peak B/param",
    "check",
    "status / notes",
)
NUMERIC = {"#", "median ms", "B/param", "TB/s", "x floor", "stochround speed-up"}
NUMERIC |= {"states B/param", "peak B/param"}


def number(value: float | None, pattern: str) -> str:
    return DASH if value is None else format(value, pattern)


def table_row(index: int, result: Result, limit: int | None) -> list[str]:
    if result.ok:
        notes = "; ".join(note for note in result.notes if "\n" not in note)
        median_ms = f"{result.timing.median_us / 1e3:.3f}"
    else:
        notes, median_ms = result.status, DASH
    return [
        str(index),
        ("* " if result.ours else "") + result.label,
        result.size,
        median_ms,
        number(result.bytes_per_param, ".3g"),
        number(result.bandwidth and result.bandwidth / 1e12, ".3f"),
        number(result.floor_ratio, ".2f"),
        number(result.speedup, ".3g") + ("x" if result.speedup is not None else ""),
        number(result.state_bytes_per_param, ".2f"),
        number(result.peak_bytes_per_param, ".2f"),
        result.check,
        shorten(notes, limit),
    ]


def floor_rows(results: list[Result], bandwidth: float | None) -> list[list[str]]:
    """One row per distinct (step, size): its floor bytes and time at the copy bandwidth."""
    rows, seen = [], set()
    for result in results:
        if result.floor_bytes is None or result.floor_us is None:
            continue
        key = (result.step, result.size)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            [result.step, result.size, f"{result.floor_bytes:g}", f"{result.floor_us / 1e3:.3f}"]
        )
    rows.append(["(copy bandwidth used)", "", "", number(bandwidth and bandwidth / 1e12, ".3f")])
    return rows


def rich_table(
    title: str, headers: tuple[str, ...], rows: list[list[str]], styles: dict[str, str]
) -> Table:
    table = Table(title=title)
    for header in headers:
        table.add_column(
            header,
            justify="right" if header in NUMERIC else "left",
            overflow="fold",
            max_width={"status / notes": 44, "check": 40, "implementation": 40}.get(header),
        )
    for row in rows:
        table.add_row(*row, style=styles.get(row[1]))
    return table


def print_tables(title: str, rows: list, floors: list, target_rows: list) -> None:
    console = Console(width=None if sys.stdout.isatty() else 220, highlight=False)
    console.print(rich_table(title, HEADERS, rows, {}), markup=False)
    floor_headers = ("step", "params", "floor B/param", "floor ms (TB/s for copy)")
    console.print(rich_table("floors at the copy bandwidth", floor_headers, floors, {}))
    styles = {"PASS": "green", "FAIL": "red", "N/A": "yellow"}
    console.print(rich_table("targets", ("target", "verdict", "detail"), target_rows, styles))


def result_dict(result: Result) -> dict:
    return {
        "key": result.key,
        "label": result.label,
        "ours": result.ours,
        "params": result.size,
        "numel": result.numel,
        "status": result.status,
        "check": result.check,
        "check_ok": result.check_ok,
        "notes": result.notes,
        "setup_s": result.setup_s,
        "first_step_s": result.first_step_s,
        "timing": result.timing.as_dict() if result.timing is not None else None,
        "median_us": result.timing.median_us if result.ok else None,
        "bytes_per_param": result.bytes_per_param,
        "bandwidth_tb_s": result.bandwidth / 1e12 if result.bandwidth else None,
        "floor_bytes_per_param": result.floor_bytes,
        "floor_us": result.floor_us,
        "floor_ratio": result.floor_ratio,
        "compared_with": result.compare,
        "stochround_speedup": result.speedup,
        "state_bytes_per_param": result.state_bytes_per_param,
        "kept_bytes_per_param": result.kept_bytes_per_param,
        "peak_bytes_per_param": result.peak_bytes_per_param,
    }


def write_outputs(out: Path, info: dict, title: str, tables: dict, payload: dict) -> None:
    floor_headers = ["step", "params", "floor B/param", "floor ms (TB/s for copy)"]
    markdown = [
        f"# bench_optim\n\n`{' '.join(sys.argv)}`\n",
        "\n".join(f"- {name}: {value}" for name, value in info.items()) + "\n",
        markdown_table(f"## {title}", list(HEADERS), tables["rows"], []),
        markdown_table("## floors at the copy bandwidth", floor_headers, tables["floors"], []),
        markdown_table("## targets", ["target", "verdict", "detail"], tables["targets"], []),
    ]
    (out / "bench_optim.md").write_text("\n".join(markdown))
    (out / "bench_optim.json").write_text(json.dumps(payload, indent=1))
    print(f"wrote {out / 'bench_optim.md'} and {out / 'bench_optim.json'}")


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write bench_optim.{md,json} here")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    parser.add_argument("--count", type=int, default=None, help="large tensors (16; quick 4)")
    parser.add_argument("--dim", type=int, default=None, help="their size dim x dim (4096; 256)")
    parser.add_argument("--small-count", type=int, default=None, help="small tensors (1000; 10)")
    parser.add_argument("--small-numel", type=int, default=None, help="their size (65536; 4096)")
    parser.add_argument("--copy-log2n", type=int, default=None, help="copy 2**this (28; 20)")
    parser.add_argument("--min-iterations", type=int, default=20)
    parser.add_argument(
        "--budget", type=float, default=0.5, help="seconds of timed steps per row (default 0.5)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: tiny sizes, 3 timed steps, 1 warm-up"
    )
    parser.add_argument("--no-compile", action="store_true", help="run HeavyBall eagerly")
    parser.add_argument("--only", default=None, help="comma-separated row keys (default: all)")
    args = parser.parse_args(argv)
    defaults = (4, 256, 10, 4096, 20) if args.quick else (16, 4096, 1000, 65536, 28)
    names = ("count", "dim", "small_count", "small_numel", "copy_log2n")
    for name, default in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def timing_options(args: argparse.Namespace) -> dict:
    if args.quick:
        return dict(
            min_iterations=3, max_iterations=3, budget_s=0.0, warmup_s=0.0, max_warmup_calls=1
        )
    return dict(min_iterations=args.min_iterations, budget_s=args.budget)


def describe_run(device: torch.device) -> dict[str, str]:
    info = device_description(device)
    info["stochround"] = f"{stochround.__version__} ({Path(stochround.__file__).parent})"
    for peer in PEERS:
        info[peer] = package_version(peer)
    print("bench_optim:", " ".join(sys.argv), flush=True)
    for name, value in info.items():
        print(f"  {name}: {value}", flush=True)
    return info


def progress(result: Result) -> None:
    if result.ok:
        first = f", first step {result.first_step_s:.2f} s" if result.first_step_s else ""
        print(
            f"{result.timing.median_us / 1e3:.3f} ms median of {result.timing.iterations}"
            f"{first}; check {result.check}",
            flush=True,
        )
    else:
        print(result.status, flush=True)
        if result.notes and "\n" in result.notes[-1]:
            print(result.notes[-1], flush=True)


def select(all_cases: list[Case], only: str | None) -> list[Case] | None:
    if not only:
        return all_cases
    wanted = set(only.split(","))
    unknown = wanted - {case.key for case in all_cases}
    if unknown:
        print(f"unknown row keys: {sorted(unknown)}", file=sys.stderr)
        return None
    return [case for case in all_cases if case.key in wanted]


def run_all(
    args: argparse.Namespace, selected: list[Case], device: torch.device, options: dict
) -> list[Result]:
    """The copy, every selected row, the copy again."""
    total = len(selected) + 2
    print(f"[1/{total}] copy ...", end=" ", flush=True)
    results = [run_copy("copy", 2**args.copy_log2n, device, options)]
    progress(results[-1])
    for number_, case in enumerate(selected, 2):
        print(f"[{number_}/{total}] {case.key}: {case.label} ...", end=" ", flush=True)
        results.append(run_case(case, device, options))
        progress(results[-1])
    print(f"[{total}/{total}] copy_repeat ...", end=" ", flush=True)
    results.append(run_copy("copy_repeat", 2**args.copy_log2n, device, options))
    progress(results[-1])
    return results


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: pass --device cpu for the smoke test", file=sys.stderr)
        return 2
    big = Params(args.count, (args.dim, args.dim), torch.bfloat16)
    small = Params(args.small_count, (args.small_numel,), torch.bfloat16)
    selected = select(cases(big, small, not args.no_compile, device), args.only)
    if selected is None:
        return 2
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    info = describe_run(device)
    options = timing_options(args)
    results = run_all(args, selected, device, options)
    by_key = {result.key: result for result in results}
    bandwidth = fill_comparisons(by_key)
    found_targets = targets(by_key)
    elapsed = time.perf_counter() - started

    first, last = by_key["copy"], by_key["copy_repeat"]
    if first.ok and last.ok:
        a, b = first.timing.median_us, last.timing.median_us
        print(f"copy measured twice: {a:.1f} and {b:.1f} us ({100 * abs(b - a) / a:.1f}% apart)")
    where = info.get("gpu", info.get("cpu", str(device)))
    title = (
        f"optimizer steps, {where}, torch {torch.__version__}; median of "
        f">= {options['min_iterations']} steps; * = stochround; total {elapsed:.0f} s"
    )
    tables = {
        "rows": [table_row(i, r, None) for i, r in enumerate(results, 1)],
        "floors": floor_rows(results, bandwidth),
        "targets": [[t.name, t.verdict, t.detail] for t in found_targets],
    }
    if args.out is not None:
        payload = {
            "argv": sys.argv,
            "info": info,
            "elapsed_s": elapsed,
            "copy_bandwidth_tb_s": bandwidth / 1e12 if bandwidth else None,
            "timing_method": next((r.timing.method for r in results if r.timing), None),
            "rows": [result_dict(r) for r in results],
            "targets": [t.__dict__ for t in found_targets],
        }
        write_outputs(args.out, info, title, tables, payload)
    short_rows = [table_row(i, r, 80) for i, r in enumerate(results, 1)]
    print_tables(title, short_rows, tables["floors"], tables["targets"])
    bad = [r.key for r in results if r.ours and r.check_ok is False]
    if bad:
        print(f"stochround rows that failed their check: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
