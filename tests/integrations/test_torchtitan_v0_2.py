"""stochround inside torchtitan 0.2.2 (`stochround.integrations.torchtitan.v0_2`): the
module-swap converter on its Llama 3, the SR optimizers from the job config, the TOML, and
torchtitan's own trainer on the CPU (gloo), in one process and with FSDP2 on two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import assert_seeded_sr_steps, seeded_sr_steps
from ranks import run_ranks
from titan_versions import torchtitan_mismatch

if reason := torchtitan_mismatch("0.2.2", "torchtitan-0.2"):
    pytest.skip(reason, allow_module_level=True)

from torch import nn
from torchtitan.config import ConfigManager
from torchtitan.models.llama3 import Transformer
from torchtitan.tools import utils as titan_utils

import stochround as sr
from stochround.integrations.torchtitan import TITAN_API, titan_config
from stochround.integrations.torchtitan.cpu_device import cpu_trainer
from stochround.integrations.torchtitan.v0_2 import (
    TOML,
    StochroundConverter,
    build_sr_optimizers,
    converted_paths,
    model_args,
)

SRC = Path(__file__).resolve().parents[2] / "src"
DEBUG_LINEARS = [
    f"layers.{i}.{name}"
    for i in range(6)
    for name in (
        "attention.wq",
        "attention.wk",
        "attention.wv",
        "attention.wo",
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
    )
]


def no_mesh(dims: object) -> None:
    """torchtitan's ``ParallelDims.get_optional_mesh`` of one rank: no mesh."""
    return None


# the converter reads the ``loss`` mesh of it (none: one data-parallel rank); the optimizers
# nothing
ONE_RANK = types.SimpleNamespace(get_optional_mesh=no_mesh)


def converted(
    config, flavor: str = "debugmodel", device: str = "meta", dims: object = ONE_RANK
) -> nn.Module:
    """torchtitan's Llama 3 of ``flavor``, built on ``device`` and converted by the job
    config's stochround section (the converter given parallel dims ``dims``)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(model_args()[flavor])
    StochroundConverter(config, dims).convert(model)
    return model


def test_the_installed_torchtitan_selects_the_0_2_api() -> None:
    assert TITAN_API == "0.2"


def test_converter_swaps_every_linear_of_the_debug_model_but_the_head() -> None:
    model = converted(titan_config("nvfp4"))
    assert converted_paths(model) == dict.fromkeys(DEBUG_LINEARS, "nvfp4")
    assert type(model.output) is nn.Linear
    layers = [m for m in model.modules() if isinstance(m, sr.nn.QuantizedLinear)]
    assert [layer.layer_index for layer in layers] == list(range(42))
    assert layers[0].recipe == sr.nn.nvfp4(keep=("^output$",))


def test_the_swapped_layers_hold_the_built_models_parameters() -> None:
    torch.manual_seed(0)
    model = Transformer(model_args()["tiny"])
    before = dict(model.named_parameters())
    plain_keys = set(model.state_dict())
    StochroundConverter(titan_config("int8", flavor="tiny"), ONE_RANK).convert(model)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is param for name, param in before.items())
    # the state dict adds the step counters only (a plain checkpoint loads strictly=False)
    extra = set(model.state_dict()) - plain_keys
    assert extra == {f"{path}.step" for path in converted_paths(model)}


def test_rules_keep_and_seed_come_from_the_job_config() -> None:
    config = titan_config(
        "nvfp4",
        switches={"stochastic_rounding": False},
        seed=7,
        rules=[(r"layers\.0\..*", None), (r"layers\.5\.feed_forward\..*", "int8")],
    )
    assert config.stochround.rules == [r"layers\.0\..*=bf16", r"layers\.5\.feed_forward\..*=int8"]
    paths = converted_paths(converted(config))
    assert [p for p in DEBUG_LINEARS if p not in paths] == DEBUG_LINEARS[:7]
    assert {p for p, name in paths.items() if name == "int8"} == {
        f"layers.5.feed_forward.{w}" for w in ("w1", "w2", "w3")
    }
    model = converted(config)
    assert model.layers["1"].attention.wo.recipe.seed == 7
    assert model.layers["1"].attention.wo.recipe.spec("dgrad_grad_output").mode == "rne"


def test_init_weights_zeroes_the_step_counters_to_empty_left() -> None:
    model = converted(titan_config("int8", flavor="tiny"))
    model.to_empty(device="cpu")
    layer = model.layers["1"].feed_forward.w2
    layer.step.fill_(12345)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    assert int(layer.step) == 0
    tokens = torch.zeros(2, 16, dtype=torch.long)
    model(tokens).sum().backward()
    assert int(layer.step) == 1 and layer.weight.grad.abs().sum() > 0


def test_a_missing_section_is_refused() -> None:
    bare = ConfigManager().parse_args([])
    with pytest.raises(ValueError, match=r"no \[stochround\] section: set job\.custom_config"):
        StochroundConverter(bare, ONE_RANK)


def test_bad_settings_raise_naming_them() -> None:
    with pytest.raises(ValueError, match="recipe must be one of bf16, nvfp4"):
        titan_config("nvfp5")
    with pytest.raises(ValueError, match="flavor must be one of debugmodel, 100M, tiny"):
        titan_config("int8", flavor="8B")
    config = titan_config("int8")
    config.stochround.rules = ["layers"]
    with pytest.raises(ValueError, match="rules items must be REGEX=RECIPE; got 'layers'"):
        StochroundConverter(config, ONE_RANK)
    config = titan_config("int8")
    config.stochround.switches = "[1]"
    with pytest.raises(ValueError, match="switches must be a JSON object"):
        StochroundConverter(config, ONE_RANK)
    model = nn.Sequential(nn.Linear(24, 32))
    with pytest.raises(ValueError, match=r"^0: "):
        StochroundConverter(titan_config("nvfp4"), ONE_RANK).convert(model)


@pytest.mark.parametrize(
    ("name", "cls", "states"),
    [
        ("SRAdamW", sr.optim.AdamW, ("exp_avg", "exp_avg_sq")),
        ("SRSGD", sr.optim.SGD, ()),
        ("SRLion", sr.optim.Lion, ("exp_avg",)),
        ("AdamW", torch.optim.AdamW, ("exp_avg", "exp_avg_sq")),
    ],
)
def test_the_job_configs_optimizer_name_builds_it(name, cls, states) -> None:
    model = nn.Linear(8, 4)
    config = titan_config("int8", optimizer=name, lr=1e-2)
    config.optimizer.implementation = "for-loop"  # torch's fused AdamW runs on CUDA only
    container = build_sr_optimizers([model], config.optimizer, ONE_RANK)
    (optimizer,) = container.optimizers
    assert type(optimizer) is cls
    assert optimizer.param_groups[0]["lr"] == 1e-2
    model(torch.ones(2, 8)).sum().backward()
    container.step()
    state = optimizer.state[model.weight]
    expected = torch.float32 if name == "AdamW" else torch.bfloat16
    assert {state[key].dtype for key in states} <= {expected}
    if name == "SRAdamW":
        assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    config.optimizer.name = "Adamax"
    with pytest.raises(ValueError, match=r"optimizer\.name must be one of Adam, AdamW, SRAdamW"):
        build_sr_optimizers([model], config.optimizer, ONE_RANK)


def build_sr_adamw(model: nn.Module, seed: int) -> torch.optim.Optimizer:
    """``titan_config``'s SRAdamW of ``seed`` on ``model``, as the train spec builds it."""
    config = titan_config("int8", optimizer="SRAdamW", seed=seed)
    (optimizer,) = build_sr_optimizers([model], config.optimizer, ONE_RANK).optimizers
    return optimizer


def test_a_configs_sr_optimizer_draws_by_its_seed_whatever_torchs_generator_did() -> None:
    """``titan_config`` sets ``optimizer.seed`` (the field stochround's job config module
    adds) to the run's seed: two builds after other draws take the same words, another
    seed other words; the TOML pins it as it pins ``stochround.seed``."""
    assert_seeded_sr_steps(seeded_sr_steps(build_sr_adamw))
    from_toml = ConfigManager().parse_args(["--job.config_file", str(TOML)])
    assert from_toml.optimizer.seed == from_toml.stochround.seed == 0


def test_the_converter_keys_x_and_dy_by_the_data_parallel_rank() -> None:
    """The swapped layers take the process's rank on torchtitan's ``loss`` mesh (data
    parallel and context parallel): the words of x and dy are that rank's, the weight's
    the layer's own (`stochround.nn.streams`)."""
    from stochround.nn.streams import DATA_ROLES, data_rank_key

    mesh = types.SimpleNamespace(get_local_rank=lambda: 3)
    dims = types.SimpleNamespace(get_optional_mesh=lambda name: mesh if name == "loss" else None)
    model = converted(titan_config("nvfp4", flavor="tiny"), "tiny", "meta", dims)
    layers = [m for m in model.modules() if isinstance(m, sr.nn.QuantizedLinear)]
    assert layers and {m.data_parallel_rank for m in layers} == {3}
    for layer in layers:
        plan = layer.plan
        for role in sr.nn.recipes.ROLES:
            key = data_rank_key(plan.seed, 3) if role in DATA_ROLES else plan.seed
            assert plan.key_of(role) == key


def test_the_toml_is_titan_configs_default() -> None:
    from_toml = ConfigManager().parse_args(["--job.config_file", str(TOML)])
    assert from_toml.model.name == "stochround_llama3"
    assert from_toml.model.converters == ["stochround"]
    assert from_toml.stochround.recipe == "nvfp4"
    assert from_toml.activation_checkpoint.mode == "none"
    ours = titan_config("nvfp4")
    assert ours.stochround == from_toml.stochround
    assert ours.training == from_toml.training


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_titan_config_sets_torchtitans_activation_checkpointing(mode: str) -> None:
    assert titan_config("nvfp4", activation_checkpoint=mode).activation_checkpoint.mode == mode


def test_an_unknown_activation_checkpoint_raises() -> None:
    with pytest.raises(
        ValueError, match="activation_checkpoint must be one of none, full, selective; got 'op'"
    ):
        titan_config("nvfp4", activation_checkpoint="op")


def test_cpu_trainer_restores_torchtitans_device() -> None:
    device = titan_utils.device_type
    with cpu_trainer():
        assert titan_utils.device_type == "cpu"
    assert titan_utils.device_type == device


def test_fsdp2_on_two_gloo_ranks(tmp_path) -> None:
    out = tmp_path / "fsdp"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    titan = ["-m", "stochround", "titan", "--recipe", "nvfp4", "--flavor", "tiny"]
    titan += ["--device", "cpu", "--steps", "2", "--seq-len", "32", "--batch", "1"]
    titan += ["--optimizer", "SRAdamW", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [*launch, *titan], env=env, capture_output=True, text=True, timeout=500, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert {row["world_size"] for row in rows} == {2}
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)


def tp_body(rank: int, world_size: int, device: str) -> dict[str, torch.Tensor]:
    """The tiny model under mxfp8 (every operand in blocks of 32 along its contraction
    axis, round to nearest: a shard quantizes as the whole does), once whole and once
    under torchtitan's Llama 3 TP plan (sequence parallel) over the two ranks: the logits
    and the gradients of each, gathered."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torchtitan.models.llama3.infra.parallelize import apply_tp

    tp_dims = types.SimpleNamespace(tp_enabled=True, tp=world_size, get_optional_mesh=no_mesh)
    whole = converted(titan_config("mxfp8", flavor="tiny"), "tiny", "cpu", tp_dims)
    with torch.no_grad():
        whole.init_weights(buffer_device=None)
    sharded = copy.deepcopy(whole)
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    apply_tp(sharded, mesh, loss_parallel=False, enable_float8_tensorwise_tp=False)
    tokens = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(3))
    out: dict[str, torch.Tensor] = {}
    for name, model in (("whole", whole), ("tp", sharded)):
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        out[f"{name}.logits"] = logits.detach()
        for path, param in model.named_parameters():
            grad = param.grad
            full = grad.full_tensor() if isinstance(grad, DTensor) else grad
            out[f"{name}.{path}"] = full.detach().clone()
    out["step"] = sharded.layers["1"].feed_forward.w2.step.clone()
    return out


def test_tensor_parallelism_with_torchtitans_llama3_plan_on_two_gloo_ranks() -> None:
    """Sharded equals whole up to the order of the sums (a rowwise layer's output and the
    sharded norms' gradients are sums across ranks)."""
    results = run_ranks(tp_body, device="cpu")
    for result in results:
        assert int(result["step"]) == 1
        whole = {k[6:]: v for k, v in result.items() if k.startswith("whole.")}
        for name, value in whole.items():
            torch.testing.assert_close(result[f"tp.{name}"], value, rtol=1e-4, atol=1e-5)


def test_tensor_parallelism_with_fsdp2_on_four_gloo_ranks(tmp_path) -> None:
    """2-D: torchtitan's trainer on the CPU with ``tensor_parallel_degree=2`` and FSDP2 over
    the other factor of four gloo ranks (``data_parallel_shard_degree`` 2), mxfp8, two
    steps: it trains.  (The losses are not a one-rank run's: torchtitan initialises the
    DTensor weights by DTensor's random generator, and each data-parallel rank reads its
    own files.)"""
    out = tmp_path / "tp-fsdp"
    script = Path(__file__).with_name("titan_parallel_run.py")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    args = [str(script), str(out), "mxfp8", "2", "2", "1"]
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [*launch, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(row["step"], row["world_size"]) for row in rows] == [(1, 4), (2, 4)]
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)


# split-batch runs: two ranks of one sample each against one process; gradient clipping
# off (max_norm 1e30): FSDP2's norm adds its shards' squares in another order than one
# process does, so a clipped step's factor differs in its last bits
SPLIT_BATCH = [1, 2]
NO_CLIPPING = "1e30"
NEAREST_NVFP4 = {"stochastic_rounding": False, "rht": False}


@pytest.fixture(scope="module")
def split_batch_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """A data folder of files of 31 bytes (with BOS and EOS: one sample of 32 tokens each,
    so one process's batch of two is rank 0's sample then rank 1's), and a seed checkpoint
    of the tiny model (nvfp4's: a bf16 model loads its parameters from it)."""
    root = tmp_path_factory.mktemp("split-batch")
    data = root / "data"
    data.mkdir()
    for i in range(8):
        (data / f"f{i}.py").write_bytes(bytes((i * 37 + j * 11) % 94 + 33 for j in range(31)))
    split_batch_run(root / "seed", "nvfp4", {}, 0, 1, 1, data, root)
    return data, root / "seed" / "checkpoint" / "step-0"


def split_batch_run(
    folder: Path,
    recipe: str,
    switches: dict[str, bool],
    steps: int,
    ranks: int,
    local: int,
    data: Path,
    seed: Path,
    device: str = "cpu",
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``titan_split_batch_run.py`` on ``ranks`` processes (gloo on the CPU, NCCL on
    ``device`` cuda: one GPU a rank) with a global batch of 2, ``local`` samples a
    micro-batch: its losses and its last model checkpoint."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    script = Path(__file__).with_name("titan_split_batch_run.py")
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    args = [str(script), str(folder), recipe, json.dumps(switches), str(steps), str(local)]
    args += ["2", NO_CLIPPING, str(data), str(seed), device]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    # one CPU thread a process in both runs (torch.distributed.run sets it for its ranks):
    # a CPU GEMM's summation order can follow its thread count, and the runs compare bits
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [*launch, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if steps == 0:
        return [], {}
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert [row["world_size"] for row in rows] == [ranks] * steps
    whole = folder / "whole.pt"
    dcp_to_torch_save(folder / "checkpoint" / f"step-{steps}", whole)
    return [row["loss"] for row in rows], torch.load(whole, weights_only=False)


@pytest.mark.parametrize(
    ("recipe", "switches", "streams"),
    [("bf16", {}, False), ("nvfp4", NEAREST_NVFP4, False), ("nvfp4", {}, True)],
    ids=["bf16", "nvfp4-nearest", "nvfp4-sr-rht"],
)
def test_fsdp2_on_a_split_batch_against_one_process(
    tmp_path, split_batch_inputs, recipe, switches, streams
) -> None:
    """torchtitan's trainer, a global batch of 2, two steps, clipping off.  FSDP2 on two
    gloo ranks of one sample each gives the losses and weights of one process that
    accumulates the gradients of the two samples, bit for bit, for the float32 model and
    for nvfp4 rounding to nearest without the RHT: torchtitan divides each rank's loss sum
    by the global token count and FSDP2 sums the two ranks' gradients (torchtitan turns its
    division off), as the accumulation adds the second micro-batch's to the first's.  With
    SR and the RHT (nvfp4's default) the first loss agrees (nvfp4's forward rounds to
    nearest) and the weights do not: the random words differ (the accumulating process
    draws its second micro-batch's at the next step of the layers' counters; the two ranks
    draw theirs at one step, rank 1's dy under its data-parallel rank's key).

    Against one process taking both samples in one micro-batch: the float32 model's losses
    agree within 1e-6 relative, not bit for bit (the loss's sum over 64 tokens against two
    over 32, and later the gradients' sums, in another order: the first loss differed in
    its last bit on the GPU machine's CPU with one thread a process, agreed here); nvfp4
    differs from the first loss on: its second-level scale comes from the amax of each
    rank's activations, not of the whole batch's.  Each process runs on one CPU thread
    (`split_batch_run`): with more, the one-process run's GEMMs summed in another order
    than the ranks' and nvfp4's weights differed on that machine."""
    data, seed = split_batch_inputs
    args = (recipe, switches, 2)
    losses, model = split_batch_run(tmp_path / "fsdp2", *args, 2, 1, data, seed)
    one_losses, one_model = split_batch_run(tmp_path / "accumulated", *args, 1, 1, data, seed)
    counters = [key for key in model if key.endswith(".step")]
    assert len(counters) == (0 if recipe == "bf16" else 14)
    assert all(int(model[k]) == 2 and int(one_model[k]) == 4 for k in counters)
    weights = [key for key in model if key not in counters]
    different = [key for key in weights if not torch.equal(model[key], one_model[key])]
    assert losses[0] == one_losses[0]
    if streams:
        assert len(different) > len(weights) // 2
        return
    assert losses == one_losses
    assert different == []
    whole_losses, _ = split_batch_run(tmp_path / "whole", *args, 1, 2, data, seed)
    if recipe == "bf16":
        torch.testing.assert_close(losses, whole_losses, rtol=1e-6, atol=0)
    else:
        assert losses[0] != whole_losses[0]


@pytest.mark.gpus2
@pytest.mark.parametrize(
    ("recipe", "switches"), [("bf16", {}), ("nvfp4", NEAREST_NVFP4)], ids=["bf16", "nvfp4-nearest"]
)
def test_fsdp2_on_two_gpus_against_one_gpu(tmp_path, split_batch_inputs, recipe, switches) -> None:
    """The split-batch comparison of `test_fsdp2_on_a_split_batch_against_one_process` on
    GPUs: FSDP2 over two GPUs (NCCL), one sample each, against one GPU accumulating the two
    samples' gradients, the float32 model, torch's deterministic algorithms: the same losses
    and weights, bit for bit (a sum of two ranks' gradients is the same in either order).
    The layers' step counters differ as on the CPU: two a rank, four where one process
    accumulates two micro-batches a step."""
    data, seed = split_batch_inputs
    args = (recipe, switches, 2)
    losses, model = split_batch_run(tmp_path / "fsdp2", *args, 2, 1, data, seed, "cuda")
    one_losses, one_model = split_batch_run(
        tmp_path / "accumulated", *args, 1, 1, data, seed, "cuda"
    )
    counters = [key for key in model if key.endswith(".step")]
    assert len(counters) == (0 if recipe == "bf16" else 14)
    assert all(int(model[k]) == 2 and int(one_model[k]) == 4 for k in counters)
    weights = [key for key in model if key not in counters]
    different = [key for key in weights if not torch.equal(model[key], one_model[key])]
    assert losses == one_losses
    assert different == []
