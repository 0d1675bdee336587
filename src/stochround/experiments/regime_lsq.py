"""The recipes-regime experiment's least-squares parts: the teacher-student problem, the
wgrad hook that quantizes only dy (or dy and x) with the public `stochround.blocks`
functions, SGD with a cosine schedule, the closed-form RN stall, and the wgrad GEMM error
against float64 (`stochround.experiments.recipes_regime` states the math).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import blocks

GRADIENTS = ("fp32", "bf16", "nvfp4_rn", "nvfp4_sr")  # how wgrad's dy is rounded
RHT_SIZE = 16  # Transformer Engine's RHT size, as `nvfp4()`
# the NVFP4 wgrads of the RHT axis: dy RN or SR, after the RHT or not (x RN, as nvfp4())
WGRADS = tuple((g, h) for g in ("nvfp4_rn", "nvfp4_sr") for h in (None, RHT_SIZE))


@dataclass(frozen=True)
class Problem:
    """``Y = X T^T + noise * E``: X (n, d) and Y (n, m) in fp32, the least-squares solution
    ``w_star`` (m, d) and its loss ``loss_star`` in float64."""

    x: Tensor
    y: Tensor
    w_star: Tensor
    loss_star: float


@dataclass(frozen=True)
class Outliers:
    """x's outliers on the RHT axis: its first ``channels`` channels times ``scale`` at one
    token in ``every`` (tokens 0, every, 2 every, ...).  ``every = 1``: outlier channels
    (a column large for every token); ``every > 1``: token outliers, as LLMs' massive
    activations (a few tokens, such as each sequence's first, huge in a few channels), one
    element large in each of its channel's 16-token blocks that holds an outlier token.
    The channels are exchangeable in the teacher-student problem, so the first ones serve;
    ``channels = 0`` is no outlier."""

    channels: int = 0
    scale: float = 1.0
    every: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.channels, bool) or not isinstance(self.channels, int):
            raise TypeError(f"channels must be an int; got {self.channels!r}")
        if self.channels < 0:
            raise ValueError(f"channels must be >= 0; got {self.channels}")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an int >= 1 (1: every token); got {self.every!r}")

    @property
    def label(self) -> str:
        """``none``, ``count x scale`` (every token) or ``count x scale, 1/every``."""
        if self.channels == 0:
            return "none"
        tokens = "" if self.every == 1 else f", 1/{self.every}"
        return f"{self.channels} x {self.scale:g}{tokens}"


NO_OUTLIERS = Outliers()


def with_outliers(x: Tensor, outliers: Outliers) -> Tensor:
    """``x`` (tokens, channels) with ``outliers`` (`Outliers`): its first
    ``outliers.channels`` channels times ``outliers.scale`` at tokens 0, every, 2 every,
    ...; every other element unchanged."""
    if outliers.channels > x.shape[1]:
        raise ValueError(
            f"outliers.channels must be in 0..{x.shape[1]} (x's channels); got {outliers.channels}"
        )
    factors = torch.ones_like(x)
    factors[:: outliers.every, : outliers.channels] = outliers.scale
    return x * factors


def least_squares(
    n: int, d: int, m: int, noise: float, seed: int, outliers: Outliers = NO_OUTLIERS
) -> Problem:
    """A teacher-student regression: X standard normal (with ``outliers``,
    `with_outliers`), the teacher T (m, d)
    normal with variance 1/d, label noise of std ``noise``; all from torch.Generator
    seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    x = with_outliers(torch.randn(n, d, generator=generator), outliers)
    teacher = torch.randn(m, d, generator=generator) / math.sqrt(d)
    y = x @ teacher.T + noise * torch.randn(n, m, generator=generator)
    x64, y64 = x.double(), y.double()
    w_star = torch.linalg.lstsq(x64, y64).solution.T.contiguous()
    return Problem(x, y, w_star, loss(w_star, x64, y64))


def loss(w: Tensor, x: Tensor, y: Tensor) -> float:
    """``||X W^T - Y||_F^2 / (2 n)`` in float64."""
    residual = x.double() @ w.double().T - y.double()
    return float(residual.square().sum() / (2 * x.shape[0]))


def excess(problem: Problem, w: Tensor) -> float:
    """The loss above the least-squares minimum, ``L(W) - L(W*)`` (float64)."""
    return loss(w, problem.x, problem.y) - problem.loss_star


def round_dy(dy: Tensor, gradient: str, seed: int, step: int, rht: int | None = None) -> Tensor:
    """wgrad's dy (tokens, out) as the GEMM sees it: unchanged (fp32), rounded to bf16, or
    NVFP4 (16-element blocks along the tokens, the GEMM's contraction axis, e4m3 block
    scales, fp32 tensor scale from the amax) with round to nearest or SR; SR draws stream
    (seed, offset ``step``).  ``rht``: the Hadamard size along the tokens, or None."""
    if gradient == "fp32":
        return dy
    if gradient == "bf16":
        return dy.to(torch.bfloat16).float()
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {', '.join(GRADIENTS)}; got {gradient!r}")
    mode = "sr" if gradient == "nvfp4_sr" else "rne"
    return blocks.fake_quantize(
        dy,
        "nvfp4",
        mode,
        axis=0,
        rht=rht,
        rht_bf16=rht is not None,
        seed=seed if mode == "sr" else None,
        offset=step if mode == "sr" else None,
    )


def round_x(x: Tensor, rht: int | None) -> Tensor:
    """wgrad's x (tokens, in) as `nvfp4()` quantizes it: NVFP4 along the tokens, round to
    nearest, after the same RHT as dy (``rht``) or none."""
    return blocks.fake_quantize(x, "nvfp4", "rne", axis=0, rht=rht, rht_bf16=rht is not None)


def cosine(step: int, steps: int, peak: float) -> float:
    """``peak (1 + cos(pi step / steps)) / 2``: from ``peak`` at step 0 to 0 at the end."""
    return peak * (1 + math.cos(math.pi * step / steps)) / 2


def batch_lr(batch: int, d: int) -> float:
    """The learning-rate rule of the batch sweep: ``1 / (1 + sqrt(d / batch))^2``, the
    inverse of the Marchenko-Pastur edge of a batch's ``X_B^T X_B / batch`` (its largest
    eigenvalue for Gaussian X): the largest step that is safely stable at every batch
    size."""
    return 1.0 / (1.0 + math.sqrt(d / batch)) ** 2


def data_lr(x: Tensor) -> float:
    """``1 / lambda_max(X^T X / n)`` of the data itself (float64): full-batch gradient
    descent's stable step for data whose spectrum the Gaussian rule (`batch_lr`) does not
    describe."""
    x64 = x.double()
    return 1.0 / float(torch.linalg.eigvalsh(x64.T @ x64 / x.shape[0]).max())


def channel_scale(x: Tensor) -> Tensor:
    """The Jacobi preconditioner's diagonal, each channel's mean square ``diag(X^T X) /
    n`` (fp32): dividing the gradient's column j by it puts every channel on one
    curvature, as Adam's per-weight scaling does, so that an outlier channel (curvature
    scale^2) does not set the step of every channel."""
    return x.square().mean(dim=0)


def preconditioned_lr(x: Tensor) -> float:
    """`data_lr` of the channel-normalized data ``X diag(channel_scale)^(-1/2)``: the
    stable step of preconditioned full-batch gradient descent."""
    return data_lr(x / channel_scale(x).sqrt())


@dataclass(frozen=True)
class Training:
    """One SGD run: ``steps`` steps of ``batch`` rows (all rows, in order, when ``batch``
    is n), peak learning rate ``lr`` with a cosine to 0, dy rounded as ``gradient``;
    ``rht``: the wgrad RHT size or None; ``quantize_x``: x of the wgrad GEMM in NVFP4 too
    (as `nvfp4()` does); ``tail``: None for a cosine to 0, else the learning rate of the
    run's second half as a fraction of ``lr`` (`run_lr`); ``precondition``: the step
    divides the gradient's columns by `channel_scale` of the full data (after the rounded
    GEMM: the rounding sees the gradient as the GEMM makes it)."""

    steps: int
    batch: int
    lr: float
    gradient: str
    rht: int | None = None
    quantize_x: bool = False
    tail: float | None = None
    precondition: bool = False


@dataclass
class Curve:
    """A run's excess loss at the logging steps (the last entry: the end) and Chmiel et
    al.'s ratio ``||G||_F / ||N||_F`` there: G = dy^T X_B of the unrounded operands, N the
    rounded GEMM's difference from it (empty for an fp32 run)."""

    steps: list[int]
    excess: list[float]
    ratio: list[float]


def train(problem: Problem, run: Training, seed: int, log_every: int = 0) -> Curve:
    """SGD from W = 0 on ``problem``: each step ``W -= lr_t Q(dy)^T X_B`` with ``dy = (X_B
    W^T - Y_B) / batch`` (module docstring of recipes_regime).  Batches: ``batch`` distinct
    rows drawn by torch.Generator seeded with ``seed``.  Logs every ``log_every`` steps (0:
    only at the end) and at the end."""
    x, y = problem.x, problem.y
    n = x.shape[0]
    generator = torch.Generator().manual_seed(seed)
    w = torch.zeros(y.shape[1], x.shape[1])
    divisor = channel_scale(x) if run.precondition else torch.ones(x.shape[1])
    full = run.batch == n
    # full batch: the same rows every step, so x's quantization is done once
    x_full = round_x(x, run.rht) if full and run.quantize_x else x
    curve = Curve([], [], [])
    for step in range(run.steps):
        if full:
            xb, yb, xq = x, y, x_full
        else:
            rows = torch.randperm(n, generator=generator)[: run.batch]
            xb, yb = x[rows], y[rows]
            xq = round_x(xb, run.rht) if run.quantize_x else xb
        dy = (xb @ w.T - yb) / run.batch
        gradient = round_dy(dy, run.gradient, seed, step, run.rht).T @ xq
        if (log_every and (step + 1) % log_every == 0) or step + 1 == run.steps:
            curve.steps.append(step + 1)
            if run.gradient != "fp32" or run.quantize_x:
                exact = dy.T @ xb
                noise = float((gradient - exact).norm())
                curve.ratio.append(math.inf if noise == 0 else float(exact.norm()) / noise)
        w -= run_lr(step, run) * gradient / divisor
        if curve.steps and curve.steps[-1] == step + 1:
            curve.excess.append(excess(problem, w))
    return curve


def run_lr(step: int, run: Training) -> float:
    """The learning rate at ``step``: a cosine from ``lr`` to 0 over the run, or, with a
    ``tail``, a cosine to ``lr * tail`` over the first half and ``lr * tail`` after it."""
    if run.tail is None:
        return cosine(step, run.steps, run.lr)
    half = run.steps // 2
    if step >= half:
        return run.lr * run.tail
    return run.lr * (run.tail + (1 - run.tail) * (1 + math.cos(math.pi * step / half)) / 2)


def rounding_error(problem: Problem, gradient: str = "nvfp4_rn") -> Tensor:
    """``e* = n Q(r*/n) - r*``: the deterministic rounding error (``gradient`` "nvfp4_rn"
    or "bf16") of the full-batch dy at the least-squares solution (r* its residual), in
    units of the residual (float64)."""
    if gradient not in ("nvfp4_rn", "bf16"):
        raise ValueError(f"gradient must be 'nvfp4_rn' or 'bf16'; got {gradient!r}")
    n = problem.x.shape[0]
    residual = problem.x.double() @ problem.w_star.T - problem.y.double()
    dy = (residual / n).float()
    return round_dy(dy, gradient, 0, 0).double() * n - residual


def predicted_stall(x: Tensor, error: Tensor) -> float:
    """The RN stall's excess loss to first order, ``||P_X e||_F^2 / (2 n)``: at the fixed
    point ``X^T (r* + X D^T + e) = 0``, so ``X D^T = -P_X e`` with P_X the projection on X's
    columns, and the excess loss is ``||X D^T||^2 / (2 n)``."""
    x64 = x.double()
    coefficients = torch.linalg.lstsq(x64, error.double()).solution
    return float((x64 @ coefficients).square().sum() / (2 * x.shape[0]))


def predicted_stall_iid(n: int, d: int, m: int, error_ms: float) -> float:
    """The closed form for errors uncorrelated with X: ``E||P_X e||^2 = d m sigma^2`` for
    i.i.d. errors of mean square ``sigma^2 = error_ms``, so the excess is ``d m sigma^2 /
    (2 n)``."""
    return d * m * error_ms / (2 * n)


def wgrad_error(
    x: Tensor, dy: Tensor, gradient: str, rht: int | None, seed: int, step: int = 0
) -> float:
    """The relative Frobenius error of NVFP4 wgrad, ``||Q(dy)^T Q(x) - dy^T x|| / ||dy^T
    x||``, against the float64 product: x round to nearest, dy as ``gradient``
    ("nvfp4_rn" or "nvfp4_sr", SR from stream (seed, ``step``)), both along the tokens
    after the same RHT (``rht``) or none."""
    quantized = round_dy(dy, gradient, seed, step, rht).double().T @ round_x(x, rht).double()
    exact = dy.double().T @ x.double()
    return float((quantized - exact).norm() / exact.norm())


__all__ = [
    "GRADIENTS",
    "NO_OUTLIERS",
    "RHT_SIZE",
    "WGRADS",
    "Curve",
    "Outliers",
    "Problem",
    "Training",
    "batch_lr",
    "channel_scale",
    "cosine",
    "data_lr",
    "excess",
    "least_squares",
    "loss",
    "preconditioned_lr",
    "predicted_stall",
    "predicted_stall_iid",
    "round_dy",
    "round_x",
    "rounding_error",
    "run_lr",
    "train",
    "wgrad_error",
    "with_outliers",
]
