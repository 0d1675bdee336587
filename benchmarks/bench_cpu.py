"""SR on the CPU: stochround beside gfloat, torchao and PyTorch.

- e4m3fn_sr8_c: SR to e4m3fn of 2**log2n fp32 values drawn from normal(0, 100) (some
  beyond e4m3fn's 448, which both turn into NaN) with 8 random bits, variant c (P3109's
  StochasticC, gfloat's ``RoundMode.Stochastic``), taking the same explicit random integers
  in [0, 256): stochround's PyTorch path beside gfloat's ``round_ndarray``. Checks:
  stochround's output rounds x (`harness.rounding_check`); gfloat's equals stochround's bit
  for bit (NaN equal to NaN).
- bf16_sr_cast: exact SR of 2**bf16_log2n fp32 values (normal(0, 1)) to bf16 from the
  counter-based stream: ``stochround.cast(x, torch.bfloat16, "sr")`` (``stochround``),
  the compiled CPU path it routes to once integrated (``stochround_cpu_path``:
  ``stochround.cpu_path.bf16_sr_cpu``), torchao's ``_fp32_to_bf16_sr`` eager and under
  ``torch.compile`` (``torch.randint`` noise), and ``x.to(torch.bfloat16)`` (round to
  nearest, the floor). Checks: every SR row rounds x stochastically without bias
  (`harness.rounding_check`); stochround's rows equal its PyTorch path bit for bit.
- adamw_bf16_sr: one AdamW step (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01)
  of one 2**adamw_log2n bf16 parameter (0.02 randn, gradient randn in bf16) with bf16
  states: ``stochround.optim.AdamW`` (``stochround``: every store SR, on its PyTorch
  path), the same optimizer updating through the compiled CPU step
  (``stochround_cpu_path``: its ``update`` replaced by
  ``stochround.optim.cpu_adamw.adamw_step_cpu``, the integration the dispatch will make),
  torchao's ``_AdamW(bf16_stochastic_round=True)`` (which compiles its step: SR of the
  parameter, states stored to nearest), and ``torch.optim.AdamW`` (foreach) on the bf16
  parameter and on an fp32 copy. Checks: stochround's rows give, after the first step,
  the bits of a PyTorch-path optimizer's first step; the others change the parameter.

Times: the median of ``--repeats`` runs after a warm-up run (the first call, compilation
included, is reported apart as ``first_call_s``); ``--threads`` sets torch's threads (the
compiled kernels' OpenMP threads too: set it for a whole run).

    python benchmarks/bench_cpu.py [--log2n 24] [--threads N]
    python benchmarks/bench_cpu.py --only 'bf16*,adamw*' --threads 2 --repeats 11
    python benchmarks/bench_cpu.py --log2n 12 --bf16-log2n 12 --adamw-log2n 12 --repeats 2
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch
from harness import Benchmark, CheckFailed, Run, rounding_check
from torch import Tensor

import stochround

RBITS = 8
BF16 = torch.bfloat16
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
SEED = 1


def main() -> int:
    bench = Benchmark("bench_cpu", __doc__)
    bench.parser.set_defaults(device="cpu")
    bench.parser.add_argument("--log2n", type=int, default=24, help="e4m3fn: 2**log2n (24)")
    add = bench.parser.add_argument
    add("--bf16-log2n", type=int, default=22, help="bf16 cast: 2**bf16_log2n values (22)")
    add("--adamw-log2n", type=int, default=20, help="AdamW: 2**adamw_log2n parameters (20)")
    add("--threads", type=int, default=None, help="torch CPU threads")
    args = bench.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    e4m3fn_rows(bench, args.log2n, args.check_count)
    cast_rows(bench, args.bf16_log2n, args.check_count)
    adamw_rows(bench, args.adamw_log2n)
    return bench.run()


# --------------------------------------------------------------------------------------
# e4m3fn: stochround beside gfloat
# --------------------------------------------------------------------------------------


def e4m3fn_rows(bench: Benchmark, log2n: int, check_count: int) -> None:
    generator = np.random.default_rng(0)
    values = generator.normal(0.0, 100.0, size=2**log2n).astype(np.float32)
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

    check = rounding_check(x, "e4m3fn", rbits=RBITS, count=check_count)
    bench.add("e4m3fn_sr8_c", "stochround", lambda: Run(ours, check, x.numel()), ours=True)
    bench.add("e4m3fn_sr8_c", "gfloat", gfloat, requires=("gfloat",))


# --------------------------------------------------------------------------------------
# bf16 SR cast
# --------------------------------------------------------------------------------------


def cast_rows(bench: Benchmark, log2n: int, check_count: int) -> None:
    x = torch.randn(2**log2n, generator=torch.Generator().manual_seed(0))
    moved = 6 * x.numel()  # read fp32, write bf16

    def torch_path(prefix: Tensor) -> Tensor:
        return stochround.cast(prefix, BF16, "sr", seed=SEED, offset=0, backend="torch")

    def run(call: Callable[[], Tensor], twin: bool = False, mode: str = "sr") -> Run:
        check = rounding_check(
            x, "bf16", mode, twin=torch_path if twin else None, count=check_count
        )
        return Run(call, check, x.numel(), moved)

    def ours() -> Run:
        return run(lambda: stochround.cast(x, BF16, "sr", seed=SEED, offset=0), twin=True)

    def ours_cpu_path() -> Run:
        from stochround.cpu_path import bf16_sr_cpu  # ImportError where not there: skipped

        return run(lambda: bf16_sr_cpu(x, SEED, 0), twin=True)

    def torchao(compiled: bool) -> Callable[[], Run]:
        def build() -> Run:
            from torchao.optim.quant_utils import _fp32_to_bf16_sr

            cast = torch.compile(_fp32_to_bf16_sr) if compiled else _fp32_to_bf16_sr
            return run(lambda: cast(x))

        return build

    case = "bf16_sr_cast"
    bench.add(case, "stochround_cpu_path", ours_cpu_path, ours=True)
    bench.add(case, "stochround", ours, ours=True)
    bench.add(case, "torchao", torchao(False), requires=("torchao",))
    bench.add(case, "torchao_compiled", torchao(True), requires=("torchao",))
    bench.add(case, "torch_to_rne", lambda: run(lambda: x.to(BF16), mode="rn"))


# --------------------------------------------------------------------------------------
# AdamW bf16 SR step
# --------------------------------------------------------------------------------------


def adamw_rows(bench: Benchmark, log2n: int) -> None:
    generator = torch.Generator().manual_seed(1)
    initial = 0.02 * torch.randn(2**log2n, generator=generator)
    grad = torch.randn(2**log2n, generator=generator)
    count = initial.numel()

    def parameter(dtype: torch.dtype) -> torch.nn.Parameter:
        param = torch.nn.Parameter(initial.to(dtype, copy=True))
        param.grad = grad.to(dtype)
        return param

    def reference_step() -> Tensor:
        """The bits of one step of stochround's PyTorch path."""
        param = parameter(BF16)
        stochround.optim.AdamW([param], **ADAMW, seed=SEED, backend="torch").step()
        return param.detach()

    def run(optimizer: torch.optim.Optimizer, param: Tensor, ours: bool, nbytes: int) -> Run:
        expected = reference_step() if ours else None

        def call() -> Tensor:
            optimizer.step()
            return param

        def check(output: object) -> str:
            assert isinstance(output, Tensor)
            if expected is not None:
                if not torch.equal(output.detach().view(torch.int16), expected.view(torch.int16)):
                    raise CheckFailed("differs from stochround's PyTorch path")
                return "ok = torch path"
            if torch.equal(output.detach().float(), initial.to(output.dtype).float()):
                raise CheckFailed("the parameter did not change")
            return "ok changed"

        return Run(call, check, count, nbytes * count)

    def ours() -> Run:
        param = parameter(BF16)
        return run(stochround.optim.AdamW([param], **ADAMW, seed=SEED), param, True, 14)

    def ours_cpu_path() -> Run:
        param = parameter(BF16)
        optimizer = stochround.optim.AdamW([param], **ADAMW, seed=SEED)
        optimizer.update = compiled_update(optimizer)  # type: ignore[method-assign]
        return run(optimizer, param, True, 14)

    def torchao() -> Run:
        from torchao.optim import _AdamW

        param = parameter(BF16)
        return run(_AdamW([param], **ADAMW, bf16_stochastic_round=True), param, False, 14)

    def torch_adamw(dtype: torch.dtype) -> Callable[[], Run]:
        def build() -> Run:
            param = parameter(dtype)
            nbytes = 7 * dtype.itemsize
            return run(torch.optim.AdamW([param], **ADAMW, foreach=True), param, False, nbytes)

        return build

    case = "adamw_bf16_sr"
    bench.add(case, "stochround_cpu_path", ours_cpu_path, ours=True)
    bench.add(case, "stochround", ours, ours=True)
    bench.add(case, "torchao", torchao, requires=("torchao",))
    bench.add(case, "torch_bf16", torch_adamw(BF16))
    bench.add(case, "torch_fp32", torch_adamw(torch.float32))


def compiled_update(optimizer: torch.optim.Optimizer) -> Callable[..., None]:
    """``optimizer``'s `update` through the compiled CPU step, as the integration routes it
    (stochround's internals: this row goes once the dispatch makes the plain row take it)."""
    from stochround.optim.base import TENSOR_SLOTS, state_stream_offset
    from stochround.optim.cpu_adamw import adamw_step_cpu

    def update(group: dict, index: int, param: Tensor, scalars: Tensor, step: Tensor) -> None:
        state = optimizer.state[param]
        slots = (TENSOR_SLOTS[name] for name in ("param", "exp_avg", "exp_avg_sq"))
        p, m, v = (state_stream_offset(step, index, slot) for slot in slots)
        adamw_step_cpu(
            param,
            param.grad,
            state["exp_avg"],
            state["exp_avg_sq"],
            scalars,
            group["seed"],
            (p, m, v),
            coupled=not group["decoupled_weight_decay"] and group["weight_decay"] != 0,
            maximize=group["maximize"],
        )

    return update


if __name__ == "__main__":
    sys.exit(main())
