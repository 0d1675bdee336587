"""Optimizer steps: stochround's SR optimizers beside PyTorch's fused ones and the peers.

Parameters are 0.02 randn and gradients randn (fp32 draws from one seeded generator, cast
to the row's dtype: the same values for every row), ``--count`` tensors of ``--dim`` x
``--dim`` (16 x 4096**2 = 268M). Cases and providers:

- adamw (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01): stochround ``AdamW`` on
  bf16 parameters with bf16 states, rounding "sr" (and "rne"); ``torch.optim.AdamW(fused=
  True)`` on fp32 and on bf16 parameters; torchao ``_AdamW(bf16_stochastic_round=True)``;
  HeavyBall ``AdamW(storage_dtype="bfloat16")``;
- sgd (momentum 0.9) and lion: stochround bf16 SR; torch's fused SGD on bf16;
- adamw_small: ``--small-count`` tensors of ``--small-numel`` bf16 values (1000 x 65536),
  stochround against torch fused bf16 (the host's work a tensor); adamw_small_graph: the
  same steps captured in a CUDA graph and replayed (the GPU's time alone);
- copy and copy_repeat: the device copy of 2**copy_log2n fp32 values, first and last.

A step is timed alone (do_bench) and back to back (b2b: 10 steps in a row, the host's time
between them counted). ``bytes``: what a step moves as the provider stores things
(parameter read and written, gradient read, each state tensor read and written);
``floor_bytes``: the least any step moves (AdamW 14 B/param: read p, g, m, v and write p,
m, v in bf16; SGD-momentum and Lion 10; in the JSON log), which `check.py` puts at the
copy's bandwidth (targets.toml's ``floor_bytes_per_element``).
Checks: after the first step every parameter is finite and the first one changed;
stochround's rows also step a copy of the first parameter twice with seeds 0 and 1: under
"sr" the stored parameter and each state differ between the seeds, under "rne" they agree.
(torch <= 2.13 leaves bf16 parameters unchanged in its fused SGD on the CPU, pytorch#191763:
that row fails its check there.)

    python benchmarks/bench_optim.py                                   # GPU
    python benchmarks/bench_optim.py --device cpu --count 2 --dim 64 --small-count 4 \\
        --small-numel 256 --copy-log2n 12                              # smoke test
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

import torch
from harness import Benchmark, CheckFailed, Run, equal_check
from torch import Tensor

import stochround

ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
BF16 = torch.bfloat16
Make = Callable[[list[Tensor], int], torch.optim.Optimizer]  # (params, seed) -> optimizer


def ours(kind: str, rounding: str = "sr") -> Make:
    optimizer = {"adamw": stochround.optim.AdamW, "sgd": stochround.optim.SGD}
    optimizer["lion"] = stochround.optim.Lion
    options = {"adamw": ADAMW, "sgd": {"lr": 1e-3, "momentum": 0.9}, "lion": {"lr": 1e-4}}[kind]
    return lambda params, seed: optimizer[kind](
        params, **options, state_dtype=BF16, rounding=rounding, seed=seed
    )


def torch_adamw(params: list[Tensor], seed: int, capturable: bool = False) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, **ADAMW, fused=True, capturable=capturable)


def torch_sgd(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, fused=True)


def torchao_adamw(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
    from torchao.optim import _AdamW

    return _AdamW(params, **ADAMW, bf16_stochastic_round=True)


def heavyball_adamw(compiled: bool) -> Make:
    def make(params: list[Tensor], seed: int) -> torch.optim.Optimizer:
        import heavyball.utils

        if not compiled:
            heavyball.utils.compile_mode = None
        return heavyball.AdamW(params, **ADAMW, storage_dtype="bfloat16", consume_grad=False)

    return make


class CapturedStep:
    """An optimizer whose ``step()`` replays a CUDA graph of the wrapped one's step,
    captured after two eager steps on a side stream (its states exist then)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.state = optimizer, optimizer.state
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            optimizer.step()
            optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            optimizer.step()

    def step(self) -> None:
        self.graph.replay()


def make_params(
    count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> list[Tensor]:
    """``count`` tensors 0.02 randn with randn gradients: the same values for every row."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for _ in range(count):
        param = torch.randn(shape, generator=generator, device=device).mul_(0.02).to(dtype)
        param.grad = torch.randn(shape, generator=generator, device=device).to(dtype)
        params.append(param)
    return params


def state_tensors(optimizer: torch.optim.Optimizer, param: Tensor) -> list[Tensor]:
    """The state tensors of ``param`` with more than one element (not step counters)."""
    found, stack = {}, [optimizer.state.get(param, {})]
    while stack:
        value = stack.pop()
        if isinstance(value, Tensor) and value.numel() > 1:
            found[(value.data_ptr(), value.dtype)] = value
        elif isinstance(value, dict | list | tuple):
            stack.extend(value.values() if isinstance(value, dict) else value)
    return list(found.values())


def moved_bytes(optimizer: torch.optim.Optimizer, params: list[Tensor]) -> float:
    """p read and written, g read, each state tensor read and written."""
    total = 0
    for p in params:
        total += p.numel() * (2 * p.element_size() + p.grad.element_size())
        total += 2 * sum(t.numel() * t.element_size() for t in state_tensors(optimizer, p))
    return total


def differing(a: Tensor, b: Tensor) -> float:
    """The fraction of elements whose stored bits differ."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return float((a.view(width) != b.view(width)).float().mean())


def seed_check(make: Make, param: Tensor, rounding: str) -> str:
    """Two steps on a copy of ``param`` with seeds 0 and 1 (two: SGD's first step stores
    the gradient as its buffer, exactly); compare what is stored."""
    stored = []
    for seed in (0, 1):
        copy = param.detach().clone()
        copy.grad = param.grad.clone()
        optimizer = make([copy], seed)
        optimizer.step()
        optimizer.step()
        stored.append([copy, *state_tensors(optimizer, copy)])
    fractions = [differing(a, b) for a, b in zip(*stored, strict=True)]
    text = f"seeds 0/1: p/states differ {'/'.join(f'{100 * f:.0f}%' for f in fractions)}"
    if not (all(f > 0 for f in fractions) if rounding == "sr" else not any(fractions)):
        raise CheckFailed(f"{text} under {rounding!r}")
    return text


def step(
    make: Make,
    new_params: Callable[[], list[Tensor]],
    floor: int,
    rounding: str | None = None,
    graph: bool = False,
) -> Run:
    """A row: the optimizer over new parameters, checked (module docstring)."""
    params = new_params()
    seeds = seed_check(make, params[0], rounding) + "; " if rounding else ""
    before = params[0].clone()
    optimizer = make(params, 0)
    stepper = CapturedStep(optimizer) if graph else optimizer

    def check(_: object) -> str:
        changed = differing(params[0], before)
        if not all(bool(torch.isfinite(p).all()) for p in params) or changed == 0:
            raise CheckFailed(f"not finite, or p0 unchanged ({100 * changed:.1f}% changed)")
        return f"ok {seeds}finite, p0 {100 * changed:.0f}% changed"

    numel = sum(p.numel() for p in params)
    bytes_moved = partial(moved_bytes, optimizer, params)  # read after the first step
    return Run(stepper.step, check, numel, bytes_moved, extra={"floor_bytes": floor * numel})


def copy(elements: int, device: torch.device) -> Run:
    source = torch.randn(elements, device=device)
    destination = torch.empty_like(source)
    return Run(lambda: destination.copy_(source), equal_check(source), elements, 8 * elements)


def main() -> int:
    bench = Benchmark("bench_optim", __doc__, reference="copy/torch", back_to_back=10)
    add = bench.parser.add_argument
    add("--count", type=int, default=16, help="large tensors (16)")
    add("--dim", type=int, default=4096, help="their size, dim x dim (4096)")
    add("--small-count", type=int, default=1000, help="small tensors (1000)")
    add("--small-numel", type=int, default=65536, help="their size (65536)")
    add("--copy-log2n", type=int, default=28, help="the copy's fp32 elements, 2**this (28)")
    add("--no-compile", action="store_true", help="HeavyBall eager")
    args = bench.parse_args()
    device = bench.device
    big = partial(make_params, args.count, (args.dim, args.dim), BF16, device)
    big_fp32 = partial(make_params, args.count, (args.dim, args.dim), torch.float32, device)
    small = partial(make_params, args.small_count, (args.small_numel,), BF16, device)
    capturable = partial(torch_adamw, capturable=True)
    heavyball = heavyball_adamw(not args.no_compile)

    # the floor's bytes a parameter (module docstring): AdamW 14, SGD-momentum and Lion 10;
    # torchao and HeavyBall compile their steps: on CUDA only
    bench.add("copy", "torch", partial(copy, 2**args.copy_log2n, device), reference=True)
    for rounding, name in (("sr", "stochround"), ("rne", "stochround_rne")):
        build = partial(step, ours("adamw", rounding), big, 14, rounding)
        bench.add("adamw", name, build, ours=True)
    bench.add("adamw", "torch_fused_fp32", partial(step, torch_adamw, big_fp32, 14))
    bench.add("adamw", "torch_fused_bf16", partial(step, torch_adamw, big, 14))
    torchao = partial(step, torchao_adamw, big, 14)
    bench.add("adamw", "torchao", torchao, requires=("torchao",), cuda_only=True)
    heavyball = partial(step, heavyball, big, 14)
    bench.add("adamw", "heavyball", heavyball, requires=("heavyball",), cuda_only=True)
    bench.add("sgd", "stochround", partial(step, ours("sgd"), big, 10, "sr"), ours=True)
    bench.add("sgd", "torch_fused_bf16", partial(step, torch_sgd, big, 10))
    bench.add("lion", "stochround", partial(step, ours("lion"), big, 10, "sr"), ours=True)
    bench.add("adamw_small", "stochround", partial(step, ours("adamw"), small, 14, "sr"), ours=True)
    bench.add("adamw_small", "torch_fused_bf16", partial(step, torch_adamw, small, 14))
    graph = partial(step, ours("adamw"), small, 14, "sr", graph=True)
    bench.add("adamw_small_graph", "stochround", graph, ours=True, cuda_only=True)
    graph = partial(step, capturable, small, 14, graph=True)
    bench.add("adamw_small_graph", "torch_fused_bf16", graph, cuda_only=True)
    bench.add("copy_repeat", "torch", partial(copy, 2**args.copy_log2n, device), reference=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
