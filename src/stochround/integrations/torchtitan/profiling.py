"""torchtitan's own profiler over the last steps of a run (both releases), and where its
traces land.

torchtitan 0.2.2 (``[profiling]``) and 0.3.0 (``Trainer.Config.profiler``) run
``torch.profiler`` on the schedule ``wait = profile_freq - warmup - active``, ``warmup``,
``active``, stepped once after each training step, and write each rank's Chrome trace to
``DUMP/save_traces_folder/iteration_STEP/rankR_trace.json`` (0.3.0: ``.json.gz``) when the
active steps end.  `profile_schedule` makes that cycle the whole run: the profiler waits
through the first steps (start-up and compilation among them), warms up on one step and
records the last ``profile_steps``, so one trace per rank comes out, at the last step.
The recorded steps are slower than the others (the profiler's own cost): a run's median
tokens/s over many more steps is barely moved, a mean over few would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

# the traces' folder in the dump folder, one name under both releases (0.2.2's default)
TRACES_FOLDER = "profile_traces"
# steps the profiler runs before recording, so its start-up is not in the recorded steps
PROFILER_WARMUP = 1


class ProfileSchedule(NamedTuple):
    """torchtitan's profiler settings: ``profile_freq``, ``profiler_warmup``,
    ``profiler_active`` (module docstring)."""

    freq: int
    warmup: int
    active: int


def profile_schedule(steps: int, profile_steps: int) -> ProfileSchedule | None:
    """The schedule recording the last ``profile_steps`` of a run of ``steps`` (None for 0:
    no profiling); ValueError unless at least one step precedes the profiler's warm-up (the
    first step compiles and allocates: never one to record)."""
    if profile_steps == 0:
        return None
    most = steps - PROFILER_WARMUP - 1
    if not 0 < profile_steps <= most:
        raise ValueError(
            f"profile_steps must be 0 (off) or 1 to {most} (steps {steps} less the "
            f"profiler's warm-up step and the first step); got {profile_steps}"
        )
    return ProfileSchedule(freq=steps, warmup=PROFILER_WARMUP, active=profile_steps)


def trace_files(dump_folder: Path) -> list[Path]:
    """The Chrome traces torchtitan's profiler wrote under a run's dump folder, in rank
    order (0.2.2's ``.json``, 0.3.0's ``.json.gz``)."""
    found = (dump_folder / TRACES_FOLDER).glob("iteration_*/rank*_trace.json*")
    return sorted(found, key=trace_rank)


def trace_rank(path: Path) -> int:
    """The rank in a trace's file name, ``rankR_trace.json[.gz]``."""
    return int(path.name.split("_", 1)[0].removeprefix("rank"))


__all__ = [
    "PROFILER_WARMUP",
    "TRACES_FOLDER",
    "ProfileSchedule",
    "profile_schedule",
    "trace_files",
    "trace_rank",
]
