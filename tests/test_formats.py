"""Tests for stochround.formats (and the code-level helpers of reference/rounding).

Every derived property of every named format is checked against sources written by
others: ``torch.finfo``, ``ml_dtypes.finfo`` and gfloat's ``FormatInfo``; every code of every
format of at most 8 bits is decoded by gfloat/ml_dtypes/torch and compared with
``reference.decode_code`` and ``rounding.decode``.
"""

import functools
import itertools
import math
import os
import pickle
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat import decode_float, decode_ndarray
from gfloat import formats as gf
from gfloat.types import Domain, Signedness

import stochround as sr
from stochround import reference, rounding
from stochround.formats import ALIASES, FORMATS, Format, format_of_dtype

# --------------------------------------------------------------------------------------
# helpers


def same_values(got, expected) -> np.ndarray:
    """Elementwise: both NaN, or identical float64 bit patterns (so -0.0 != +0.0)."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    both_nan = np.isnan(got) & np.isnan(expected)
    return both_nan | (got.view(np.int64) == expected.view(np.int64))


def assert_same_values(got, expected, codes, what: str) -> None:
    ok = same_values(got, expected)
    if not ok.all():
        bad = np.flatnonzero(~ok)[:10]
        got = np.asarray(got, dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        rows = [f"code {int(codes[i]):#x}: expected {expected[i]!r}, got {got[i]!r}" for i in bad]
        raise AssertionError(f"{what}: {(~ok).sum()} mismatches\n" + "\n".join(rows))


@functools.cache
def reference_values(fmt: Format) -> np.ndarray:
    values = np.array([reference.decode_code(c, fmt) for c in range(fmt.num_codes)])
    values.flags.writeable = False
    return values


def rounding_values(fmt: Format, dtype=torch.float64) -> np.ndarray:
    codes = torch.arange(fmt.num_codes, dtype=torch.int64)
    return rounding.decode(codes, fmt, dtype=dtype).to(torch.float64).numpy()


def smallest_positive(values: np.ndarray) -> float:
    values = values[np.isfinite(values) & (values > 0)]
    return float(values.min())


# --------------------------------------------------------------------------------------
# the independent sources

# stochround name -> torch dtype (torch.finfo, and the values of every code by .view)
TORCH_FLOATS = {
    "binary64": torch.float64,
    "binary32": torch.float32,
    "binary16": torch.float16,
    "bfloat16": torch.bfloat16,
    "e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
    "e8m0": torch.float8_e8m0fnu,
}

# stochround name -> ml_dtypes type (ml_dtypes.finfo, and every code by numpy .view)
ML_FLOATS = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2": ml_dtypes.float8_e5m2,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3": ml_dtypes.float8_e4m3,
    "e3m4": ml_dtypes.float8_e3m4,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "bfloat16": ml_dtypes.bfloat16,
}

# (stochround format, gfloat FormatInfo)
GFLOAT_NAMED = [
    ("e4m3fn", gf.format_info_ocp_e4m3),
    ("e5m2", gf.format_info_ocp_e5m2),
    ("e2m3", gf.format_info_ocp_e2m3),
    ("e3m2", gf.format_info_ocp_e3m2),
    ("e2m1", gf.format_info_ocp_e2m1),
    ("e8m0", gf.format_info_ocp_e8m0),
    ("binary16", gf.format_info_binary16),
    ("binary32", gf.format_info_binary32),
    ("binary64", gf.format_info_binary64),
    ("bfloat16", gf.format_info_bfloat16),
]

# Every P3109 format with 3 <= k <= 8, 1 <= p <= k, signed/unsigned, extended/finite.
P3109_PARAMS = [
    (k, p, signed, extended)
    for k in range(3, 9)
    for p in range(1, k + 1)
    for signed in (True, False)
    for extended in (True, False)
]


def p3109_pair(k, p, signed, extended):
    fi = gf.format_info_p3109(
        k,
        p,
        Signedness.Signed if signed else Signedness.Unsigned,
        Domain.Extended if extended else Domain.Finite,
    )
    return Format.p3109(k, p, signed=signed, extended=extended), fi


GFLOAT_ALL = [(FORMATS[name], fi) for name, fi in GFLOAT_NAMED] + [
    p3109_pair(*params) for params in P3109_PARAMS
]
GFLOAT_IDS = [fmt.name for fmt, _ in GFLOAT_ALL]


# --------------------------------------------------------------------------------------
# derived properties


@pytest.mark.parametrize("name", sorted(TORCH_FLOATS))
def test_properties_match_torch_finfo(name):
    fmt = sr.format(name)
    dtype = TORCH_FLOATS[name]
    info = torch.finfo(dtype)
    assert fmt.torch_dtype is dtype
    assert format_of_dtype(dtype) is fmt
    assert fmt.bits == info.bits
    assert fmt.num_codes == 2**info.bits
    assert fmt.max == info.max
    assert fmt.lowest == info.min
    assert fmt.min_normal == info.smallest_normal == info.tiny
    # eps is the distance from 1 to the next value: torch's own cast must keep 1 + eps
    one_plus_eps = torch.tensor([1 + fmt.eps], dtype=torch.float64)
    assert one_plus_eps.to(dtype).item() == 1 + fmt.eps
    if fmt.bits < 64:  # and nothing between 1 and 1 + eps (exact in float64 below 64 bits)
        one_plus_half_eps = torch.tensor([1 + fmt.eps / 2], dtype=torch.float64)
        assert one_plus_half_eps.to(dtype).item() != 1 + fmt.eps / 2
    else:
        one = torch.tensor(1.0, dtype=dtype)
        assert torch.nextafter(one, torch.tensor(2.0, dtype=dtype)).item() == 1 + fmt.eps
    if fmt.eps != info.eps:
        # torch.finfo(float8_e5m2fnuz).eps is 0.125 (torch 2.13), but 1 + 0.125 is not an
        # e5m2fnuz value (two mantissa bits): torch's cast rounds it to 1.0
        assert name == "e5m2fnuz"
        assert torch.tensor([1 + info.eps], dtype=torch.float64).to(dtype).item() == 1.0


@pytest.mark.parametrize("name", sorted(TORCH_FLOATS))
def test_every_code_matches_torch(name):
    """torch's own decoding (view the code as the dtype) of every code (all 65536 for 16
    bits; for fp32/fp64 a sample of codes around the special ones)."""
    fmt = sr.format(name)
    dtype = TORCH_FLOATS[name]
    if fmt.bits <= 16:
        codes = torch.arange(fmt.num_codes, dtype=torch.int64)
    else:
        rng = np.random.default_rng(1)
        edges = [0, 1, 2, 3, 2 ** (fmt.bits - 1)]
        edges += [c - 1 for c in (2 ** (fmt.bits - 1), 2**fmt.bits)]
        edges += [((2**fmt.ebits - 1) << fmt.mbits) + d for d in (-1, 0, 1)]
        edges += [e | 2 ** (fmt.bits - 1) for e in edges]
        sample = rng.integers(0, 2**fmt.bits - 1, size=20000, dtype=np.uint64)
        wrap = 2**fmt.bits if fmt.bits == 64 else 0  # int64 holds 64-bit codes as signed
        codes = [int(c) for c in itertools.chain(edges, sample)]
        codes = torch.tensor([c - wrap if c >= 2**63 else c for c in codes], dtype=torch.int64)
    width = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[fmt.bits]
    torch_values = codes.to(width).view(dtype).to(torch.float64).numpy()
    if fmt.bits <= 8:
        reference_vals = reference_values(fmt)
        assert_same_values(reference_vals, torch_values, codes, f"{name}: reference.decode_code")
    # (16 bits: the reference is compared with rounding.decode in the round-trip test)
    if fmt.bits <= 16:
        assert smallest_positive(torch_values) == fmt.min_subnormal
    else:
        reference_vals = np.array([reference.decode_code(int(c), fmt) for c in codes])
        assert_same_values(reference_vals, torch_values, codes, f"{name}: reference.decode_code")
        assert torch.tensor(1, dtype=width).view(dtype).item() == fmt.min_subnormal
    got = rounding.decode(codes, fmt, dtype=torch.float64).numpy()
    assert_same_values(got, torch_values, codes, f"{name}: rounding.decode")


@pytest.mark.parametrize("name", sorted(ML_FLOATS))
def test_properties_match_ml_dtypes_finfo(name):
    fmt = sr.format(name)
    info = ml_dtypes.finfo(ML_FLOATS[name])
    assert fmt.bits == info.bits
    assert fmt.max == float(info.max)
    assert fmt.lowest == float(info.min)
    assert fmt.min_normal == float(info.smallest_normal)
    assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert fmt.eps == float(info.eps)
    assert fmt.mbits == info.nmant
    assert fmt.precision == info.nmant + 1
    assert fmt.ebits == info.nexp
    assert fmt.emin == info.minexp
    assert fmt.emax == info.maxexp - 1


@pytest.mark.parametrize("name", sorted(n for n in ML_FLOATS if FORMATS[n].bits <= 16))
def test_every_code_matches_ml_dtypes(name):
    fmt = sr.format(name)
    storage = np.uint8 if fmt.bits <= 8 else np.uint16
    codes = np.arange(fmt.num_codes, dtype=storage)
    ml_values = codes.view(ML_FLOATS[name]).astype(np.float64)
    if fmt.bits <= 8:
        assert_same_values(reference_values(fmt), ml_values, codes, f"{name}: reference")
    assert_same_values(rounding_values(fmt), ml_values, codes, f"{name}: rounding.decode")
    negative_zero_code = 1 << (fmt.bits - 1)
    ml_negative_zero = float(ml_values[negative_zero_code])
    ml_has_negative_zero = ml_negative_zero == 0 and math.copysign(1, ml_negative_zero) < 0
    assert fmt.has_negative_zero == ml_has_negative_zero


@pytest.mark.parametrize(("fmt", "fi"), GFLOAT_ALL, ids=GFLOAT_IDS)
def test_properties_match_gfloat(fmt, fi):
    assert fmt.bits == fi.k
    assert fmt.precision == fi.precision
    assert fmt.mbits == fi.tSignificandBits
    assert fmt.ebits == fi.expBits
    assert fmt.signed == fi.is_signed
    assert fmt.bias == fi.bias
    assert fmt.inf == (fi.domain == Domain.Extended)
    assert fmt.has_negative_zero == (fi.is_signed and fi.has_nz)
    assert fmt.has_zero == fi.has_zero
    assert fmt.has_nan == (fi.num_nans > 0)
    assert fmt.num_codes == 2**fi.k
    assert fmt.max == fi.max
    assert fmt.lowest == fi.min
    assert fmt.min_normal == fi.smallest_normal
    assert fmt.min_subnormal == fi.smallest
    if fi.has_subnormals:
        assert fmt.min_subnormal == fi.smallest_subnormal
    # gfloat's emax is floor(math.log2(max)), which rounds up to 1024 for binary64;
    # the exponent of its max, exactly:
    assert fmt.emax == math.frexp(fi.max)[1] - 1
    if fmt.bits < 64:
        assert fmt.emax == fi.emax
    if fi.is_all_subnormal:
        # gfloat's eps is 2**-t, which assumes 1.0 is normal (its source has a TODO on
        # this); an all-subnormal grid is uniform and its spacing is the smallest value.
        assert fmt.eps == fi.smallest_subnormal
        assert fmt.eps != fi.eps
    else:
        assert fmt.eps == fi.eps


@pytest.mark.parametrize(("fmt", "fi"), GFLOAT_ALL, ids=GFLOAT_IDS)
def test_every_code_matches_gfloat(fmt, fi):
    """gfloat's scalar decode_float for formats of at most 8 bits; its vectorized
    decode_ndarray for 16 bits; a sample for 32/64 bits."""
    if fmt.bits <= 8:
        codes = np.arange(fmt.num_codes)
        gfloat_values = np.array([decode_float(fi, int(c)).fval for c in codes])
    elif fmt.bits <= 16:
        codes = np.arange(fmt.num_codes)
        gfloat_values = decode_ndarray(fi, codes)
    else:
        rng = np.random.default_rng(2)
        sample = rng.integers(0, 2**fmt.bits - 1, size=512, dtype=np.uint64)
        codes = [0, 1, 2, 2 ** (fmt.bits - 1), 2 ** (fmt.bits - 1) + 1] + [int(c) for c in sample]
        gfloat_values = np.array([decode_float(fi, c).fval for c in codes])
    if fmt.bits != 16:  # (16 bits: compared with rounding.decode in the round-trip test)
        reference_vals = np.array([reference.decode_code(int(c), fmt) for c in codes])
        assert_same_values(reference_vals, gfloat_values, codes, f"{fmt.name}: reference")
    # codes as int64 holding the bit pattern (as Tensor.view and encode give them)
    wrap = 2**64 if fmt.bits == 64 else 0
    signed_codes = [int(c) - wrap if int(c) >= 2**63 else int(c) for c in codes]
    got = rounding.decode(torch.tensor(signed_codes, dtype=torch.int64), fmt, dtype=torch.float64)
    assert_same_values(got.numpy(), gfloat_values, codes, f"{fmt.name}: rounding.decode")


def test_ocp_int8_is_int8_scaled_by_2_to_the_6():
    """gfloat's ocp_int8 is 1.6 fixed point; stochround's int8 is the integer grid."""
    fmt = sr.format("int8")
    fi = gf.format_info_ocp_int8
    gfloat_values = np.array([decode_float(fi, c).fval * 64 for c in range(256)])
    assert_same_values(reference_values(fmt), gfloat_values, range(256), "int8 vs ocp_int8 * 64")
    assert fmt.max == fi.max * 64
    assert fmt.lowest == fi.min * 64


def test_custom_format_properties_from_first_principles():
    """A format nobody else names: e3m3, bias 5, fn NaN, no inf (7 bits)."""
    fmt = Format(ebits=3, mbits=3, bias=5, inf=False, nan="fn")
    assert fmt.bits == 7
    assert fmt.num_codes == 128
    assert fmt.emin == -4
    assert fmt.min_subnormal == 2.0**-7
    assert fmt.min_normal == 2.0**-4
    assert fmt.max == 1.75 * 2.0**2  # exponent field 7, mantissa 110 (111 is NaN)
    assert fmt.emax == 2
    assert fmt.eps == 0.125
    assert fmt.has_negative_zero
    assert fmt.torch_dtype is None
    assert fmt.name == "e3m3b5f_fn"


# --------------------------------------------------------------------------------------
# integer grids

INTEGER_GRIDS = {
    "int8": (range(-128, 128), torch.int8, None),
    "uint8": (range(256), torch.uint8, None),
    "int4": (range(-8, 8), None, ml_dtypes.int4),
    "uint4": (range(16), None, ml_dtypes.uint4),
}


@pytest.mark.parametrize("name", sorted(INTEGER_GRIDS))
def test_integer_grid_values(name):
    fmt = sr.format(name)
    integers, torch_dtype, ml_type = INTEGER_GRIDS[name]
    values = reference_values(fmt)
    assert sorted(values.tolist()) == [float(i) for i in integers]
    assert_same_values(rounding_values(fmt), values, range(fmt.num_codes), "rounding.decode")
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    if torch_dtype is not None:
        expected = torch.from_numpy(codes).view(torch_dtype).to(torch.float64).numpy()
        assert fmt.torch_dtype is torch_dtype
    else:
        expected = codes.view(ml_type).astype(np.float64)
    assert_same_values(values, expected, codes, f"{name} codes")
    assert fmt.is_integer
    assert fmt.max == max(integers)
    assert fmt.lowest == min(integers)
    assert fmt.min_subnormal == 1.0
    assert fmt.eps == 1.0
    assert fmt.bits == {"int8": 8, "uint8": 8, "int4": 4, "uint4": 4}[name]
    assert not fmt.has_negative_zero
    assert not fmt.has_nan and not fmt.inf


# --------------------------------------------------------------------------------------
# encode/decode round trips and agreement of the two implementations

ROUND_TRIP_FORMATS = (
    [FORMATS[name] for name in FORMATS if FORMATS[name].bits <= 16]
    + [p3109_pair(*params)[0] for params in P3109_PARAMS if params[0] in (3, 5, 8)]
    + [
        Format.cfloat8(4, 3, 20),
        Format.cfloat8(5, 2, 0),
        Format.cfloat8(1, 6, 63),
        Format(ebits=3, mbits=3, bias=5, inf=False, nan="fn"),
        Format(ebits=4, mbits=0, bias=3, signed=False, inf=True, nan="fn"),
        Format(ebits=2, mbits=0, bias=1, inf=False, nan="none", subnormals=False),
        Format(ebits=0, mbits=5, bias=-2, inf=False, nan="none"),
    ]
)


@pytest.mark.parametrize("fmt", ROUND_TRIP_FORMATS, ids=lambda f: f.name)
def test_encode_decode_round_trip(fmt):
    values = reference_values(fmt)
    nan = np.isnan(values)
    canonical_nan = None
    if fmt.has_nan:
        canonical_nan = reference.encode_value(math.nan, fmt)
        assert math.isnan(reference.decode_code(canonical_nan, fmt))
    else:
        assert not nan.any()
        with pytest.raises(ValueError, match="NaN"):
            reference.encode_value(math.nan, fmt)
    expected_codes = np.array(
        [
            canonical_nan if math.isnan(v) else reference.encode_value(v, fmt)
            for v in values.tolist()
        ]
    )
    round_trips = (expected_codes == np.arange(fmt.num_codes)) | nan
    bad = np.flatnonzero(~round_trips)[:10]
    assert round_trips.all(), [(hex(c), values[c], hex(expected_codes[c])) for c in bad]

    # the vectorized decode and encode agree with the reference on every code
    assert_same_values(rounding_values(fmt), values, range(fmt.num_codes), "rounding.decode")
    got = rounding.encode(torch.tensor(values), fmt, backend="torch")
    assert got.dtype == (torch.uint8 if fmt.bits <= 8 else torch.int16)
    got_codes = (got.to(torch.int64) & (fmt.num_codes - 1)).numpy()
    mismatch = np.flatnonzero(got_codes != expected_codes)
    assert mismatch.size == 0, [
        (int(c), values[c], int(got_codes[c]), int(expected_codes[c])) for c in mismatch[:10]
    ]


@pytest.mark.parametrize("fmt", ROUND_TRIP_FORMATS, ids=lambda f: f.name)
def test_decode_to_float32_and_float16(fmt):
    """decode's default float32 result (and float16 where the format fits in it) hold
    the same values as the float64 decoding."""
    values = rounding_values(fmt)
    codes = torch.arange(fmt.num_codes)
    assert_same_values(rounding.decode(codes, fmt).numpy(), values, codes, "float32")
    assert rounding.decode(codes, fmt).dtype == torch.float32
    if fmt.mbits <= 10 and fmt.min_subnormal >= 2.0**-24 and fmt.max <= 65504:
        got = rounding.decode(codes, fmt, dtype=torch.float16).to(torch.float64).numpy()
        assert_same_values(got, values, codes, "float16")


def test_decode_rejects_formats_that_do_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        rounding.decode(torch.arange(4), "bf16", dtype=torch.float16)
    with pytest.raises(ValueError, match="does not fit"):
        rounding.decode(torch.arange(4), "e8m0", dtype=torch.float16)
    with pytest.raises(TypeError, match="codes"):
        rounding.decode(torch.zeros(4), "e4m3fn")


def test_decode_uses_only_the_low_bits():
    codes = torch.tensor([0x38, 0x138, 0xF38], dtype=torch.int64)
    assert rounding.decode(codes, "e4m3fn").tolist() == [1.0, 1.0, 1.0]


def test_reference_encode_known_codes():
    """Hand-written codes from the OCP FP8 spec and IEEE 754."""
    assert reference.encode_value(448.0, "e4m3fn") == 0x7E
    assert reference.encode_value(-448.0, "e4m3fn") == 0xFE
    assert reference.encode_value(2.0**-9, "e4m3fn") == 0x01
    assert reference.encode_value(math.nan, "e4m3fn") == 0x7F
    assert reference.encode_value(57344.0, "e5m2") == 0x7B
    assert reference.encode_value(math.inf, "e5m2") == 0x7C
    assert reference.encode_value(-math.inf, "e5m2") == 0xFC
    assert reference.encode_value(math.nan, "e5m2") == 0x7E
    assert reference.encode_value(-0.0, "e5m2") == 0x80
    assert reference.encode_value(-0.0, "e4m3fnuz") == 0x00
    assert reference.encode_value(math.nan, "e4m3fnuz") == 0x80
    assert reference.encode_value(1.0, "bf16") == 0x3F80
    assert reference.encode_value(65504.0, "fp16") == 0x7BFF
    assert reference.encode_value(1.0, "e8m0") == 127
    assert reference.encode_value(math.nan, "e8m0") == 0xFF
    assert reference.encode_value(-1.0, "int8") == 0xFF
    assert reference.encode_value(-128.0, "int8") == 0x80
    assert reference.encode_value(6.0, "e2m1") == 0x7
    assert reference.encode_value(-0.5, "e2m1") == 0x9


# --------------------------------------------------------------------------------------
# the registry


@pytest.mark.parametrize(("alias", "name"), sorted(ALIASES.items()))
def test_every_alias_resolves(alias, name):
    assert sr.format(alias) is FORMATS[name]
    assert sr.format(alias.upper()) is FORMATS[name]
    assert sr.format(alias.swapcase().capitalize()) is FORMATS[name]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_name_resolves_case_insensitively(name):
    fmt = FORMATS[name]
    assert fmt.name == name
    assert sr.format(name) is fmt
    assert sr.format(name.upper()) is fmt
    assert sr.format(f"  {name.title()} ") is fmt
    assert sr.format(fmt) is fmt
    assert str(fmt) == name


def test_aliases_match_the_formats_they_describe():
    """Aliases that spell out a layout describe that layout."""
    for alias, name in ALIASES.items():
        fmt = FORMATS[name]
        for width, dtype_name in ((8, "float8_"), (6, "float6_"), (4, "float4_")):
            if alias.startswith(dtype_name):
                assert fmt.bits == width, alias
    assert sr.format("float8_e4m3fn").nan == "fn"
    assert sr.format("float8_e5m2fnuz").nan == "fnuz"
    assert sr.format("fp16") == Format(5, 10)
    assert sr.format("bf16") == Format(8, 7)
    assert sr.format("fp32") == Format(8, 23)
    assert sr.format("fp64") == Format(11, 52)
    assert sr.format("tf32") == Format(8, 10)


@pytest.mark.parametrize(("k", "p", "signed", "extended"), P3109_PARAMS[::7])
def test_p3109_names_parse(k, p, signed, extended):
    name = f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if extended else 'f'}"
    fmt = sr.format(name)
    assert fmt == Format.p3109(k, p, signed=signed, extended=extended)
    assert fmt.name == name
    assert sr.format(name.upper()) == fmt


def test_p3109_k8p4se_is_the_default_p3109():
    fmt = sr.format("p3109_k8p4se")
    assert fmt == Format.p3109(8, 4)
    assert (fmt.ebits, fmt.mbits, fmt.bias, fmt.signed, fmt.inf, fmt.nan) == (
        4,
        3,
        8,
        True,
        True,
        "fnuz",
    )
    assert fmt.max == 224.0  # 0x7E: 1.110 * 2**7; 0x7F is +inf, 0x80 NaN
    assert math.isinf(reference.decode_code(0x7F, fmt))
    assert math.isnan(reference.decode_code(0x80, fmt))


@pytest.mark.parametrize(
    ("name", "ebits", "mbits", "bias"),
    [
        ("cfloat8_e4m3_b20", 4, 3, 20),
        ("cfloat8_e5m2_b0", 5, 2, 0),
        ("CFloat8_E1M6_B63", 1, 6, 63),
    ],
)
def test_cfloat8_names_parse(name, ebits, mbits, bias):
    fmt = sr.format(name)
    assert fmt == Format.cfloat8(ebits, mbits, bias)
    assert (fmt.ebits, fmt.mbits, fmt.bias, fmt.inf, fmt.nan, fmt.signed) == (
        ebits,
        mbits,
        bias,
        False,
        "none",
        True,
    )
    assert fmt.bits == 8
    assert fmt.max == (2 - 2.0**-mbits) * 2.0 ** (2**ebits - 1 - bias)
    assert fmt.min_subnormal == 2.0 ** (1 - bias - mbits)


def test_unknown_name_suggests_close_names():
    with pytest.raises(ValueError, match="e4m3fn") as info:
        sr.format("e4m3fm")
    assert "unknown format 'e4m3fm'" in str(info.value)
    with pytest.raises(ValueError, match=r"bfloat16|bf16"):
        sr.format("bfloat61")
    with pytest.raises(ValueError, match="unknown format"):
        sr.format("zzzzzz")
    with pytest.raises(ValueError, match="unknown format"):
        sr.format("p3109_k8p4xe")
    with pytest.raises(TypeError, match="format"):
        sr.format(8)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Format(ebits=4, mbits=3, inf=False, nan="ieee"), "nan='ieee'.*inf=True"),
        (lambda: Format(ebits=0, mbits=3, bias=0, nan="ieee"), "nan='ieee'.*ebits >= 1"),
        (lambda: Format(ebits=4, mbits=3, signed=False, nan="fnuz", inf=False), "fnuz.*signed"),
        (lambda: Format(ebits=4, mbits=3, subnormals=False, nan="fn", inf=False), "subnormals"),
        (lambda: Format(ebits=16, mbits=3), "ebits"),
        (lambda: Format(ebits=-1, mbits=3), "ebits"),
        (lambda: Format(ebits=2.0, mbits=3), "ebits"),
        (lambda: Format(ebits=4, mbits=53), "mbits"),
        (lambda: Format(ebits=4, mbits=-1), "mbits"),
        (lambda: Format(ebits=0, mbits=0, bias=0, nan="none", inf=False), "at least one"),
        (lambda: Format(ebits=4, mbits=3, nan="sometimes"), "nan must be one of"),
        (lambda: Format(ebits=4, mbits=3, bias=2000), "bias"),
        (lambda: Format(ebits=1, mbits=0, signed=False, nan="fn", inf=True), "no finite"),
        (lambda: Format(ebits=4, mbits=3, twos_complement=True), "twos_complement"),
        (lambda: Format.cfloat8(4, 3, 64), "bias"),
        (lambda: Format.cfloat8(4, 3, -1), "bias"),
        (lambda: Format.cfloat8(4, 4, 7), "ebits \\+ mbits"),
        (lambda: Format.p3109(8, 9), "p must be"),
        (lambda: Format.p3109(1, 1), "k must be"),
        (lambda: Format.integer(1), "bits"),
    ],
)
def test_invalid_formats_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bias_must_be_an_int():
    with pytest.raises(TypeError, match="bias"):
        Format(ebits=4, mbits=3, bias=7.0)


def test_formats_are_frozen_and_compare_by_layout():
    fmt = sr.format("e4m3fn")
    with pytest.raises(AttributeError):
        fmt.bias = 3
    same = Format(ebits=4, mbits=3, inf=False, nan="fn", name="another_name")
    assert same == fmt
    assert hash(same) == hash(fmt)
    assert Format(ebits=4, mbits=3, inf=False, nan="fn", bias=8) != fmt


def test_a_pickled_format_finds_its_equal_in_another_process():
    """A format's hash is cached (and pickled with it): it must not depend on the process's
    str hash seed, or an unpickled format would miss its equal in dicts and caches."""
    fmt = sr.format("e4m3fn")
    hash(fmt)  # cached before pickling
    code = (
        "import pickle, sys, stochround as sr; fmt = pickle.loads(sys.stdin.buffer.read()); "
        "print({sr.format('e4m3fn'): 'found'}.get(fmt))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(fmt),
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert found.stdout.decode().strip() == "found"


def test_public_names():
    assert sr.encode is rounding.encode and sr.decode is rounding.decode
    assert sr.FORMATS is FORMATS
    assert set(itertools.chain(FORMATS)) >= {
        "binary16",
        "bfloat16",
        "e4m3fn",
        "e5m2",
        "e2m1",
        "e8m0",
        "int8",
    }
