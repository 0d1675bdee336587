"""Hardware SR units as data: named presets that describe the stochastic-rounding units of
shipping hardware (applied by `stochround.round(..., hardware=...)` and analysed by
`stochround.hardware`).

Every unit documented here does the same thing at heart: it adds a random integer to the
bits of the significand that the narrower format drops and keeps the bits above (the carry
is the rounding decision). With ``d`` discarded bits, ``n`` random bits aligned with the
top of them and ``nu`` the discarded fraction in target ulps, the carry happens when

    floor(nu * 2**n) + r >= 2**n,        r uniform in [0, 2**n)

which is the contract's SR variant ``a`` (P3109 StochasticA) with ``n`` random bits: exact SR
when ``n >= d``, and otherwise biased toward zero by less than ``2**-n`` ulp, because the
``d - n`` lowest bits are truncated before the addition. A preset therefore names a
source format (what the instruction reads: a wider input is first rounded to it, to
nearest-even, as a program must do to feed the instruction), the target format, the
variant and ``rbits``, the saturation, and the steps the unit adds around the contract:
only Graphcore's flush to zero below half the smallest subnormal so far.

Random bits: ``rand=`` gives each element's random integer in ``[0, 2**rbits)``, exactly
as the instruction's random operand would hold it after the unit selects its bits; with a
``seed`` the integer is the top ``rbits`` bits of the element's 32-bit counter-based word
(`stochround.random`), which for the AMD instructions is literally the bit field the hardware reads
from its seed operand (``S1[31:12]`` / ``S1[31:11]``).

Presets: ``amd-mi300-fp8`` / ``amd-mi300-bf8`` (FNUZ) and ``amd-mi350-fp8`` /
``amd-mi350-bf8`` (OCP), ``nvidia-cvt-rs-{fp16,bf16,e4m3,e5m2,e2m3,e3m2,e2m1}``,
``graphcore-ipu-fp16``, ``intel-fp16``, ``intel-e5m2`` and ``transformer-engine-sr-e2m1``
(Transformer Engine's software SR, beside ``nvidia-cvt-rs-e2m1``: their sources disagree on
the random bits per value, 8 or 16); a family's name (the preset's without its destination:
``amd-mi300``, ``amd-mi350``, ``nvidia-cvt-rs``, ``graphcore-ipu``, ``intel``,
``transformer-engine-sr``) with the target format picks a preset, as in ``sr.round(x, "e5m2fnuz",
hardware="amd-mi300")``. Each preset's ``description``
says what the unit does, ``source`` which documents say so, ``decisions`` what was chosen
where they disagree or are silent, and ``exact_domain`` where the preset equals
``sr.round(x, target, "sr", rbits=rbits, variant=variant, sat=sat)`` bit for bit.
tests/hardware/test_units.py checks every preset against a bit-level model of its unit and
against that contract: for every random integer where the count fits the test budget
(rbits 13 and 16), around the decision threshold otherwise, and the differences outside
the domain exactly. A variant other than ``a`` or other steps can be tried with
``dataclasses.replace`` (a frozen preset is a value).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from . import reference
from .formats import Format
from .formats import format as find_format

# a float or a tensor, for functions whose body mypy checks for each of the two
FloatOrTensor = TypeVar("FloatOrTensor", float, Tensor)

__all__ = ["FAMILIES", "PRESETS", "HardwarePreset", "family", "preset"]


@dataclass(frozen=True)
class HardwarePreset:
    """A documented hardware SR conversion, expressed as the stochround contract plus the
    unit's own steps.

    ``round_hardware`` computes: ``xs = round(x, source_format, "rne")`` (the instruction's
    operand), then ``round(xs, target_format, "sr", rbits=rbits, variant=variant,
    sat=sat)``, then sets to zero (keeping the sign) every element with
    ``|xs| < flush_below``.  ``description`` states what the hardware does, ``source`` the
    documents it comes from, ``decisions`` what was chosen where they are silent or
    disagree, ``exact_domain`` where the preset equals the plain contract.
    """

    name: str
    source_format: str
    target_format: str
    variant: str
    rbits: int
    description: str
    source: str
    sat: str = "none"
    flush_below: float | None = None
    decisions: str = ""
    exact_domain: str = ""

    def __post_init__(self) -> None:
        find_format(self.source_format)
        find_format(self.target_format)
        reference.check_choice("variant", self.variant, reference.VARIANTS)
        reference.check_choice("sat", self.sat, reference.SATURATIONS)
        reference.check_rbits(self.rbits)
        if self.flush_below is not None and not self.flush_below > 0:
            raise ValueError(f"flush_below must be None or positive, got {self.flush_below!r}")

    @property
    def target(self) -> Format:
        """The target format."""
        return find_format(self.target_format)

    @property
    def operand(self) -> Format:
        """The format the instruction reads its input in."""
        return find_format(self.source_format)

    def flushes(self, operand: FloatOrTensor) -> bool | Tensor:
        """Whether the unit sets operands (values of the source format) to zero: a bool for
        a float, a bool tensor for a tensor (False where the unit flushes nothing)."""
        if self.flush_below is None:
            return False
        return abs(operand) < self.flush_below

    def flush(self, operand: Tensor, result: Tensor) -> Tensor:
        """``result`` with the elements whose operand the unit flushes set to zero (float64
        tensors of one shape; the zero keeps the operand's sign where the target has -0)."""
        if self.flush_below is None:
            return result
        zero = torch.zeros_like(operand)
        if self.target.has_negative_zero:
            zero = torch.copysign(zero, operand)
        flushed = self.flushes(operand)
        assert isinstance(flushed, Tensor)  # a tensor operand with a threshold: a bool tensor
        return torch.where(flushed, zero, result)

    def contract_arguments(self) -> dict[str, object]:
        """Keyword arguments of ``sr.round`` for the contract part of this preset."""
        return {
            "fmt": self.target_format,
            "mode": "sr",
            "rbits": self.rbits,
            "variant": self.variant,
            "sat": self.sat,
        }


_PTX = "NVIDIA PTX ISA (9.x), cvt instruction: the .rs rounding modifier and the rbits operand"
_PTX_DESTINATIONS = {
    # destination: (stochround format, PTX type, random bits per value, saturation, note)
    "fp16": ("binary16", ".f16x2", 13, "none", "the 13 LSBs of its 16-bit half of rbits"),
    "bf16": ("bfloat16", ".bf16x2", 16, "none", "its whole 16-bit half of rbits"),
    "e4m3": ("e4m3fn", ".e4m3x4", 16, "finite", "the 16-bit half of rbits its pair shares"),
    "e5m2": ("e5m2", ".e5m2x4", 16, "finite", "the 16-bit half of rbits its pair shares"),
    "e2m3": ("e2m3", ".e2m3x4", 16, "finite", "the 16-bit half of rbits its pair shares"),
    "e3m2": ("e3m2", ".e3m2x4", 16, "finite", "the 16-bit half of rbits its pair shares"),
    "e2m1": ("e2m1", ".e2m1x4", 16, "finite", "the two bytes of rbits its pair shares"),
}


def _nvidia_preset(destination: str) -> HardwarePreset:
    fmt_name, ptx_type, bits, sat, layout = _PTX_DESTINATIONS[destination]
    fmt = find_format(fmt_name)
    dropped = 23 - fmt.mbits
    packed = ptx_type.endswith("x4")
    exactness = (
        "exact SR for every fp32 input, subnormals included: bf16 shares fp32's exponent "
        "range, so 16 bits are dropped at every magnitude"
        if destination == "bf16"
        else f"exact SR for fp32 inputs with a normal {destination} result ({dropped} bits "
        f"dropped, {bits} random)"
        if bits >= dropped
        else f"SR with {bits} of the {dropped} dropped bits (variant a truncates the lowest "
        f"{dropped - bits}: bias toward zero below 2**-{bits} ulp)"
    )
    description = (
        f"cvt.rs{'.satfinite' if sat == 'finite' else ''}{ptx_type}.f32 (sm_100a and later): "
        f"each fp32 operand is rounded to {destination} by adding {bits} random bits, "
        f"{layout}, to the bits below the {destination} ulp and truncating; the carry rounds "
        f"away from zero. {exactness}."
        + (
            " .satfinite is mandatory for this destination: overflow and infinities give "
            + ("+-MAX_NORM, NaN stays NaN." if fmt.has_nan else "+-MAX_NORM (NaN: see decisions).")
            if sat == "finite"
            else " Without .satfinite an overflow gives +-inf (the preset's sat='none'); "
            "with it, use dataclasses.replace(preset, sat='finite')."
        )
    )
    decisions = (
        "Subnormal results: the PTX ISA does not say how the random bits align when the "
        f"result is subnormal; the preset keeps them aligned with the top of the {destination} "
        "ulp (variant a with the same n), the behaviour established from GPU captures for "
        "AMD's equivalent instruction, so extra dropped bits are truncated. "
        "Random bits: seed mode gives each element its own word; the instruction's bit "
        "selection from one rbits register (and the correlation it creates between the "
        "values sharing it) is not modelled: pass rand= with the bits you extracted."
    )
    if packed:
        decisions += (
            " Bit count: the ISA gives a 16-bit field to each pair of operands (a, b: upper; "
            "e, f: lower); a public measurement on sm_100a (cvt.rs.satfinite.e4m3x4.f32) "
            "found 16 random bits per value, P(up) = floor(frac20 / 16) / 2**16, one operand "
            "of the pair seeing the field bit-reversed. The preset uses 16 random bits per "
            f"value for every x4 destination; for {destination} that is "
            + ("measured." if destination == "e4m3" else "carried over from the e4m3 measurement.")
        )
    if not fmt.has_nan:
        decisions += (
            f" NaN inputs: {destination} has no NaN code and the ISA text available did not "
            "say which code .satfinite writes for NaN; the emulation returns NaN to flag it."
        )
    exact_domain = (
        f"fp32 inputs (and any input, after its rounding to fp32): equal to sr.round(x, "
        f"'{fmt_name}', 'sr', rbits={bits}, variant='a', sat='{sat}') everywhere, subnormal "
        "results included (a consequence of the decision above)"
    )
    return HardwarePreset(
        name=f"nvidia-cvt-rs-{destination}",
        source_format="binary32",
        target_format=fmt_name,
        variant="a",
        rbits=bits,
        sat=sat,
        description=description,
        source=(
            f"{_PTX}, section on cvt ({ptx_type}: how rbits feeds each operand); "
            "measured per-value behaviour of cvt.rs.satfinite.e4m3x4.f32 on sm_100a recorded "
            "in public kernel code (16 random bits per value)."
        ),
        decisions=decisions,
        exact_domain=exact_domain,
    )


_AMD_SOURCE = (
    "AMD Instinct MI300 (CDNA3) and MI350 (CDNA4) ISA reference guides, V_CVT_SR_FP8_F32 / "
    "V_CVT_SR_BF8_F32 (src0 the fp32 value, src1 the 32-bit seed whose high bits, S1[31:12] "
    "for fp8, are added to the fp32 mantissa); ROCm's host reference for the MI300 "
    "conversion (hip_f8_impl cast_to_f8: denormalize, add the random bits under a mask of "
    "the bits a normal result drops, truncate); an open-source RDNA4 instruction emulator "
    "whose NaN, infinity and subnormal stochastic behaviour was established from GPU "
    "captures (align to the minimum normal exponent first, no sticky bit, add seed >> 12 "
    "for fp8 or seed >> 11 for bf8, truncate); LLVM/MLIR AMDGPU notes that gfx942 (MI300) "
    "converts to the FNUZ fp8 types and gfx950 (MI350) to the OCP ones (LLVM lowers an "
    "SR conversion to Float8E4M3FN to v_cvt_sr_fp8_f32 on gfx950)."
)


def _amd_preset(chip: str, kind: str) -> HardwarePreset:
    fnuz = chip == "mi300"
    fmt_name = {
        ("fp8", True): "e4m3fnuz",
        ("bf8", True): "e5m2fnuz",
        ("fp8", False): "e4m3fn",
        ("bf8", False): "e5m2",
    }[kind, fnuz]
    fmt = find_format(fmt_name)
    bits = 23 - fmt.mbits
    field_bits = f"[31:{32 - bits}]"
    instruction = f"V_CVT_SR_{kind.upper()}_F32"
    description = (
        f"{instruction} on {chip.upper()}: fp32 src0 to {fmt_name} with the 32-bit seed in "
        f"src1. Bits {field_bits} of the seed ({bits} bits, the number of fp32 mantissa bits "
        f"a normal {fmt_name} result drops) are added to the dropped bits and the result is "
        "truncated; the carry rounds away from zero and propagates into the exponent. Exact "
        f"SR for every fp32 input with a normal {fmt_name} result. A subnormal result drops "
        f"{bits} + k bits: the unit first shifts the significand right by k (those bits are "
        f"lost, no sticky bit), then adds the same {bits} random bits: variant a with "
        f"n = {bits}, biased toward zero by less than 2**-{bits} ulp there."
    )
    decisions = (
        "Seed bits: the ISA pseudocode adds the seed's high bits (S1[31:12] for fp8); ROCm's "
        "host reference masks the low bits (rng & drop_mask). Both give a uniform integer; "
        "the preset follows the ISA (r = seed >> "
        f"{32 - bits}), which is also stochround's word convention, so seed= words are the "
        "src1 values bit for bit. "
        "Subnormal results: the ISA pseudocode adds the seed to the mantissa at fixed fp32 "
        "positions and says nothing about denormalization; the host reference and the "
        "capture-based emulator both denormalize first and add the random bits below the "
        "target ulp, so the preset does (variant a with n = "
        f"{bits} everywhere). "
        "Overflow: without the clamp (MODE.FP16_OVFL clear) a finite overflow gives "
        + ("NaN (FNUZ formats have no infinity)" if fnuz else "NaN (e4m3fn) or inf (e5m2)")
        + ", the preset's sat='none'; with the clamp set, finite overflow saturates and "
        "infinity and NaN keep their special result: use "
        "dataclasses.replace(preset, sat='propagate')."
    )
    return HardwarePreset(
        name=f"amd-{chip}-{kind}",
        source_format="binary32",
        target_format=fmt_name,
        variant="a",
        rbits=bits,
        sat="none",
        description=description,
        source=_AMD_SOURCE,
        decisions=decisions,
        exact_domain=(
            f"every input (after rounding to fp32): equal to sr.round(x, '{fmt_name}', 'sr', "
            f"rbits={bits}, variant='a'), which is exact SR wherever the result is normal"
        ),
    )


_GRAPHCORE_FLUSH = float(find_format("binary16").min_subnormal) / 2  # 2**-25

_GRAPHCORE = HardwarePreset(
    name="graphcore-ipu-fp16",
    source_format="binary32",
    target_format="binary16",
    variant="a",
    rbits=24,
    sat="propagate",
    flush_below=_GRAPHCORE_FLUSH,
    description=(
        "Graphcore IPU fp32 -> fp16 conversion with stochastic rounding enabled (FP_CTL.ESR): "
        "arithmetic is fp32, so the operand is fp32 (a wider value is rounded to fp32 first). "
        "A random number is masked to the bits fp16 drops and added to the fp32 mantissa; the "
        "carry goes into the kept bits and the rest is truncated. The mask is 13 bits for a "
        "normal fp16 result and grows by one bit per binade below 2**-14, so every fp32 input "
        "down to 2**-25 gets exact SR (13 to 24 random bits); magnitudes below 2**-25, half "
        "the smallest fp16 subnormal, become zero. The preset draws a 24-bit r and the unit "
        "uses its top 13 + k bits: for a value with d <= 24 dropped bits, variant a with 24 "
        "bits equals variant a with the top d bits of r, so one 24-bit r per element "
        "reproduces the whole range."
    ),
    source=(
        "Graphcore, 'AI-Float' white paper (IPU mixed precision: fp32 results rounded back "
        "to fp16 by round-to-nearest-even or stochastic rounding) and the IPU TensorFlow user "
        "guides ('Half-precision floating point and stochastic rounding': the esr bit enables "
        "the SR unit, nanoo selects clipping or NaN on fp16 overflow); Graphcore patent "
        "'Converting floating point numbers to reduce the precision' (US 11,169,778 B2, "
        "GB 2580153): random bits masked to a length set by the difference between the "
        "exponent and fp16's minimum exponent, added to the mantissa, carry into the "
        "truncated result."
    ),
    decisions=(
        "Random bits: the documents give no count; 13 for normal results is the number of "
        "dropped bits (the patent sizes the random number by the precision difference), and "
        "the subnormal mask growing one bit per binade reaches the whole 24-bit significand "
        "at 2**-25, hence 24 at most. Below 2**-25 the preset flushes to zero, the "
        "behaviour the project's specification gives for the unit (the stored documents "
        "did not include the text of that rule; it is where the mask would have to exceed "
        "the significand). "
        "Overflow: the default (nanoo off) clips a finite overflow to +-65504; an infinite "
        "operand stays infinite (it is not an overflow), hence sat='propagate'. With nanoo "
        "on, overflow gives NaN, which the preset does not model. Flushed values keep their "
        "sign."
    ),
    exact_domain=(
        "fp32 inputs with |x| >= 2**-25: equal to sr.round(x, 'binary16', 'sr', rbits=24, "
        "variant='a', sat='propagate'), which is exact SR there. Below 2**-25 the hardware "
        "gives +-0 for every r, while the contract rounds away with probability "
        "floor(nu 2**24) / 2**24 (nonzero from 2**-48 up)"
    ),
)

_INTEL_PATENT = (
    "Intel patent family 'Instructions to convert from FP16 to BF8' (Heinecke, Mellempudi "
    "et al.; US 2022/0206805 A1, US 12,423,102 B2, continuations US 12,367,045 B2 and "
    "US 2025/0117218 A1): packed fp16 converted to bf8 'using bias terms' from a third "
    "operand"
)

_INTEL_E5M2 = HardwarePreset(
    name="intel-e5m2",
    source_format="binary16",
    target_format="e5m2",
    variant="a",
    rbits=8,
    sat="none",
    description=(
        "fp16 -> bf8 (e5m2) with a per-element 8-bit bias (AVX10.2 VCVTBIASPH2BF8): bf8 is the "
        "upper byte of fp16 (same sign, 5-bit exponent with bias 15, top 2 mantissa bits), so "
        "the unit adds the 8-bit bias to the fp16 bit pattern as an integer and keeps the "
        "upper byte. With a uniform random bias that is SR with 8 random bits for the 8 "
        "dropped bits at every magnitude, subnormals included: exact SR for every fp16 input. "
        "A carry out of the largest finite value gives infinity; infinities stay infinite "
        "and NaN stays NaN (quieted)."
    ),
    source=(
        f"{_INTEL_PATENT}; Intel AVX10.2 Architecture Specification, VCVTBIASPH2BF8 / "
        "VCVTBIASPH2BF8S; the GCC test-suite reference model of the conversion (integer add "
        "of the bias byte to the fp16 pattern, upper byte kept, saturating form clamping an "
        "overflow to the largest finite code)."
    ),
    decisions=(
        "Saturation: the preset models the non-saturating form (overflow to infinity, "
        "sat='none'); the S form saturates finite overflow and keeps infinities: "
        "dataclasses.replace(preset, sat='propagate'). An input wider than fp16 is rounded "
        "to fp16 (nearest-even) first, as a program must do to feed the instruction."
    ),
    exact_domain=(
        "every fp16 input: equal to sr.round(x, 'e5m2', 'sr', rbits=8, variant='a'), which "
        "is exact SR for all of them"
    ),
)

_INTEL_FP16 = HardwarePreset(
    name="intel-fp16",
    source_format="binary32",
    target_format="binary16",
    variant="a",
    rbits=13,
    sat="none",
    description=(
        "fp32 -> fp16 with a per-element 13-bit random bias added to the 13 mantissa bits "
        "fp16 drops, then truncation (the bias-add-truncate scheme of Intel's FP16 -> BF8 "
        "conversion, one level up): exact SR for every fp32 input with a normal fp16 result; "
        "overflow to infinity."
    ),
    source=(
        f"{_INTEL_PATENT}, as the scheme; the fp32 -> fp16 width (13 random bits) as the "
        "project's specification attributes it to the Intel patent."
    ),
    decisions=(
        "The text of an Intel document for an fp32 -> fp16 biased conversion was not "
        "available to check; the preset encodes the specification's 13 random bits and "
        "the same add-and-truncate rule. Unlike fp16 -> bf8, the exponent ranges differ, so "
        "subnormal fp16 results need a decision: the random bits stay aligned with the top "
        "of the dropped bits (variant a with n = 13, as AMD's unit does), extra dropped bits "
        "are truncated. Overflow: infinity (sat='none')."
    ),
    exact_domain=(
        "fp32 inputs (any input, after rounding to fp32): equal to sr.round(x, 'binary16', "
        "'sr', rbits=13, variant='a') everywhere; exact SR wherever the fp16 result is normal"
    ),
)


_TRANSFORMER_ENGINE_E2M1 = HardwarePreset(
    name="transformer-engine-sr-e2m1",
    source_format="binary32",
    target_format="e2m1",
    variant="a",
    rbits=8,
    sat="finite",
    description=(
        "Transformer Engine's software stochastic rounding to e2m1 (its NVFP4 path on GPUs "
        "without cvt.rs, ptx::stochastic_round_fp4_e2m1): for a scaled fp32 value x with "
        "a = |x|, u = r / 256 from 8 random bits r and the e2m1 step s at a (0.5 below 2, "
        "1 in [2, 4), 2 from 4), t = fmaf(u, s, a), and the result is floor(t / s_t) * s_t "
        "with s_t the step at t, clamped to 6, with x's sign: in exact arithmetic it rounds "
        "away when floor(nu 2**8) + r >= 2**8 (nu the dropped fraction in ulps), variant a "
        "with 8 random bits, which is gfloat's StochasticFastest with srnumbits=8. Values "
        "above 6 and infinities saturate to +-6 (the satfinite behaviour). e2m1 drops 22 "
        "bits of an fp32 significand, so 8 random bits truncate the lowest 14: a bias "
        "toward zero below 2**-8 ulp."
    ),
    source=(
        "NVIDIA Transformer Engine (github.com/NVIDIA/TransformerEngine), "
        "transformer_engine/common/util/ptx.cuh: stochastic_round_fp4_e2m1 ('Software "
        "stochastic rounding onto the e2m1 grid, for architectures without cvt.rs. Takes 8 "
        "random bits per element, which is what cvt.rs.satfinite.e2m1x4.f32 takes from its "
        "rbits operand'); its callers in util/ptx_arch_spec.cuh and "
        "transpose/quantize_transpose_vector_blockwise_fp4.cu give the four values of an "
        "e2m1x4 group the bytes 0..3 of one 32-bit word (rbits, rbits >> 8, >> 16, >> 24), "
        "and cast/nvfp4/core_nvfp4.cuh (get_rbits) takes those words in turn from one "
        "Philox4x32 call (curanddx), so one Philox call serves 16 values. The issue text "
        "(TE reports the distributions match cvt.rs) and gfloat's RoundMode.StochasticFastest."
    ),
    decisions=(
        "The sources disagree on cvt.rs for e2m1: TE's comment reads the PTX rbits operand "
        "of cvt.rs.satfinite.e2m1x4.f32 as 8 random bits per value, while the "
        "nvidia-cvt-rs-e2m1 preset follows the PTX ISA read as a 16-bit field per pair of "
        "operands, and a measurement on sm_100a found 16 bits per value (for e4m3x4). Both "
        "presets are kept, each named for its source: this one for TE's software path, "
        "nvidia-cvt-rs-e2m1 for the instruction. "
        "Random bits: with a seed, each element's 8 bits are the top 8 bits of its own "
        "stochround word (random_words of its global index), not TE's byte of a word shared "
        "by four values from TE's Philox stream: the same distribution (uniform, independent "
        "across elements), not TE's bits. To reproduce TE's bits, pass rand= with the bytes "
        "extracted from TE's words. "
        "fp32 arithmetic: TE forms t = fmaf(u, s, a) with one rounding to fp32. Where a is "
        "below 0.25 and carries bits below t's ulp, within 2**-26 under a multiple of "
        "2**-9, that rounding can land t on 0.5 and round up for one integer r more than "
        "the exact rule; the preset follows the exact rule (variant a), as gfloat does. "
        "NaN: TE returns +6 for a NaN input (fminf drops the NaN); the preset returns NaN, "
        "stochround's flag for a value e2m1 cannot hold (an encode with the default "
        "nan='raise' refuses it)."
    ),
    exact_domain=(
        "fp32 inputs (any input, after its rounding to fp32): equal to sr.round(x, 'e2m1', "
        "'sr', rbits=8, variant='a', sat='finite') everywhere, and to gfloat's "
        "round_ndarray(e2m1, x, StochasticFastest, sat=True, srbits=r, srnumbits=8); equal "
        "to TE's fp32 function for every finite input and r except the fmaf rounding case "
        "and NaN of the decisions. SR with 8 of the 22 dropped bits: bias toward zero "
        "below 2**-8 ulp"
    ),
)


def _build_presets() -> dict[str, HardwarePreset]:
    presets = [
        _amd_preset("mi300", "fp8"),
        _amd_preset("mi300", "bf8"),
        _amd_preset("mi350", "fp8"),
        _amd_preset("mi350", "bf8"),
        *(_nvidia_preset(destination) for destination in _PTX_DESTINATIONS),
        _GRAPHCORE,
        _INTEL_FP16,
        _INTEL_E5M2,
        _TRANSFORMER_ENGINE_E2M1,
    ]
    return {p.name: p for p in presets}


PRESETS: dict[str, HardwarePreset] = _build_presets()


def family(name: str) -> str:
    """A preset's family: its name without the destination after the last hyphen (the
    units of one chip or instruction set: amd-mi300, nvidia-cvt-rs, intel ...)."""
    return name.rsplit("-", 1)[0]


FAMILIES: dict[str, tuple[HardwarePreset, ...]] = {
    name: tuple(p for p in PRESETS.values() if family(p.name) == name)
    for name in dict.fromkeys(family(p) for p in PRESETS)
}


def _units(members: tuple[HardwarePreset, ...]) -> str:
    return ", ".join(f"{p.target_format!r} ({p.name})" for p in members)


def preset(name: str | HardwarePreset, fmt: Format | str | None = None) -> HardwarePreset:
    """Find a preset by its name or by its family's name (case-insensitive), ``fmt`` (a
    format or its name) being its target format: for a family it picks the member (needed
    where the family has several), for a name it must agree.  A `HardwarePreset` is
    returned as is (``fmt``, if given, must agree with it too)."""
    target = None if fmt is None else find_format(fmt)
    if isinstance(name, HardwarePreset):
        found = name
    elif isinstance(name, str):
        found = _find(name.strip().lower(), target)
    else:
        raise TypeError(
            f"preset must be a name (str) or a HardwarePreset, got {type(name).__name__}"
        )
    if target is not None and target != found.target:
        raise ValueError(
            f"hardware preset {found.name} rounds to {found.target_format}, not to "
            f"fmt={target.name}"
        )
    return found


def _find(key: str, fmt: Format | None) -> HardwarePreset:
    """The preset named ``key``, or the member of family ``key`` that rounds to ``fmt``."""
    if key in PRESETS:
        return PRESETS[key]
    members = FAMILIES.get(key)
    if members is None:
        names = sorted([*PRESETS, *FAMILIES])
        close = difflib.get_close_matches(key, names, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(names)}"
        raise ValueError(f"unknown hardware preset {key!r}; {hint}")
    if fmt is None:
        if len(members) == 1:
            return members[0]
        raise ValueError(
            f"hardware {key!r} has {len(members)} units: name one, or pass its target format "
            f"as fmt: {_units(members)}"
        )
    for member in members:
        if member.target == fmt:
            return member
    raise ValueError(
        f"hardware {key!r} has no unit rounding to {fmt.name}; its units: {_units(members)}"
    )
