"""Counter-based random bits: ``(seed, offset, global element index) -> 32-bit word``.

Every word is a pure function of its inputs, so the PyTorch path here and the Triton
kernels (:mod:`stochround.kernels.philox`) produce the same bits on every device, for
every sharding, eager or compiled.

The mapping (the definition both paths implement)::

    g                  = index >> 2                     # one Philox call per 4 elements
    lane               = index & 3
    (c0, c1, c2, c3)   = (g mod 2**32, g >> 32, offset mod 2**32, offset >> 32)
    (k0, k1)           = (seed mod 2**32, seed >> 32)
    word(index)        = philox4x32_10((c0, c1, c2, c3), (k0, k1))[lane]

with ``seed, offset`` in ``[0, 2**64)`` and ``index`` read modulo ``2**64``. Philox4x32-10
is the generator of Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC11),
exactly as Triton's ``tl.philox(seed, c0, c1, c2, c3)`` computes it for 32-bit counters
(which also matches the Random123 known-answer vectors). Elements ``4g .. 4g+3`` share
one Philox block, and since ``offset`` fills the upper half of the counter, the streams
of two different ``(seed, offset)`` pairs never share a counter block.

Stream domains (`StreamDomain`, `stream_key`). Every consumer of random bits draws with
the Philox key ``stream_key(seed, domain)``, its seed XORed with a constant of its own::

    key(seed, domain) = seed ^ ((domain * 0x9E3779B97F4A7C15) mod 2**64)

Domain 0 (`StreamDomain.ROUNDING`, a user's ``stochround.round(..., seed=s)``) keeps its
seed as the key, so those bits are unchanged; every other consumer (the optimizers, the
quantized-training recipes, GaussWS, `stochround.emulate`, the experiments) has a domain
of its own.  The constants are the golden-ratio Weyl sequence, ``d * c`` with ``c`` odd:
distinct for distinct domains, so equal seeds in two domains are always different keys,
and for one domain the map is a bijection of the seeds (no two seeds share a key).  Why
the key and not the counter: each consumer already spends the counter's 128 bits (the
element index fills the lower half, its own ``step * 2**32 + ...`` layout the upper), so
there are no spare counter bits to give a domain without narrowing a layout, whereas the
key is the seed alone; and a different key is a different Philox permutation, so the two
domains' words are independent whatever offsets their layouts produce.  XOR costs one
integer operation on an int or on an int64 device tensor (no host read, traceable by
`torch.compile`, capturable in a CUDA graph), and the kernels take the key exactly as
they took the seed.

Besides the PRNG, :func:`data_words` is a state-free, data-derived source: a hash of a
value's bit pattern and its global index.  :class:`Stream` is the one stateful object: a
``(seed, offset)`` that the rounding functions' ``stream=`` advances by one offset a call.
"""

from __future__ import annotations

import enum
import numbers
from typing import Protocol, TypeVar, cast

import torch
from torch import Tensor

__all__ = [
    "PHILOX_KEY_A",
    "PHILOX_KEY_B",
    "PHILOX_ROUND_A",
    "PHILOX_ROUND_B",
    "Stream",
    "StreamDomain",
    "as_signed64",
    "as_unsigned64",
    "bit_pattern",
    "check_index",
    "check_index_offset",
    "check_seed",
    "data_words",
    "default_seed",
    "default_seed_tensor",
    "group_counters",
    "philox4x32",
    "philox_rounds",
    "random_words",
    "random_words_like",
    "seed_tensor",
    "stream_key",
]

PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85

# murmur3's 32-bit finalizer constants, and the constants data_words folds with.
FMIX_MULTIPLIER_1 = 0x85EBCA6B
FMIX_MULTIPLIER_2 = 0xC2B2AE35
DATA_INDEX_KEY = 0x9E3779B9
DATA_HIGH_MULTIPLIER = 0x27D4EB2F

MASK32 = 0xFFFFFFFF
MASK16 = 0xFFFF
TWO_POW_64 = 1 << 64
INT64_MAX = (1 << 63) - 1

IntLike = int | Tensor


# --------------------------------------------------------------------------------------
# exact 32-bit arithmetic in int64 tensors
# --------------------------------------------------------------------------------------


TWO_POW_32 = 1 << 32


def _mulhilo32(constant: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(hi, lo)`` of the exact 64-bit product ``constant * x`` (both in ``[0, 2**32)``).

    For a constant in ``(2**31, 2**32)``, as the Philox multipliers are: ``constant * x =
    p + x 2**32`` with ``p = x (constant - 2**32)``, one int64 multiply of magnitude below
    ``2**63`` (which traced code vectorizes), so ``hi = floor(p / 2**32) + x`` and ``lo = p
    mod 2**32``.  Otherwise ``constant = b1 * 2**16 + b0``, so ``constant * x = x*b0 + (t1 *
    2**16 + t0) * 2**16`` with ``t = x*b1``; every intermediate stays below ``2**49``.
    """
    if 2**31 < constant < TWO_POW_32:
        product = x * (constant - TWO_POW_32)
        return (product >> 32) + x, product & MASK32
    high_part = x * (constant >> 16)  # < 2**48
    partial = x * (constant & MASK16) + ((high_part & MASK16) << 16)  # < 2**49
    hi = (partial >> 32) + (high_part >> 16)
    lo = partial & MASK32
    return hi, lo


def _mullo32(x: Tensor, constant: int) -> Tensor:
    """``(x * constant) mod 2**32`` for ``x, constant`` in ``[0, 2**32)``, without int64 wrap."""
    high_part = (x * (constant >> 16)) & MASK16
    return (x * (constant & MASK16) + (high_part << 16)) & MASK32


def _fmix32(h: Tensor) -> Tensor:
    """murmur3's finalizer, a bijection of ``[0, 2**32)``:
    ``h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16``."""
    h = h ^ (h >> 16)
    h = _mullo32(h, FMIX_MULTIPLIER_1)
    h = h ^ (h >> 13)
    h = _mullo32(h, FMIX_MULTIPLIER_2)
    return h ^ (h >> 16)


def _as_word_tensor(value: IntLike, device: torch.device | None) -> Tensor:
    if isinstance(value, Tensor):
        return (value.to(torch.int64) if value.dtype != torch.int64 else value) & MASK32
    return torch.tensor(int(value) & MASK32, dtype=torch.int64, device=device)


# --------------------------------------------------------------------------------------
# Philox4x32
# --------------------------------------------------------------------------------------


def philox4x32(
    c0: IntLike,
    c1: IntLike,
    c2: IntLike,
    c3: IntLike,
    k0: IntLike,
    k1: IntLike,
    rounds: int = 10,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32 with ``rounds`` rounds on counter ``(c0, c1, c2, c3)`` and key ``(k0, k1)``.

    One round, with ``A = 0xD2511F53``, ``B = 0xCD9E8D57`` and ``hi, lo`` the halves of
    the exact 64-bit product::

        (c0, c1, c2, c3) <- (hi(B*c2) ^ c1 ^ k0,  lo(B*c2),  hi(A*c0) ^ c3 ^ k1,  lo(A*c0))
        (k0, k1)         <- (k0 + 0x9E3779B9,  k1 + 0xBB67AE85)  mod 2**32

    Inputs are int64 tensors (or Python ints) read modulo ``2**32`` and broadcast together;
    the four outputs are int64 tensors of the broadcast shape holding values in
    ``[0, 2**32)``. This is Triton's ``philox_impl`` for uint32 counters, bit for bit.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral):
        raise TypeError(f"rounds must be an int, got {type(rounds).__name__}")
    if rounds < 0:
        raise ValueError(f"rounds must be non-negative, got {rounds}")
    inputs = (c0, c1, c2, c3, k0, k1)
    device = next((v.device for v in inputs if isinstance(v, Tensor)), None)
    words = [_as_word_tensor(v, device) for v in inputs]
    shape = torch.broadcast_shapes(*(v.shape for v in words))
    outputs = philox_rounds(*words, rounds=rounds)
    return tuple(v.expand(shape) if v.shape != shape else v for v in outputs)  # type: ignore[return-value]


def philox_rounds(
    c0: Tensor, c1: Tensor, c2: Tensor, c3: Tensor, k0: Tensor, k1: Tensor, rounds: int = 10
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The rounds of `philox4x32` on int64 tensors already holding words in ``[0, 2**32)``
    (broadcast together; the outputs have the broadcast shape only where an input does):
    no checks, integer tensor operations only, so traced code (`stochround.cpu_path`)
    computes the stream with this very function."""
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo32(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo32(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


# --------------------------------------------------------------------------------------
# seeds and offsets
# --------------------------------------------------------------------------------------


def check_seed(value: object, name: str) -> int | Tensor:
    """A seed or offset, checked: an int in ``[0, 2**64)`` (any integral type: a numpy
    integer, or a `torch.SymInt` under `torch.compile`; returned as an int or SymInt), or a
    single-element int64 tensor (two's complement for values at or above ``2**63``); the
    ValueError/TypeError name it ``name``."""
    if type(value) is int and 0 <= value < TWO_POW_64:  # the common case, before the ABCs
        return value
    if isinstance(value, torch.SymInt):
        # a traced int (a step counter under torch.compile): its range becomes a guard
        if not 0 <= value < TWO_POW_64:
            raise ValueError(f"{name} must be in [0, 2**64), got {value}")
        return cast(int, value)  # a SymInt stands for an int
    if isinstance(value, Tensor):
        if value.dtype != torch.int64:
            raise TypeError(f"{name} must be an int or an int64 tensor, got a {value.dtype} tensor")
        if value.numel() != 1:
            raise ValueError(
                f"{name} must be a 0-d (single-element) tensor, got shape {tuple(value.shape)}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or a 0-d int64 tensor, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value < TWO_POW_64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def as_signed64(value: int) -> int:
    """A seed or offset in ``[0, 2**64)`` as the signed 64-bit integer of the same bits
    (two's complement at or above ``2**63``): what an op schema's int and an int64 tensor
    hold.  Works on a `torch.SymInt` too (a guard on its range)."""
    return value - TWO_POW_64 if value > INT64_MAX else value


def as_unsigned64(value: int) -> int:
    """The inverse of `as_signed64`: a signed 64-bit integer back in ``[0, 2**64)``."""
    return value + TWO_POW_64 if value < 0 else value


class StreamDomain(enum.IntEnum):
    """The consumers of random bits, each mixed into its own Philox keys by `stream_key`
    (module docstring): equal seeds in two domains never draw the same words."""

    ROUNDING = 0  # stochround.round / cast / encode / Stream with seed=: the key is the seed
    OPTIMIZER = 1  # stochround.optim's rounded stores
    RECIPE = 2  # stochround.nn.QuantizedLinear's operands and RHT signs
    GAUSSWS = 3  # stochround.nn.GaussWS's sampled weights
    EMULATE = 4  # stochround.emulate / stochround.mca
    EXPERIMENT = 5  # stochround.experiments' own draws


# the golden-ratio Weyl increment: odd, so d -> d * DOMAIN_MULTIPLIER mod 2**64 is a
# bijection (distinct domains, distinct constants) with 0 -> 0 (ROUNDING's key is its seed)
DOMAIN_MULTIPLIER = 0x9E3779B97F4A7C15


def domain_constant(domain: StreamDomain) -> int:
    """``(domain * 0x9E3779B97F4A7C15) mod 2**64``: what `stream_key` XORs ``domain``'s seeds
    with, in [0, 2**64)."""
    if not isinstance(domain, StreamDomain):
        raise TypeError(
            f"domain must be a StreamDomain (one of {[d.name for d in StreamDomain]}), "
            f"got {type(domain).__name__}"
        )
    return (int(domain) * DOMAIN_MULTIPLIER) % TWO_POW_64


def stream_key(seed: int | Tensor, domain: StreamDomain) -> int | Tensor:
    """The Philox key of consumer ``domain`` given its ``seed``:
    ``seed ^ ((domain * 0x9E3779B97F4A7C15) mod 2**64)`` (module docstring).

    ``seed``: an int in ``[0, 2**64)`` (an int comes back) or a single-element int64 tensor,
    two's complement at and above ``2**63`` (a tensor of the same shape and device comes
    back, computed on the device: no host synchronization, traceable by `torch.compile`).
    `StreamDomain.ROUNDING` returns the seed itself.  Mix a seed once, where a consumer
    hands it to the streams: a key passed here again is another key.
    """
    constant = domain_constant(domain)
    seed = check_seed(seed, "seed")
    if isinstance(seed, Tensor):
        return seed ^ as_signed64(constant) if constant else seed
    return seed ^ constant


def _split_u64(value: int | Tensor, name: str, device: torch.device) -> tuple[IntLike, IntLike]:
    """Validate a 64-bit seed/offset and return its ``(low, high)`` 32-bit halves.

    Ints stay Python ints; a tensor is split on ``device`` without a host synchronization.
    """
    value = check_seed(value, name)
    if isinstance(value, Tensor):
        value = value.reshape(()).to(device)
        return value & MASK32, (value >> 32) & MASK32
    return value & MASK32, value >> 32


def check_index(index: Tensor) -> Tensor:
    """``index`` as int64, checked to be an integer tensor of global element indices (read
    modulo ``2**64`` by the streams); TypeError otherwise."""
    if not isinstance(index, Tensor):
        raise TypeError(f"index must be an integer tensor, got {type(index).__name__}")
    if index.dtype == torch.bool or index.dtype.is_floating_point or index.dtype.is_complex:
        raise TypeError(f"index must be an integer tensor, got a {index.dtype} tensor")
    return index if index.dtype == torch.int64 else index.to(torch.int64)


_Bits = TypeVar("_Bits", bound="_Shiftable")


class _Shiftable(Protocol):
    """An int64 value with the two operators `group_counters` applies."""

    def __rshift__(self: _Bits, other: int) -> _Bits: ...

    def __and__(self: _Bits, other: int) -> _Bits: ...


def group_counters(index: _Bits) -> tuple[_Bits, _Bits]:
    """Philox's first two counter words of element ``index`` (an int64 value: a tensor, or
    any value with ``>>`` and ``&``, such as Inductor's): its group ``g = index >> 2`` as
    ``(g mod 2**32, g >> 32)``, the high word masked: a logical shift of the index read
    mod 2**64."""
    return (index >> 2) & MASK32, (index >> 34) & (MASK32 >> 2)


def random_words(index: Tensor, seed: int | Tensor, offset: int | Tensor = 0) -> Tensor:
    """The 32-bit words of global element indices ``index`` in stream ``(seed, offset)``.

    ``word = philox4x32_10((g mod 2**32, g >> 32, offset mod 2**32, offset >> 32),
    (seed mod 2**32, seed >> 32))[index & 3]`` with ``g = index >> 2`` (module docstring).

    Returns an int64 tensor shaped like ``index``, on its device, with values in
    ``[0, 2**32)``. ``seed`` and ``offset`` are ints in ``[0, 2**64)`` or single-element
    int64 tensors (values ``>= 2**63`` as two's complement) that may live on the device.
    """
    index = check_index(index)
    key0, key1 = _split_u64(seed, "seed", index.device)
    counter2, counter3 = _split_u64(offset, "offset", index.device)
    group_low, group_high = group_counters(index)
    outputs = philox4x32(group_low, group_high, counter2, counter3, key0, key1)
    stacked = torch.stack(outputs, dim=-1)
    lane = (index & 3).unsqueeze(-1)
    return torch.gather(stacked, -1, lane).squeeze(-1)


def check_index_offset(index_offset: object, count: int = 0) -> int:
    """``index_offset`` checked for a tensor of ``count`` elements: an int (a numpy integer
    too; TypeError otherwise) in ``[0, 2**63 - count]`` (ValueError otherwise), so that
    every element's index fits in the stream's 63 bits.  A `torch.SymInt` (a traced int
    under `torch.compile`) is checked by a guard and kept."""
    if isinstance(index_offset, torch.SymInt):
        if index_offset < 0:  # a guard on the traced value
            raise ValueError(f"index_offset must be in [0, 2**63 - {count}], got {index_offset}")
        return cast(int, index_offset)  # a SymInt stands for an int
    if isinstance(index_offset, bool) or not isinstance(index_offset, numbers.Integral):
        raise TypeError(f"index_offset must be an int, got {type(index_offset).__name__}")
    if not 0 <= int(index_offset) <= (1 << 63) - count:
        raise ValueError(f"index_offset must be in [0, 2**63 - {count}], got {index_offset}")
    return int(index_offset)


def random_words_like(
    x: Tensor, seed: int | Tensor, offset: int | Tensor = 0, index_offset: int = 0
) -> Tensor:
    """Words for a contiguous logical tensor shaped like ``x``: row-major element ``i`` gets
    ``random_words(index_offset + i, seed, offset)``.

    A shard covering global elements ``[start, start + x.numel())`` passes
    ``index_offset=start`` and so draws the words the unsharded tensor would. Computes one
    Philox block per four elements. Returns an int64 tensor shaped like ``x``, on its device.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    count = x.numel()
    index_offset = check_index_offset(index_offset, count)
    device = x.device
    key0, key1 = _split_u64(seed, "seed", device)
    counter2, counter3 = _split_u64(offset, "offset", device)
    if count == 0:
        return torch.empty(x.shape, dtype=torch.int64, device=device)
    first_group = index_offset >> 2
    last_group = (index_offset + count - 1) >> 2
    groups = torch.arange(first_group, last_group + 1, dtype=torch.int64, device=device)
    outputs = philox4x32(groups & MASK32, groups >> 32, counter2, counter3, key0, key1)
    words = torch.stack(outputs, dim=-1).reshape(-1)
    start = index_offset & 3
    return words[start : start + count].reshape(x.shape)


def seed_tensor(value: int | Tensor, name: str, device: torch.device) -> Tensor:
    """A one-element int64 tensor on ``device`` holding the seed or offset ``value`` in
    [0, 2**64) (two's complement above 2**63), checked as `check_seed` does (errors name it
    ``name``); a tensor is moved, not copied twice."""
    value = check_seed(value, name)
    if isinstance(value, Tensor):
        return value.reshape(1).to(device)
    if value >= TWO_POW_64 // 2:
        value -= TWO_POW_64
    # a fill, not a host-to-device copy: no synchronization, and CUDA graphs can capture it
    return torch.full((1,), value, dtype=torch.int64, device=device)


def default_seed() -> int:
    """A seed in ``[0, 2**64)`` drawn from torch's default CPU generator (two 32-bit draws,
    ``low + 2**32 * high``), so ``torch.manual_seed`` makes runs reproducible."""
    halves = torch.randint(0, 1 << 32, (2,), dtype=torch.int64, device="cpu")
    low, high = (int(v) for v in halves)
    return low | (high << 32)


def default_seed_tensor() -> Tensor:
    """`default_seed` as a one-element int64 CPU tensor (two's complement above 2**63):
    the same two draws of torch's default generator, with no host read of them, so
    `torch.compile` traces it (the seed of a ``seed=None`` call there)."""
    halves = torch.randint(0, 1 << 32, (2,), dtype=torch.int64, device="cpu")
    return halves[:1] | (halves[1:] << 32)


class Stream:
    """A stateful random stream, as `torch.Generator` is for torch's random functions:
    pass it as ``stream=`` to `stochround.round`, `cast` or `encode`, and each call that
    draws random words (SR without ``rand=``) draws them from ``(seed, offset)`` and then
    advances ``offset`` by one.

    An offset is the upper half of the Philox counter (module docstring): each one is a
    stream of its own, which shares no word with any other, whatever the elements' indices.
    So one step per call moves past every word the call used, however many elements it
    rounded, and consecutive calls draw fresh bits — where a fixed ``(seed, offset)``
    reused in a loop gives each element the same threshold at every step.

    ``seed``: an int in ``[0, 2**64)``, or None to draw one from torch's default generator
    (`default_seed`: ``torch.manual_seed`` makes it reproducible); ``offset``: the first
    call's offset, in ``[0, 2**64)`` (it wraps to 0 after ``2**64 - 1``); ``device``:
    where the offset is kept (default: the CPU).  The offset lives in a one-element int64
    tensor advanced in place, so that `torch.compile` traces a call without specializing
    on its value (a stream held by an `nn.Module` compiles once), and a stream on the
    CUDA device can be captured in a CUDA graph, whose replays each advance it.  Outside
    `torch.compile` a CPU stream passes its offset as an int (no copy to the device).
    `state_dict` / `load_state_dict` save and restore it as two ints.
    """

    def __init__(
        self, seed: int | None = None, offset: int = 0, device: torch.device | str | None = None
    ) -> None:
        self.seed = default_seed() if seed is None else _int_state(seed, "seed")
        where = torch.device("cpu" if device is None else device)
        self._offset = seed_tensor(_int_state(offset, "offset"), "offset", where)

    @property
    def offset(self) -> int:
        """The offset the next call draws from (a read of the device tensor: it waits)."""
        return as_unsigned64(int(self._offset[0]))

    @property
    def device(self) -> torch.device:
        """Where the offset is kept."""
        return self._offset.device

    def take(self) -> tuple[int, int | Tensor]:
        """The ``(seed, offset)`` of the next call, advancing the offset by one: the offset
        as an int from a CPU stream outside `torch.compile`, as a one-element int64 tensor
        (two's complement above ``2**63``) otherwise."""
        offset = self._offset
        if offset.device.type == "cpu" and not torch.compiler.is_compiling():
            value = as_unsigned64(int(offset[0]))
            offset.add_(1)  # int64 arithmetic wraps: 2**64 - 1 (as -1) + 1 is 0
            return self.seed, value
        taken = offset.clone()
        offset.add_(1)
        return self.seed, taken

    def state_dict(self) -> dict[str, int]:
        """The stream's state: ``{"seed": seed, "offset": offset}`` (the next call's)."""
        return {"seed": self.seed, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a state saved by `state_dict` (both keys required, ints checked); the
        offset is written into the stream's tensor in place."""
        if not isinstance(state, dict) or set(state) != {"seed", "offset"}:
            raise ValueError(
                f"state must be a dict with keys 'seed' and 'offset' (Stream.state_dict()); "
                f"got {state!r}"
            )
        seed, offset = _int_state(state["seed"], "seed"), _int_state(state["offset"], "offset")
        self.seed = seed
        self._offset.fill_(as_signed64(offset))

    def __repr__(self) -> str:
        device = "" if self.device.type == "cpu" else f", device={str(self.device)!r}"
        return f"Stream(seed={self.seed}, offset={self.offset}{device})"


def _int_state(value: object, name: str) -> int:
    """A Stream's seed or offset: an int in [0, 2**64) (a Python or numpy integer; a tensor
    is refused: the state saves as ints)."""
    if isinstance(value, Tensor):
        raise TypeError(f"a Stream's {name} must be an int, got a tensor")
    return int(check_seed(value, name))


# --------------------------------------------------------------------------------------
# data-derived words
# --------------------------------------------------------------------------------------


_UNSIGNED_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_pattern(bits: Tensor) -> Tensor:
    """The unsigned bit pattern of ``bits`` as int64 (read modulo 2**64 for 64-bit dtypes)."""
    if not isinstance(bits, Tensor):
        raise TypeError(f"bits must be a tensor, got {type(bits).__name__}")
    if bits.dtype == torch.bool or bits.dtype.is_complex:
        raise TypeError(f"bits must be an integer or floating tensor, got a {bits.dtype} tensor")
    width = bits.element_size()
    if width not in _UNSIGNED_VIEW:
        raise TypeError(f"bits must have a 1, 2, 4 or 8 byte dtype, got {bits.dtype}")
    if bits.dtype.is_floating_point:
        bits = bits.view(_UNSIGNED_VIEW[width])
    if width == 8:
        return bits.to(torch.int64)
    return bits.to(torch.int64) & ((1 << (8 * width)) - 1)


def data_words(bits: Tensor, index: Tensor) -> Tensor:
    """State-free, data-derived 32-bit words hashed from each value's bits and global index.

    With ``fmix32`` murmur3's finalizer (a bijection of ``[0, 2**32)``), all arithmetic
    modulo ``2**32``, ``(b_lo, b_hi)`` and ``(i_lo, i_hi)`` the 32-bit halves of the
    value's bit pattern and of the index::

        u    = fmix32(i_lo ^ (i_hi * 0x27D4EB2F) ^ 0x9E3779B9)      # index hash
        word = fmix32(fmix32(b_lo ^ (b_hi * 0x27D4EB2F) ^ u) ^ u)

    ``bits`` holds raw bit patterns: an integer tensor is read as unsigned of its own
    width (int64 modulo ``2**64``, so pass ``x.view(torch.int32)`` or its zero-extension,
    not a sign-extended int64, for 32-bit values) and a floating tensor is reinterpreted
    (``x.view`` as the same-width integer). For a fixed index, distinct 32-bit patterns
    always give distinct words. ``bits`` and ``index`` broadcast; the result is int64 in
    ``[0, 2**32)`` on their device.
    """
    pattern = bit_pattern(bits)
    index = check_index(index)
    index_hash = _fmix32(
        (index & MASK32) ^ _mullo32((index >> 32) & MASK32, DATA_HIGH_MULTIPLIER) ^ DATA_INDEX_KEY
    )
    folded = (pattern & MASK32) ^ _mullo32((pattern >> 32) & MASK32, DATA_HIGH_MULTIPLIER)
    return _fmix32(_fmix32(folded ^ index_hash) ^ index_hash)
