"""Gaussian weight sampling's overhead: a training step of a GPT-2-medium-shaped model with
and without `stochround.nn.gaussws_`, in one run (issue 32's performance target).

Model: `stochround.experiments.lm_model.GPT` at d_model 1024, 24 blocks, 16 heads,
context 1024 (byte-level: 303M parameters, GPT-2 medium's blocks with a 256-symbol
vocabulary), bf16 parameters. One step is the forward and the backward of the mean
cross-entropy on ``--batch`` windows of random bytes (gradients set to None first); no
optimizer step. Rows (case ``gpt_step``):

- ``bf16``: the model as it is (the reference row).
- ``gaussws_e3m2``: `gaussws_(model, "e3m2")` on every Linear (the default block of 32 and
  32-bit noise): each forward samples every weight once, ``W~ = bf16(W + R u(W))``, by the
  Triton kernel on CUDA.
- ``gaussws_e4m3fn``: the same with an FP8 target.

Each row also reports its persistent bytes (parameters and buffers): the sampling keeps no
copy of the weights, only a step counter a layer. Checks before timing: the loss is finite
and the sampled model's loss lies within 5% of the bf16 model's (the noise is a few units
of the target format's spacing: a wrong scale moves the loss far more).

    python benchmarks/bench_gaussws.py                                  # GPU
    python benchmarks/bench_gaussws.py --device cpu --d-model 64 --layers 2 --context 64
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

# harness before stochround: without a GPU it selects Triton's interpreter
import harness  # noqa: F401
import torch
import torch.nn.functional as F
from harness import Benchmark, CheckFailed, Run

from stochround.experiments.lm_model import GPT
from stochround.nn import gaussws_

CASE = "gpt_step"
LOSS_BOUND = 0.05  # relative distance of a sampled model's loss from the bf16 model's


class Inputs:
    """Random bytes (seed 0): ``batch`` windows of ``context`` inputs and their targets."""

    def __init__(self, batch: int, context: int, device: torch.device) -> None:
        generator = torch.Generator(device=device).manual_seed(0)
        tokens = torch.randint(0, 256, (batch, context + 1), generator=generator, device=device)
        self.inputs, self.targets = tokens[:, :-1], tokens[:, 1:]
        self.tokens = batch * context


def build_model(d_model: int, layers: int, heads: int, context: int, device: torch.device) -> GPT:
    """The GPT in bf16, its weights drawn from a seeded generator (the same for every row)."""
    torch.manual_seed(0)
    return GPT(d_model, layers, heads, context).to(device=device, dtype=torch.bfloat16)


def persistent_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(parameter bytes, buffer bytes) of the model, parametrized or not."""
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return parameters, buffers


def step(model: GPT, inputs: Inputs) -> Callable[[], torch.Tensor]:
    """Gradients set to None, the loss, its backward; returns the loss."""

    def call() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        logits = model(inputs.inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, 256), inputs.targets.reshape(-1))
        loss.backward()
        return loss.detach()

    return call


def row(
    shape: tuple[int, int, int, int],
    inputs: Inputs,
    device: torch.device,
    fmt: str | None,
    reference: list[float],
) -> Run:
    """A row: the model, sampled toward ``fmt`` (None: as it is); the bf16 row records its
    loss in ``reference`` for the others' checks."""
    model = build_model(*shape, device)
    if fmt is not None:
        gaussws_(model, fmt)
    model.train()
    parameters, buffers = persistent_bytes(model)

    def check(loss: object) -> str:
        value = float(loss)  # type: ignore[arg-type]
        if not value == value or value in (float("inf"), float("-inf")):
            raise CheckFailed(f"loss {value}")
        if fmt is None:
            reference.append(value)
        elif reference and abs(value / reference[0] - 1) > LOSS_BOUND:
            raise CheckFailed(f"loss {value:.4f} against bf16's {reference[0]:.4f}")
        return f"ok loss {value:.4f}; params {parameters / 2**20:.0f} MiB, buffers {buffers} B"

    extra = {"parameter_bytes": parameters, "buffer_bytes": buffers}
    return Run(step(model, inputs), check, inputs.tokens, notes="eager", extra=extra)


def main() -> int:
    bench = Benchmark("bench_gaussws", __doc__, reference=f"{CASE}/bf16")
    bench.parser.set_defaults(warmup_ms=1000, rep_ms=3000)
    add = bench.parser.add_argument
    add("--d-model", type=int, default=1024, help="width (1024)")
    add("--layers", type=int, default=24, help="blocks (24)")
    add("--heads", type=int, default=16, help="attention heads (16)")
    add("--context", type=int, default=1024, help="window length (1024)")
    add("--batch", type=int, default=8, help="windows a step (8)")
    args = bench.parse_args()
    if args.d_model % 32 or args.d_model % args.heads:
        bench.parser.error("--d-model must be a multiple of 32 and of --heads")
    shape = (args.d_model, args.layers, args.heads, args.context)
    inputs = Inputs(args.batch, args.context, bench.device)
    reference: list[float] = []
    build = partial(row, shape, inputs, bench.device)
    bench.add(CASE, "bf16", partial(build, None, reference), reference=True)
    bench.add(CASE, "gaussws_e3m2", partial(build, "e3m2", reference), ours=True)
    bench.add(CASE, "gaussws_e4m3fn", partial(build, "e4m3fn", reference), ours=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
