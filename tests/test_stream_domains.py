"""Stream domains (`stochround.random.StreamDomain`, `stream_key`): the keys, and that every
consumer of random bits given one seed draws words no other consumer draws."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch

import stochround as sr
import stochround.cpu_path
import stochround.random
from stochround.emulate import emulate
from stochround.nn import GaussWS, QuantizedLinear
from stochround.nn.recipes import nvfp4
from stochround.optim import SGD, AdamW, state_stream_offset
from stochround.random import StreamDomain, random_words, stream_key

SEED = 1234
# Weyl constants d * 0x9E3779B97F4A7C15 mod 2**64, written out: the registry's definition
CONSTANTS = {
    StreamDomain.ROUNDING: 0,
    StreamDomain.OPTIMIZER: 0x9E3779B97F4A7C15,
    StreamDomain.RECIPE: 0x3C6EF372FE94F82A,
    StreamDomain.GAUSSWS: 0xDAA66D2C7DDF743F,
    StreamDomain.EMULATE: 0x78DDE6E5FD29F054,
    StreamDomain.EXPERIMENT: 0x1715609F7C746C69,
}


def test_domains_are_the_documented_table() -> None:
    assert {d.name: int(d) for d in StreamDomain} == {
        "ROUNDING": 0,
        "OPTIMIZER": 1,
        "RECIPE": 2,
        "GAUSSWS": 3,
        "EMULATE": 4,
        "EXPERIMENT": 5,
    }


@pytest.mark.parametrize("domain", list(StreamDomain))
@pytest.mark.parametrize("seed", [0, 1, SEED, 2**63 - 1, 2**63, 2**64 - 1])
def test_stream_key_is_the_seed_xor_the_domain_constant(domain: StreamDomain, seed: int) -> None:
    key = stream_key(seed, domain)
    assert type(key) is int and key == seed ^ CONSTANTS[domain]
    assert 0 <= key < 2**64


def test_rounding_domain_keeps_the_seed() -> None:
    """User calls' bits are unchanged: ROUNDING's key is the seed itself."""
    assert stream_key(SEED, StreamDomain.ROUNDING) == SEED
    tensor = torch.tensor([-5], dtype=torch.int64)
    assert stream_key(tensor, StreamDomain.ROUNDING) is tensor


@pytest.mark.parametrize("domain", list(StreamDomain))
@pytest.mark.parametrize("seed", [0, SEED, 2**63 - 1, 2**63, 2**64 - 1])
def test_tensor_seed_gives_the_int_key_in_twos_complement(domain: StreamDomain, seed: int) -> None:
    signed = seed - 2**64 if seed >= 2**63 else seed
    for shape in ((), (1,)):
        tensor = torch.full(shape, signed, dtype=torch.int64)
        key = stream_key(tensor, domain)
        assert isinstance(key, torch.Tensor)
        assert key.dtype == torch.int64 and key.shape == tensor.shape
        assert int(key.reshape(())) % 2**64 == stream_key(seed, domain)


def test_tensor_key_draws_the_int_keys_words() -> None:
    index = torch.arange(16)
    for domain in StreamDomain:
        tensor_key = stream_key(torch.tensor(2**64 - 3 - 2**64), domain)
        expected = random_words(index, stream_key(2**64 - 3, domain), 7)
        assert torch.equal(random_words(index, tensor_key, 7), expected)


def test_stream_key_compiles_without_a_graph_break() -> None:
    def draw(seed: torch.Tensor) -> torch.Tensor:
        key = stream_key(seed, StreamDomain.OPTIMIZER)
        return random_words(torch.arange(8), key, 3)

    seed = torch.tensor(SEED, dtype=torch.int64)
    compiled = torch.compile(draw, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(seed), draw(seed))
    assert torch.equal(draw(seed), random_words(torch.arange(8), SEED ^ CONSTANTS[1], 3))


def test_equal_seeds_in_two_domains_give_distinct_keys() -> None:
    for seed in (0, 1, SEED, 2**64 - 1):
        keys = [stream_key(seed, domain) for domain in StreamDomain]
        assert len(set(keys)) == len(keys)


def test_stream_key_errors() -> None:
    with pytest.raises(TypeError, match="domain must be a StreamDomain"):
        stream_key(1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        stream_key(-1, StreamDomain.OPTIMIZER)
    with pytest.raises(TypeError, match="seed must be an int or an int64 tensor"):
        stream_key(torch.tensor(1.0), StreamDomain.OPTIMIZER)


# --------------------------------------------------------------------------------------
# the overlap test: one seed, every consumer, no shared word
# --------------------------------------------------------------------------------------


Block = tuple[int, int, int, int]


def recorded(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[], None]
) -> tuple[set[Block], set[tuple[int, int]]]:
    """The Philox blocks (four 32-bit words) ``run`` computes on the PyTorch path, and the
    ``(key, offset)`` streams they come from: every stream word there comes from
    `stochround.random.philox_rounds`."""
    blocks: set[Block] = set()
    streams: set[tuple[int, int]] = set()
    original = stochround.random.philox_rounds

    def recording(*args: torch.Tensor, rounds: int = 10) -> tuple[torch.Tensor, ...]:
        outputs = original(*args, rounds=rounds)  # type: ignore[arg-type]
        if rounds == 10:
            shape = torch.broadcast_shapes(*(v.shape for v in outputs))
            stacked = torch.stack([v.expand(shape).reshape(-1) for v in outputs], dim=-1)
            blocks.update(tuple(int(w) for w in row) for row in stacked.tolist())
            _, _, c2, c3, k0, k1 = (v.expand(shape).reshape(-1) for v in args)
            pairs = zip(k0.tolist(), k1.tolist(), c2.tolist(), c3.tolist(), strict=True)
            streams.update((lo | hi << 32, c_lo | c_hi << 32) for lo, hi, c_lo, c_hi in pairs)
        return outputs

    with monkeypatch.context() as patch:
        patch.setattr(stochround.random, "philox_rounds", recording)
        patch.setattr(stochround.cpu_path, "philox_rounds", recording)
        run()
    return blocks, streams


def recorded_blocks(monkeypatch: pytest.MonkeyPatch, run: Callable[[], None]) -> set[Block]:
    return recorded(monkeypatch, run)[0]


def recorded_keys(monkeypatch: pytest.MonkeyPatch, run: Callable[[], None]) -> set[int]:
    return {key for key, _ in recorded(monkeypatch, run)[1]}


def optimizer_step(optimizer: type) -> Callable[[], None]:
    def run() -> None:
        param = torch.nn.Parameter(torch.linspace(-1, 1, 64).to(torch.bfloat16))
        param.grad = torch.linspace(0.5, -0.3, 64).to(torch.bfloat16)
        optimizer([param], lr=1e-2, seed=SEED, backend="torch").step()

    return run


def quantized_linear_step() -> None:
    """Two training steps of layer 0 (steps 0 and 1: an optimizer's first step is 1)."""
    layer = QuantizedLinear(32, 16, recipe=nvfp4(seed=SEED), layer_index=0)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for _ in range(2):
        layer(x).sum().backward()


def gaussws_sample() -> None:
    sampling = GaussWS("e3m2", block=32, seed=SEED, layer_index=0, backend="torch")
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    sampling(w)


def emulated_op() -> None:
    a = torch.randn(64, generator=torch.Generator().manual_seed(2))
    with emulate("bfloat16", "sr", seed=SEED):
        _ = a * 3.0


def rounding_call() -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    sr.round(x, "bfloat16", "sr", seed=SEED, offset=0)


CONSUMERS: dict[str, Callable[[], None]] = {
    "rounding": rounding_call,
    "AdamW": optimizer_step(AdamW),
    "SGD": optimizer_step(SGD),
    "QuantizedLinear": quantized_linear_step,
    "GaussWS": gaussws_sample,
    "emulate": emulated_op,
}


def pairs(names: list[str]) -> Iterator[tuple[str, str]]:
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            yield first, second


def test_consumers_with_one_seed_share_no_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the same seed, a rounding call, an optimizer step (AdamW and SGD share the
    optimizers' domain but are separate runs: compared across domains only), a
    QuantizedLinear step, a GaussWS sample and an emulated op draw disjoint Philox blocks.
    Before the domains, AdamW's parameter 0 at step 1 and QuantizedLinear's layer 0 at
    step 0 drew from overlapping offsets of one key."""
    drawn = {name: recorded_blocks(monkeypatch, run) for name, run in CONSUMERS.items()}
    for name, blocks in drawn.items():
        assert blocks, f"{name} drew no words on the PyTorch path"
    shared = {
        (first, second): len(drawn[first] & drawn[second])
        for first, second in pairs(list(drawn))
        if {first, second} != {"AdamW", "SGD"}
    }
    assert shared == dict.fromkeys(shared, 0)


@pytest.mark.parametrize(
    ("name", "domain"),
    [
        ("rounding", StreamDomain.ROUNDING),
        ("AdamW", StreamDomain.OPTIMIZER),
        ("SGD", StreamDomain.OPTIMIZER),
        ("QuantizedLinear", StreamDomain.RECIPE),
        ("GaussWS", StreamDomain.GAUSSWS),
        ("emulate", StreamDomain.EMULATE),
    ],
)
def test_each_consumer_draws_with_its_domains_key(
    monkeypatch: pytest.MonkeyPatch, name: str, domain: StreamDomain
) -> None:
    assert recorded_keys(monkeypatch, CONSUMERS[name]) == {stream_key(SEED, domain)}


def test_optimizer_streams_are_the_key_at_the_documented_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AdamW's first step on parameter 0: the key at offsets 2**32 + slot (param 0, the
    two moments 1 and 2)."""
    _, streams = recorded(monkeypatch, CONSUMERS["AdamW"])
    key = stream_key(SEED, StreamDomain.OPTIMIZER)
    assert streams == {(key, state_stream_offset(1, 0, slot)) for slot in (0, 1, 2)}


def adamw_run(seed: int) -> tuple[torch.nn.Parameter, AdamW]:
    param = torch.nn.Parameter(torch.linspace(-1, 1, 64).to(torch.bfloat16))
    return param, AdamW([param], lr=1e-2, seed=seed, backend="torch")


def adamw_step(param: torch.nn.Parameter, optimizer: AdamW, scale: float) -> None:
    param.grad = (torch.linspace(0.5, -0.3, 64) * scale).to(torch.bfloat16)
    optimizer.step()


def test_an_optimizer_checkpoint_keeps_its_keys_and_seed_and_loads_unmixed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A state dict has the keys it had before the domains (the group's seed, not the key),
    and one saved by a fresh optimizer (as the code before the domains wrote it) loads:
    the next step continues bit for bit with the seed's key, mixed once (not twice)."""
    param, optimizer = adamw_run(SEED)
    adamw_step(param, optimizer, 1.0)
    state = copy.deepcopy(optimizer.state_dict())  # as saved: the step below moves none
    assert state["param_groups"][0]["seed"] == SEED
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    saved = param.detach().clone()
    adamw_step(param, optimizer, -2.0)

    resumed_param, resumed = adamw_run(7)
    with torch.no_grad():
        resumed_param.copy_(saved)
    resumed.load_state_dict(state)
    assert resumed.param_groups[0]["seed"] == SEED

    def step() -> None:
        adamw_step(resumed_param, resumed, -2.0)

    _, streams = recorded(monkeypatch, step)
    key = stream_key(SEED, StreamDomain.OPTIMIZER)
    assert streams == {(key, state_stream_offset(2, 0, slot)) for slot in (0, 1, 2)}
    assert torch.equal(resumed_param.view(torch.int16), param.view(torch.int16))


def test_a_fresh_optimizers_state_dict_loads() -> None:
    """The keys an optimizer saved before its first step (no state yet) load as before."""
    _, fresh = adamw_run(SEED)
    state = fresh.state_dict()
    assert state["state"] == {} and state["param_groups"][0]["seed"] == SEED
    param, optimizer = adamw_run(5)
    optimizer.load_state_dict(state)
    assert optimizer.param_groups[0]["seed"] == SEED
    adamw_step(param, optimizer, 1.0)
    reference, reference_optimizer = adamw_run(SEED)
    adamw_step(reference, reference_optimizer, 1.0)
    assert torch.equal(param.view(torch.int16), reference.view(torch.int16))


def test_quantized_linear_and_gaussws_state_dicts_keep_their_keys() -> None:
    """The modules keep the recipe's / the user's seed and save only their step buffers, as
    before: a checkpoint loads, and continues with the domain's key."""
    layer = QuantizedLinear(32, 16, recipe=nvfp4(seed=SEED), layer_index=0)
    assert set(layer.state_dict()) == {"weight", "bias", "step"}
    sampling = GaussWS("e3m2", block=32, seed=SEED, layer_index=0, backend="torch")
    assert set(sampling.state_dict()) == {"step"}
    assert sampling.seed == SEED and sampling.key == stream_key(SEED, StreamDomain.GAUSSWS)
