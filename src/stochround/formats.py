"""Number formats: the `Format` description and the registry of named formats.

A format is a sign bit (when signed), `ebits` exponent bits and `mbits` mantissa
(trailing significand) bits.  With exponent field `E` and mantissa field `M`, a
magnitude code decodes to

    E == 0 and subnormals:   M * 2**(emin - mbits)              (emin = 1 - bias)
    otherwise:               (2**mbits + M) * 2**(E - bias - mbits)

Special values take the largest magnitude codes, as P3109 and gfloat describe them:

* ``nan="ieee"``: the whole top binade is reserved: ``M == 0`` is infinity, the rest NaN.
* ``nan="fn"``: only the all-ones magnitude code is NaN (per sign).
* ``nan="fnuz"``: the negative-zero code is the single NaN; there is no -0.
* ``nan="none"``: no NaN code.

Outside ``"ieee"``, ``inf=True`` puts +-infinity on the largest magnitude code that is
not NaN (P3109 "extended" formats).  Formats without subnormals must have ``mbits == 0``
(scale formats such as e8m0): every exponent field, 0 included, is a normal power of two
and there is no zero.  Integer grids are formats with ``ebits == 0`` whose ulp is 1;
``twos_complement=True`` adds the one extra negative code of two's complement integers.
"""

from __future__ import annotations

import difflib
import numbers
import re
from dataclasses import dataclass, field, fields
from fractions import Fraction
from functools import cached_property

import torch

NAN_ENCODINGS = ("ieee", "fn", "fnuz", "none")


def floor_log2(value: Fraction) -> int:
    """floor(log2(value)) for a positive rational, exactly."""
    return floor_log2_ratio(value.numerator, value.denominator)


def floor_log2_ratio(num: int, den: int) -> int:
    """floor(log2(num / den)) for positive integers, exactly."""
    guess = num.bit_length() - den.bit_length()
    below = num < den << guess if guess >= 0 else num << -guess < den
    return guess - 1 if below else guess


@dataclass(frozen=True)
class Format:
    """A binary number format: bit widths, bias and the encoding of special values.

    ``ebits`` and ``mbits``: exponent and mantissa (trailing significand) bits; ``bias``:
    the exponent bias (None: IEEE's ``2**(ebits-1) - 1``, 0 without exponent bits; the
    constructed format holds the int, which `exponent_bias` reads with an int type);
    ``signed``: whether there is a sign bit; ``inf``: whether +-infinity has a code;
    ``nan``: where NaN lives (one of ``NAN_ENCODINGS``, see the module docstring);
    ``subnormals``: whether the exponent field 0 holds subnormals and zero;
    ``twos_complement``: two's complement integers (``ebits == 0``); ``name``: the
    registry name (derived from the layout when empty; not part of equality).
    """

    ebits: int
    mbits: int
    bias: int | None = None
    signed: bool = True
    inf: bool = True
    nan: str = "ieee"
    subnormals: bool = True
    twos_complement: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("ebits", "mbits", "bias"):  # numpy integers are ints too
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                object.__setattr__(self, name, int(value))
        if self.bias is None:  # IEEE's 2**(ebits-1) - 1; 0 for integer-like grids
            object.__setattr__(self, "bias", 2 ** max(self.ebits - 1, 0) - 1)
        self._validate()
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _validate(self) -> None:
        if not (isinstance(self.ebits, int) and 0 <= self.ebits <= 15):
            raise ValueError(f"ebits must be an int in 0..15, got {self.ebits!r}")
        if not (isinstance(self.mbits, int) and 0 <= self.mbits <= 52):
            raise ValueError(f"mbits must be an int in 0..52, got {self.mbits!r}")
        if not isinstance(self.bias, int):
            raise TypeError(f"bias must be an int, got {self.bias!r}")
        if self.nan not in NAN_ENCODINGS:
            raise ValueError(f"nan must be one of {NAN_ENCODINGS}, got {self.nan!r}")
        if self.ebits + self.mbits == 0:
            raise ValueError("a format needs at least one exponent or mantissa bit")
        if self.nan == "ieee" and (not self.inf or self.ebits == 0):
            raise ValueError("nan='ieee' reserves the top binade: it needs inf=True and ebits >= 1")
        if self.nan == "fnuz" and not self.signed:
            raise ValueError("nan='fnuz' uses the negative-zero code: it needs signed=True")
        if not self.subnormals and self.mbits != 0:
            raise ValueError("subnormals=False is supported only with mbits=0 (scale formats)")
        if self.twos_complement and not (
            self.signed and self.ebits == 0 and self.nan == "none" and not self.inf
        ):
            raise ValueError(
                "twos_complement=True needs signed=True, ebits=0, nan='none' and inf=False"
            )
        if self.emin - self.mbits < -1100 or self.emin - self.mbits > 1000:
            raise ValueError(f"bias={self.bias} puts the format's ulp outside float64's range")
        if self.reserved_codes >= 2 ** (self.ebits + self.mbits):
            raise ValueError("the special values leave no finite magnitude code")

    def __hash__(self) -> int:
        # computed once, where the dataclass's hash would hash every field on each of the
        # several cache lookups (support checks, kernel plans) of a rounding call
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # of ints only (the NaN encoding by its index), so that the value pickled with a
        # format holds in any process: str hashes differ between processes
        layout = (getattr(self, f.name) for f in fields(self) if f.compare and f.name != "nan")
        return hash((*layout, NAN_ENCODINGS.index(self.nan)))

    def _default_name(self) -> str:
        sign = "" if self.signed else "u"
        return f"{sign}e{self.ebits}m{self.mbits}b{self.bias}{'' if self.inf else 'f'}_{self.nan}"

    # --- derived properties -------------------------------------------------------------

    @property
    def exponent_bias(self) -> int:
        """The exponent bias as an int: ``bias`` once ``__post_init__`` resolved None."""
        bias = self.bias
        assert bias is not None  # resolved in __post_init__ and checked to be an int
        return bias

    @property
    def bits(self) -> int:
        """Total width of a code in bits."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one: p = mbits + 1."""
        return self.mbits + 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade (1 - bias; -bias without subnormals)."""
        return 1 - self.exponent_bias if self.subnormals else -self.exponent_bias

    @property
    def num_codes(self) -> int:
        """Number of bit patterns, 2**bits."""
        return 2**self.bits

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.nan != "fnuz" and not self.twos_complement

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @cached_property
    def reserved_codes(self) -> int:
        """Number of largest magnitude codes that hold NaN or infinity (per sign)."""
        if self.nan == "ieee":
            return 2**self.mbits
        return int(self.nan == "fn") + int(self.inf)

    @cached_property
    def max_magnitude_code(self) -> int:
        """The magnitude code of the largest finite value."""
        return 2 ** (self.ebits + self.mbits) - 1 - self.reserved_codes

    def magnitude_value(self, code: int) -> Fraction:
        """Exact value of a finite magnitude code (sign bit excluded)."""
        exponent_field, mantissa = code >> self.mbits, code & (2**self.mbits - 1)
        if exponent_field == 0 and self.subnormals:
            return Fraction(mantissa) * Fraction(2) ** (self.emin - self.mbits)
        return Fraction(2**self.mbits + mantissa) * Fraction(2) ** (
            exponent_field - self.exponent_bias - self.mbits
        )

    @cached_property
    def max(self) -> float:
        """Largest finite value."""
        return float(self.magnitude_value(self.max_magnitude_code))

    @cached_property
    def lowest(self) -> float:
        """Most negative finite value (numpy's finfo.min); 0 or the smallest value if unsigned."""
        if not self.signed:
            return 0.0 if self.has_zero else self.min_normal
        if self.twos_complement:
            return -float(self.magnitude_value(self.max_magnitude_code) + self.ulp_at_emin)
        return -self.max

    @cached_property
    def emax(self) -> int:
        """floor(log2(max)), as gfloat defines it (also for all-subnormal integer grids)."""
        return floor_log2(self.magnitude_value(self.max_magnitude_code))

    @cached_property
    def ulp_at_emin(self) -> Fraction:
        """Spacing of the subnormal (and first normal) binade: 2**(emin - mbits)."""
        return Fraction(2) ** (self.emin - self.mbits)

    @cached_property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**emin."""
        return float(Fraction(2) ** self.emin)

    @cached_property
    def min_subnormal(self) -> float:
        """Smallest positive value: 2**(emin - mbits), or 2**emin without subnormals."""
        return float(self.ulp_at_emin) if self.subnormals else self.min_normal

    @cached_property
    def eps(self) -> float:
        """Distance from 1 to the next larger value of the grid, 2**-mbits (1 for integers)."""
        return float(Fraction(2) ** -self.mbits) if self.ebits else float(self.ulp_at_emin)

    @property
    def is_integer(self) -> bool:
        """True for integer grids (no exponent bits and an ulp of 1)."""
        return self.ebits == 0 and self.ulp_at_emin == 1

    def fits_in(self, other: Format) -> bool:
        """Whether every value of this format is a value of ``other``: no more mantissa
        bits, no larger maximum, no finer spacing at the bottom."""
        return (
            self.mbits <= other.mbits
            and self.max <= other.max
            and self.min_subnormal >= other.min_subnormal
        )

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype holding exactly this format's values, where torch has one."""
        return _TORCH_DTYPES.get(self.name)

    def __str__(self) -> str:
        return self.name

    # --- constructors of families -------------------------------------------------------

    @staticmethod
    def p3109(k: int, p: int, signed: bool = True, extended: bool = True) -> Format:
        """IEEE P3109 binary format K{k}P{p}: ``k`` bits in all, precision ``p`` (so
        ``mbits = p - 1``); bias 2**(k-p-1) when ``signed``, 2**(k-p) unsigned; NaN on the
        negative-zero code (signed) or the all-ones code (unsigned); with ``extended``
        +-infinity on the largest magnitude codes."""
        k, p = _as_int(k), _as_int(p)
        if not (isinstance(k, int) and 2 <= k <= 16):
            raise ValueError(f"k must be an int in 2..16, got {k!r}")
        if not (isinstance(p, int) and 1 <= p <= k):
            raise ValueError(f"p must be an int in 1..{k} for k={k}, got {p!r}")
        ebits = k - p + (0 if signed else 1)
        bias = (2 ** (k - p - 1) if k > p else 0) if signed else 2 ** (k - p)
        name = f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if extended else 'f'}"
        return Format(
            ebits=ebits,
            mbits=p - 1,
            bias=bias,
            signed=signed,
            inf=extended,
            nan="fnuz" if signed else "fn",
            name=name,
        )

    @staticmethod
    def cfloat8(ebits: int, mbits: int, bias: int) -> Format:
        """Tesla CFloat8 (Dojo): 1 sign bit, ebits + mbits = 7, a configurable bias in
        0..63, subnormals, no infinities and no NaN."""
        ebits, mbits, bias = _as_int(ebits), _as_int(mbits), _as_int(bias)
        if ebits + mbits != 7 or ebits < 1:
            raise ValueError(f"cfloat8 needs ebits + mbits == 7, got ebits={ebits}, mbits={mbits}")
        if not (isinstance(bias, int) and 0 <= bias <= 63):
            raise ValueError(f"bias must be an int in 0..63 for cfloat8, got {bias!r}")
        return Format(
            ebits=ebits,
            mbits=mbits,
            bias=bias,
            inf=False,
            nan="none",
            name=f"cfloat8_e{ebits}m{mbits}_b{bias}",
        )

    @staticmethod
    def integer(bits: int, signed: bool = True) -> Format:
        """The integers representable in ``bits`` bits: two's complement when signed."""
        bits = _as_int(bits)
        if not (isinstance(bits, int) and 2 <= bits <= 32):
            raise ValueError(f"bits must be an int in 2..32, got {bits!r}")
        mbits = bits - int(signed)
        return Format(
            ebits=0,
            mbits=mbits,
            bias=1 - mbits,
            signed=signed,
            inf=False,
            nan="none",
            twos_complement=signed,
            name=f"{'' if signed else 'u'}int{bits}",
        )


def _as_int(value: int) -> int:
    """A numpy (or other integral, not bool) integer as a Python int; anything else as is,
    for the checks that follow to name it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _ieee(name: str, ebits: int, mbits: int) -> Format:
    return Format(ebits=ebits, mbits=mbits, name=name)


def _finite(name: str, ebits: int, mbits: int, nan: str, bias: int | None = None) -> Format:
    return Format(ebits=ebits, mbits=mbits, bias=bias, inf=False, nan=nan, name=name)


# Each entry: the canonical format and its aliases.
_NAMED: list[tuple[Format, tuple[str, ...]]] = [
    (_ieee("binary64", 11, 52), ("fp64", "float64", "double")),
    (_ieee("binary32", 8, 23), ("fp32", "float32", "float", "single")),
    (_ieee("tf32", 8, 10), ("tensorfloat32",)),
    (_ieee("binary16", 5, 10), ("fp16", "float16", "half")),
    (_ieee("bfloat16", 8, 7), ("bf16",)),
    (_finite("e4m3fn", 4, 3, "fn"), ("fp8_e4m3fn", "float8_e4m3fn", "ocp_e4m3")),
    (_finite("e4m3fnuz", 4, 3, "fnuz", bias=8), ("fp8_e4m3fnuz", "float8_e4m3fnuz")),
    (_ieee("e5m2", 5, 2), ("fp8_e5m2", "float8_e5m2", "ocp_e5m2")),
    (_finite("e5m2fnuz", 5, 2, "fnuz", bias=16), ("fp8_e5m2fnuz", "float8_e5m2fnuz")),
    (_ieee("e4m3", 4, 3), ("fp8_e4m3", "float8_e4m3")),
    (_ieee("e3m4", 3, 4), ("fp8_e3m4", "float8_e3m4")),
    (_finite("e2m3", 2, 3, "none"), ("fp6_e2m3", "float6_e2m3fn", "ocp_e2m3")),
    (_finite("e3m2", 3, 2, "none"), ("fp6_e3m2", "float6_e3m2fn", "ocp_e3m2")),
    (_finite("e2m1", 2, 1, "none"), ("fp4", "fp4_e2m1", "float4_e2m1fn", "ocp_e2m1")),
    (
        Format(
            ebits=8,
            mbits=0,
            bias=127,
            signed=False,
            inf=False,
            nan="fn",
            subnormals=False,
            name="e8m0",
        ),
        ("fp8_e8m0", "float8_e8m0fnu", "ocp_e8m0", "e8m0fnu"),
    ),
    (Format.integer(8), ("i8",)),
    (Format.integer(4), ("i4",)),
    (Format.integer(8, signed=False), ("u8",)),
    (Format.integer(4, signed=False), ("u4",)),
]

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "binary64": torch.float64,
    "binary32": torch.float32,
    "binary16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
for _format_name, _dtype_name in [
    ("e4m3fn", "float8_e4m3fn"),
    ("e4m3fnuz", "float8_e4m3fnuz"),
    ("e5m2", "float8_e5m2"),
    ("e5m2fnuz", "float8_e5m2fnuz"),
    ("e8m0", "float8_e8m0fnu"),
    ("e2m1", "float4_e2m1fn_x2"),
]:
    if hasattr(torch, _dtype_name):
        _TORCH_DTYPES[_format_name] = getattr(torch, _dtype_name)

FORMATS: dict[str, Format] = {fmt.name: fmt for fmt, _ in _NAMED}
_FORMAT_OF_DTYPE: dict[torch.dtype, Format] = {
    dtype: FORMATS[name] for name, dtype in _TORCH_DTYPES.items()
}
ALIASES: dict[str, str] = {alias: fmt.name for fmt, aliases in _NAMED for alias in aliases}

_P3109_NAME = re.compile(r"p3109_k(\d+)p(\d+)([su])([ef])")
_CFLOAT8_NAME = re.compile(r"cfloat8_e(\d+)m(\d+)_b(\d+)")


def format(name: str | Format | torch.dtype) -> Format:  # noqa: A001 - the public name (sr.format)
    """Find a format by name or alias (case-insensitive); a `Format` is returned as is, and
    a torch dtype gives the format its values have (`format_of_dtype`: torch.float8_e4m3fn
    is e4m3fn, torch.int8 the int8 grid).

    Besides the registry, P3109 names (``p3109_k8p4se``: k, p, signed/unsigned,
    extended/finite) and CFloat8 names (``cfloat8_e4m3_b20``) are parsed.
    """
    if isinstance(name, Format):
        return name
    if isinstance(name, torch.dtype):
        return format_of_dtype(name)
    if not isinstance(name, str):
        raise TypeError(
            f"format must be a name (str), a Format or a torch dtype, got {type(name).__name__}"
        )
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    if match := _P3109_NAME.fullmatch(key):
        k, p, signedness, domain = match.groups()
        return Format.p3109(int(k), int(p), signed=signedness == "s", extended=domain == "e")
    if match := _CFLOAT8_NAME.fullmatch(key):
        ebits, mbits, bias = map(int, match.groups())
        return Format.cfloat8(ebits, mbits, bias)
    known = sorted(set(FORMATS) | set(ALIASES))
    close = difflib.get_close_matches(key, known, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(sorted(FORMATS))}"
    raise ValueError(
        f"unknown format {name!r}; {hint} (also p3109_k<K>p<P><s|u><e|f>, cfloat8_e<E>m<M>_b<B>)"
    )


def format_of_dtype(dtype: torch.dtype) -> Format:
    """The format whose values a torch dtype holds: the floating dtypes (float4_e2m1fn_x2:
    e2m1, the format of each of its two codes), int8 and uint8."""
    fmt = _FORMAT_OF_DTYPE.get(dtype)
    if fmt is None:
        known = ", ".join(str(d) for d in _FORMAT_OF_DTYPE)
        raise ValueError(f"dtype {dtype} has no matching stochround format; known: {known}")
    return fmt
