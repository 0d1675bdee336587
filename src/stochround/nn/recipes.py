"""Quantized-training recipes: which operand of which GEMM is quantized, and how.

A linear layer ``y = x W^T`` runs three GEMMs, each with two operands (six *roles*)::

    fprop   y  = Q(x)    Q(W)^T     fprop_input,       fprop_weight       (contract in_features)
    dgrad   dx = Q(dy)   Q(W)       dgrad_grad_output, dgrad_weight       (contract out_features)
    wgrad   dW = Q(dy)^T Q(x)       wgrad_grad_output, wgrad_input        (contract tokens)

A `Recipe` gives each role a `QuantSpec` (`stochround.nn.quant_spec`: block format,
element rounding mode, scale rule, 1-D or 2-D blocks, RHT, NVFP4's tensor scale; blocks
always run along the GEMM's contraction dimension), a seed for the random bits, and a
filter of layers kept in high precision.  Recipes are frozen dataclasses: they print,
compare with ``==`` and serialize (`Recipe.to_dict` / `Recipe.from_dict`, JSON-able).  The
named recipes (`nvfp4`, `mxfp4_tseng`, `mxfp8`, `fp8`, `int8`) each cite the table they
reproduce.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..block_constants import HADAMARD_SIZES
from ..reference import check_choice
from .quant_spec import (
    FORMAT_NAMES,
    MAX_AMAX_HISTORY,
    NOISE_POLICIES,
    PASSTHROUGH,
    SIGN_POLICIES,
    TENSOR_FORMATS,
    TENSOR_SCALE_POLICIES,
    QuantSpec,
    check_keys,
    spec_words,
)

# the six operands of a linear layer's three GEMMs, in the order of their stream slots
ROLES: tuple[str, ...] = (
    "fprop_input",
    "fprop_weight",
    "dgrad_grad_output",
    "dgrad_weight",
    "wgrad_grad_output",
    "wgrad_input",
)
# each GEMM's two roles (left operand, right operand)
GEMMS: dict[str, tuple[str, str]] = {
    "fprop": ("fprop_input", "fprop_weight"),
    "dgrad": ("dgrad_grad_output", "dgrad_weight"),
    "wgrad": ("wgrad_grad_output", "wgrad_input"),
}
# how a recipe's GEMMs run (`Recipe.gemm`)
GEMM_KINDS = ("emulated", "native")


@dataclass(frozen=True)
class Recipe:
    """A quantized-training recipe: a `QuantSpec` per GEMM operand (module docstring).

    Args:
        name: the recipe's name (a named recipe's function name, or your own).
        fprop_input, fprop_weight, dgrad_grad_output, dgrad_weight, wgrad_grad_output,
            wgrad_input: the spec of each role (default: passthrough).
        seed: the seed of every random bit the recipe draws, an int in [0, 2**64).  A layer
            draws ``random_words(index, key, offset)`` with ``key = stream_key(seed,
            StreamDomain.RECIPE)`` (`stochround.random`) and ``offset = step * 2**32 +
            layer * 16 + slot`` (`stochround.nn.linear.stream_offset`).
        source: where the recipe's table comes from (a citation, for people).
        keep: regular expressions of module paths (``re.search``) kept in high precision:
            `stochround.nn.quantize_` leaves the layers they match as they are.
        gemm: one of `GEMM_KINDS`: "emulated" (default) multiplies the quantized operands'
            values exactly with fp32 accumulation, as the guide's GEMM rule states;
            "native" runs each GEMM on the FP8 tensor cores (``torch._scaled_mm``, sm89+):
            what the hardware computes, for recipes whose six roles are per-tensor FP8
            (`fp8`).
    """

    name: str = "custom"
    fprop_input: QuantSpec = PASSTHROUGH
    fprop_weight: QuantSpec = PASSTHROUGH
    dgrad_grad_output: QuantSpec = PASSTHROUGH
    dgrad_weight: QuantSpec = PASSTHROUGH
    wgrad_grad_output: QuantSpec = PASSTHROUGH
    wgrad_input: QuantSpec = PASSTHROUGH
    seed: int = 0
    source: str = ""
    keep: tuple[str, ...] = ()
    gemm: str = "emulated"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        check_choice("gemm", self.gemm, GEMM_KINDS)
        if self.gemm == "native":
            others = [role for role in ROLES if getattr(self, role).format not in TENSOR_FORMATS]
            if others:
                raise ValueError(
                    "gemm='native' runs FP8 tensor-core GEMMs on per-tensor FP8 operands "
                    f"({', '.join(TENSOR_FORMATS)}); these roles are not: {', '.join(others)}"
                )
        for role in ROLES:
            spec = getattr(self, role)
            if not isinstance(spec, QuantSpec):
                raise TypeError(f"{role} must be a QuantSpec, got {type(spec).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a str, got {type(self.source).__name__}")
        keep = (self.keep,) if isinstance(self.keep, str) else tuple(self.keep)
        for pattern in keep:
            if not isinstance(pattern, str):
                raise TypeError(f"keep must hold regular expressions (str); got {pattern!r}")
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"keep: {pattern!r} is not a regular expression: {error}"
                ) from None
        object.__setattr__(self, "keep", keep)

    def spec(self, role: str) -> QuantSpec:
        """The `QuantSpec` of ``role`` (one of `ROLES`)."""
        check_choice("role", role, ROLES)
        spec: QuantSpec = getattr(self, role)
        return spec

    def keeps(self, path: str) -> bool:
        """Whether the module at ``path`` (its fully qualified name) stays in high
        precision: some ``keep`` pattern is found in it."""
        return any(re.search(pattern, path) for pattern in self.keep)

    def describe(self) -> str:
        """The recipe as a table: one line per role (format, blocks, rounding, RHT)."""
        lines = [f"{self.name}: seed {self.seed}" + (f" ({self.source})" if self.source else "")]
        if self.gemm != "emulated":
            lines.append(f"  GEMMs: {self.gemm} (FP8 tensor cores)")
        for role in ROLES:
            lines.append(f"  {role:<18} {spec_words(self.spec(role))}")
        if self.keep:
            lines.append(f"  kept in high precision: {', '.join(self.keep)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def replace(self, **changes: Any) -> Recipe:
        """A copy with fields replaced (``dataclasses.replace``), for instance another seed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-able dict (``json.dumps(recipe.to_dict())``)."""
        data: dict[str, Any] = {"name": self.name, "seed": self.seed, "source": self.source}
        data["gemm"] = self.gemm
        data["keep"] = list(self.keep)
        for role in ROLES:
            data[role] = self.spec(role).to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        """The recipe `to_dict` wrote (ValueError naming unknown keys)."""
        check_keys(cls, data)
        fields = dict(data)
        for role in ROLES:
            if role in fields:
                fields[role] = QuantSpec.from_dict(fields[role])
        if "keep" in fields:
            fields["keep"] = tuple(fields["keep"])
        return cls(**fields)


def nvfp4_rotation(rht: object) -> int | None:
    """`nvfp4`'s ``rht`` as the RHT size: True is TE's 16, False none, an int one of the
    Hadamard sizes (ValueError/TypeError naming ``rht`` and the allowed values)."""
    allowed = ", ".join(map(str, HADAMARD_SIZES))
    if isinstance(rht, bool):
        return 16 if rht else None
    if not isinstance(rht, int):
        raise TypeError(f"rht must be a bool or a Hadamard size ({allowed}); got {rht!r}")
    if rht not in HADAMARD_SIZES:
        raise ValueError(f"rht must be True (16), False or a Hadamard size in {allowed}; got {rht}")
    return rht


def nvfp4(
    rht: bool | int = True,
    stochastic_rounding: bool = True,
    weight_2d: bool = True,
    *,
    seed: int = 0,
    keep: tuple[str, ...] = (),
    tensor_scale: str = "amax",
    amax_history: int = 1,
) -> Recipe:
    """NVIDIA's NVFP4 training recipe, as Transformer Engine's ``NVFP4BlockScaling``
    (transformer_engine/common/recipe; NVIDIA, "Pretraining Large Language Models with
    NVFP4", 2025): every operand NVFP4 (16 e2m1 elements, e4m3 block scale, fp32 tensor
    scale from the tensor's amax):

    - x, in fprop and wgrad: 1x16 blocks, round to nearest; in wgrad after a 16-point RHT
      along the tokens, with its own tensor scale (the rotated copy's amax);
    - W, in fprop and dgrad: 16x16 2-D blocks, round to nearest (so the dgrad W is the
      exact transpose of the fprop W);
    - dy, in dgrad and wgrad: 1x16 blocks, stochastic rounding; in wgrad after the same
      16-point RHT, with its own tensor scale.

    The switches are TE's: ``rht`` (its ``disable_rht`` negated), ``stochastic_rounding``
    (``disable_stochastic_rounding`` negated), ``weight_2d`` (``disable_2d_quantization``
    negated; False gives W 1x16 blocks); ``rht`` may also be a Hadamard size (16, 32, 64,
    128, 256; True is TE's 16).  TE's RHT uses one fixed sign vector and computes the
    rotation in bf16 (``rht_bf16``).  ``keep``: module-path regexes left in bf16 (TE's
    advice: the first and last blocks and the LM head, for instance ``("lm_head",)``).
    ``tensor_scale``, ``amax_history``: every role's (`QuantSpec`; TE's NVFP4 has no "delayed",
    nor "pow2", which spares a GPU without FP4 tensor cores its GEMMs' scaling pass).
    """
    weight_block = (16, 16) if weight_2d else None
    rotation = nvfp4_rotation(rht)
    grad_mode = "sr" if stochastic_rounding else "rne"
    scaled: dict[str, Any] = {"tensor_scale": tensor_scale, "amax_history": amax_history}
    rotated: dict[str, Any] = {"rht": rotation, "rht_bf16": bool(rotation), **scaled}
    return Recipe(
        name="nvfp4",
        fprop_input=QuantSpec("nvfp4", **scaled),
        fprop_weight=QuantSpec("nvfp4", block=weight_block, **scaled),
        dgrad_grad_output=QuantSpec("nvfp4", grad_mode, **scaled),
        dgrad_weight=QuantSpec("nvfp4", block=weight_block, **scaled),
        wgrad_grad_output=QuantSpec("nvfp4", grad_mode, **rotated),
        wgrad_input=QuantSpec("nvfp4", **rotated),
        seed=seed,
        source="Transformer Engine NVFP4BlockScaling; NVIDIA, Pretraining LLMs with NVFP4 (2025)",
        keep=keep,
    )


def mxfp4_tseng(*, rht: int = 64, seed: int = 0, keep: tuple[str, ...] = ()) -> Recipe:
    """Tseng et al., "Training LLMs with MXFP4" (AISTATS 2025), Algorithm 1: the forward
    GEMM in high precision (passthrough); both backward GEMMs in MXFP4 with every operand
    rounded stochastically, the ``floor-3/4`` scale rule (no element can clip, so SR stays
    unbiased) and a random Hadamard transform of ``rht`` (64) values along the contraction
    axis, with fresh signs every step shared by the GEMM's two operands (the rotations
    cancel in the product)."""
    spec = QuantSpec("mxfp4", "sr", scale_rule="floor-3/4", rht=rht, rht_signs="per_step")
    return Recipe(
        name="mxfp4_tseng",
        dgrad_grad_output=spec,
        dgrad_weight=spec,
        wgrad_grad_output=spec,
        wgrad_input=spec,
        seed=seed,
        source="Tseng, Yu, Park: Training LLMs with MXFP4 (AISTATS 2025), Algorithm 1",
        keep=keep,
    )


def mxfp8(*, seed: int = 0, keep: tuple[str, ...] = ()) -> Recipe:
    """Transformer Engine's ``MXFP8BlockScaling`` (default ``Format.E4M3``): every operand
    MXFP8 e4m3 (blocks of 32 along the contraction axis), E8M0 scales by the ``rceil`` rule
    (cuBLAS's), elements rounded to nearest even."""
    spec = QuantSpec("mxfp8_e4m3", scale_rule="rceil")
    roles: dict[str, Any] = dict.fromkeys(ROLES, spec)
    return Recipe(
        name="mxfp8",
        **roles,
        seed=seed,
        source="Transformer Engine MXFP8BlockScaling (E4M3, rceil scales)",
        keep=keep,
    )


def fp8(*, native: bool = False, seed: int = 0, keep: tuple[str, ...] = ()) -> Recipe:
    """Transformer Engine's ``Float8CurrentScaling`` with ``Format.HYBRID``: per-tensor
    current scaling (one fp32 scale ``amax / max`` per tensor, from this step's amax), e4m3
    for the forward tensors (x and W, in every GEMM) and e5m2 for the gradient dy, round
    to nearest even.  TE multiplies by ``max / amax`` where this divides by ``amax / max``
    (`stochround.blocks.scales.absmax_scales`): the elements can differ where the fp32
    reciprocal rounds.  ``native``: the GEMMs on the FP8 tensor cores (``gemm="native"``,
    sm89+) instead of the exact emulation."""
    if not isinstance(native, bool):
        raise TypeError(f"native must be a bool, got {type(native).__name__}")
    forward = QuantSpec("fp8_e4m3_tensor")
    gradient = QuantSpec("fp8_e5m2_tensor")
    return Recipe(
        name="fp8",
        fprop_input=forward,
        fprop_weight=forward,
        dgrad_grad_output=gradient,
        dgrad_weight=forward,
        wgrad_grad_output=gradient,
        wgrad_input=forward,
        seed=seed,
        source="Transformer Engine Float8CurrentScaling, Format.HYBRID",
        keep=keep,
        gemm="native" if native else "emulated",
    )


BWD_STOCHASTIC_ROUNDINGS: tuple[str | None, ...] = (None, "uniform")


def int8(
    bwd_stochastic_rounding: str | None = "uniform",
    *,
    noise: str = "element",
    seed: int = 0,
    keep: tuple[str, ...] = (),
) -> Recipe:
    """Qwix's int8 QAT rule (``QtRule(weight_qtype=int8, act_qtype=int8, bwd_qtype=int8,
    bwd_stochastic_rounding="uniform")``): every operand int8 with a row-wise absmax scale
    along the contraction axis, the forward operands and the backward weights and inputs
    rounded to nearest, the gradient dy rounded stochastically in both backward GEMMs
    (``bwd_stochastic_rounding=None``: to nearest).

    ``noise="element"`` (the default) draws one random word per element: exact SR, each
    element unbiased and independent.  ``noise="row"`` reproduces Qwix, whose uniform noise
    varies along the cotangent's first axis only (``channelwise_noise_axes=(0,)``): one
    value per token, shared by the token's output features.  Each element is still
    unbiased, but the errors of one token are correlated (they share a threshold): in
    dgrad, which sums along a token's features, a row's sum then has a larger variance
    than with independent noise.
    """
    if bwd_stochastic_rounding not in BWD_STOCHASTIC_ROUNDINGS:
        raise ValueError(
            "bwd_stochastic_rounding must be one of 'uniform', None; "
            f"got {bwd_stochastic_rounding!r}"
        )
    check_choice("noise", noise, NOISE_POLICIES)
    nearest = QuantSpec("int8_rowwise")
    if bwd_stochastic_rounding is None:
        grad = nearest
    else:
        grad = QuantSpec("int8_rowwise", "sr", noise=noise)
    return Recipe(
        name="int8",
        fprop_input=nearest,
        fprop_weight=nearest,
        dgrad_grad_output=grad,
        dgrad_weight=nearest,
        wgrad_grad_output=grad,
        wgrad_input=nearest,
        seed=seed,
        source='Qwix QtRule(int8, bwd_stochastic_rounding="uniform")',
        keep=keep,
    )


def bf16(*, seed: int = 0) -> Recipe:
    """No quantization: every operand passes through (the baseline)."""
    return Recipe(name="bf16", seed=seed, source="no quantization")


RECIPES = {
    "bf16": bf16,
    "nvfp4": nvfp4,
    "mxfp4_tseng": mxfp4_tseng,
    "mxfp8": mxfp8,
    "fp8": fp8,
    "int8": int8,
}


__all__ = [
    "FORMAT_NAMES",
    "GEMMS",
    "GEMM_KINDS",
    "MAX_AMAX_HISTORY",
    "NOISE_POLICIES",
    "PASSTHROUGH",
    "RECIPES",
    "ROLES",
    "SIGN_POLICIES",
    "TENSOR_FORMATS",
    "TENSOR_SCALE_POLICIES",
    "QuantSpec",
    "Recipe",
    "bf16",
    "fp8",
    "int8",
    "mxfp4_tseng",
    "mxfp8",
    "nvfp4",
    "spec_words",
]
