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

import json
import math
import platform
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import nn as snn
from ..optim import AdamW as SRAdamW
from .report import Experiment, KeyNumber, ProgressLike, Table, new_figure, save_figure

VOCAB = 256
SEED_MODULUS = 2**64
OPTIMIZER_SEED_SHIFT = 2**63  # the optimizer's seed: the run's seed + 2**63 (mod 2**64)

# Large pure-Python modules present in every CPython 3.10+ (none removed by PEP 594, none
# turned into a package since 3.10), as paths relative to the stdlib folder
TRAIN_FILES: tuple[str, ...] = (
    "_pydecimal.py",
    "inspect.py",
    "typing.py",
    "pydoc.py",
    "email/_header_value_parser.py",
    "tarfile.py",
    "doctest.py",
    "unittest/mock.py",
    "urllib/request.py",
    "argparse.py",
    "_pyio.py",
    "pickletools.py",
    "subprocess.py",
    "difflib.py",
    "logging/__init__.py",
    "locale.py",
    "enum.py",
    "mailbox.py",
    "asyncio/base_events.py",
    "xml/etree/ElementTree.py",
    "importlib/_bootstrap_external.py",
    "xml/dom/minidom.py",
    "pickle.py",
    "pdb.py",
    "logging/handlers.py",
    "ast.py",
    "optparse.py",
    "unittest/case.py",
    "dataclasses.py",
    "threading.py",
    "http/client.py",
    "shutil.py",
    "configparser.py",
    "imaplib.py",
    "ssl.py",
    "collections/__init__.py",
    "http/server.py",
    "email/message.py",
    "multiprocessing/managers.py",
    "statistics.py",
)
VALIDATION_FILES: tuple[str, ...] = (
    "smtplib.py",
    "platform.py",
    "urllib/parse.py",
    "os.py",
    "traceback.py",
    "functools.py",
)

SQRT3 = math.sqrt(3.0)
LOW_LR = 0.05  # the late phase's learning rate, as a fraction of the peak
DECAY_END = 0.75  # the cosine ends (and the late phase starts) at this fraction of the run
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
KEEP = ("lm_head",)  # module paths the recipes leave in bf16


@dataclass(frozen=True)
class Sizes:
    """The model and run sizes.

    Args:
        d_model: the width; n_layer: the blocks; n_head: the attention heads (d_model /
            n_head each); context: the window length in bytes; batch: windows per step.
        steps: optimizer steps; warmup: the warmup's steps; lr: the peak learning rate.
        log_every: steps between two logging steps (validation loss and ratio; the first
            step and the last are logging steps too).
        eval_batches: validation batches of ``batch`` windows.
        seeds: runs per row.
    """

    d_model: int
    n_layer: int
    n_head: int
    context: int
    batch: int
    steps: int
    warmup: int
    lr: float
    log_every: int
    eval_batches: int
    seeds: int


FULL = Sizes(
    d_model=384,
    n_layer=6,
    n_head=6,
    context=256,
    batch=64,
    steps=1200,
    warmup=60,
    lr=1e-3,
    log_every=50,
    eval_batches=8,
    seeds=3,
)
QUICK = Sizes(
    d_model=64,
    n_layer=1,
    n_head=2,
    context=32,
    batch=8,
    steps=60,
    warmup=5,
    lr=3e-3,
    log_every=10,
    eval_batches=2,
    seeds=1,
)


# --------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------


@dataclass
class Data:
    """The training and validation text, as uint8 tensors of bytes."""

    train: Tensor
    validation: Tensor


def stdlib_folder() -> Path:
    """The running interpreter's standard-library folder (``sysconfig``'s ``stdlib``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def read_files(names: Sequence[str], root: Path) -> Tensor:
    """The files ``names`` (paths relative to ``root``) concatenated, as a uint8 tensor.

    A missing file is a ValueError naming it and ``root``.
    """
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise ValueError(
            f"the language-model data needs the standard-library files {', '.join(missing)}, "
            f"not found in {root}"
        )
    text = b"".join((root / name).read_bytes() for name in names)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def load_data(
    root: Path | None = None,
    train_files: Sequence[str] = TRAIN_FILES,
    validation_files: Sequence[str] = VALIDATION_FILES,
) -> Data:
    """The training and validation text: the files of each list under ``root`` (default:
    `stdlib_folder`).  A file in both lists is a ValueError (the split is by file)."""
    shared = sorted(set(train_files) & set(validation_files))
    if shared:
        raise ValueError(f"train_files and validation_files share {', '.join(shared)}")
    folder = stdlib_folder() if root is None else root
    return Data(read_files(train_files, folder), read_files(validation_files, folder))


def batch_starts(
    length: int, steps: int, batch: int, context: int, generator: torch.Generator
) -> Tensor:
    """The offsets of every training window of a run, drawn at once from ``generator``:
    int64 ``(steps, batch)``, uniform in [0, length - context - 1] (a window holds
    ``context + 1`` bytes of a text of ``length`` bytes).  Drawn up front so that a run on
    a GPU copies them once, not at every step."""
    if length < context + 1:
        raise ValueError(f"the text ({length} bytes) is shorter than context + 1")
    return torch.randint(0, length - context, (steps, batch), generator=generator)


def windows_at(text: Tensor, starts: Tensor, context: int) -> tuple[Tensor, Tensor]:
    """The windows of ``context + 1`` bytes of ``text`` at ``starts`` (on text's device):
    (inputs, targets), int64 ``(*starts.shape, context)``, the targets the inputs shifted
    by one byte."""
    offsets = torch.arange(context + 1, device=text.device)
    windows = text[starts[..., None] + offsets].long()
    return windows[..., :-1], windows[..., 1:]


def validation_windows(text: Tensor, count: int, context: int) -> Tensor:
    """``count`` windows of ``context + 1`` bytes at evenly spaced offsets of ``text``
    (the first at 0, the last at ``len - context - 1``), int64 ``(count, context + 1)``."""
    if text.numel() < context + 1:
        raise ValueError(f"the text ({text.numel()} bytes) is shorter than context + 1")
    starts = torch.linspace(0, text.numel() - context - 1, count).long()
    return text[starts[:, None] + torch.arange(context + 1)].long()


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one qkv Linear, `F.scaled_dot_product_attention`
    with ``is_causal=True``, one output projection Linear."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class TransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``
    with the MLP ``fc2(gelu(fc(x)))``, 4 d_model wide."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.fc2 = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """The byte-level decoder-only transformer (module docstring): ``forward(idx)`` maps
    int64 bytes ``(batch, length)``, length <= context, to logits ``(batch, length, 256)``."""

    def __init__(self, d_model: int, n_layer: int, n_head: int, context: int) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"n_head must divide d_model; got {n_head} and {d_model}")
        self.context = context
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def parameter_count(d_model: int, n_layer: int, context: int) -> int:
    """The parameters of `GPT`: ``2 V d + C d`` (token embedding, lm_head, positions; V =
    256, C the context) ``+ n_layer (12 d^2 + 4 d)`` (qkv 3 d^2, projection d^2, MLP 8 d^2,
    two LayerNorms 4 d) ``+ 2 d`` (the final LayerNorm)."""
    d = d_model
    return 2 * VOCAB * d + context * d + n_layer * (12 * d * d + 4 * d) + 2 * d


def build_model(sizes: Sizes, generator: torch.Generator) -> GPT:
    """A `GPT` of ``sizes`` with weights drawn from ``generator`` in fp32 (module
    docstring), on the CPU, in fp32."""
    with torch.device("meta"):
        model = GPT(sizes.d_model, sizes.n_layer, sizes.n_head, sizes.context)
    model = model.to_empty(device="cpu")
    residual_std = 0.02 / math.sqrt(2 * sizes.n_layer)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:  # LayerNorm: weight 1, bias 0
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
                continue
            residual = name.endswith("proj.weight") or name.endswith("fc2.weight")
            std = residual_std if residual else 0.02
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    return model


# --------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row: a recipe (None: bf16), the optimizer ("sr-bf16": stochround AdamW on
    the bf16 parameters with bf16 SR states; "fp32-master": fp32 master weights and
    torch's AdamW) and the weight sampling (``sampling``: `gaussws_`'s options, applied to
    the blocks' Linears with the run's seed; None: none)."""

    key: str
    label: str
    recipe: Callable[..., snn.Recipe] | None
    options: tuple[tuple[str, Any], ...] = ()
    optimizer: str = "sr-bf16"
    # Gaussian weight sampling (`stochround.nn.gaussws_` options; None: none)
    sampling: tuple[tuple[str, Any], ...] | None = None

    def make_recipe(self, seed: int) -> snn.Recipe | None:
        """The row's recipe with the run's ``seed`` and ``keep=KEEP`` (None for bf16)."""
        if self.recipe is None:
            return None
        return self.recipe(**dict(self.options), seed=seed, keep=KEEP)


ROWS: tuple[Row, ...] = (
    Row("bf16", "bf16", None),
    Row("nvfp4", "nvfp4 (SR, RHT)", snn.nvfp4),
    Row("nvfp4_rn", "nvfp4, RN gradients", snn.nvfp4, (("stochastic_rounding", False),)),
    Row("nvfp4_no_rht", "nvfp4, no RHT", snn.nvfp4, (("rht", False),)),
    Row("mxfp4_tseng", "mxfp4_tseng", snn.mxfp4_tseng),
    Row("mxfp8", "mxfp8", snn.mxfp8),
    Row("int8", "int8 (SR dy)", snn.int8),
    Row("nvfp4_fp32_adamw", "nvfp4, fp32 AdamW", snn.nvfp4, optimizer="fp32-master"),
    Row("gaussws_e3m2", "GaussWS e3m2", None, sampling=(("fmt", "e3m2"),)),
    Row("gaussws_e2m3", "GaussWS e2m3", None, sampling=(("fmt", "e2m3"),)),
    Row("gaussws_e4m3", "GaussWS e4m3fn", None, sampling=(("fmt", "e4m3fn"),)),
    Row("diffq_e3m2", "DiffQ noise, 6 bits", None, sampling=(("fmt", "e3m2"), ("noise", "diffq"))),
    Row("sr_e3m2", "SR fake-quant e3m2", None, sampling=(("fmt", "e3m2"), ("noise", "sr"))),
)
# (row, the row it is compared with, what the comparison isolates)
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("nvfp4", "nvfp4_rn", "SR vs RN gradients"),
    ("nvfp4", "nvfp4_no_rht", "RHT vs none"),
    ("nvfp4", "nvfp4_fp32_adamw", "bf16 SR AdamW (6 B) vs fp32 (14 B)"),
    ("gaussws_e3m2", "diffq_e3m2", "rounded Gaussian vs DiffQ noise"),
    ("gaussws_e3m2", "sr_e3m2", "GaussWS vs SR fake quantization"),
)


def keeps_out_lm_head(module: nn.Module, path: str) -> bool:
    """`gaussws_`'s filter: every Linear but those `KEEP` names (the lm_head), as the
    recipes keep them."""
    return not any(re.search(pattern, path) for pattern in KEEP)


def row_by_key(key: str) -> Row:
    """The row of `ROWS` named ``key`` (ValueError listing the keys)."""
    for row in ROWS:
        if row.key == key:
            return row
    raise ValueError(f"row must be one of {', '.join(r.key for r in ROWS)}; got {key!r}")


# --------------------------------------------------------------------------------------
# the ratio of the gradient norm to the quantization noise
# --------------------------------------------------------------------------------------


class NoiseProbe:
    """Hooks on a model's `QuantizedLinear` layers that, while ``active``, compute each
    layer's exact fp32 weight gradient ``G = dy^T x`` (module docstring); `ratio` then
    compares them with the weights' ``.grad``."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, snn.QuantizedLinear)]
        self.active = False
        self.exact: dict[int, Tensor] = {}
        self.handles = [layer.register_forward_hook(self._forward) for layer in self.layers]

    def _forward(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        if not (self.active and output.requires_grad):
            return
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()
        key = id(module)

        def keep_exact(dy: Tensor) -> None:
            self.exact[key] = dy.reshape(-1, dy.shape[-1]).float().T @ x

        output.register_hook(keep_exact)

    def ratio(self) -> tuple[float, float, float]:
        """(``||G||_F / ||N||_F``, ``||G||_F``, ``||N||_F``) over all layers, from the last
        active backward pass (the ratio inf where N is exactly zero; ValueError if a
        layer's G or grad is missing)."""
        gradient = noise = 0.0
        for layer in self.layers:
            exact = self.exact.get(id(layer))
            if exact is None or layer.weight.grad is None:
                raise ValueError("NoiseProbe.ratio needs an active forward and backward pass")
            gradient += float(exact.square().sum())
            noise += float((layer.weight.grad.float() - exact).square().sum())
        self.exact.clear()
        ratio = math.inf if noise == 0 else math.sqrt(gradient / noise)
        return ratio, math.sqrt(gradient), math.sqrt(noise)

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()


# --------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------


def learning_rate(step: int, sizes: Sizes) -> float:
    """The learning rate of ``step`` (0-based): linear warmup to ``lr`` over ``warmup``
    steps, cosine decay to ``lr * LOW_LR`` at ``DECAY_END * steps``, then constant."""
    peak, low = sizes.lr, sizes.lr * LOW_LR
    if step < sizes.warmup:
        return peak * (step + 1) / sizes.warmup
    decay_end = int(DECAY_END * sizes.steps)
    if step >= decay_end:
        return low
    progress = (step - sizes.warmup) / max(1, decay_end - sizes.warmup)
    return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * progress))


def logging_steps(sizes: Sizes) -> list[int]:
    """The steps (0-based) whose training step is measured and after which the
    validation loss is taken: 0, log_every, 2 log_every, ..., and the last."""
    steps = list(range(0, sizes.steps, sizes.log_every))
    if steps[-1] != sizes.steps - 1:
        steps.append(sizes.steps - 1)
    return steps


class FP32Master:
    """fp32 master copies of a model's parameters, updated by torch's ``AdamW``; `step`
    copies each (rounded to nearest) into the model's parameter."""

    def __init__(self, groups: list[dict[str, Any]], **options: Any) -> None:
        self.params = [p for group in groups for p in group["params"]]
        master_groups = []
        self.masters = []
        for group in groups:
            masters = [p.detach().float().clone().requires_grad_() for p in group["params"]]
            self.masters += masters
            master_groups.append({**group, "params": masters})
        self.optimizer = torch.optim.AdamW(master_groups, **options)
        self.param_groups = self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.params:
            parameter.grad = None

    def step(self) -> None:
        with torch.no_grad():
            for parameter, master in zip(self.params, self.masters, strict=True):
                master.grad = None if parameter.grad is None else parameter.grad.float()
            self.optimizer.step()
            for parameter, master in zip(self.params, self.masters, strict=True):
                parameter.copy_(master)


def make_optimizer(model: nn.Module, sizes: Sizes, row: Row, seed: int) -> Any:
    """The row's optimizer over ``model`` (weight decay on the 2-D tensors only)."""
    decayed = [p for p in model.parameters() if p.ndim == 2]
    others = [p for p in model.parameters() if p.ndim != 2]
    groups = [
        {"params": decayed, "weight_decay": WEIGHT_DECAY},
        {"params": others, "weight_decay": 0.0},
    ]
    if row.optimizer == "fp32-master":
        return FP32Master(groups, lr=sizes.lr, betas=BETAS, eps=1e-8)
    # the layers' and the optimizer's stream offsets overlap (both step * 2**32 + a small
    # index): a seed of its own keeps the optimizer from reusing the layers' random words
    optimizer_seed = (seed + OPTIMIZER_SEED_SHIFT) % SEED_MODULUS
    return SRAdamW(groups, lr=sizes.lr, betas=BETAS, eps=1e-8, rounding="sr", seed=optimizer_seed)


def validation_loss(model: nn.Module, windows: Tensor, batch: int) -> float:
    """The mean cross-entropy (nats per byte) of ``model`` over ``windows`` (on the model's
    device, in batches of ``batch``; their count a multiple of it), without grad."""
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for chunk in windows.split(batch):
            logits = model(chunk[:, :-1]).float()
            total += float(F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1)))
    model.train(was_training)
    return total / math.ceil(windows.shape[0] / batch)


@dataclass
class RunResult:
    """One training run: the logging steps, the validation loss after each, the ratio at
    each (empty for bf16), the training loss at every step, the wall time, and the
    quantized layers (count and recipe names)."""

    row: str
    seed: int
    steps: list[int]
    validation: list[float]
    ratio: list[float]
    train_loss: list[float]
    seconds: float
    quantized_layers: int
    recipe_names: list[str] = field(default_factory=list)
    sampled_layers: int = 0  # Linears whose weight GaussWS samples

    @property
    def final(self) -> float:
        return self.validation[-1]

    def first_below(self, threshold: float = SQRT3) -> int | None:
        """The first logging step whose ratio is below ``threshold`` (None: none)."""
        for step, value in zip(self.steps, self.ratio, strict=False):
            if value < threshold:
                return step
        return None


@dataclass(frozen=True)
class Placement:
    """How `train_run` spreads a run over ranks; the default (`ONE_DEVICE`) trains on one
    device.  `stochround.experiments.lm_distributed` fills it in for FSDP2.

    Args:
        shard: shards the model in place once its recipe or sampling is applied and before
            the optimizer is made over its parameters (FSDP2's ``fully_shard``).
        windows: this rank's offsets of a step, from all of the step's ``(batch,)``
            offsets (None: every rank trains on the whole batch).
        mean_loss: the training losses to log, from this rank's ``(steps,)`` fp32 losses
            (e.g. their mean over the ranks; None: as they are).
        ratio: whether the ratio is measured.  Off for sharded runs: `NoiseProbe` compares
            a layer's whole gradient with the exact one of this rank's windows, and a
            sharded, averaged gradient is neither.
    """

    shard: Callable[[nn.Module], None] | None = None
    windows: Callable[[Tensor], Tensor] | None = None
    mean_loss: Callable[[Tensor], Tensor] | None = None
    ratio: bool = True


ONE_DEVICE = Placement()


def train_run(
    row: Row,
    sizes: Sizes,
    seed: int,
    data: Data,
    device: str,
    progress: ProgressLike,
    placement: Placement = ONE_DEVICE,
) -> RunResult:
    """Train ``row`` at ``sizes`` with ``seed`` on ``data`` on ``device`` (module
    docstring) and return its `RunResult`; ``placement``: one device, or how the run is
    spread over ranks (`Placement`)."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    model = build_model(sizes, generator).to(device=device, dtype=torch.bfloat16)
    recipe = row.make_recipe(seed)
    if recipe is not None:
        snn.quantize_(model, recipe)
    if row.sampling is not None:
        snn.gaussws_(model, filter_fn=keeps_out_lm_head, seed=seed, **dict(row.sampling))
    quantized = [m for m in model.modules() if isinstance(m, snn.QuantizedLinear)]
    if placement.shard is not None:
        placement.shard(model)
    optimizer = make_optimizer(model, sizes, row, seed)
    probe = NoiseProbe(model)
    windows = validation_windows(data.validation, sizes.eval_batches * sizes.batch, sizes.context)
    windows = windows.to(device)
    text = data.train.to(device)
    starts = batch_starts(text.numel(), sizes.steps, sizes.batch, sizes.context, generator)
    starts = starts.to(device)
    logged = set(logging_steps(sizes))
    measured = bool(quantized) and placement.ratio
    steps: list[int] = []
    validation: list[float] = []
    ratios: list[float] = []
    losses: list[Tensor] = []
    for step in progress.track(range(sizes.steps), f"lm {row.key} seed {seed}", sizes.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, sizes)
        offsets = starts[step] if placement.windows is None else placement.windows(starts[step])
        inputs, targets = windows_at(text, offsets, sizes.context)
        probe.active = step in logged and measured
        logits = model(inputs).float()
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if probe.active:
            ratios.append(probe.ratio()[0])
            probe.active = False
        optimizer.step()
        losses.append(loss.detach())
        if step in logged:
            steps.append(step)
            validation.append(validation_loss(model, windows, sizes.batch))
    probe.remove()
    train_loss = torch.stack(losses).float()
    if placement.mean_loss is not None:
        train_loss = placement.mean_loss(train_loss)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return RunResult(
        row=row.key,
        seed=seed,
        steps=steps,
        validation=validation,
        ratio=ratios,
        train_loss=train_loss.cpu().tolist(),
        seconds=time.perf_counter() - started,
        quantized_layers=len(quantized),
        recipe_names=sorted({m.recipe.name for m in quantized}),
        sampled_layers=sum(isinstance(m, snn.GaussWS) for m in model.modules()),
    )


def run_settings(sizes: Sizes, device: str) -> dict[str, KeyNumber]:
    """What a run's result depends on besides its row and seed (a cached run is reused
    only under equal settings)."""
    settings: dict[str, KeyNumber] = dict(asdict(sizes))
    settings.update(
        device=device,
        python=platform.python_version(),
        torch=torch.__version__,
        low_lr=LOW_LR,
        decay_end=DECAY_END,
        weight_decay=WEIGHT_DECAY,
    )
    return settings


def cached_run(
    row: Row,
    sizes: Sizes,
    seed: int,
    data: Data,
    device: str,
    progress: ProgressLike,
    cache: Path | None,
) -> RunResult:
    """`train_run`, or its result from ``cache/ROW-seedSEED.json`` when that file holds a
    run of the same settings (`run_settings`); a new result is written there."""
    if cache is None:
        return train_run(row, sizes, seed, data, device, progress)
    path = cache / f"{row.key}-seed{seed}.json"
    settings = run_settings(sizes, device)
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("settings") == settings:
            return RunResult(**stored["result"])
    result = train_run(row, sizes, seed, data, device, progress)
    cache.mkdir(parents=True, exist_ok=True)
    payload = {"settings": settings, "result": asdict(result)}
    path.write_text(json.dumps(payload) + "\n", encoding="utf-8")
    return result


def run_seeds(seed: int, count: int) -> list[int]:
    """``count`` seeds: ``seed, seed + 1, ...`` modulo 2**64."""
    return [(seed + k) % SEED_MODULUS for k in range(count)]


def run_rows(
    sizes: Sizes,
    seed: int,
    device: str,
    progress: ProgressLike,
    rows: Sequence[Row] = ROWS,
    data: Data | None = None,
    cache: Path | None = None,
) -> dict[str, list[RunResult]]:
    """Every row of ``rows`` at ``sizes`` for each of `run_seeds` (``sizes.seeds`` of
    them from ``seed``), on ``device``: the results by row key, in seed order."""
    text = load_data() if data is None else data
    results: dict[str, list[RunResult]] = {}
    for row in rows:
        results[row.key] = [
            cached_run(row, sizes, run_seed, text, device, progress, cache)
            for run_seed in run_seeds(seed, sizes.seeds)
        ]
    return results


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (ddof 1; NaN for one value)."""
    array = np.asarray(values, dtype=np.float64)
    std = float(array.std(ddof=1)) if array.size > 1 else math.nan
    return float(array.mean()), std


def verdict(differences: Sequence[float], unit: str = "") -> str:
    """ "none" if the mean of the paired ``differences`` is smaller in size than their
    standard deviation, else "lower" / "higher" with the mean; "n/a (1 seed)" for one."""
    mean, std = mean_std(differences)
    if math.isnan(std):
        return "n/a (1 seed)"
    if abs(mean) < std:
        return "none"
    return f"{'lower' if mean < 0 else 'higher'} by {abs(mean):.3g}{unit}"


def pm(mean: float, std: float, digits: int = 4, suffix: str = "") -> str:
    """``mean ± std`` (``mean`` alone where std is NaN)."""
    if math.isnan(std):
        return f"{mean:.{digits}f}{suffix}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}{suffix}"


def summarize(
    results: dict[str, list[RunResult]],
) -> tuple[list[Table], dict[str, KeyNumber]]:
    """The tables (final validation loss per row; the comparisons) and key numbers."""
    key: dict[str, KeyNumber] = {}
    base = results.get("bf16")
    rows: list[list[str]] = []
    for row_key, runs in results.items():
        finals = [run.final for run in runs]
        mean, std = mean_std(finals)
        key[f"{row_key}_val_loss_mean"] = mean
        key[f"{row_key}_val_loss_std"] = 0.0 if math.isnan(std) else std
        key[f"{row_key}_seconds"] = float(np.mean([run.seconds for run in runs]))
        key[f"{row_key}_quantized_layers"] = runs[0].quantized_layers
        relative_text = versus_text = "-"
        if base is not None and row_key != "bf16":
            relative = [100 * (r.final / b.final - 1) for r, b in zip(runs, base, strict=True)]
            rel_mean, rel_std = mean_std(relative)
            key[f"{row_key}_vs_bf16_pct_mean"] = rel_mean
            key[f"{row_key}_vs_bf16_pct_std"] = 0.0 if math.isnan(rel_std) else rel_std
            relative_text = pm(rel_mean, rel_std, 2, " %")
            versus_text = verdict(relative, " %")
            key[f"{row_key}_vs_bf16"] = versus_text
        ratio_text = "-"
        if runs[0].ratio:
            firsts = [run.first_below() for run in runs]
            final_ratio = float(np.mean([run.ratio[-1] for run in runs]))
            key[f"{row_key}_ratio_first"] = float(np.mean([run.ratio[0] for run in runs]))
            key[f"{row_key}_ratio_final"] = final_ratio
            below = [f for f in firsts if f is not None]
            key[f"{row_key}_ratio_below_sqrt3_step"] = min(below) if below else -1
            crossed = ", ".join("never" if f is None else str(f) for f in firsts)
            ratio_text = f"{final_ratio:.3g}; {crossed}"
        rows.append(
            [
                row_by_key(row_key).label,
                pm(mean, std),
                relative_text,
                versus_text,
                ratio_text,
                f"{key[f'{row_key}_seconds']:.1f}",
            ]
        )
    seeds = len(next(iter(results.values())))
    table = Table(
        f"Byte-level GPT on the standard library's source: final validation loss, {seeds} "
        f"seed{'s' if seeds > 1 else ''} per row",
        [
            "row",
            "val loss (nats/byte)",
            "vs bf16",
            "verdict vs bf16",
            "ratio at end; first step < √3",
            "s/run",
        ],
        rows,
        [
            "mean ± std over seeds; vs bf16: per-seed 100 (L / L_bf16 - 1); a mean smaller "
            "than its spread is reported as none.",
            "ratio = ||G||_F / ||N||_F of the quantized layers' weight gradients (the exact "
            "fp32 gradient over the quantization noise), mean over seeds at the last "
            "logging step; the first logging step below √3 per seed.",
        ],
    )
    comparison_rows = []
    for first, second, what in COMPARISONS:
        if first not in results or second not in results:
            continue
        differences = [
            a.final - b.final for a, b in zip(results[first], results[second], strict=True)
        ]
        mean, std = mean_std(differences)
        text = verdict(differences)
        key[f"{first}_vs_{second}_diff_mean"] = mean
        key[f"{first}_vs_{second}"] = text
        comparison_rows.append(
            [what, f"{first} - {second}", pm(mean, std), text],
        )
    comparisons = Table(
        "Paired comparisons of final validation loss",
        ["comparison", "rows", "difference (nats/byte)", "verdict"],
        comparison_rows,
        ["per-seed difference, mean ± std; |mean| < std is none."],
    )
    return [table, comparisons], key


def plot_curves(results: dict[str, list[RunResult]], out: Path) -> Path:
    """Validation loss over training, the mean over seeds per row (left), and each row's
    loss relative to bf16's, ``100 (L / L_bf16 - 1)`` per seed then the mean (right: the
    differences the left panel's scale hides)."""
    figure, (absolute, relative) = new_figure(width=12.0, height=4.8, columns=2)
    colours = row_colours()
    baseline = results.get("bf16")
    for index, (row_key, runs) in enumerate(results.items()):
        # one colour a row in both panels (the right one has no bf16 line)
        style = {
            "linestyle": "-" if row_key in ("bf16", "nvfp4") else "--",
            "color": colours(index % colours.N),
        }
        label = row_by_key(row_key).label
        curve = np.mean([run.validation for run in runs], axis=0)
        absolute.plot(runs[0].steps, curve, label=label, **style)
        if baseline is None or row_key == "bf16":
            continue
        percent = [
            100 * (np.asarray(run.validation) / np.asarray(base.validation) - 1)
            for run, base in zip(runs, baseline, strict=True)
        ]
        relative.plot(runs[0].steps, np.mean(percent, axis=0), label=label, **style)
    absolute.set_xlabel("step")
    absolute.set_ylabel("validation loss (nats/byte)")
    absolute.set_title("Byte-level GPT under each recipe (mean over seeds)", fontsize=10)
    absolute.legend(fontsize=8)
    relative.axhline(0.0, color="black", linewidth=0.8)
    relative.set_xlabel("step")
    relative.set_ylabel("validation loss vs bf16 (%)")
    relative.set_title("Relative to bf16, same seeds (mean over seeds)", fontsize=10)
    relative.legend(fontsize=8)
    return save_figure(figure, out, "lm_loss")


def row_colours():
    """matplotlib's 20 distinct colours (more rows than its default cycle's 10)."""
    import matplotlib

    return matplotlib.colormaps["tab20"]


def plot_ratio(results: dict[str, list[RunResult]], out: Path) -> Path:
    """The ratio ||G|| / ||N|| over training, the mean over seeds per quantized row (log
    scale), with the √3 line."""
    figure, axes = new_figure(width=7.5, height=4.5)
    for row_key, runs in results.items():
        if not runs[0].ratio:
            continue
        curve = np.mean([run.ratio for run in runs], axis=0)
        axes.plot(runs[0].steps, curve, label=row_by_key(row_key).label)
    axes.axhline(SQRT3, color="black", linestyle=":", label="√3")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("||G|| / ||N|| (gradient / quantization noise)")
    axes.set_title("Gradient norm over quantization noise (Chmiel et al.'s ratio)", fontsize=10)
    axes.legend(fontsize=8)
    return save_figure(figure, out, "lm_ratio")


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
