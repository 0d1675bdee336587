"""A training step of a whole model under the recipes: a GPT-2-small-shaped model with every
Linear but the head quantized, beside the same model in bf16, eager, compiled and captured
as one CUDA graph, in one run (issue 42's model targets).

Model: `stochround.experiments.lm_model.GPT` (byte-level: 256 symbols) in bf16. Presets:

- ``gpt2-small`` (default): d_model 768, 12 blocks, 12 heads, context 1024, 8 windows a
  step (8192 tokens): GPT-2 small's blocks.
- ``lm``: the `lm` experiment's full size (d_model 384, 6 blocks, 6 heads, context 256,
  64 windows): its step, bf16 against ``nvfp4()``.

One step is the forward and the backward of the mean cross-entropy on random bytes
(gradients set to None first); no optimizer step. Rows (case ``model_step_<preset>``), each
``<variant>_<how>`` with ``how`` one of ``eager``, ``compiled`` (``torch.compile`` of the
model, inductor), ``compiled_cudagraphs`` (``torch.compile(mode="reduce-overhead")``:
inductor's graphs replayed as CUDA graphs, CUDA only) and ``graphed`` (the eager step
captured as one CUDA graph: what is left without host time):

- ``bf16``: the model as it is (``bf16_eager`` is the reference row).
- ``nvfp4``: `stochround.nn.quantize_(model, nvfp4())` (the recipe keeps the head in
  bf16). Compiled only where `stochround.nn.linear.COMPILES` (torch >= 2.11); the row says
  so otherwise.
- ``gaussws``: `stochround.nn.gaussws_(model, "e3m2")` on every Linear but the head.
- ``nvfp4_no_step_graphs`` (eager and compiled only): ``nvfp4`` with the layers' CUDA step
  graphs off (`stochround.nn.use_step_graphs(False)`; the other rows run with the
  library's default, on, which leaves a whole-step capture and reduce-overhead's graphs
  alone), except ``compiled_cudagraphs``, which runs with them off as the recipes guide
  advises for `mode="reduce-overhead"`: the whole step is captured anyway, and a trace
  that sees them off keeps the forward's operands for the backward.
- ``nvfp4_delayed`` (eager, compiled and ``compiled_cudagraphs``): ``nvfp4(tensor_scale=
  "delayed")``, each role's tensor scale from the amaxes of the step before (no amax pass
  where the kernels' route serves), with the step graphs on as the other rows (a graph per
  host decision, in place); not ``graphed``: an eager step decides its windows on the host,
  which a capture of the whole step would freeze.
- ``nvfp4_pow2``: ``nvfp4(tensor_scale="pow2")``, power-of-two tensor scales that the
  operands' values hold, so that no GEMM scales its result (no epilogue pass).

Checks before timing: the loss is finite and lies within 5% of the bf16 model's.

    python benchmarks/bench_model.py                                   # GPU
    python benchmarks/bench_model.py --preset lm
    python benchmarks/bench_model.py --device cpu --d-model 64 --layers 1 --heads 2 \\
        --context 32 --batch 2 --only "*eager*"                        # smoke test
"""

from __future__ import annotations

import sys
from functools import partial

# harness before stochround: without a GPU it selects Triton's interpreter
import harness
import torch
from bench_gaussws import Inputs, step
from bench_gaussws import build_model as bf16_model
from harness import Benchmark, CheckFailed, Run

from stochround.experiments.lm_model import GPT
from stochround.nn.step_graphs import STEP_GRAPHS

LOSS_BOUND = 0.05  # relative distance of a variant's loss from the bf16 model's
PRESETS = {  # d_model, blocks, heads, context, windows a step
    "gpt2-small": (768, 12, 12, 1024, 8),
    "lm": (384, 6, 6, 256, 64),
}
VARIANTS = ("bf16", "nvfp4", "gaussws", "nvfp4_no_step_graphs", "nvfp4_delayed", "nvfp4_pow2")
HOWS = ("eager", "compiled", "compiled_cudagraphs", "graphed")
# torch.compile's mode for each compiled ``how``
COMPILE_MODES = {"compiled": None, "compiled_cudagraphs": "reduce-overhead"}


def uses_step_graphs(variant: str, how: str) -> bool:
    """Whether ``variant``'s rows run ``how`` with the layers' step graphs on (the
    library's default): all but ``nvfp4_no_step_graphs`` and ``compiled_cudagraphs``
    (reduce-overhead captures the whole step: with the step graphs off the trace keeps the
    forward's operands, as the recipes guide, "torch.compile", advises)."""
    return variant != "nvfp4_no_step_graphs" and how != "compiled_cudagraphs"


def build_model(shape: tuple[int, int, int, int], variant: str, device: torch.device) -> GPT:
    """The GPT in bf16 (seeded weights, the same for every row: `bench_gaussws`'s model)
    under ``variant``."""
    import stochround.nn as srnn

    model = bf16_model(*shape, device)
    if variant == "nvfp4_delayed":
        srnn.quantize_(model, srnn.nvfp4(keep=("lm_head",), tensor_scale="delayed"))
    elif variant == "nvfp4_pow2":
        srnn.quantize_(model, srnn.nvfp4(keep=("lm_head",), tensor_scale="pow2"))
    elif variant.startswith("nvfp4"):
        srnn.quantize_(model, srnn.nvfp4(keep=("lm_head",)))
    elif variant == "gaussws":
        srnn.gaussws_(model, "e3m2", filter_fn=lambda _module, path: path != "lm_head")
    return model.train()


def row(
    shape: tuple[int, int, int, int],
    inputs: Inputs,
    device: torch.device,
    variant: str,
    how: str,
    reference: list[float],
) -> Run:
    """A row: the model under ``variant``, its step run ``how``; the first bf16 row records
    its loss in ``reference`` for the others' checks."""
    from stochround.nn.linear import COMPILES

    if how in COMPILE_MODES and variant.startswith("nvfp4") and not COMPILES:
        raise ImportError(f"QuantizedLinear compiles with torch >= 2.11 (here {torch.__version__})")
    # each row starts with no step graph: the graphs an earlier row kept would hold their
    # share of the graphs' bounds (MAX_GRAPHS, MAX_GRAPH_BYTES) and crowd this row's out
    STEP_GRAPHS.clear()
    model = build_model(shape, variant, device)
    runner: torch.nn.Module = model
    if how in COMPILE_MODES:
        runner = torch.compile(model, mode=COMPILE_MODES[how])  # type: ignore[assignment]
    call = step(runner, inputs)  # type: ignore[arg-type]
    if how == "graphed":
        call = harness.graph_of(call)
    call = harness.with_step_graphs(call, uses_step_graphs(variant, how))

    def check(loss: object) -> str:
        value = float(loss)  # type: ignore[arg-type]
        if not value == value or value in (float("inf"), float("-inf")):
            raise CheckFailed(f"loss {value}")
        if not reference:
            reference.append(value)
        elif abs(value / reference[0] - 1) > LOSS_BOUND:
            raise CheckFailed(f"loss {value:.4f} against bf16's {reference[0]:.4f}")
        return f"ok loss {value:.4f}"

    return Run(call, check, inputs.tokens, notes=how)


def main() -> int:
    bench = Benchmark("bench_model", __doc__)
    bench.parser.set_defaults(warmup_ms=500, rep_ms=2000)
    add = bench.parser.add_argument
    add("--preset", choices=tuple(PRESETS), default="gpt2-small", help="model (gpt2-small)")
    for name in ("d-model", "layers", "heads", "context", "batch"):
        add(f"--{name}", type=int, default=None, help="overrides the preset's")
    args = bench.parse_args()
    d_model, layers, heads, context, batch = PRESETS[args.preset]
    d_model = args.d_model or d_model
    layers, heads = args.layers or layers, args.heads or heads
    context, batch = args.context or context, args.batch or batch
    if d_model % 32 or d_model % heads:
        bench.parser.error("--d-model must be a multiple of 32 and of --heads")
    case = f"model_step_{args.preset}"
    bench.reference = f"{case}/bf16_eager"
    shape = (d_model, layers, heads, context)
    inputs = Inputs(batch, context, bench.device)
    reference: list[float] = []
    build = partial(row, shape, inputs, bench.device)
    for variant in VARIANTS:
        for how in HOWS:
            if variant.endswith("step_graphs") and how not in ("eager", "compiled"):
                continue
            if variant == "nvfp4_delayed" and how == "graphed":
                continue
            cuda_only = how in ("graphed", "compiled_cudagraphs")
            options = {"cuda_only": cuda_only, "ours": variant != "bf16"}
            if (variant, how) == ("bf16", "eager"):
                options["reference"] = True
            bench.add(case, f"{variant}_{how}", partial(build, variant, how, reference), **options)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
