"""quantize_: torchao's filter_fn, Qwix's module-path rules, the recipe's keep patterns,
shared parameters and layer numbering."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stochround.nn as srnn
from stochround.nn.recipes import ROLES


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(32, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.attn(x))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


def quantized_paths(model: nn.Module) -> dict[str, str]:
    return {
        path: module.recipe.name
        for path, module in model.named_modules()
        if isinstance(module, srnn.QuantizedLinear)
    }


def test_every_linear_is_replaced_sharing_its_parameters_numbered_in_order() -> None:
    model = Tiny()
    weights = {path: m.weight for path, m in model.named_modules() if isinstance(m, nn.Linear)}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert srnn.quantize_(model, srnn.mxfp8()) is model
    layers = [(p, m) for p, m in model.named_modules() if isinstance(m, srnn.QuantizedLinear)]
    assert [p for p, _ in layers] == list(weights)
    assert [m.layer_index for _, m in layers] == list(range(len(weights)))
    for path, module in layers:
        assert module.weight is weights[path]
    model(torch.randn(32, 32)).sum().backward()
    optimizer.step()  # the optimizer built before the swap still holds the parameters


def test_filter_fn_follows_torchaos_convention() -> None:
    model = Tiny()
    seen: list[str] = []

    def not_head(module: nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        assert isinstance(module, nn.Linear)
        return fqn != "lm_head"

    srnn.quantize_(model, srnn.nvfp4(), filter_fn=not_head)
    assert "lm_head" in seen and "lm_head" not in quantized_paths(model)
    assert len(quantized_paths(model)) == 6


def test_rules_by_module_path_first_match_wins_and_none_keeps_the_layer() -> None:
    model = Tiny()
    rules = [
        (r"blocks\.0\..*", None),
        (r".*mlp.*", srnn.int8()),
        (r".*mlp\.0", srnn.fp8()),  # never reached: the rule above matches first
        (r"lm_head", srnn.mxfp8()),
    ]
    srnn.quantize_(model, srnn.nvfp4(), rules=rules)
    assert quantized_paths(model) == {
        "blocks.1.attn": "nvfp4",
        "blocks.1.mlp.0": "int8",
        "blocks.1.mlp.2": "int8",
        "lm_head": "mxfp8",
    }


def test_rules_match_the_whole_path_and_unmatched_layers_take_the_default() -> None:
    model = Tiny()
    srnn.quantize_(model, rules=[(r"attn", srnn.mxfp8())])  # matches no whole path
    assert quantized_paths(model) == {}
    srnn.quantize_(model, rules=[(r".*attn", srnn.mxfp8())])
    assert quantized_paths(model) == {"blocks.0.attn": "mxfp8", "blocks.1.attn": "mxfp8"}


def test_the_recipes_keep_patterns_stay_in_high_precision() -> None:
    model = Tiny()
    srnn.quantize_(model, srnn.nvfp4(keep=("lm_head", r"^blocks\.0\.")))
    assert set(quantized_paths(model)) == {"blocks.1.attn", "blocks.1.mlp.0", "blocks.1.mlp.2"}
    assert type(model.lm_head) is nn.Linear


def test_a_second_call_leaves_quantized_layers_alone_and_a_bare_linear_is_returned() -> None:
    model = Tiny()
    srnn.quantize_(model, srnn.mxfp8())
    srnn.quantize_(model, srnn.nvfp4())
    assert set(quantized_paths(model).values()) == {"mxfp8"}
    layer = nn.Linear(32, 32)
    replaced = srnn.quantize_(layer, srnn.mxfp8())
    assert isinstance(replaced, srnn.QuantizedLinear) and replaced.weight is layer.weight


def test_a_layer_that_does_not_fit_its_recipe_leaves_the_model_untouched() -> None:
    model = Tiny()
    model.lm_head = nn.Linear(32, 40)  # 40 outputs: NVFP4's 16x16 weight tiles do not fit
    with pytest.raises(ValueError, match="fprop_weight"):
        srnn.quantize_(model, srnn.nvfp4())
    assert quantized_paths(model) == {}


def test_bad_arguments_raise_naming_them() -> None:
    with pytest.raises(TypeError, match=r"model must be an nn\.Module"):
        srnn.quantize_("model", srnn.nvfp4())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="recipe must be a Recipe"):
        srnn.quantize_(Tiny(), "nvfp4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rules must hold"):
        srnn.quantize_(Tiny(), rules=["lm_head"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a regular expression"):
        srnn.quantize_(Tiny(), rules=[("(", None)])
    with pytest.raises(TypeError, match="filter_fn must be callable"):
        srnn.quantize_(Tiny(), srnn.nvfp4(), filter_fn=3)  # type: ignore[arg-type]


def test_the_attention_output_projection_is_left_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nn.MultiheadAttention multiplies by out_proj.weight without calling out_proj (a
    NonDynamicallyQuantizableLinear): swapped, it would never run quantized.  quantize_
    leaves it, even where the filter and rules choose it, and logs its path; the layers
    that run are swapped and advance their steps."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
    with caplog.at_level("INFO", logger="stochround.nn.apply"):
        srnn.quantize_(
            layer, srnn.mxfp8(), filter_fn=lambda module, fqn: True, rules=[(".*", srnn.mxfp8())]
        )
    assert type(layer.self_attn.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    assert set(quantized_paths(layer)) == {"linear1", "linear2"}
    assert "self_attn.out_proj" in caplog.text and "without calling them" in caplog.text
    layer(torch.randn(2, 16, 32)).sum().backward()
    assert int(layer.linear1.step) == int(layer.linear2.step) == 1


def test_a_model_under_gaussws_raises_saying_to_quantize_first() -> None:
    model = Tiny()
    srnn.gaussws_(model, "e3m2")
    with pytest.raises(
        ValueError,
        match=r"blocks\.0\.attn: the layer's weight is parametrized \(GaussWS\).*quantize first",
    ):
        srnn.quantize_(model, srnn.mxfp8())
    assert quantized_paths(model) == {}
    ordered = srnn.gaussws_(srnn.quantize_(Tiny(), srnn.mxfp8()), "e3m2")  # the order that works
    ordered(torch.randn(32, 32)).sum().backward()


def test_a_second_call_numbers_its_layers_after_the_first_calls() -> None:
    """Layers swapped by a later call take the numbers after those of the earlier one, so
    no two layers share a random stream."""
    model = Tiny()
    srnn.quantize_(model, rules=[(r"blocks\.0\..*", srnn.mxfp8())])
    srnn.quantize_(model, srnn.nvfp4())
    numbers = [m.layer_index for m in model.modules() if isinstance(m, srnn.QuantizedLinear)]
    assert numbers == [0, 1, 2, 3, 4, 5, 6]


def test_unquantize_gives_back_plain_layers_holding_the_same_parameters() -> None:
    """unquantize_ undoes quantize_ and gaussws_: nn.Linear layers holding the very
    Parameter objects (dtype and device kept, so an optimizer keeps working), the original
    weights (not a sample), and a state dict that a plain model loads strictly."""
    model = Tiny().to(torch.bfloat16)
    parameters = list(model.parameters())
    srnn.quantize_(model, srnn.nvfp4())
    srnn.gaussws_(model, "e3m2")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(32, 32, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        Tiny().to(torch.bfloat16).load_state_dict(model.state_dict())  # the steps
    assert srnn.unquantize_(model) is model
    assert all(
        type(m) in (Tiny, Block, nn.ModuleList, nn.Sequential, nn.GELU, nn.Linear)
        for m in model.modules()
    )
    assert all(a is b for a, b in zip(model.parameters(), parameters, strict=True))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    plain = Tiny().to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())  # strict
    x = torch.randn(32, 32, dtype=torch.bfloat16)
    assert torch.equal(plain(x), model(x))
    layer = srnn.quantize_(nn.Linear(32, 32), srnn.mxfp8())
    back = srnn.unquantize_(layer)
    assert type(back) is nn.Linear and back.weight is layer.weight
    with pytest.raises(TypeError, match=r"model must be an nn\.Module"):
        srnn.unquantize_("model")  # type: ignore[arg-type]


def test_a_data_parallel_rank_keys_the_words_of_x_and_dy_not_the_weights() -> None:
    """``data_parallel_rank`` (`stochround.nn.streams`): the plan's key of each x and dy
    role is the rank's, of each weight role the layer's; the compiled ops' registered plan
    carries the rank; `set_data_parallel_rank` makes the plan again and keeps the step."""
    from stochround.nn.opaque_matmul import registered_plan
    from stochround.nn.streams import DATA_ROLES, data_rank_key

    model = srnn.quantize_(Tiny(), srnn.nvfp4(seed=5), data_parallel_rank=3)
    layer = model.blocks[0].attn
    assert layer.data_parallel_rank == 3 and "data_parallel_rank=3" in repr(layer)
    plan = layer.plan
    for role in ROLES:
        ranked = data_rank_key(plan.seed, 3) if role in DATA_ROLES else plan.seed
        assert plan.key_of(role) == ranked, role
    assert registered_plan(layer.plan_index, -1) == plan._replace(layer=0)
    model(torch.randn(32, 32)).sum().backward()
    layer.set_data_parallel_rank(0)
    assert all(layer.plan.key_of(role) == plan.seed for role in ROLES)
    assert int(layer.step) == 1


@pytest.mark.parametrize(
    ("rank", "error", "message"),
    [
        (-1, ValueError, r"data_parallel_rank must be in \[0, 2\*\*32\), got -1"),
        (0.0, TypeError, "data_parallel_rank must be an int, got float"),
    ],
)
def test_a_bad_data_parallel_rank_is_refused_before_any_swap(rank, error, message) -> None:
    model = Tiny()
    with pytest.raises(error, match=message):
        srnn.quantize_(model, srnn.nvfp4(), data_parallel_rank=rank)
    assert quantized_paths(model) == {}
    layer = srnn.quantize_(nn.Linear(32, 32), srnn.nvfp4())
    with pytest.raises(error, match=message):
        layer.set_data_parallel_rank(rank)
