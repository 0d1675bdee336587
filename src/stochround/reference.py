"""The scalar specification: exact rounding of one value, in Python integers and fractions.

Slow and obviously right; the vectorized PyTorch path is tested against it.  For a finite
nonzero x and a format with mantissa bits m and minimum exponent emin:

    e = max(floor(log2|x|), emin);  q = e - m;  s = |x| * 2**-q;  nu = s - floor(s)

A mode decides ``away`` in {0, 1}; the magnitude is (floor(s) + away) * 2**q, then overflow
is handled, then the sign is restored.  Stochastic rounding with n random bits and a random
integer r in [0, 2**n) rounds away when

    a:   floor(nu 2**n) + r >= 2**n                 (P3109 StochasticA, gfloat StochasticFastest)
    b:   floor(nu 2**(n+1)) + 2r + 1 >= 2**(n+1)    (StochasticB, gfloat StochasticFast)
    c:   round_half_even(nu 2**n) + r >= 2**n       (StochasticC, gfloat Stochastic)
    odd: round_half_odd(nu 2**n) + r >= 2**n        (gfloat StochasticOdd)

Exact SR (``rbits=None``) is the chosen variant with n = 32 and r a 32-bit word.  The
rounding contract, with saturation and each variant's bias, is explained in the docs
(docs/explanation/contract.md).  Every ``fmt`` argument is a `Format` or a name that
`stochround.formats.format` knows.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from .formats import Format, floor_log2_ratio
from .formats import format as find_format

MODES = ("rne", "rna", "rz", "ru", "rd", "ro", "sr")
VARIANTS = ("a", "b", "c", "odd")
SATURATIONS = ("finite", "propagate", "none")
WORD_BITS = 32


def check_choice(argument: str, value: object, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ValueError naming the argument."""
    if value not in allowed:
        raise ValueError(
            f"{argument} must be one of {', '.join(map(repr, allowed))}; got {value!r}"
        )
    return value  # type: ignore[return-value]


def check_mode(mode: object) -> str:
    """The rounding mode ``mode`` names, spelled as in `MODES`: mode names, like format
    names, are case-insensitive and surrounding spaces are ignored ("SR" names "sr").
    Anything else is a ValueError naming the argument and `MODES`.

    Every entry point that takes a mode keeps what this returns, so that the code below it
    compares canonical names only."""
    if mode in MODES:  # the common case, first: no string work per call
        return mode  # type: ignore[return-value]
    canonical = mode.strip().lower() if isinstance(mode, str) else mode
    return check_choice("mode", canonical if canonical in MODES else mode, MODES)


def check_rbits(rbits: int | None) -> int:
    """The number of random bits: ``rbits`` in 1..32, or 32 for exact SR (None)."""
    if rbits is None:
        return WORD_BITS
    # a numpy integer is an int too; a bool is not
    if isinstance(rbits, bool) or not isinstance(rbits, numbers.Integral):
        raise ValueError(f"rbits must be None (exact SR) or an int in 1..32; got {rbits!r}")
    if not 1 <= rbits <= WORD_BITS:
        raise ValueError(f"rbits must be None (exact SR) or an int in 1..32; got {rbits!r}")
    return int(rbits)


def divide_half_even(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded to the nearest integer, ties to even."""
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    return quotient + int(twice > denominator or (twice == denominator and quotient % 2 == 1))


def divide_half_odd(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded to the nearest integer, ties to odd."""
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    return quotient + int(twice > denominator or (twice == denominator and quotient % 2 == 0))


def _sr_count(rem: int, den: int, n: int, variant: str) -> int:
    """The integer each variant compares with 2**n - r, for nu = rem / den."""
    if variant == "a":
        return (rem << n) // den
    if variant == "b":  # floor(nu 2**(n+1)) + 2r + 1 >= 2**(n+1)  <=>  half-up(nu 2**n) + r >= 2**n
        return ((rem << (n + 1)) // den + 1) >> 1
    if variant == "c":
        return divide_half_even(rem << n, den)
    return divide_half_odd(rem << n, den)


def away_probability(nu: Fraction, n: int, variant: str) -> Fraction:
    """P(away) over uniform r in [0, 2**n) for the discarded fraction ``nu`` in [0, 1):
    ``count(nu 2**n) / 2**n`` with ``count`` floor for variant a, round-half-up for b,
    round-half-even for c and round-half-odd for odd."""
    return Fraction(_sr_count(nu.numerator, nu.denominator, n, variant), 2**n)


def code_is_odd(kept: int, e: int, fmt: Format) -> bool:
    """Whether the code of the value kept * 2**(e - m) has its last bit set.

    With mantissa bits that is the last significand bit; with none (p = 1) the last code
    bit is the exponent field's, e + bias, and the zero code is even.
    """
    if fmt.mbits > 0:
        return kept % 2 == 1
    return kept != 0 and (e + fmt.exponent_bias) % 2 == 1


def rounds_away(
    rem: int,
    den: int,
    odd: bool,
    negative: bool,
    mode: str,
    n: int,
    variant: str,
    rand: int | None,
) -> bool:
    """The mode's decision for the discarded fraction nu = rem / den in [0, 1).

    ``odd``: whether the kept code (toward zero) is odd; ``negative``: the sign of x;
    ``mode``: one of `MODES`; for ``"sr"``, ``n`` random bits, the ``variant`` and the
    random integer ``rand`` in [0, 2**n) (ignored by the other modes).
    """
    if mode == "rne":
        return 2 * rem > den or (2 * rem == den and odd)
    if mode == "rna":
        return 2 * rem >= den
    if mode == "rz":
        return False
    if mode == "ru":
        return rem > 0 and not negative
    if mode == "rd":
        return rem > 0 and negative
    if mode == "ro":
        return rem > 0 and not odd
    if rand is None:
        raise ValueError("the reference needs rand (the random integer) for mode='sr'")
    return _sr_count(rem, den, n, variant) + rand >= 2**n


def overflow_value(negative: bool, infinite: bool, fmt: Format, mode: str, sat: str) -> float:
    """The result for an infinite input, or a finite one whose rounded value is out of range.

    ``finite`` saturates everything, ``propagate`` keeps infinities and saturates finite
    overflow, ``none`` gives infinity (NaN where the format has none) except that directed
    modes pointing inward (rz; rd above, ru below) clamp, as IEEE 754 says.  ``negative``:
    the sign of x; ``infinite``: whether x itself is infinite; ``mode`` and ``sat`` as in
    `round_value`.
    """
    inward = mode == "rz" or (mode == "rd" and not negative) or (mode == "ru" and negative)
    if sat == "finite" or (not infinite and (sat == "propagate" or inward)):
        return fmt.lowest if negative else fmt.max
    if fmt.inf and (fmt.signed or not negative):
        return -math.inf if negative else math.inf
    return math.nan


def round_value(
    x: float | Fraction,
    fmt: Format | str,
    mode: str = "rne",
    *,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    rand: int | None = None,
) -> float:
    """Round one value to ``fmt``; the result is a Python float holding the format's value.

    ``mode`` is one of `MODES`; ``rbits`` the number n of random bits of SR (None: exact
    SR), ``variant`` how they are compared (a, b, c or odd, the module docstring's rules)
    and ``sat`` the overflow handling (`overflow_value`).  ``rand`` is the random integer
    for ``mode="sr"``: in [0, 2**rbits), or a 32-bit word for exact SR.  Negative zero is
    kept where the format has it; NaN stays NaN.
    """
    fmt = find_format(fmt)
    mode = check_mode(mode)
    check_choice("variant", variant, VARIANTS)
    check_choice("sat", sat, SATURATIONS)
    return round_checked(x, fmt, mode, check_rbits(rbits), variant, sat, rand)


def round_checked(
    x: float | Fraction,
    fmt: Format,
    mode: str,
    n: int,
    variant: str,
    sat: str,
    rand: int | None,
) -> float:
    """`round_value` with its arguments already checked (n: the number of random bits)."""
    if isinstance(x, float) and math.isnan(x):
        return math.nan
    negative = x < 0
    if isinstance(x, float) and math.isinf(x):
        return overflow_value(negative, True, fmt, mode, sat)
    num, den = _magnitude_ratio(x)
    if num == 0:
        if not fmt.has_zero:
            return fmt.min_normal
        signbit = isinstance(x, float) and math.copysign(1.0, x) < 0
        return -0.0 if signbit and fmt.has_negative_zero else 0.0
    e, s_num, s_den = _scaled(num, den, fmt)
    if e > fmt.emax + 1:  # |x| >= 2**(emax + 2): every mode gives at least 2**(emax + 1) > max
        return overflow_value(negative, False, fmt, mode, sat)
    q = e - fmt.mbits
    kept, rem = divmod(s_num, s_den)
    odd = code_is_odd(kept, e, fmt)
    away = rounds_away(rem, s_den, odd, negative, mode, n, variant, rand)
    # Format values have at most 53 significand bits: the float is exact, or beyond every
    # double and so beyond the format's max.
    try:
        rounded = math.ldexp(kept + int(away), q)
    except OverflowError:
        return overflow_value(negative, False, fmt, mode, sat)
    if not fmt.has_zero:
        rounded = max(rounded, fmt.min_normal)
    value = -rounded if negative else rounded
    if value > fmt.max or value < fmt.lowest:
        return overflow_value(negative, False, fmt, mode, sat)
    if value == 0:
        return -0.0 if negative and fmt.has_negative_zero else 0.0
    return value


def _magnitude_ratio(x: float | Fraction) -> tuple[int, int]:
    """|x| as the integer ratio num/den in lowest terms (den > 0): x's own ratio, whose sign
    is its numerator's (as ``abs(x).as_integer_ratio()``, typed for floats and fractions)."""
    num, den = x.as_integer_ratio()
    return abs(num), den


def _scaled(num: int, den: int, fmt: Format) -> tuple[int, int, int]:
    """For |x| = num/den > 0: e = max(floor(log2|x|), emin) and s = |x| 2**-(e - m) as a ratio."""
    e = max(floor_log2_ratio(num, den), fmt.emin)
    q = e - fmt.mbits
    if q >= 0:
        return e, num, den << q
    return e, num << -q, den


def neighbours(x: float | Fraction, fmt: Format | str) -> tuple[float, float]:
    """The two adjacent values of the format's grid around finite x (equal if x is on it):
    round toward negative and toward positive, with ``sat="none"``."""
    return round_value(x, fmt, "rd"), round_value(x, fmt, "ru")


def discarded_fraction(x: float | Fraction, fmt: Format | str) -> Fraction:
    """nu = s - floor(s): the part of |x| below the target ulp, in ulps (0 on the grid)."""
    fmt = find_format(fmt)
    num, den = _magnitude_ratio(x)
    if num == 0:
        return Fraction(0)
    _, s_num, s_den = _scaled(num, den, fmt)
    return Fraction(s_num % s_den, s_den)


def decode_code(code: int, fmt: Format | str) -> float:
    """The value of the bit pattern ``code`` (read modulo 2**bits; NaN for NaN codes)."""
    fmt = find_format(fmt)
    code &= fmt.num_codes - 1
    if fmt.twos_complement:
        signed = code - fmt.num_codes if code >= fmt.num_codes // 2 else code
        return float(signed * fmt.ulp_at_emin)
    magnitude_bits = fmt.ebits + fmt.mbits
    negative = fmt.signed and code >> magnitude_bits == 1
    magnitude_code = code & (2**magnitude_bits - 1)
    if fmt.nan == "fnuz" and negative and magnitude_code == 0:
        return math.nan
    if magnitude_code > fmt.max_magnitude_code + int(fmt.inf):
        return math.nan
    if magnitude_code == fmt.max_magnitude_code + 1:
        value = math.inf
    else:
        value = float(fmt.magnitude_value(magnitude_code))
    return -value if negative else value


def encode_value(value: float, fmt: Format | str) -> int:
    """The bit pattern of ``value``, a value of the format (NaN: the canonical quiet NaN
    code)."""
    fmt = find_format(fmt)
    magnitude_bits = fmt.ebits + fmt.mbits
    if math.isnan(value):
        if fmt.nan == "none":
            raise ValueError(f"format {fmt.name} has no NaN code")
        if fmt.nan == "fnuz":
            return 1 << magnitude_bits
        quiet = 1 << (fmt.mbits - 1) if fmt.nan == "ieee" and fmt.mbits else 2**fmt.mbits - 1
        return (2**fmt.ebits - 1) << fmt.mbits | quiet
    if fmt.twos_complement:
        return int(Fraction(value) / fmt.ulp_at_emin) % fmt.num_codes
    negative = math.copysign(1.0, value) < 0 and (value != 0 or fmt.has_negative_zero)
    magnitude = abs(value)
    if math.isinf(magnitude):
        magnitude_code = fmt.max_magnitude_code + 1
    elif magnitude == 0:
        magnitude_code = 0
    else:
        exact = Fraction(magnitude)
        e = floor_log2_ratio(exact.numerator, exact.denominator)
        if e < fmt.emin:
            magnitude_code = int(exact / fmt.ulp_at_emin)
        else:
            mantissa = int(exact / Fraction(2) ** (e - fmt.mbits)) - 2**fmt.mbits
            magnitude_code = (e + fmt.exponent_bias) << fmt.mbits | mantissa
    return int(negative) << magnitude_bits | magnitude_code


def all_values(fmt: Format | str) -> list[tuple[int, float]]:
    """Every code of a format of at most 16 bits with its value, in code order."""
    fmt = find_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"all_values lists formats of at most 16 bits; {fmt.name} has {fmt.bits}")
    return [(code, decode_code(code, fmt)) for code in range(fmt.num_codes)]
