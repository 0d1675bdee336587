"""Independent oracles for `stochround.round` / `stochround.cast` (the PyTorch path).

Three implementations written by others decide what the rounded values must be, bit for
bit: torch's own dtype conversions, ml_dtypes' numpy casts, and gfloat's `round_ndarray`
(every rounding mode, saturation, and the stochastic modes with explicit random bits).

Inputs, for every target format:
* every bf16 bit pattern and every fp16 bit pattern (65536 each, in their own dtype);
* log-uniform random fp32 magnitudes of both signs spanning the target's subnormal,
  normal and overflow ranges (fixed seed);
* every midpoint between adjacent target values (and the overflow threshold above max),
  exact in fp32, with its two fp32 neighbours (torch.nextafter);
* zeros of both signs, infinities, NaN, the target's extremes, fp32's extremes.
"""

import functools
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat import RoundMode, round_ndarray
from gfloat import formats as gf
from gfloat.types import Domain, Signedness
from helpers import all_bit_patterns

import stochround as sr
from stochround.formats import Format

# --------------------------------------------------------------------------------------
# inputs

# The PyTorch path, named: with TRITON_INTERPRET=1 (which conftest sets on machines without
# CUDA) backend="auto" would send CPU tensors through the Triton kernels' interpreter.
BACKEND = "torch"
RANDOM_COUNT = 2**16
FP32_MIN_EXPONENT, FP32_MAX_EXPONENT = -149, 127


def bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    """All 65536 values of a 16-bit dtype (NaNs and both zeros included)."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


@functools.cache
def grid_values(fmt: Format) -> torch.Tensor:
    """The finite values of a format of at most 16 bits, sorted, as float64."""
    codes = torch.arange(fmt.num_codes)
    values = sr.decode(codes, fmt, dtype=torch.float64)
    return torch.unique(values[torch.isfinite(values)])


def ulp_at_max(fmt: Format) -> float:
    if fmt.ebits == 0:
        return fmt.min_subnormal
    return math.ldexp(1.0, fmt.emax - fmt.mbits)


@functools.cache
def midpoints_and_neighbours(fmt: Format) -> torch.Tensor:
    """Midpoints of adjacent values, the overflow thresholds +-(max + ulp/2), and their fp32
    neighbours.  All midpoints of formats of at most 16 bits are exact in fp32."""
    values = grid_values(fmt)
    mids = (values[:-1] + values[1:]) / 2
    threshold = fmt.max + ulp_at_max(fmt) / 2
    mids = torch.cat([mids, torch.tensor([threshold, -threshold], dtype=torch.float64)])
    mids32 = mids.to(torch.float32)
    assert torch.equal(mids32.to(torch.float64), mids), "midpoints must be exact in fp32"
    up = torch.nextafter(mids32, torch.tensor(math.inf))
    down = torch.nextafter(mids32, torch.tensor(-math.inf))
    return torch.cat([mids32, up, down])


def specials(fmt: Format) -> torch.Tensor:
    fp32 = torch.finfo(torch.float32)
    values = [
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        math.nan,
        1.0,
        -1.0,
        fp32.max,
        -fp32.max,
        fp32.smallest_normal,
        2.0**-149,
        -(2.0**-149),
        fmt.max,
        -fmt.max,
        fmt.min_normal,
        -fmt.min_normal,
        fmt.min_subnormal,
        -fmt.min_subnormal,
        fmt.min_subnormal / 2,
        -fmt.min_subnormal / 2,
    ]
    return torch.tensor(values, dtype=torch.float32)


@functools.cache
def random_fp32(fmt: Format, count: int = RANDOM_COUNT) -> torch.Tensor:
    """Log-uniform magnitudes from 2**-4 below the smallest subnormal to 2**3 above max."""
    seed = int.from_bytes(fmt.name.encode()[:8].ljust(8, b"\0"), "little")
    rng = np.random.default_rng(seed)
    low = max(math.log2(fmt.min_subnormal) - 4, FP32_MIN_EXPONENT)
    high = min(math.log2(fmt.max) + 3, FP32_MAX_EXPONENT + 0.999)
    magnitudes = np.exp2(rng.uniform(low, high, count))
    signs = rng.choice([-1.0, 1.0], count)
    return torch.from_numpy(signs * magnitudes).to(torch.float32)


@functools.cache
def fp32_inputs(fmt: Format) -> torch.Tensor:
    return torch.cat([specials(fmt), midpoints_and_neighbours(fmt), random_fp32(fmt)])


def input_groups(fmt: Format) -> dict[str, torch.Tensor]:
    return {
        "bf16 patterns": bit_patterns(torch.bfloat16),
        "fp16 patterns": bit_patterns(torch.float16),
        "fp32": fp32_inputs(fmt),
    }


# --------------------------------------------------------------------------------------
# comparison


def bits_of(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float64).view(torch.int64)


def assert_same(got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """Both NaN, or identical bits (signed zeros compared by sign bit)."""
    assert got.shape == expected.shape == x.shape
    got_nan = torch.isnan(got.to(torch.float64))
    expected_nan = torch.isnan(expected.to(torch.float64))
    same_bits = bits_of(got) == bits_of(expected)
    ok = (got_nan & expected_nan) | (~got_nan & ~expected_nan & same_bits)
    if bool(ok.all()):
        return
    bad = torch.nonzero(~ok).flatten()[:12].tolist()
    lines = [
        f"  x={float(x[i])!r} ({float(x[i]).hex()}, {x.dtype} bits {input_bits(x[i]):#x}):"
        f" expected {float(expected[i])!r}, got {float(got[i])!r}"
        for i in bad
    ]
    raise AssertionError(f"{what}: {int((~ok).sum())} of {x.numel()} differ\n" + "\n".join(lines))


def input_bits(element: torch.Tensor) -> int:
    """The bit pattern of one element of a float tensor, as an unsigned integer."""
    width = element.dtype.itemsize
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return element.reshape(1).view(integer).item() % 2 ** (8 * width)


# --------------------------------------------------------------------------------------
# oracle 1: torch's own conversions (round to nearest even)


@pytest.mark.parametrize(("name", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_torch_bf16_fp16_conversions(name, dtype):
    """x.to(bf16/fp16) is IEEE rne with overflow to inf: sat='none'."""
    fmt = sr.format(name)
    for group, x in input_groups(fmt).items():
        expected = x.to(dtype)
        got = sr.cast(x, dtype, backend=BACKEND)
        assert got.dtype == dtype
        assert_same(got, expected, x, f"cast({group} -> {dtype})")
        rounded = sr.round(x, name, backend=BACKEND)
        assert rounded.dtype == x.dtype
        assert_same(rounded, expected.to(x.dtype), x, f"round({group}, {name!r})")


# torch's float8 conversions beyond max, found by trying them (torch 2.13):
#  float8_e4m3fn:   finite overflow and +-inf saturate to +-448 (NaN stays NaN): sat='finite'
#  float8_e5m2:     IEEE: overflow rounds to +-inf: sat='none'
#  float8_e4m3fnuz, float8_e5m2fnuz: overflow and +-inf give NaN: sat='none' (no inf code)
#  float8_e8m0fnu:  round to nearest, ties up (1.5 -> 2, 3 -> 4, 0.75 -> 1): mode 'rna';
#                   0 -> 2**-127 as stochround; negative x -> the code of |x| (compared
#                   only for x >= 0: stochround gives NaN for negatives in unsigned formats);
#                   x in [2**-127, 2**-126), fp32 subnormals, round as if their fraction
#                   bits were a normal mantissa (1.02 * 2**-127 -> 2**-126): not compared.
# (older torch releases gave NaN for e4m3fn overflow, as sat="none"; the GPU machine's
# torch may be one of them, so the saturation torch applies is read off torch itself)
E4M3FN_SATURATION = (
    "finite" if torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().item() == 448 else "none"
)
TORCH_FLOAT8 = [
    ("e4m3fn", torch.float8_e4m3fn, "rne", E4M3FN_SATURATION),
    ("e5m2", torch.float8_e5m2, "rne", "none"),
    ("e4m3fnuz", torch.float8_e4m3fnuz, "rne", "none"),
    ("e5m2fnuz", torch.float8_e5m2fnuz, "rne", "none"),
    ("e8m0", torch.float8_e8m0fnu, "rna", "none"),
]


@pytest.mark.parametrize(
    ("name", "dtype", "mode", "sat"), TORCH_FLOAT8, ids=[t[0] for t in TORCH_FLOAT8]
)
def test_torch_float8_conversions(name, dtype, mode, sat):
    fmt = sr.format(name)
    for group, x in input_groups(fmt).items():
        if not fmt.signed:
            x = x[~torch.signbit(x)]
        if not fmt.has_zero:
            x = x[~((x > 0) & (x < 2.0**-126))]
        expected = x.to(dtype)
        got = sr.cast(x, dtype, mode, sat=sat, backend=BACKEND)
        assert got.dtype == dtype
        expected_values, got_values = expected.to(torch.float32), got.to(torch.float32)
        assert_same(got_values, expected_values, x, f"cast({group} -> {dtype}, {mode}, {sat})")
        # not only the same values: the same codes (NaN codes may differ in sign/payload)
        non_nan = ~torch.isnan(expected_values)
        assert torch.equal(got.view(torch.uint8)[non_nan], expected.view(torch.uint8)[non_nan])
        # inside the range every saturation agrees with torch, the default one included
        in_range = (x.abs() <= fmt.max) | torch.isnan(x)
        default = sr.cast(x[in_range], dtype, mode, backend=BACKEND).to(torch.float32)
        assert_same(default, expected_values[in_range], x[in_range], f"cast({group}), |x| <= max")
        if sat == "none" and fmt.has_zero:
            # and sr.round agrees, in x's dtype, where the values fit in it
            rounded = sr.round(x, name, mode, backend=BACKEND)
            fits = expected_values.abs() <= torch.finfo(x.dtype).max
            expected_rounded = expected_values.to(x.dtype)[fits]
            assert_same(rounded[fits], expected_rounded, x[fits], f"round({group})")


# --------------------------------------------------------------------------------------
# oracle 2: ml_dtypes' numpy casts from fp32 (round to nearest even)

# ml_dtypes beyond max, found by trying it (ml_dtypes 0.6):
#   float8_e4m3fn/e4m3fnuz/e5m2fnuz: overflow and +-inf give NaN; e5m2, e4m3, e3m4 (IEEE
#   layouts): overflow gives +-inf.  Both are sat='none'.
#   float6_e2m3fn, float6_e3m2fn, float4_e2m1fn (no inf, no NaN): overflow and +-inf
#   saturate to +-max: sat='finite'; NaN has no code (ml_dtypes gives -0): excluded.
#   float8_e8m0fnu: ties round up (1.5 -> 2, 3 -> 4): mode 'rna'; 0 and negatives give NaN
#   (stochround: 2**-127 and NaN): only x > 0 compared; x in [2**-127, 2**-126), fp32
#   subnormals, round as if their fraction bits were a normal mantissa (1.02 * 2**-127 ->
#   2**-126, as torch does): only x >= 2**-126 compared.
ML_DTYPES = [
    ("e4m3fn", ml_dtypes.float8_e4m3fn, "rne", "none"),
    ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz, "rne", "none"),
    ("e5m2", ml_dtypes.float8_e5m2, "rne", "none"),
    ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz, "rne", "none"),
    ("e4m3", ml_dtypes.float8_e4m3, "rne", "none"),
    ("e3m4", ml_dtypes.float8_e3m4, "rne", "none"),
    ("e2m3", ml_dtypes.float6_e2m3fn, "rne", "finite"),
    ("e3m2", ml_dtypes.float6_e3m2fn, "rne", "finite"),
    ("e2m1", ml_dtypes.float4_e2m1fn, "rne", "finite"),
    ("e8m0", ml_dtypes.float8_e8m0fnu, "rna", "none"),
]


@pytest.mark.parametrize(
    ("name", "ml_type", "mode", "sat"), ML_DTYPES, ids=[t[0] for t in ML_DTYPES]
)
def test_ml_dtypes_casts(name, ml_type, mode, sat):
    fmt = sr.format(name)
    x = torch.cat([group.to(torch.float32) for group in input_groups(fmt).values()])
    if not fmt.has_nan:
        x = x[~torch.isnan(x)]
    if not fmt.signed:
        x = x[x > 0]
    if not fmt.has_zero:
        x = x[x >= 2.0**-126]
    expected = torch.from_numpy(x.numpy().astype(ml_type).astype(np.float32))
    got = sr.round(x, name, mode, sat=sat, backend=BACKEND)
    assert_same(got, expected, x, f"round(fp32, {name!r}, {mode}, sat={sat}) vs ml_dtypes")
    in_range = x.abs() <= fmt.max
    assert int(in_range.sum()) > 30000 and int((~in_range).sum()) > 100  # both were checked


# --------------------------------------------------------------------------------------
# oracle 3: gfloat's round_ndarray, every mode, saturation and SR with explicit bits

GFLOAT_MODES = {
    "rz": (RoundMode.TowardZero, None),
    "rd": (RoundMode.TowardNegative, None),
    "ru": (RoundMode.TowardPositive, None),
    "rne": (RoundMode.TiesToEven, None),
    "rna": (RoundMode.TiesToAway, None),
    "sr_c": (RoundMode.Stochastic, "c"),
    "sr_odd": (RoundMode.StochasticOdd, "odd"),
    "sr_b": (RoundMode.StochasticFast, "b"),
    "sr_a": (RoundMode.StochasticFastest, "a"),
}
SR_BITS = (1, 3, 8, 13)


def _p3109(k, p, signed, extended):
    fi = gf.format_info_p3109(
        k,
        p,
        Signedness.Signed if signed else Signedness.Unsigned,
        Domain.Extended if extended else Domain.Finite,
    )
    return fi.name, fi, Format.p3109(k, p, signed=signed, extended=extended)


GFLOAT_FORMATS = [
    ("ocp_e4m3", gf.format_info_ocp_e4m3, sr.format("e4m3fn")),
    ("ocp_e5m2", gf.format_info_ocp_e5m2, sr.format("e5m2")),
    ("ocp_e2m3", gf.format_info_ocp_e2m3, sr.format("e2m3")),
    ("ocp_e3m2", gf.format_info_ocp_e3m2, sr.format("e3m2")),
    ("ocp_e2m1", gf.format_info_ocp_e2m1, sr.format("e2m1")),
    ("ocp_e8m0", gf.format_info_ocp_e8m0, sr.format("e8m0")),
    ("binary16", gf.format_info_binary16, sr.format("binary16")),
    ("bfloat16", gf.format_info_bfloat16, sr.format("bfloat16")),
    _p3109(8, 1, True, True),
    _p3109(8, 1, False, True),
    _p3109(8, 3, True, True),
    _p3109(8, 3, False, False),
    _p3109(8, 4, True, False),
    _p3109(8, 4, False, True),
    _p3109(8, 7, True, True),
    _p3109(8, 8, True, False),
    _p3109(8, 8, False, True),
    _p3109(6, 3, True, True),
    _p3109(4, 2, False, False),
    _p3109(3, 1, True, False),
    _p3109(3, 2, True, True),
]


def gfloat_takes(fi, fmt: Format, sat: bool, x: torch.Tensor) -> torch.Tensor:
    """Which inputs to compare: left out are the values gfloat cannot take or treats
    by another convention:
    NaN in formats without NaN (no code for it); with sat=False, +-inf and finite overflow
    (|x| > max) in formats with neither inf nor NaN (gfloat raises); negative x for
    unsigned formats (gfloat ignores the sign: -3 rounds as 3); for formats without zero
    (e8m0), x below 2**-127 (gfloat has no underflow clamp: it gives 2**floor(log2 x))."""
    keep = torch.ones_like(x, dtype=torch.bool)
    if fi.num_nans == 0:
        keep &= ~torch.isnan(x)
        if not sat and fi.domain != Domain.Extended:
            keep &= x.abs() <= fmt.max
    if not fi.is_signed:
        keep &= ~torch.signbit(x)
    if not fi.has_zero:
        keep &= (x >= fmt.min_normal) | torch.isnan(x)
    return keep


@functools.cache
def gfloat_input_groups(fmt: Format) -> tuple[torch.Tensor, ...]:
    """input_groups, thinned where thinning loses nothing but time: 16-bit patterns more
    than 2**4 below the smallest subnormal or 2**3 above max (which flush to zero or
    overflow in every mode) are kept one in 16; the ~200k midpoints of a 16-bit format,
    one in 4 (torch's conversions check all of them, in rne)."""
    groups = []
    for name, x in input_groups(fmt).items():
        magnitude = x.abs().to(torch.float64)
        if name.endswith("patterns"):
            far = (magnitude < fmt.min_subnormal / 16) | (magnitude > fmt.max * 8)
            far &= torch.isfinite(magnitude) & (magnitude != 0)
            x = x[~far | (torch.arange(x.numel()) % 16 == 0)]
        elif fmt.bits > 8:
            thin = torch.from_numpy(np.random.default_rng(5).integers(0, 4, x.numel())) == 0
            is_midpoint_input = torch.zeros_like(thin)
            count = specials(fmt).numel()
            is_midpoint_input[count : count + midpoints_and_neighbours(fmt).numel()] = True
            x = x[~is_midpoint_input | thin]
        groups.append(x)
    return tuple(groups)


def gfloat_cases(fi, fmt: Format, mode: str):
    """(sat, rbits, x) triples covering every input once per mode and saturation (SR: each
    input goes to one of the 8 (sat, rbits) combinations, drawn at random; directed and
    nearest modes: every input with sat=False, and with sat=True those where saturation
    can act, |x| > max/2 or infinite, and one in 8 of the others)."""
    variant = GFLOAT_MODES[mode][1]
    for index, x in enumerate(gfloat_input_groups(fmt)):
        if variant:
            combos = [(sat, bits) for sat in (False, True) for bits in SR_BITS]
            slot = np.random.default_rng(index).integers(0, len(combos), x.numel())
            slot = torch.from_numpy(slot)
            for number, (sat, bits) in enumerate(combos):
                chosen = x[slot == number]
                yield sat, bits, chosen[gfloat_takes(fi, fmt, sat, chosen)]
        else:
            yield False, None, x[gfloat_takes(fi, fmt, False, x)]
            near = ~torch.isfinite(x) | (x.abs() > fmt.max / 2)
            chosen = x[near | (torch.arange(x.numel()) % 8 == 0)]
            yield True, None, chosen[gfloat_takes(fi, fmt, True, chosen)]


def largest_at_most(bound: float, dtype: torch.dtype) -> float:
    """The largest finite value of a float dtype not above ``bound`` (bound >= 0): from
    every bit pattern of a 16-bit dtype, by nextafter steps in a wider one."""
    if dtype in (torch.bfloat16, torch.float16):
        values = all_bit_patterns(dtype).to(torch.float64)
        return float(values[torch.isfinite(values) & (values <= bound)].max())
    value = torch.tensor(bound, dtype=torch.float64).to(dtype)
    while not bool(torch.isfinite(value)) or float(value) > bound:
        value = torch.nextafter(value, torch.tensor(-math.inf, dtype=dtype))
    return float(value)


def narrowed_as_documented(
    expected: torch.Tensor, fmt: Format, dtype: torch.dtype, saturated: bool
) -> torch.Tensor:
    """float64 results in x's dtype as `sr.round` documents: to nearest, except that a
    finite result beyond the largest value of the dtype within the format's range becomes
    that value (bf16 holds no 65504: fp16's max is 65280 there), where the dtype's range
    holds the format's bound or the call saturates."""
    narrowed = expected.to(dtype)
    dtype_max = torch.finfo(dtype).max

    def bound(value: float) -> float:
        if not saturated and value > dtype_max:
            return math.inf
        return largest_at_most(value, dtype)

    high = bound(fmt.max)
    low = -bound(-fmt.lowest) if fmt.lowest < 0 else -math.inf
    clamped = narrowed.clamp(low, high)
    return torch.where(torch.isfinite(expected), clamped, narrowed)


def compare_with_gfloat(name, fi, fmt, mode) -> int:
    rnd, variant = GFLOAT_MODES[mode]
    checked = 0
    for sat, bits, x in gfloat_cases(fi, fmt, mode):
        x64 = x.to(torch.float64).numpy()
        sr_sat = "finite" if sat else "none"
        if variant:
            srbits = np.random.default_rng(bits).integers(0, 2**bits, x.numel(), dtype=np.int64)
            expected = round_ndarray(fi, x64, rnd, sat, srbits, bits)
            got = sr.round(
                x,
                fmt,
                "sr",
                rbits=bits,
                variant=variant,
                sat=sr_sat,
                rand=torch.from_numpy(srbits),
                backend=BACKEND,
            )
        else:
            expected = round_ndarray(fi, x64, rnd, sat)
            got = sr.round(x, fmt, mode, sat=sr_sat, backend=BACKEND)
        # gfloat's float64 result given x's dtype, as sr.round documents for its result:
        # to nearest, saturated results clamped into the format's range
        expected = narrowed_as_documented(torch.from_numpy(expected), fmt, x.dtype, sat)
        assert_same(got, expected, x, f"{name} {mode} sat={sat} rbits={bits} {x.dtype} inputs")
        checked += x.numel()
    return checked


@pytest.mark.parametrize("mode", list(GFLOAT_MODES))
@pytest.mark.parametrize(("name", "fi", "fmt"), GFLOAT_FORMATS, ids=[f[0] for f in GFLOAT_FORMATS])
def test_gfloat_round_ndarray(name, fi, fmt, mode):
    assert fmt.bits == fi.k and fmt.precision == fi.precision and fmt.bias == fi.bias
    assert compare_with_gfloat(name, fi, fmt, mode) > 30000


@pytest.mark.parametrize("mode", list(GFLOAT_MODES))
def test_gfloat_ocp_int8_scaled(mode):
    """gfloat's ocp_int8 is 1.6 fixed point: int8's values are 2**6 times its values."""
    fmt, fi = sr.format("int8"), gf.format_info_ocp_int8
    rng = np.random.default_rng(8)
    uniform = torch.from_numpy(rng.uniform(-140, 140, 2**14)).to(torch.float32)
    halves = torch.arange(-129, 129, dtype=torch.float32) + 0.5
    x = torch.cat(
        [
            uniform,
            halves,
            torch.nextafter(halves, torch.tensor(math.inf)),
            torch.nextafter(halves, torch.tensor(-math.inf)),
            torch.arange(-130.0, 131.0),
            torch.tensor([0.0, -0.0, 2.0**-20, -(2.0**-20), math.inf, -math.inf]),
        ]
    )

    rnd, variant = GFLOAT_MODES[mode]
    for sat in (False, True):
        xs = x if sat else x[(x >= fmt.lowest) & (x <= fmt.max)]
        x64 = xs.to(torch.float64).numpy() / 64
        sr_sat = "finite" if sat else "none"
        for bits in SR_BITS if variant else (None,):
            if variant:
                srbits = np.random.default_rng(bits).integers(0, 2**bits, xs.numel())
                expected = round_ndarray(fi, x64, rnd, sat, srbits, bits) * 64
                got = sr.round(
                    xs,
                    fmt,
                    "sr",
                    rbits=bits,
                    variant=variant,
                    sat=sr_sat,
                    rand=torch.from_numpy(srbits),
                    backend=BACKEND,
                )
            else:
                expected = round_ndarray(fi, x64, rnd, sat) * 64
                got = sr.round(xs, fmt, mode, sat=sr_sat, backend=BACKEND)
            # neither ocp_int8 nor int8 has a negative zero
            expected = torch.from_numpy(expected).to(xs.dtype)
            assert_same(got, expected, xs, f"int8 {mode} sat={sat} rbits={bits}")
