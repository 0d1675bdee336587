"""SR to e4m3fn on the CPU: stochround's PyTorch path beside gfloat's ``round_ndarray``.

Both round the same 2**log2n fp32 values drawn from normal(0, 100) (some beyond e4m3fn's
448, which both turn into NaN) with 8 random bits, variant c (P3109's StochasticC, gfloat's
``RoundMode.Stochastic``), taking the same explicit random integers in [0, 256). Checks:
stochround's output rounds x (`harness.rounding_check`); gfloat's equals stochround's bit
for bit (NaN equal to NaN). Times: the median of ``--repeats`` runs after a warm-up run.

    python benchmarks/bench_cpu.py [--log2n 24] [--threads N]
    python benchmarks/bench_cpu.py --log2n 12 --repeats 2          # smoke test
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from harness import Benchmark, CheckFailed, Run, rounding_check
from torch import Tensor

import stochround

RBITS = 8


def main() -> int:
    bench = Benchmark("bench_cpu", __doc__)
    bench.parser.set_defaults(device="cpu")
    bench.parser.add_argument("--log2n", type=int, default=24, help="elements 2**log2n (24)")
    bench.parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = bench.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    generator = np.random.default_rng(0)
    values = generator.normal(0.0, 100.0, size=2**args.log2n).astype(np.float32)
    rand = generator.integers(0, 2**RBITS, size=values.size, dtype=np.uint8)
    x, rand_tensor = torch.from_numpy(values), torch.from_numpy(rand)

    def ours() -> Tensor:
        return stochround.round(x, "e4m3fn", "sr", rbits=RBITS, variant="c", rand=rand_tensor)

    def gfloat() -> Run:
        from gfloat import RoundMode, round_ndarray
        from gfloat.formats import format_info_ocp_e4m3

        expected = ours().numpy()

        def call() -> np.ndarray:
            return round_ndarray(
                format_info_ocp_e4m3, values, RoundMode.Stochastic, srbits=rand, srnumbits=RBITS
            )

        def check(output: np.ndarray) -> str:
            theirs = output.astype(np.float32)  # float64 out; e4m3fn values convert exactly
            same = (theirs.view(np.uint32) == expected.view(np.uint32)) | (
                np.isnan(theirs) & np.isnan(expected)
            )
            if not same.all():
                raise CheckFailed(f"{int((~same).sum())} differ from stochround's results")
            return f"ok = stochround bit for bit ({int(np.isnan(theirs).sum())} NaN)"

        return Run(call, check, values.size, notes="RoundMode.Stochastic, sat=False")

    check = rounding_check(x, "e4m3fn", rbits=RBITS, count=args.check_count)
    bench.add("e4m3fn_sr8_c", "stochround", lambda: Run(ours, check, x.numel()), ours=True)
    bench.add("e4m3fn_sr8_c", "gfloat", gfloat, requires=("gfloat",))
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
