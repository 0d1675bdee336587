"""Casts of fp32 values with stochastic rounding: stochround beside its peers.

Every row rounds the same 2**log2n fp32 values drawn from randn (gfloat's rows the first
2**gfloat_log2n: gfloat is slow, so compare per element; the ``_wide`` rows scaled).
Cases: fp32 -> bf16, fp16, e4m3fn and packed e2m1 (fp4x2) SR; e5m2 SR with 8 random bits,
variants a, b and c (the general kernel); p3109_k8p4se RNE; saturation (below); the device
copy, the floor (8 bytes an element), first and last (noise). Providers: stochround
(`cast`/`round`/`encode` on the Triton backend), PyTorch, torchao `_fp32_to_bf16_sr`
(compiled), HeavyBall `copy_stochastic_`, gfloat `round_ndarray` with 32 random bits (the
rounding stochround's "sr" does: variant c, n = 32) and with 8 (its cheapest), and a naive
eager PyTorch SR. Every output is checked before it is timed
(`harness.rounding_check`); stochround's also bit for bit against its PyTorch path.

e2m1: the kernel is judged in its asynchronous call (``nan="zero"``); the default call
(``nan="raise"``) waits for its kernel to learn whether a result is NaN and is reported
beside ``torch_waiting_copy``, a copy of the same bytes followed by a wait on the stream.

Saturation: SR with ``sat="finite"``, ``nan="zero"`` to packed e2m1 and e4m3fn (``cast``)
and to e2m3 and e3m2 codes (``encode``), on the randn values (case ``<format>_finite``)
and on randn x max/2 (``<format>_finite_wide``: randn*3 for e2m1, about 4.6% of the values
beyond +-max, which saturate), so that a saturating tile's cost shows beside a tile within
range.

    python benchmarks/bench_cast.py                                           # GPU
    python benchmarks/bench_cast.py --device cpu --log2n 12 --gfloat-log2n 12  # smoke test
"""

from __future__ import annotations

import sys
from functools import partial

import torch
from harness import Benchmark, Run, equal_check, rounding_check, stochround_run
from torch import Tensor

SEED = 1
FP4 = torch.float4_e2m1fn_x2
# stochround's rows: case, provider, then `harness.stochround_run`'s function, arguments
# after x, keywords, the check's format and bytes an element (fp32 read + result written)
OURS = [
    ("bf16", "stochround", "cast", (torch.bfloat16, "sr"), {}, "bfloat16", 6),
    ("bf16", "stochround_device_seed", "cast", (torch.bfloat16, "sr"), {"seed": "tensor"},
     "bfloat16", 6),
    ("fp16", "stochround", "cast", (torch.float16, "sr"), {}, "binary16", 6),
    ("e4m3fn", "stochround", "cast", (torch.float8_e4m3fn, "sr"), {}, "e4m3fn", 5),
    ("e2m1", "stochround", "cast", (FP4, "sr"), {"nan": "zero"}, "e2m1", 4.5),
    ("e2m1", "stochround_checked", "cast", (FP4, "sr"), {}, "e2m1", 4.5),
    *[(f"e5m2_sr8_{variant}", "stochround", "round", ("e5m2", "sr"),
       {"rbits": 8, "variant": variant}, "e5m2", 8) for variant in "abc"],
    ("p3109_k8p4se_rne", "stochround", "round", ("p3109_k8p4se", "rne"), {}, "p3109_k8p4se", 8),
]  # fmt: skip
# the saturation rows: format -> `harness.stochround_run`'s function and arguments after
# x, and bytes an element; each row runs on randn and on randn x max/2 (module docstring)
SATURATING = {
    "e2m1": ("cast", (FP4, "sr"), 4.5),
    "e2m3": ("encode", ("e2m3", "sr"), 5),
    "e3m2": ("encode", ("e3m2", "sr"), 5),
    "e4m3fn": ("cast", (torch.float8_e4m3fn, "sr"), 5),
}
# gfloat's rows: case -> (its format, the check's format, bytes an element, saturate: e2m1
# has no inf/NaN, and gfloat raises on overflow without it)
GFLOAT = {
    "bf16": ("format_info_bfloat16", "bfloat16", 6, False),
    "e4m3fn": ("format_info_ocp_e4m3", "e4m3fn", 5, False),
    "e2m1": ("format_info_ocp_e2m1", "e2m1", 4.5, True),
}


def copy(x: Tensor, count: int) -> Run:
    destination = torch.empty_like(x)
    return Run(lambda: destination.copy_(x), equal_check(x[:count]), x.numel(), 8 * x.numel())


def torch_rne(x: Tensor, count: int) -> Run:
    destination = torch.empty_like(x, dtype=torch.bfloat16)
    check = rounding_check(x, "bfloat16", "rn", count=count)
    return Run(lambda: destination.copy_(x), check, x.numel(), 6 * x.numel(), "dst.copy_(x)")


def naive(x: Tensor, count: int) -> Run:
    def call() -> Tensor:
        noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device)
        return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)

    return Run(call, rounding_check(x, "bfloat16", count=count), x.numel(), 6 * x.numel())


def torchao(x: Tensor, count: int, compile_peers: bool) -> Run:
    from torchao.optim.quant_utils import _fp32_to_bf16_sr

    function = torch.compile(_fp32_to_bf16_sr) if compile_peers else _fp32_to_bf16_sr
    check = rounding_check(x, "bfloat16", count=count)
    notes = "torch.compile" if compile_peers else "eager"
    return Run(lambda: function(x), check, x.numel(), 6 * x.numel(), notes)


def heavyball(x: Tensor, count: int, compile_peers: bool) -> Run:
    import heavyball.utils

    if not compile_peers:
        heavyball.utils.compile_mode = None
    destination = torch.empty_like(x, dtype=torch.bfloat16)

    def call() -> Tensor:
        heavyball.utils.copy_stochastic_(destination, x)
        return destination

    notes = f"compile_mode {heavyball.utils.compile_mode!r}"
    return Run(call, rounding_check(x, "bfloat16", count=count), x.numel(), 6 * x.numel(), notes)


def gfloat(x: Tensor, case: str, rbits: int, count: int) -> Run:
    import gfloat.formats
    from gfloat import RoundMode, round_ndarray

    name, fmt, nbytes, saturate = GFLOAT[case]
    generator = torch.Generator(device=x.device).manual_seed(SEED)
    # torch has no uint32 arithmetic: 32-bit random integers travel as int64
    dtype = torch.uint8 if rbits <= 8 else torch.int64
    bits = torch.randint(0, 2**rbits, x.shape, dtype=dtype, device=x.device, generator=generator)
    info = getattr(gfloat.formats, name)

    def call() -> Tensor:
        return round_ndarray(
            info, x, RoundMode.Stochastic, sat=saturate, srbits=bits, srnumbits=rbits
        )

    check = rounding_check(x, fmt, rbits=rbits, count=count)
    return Run(call, check, x.numel(), nbytes * x.numel(), f"sat={saturate}")


def saturating(x: Tensor, fmt: str, wide: bool, count: int) -> Run:
    """SR of x (``wide``: x times max/2) to ``fmt`` with ``sat="finite"``, ``nan="zero"``
    on the Triton backend, checked as `harness.stochround_run` checks its rows (codes from
    ``encode`` decoded first)."""
    import stochround

    name, args, nbytes = SATURATING[fmt]
    if wide:
        x = x * (stochround.format(fmt).max / 2)
    keywords = {"seed": SEED, "sat": "finite", "nan": "zero"}
    if name == "cast":
        return stochround_run(x, name, args, keywords, fmt, nbytes, backend="triton", count=count)

    def values(output: Tensor, prefix: int) -> Tensor:
        return stochround.decode(output.reshape(-1)[:prefix], fmt)

    def twin(prefix: Tensor) -> Tensor:
        return stochround.encode(prefix, *args, backend="torch", **keywords)

    check = rounding_check(x, fmt, values=values, twin=twin, count=count)
    call = partial(stochround.encode, x, *args, backend="triton", **keywords)
    return Run(call, check, x.numel(), nbytes * x.numel())


def waiting_copy(x: Tensor) -> Run:
    """The e2m1 row's bytes (4 read and 0.5 written an element) as one byte copy, then a
    wait on the stream: what any call that waits for its kernel costs at least."""
    source = x.view(torch.uint8)[: x.numel() * 9 // 4]
    destination = torch.empty_like(source)

    def call() -> Tensor:
        destination.copy_(source)
        if x.is_cuda:
            torch.cuda.current_stream(x.device).synchronize()
        return destination

    return Run(call, equal_check(source), x.numel(), 4.5 * x.numel())


def main() -> int:
    bench = Benchmark("bench_cast", __doc__, reference="copy/torch")
    bench.parser.add_argument("--log2n", type=int, default=28, help="elements 2**log2n (28)")
    bench.parser.add_argument("--gfloat-log2n", type=int, default=24, help="gfloat's (24)")
    bench.parser.add_argument("--no-compile", action="store_true", help="eager peers")
    args = bench.parse_args()
    generator = torch.Generator(device=bench.device).manual_seed(0)
    x = torch.randn(2**args.log2n, generator=generator, device=bench.device)
    small = x[: 2 ** min(args.gfloat_log2n, args.log2n)]
    n, compiled = args.check_count, not args.no_compile

    bench.add("copy", "torch", lambda: copy(x, n), reference=True)
    for case, provider, *spec in OURS:
        build = partial(stochround_run, x, *spec, backend="triton", count=n)
        bench.add(case, provider, build, ours=True)
    for fmt in SATURATING:
        for wide in (False, True):
            case = f"{fmt}_finite{'_wide' if wide else ''}"
            bench.add(case, "stochround", partial(saturating, x, fmt, wide, n), ours=True)
    bench.add("bf16", "torch_rne", lambda: torch_rne(x, n))
    bench.add("bf16", "naive", lambda: naive(x, n))
    bench.add("bf16", "torchao", lambda: torchao(x, n, compiled), requires=("torchao",))
    bench.add("bf16", "heavyball", lambda: heavyball(x, n, compiled), requires=("heavyball",))
    bench.add("e2m1", "torch_waiting_copy", lambda: waiting_copy(x))
    for case in GFLOAT:
        for rbits in (32, 8):
            build = partial(gfloat, small, case, rbits, n)
            bench.add(case, f"gfloat_sr{rbits}", build, requires=("gfloat",))
    bench.add("copy_repeat", "torch", lambda: copy(x, n), reference=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
