"""stochround inside torchtitan 0.3.0: the converter on torchtitan's Llama 3 configs, the SR
optimizers from the optimizer config, the offline data, a converted model's forward and
backward on the CPU (torchtitan's trainer does not run on the CPU: it takes CUDA when no
accelerator is found, and FlexAttention has no CPU backward), and ``stochround titan``."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from titan_versions import torchtitan_mismatch

if reason := torchtitan_mismatch("0.3.0", "torchtitan"):
    pytest.skip(reason, allow_module_level=True)

from helpers import assert_seeded_sr_steps, seeded_sr_steps
from ranks import run_ranks
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.common.decoder_sharding import colwise_config, rowwise_config
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module

import stochround as sr
from stochround.integrations.torchtitan import (
    StochroundConverter,
    StochroundLinear,
    converted_paths,
    make_recipe,
    sr_optimizer,
    titan_config,
)
from stochround.integrations.torchtitan.attention import dense_attention
from stochround.integrations.torchtitan.config_registry import (
    TENSOR_PARALLEL_SPMD_BACKEND,
    adamw,
    stochround_debugmodel_nvfp4,
)
from stochround.nn.opaque_matmul import registered_plan
from stochround.nn.tensor_parallel import rank_key

SRC = Path(__file__).resolve().parents[2] / "src"
DEBUG_LINEARS = [
    f"layers.{i}.{name}"
    for i in range(6)
    for name in (
        "attention.qkv_linear.wqkv",
        "attention.wo",
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
    )
]


def linear_paths(model_config: object) -> list[str]:
    return [path for path, *_ in model_config.traverse(Linear.Config)]  # type: ignore[attr-defined]


def built(config, device: str = "cpu") -> torch.nn.Module:
    """The model of a trainer config, built as torchtitan's trainer builds it."""
    model_config = dense_attention(config.model_spec.model)
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    model.verify_module_protocol()
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def test_converter_swaps_every_linear_of_the_debug_model_but_the_head() -> None:
    model = stochround_debugmodel_nvfp4().model_spec.model
    assert converted_paths(model) == dict.fromkeys(DEBUG_LINEARS, "nvfp4")
    assert type(model.lm_head) is Linear.Config
    indices = [config.layer_index for _, config, _, _ in model.traverse(StochroundLinear.Config)]
    assert indices == list(range(30))
    first = model.layers[0].feed_forward.w1
    assert first.recipe == sr.nn.nvfp4(keep=("lm_head",))
    # the linear's own config fields carried over (its init, no bias)
    assert first.param_init is not None and first.bias is False


def test_rules_keep_chosen_blocks_in_bf16_and_give_others_their_recipe() -> None:
    converter = StochroundConverter.Config(
        recipe="nvfp4",
        switches={"stochastic_rounding": False},
        seed=7,
        rules=[(r"layers\.0\..*", None), (r"layers\.5\.feed_forward\..*", "int8")],
    ).build()
    model = converter.convert(titan_config("bf16").model_spec.model)
    paths = converted_paths(model)
    assert [p for p in DEBUG_LINEARS if p not in paths] == DEBUG_LINEARS[:5]
    assert {p for p, name in paths.items() if name == "int8"} == {
        f"layers.5.feed_forward.{w}" for w in ("w1", "w2", "w3")
    }
    assert "lm_head" in linear_paths(model)
    assert model.layers[1].attention.wo.recipe.seed == 7
    assert model.layers[1].attention.wo.recipe.spec("dgrad_grad_output").mode == "rne"


def test_the_converted_model_has_the_plain_models_parameters() -> None:
    plain = built(titan_config("bf16", flavor="tiny"))
    quantized = built(titan_config("nvfp4", flavor="tiny"))
    assert isinstance(quantized.layers["0"].feed_forward.w1, StochroundLinear)
    assert type(quantized.lm_head).__name__ == "Linear"
    plain_params = dict(plain.named_parameters())
    quantized_params = dict(quantized.named_parameters())
    assert plain_params.keys() == quantized_params.keys()
    for name, param in plain_params.items():
        assert torch.equal(param, quantized_params[name]), name
    # a plain checkpoint loads strictly; the quantized one adds the step counters only
    extra = set(quantized.state_dict()) - set(plain.state_dict())
    assert extra == {f"layers.{i}.{p}.step" for i in (0, 1) for p in (
        "attention.qkv_linear.wqkv", "attention.wo", "feed_forward.w1",
        "feed_forward.w2", "feed_forward.w3",
    )}  # fmt: skip
    quantized.load_state_dict(plain.state_dict(), strict=False)
    assert int(quantized.layers["0"].attention.wo.step) == 0


def test_forward_and_backward_of_the_converted_model_on_the_cpu() -> None:
    model = built(titan_config("nvfp4", flavor="tiny"))
    tokens = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(32).repeat(2, 1)
    masks = model.get_attention_masks(positions)
    logits = model(tokens, attention_masks=masks, positions=positions)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    layer = model.layers["1"].feed_forward.w2
    assert int(layer.step) == 1
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def train_steps(model: torch.nn.Module, steps: int = 2) -> list[torch.Tensor]:
    """A plain loop of SGD steps on fixed tokens: each step's loss, every gradient and
    every step counter."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    positions = torch.arange(32).repeat(2, 1)
    masks = model.get_attention_masks(positions)
    seen: list[torch.Tensor] = []
    for _ in range(steps):
        tokens = torch.randint(0, 258, (2, 32), generator=generator)
        optimizer.zero_grad()
        logits = model(tokens, attention_masks=masks, positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        seen.append(loss.detach().clone())
        seen += [p.grad.clone() for p in model.parameters() if p.grad is not None]
        seen += [b.clone() for b in model.buffers() if b.dtype == torch.int64]
        optimizer.step()
    return seen


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_checkpointed_model_trains_as_the_plain_one_bit_for_bit(mode: str) -> None:
    """The tiny nvfp4 model with torchtitan's activation checkpointing applied as its
    parallelize step applies it (``ac_config.build().apply(model)``) gives the losses,
    gradients and step counters of the same model without it, bit for bit, for two
    steps (before, titan_config had no activation checkpointing to turn on)."""
    config = titan_config("nvfp4", flavor="tiny", activation_checkpoint=mode)
    assert isinstance(
        config.activation_checkpoint, FullAC.Config if mode == "full" else SelectiveAC.Config
    )
    plain = built(titan_config("nvfp4", flavor="tiny"))
    checkpointed = built(config)
    config.activation_checkpoint.build(dump_folder="").apply(checkpointed)
    assert type(checkpointed.layers["0"]).__name__ == "CheckpointWrapper"
    got, expected = train_steps(checkpointed), train_steps(plain)
    assert len(got) == len(expected) and len(expected) > 2 * 25
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(mine, theirs), index
    assert int(checkpointed.layers["1"].feed_forward.w2.step) == 2


def test_an_unknown_activation_checkpoint_raises() -> None:
    assert titan_config("nvfp4", flavor="tiny").activation_checkpoint is None
    with pytest.raises(
        ValueError, match="activation_checkpoint must be one of none, full, selective"
    ):
        titan_config("nvfp4", flavor="tiny", activation_checkpoint="memory-budget")


def test_unknown_recipe_and_misfit_layer_raise() -> None:
    with pytest.raises(ValueError, match="recipe must be one of bf16, nvfp4"):
        make_recipe("nvfp5")
    with pytest.raises(ValueError, match="recipe 'bf16' takes no switches"):
        make_recipe("bf16", {"rht": False})
    converter = StochroundConverter.Config(recipe="nvfp4").build()
    with pytest.raises(ValueError, match=r"^: .*leave it in bf16"):
        converter.convert(Linear.Config(in_features=24, out_features=32))


def test_the_full_dtensor_backend_is_refused() -> None:
    config = StochroundLinear.Config(in_features=32, out_features=32, recipe=sr.nn.int8())
    with torch.device("meta"):
        layer = config.build()
    dims = types.SimpleNamespace(tp=1, spmd_backend="full_dtensor")
    with pytest.raises(
        ValueError, match=r"spmd_backend in spmd_types, partial_dtensor.*got 'full_dtensor'"
    ):
        layer.parallelize(dims)


@pytest.mark.parametrize(
    ("sharding", "tp", "message"),
    [
        # colwise: 64 outputs over 4 ranks, 16 a rank; mxfp8's dgrad blocks of 32 along them
        (
            colwise_config,
            4,
            r"under parallelism\.tensor_parallel_degree=4 each rank "
            r"quantizes its local weight \(16, 64\): a block would straddle",
        ),
        # rowwise: 64 inputs over 4 ranks, 16 a rank: the fprop blocks of 32
        (rowwise_config, 4, r"local weight \(64, 16\)"),
        (colwise_config, 3, r"tensor_parallel_degree=3 does not divide the weight's axis 0"),
    ],
)
def test_a_block_straddling_two_tensor_parallel_shards_is_refused(sharding, tp, message) -> None:
    """Checked before the layer is parallelized, naming its path."""
    config = StochroundLinear.Config(
        in_features=64,
        out_features=64,
        recipe=sr.nn.mxfp8(),
        path="layers.0.feed_forward.w1",
        sharding_config=sharding(),
    )
    with torch.device("meta"):
        layer = config.build()
    dims = types.SimpleNamespace(tp=tp, spmd_backend="spmd_types")
    with pytest.raises(ValueError, match=r"^layers\.0\.feed_forward\.w1: .*" + message):
        layer.parallelize(dims)


def tp_body(rank: int, world_size: int, device: str, recipe: str) -> dict[str, object]:
    """The tiny model under ``recipe``, once whole and once tensor parallel over the ranks
    as torchtitan's trainer parallelizes it (its Llama 3 sharding configs, sequence
    parallel, the ``spmd_types`` backend, ``model.parallelize`` on ``meta``), with the
    whole model's weights: each rank's logits (its vocabulary shard) and gradients under
    a loss linear in the logits, the whole model's beside them, and the layers' TP ranks
    and Philox keys."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    def build(tp: int) -> tuple[object, torch.nn.Module]:
        config = titan_config(recipe, flavor="tiny")
        config.parallelism.tensor_parallel_degree = tp
        model_config = dense_attention(config.model_spec.model)
        model_config.update_from_config(config=config)
        with torch.device("meta"):
            return config, model_config.build()

    _, whole = build(1)
    whole.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        whole.init_weights(buffer_device=None)
    config, sharded = build(world_size)
    dims = ParallelDims.from_config(config.parallelism, world_size)  # type: ignore[attr-defined]
    dist_utils.set_spmd_backend("spmd_types")
    out: dict[str, object] = {}
    with dist_utils.get_spmd_context(parallel_dims=dims)():
        sharded.parallelize(dims)
        sharded.to_empty(device="cpu")
        with torch.no_grad():
            sharded.init_weights(buffer_device=None)  # the buffers (RoPE, step counters)
            full = dict(whole.named_parameters())
            for name, param in sharded.named_parameters():
                param.copy_(shard_of(full[name], param.shape, rank, world_size))
        tokens = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(3))
        positions = torch.arange(32).repeat(2, 1)
        for name, model in (("whole", whole), ("tp", sharded)):
            logits = model(
                tokens, attention_masks=model.get_attention_masks(positions), positions=positions
            )
            weights = torch.randn(
                (*logits.shape[:-1], 2048), generator=torch.Generator().manual_seed(4)
            )
            (logits * shard_of(weights, logits.shape, rank, world_size)).sum().backward()
            out[f"{name}.logits"] = logits.detach()
            for path, param in model.named_parameters():
                out[f"{name}.{path}"] = param.grad.detach().clone()
    layers = [m for m in sharded.modules() if isinstance(m, StochroundLinear)]
    plain = [m for m in whole.modules() if isinstance(m, StochroundLinear)]
    out["tp_ranks"] = {m.tp_rank for m in layers}
    out["keys"] = [(p.plan.seed, m.plan.seed) for p, m in zip(plain, layers, strict=True)]
    # the compiled layer's ops take the registered plan: the rank's key too
    out["registered"] = [registered_plan(m.plan_index, -1).seed == m.plan.seed for m in layers]
    out["step"] = int(sharded.layers["1"].feed_forward.w2.step)
    return out


def shard_of(whole: torch.Tensor, shape: torch.Size, rank: int, ranks: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``whole`` with the local ``shape`` (the whole tensor where
    the shapes agree; else its ``rank``-th chunk along the axis they differ on)."""
    axes = [axis for axis in range(whole.dim()) if whole.shape[axis] != shape[axis]]
    return whole if not axes else whole.chunk(ranks, axes[0])[rank]


def test_tensor_parallelism_with_torchtitans_llama3_sharding_on_two_gloo_ranks() -> None:
    """mxfp8 (blocks of 32 along each GEMM's contraction axis, round to nearest: a shard
    quantizes as the whole does): the tensor-parallel logits and linears' gradients are
    the rank's shards of the whole model's, up to the order of sums (a rowwise layer's
    output is a sum across ranks; its gradients came out bit-equal).  Before, the
    converter refused tensor parallelism."""
    results = run_ranks(tp_body, "mxfp8", device="cpu")
    for rank, result in enumerate(results):
        assert result["step"] == 1
        assert result["tp_ranks"] == {rank}
        assert all(key == rank_key(whole, rank) for whole, key in result["keys"])
        assert all(result["registered"])
        names = [k[6:] for k in result if k.startswith("whole.")]
        linears = [n for n in names if "norm" not in n]  # the norms' gradients: partial sums
        assert len(linears) == 1 + 1 + 2 * 5 + 1  # logits, embeddings, 10 linears, head
        for name in linears:
            whole = result[f"whole.{name}"]
            mine = result[f"tp.{name}"]
            expected = shard_of(whole, mine.shape, rank, len(results))
            torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-5, msg=name)


def test_a_tensor_parallel_config_takes_the_partial_dtensor_backend() -> None:
    """torchtitan 0.3.0's default SPMD backend stops its trainer in FSDP2's wrapping under
    tensor parallelism (a bf16 model too): `titan_config` sets `TENSOR_PARALLEL_SPMD_BACKEND`
    there, and leaves torchtitan's default without it."""
    assert titan_config("bf16", flavor="tiny").parallelism.spmd_backend == "spmd_types"
    parallel = titan_config("nvfp4", flavor="tiny", tensor_parallel_degree=2).parallelism
    assert parallel.tensor_parallel_degree == 2
    assert parallel.spmd_backend == TENSOR_PARALLEL_SPMD_BACKEND == "partial_dtensor"


def dp_body(rank: int, world_size: int, device: str) -> dict[str, object]:
    """The tiny model under nvfp4 (SR gradients) parallelized as torchtitan's trainer does
    with ``data_parallel_shard_degree`` over the ranks (``model.parallelize``; FSDP2 itself
    does not run on gloo under 0.3.0), the same weights and tokens on every rank: the
    layers' data-parallel ranks and keys, the logits and the linears' gradients."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    from stochround.nn.streams import DATA_ROLES, data_rank_key

    config = titan_config("nvfp4", flavor="tiny")
    config.parallelism.data_parallel_shard_degree = world_size
    dims = ParallelDims.from_config(config.parallelism, world_size)  # type: ignore[attr-defined]
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    model_config = dense_attention(config.model_spec.model)
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    out: dict[str, object] = {}
    with dist_utils.get_spmd_context(parallel_dims=dims)():
        model.parallelize(dims)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        tokens = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(3))
        positions = torch.arange(32).repeat(2, 1)
        logits = model(
            tokens, attention_masks=model.get_attention_masks(positions), positions=positions
        )
        logits.float().square().mean().backward()
    layers = [m for m in model.modules() if isinstance(m, StochroundLinear)]
    out["ranks"] = {m.data_parallel_rank for m in layers}
    out["keys"] = all(
        m.plan.key_of(role)
        == (data_rank_key(m.plan.seed, rank) if role in DATA_ROLES else m.plan.seed)
        for m in layers
        for role in sr.nn.recipes.ROLES
    )
    out["registered"] = all(
        registered_plan(m.plan_index, -1).data_parallel_rank == rank for m in layers
    )
    out["logits"] = logits.detach()
    out["grads"] = [m.weight.grad.detach().clone() for m in layers]
    return out


def test_data_parallel_ranks_key_the_words_of_x_and_dy_on_two_gloo_ranks() -> None:
    """Each converted layer takes its rank on torchtitan's ``loss`` mesh (here FSDP's
    ``dp_shard`` axis): on the same weights and tokens the ranks' logits are equal (nvfp4's
    forward rounds to nearest, and the weight's words are one key's) and the linears'
    weight gradients differ (each rank's dy draws its own SR words)."""
    first, second = run_ranks(dp_body, device="cpu")
    assert (first["ranks"], second["ranks"]) == ({0}, {1})
    assert all(result["keys"] and result["registered"] for result in (first, second))
    assert torch.equal(first["logits"], second["logits"])
    pairs = zip(first["grads"], second["grads"], strict=True)
    assert all(not torch.equal(a, b) for a, b in pairs)


def build_sr_adamw(model: torch.nn.Module, seed: int) -> torch.optim.Optimizer:
    """``titan_config``'s SRAdamW of ``seed`` on ``model``."""
    config = titan_config("bf16", optimizer="SRAdamW", seed=seed)
    (optimizer,) = config.optimizer.build(model_parts=[model]).optimizers
    return optimizer


def test_a_configs_sr_optimizer_draws_by_its_seed_whatever_torchs_generator_did() -> None:
    """The config's seed is the SR optimizer's: two builds after other draws take the same
    words, another seed other words."""
    assert_seeded_sr_steps(seeded_sr_steps(build_sr_adamw))


@pytest.mark.parametrize(
    ("name", "cls", "states"),
    [
        ("SRAdamW", sr.optim.AdamW, ("exp_avg", "exp_avg_sq")),
        ("SRSGD", sr.optim.SGD, ("momentum_buffer",)),
        ("SRLion", sr.optim.Lion, ("exp_avg",)),
    ],
)
def test_the_optimizer_config_builds_the_sr_optimizer(name, cls, states) -> None:
    model = torch.nn.Linear(8, 4)
    kwargs = {"momentum": 0.9} if name == "SRSGD" else {}
    container = sr_optimizer(name, lr=1e-2, **kwargs).build(model_parts=[model])
    (optimizer,) = container.optimizers
    assert type(optimizer) is cls
    model(torch.ones(2, 8)).sum().backward()
    container.step()
    state = optimizer.state[model.weight]
    assert {state[key].dtype for key in states} == {torch.bfloat16}
    with pytest.raises(ValueError, match="name must be one of SRAdamW"):
        sr_optimizer("SRAdamax")


def test_torch_adamw_stays_available() -> None:
    model = torch.nn.Linear(8, 4)
    (optimizer,) = adamw(1e-3).build(model_parts=[model]).optimizers
    assert type(optimizer) is torch.optim.AdamW


def test_torchtitans_parallelize_places_the_step_counters(monkeypatch) -> None:
    """torchtitan's ``Module.parallelize`` (the spmd_types backend, one gloo rank) needs a
    placement for every buffer: the converted layers declare their step counter's."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    from stochround.integrations.torchtitan.run import free_port

    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = titan_config("int8", flavor="tiny")
        dims = ParallelDims.from_config(config.parallelism, 1)
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
        model_config = dense_attention(config.model_spec.model)
        model_config.update_from_config(config=config)
        with torch.device("meta"):
            model = model_config.build()
        model.parallelize(dims)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        positions = torch.arange(32).repeat(2, 1)
        masks = model.get_attention_masks(positions)
        model(torch.zeros(2, 32, dtype=torch.long), attention_masks=masks, positions=positions)
        assert int(model.layers["1"].attention.wo.step) == 1
    finally:
        torch.distributed.destroy_process_group()


def test_a_layer_built_in_a_process_group_takes_its_global_rank_until_parallelize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``partial_dtensor`` without tensor parallelism torchtitan 0.3.0 calls no
    module's ``parallelize``: a layer built on rank 3 keys its x and dy words by 3 (the
    global rank, which is the loss mesh's there) instead of sharing rank 0's; a
    ``parallelize`` then sets the loss mesh's rank."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    config = StochroundLinear.Config(in_features=32, out_features=32, recipe=sr.nn.int8())
    with torch.device("meta"):
        layer = config.build()
    assert layer.data_parallel_rank == 3
    loss_mesh = types.SimpleNamespace(get_local_rank=lambda: 1)
    dims = types.SimpleNamespace(
        tp=1, spmd_backend="partial_dtensor", get_optional_mesh=lambda name: loss_mesh
    )
    monkeypatch.setattr(Module, "parallelize", lambda self, dims: None)
    layer.parallelize(dims)
    assert layer.data_parallel_rank == 1
