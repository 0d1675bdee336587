"""How one GEMM operand is quantized: `QuantSpec` (block format, rounding, scale rule, blocks,
RHT, NVFP4's tensor scale, noise, hardware preset), the values its options take, and its
one-line description (`spec_words`).  `stochround.nn.recipes` gives each of a layer's six
operands one (a `Recipe`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..block_constants import HADAMARD_SIZES
from ..blocks import BLOCK_FORMATS, BlockFormat
from ..blocks.formats import check_block
from ..blocks.request import resolve_block_format
from ..formats import format as find_format
from ..presets import preset
from ..reference import VARIANTS, check_choice, check_mode, check_rbits

SIGN_POLICIES: tuple[str, ...] = ("fixed", "per_step")
TENSOR_SCALE_POLICIES: tuple[str, ...] = ("amax", "delayed", "none", "pow2")
# the longest amax history of a delayed tensor scale (TE's default ``amax_history_len``)
MAX_AMAX_HISTORY = 1024
NOISE_POLICIES: tuple[str, ...] = ("element", "row")

# Per-tensor scaled FP8 (Transformer Engine's current scaling): one fp32 scale
# ``amax / max`` for the whole tensor, which the layer flattens into a single row so that
# the row-wise ``absmax`` rule gives one scale
_FP32 = find_format("binary32")
TENSOR_FORMATS: dict[str, BlockFormat] = {
    "fp8_e4m3_tensor": BlockFormat("fp8_e4m3_tensor", find_format("e4m3fn"), None, _FP32, "absmax"),
    "fp8_e5m2_tensor": BlockFormat("fp8_e5m2_tensor", find_format("e5m2"), None, _FP32, "absmax"),
}
FORMAT_NAMES: tuple[str, ...] = (*BLOCK_FORMATS, *TENSOR_FORMATS)


def check_keys(cls: type, data: dict[str, Any]) -> None:
    """ValueError naming the keys of ``data`` that are not fields of the dataclass ``cls``
    (what `to_dict` wrote is read back by ``from_dict``)."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} keys {sorted(unknown)}; known: {', '.join(sorted(known))}"
        )


@dataclass(frozen=True)
class QuantSpec:
    """How one GEMM operand is quantized: ``fake_quantize`` along the contraction axis.

    Args:
        format: a block format name (`stochround.blocks.BLOCK_FORMATS`), or
            ``"fp8_e4m3_tensor"`` / ``"fp8_e5m2_tensor"`` (one fp32 scale ``amax / max``
            for the whole tensor, `TENSOR_FORMATS`), or None: no quantization, the operand
            enters the GEMM as it is (bf16 in a bf16 model).
        mode: the elements' rounding mode (rne, rna, rz, ru, rd, ro, sr).
        rbits, variant: limited-bit SR (1..32 bits, None: exact) and its variant a/b/c/odd.
        scale_rule: replaces the format's scale rule (None: the format's).
        block: replaces the format's block: an int, a 2-D tile ``(rows, cols)`` of the
            operand laid out with the contraction axis last, or None (the format's).
        rht: the size of a random Hadamard transform along the contraction axis before
            quantizing (16..256), or None.
        rht_signs: "fixed" (the library's one fixed sign vector, as Transformer Engine) or
            "per_step" (fresh signs each step, shared by the GEMM's two operands).
        rht_bf16: round the rotated values to bf16 before the amax (as Transformer Engine).
        tensor_scale: NVFP4's per-tensor scale: "amax" (from the operand's amax, after the
            RHT: a rotated copy has its own), "delayed" (from the largest amax recorded
            over the role's previous ``amax_history`` steps: `stochround.nn.amax_history`),
            "none" (single-level) or "pow2" (the amax's rounded up to a power of two, which
            the GEMM operand holds in its values: `stochround.blocks.scales`).
        noise: "element" (one random word per element) or "row" (Qwix's channelwise
            noise: one word per index of the first axis of the tensor the layer holds,
            x and dy: per token, W: per output feature, shared along the other axis;
            absmax formats only).
        hardware: a hardware SR preset for the elements (`stochround.hardware`), for
            instance ``"transformer-engine-sr-e2m1"``, Transformer Engine's software SR on
            GPUs without ``cvt.rs``; with mode "sr", rbits and variant left at their
            defaults (the preset sets them), per-element noise and a block format whose
            elements are the preset's target. None: the core's SR.
        amax_history: how many previous steps a delayed scale's amax is the largest of,
            in [1, `MAX_AMAX_HISTORY`]; 1 unless delayed.
    """

    format: str | None = None
    mode: str = "rne"
    rbits: int | None = None
    variant: str = "c"
    scale_rule: str | None = None
    block: int | tuple[int, int] | None = None
    rht: int | None = None
    rht_signs: str = "fixed"
    rht_bf16: bool = False
    tensor_scale: str = "amax"
    noise: str = "element"
    hardware: str | None = None
    amax_history: int = 1

    def __post_init__(self) -> None:
        if self.format is not None:
            check_choice("format", self.format, FORMAT_NAMES)
        object.__setattr__(self, "mode", check_mode(self.mode))
        if self.rbits is not None:
            if self.mode != "sr":
                raise ValueError(f"rbits applies to mode='sr' only; got mode={self.mode!r}")
            check_rbits(self.rbits)
        check_choice("variant", self.variant, VARIANTS)
        # from_dict gives a 2-D block as a JSON list
        block = tuple(self.block) if isinstance(self.block, list) else self.block
        object.__setattr__(self, "block", check_block(block))
        if self.rht is not None and (isinstance(self.rht, bool) or self.rht not in HADAMARD_SIZES):
            allowed = ", ".join(map(str, HADAMARD_SIZES))
            raise ValueError(f"rht must be None or a Hadamard size in {allowed}; got {self.rht!r}")
        check_choice("rht_signs", self.rht_signs, SIGN_POLICIES)
        if not isinstance(self.rht_bf16, bool):
            raise TypeError(f"rht_bf16 must be a bool, got {type(self.rht_bf16).__name__}")
        if self.rht_bf16 and self.rht is None:
            raise ValueError("rht_bf16=True applies with rht= (the Hadamard size); got rht=None")
        check_choice("tensor_scale", self.tensor_scale, TENSOR_SCALE_POLICIES)
        self._check_amax_history()
        check_choice("noise", self.noise, NOISE_POLICIES)
        if self.format is not None:
            self._check_format()
        elif self.tensor_scale == "delayed":
            raise ValueError("tensor_scale='delayed' applies to a quantized operand (format=None)")

    def _check_amax_history(self) -> None:
        """``amax_history`` an int in [1, `MAX_AMAX_HISTORY`], not 1 only when delayed."""
        history, delayed = self.amax_history, self.tensor_scale == "delayed"
        if isinstance(history, bool) or not isinstance(history, int):
            raise TypeError(f"amax_history must be an int, got {type(history).__name__}")
        if not 1 <= history <= MAX_AMAX_HISTORY or (history != 1 and not delayed):
            raise ValueError(
                f"amax_history must be in [1, {MAX_AMAX_HISTORY}], and applies with "
                f"tensor_scale='delayed'; got {history} with {self.tensor_scale!r}"
            )

    def _check_format(self) -> None:
        """The format with the block and rule replaced must be a valid `BlockFormat`, and
        the options must apply to it."""
        fmt = self.block_format()
        if self.noise == "row" and (self.mode != "sr" or fmt.scale_rule != "absmax"):
            raise ValueError(
                "noise='row' (one random word per row) applies to mode='sr' with an absmax "
                f"(row-scaled) format; got mode={self.mode!r}, format={self.format!r}"
            )
        if self.noise == "row" and self.rht is not None:
            raise ValueError(f"noise='row' applies without rht; got rht={self.rht}")
        if isinstance(fmt.block, tuple) and self.rht is not None:
            raise ValueError(f"rht applies to 1-D blocks; got block={fmt.block}")
        if self.format in TENSOR_FORMATS and self.block is not None:
            raise ValueError(f"{self.format} has one scale per tensor: block must be None")
        # delayed tensor scales are built for NVFP4's (TE's FP8 ``DelayedScaling`` is not)
        if self.tensor_scale == "delayed" and self.format in TENSOR_FORMATS:
            raise NotImplementedError(f"tensor_scale='delayed' is not built for {self.format}")
        if self.tensor_scale in ("delayed", "pow2") and not fmt.tensor_scale:
            wanted = f"tensor_scale={self.tensor_scale!r}"
            raise ValueError(f"{wanted} needs a per-tensor scale (nvfp4): {fmt.name}")
        if self.hardware is not None:
            self._check_hardware(fmt)

    def _check_hardware(self, fmt: BlockFormat) -> None:
        """The preset must exist, round to the format's elements, and be the only SR choice."""
        if self.mode != "sr" or self.rbits is not None or self.variant != "c":
            raise ValueError(
                f"hardware={self.hardware!r} is an SR unit that sets rbits and variant: pass "
                "mode='sr' and leave rbits and variant at their defaults"
            )
        if self.noise != "element" or self.format in TENSOR_FORMATS:
            raise ValueError("hardware= applies to block formats with per-element noise")
        unit = preset(str(self.hardware), fmt.element)
        if unit.target != fmt.element:
            raise ValueError(
                f"hardware={self.hardware!r} rounds to {unit.target.name}, not to the elements "
                f"of {self.format} ({fmt.element.name})"
            )

    @property
    def quantized(self) -> bool:
        """Whether the operand is quantized at all (False: it enters the GEMM as it is)."""
        return self.format is not None

    @property
    def nvfp4_flavour(self) -> str:
        """NVFP4's scales' flavour (`stochround.blocks.scales`): "pow2" or TE's."""
        return "pow2" if self.tensor_scale == "pow2" else "te"

    @property
    def stochastic(self) -> bool:
        """Whether the operand is rounded stochastically (draws random bits)."""
        return self.format is not None and self.mode == "sr"

    def block_format(self) -> BlockFormat:
        """The operand's `BlockFormat`: the named format with ``block`` and ``scale_rule``
        replaced where given (ValueError for a passthrough spec)."""
        if self.format is None:
            raise ValueError("a QuantSpec with format=None (passthrough) has no block format")
        if self.format in TENSOR_FORMATS:
            return resolve_block_format(TENSOR_FORMATS[self.format], None, self.scale_rule)
        return resolve_block_format(self.format, self.block, self.scale_rule)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-able dict (a 2-D block as a list)."""
        data = dataclasses.asdict(self)
        if isinstance(self.block, tuple):
            data["block"] = list(self.block)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantSpec:
        """The spec `to_dict` wrote (ValueError naming unknown keys)."""
        check_keys(cls, data)
        return cls(**data)


PASSTHROUGH = QuantSpec()


def spec_words(spec: QuantSpec) -> str:
    """One line saying what ``spec`` does: ``nvfp4 16x16 rne``, ``mxfp4 32 sr
    floor-3/4 rht64/per_step``, or ``passthrough``."""
    if spec.format is None:
        return "passthrough"
    fmt = spec.block_format()
    if isinstance(fmt.block, tuple):
        block = f"{fmt.block[0]}x{fmt.block[1]}"
    else:
        block = "tensor" if spec.format in TENSOR_FORMATS else str(fmt.block or "row")
    words = [spec.format, block, spec.mode]
    if spec.mode == "sr" and spec.rbits is not None:
        words.append(f"rbits={spec.rbits}/{spec.variant}")
    if spec.scale_rule is not None:
        words.append(spec.scale_rule)
    if spec.rht is not None:
        words.append(f"rht{spec.rht}/{spec.rht_signs}" + ("/bf16" if spec.rht_bf16 else ""))
    if spec.tensor_scale == "none" and fmt.tensor_scale:
        words.append("single-level")
    if spec.tensor_scale in ("delayed", "pow2"):
        words.append(
            f"delayed-amax/{spec.amax_history}" if spec.tensor_scale == "delayed" else "pow2"
        )
    if spec.noise == "row":
        words.append("row-noise")
    if spec.hardware is not None:
        words.append(f"hardware={spec.hardware}")
    return " ".join(words)


__all__ = [
    "FORMAT_NAMES",
    "MAX_AMAX_HISTORY",
    "NOISE_POLICIES",
    "PASSTHROUGH",
    "SIGN_POLICIES",
    "TENSOR_FORMATS",
    "TENSOR_SCALE_POLICIES",
    "QuantSpec",
    "check_keys",
    "spec_words",
]
