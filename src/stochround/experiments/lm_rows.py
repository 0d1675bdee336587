"""What the language-model experiment trains: the model and run sizes (`Sizes`, `FULL`,
`QUICK`) and the rows (`ROWS`: a recipe, an optimizer or a weight sampling each) with the
comparisons the report makes between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import nn as snn

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


def row_by_key(key: str) -> Row:
    """The row of `ROWS` named ``key`` (ValueError listing the keys)."""
    for row in ROWS:
        if row.key == key:
            return row
    raise ValueError(f"row must be one of {', '.join(r.key for r in ROWS)}; got {key!r}")


__all__ = ["COMPARISONS", "FULL", "KEEP", "QUICK", "ROWS", "Row", "Sizes", "row_by_key"]
