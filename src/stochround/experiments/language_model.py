"""A small byte-level GPT trained under each quantized-training recipe: what stochastic
rounding (SR) and the random Hadamard transform (RHT) of the gradients buy, measured.

Data.  The standard library's own Python source, read as bytes (vocabulary 256) from
``sysconfig.get_paths()["stdlib"]``: the files `TRAIN_FILES` for training and
`VALIDATION_FILES` for validation (split by file; every one of them ships with CPython
3.10 and later).  Each list is concatenated into one byte string.  The text differs
between Python versions, so the version is recorded in the settings.  A training batch
is ``batch`` windows of ``context + 1`` bytes at offsets drawn (all of a run's at once)
by a torch.Generator seeded with the run's seed, after the model's initial weights:
every row of one seed starts from the same weights and sees the same bytes in the same
order.  Validation: ``eval_batches * batch`` windows at evenly spaced offsets of the
validation text, the same for every run; the validation loss is the mean cross-entropy
(nats per byte) of predicting each window's next bytes, evaluated with the model as
trained (its quantized forward GEMM included).

Model.  A decoder-only transformer (nanoGPT's shape): token and learned position
embeddings; ``n_layer`` blocks of LayerNorm, causal self-attention (one qkv Linear, one
projection Linear, ``F.scaled_dot_product_attention(is_causal=True)``), LayerNorm and an
MLP (Linear to 4 d, GELU, Linear back); a final LayerNorm and the lm_head Linear.  The
Linears have no bias.  Weights N(0, 0.02) (the residual projections 0.02 / sqrt(2
n_layer)), drawn in fp32, then stored in bf16.  `parameter_count` gives the size.

Rows.  Every row trains the bf16 model (bf16 parameters, bf16 activations).  bf16: plain
``nn.Linear`` (bf16 GEMMs with fp32 accumulation, as torch does).  The quantized rows
apply ``stochround.nn.quantize_(model, recipe)`` with the recipe's ``keep=("lm_head",)``:
every Linear of the blocks runs its three GEMMs on quantized operands, the lm_head stays
bf16.  The recipes: ``nvfp4()`` (SR gradients, RHT-16 in wgrad, 2-D weight blocks),
``nvfp4(stochastic_rounding=False)``, ``nvfp4(rht=False)``, ``mxfp4_tseng()``, ``mxfp8()``
and ``int8()`` (Qwix's rule, SR per element), each seeded with the run's seed.
Optimizer: every row but ``nvfp4_fp32_adamw`` uses ``stochround.optim.AdamW`` on the bf16 parameters
with bf16 states, stored by SR (6 bytes a parameter), seeded with the run's seed + 2**63
(mod 2**64: the layers' and the optimizer's stream offsets overlap, and a seed of its own
keeps their random words apart); the ``nvfp4`` row is thus the NVFP4 recipe with the
6-byte SR optimizer.  The row ``nvfp4_fp32_adamw`` is ``nvfp4()`` with fp32 master
weights and torch's fp32 ``AdamW`` (14 bytes a parameter: the master copy and its two
states, and the bf16 model copy): the master copy is updated, then rounded to nearest
into the bf16 model, so the forward and backward passes are those of the other rows and
only the optimizer's storage differs.  Gaussian weight sampling rows (issue 32): the bf16 model with
``stochround.nn.gaussws_(model, fmt, noise=...)`` on the blocks' Linears (the lm_head
kept, as the recipes keep it), seeded with the run's seed: each training forward samples
``W~ = bf16(W + R u(W))`` toward an FP6 (e3m2, e2m3) or FP8 (e4m3fn) target, and the two
other noises for contrast, DiffQ's unrounded Gaussian and SR fake quantization, toward
e3m2.  AdamW: betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every 2-D
tensor (the Linears' weights and both embeddings), none on the LayerNorms' parameters.

Schedule.  Linear warmup over the first ``warmup`` steps to ``lr``, a cosine decay to
``lr * LOW_LR`` at step ``decay_end = DECAY_END * steps``, then the late phase: the rest
of the run at ``lr * LOW_LR``: a late phase of small updates, where the gradient's norm
is small next to the quantization noise (the ratio below).

The ratio.  At each logging step the training step of each quantized run is measured.
For each `QuantizedLinear` (the blocks' Linears) a forward hook keeps its input x and a
tensor hook on its output the output's gradient dy, both as ``(tokens, features)``
matrices; then ``G = dy^T x`` in fp32 is the layer's weight gradient of exact GEMMs (the
same x and dy: the noise of the layers above is in dy already, and is not counted
again), and ``N = weight.grad - G`` is the noise the quantized wgrad GEMM added (its
operands' quantization error, plus the bf16 rounding of the stored gradient, which is
far smaller).  The ratio is ``||G||_F / ||N||_F`` with both norms over all quantized
layers together (the root of the sum of the layers' squared norms): the gradient's norm
over the noise's norm.  For per-element noise of standard deviation sigma over d weights,
``||N||_F = sqrt(d) sigma``, so this is ``||G|| / (sqrt(d) sigma)``.  Chmiel et al.
("FP4 all the way", 2025) find that fully quantized training becomes less effective
once the gradient norm falls below about sqrt(3) times the quantization noise (in these
units: the ratio below sqrt(3)); below it, whether the noise is unbiased (SR) or not
(round to nearest) is what the issue expects to matter.  The report gives, per recipe, the ratio
over training (the mean over seeds, log scale, with the sqrt(3) line) and the first
logging step at which it falls below sqrt(3).  For nvfp4 with RN gradients N is a
deterministic (biased) error rather than noise; the ratio is the same quantity.

Statistics.  ``seeds`` runs per row (seeds ``seed, seed + 1, ...``).  Each row's final
validation loss is given as mean ± standard deviation (ddof 1) over its seeds, and
relative to bf16 per seed (``100 (L_row / L_bf16 - 1)``, paired: the same seed has the
same data), mean ± std.  A comparison of two rows uses the per-seed paired differences
of their final validation losses: a mean difference smaller (in size) than those
differences' standard deviation is reported as "none"; with one seed there is no spread
and the verdict is "n/a (1 seed)".

Resuming.  Each finished run is written to ``out/lm-runs/ROW-seedSEED.json`` with the
settings it ran under; a later call with the same ``out`` and settings reads it back
instead of running again, so the full experiment can be run in several calls.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from .lm_data import load_data
from .lm_model import parameter_count
from .lm_rows import FULL, QUICK
from .lm_summary import plot_curves, plot_ratio, summarize
from .lm_training import run_rows, run_settings
from .report import Experiment, KeyNumber, ProgressLike


def resolve_device(device: str | None, quick: bool) -> str:
    """The device to train on: ``device`` as given ("cpu" or "cuda"), or for None "cpu"
    for the quick run and "cuda" where available (else "cpu") for the full one.  "cuda"
    without CUDA is a ValueError."""
    if device is None:
        return "cuda" if not quick and torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or None; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' needs CUDA, and torch.cuda.is_available() is False")
    return device


def run(
    quick: bool, seed: int, out: Path, progress: ProgressLike, device: str | None = None
) -> Experiment:
    """Train every row of `ROWS` at `QUICK` or `FULL` sizes (module docstring), writing the
    plots (and each run, for resuming) to ``out``; ``device``: see `resolve_device`."""
    started = time.perf_counter()
    sizes = QUICK if quick else FULL
    chosen = resolve_device(device, quick)
    data = load_data()
    results = run_rows(sizes, seed, chosen, progress, data=data, cache=out / "lm-runs")
    tables, key = summarize(results)
    parameters = parameter_count(sizes.d_model, sizes.n_layer, sizes.context)
    key["parameters"] = parameters
    key["seeds"] = sizes.seeds
    key["steps"] = sizes.steps
    key["train_bytes"] = data.train.numel()
    key["validation_bytes"] = data.validation.numel()
    tables[0].notes.append(
        f"{parameters:,} parameters (d {sizes.d_model}, {sizes.n_layer} block(s), "
        f"{sizes.n_head} heads, context {sizes.context}); {sizes.steps} steps of "
        f"{sizes.batch}x{sizes.context} bytes; lm_head kept in bf16; device {chosen}."
    )
    figures = [plot_curves(results, out), plot_ratio(results, out)]
    settings: dict[str, KeyNumber] = {"quick": quick, "seed": seed}
    settings.update(run_settings(sizes, chosen))
    settings["python_implementation"] = sys.implementation.name
    return Experiment(
        name="lm",
        title="A byte-level GPT trained under each quantized-training recipe",
        tables=tables,
        figures=figures,
        key_numbers=key,
        markdown=__doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        seconds=time.perf_counter() - started,
        settings=settings,
    )


__all__ = ["run"]
