"""`stochround.nn.streams`: the data-parallel key of x's and dy's words, its folding with
the tensor-parallel key, and its checks."""

from __future__ import annotations

import pytest

from stochround.nn.recipes import ROLES
from stochround.nn.streams import DATA_ROLES, data_rank_key
from stochround.nn.tensor_parallel import RANK_KEY_STEP, rank_key
from stochround.random import StreamDomain, domain_constant, stream_key

MASK64 = (1 << 64) - 1


def test_the_data_roles_are_the_operands_of_x_and_dy() -> None:
    assert {role for role in ROLES if not role.endswith("_weight")} == DATA_ROLES


def test_rank_zero_keeps_the_layers_key() -> None:
    key = int(stream_key(7, StreamDomain.RECIPE))
    assert data_rank_key(key, 0) == key
    assert data_rank_key(key, 1) == key ^ (1 << 32)


def test_tensor_and_data_parallel_ranks_give_distinct_keys() -> None:
    """Every (tensor-parallel, data-parallel) pair of a 64 x 64 grid, and the grid's
    corners up to 2**32 - 1, keys the layer's words apart."""
    key = int(stream_key(3, StreamDomain.RECIPE))
    ranks = [*range(64), (1 << 32) - 1, (1 << 31) + 5]
    keys = {data_rank_key(rank_key(key, t), d) for t in ranks for d in ranks}
    assert len(keys) == len(ranks) ** 2


@pytest.mark.parametrize("domain", [d for d in StreamDomain if d != StreamDomain.RECIPE])
def test_a_ranked_layer_key_is_no_other_consumers_key_of_the_same_seed(domain) -> None:
    """The recipes' key of a seed, folded with a TP rank t and a DP rank d, equals another
    domain's key of that seed only if ``t * RANK_KEY_STEP ^ (d << 32)`` is the two domain
    constants' xor: its low 32 bits fix t, which is above 2**25 for every domain."""
    difference = domain_constant(StreamDomain.RECIPE) ^ domain_constant(domain)
    low = difference & 0xFFFFFFFF
    t = low * pow(RANK_KEY_STEP & 0xFFFFFFFF, -1, 1 << 32) % (1 << 32)
    assert t >= 1 << 25
    d = (difference ^ (t * RANK_KEY_STEP & MASK64)) >> 32
    seed = 11
    ranked = data_rank_key(rank_key(int(stream_key(seed, StreamDomain.RECIPE)), t), d)
    assert ranked == int(stream_key(seed, domain))  # the one pair that collides


@pytest.mark.parametrize(
    ("rank", "error", "message"),
    [
        (-1, ValueError, r"data_parallel_rank must be in \[0, 2\*\*32\), got -1"),
        (1 << 32, ValueError, r"data_parallel_rank must be in \[0, 2\*\*32\)"),
        ("1", TypeError, "data_parallel_rank must be an int, got str"),
        (True, TypeError, "data_parallel_rank must be an int, got bool"),
    ],
)
def test_a_bad_rank_is_refused(rank, error, message) -> None:
    with pytest.raises(error, match=message):
        data_rank_key(0, rank)
