"""The language-model experiment's training: one run of a row (`train_run`: schedule,
optimizer, validation loss and the gradient-to-noise ratio `NoiseProbe` measures), the runs
cached by settings (`cached_run`) and every row over the seeds (`run_rows`).
"""

from __future__ import annotations

import json
import math
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import nn as snn
from ..optim import AdamW as SRAdamW
from .lm_data import VOCAB, Data, batch_starts, load_data, validation_windows, windows_at
from .lm_model import build_model
from .lm_rows import KEEP, ROWS, Row, Sizes
from .report import KeyNumber, ProgressLike

_SEED_MODULUS = 2**64
_OPTIMIZER_SEED_SHIFT = 2**63  # the optimizer's seed: the run's seed + 2**63 (mod 2**64)
SQRT3 = math.sqrt(3.0)
LOW_LR = 0.05  # the late phase's learning rate, as a fraction of the peak
DECAY_END = 0.75  # the cosine ends (and the late phase starts) at this fraction of the run
_BETAS = (0.9, 0.95)
_WEIGHT_DECAY = 0.1


def _keeps_out_lm_head(module: nn.Module, path: str) -> bool:
    """`gaussws_`'s filter: every Linear but those `KEEP` names (the lm_head), as the
    recipes keep them."""
    return not any(re.search(pattern, path) for pattern in KEEP)


class NoiseProbe:
    """Hooks on a model's `QuantizedLinear` layers that, while ``active``, compute each
    layer's exact fp32 weight gradient ``G = dy^T x`` (as
    `stochround.experiments.language_model` describes); `ratio` then compares them with
    the weights' ``.grad``."""

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


class _FP32Master:
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


def _make_optimizer(model: nn.Module, sizes: Sizes, row: Row, seed: int) -> Any:
    """The row's optimizer over ``model`` (weight decay on the 2-D tensors only)."""
    decayed = [p for p in model.parameters() if p.ndim == 2]
    others = [p for p in model.parameters() if p.ndim != 2]
    groups = [
        {"params": decayed, "weight_decay": _WEIGHT_DECAY},
        {"params": others, "weight_decay": 0.0},
    ]
    if row.optimizer == "fp32-master":
        return _FP32Master(groups, lr=sizes.lr, betas=_BETAS, eps=1e-8)
    # the layers' and the optimizer's stream offsets overlap (both step * 2**32 + a small
    # index): a seed of its own keeps the optimizer from reusing the layers' random words
    optimizer_seed = (seed + _OPTIMIZER_SEED_SHIFT) % _SEED_MODULUS
    return SRAdamW(groups, lr=sizes.lr, betas=_BETAS, eps=1e-8, rounding="sr", seed=optimizer_seed)


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
    """How `train_run` spreads a run over ranks; the default, ``Placement()``, trains on one
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


_ONE_DEVICE = Placement()


def train_run(
    row: Row,
    sizes: Sizes,
    seed: int,
    data: Data,
    device: str,
    progress: ProgressLike,
    placement: Placement = _ONE_DEVICE,
) -> RunResult:
    """Train ``row`` at ``sizes`` with ``seed`` on ``data`` on ``device`` (as
    `stochround.experiments.language_model` describes) and return its `RunResult`;
    ``placement``: one device, or how the run is spread over ranks (`Placement`)."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    model = build_model(sizes, generator).to(device=device, dtype=torch.bfloat16)
    recipe = row.make_recipe(seed)
    if recipe is not None:
        snn.quantize_(model, recipe)
    if row.sampling is not None:
        snn.gaussws_(model, filter_fn=_keeps_out_lm_head, seed=seed, **dict(row.sampling))
    quantized = [m for m in model.modules() if isinstance(m, snn.QuantizedLinear)]
    if placement.shard is not None:
        placement.shard(model)
    optimizer = _make_optimizer(model, sizes, row, seed)
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
        weight_decay=_WEIGHT_DECAY,
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


def _run_seeds(seed: int, count: int) -> list[int]:
    """``count`` seeds: ``seed, seed + 1, ...`` modulo 2**64."""
    return [(seed + k) % _SEED_MODULUS for k in range(count)]


def run_rows(
    sizes: Sizes,
    seed: int,
    device: str,
    progress: ProgressLike,
    rows: Sequence[Row] = ROWS,
    data: Data | None = None,
    cache: Path | None = None,
) -> dict[str, list[RunResult]]:
    """Every row of ``rows`` at ``sizes`` for each of `_run_seeds` (``sizes.seeds`` of
    them from ``seed``), on ``device``: the results by row key, in seed order."""
    text = load_data() if data is None else data
    results: dict[str, list[RunResult]] = {}
    for row in rows:
        results[row.key] = [
            cached_run(row, sizes, run_seed, text, device, progress, cache)
            for run_seed in _run_seeds(seed, sizes.seeds)
        ]
    return results


__all__ = [
    "SQRT3",
    "Placement",
    "RunResult",
    "cached_run",
    "run_rows",
    "run_settings",
    "train_run",
]
