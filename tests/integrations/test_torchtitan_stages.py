"""The SR optimizers' numbering of pipeline stages (`stochround.integrations.torchtitan.stages`):
each stage's parameters draw the words the one-part run draws for them; a run without
pipelining draws the words it drew before.  torchtitan 0.3.0's tests run on the CPU; the
0.2.2 ones run only where 0.2.2 is installed (the GPU machine)."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch
from torch import nn

pytest.importorskip(
    "torchtitan",
    reason="torchtitan is not installed (pip install 'stochround[torchtitan]', Python >= 3.11)",
)

from titan_versions import torchtitan_mismatch

import stochround as sr
from stochround.integrations.torchtitan.stages import (
    NAMES_ATTRIBUTE,
    number_pipeline_parts,
    record_parameter_order,
    recording_pipeline,
    whole_model_numbering,
)

NOT_0_3 = torchtitan_mismatch("0.3.0", "torchtitan")
NOT_0_2 = torchtitan_mismatch("0.2.2", "torchtitan-0.2")


def stack(count: int = 4) -> nn.Module:
    """A model shaped as torchtitan's: an input module, numbered layers, an output."""
    model = nn.Module()
    model.embed = nn.Linear(4, 8)
    model.layers = nn.ModuleDict({str(i): nn.Linear(8, 8) for i in range(count)})
    model.output = nn.Linear(8, 2)
    return model.to(torch.bfloat16)


def split(whole: nn.Module, layers: list[str], embed: bool, output: bool) -> nn.Module:
    """A stage as torchtitan's ``_split_module`` cuts it: a copy of the whole model without
    the other stages' modules."""
    part = copy.deepcopy(whole)
    for name in list(part.layers.keys()):
        if name not in layers:
            del part.layers[name]
    if not embed:
        part.embed = None
    if not output:
        part.output = None
    return part


def give_gradients(model: nn.Module) -> None:
    """Gradients that depend on the parameter's name alone, so a stage's parameters get the
    whole model's."""
    for name, param in model.named_parameters():
        generator = torch.Generator().manual_seed(sum(map(ord, name)))
        param.grad = torch.randn(param.shape, generator=generator).to(param.dtype)


def stepped(parts: list[nn.Module], *, seed: int = 5) -> dict[str, torch.Tensor]:
    """Each part's parameters after two steps of its own SR AdamW, numbered as torchtitan's
    container numbers them (one catch-all group)."""
    optimizers = [sr.optim.AdamW(part.parameters(), lr=1e-2, seed=seed) for part in parts]
    number_pipeline_parts(parts, optimizers, [(r".*", "SRAdamW")])
    for _ in range(2):
        for part, optimizer in zip(parts, optimizers, strict=True):
            give_gradients(part)
            optimizer.step()
    return {name: p.detach().clone() for part in parts for name, p in part.named_parameters()}


def test_stages_draw_the_words_of_the_one_part_run() -> None:
    """Three stages, each with its own optimizer (as on three ranks, or two on one rank):
    every parameter ends with the bits the one-part run gives it, while numbering each
    stage from 0 (today's positions) gives other bits."""
    torch.manual_seed(0)
    whole = stack()
    reference = stepped([copy.deepcopy(whole)])
    record_parameter_order(whole)
    stages = [
        split(whole, ["0"], embed=True, output=False),
        split(whole, ["1", "2"], embed=False, output=False),
        split(whole, ["3"], embed=False, output=True),
    ]
    pipelined = stepped(stages)
    assert pipelined.keys() == reference.keys()
    assert all(torch.equal(pipelined[name], reference[name]) for name in reference)
    for part in stages:  # unmarked copies number from 0
        for module in part.modules():
            module.__dict__.pop(NAMES_ATTRIBUTE, None)
    positional = stepped([copy.deepcopy(part) for part in stages])
    assert not torch.equal(positional["layers.1.weight"], reference["layers.1.weight"])


def test_the_stages_indices_partition_the_whole_models() -> None:
    """The stages' stream indices are distinct (no two parameters share a stream under the
    run's one seed and domain) and together the whole model's 0 .. n - 1."""
    whole = stack(6)
    record_parameter_order(whole)
    stages = [
        split(whole, ["0", "1"], embed=True, output=False),
        split(whole, ["2", "3"], embed=False, output=False),
        split(whole, ["4", "5"], embed=False, output=True),
    ]
    optimizers = [sr.optim.SGD(part.parameters(), lr=1e-2, seed=0) for part in stages]
    number_pipeline_parts(stages, optimizers, [(r".*", "SRSGD")])
    indices = [i for optimizer in optimizers for i in optimizer.param_indices or ()]
    assert sorted(indices) == list(range(len(list(whole.parameters()))))
    assert [optimizer.param_indices[0] for optimizer in optimizers] == [0, 6, 10]


def test_an_unmarked_model_keeps_its_positions() -> None:
    model = stack()
    (optimizer,) = optimizers = [sr.optim.AdamW(model.parameters(), lr=1e-2, seed=0)]
    number_pipeline_parts([model], optimizers, [(r".*", "SRAdamW")])
    assert optimizer.param_indices is None


def test_the_numbering_follows_the_containers_rules_across_optimizers() -> None:
    """First match wins; the indices count the rules' parameters in rule order across the
    optimizers (each optimizer's own parameters in its order), and one optimizer's are its
    positions."""
    names = ["embed.weight", "layers.0.bias", "layers.0.weight", "layers.1.bias", "out.weight"]
    rules = [(r"bias$", "SRAdamW"), (r"^embed", "SRSGD"), (r".*", "SRAdamW")]
    assert whole_model_numbering(names, rules) == [
        ("SRSGD", 2),
        ("SRAdamW", 0),
        ("SRAdamW", 3),
        ("SRAdamW", 1),
        ("SRAdamW", 4),
    ]
    assert whole_model_numbering(names, [(r"bias$", "SRAdamW")])[0] is None
    assert [entry[1] for entry in whole_model_numbering(names, [(r".*", "SRAdamW")])] == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip


def test_two_optimizers_of_an_unsplit_model_draw_apart() -> None:
    """An unmarked model whose rules name two SR optimizers (biases by SGD, the rest by
    AdamW) numbers their parameters across both: no index given twice, so the two never
    draw one parameter's words; each keeps its own parameters' order."""
    model = stack(2)
    biases = [param for name, param in model.named_parameters() if name.endswith("bias")]
    weights = [param for name, param in model.named_parameters() if not name.endswith("bias")]
    optimizers = [
        sr.optim.SGD(biases, lr=1e-2, seed=0),
        sr.optim.AdamW(weights, lr=1e-2, seed=0),
    ]
    number_pipeline_parts([model], optimizers, [(r"bias$", "SRSGD"), (r".*", "SRAdamW")])
    first, second = (optimizer.param_indices for optimizer in optimizers)
    assert first == (0, 1, 2, 3) and second == (4, 5, 6, 7)


def test_a_stage_parameter_of_another_optimizer_is_refused() -> None:
    whole = stack(2)
    record_parameter_order(whole)
    part = split(whole, ["1"], embed=False, output=True)
    optimizers = [sr.optim.AdamW(part.parameters(), lr=1e-2, seed=0)]
    with pytest.raises(ValueError, match="not the whole model's parameter of SRAdamW"):
        number_pipeline_parts([part], optimizers, [(r"^output", "SRSGD"), (r".*", "SRAdamW")])


def test_the_pipelining_function_marks_the_model_before_it_splits() -> None:
    seen = []
    pipeline = recording_pipeline(lambda model, *args: seen.append(getattr(model, NAMES_ATTRIBUTE)))
    pipeline(stack(1), "mesh")
    layers = ("embed", "layers.0", "output")
    assert seen == [tuple(f"{layer}.{kind}" for layer in layers for kind in ("weight", "bias"))]


# torchtitan 0.3.0: its Llama 3, its split and its container


def titan_built(seed: int) -> tuple[object, nn.Module]:
    """``titan_config``'s SRAdamW run of ``seed`` on the tiny flavour, and its model built
    as torchtitan's trainer builds it."""
    from stochround.integrations.torchtitan import titan_config
    from stochround.integrations.torchtitan.attention import dense_attention

    config = titan_config("bf16", optimizer="SRAdamW", flavor="tiny", seed=seed)
    model_config = dense_attention(config.model_spec.model)
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return config, model


def container_step(config: object, parts: list[nn.Module]) -> dict[str, torch.Tensor]:
    container = config.optimizer.build(model_parts=parts)  # type: ignore[attr-defined]
    for part in parts:
        give_gradients(part)
    container.step()
    return {name: p.detach().clone() for part in parts for name, p in part.named_parameters()}


@pytest.mark.skipif(bool(NOT_0_3), reason=str(NOT_0_3))
@pytest.mark.parametrize("stages", [2, 3])
def test_torchtitans_pipeline_stages_take_the_one_part_runs_words(stages: int) -> None:
    """torchtitan 0.3.0 splits the config's Llama 3 into ``stages`` (its own split of the
    marked whole model); one container over the stages (as a looped schedule holds them on
    one rank) and one container per stage (one rank each) step every parameter to the
    one-part run's bits, and the stages' optimizers keep the run's seed."""
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _split_module,
    )

    config, whole = titan_built(seed=9)
    reference = container_step(config, [copy.deepcopy(whole)])
    assert config.model_spec.pipelining_fn.__wrapped__.__name__ == "pipeline_llm"  # type: ignore[attr-defined]
    record_parameter_order(whole)  # what the config's pipelining function does first
    names = _generate_llm_fqn_per_model_part(stages, len(whole.layers))
    parts = [_split_module(whole, modules) for modules in names]
    together = container_step(config, [copy.deepcopy(part) for part in parts])
    apart: dict[str, torch.Tensor] = {}
    for part in parts:
        apart.update(container_step(config, [part]))
    for result in (together, apart):
        assert result.keys() == reference.keys()
        assert all(torch.equal(result[name], reference[name]) for name in reference)
    optimizers = config.optimizer.build(model_parts=parts).optimizers  # type: ignore[attr-defined]
    assert {group["seed"] for o in optimizers for group in o.param_groups} == {9}
    firsts = [o.param_indices[0] for o in optimizers]  # type: ignore[index]
    assert firsts[0] == 0 and len(set(firsts)) == stages


@pytest.mark.skipif(bool(NOT_0_3), reason=str(NOT_0_3))
def test_a_run_without_pipelining_draws_the_words_it_drew_before() -> None:
    """Two steps of ``titan_config``'s SRAdamW (seed 11) on one model part: the bits of
    the parameters and states before the stages' numbering existed (pinned)."""
    from stochround.integrations.torchtitan import titan_config

    model = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4)).to(torch.bfloat16)
    with torch.no_grad():
        for number, param in enumerate(model.parameters()):
            param.copy_(torch.linspace(-1, 1, param.numel()).reshape(param.shape) * (number + 1))
    config = titan_config("bf16", optimizer="SRAdamW", seed=11)
    container = config.optimizer.build(model_parts=[model])
    for step in range(2):
        for number, param in enumerate(model.parameters()):
            ramp = torch.linspace(1, -1, param.numel()).reshape(param.shape)
            param.grad = ramp.to(param.dtype) * 1e-3 * (number + step + 1)
        container.step()
    (optimizer,) = container.optimizers
    assert optimizer.param_indices is None
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.view(torch.int16).numpy().tobytes())
        for name in ("exp_avg", "exp_avg_sq"):
            digest.update(optimizer.state[param][name].view(torch.int16).numpy().tobytes())
    assert digest.hexdigest() == "f570803d24f783b22b4b248a9acfccd8a46d00fb9fe97b2ffa191f57157c9ca2"


# torchtitan 0.2.2 (unverified here: it runs where 0.2.2 is installed)


@pytest.mark.skipif(bool(NOT_0_2), reason=str(NOT_0_2))
def test_torchtitan_0_2_pipeline_stages_take_the_one_part_runs_words() -> None:
    """0.2.2's ``build_sr_optimizers`` over stages cut from a marked whole model (one
    optimizer per part, as its ``OptimizersContainer`` builds them) steps every parameter
    to the one-part run's bits; the train spec's pipelining marks the model first."""
    from types import SimpleNamespace

    from stochround.integrations.torchtitan.v0_2.optimizers import build_sr_optimizers
    from stochround.integrations.torchtitan.v0_2.train_spec import train_spec

    assert train_spec().pipelining_fn.__wrapped__.__name__ == "pipeline_llm"
    settings = SimpleNamespace(
        name="SRAdamW",
        lr=1e-2,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        seed=9,
        early_step_in_backward=False,
        implementation="for-loop",
    )

    def run(parts: list[nn.Module]) -> dict[str, torch.Tensor]:
        container = build_sr_optimizers(parts, settings, None)
        for part in parts:
            give_gradients(part)
        container.step()
        return {name: p.detach().clone() for part in parts for name, p in part.named_parameters()}

    torch.manual_seed(0)
    whole = stack()
    reference = run([copy.deepcopy(whole)])
    record_parameter_order(whole)
    stages = [
        split(whole, ["0", "1"], embed=True, output=False),
        split(whole, ["2", "3"], embed=False, output=True),
    ]
    result = run(stages)
    assert all(torch.equal(result[name], reference[name]) for name in reference)
