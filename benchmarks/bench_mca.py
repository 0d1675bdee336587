"""The time of `stochround.emulate.mca` (what ``stochround mca SCRIPT.py`` runs) on a float32
script of many small ops, against the script alone (issue 43: n = 32 samples within 10x
the script's own time on a GPU).

The script: a damped two-variable recurrence on float32 vectors of ``--width`` elements,
four ATen ops a step (``x * 0.999``, ``+ y``, ``0.001 * x``, ``y - ...``), ``--ops // 4``
steps, then ``x.sum()`` (``--ops`` 100000 by default: a 1e5-op script).  Rows (case
``mca_script``, shape ``<ops>x<width>``):

- ``plain``: the script as it is (the reference row).
- ``mca_batched``: ``mca(script, n=--samples, trace=True)`` (the command's call: the
  digits of each line too), the n samples together (`stochround.emulate.mca_batched`):
  each op once over all n samples, on their stacked values (no vmap for pointwise ops
  and sums: `stochround.emulate.mca_direct`); on CUDA each of the script's ops is one
  launch that computes it, its exact residual and its rounding for every sample
  (`stochround.kernels.sample_pair`).
- ``mca_batched_untraced``: the same without the trace (``trace=False``): the difference
  is the trace's own cost (each op's samples copied into a buffer of the device, their
  digits computed a buffer at a time: `stochround.emulate.mca_trace`).
- ``mca_serial``: the same with ``batched=False``, the runs one after another, timed for
  ``--serial-samples`` runs (default 2: a run of 1e5 emulated ops takes seconds).

Each MCA row's ``elements`` is its samples, so its time per element is a sample's.  The
summary after the table gives each MCA row's time for n samples (the serial row's scaled
from its runs: the runs are the same script) over the plain script's; the target is
``mca_batched`` <= 10x at n = 32 on the GPU.  Check: the batched run's samples 0 and
1 equal the serial run's bit for bit (run j draws the same words in both).  Timer: wall
clock a call (``--calls`` 1, median of ``--repeats``, 2 by default: each row also makes
one first call), the device synchronized.

``--host`` (no GPU; with ``--device cpu``): instead of the table, the batched run's
process time an op, traced and untraced, on the route a CUDA tensor takes: CPU tensors
inside `stochround.kernels.availability.cpu_as_cuda`, every `stochround.kernels.runtime.
Launch` returning at once, one torch thread; the best of ``--repeats``.  It is the host's
Python and dispatch work an op plus the CPU's arithmetic on the small tensors (a GPU's is
not the host's), no GPU figure.

    python benchmarks/bench_mca.py                                     # GPU
    python benchmarks/bench_mca.py --device cpu --ops 2000 --samples 8 --repeats 1
    python benchmarks/bench_mca.py --device cpu --host --ops 4000      # host time an op
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial

# harness before stochround: without a GPU it selects Triton's interpreter
import harness  # noqa: F401
import torch
from bench_ops import launches_stubbed
from harness import Benchmark, CheckFailed, Run

from stochround.emulate.mca import MCAResult, mca
from stochround.kernels.availability import cpu_as_cuda

CASE = "mca_script"
OPS_A_STEP = 4


def script(steps: int, width: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """The benchmark's program: its data made here (once, unrounded, as a script's
    top-level code), its ``steps`` steps of four float32 ops each in the function."""
    generator = torch.Generator().manual_seed(0)
    x0 = torch.rand(width, generator=generator).to(device)
    y0 = torch.rand(width, generator=generator).to(device)

    def main() -> torch.Tensor:
        x, y = x0, y0
        for _ in range(steps):
            x = x * 0.999 + y
            y = y - 0.001 * x
        return x.sum()

    return main


def row(kind: str, args: object, device: torch.device, found: dict[str, MCAResult]) -> Run:
    steps = args.ops // OPS_A_STEP  # type: ignore[attr-defined]
    width, n = args.width, args.samples  # type: ignore[attr-defined]
    main = script(steps, width, device)
    shape = f"{steps * OPS_A_STEP}x{width}"
    extra: dict[str, object] = {"shape": shape, "samples": n}
    if kind == "plain":
        return Run(main, elements=1, extra=extra)
    serial = kind == "mca_serial"
    runs = args.serial_samples if serial else n  # type: ignore[attr-defined]
    trace = kind != "mca_batched_untraced"

    def call() -> MCAResult:
        result = mca(main, n=runs, trace=trace, seed=0, batched=not serial)
        found[kind] = result
        return result

    def check(_: object) -> str:
        other = found.get("mca_batched" if serial else "mca_serial")
        if other is None:
            return "—"
        count = min(other.samples[0].shape[0], found[kind].samples[0].shape[0])
        if not torch.equal(other.samples[0][:count], found[kind].samples[0][:count]):
            raise CheckFailed("the batched and serial samples differ")
        return f"samples 0..{count - 1} == serial's"

    notes = f"{runs} serial runs timed; the summary scales them to n = {n}" if serial else ""
    return Run(call, check, elements=runs, notes=notes, extra=extra)


def main() -> int:
    bench = Benchmark("bench_mca", __doc__, timer="host", reference=f"{CASE}/plain")
    bench.parser.set_defaults(calls=1, repeats=2)
    add = bench.parser.add_argument
    add("--ops", type=int, default=100_000, help="ATen ops of the script (100000)")
    add("--width", type=int, default=64, help="elements of its vectors (64)")
    add("--samples", type=int, default=32, help="n, the MCA samples (32)")
    add("--serial-samples", type=int, default=2, help="serial runs timed, scaled to n (2)")
    add("--host", action="store_true", help="no GPU: host time an op, launches stubbed")
    args = bench.parse_args()
    if args.host:
        host_times(args)
        return 0
    found: dict[str, MCAResult] = {}
    build = partial(row, args=args, device=bench.device, found=found)
    bench.add(CASE, "plain", partial(build, "plain"), reference=True)
    bench.add(CASE, "mca_batched", partial(build, "mca_batched"), ours=True)
    bench.add(CASE, "mca_batched_untraced", partial(build, "mca_batched_untraced"), ours=True)
    bench.add(CASE, "mca_serial", partial(build, "mca_serial"), ours=True)
    status = bench.run()
    summary(args)
    return status


def host_times(args: object) -> None:
    """``--host``: the batched run's process time an op, traced and untraced, on the CPU's
    CUDA route with the launches stubbed (module docstring)."""
    if torch.cuda.is_available():
        raise SystemExit("--host measures the CUDA route on the CPU: run it where no GPU is")
    steps = args.ops // OPS_A_STEP  # type: ignore[attr-defined]
    ops = steps * OPS_A_STEP + 1
    main = script(steps, args.width, torch.device("cpu"))  # type: ignore[attr-defined]
    n = args.samples  # type: ignore[attr-defined]
    torch.set_num_threads(1)
    with cpu_as_cuda(cuda_only_ops=False), launches_stubbed():
        mca(main, n=n, trace=True, seed=0)  # the first call: prepared launches, caches
        for trace in (True, False):
            best = float("inf")
            for _ in range(args.repeats):  # type: ignore[attr-defined]
                start = time.process_time()
                mca(main, n=n, trace=trace, seed=0)
                best = min(best, time.process_time() - start)
            print(
                f"mca_batched trace={trace}: {best / ops * 1e6:.1f} us an op (host, CPU, CUDA "
                f"route, launches stubbed; {ops} ops x {args.width}, n = {n})"  # type: ignore[attr-defined]
            )


def summary(args: object) -> None:
    """Each MCA row's time for n samples (the serial row's scaled from its runs) over the
    plain script's, from the run's JSON log."""
    tag = args.tag  # type: ignore[attr-defined]
    path = args.out / f"bench_mca{'_' + tag if tag else ''}.json"  # type: ignore[attr-defined]
    rows = {r["provider"]: r for r in json.loads(path.read_text())["rows"]}
    plain = rows.get("plain", {}).get("median_us")
    n = args.samples  # type: ignore[attr-defined]
    for name in ("mca_batched", "mca_batched_untraced", "mca_serial"):
        entry = rows.get(name, {})
        if not plain or not entry.get("median_us"):
            continue
        total = entry["median_us"] * n / entry["elements"]
        ops = args.ops // OPS_A_STEP * OPS_A_STEP + 1  # type: ignore[attr-defined]  # + the sum
        print(
            f"{name}: n = {n} samples in {total / 1e6:.3g} s = {total / plain:.3g}x the script "
            f"({total / ops:.3g} us an op; the script {plain / ops:.3g} us an op)"
        )


if __name__ == "__main__":
    sys.exit(main())
