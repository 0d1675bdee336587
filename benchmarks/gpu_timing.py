"""Shared helpers of the benchmarks: medians of device time, bandwidth, versions, and the
few text and memory chores every benchmark script does.

On CUDA every timed call is bracketed by its own pair of CUDA events (as
``triton.testing.do_bench`` does; recorded on the current stream, fetched once), after a
first call (compilation, autotuning, module load) and a few warm-up calls that stay out of
the numbers; the median is reported.
On the CPU the same loop reads ``time.perf_counter`` around each (synchronous) call.

    timing = time_function(lambda: dst.copy_(src), device)
    timing.median_us, bandwidth_bytes_per_s(bytes_moved, timing.median_us)
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata

import torch


@dataclass
class Timing:
    """Per-call times of one function, in microseconds; ``first_call_s`` is wall time."""

    times_us: list[float]
    first_call_s: float
    warmup_calls: int
    method: str
    median_us: float = field(init=False)
    min_us: float = field(init=False)
    max_us: float = field(init=False)

    def __post_init__(self) -> None:
        self.median_us = statistics.median(self.times_us)
        self.min_us = min(self.times_us)
        self.max_us = max(self.times_us)

    @property
    def iterations(self) -> int:
        return len(self.times_us)

    def as_dict(self) -> dict:
        result = asdict(self)
        result["iterations"] = self.iterations
        return result


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_function(
    function: Callable[[], object],
    device: torch.device | str,
    *,
    min_iterations: int = 20,
    max_iterations: int = 200,
    budget_s: float = 0.25,
    warmup_s: float = 0.05,
    max_warmup_calls: int = 10,
) -> Timing:
    """Median-ready per-call times of ``function()`` on ``device``.

    The first call (compilation) is timed on the wall clock and reported apart; then
    warm-up calls (at least one, about ``warmup_s`` worth, at most ``max_warmup_calls``);
    then ``budget_s`` worth of timed calls, clamped to [min_iterations, max_iterations].
    """
    device = torch.device(device)
    started = time.perf_counter()
    function()
    synchronize(device)
    first_call_s = time.perf_counter() - started

    started = time.perf_counter()
    function()
    synchronize(device)
    estimate_s = max(time.perf_counter() - started, 1e-7)
    warmup_calls = 1 + max(0, min(max_warmup_calls - 1, math.ceil(warmup_s / estimate_s) - 1))
    if warmup_calls > 1:
        started = time.perf_counter()
        for _ in range(warmup_calls - 1):
            function()
        synchronize(device)
        estimate_s = max((time.perf_counter() - started) / (warmup_calls - 1), 1e-7)
    iterations = max(min_iterations, min(max_iterations, math.ceil(budget_s / estimate_s)))

    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        # recorded on the stream fetched once: `Event.record()` without one builds the
        # current stream's object anew (5-6 us of host time on an H100 host), which the
        # end event would charge to a call that synchronizes (the device idles meanwhile)
        stream = torch.cuda.current_stream(device)
        for start, end in zip(starts, ends, strict=True):
            start.record(stream)
            function()
            end.record(stream)
        torch.cuda.synchronize(device)
        times_us = [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends, strict=True)]
        method = "CUDA events around each call"
    else:
        times_us = []
        for _ in range(iterations):
            started = time.perf_counter()
            function()
            synchronize(device)
            times_us.append((time.perf_counter() - started) * 1e6)
        method = "time.perf_counter around each call"
    return Timing(times_us, first_call_s, warmup_calls, method)


def bandwidth_bytes_per_s(bytes_moved: float, time_us: float) -> float:
    """Effective bandwidth: bytes read plus bytes written, over the time."""
    return bytes_moved / (time_us * 1e-6)


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def triton_version() -> str:
    try:
        import triton
    except ImportError as error:
        return f"not importable ({error})"
    return triton.__version__


def device_description(device: torch.device | str) -> dict[str, str]:
    """What ran the benchmark: device name and properties, host, torch/CUDA/Triton versions."""
    device = torch.device(device)
    info = {
        "device": str(device),
        "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info.update(
            gpu=properties.name,
            gpu_memory_gib=f"{properties.total_memory / 2**30:.1f}",
            multiprocessors=str(properties.multi_processor_count),
            capability=f"{properties.major}.{properties.minor}",
            cuda=str(torch.version.cuda),
        )
    else:
        info.update(
            cpu=platform.processor() or platform.machine(), threads=str(torch.get_num_threads())
        )
    return info


__all__ = [
    "Timing",
    "bandwidth_bytes_per_s",
    "device_description",
    "package_version",
    "synchronize",
    "time_function",
    "triton_version",
]


def reason(error: BaseException) -> str:
    """An exception as one line of at most 300 characters, for a table's status column."""
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def free(device: torch.device) -> None:
    """Let the caching allocator give back what the last row held (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def shorten(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters (with "..."), or whole when limit is None."""
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
