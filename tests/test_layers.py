"""The package's layering: every module imports only modules of its own layer or the layers
below it, the imports form no cycle, and no private name crosses a module boundary.

The imports are read from the source (an AST walk, imports inside functions included), so a
lazy import that would close a cycle at run time is caught as well.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "stochround"

# The layers, lowest first (the docs' architecture page lists the same): a module may import
# modules of its own layer and of the layers before it.  A name stands for a module and,
# for a package, every module inside it.
LAYERS: list[tuple[str, ...]] = [
    ("formats", "version", "compile_cache", "shards", "block_constants"),
    ("reference", "outcomes"),
    ("presets",),
    ("random",),
    ("packing", "torch_path", "cpu_path"),
    ("kernels",),
    ("rounding",),
    ("hardware",),
    ("blocks",),
    ("arith",),
    ("emulate",),
    ("optim", "nn"),
    ("experiments",),
    ("integrations",),
    ("cli", "__main__"),
]


def module_name(path: Path) -> str:
    """``stochround.x.y`` for src/stochround/x/y.py (a package's __init__.py: its name)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str | None = None) -> list[tuple[str, list[str], int]]:
    """(module imported, names imported from it, line) for every stochround import in the
    file of module ``name`` (by default the package module at ``path``), module-level or
    not, relative imports resolved."""
    name = module_name(path) if name is None else name
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [alias.name for alias in node.names]
            # `from . import x` imports the module x when x is one
            for alias in names:
                submodule = f"{target}.{alias}"
                if module_path(submodule) is not None:
                    found.append((submodule, [], node.lineno))
                    names = [n for n in names if n != alias]
            if names:  # names the module defines (not its submodules)
                found.append((target, names, node.lineno))
    return [entry for entry in found if entry[0].split(".")[0] == "stochround"]


def module_path(name: str) -> Path | None:
    """The source file of a stochround module (None if there is none)."""
    relative = Path(*name.split(".")[1:])
    for candidate in (PACKAGE / relative / "__init__.py", PACKAGE / f"{relative}.py"):
        if candidate.exists():
            return candidate
    return None


def layer(name: str) -> int | None:
    """The layer of a module (None for the package itself, the public facade above all)."""
    parts = name.split(".")
    if len(parts) == 1:
        return None
    for index, members in enumerate(LAYERS):
        if parts[1] in members:
            return index
    raise AssertionError(f"module {name} is in no layer: add it to LAYERS and the docs")


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        layer(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_one_way_down(name: str) -> None:
    own = layer(name)
    if own is None:
        return
    for target, _, line in imports(MODULES[name]):
        theirs = layer(target)
        assert theirs is None or theirs <= own, (
            f"{name} (layer {own}) imports {target} (layer {theirs}) at line {line}: "
            "a module imports only its own layer and the layers below it"
        )
        assert theirs is not None or target == name, (
            f"{name} imports the package facade `stochround` at line {line}; import the "
            "module that defines the name instead"
        )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_crosses_a_module_boundary(name: str) -> None:
    for target, names, line in imports(MODULES[name]):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{name} imports private {private} from {target} at line {line}"


def test_the_imports_form_no_cycle() -> None:
    graph = {
        name: {target for target, _, _ in imports(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }
    # the package facade imports everything and nothing imports it (checked above)
    graph.pop("stochround")
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done or name not in graph:
            return
        assert name not in visiting, "import cycle: " + " -> ".join(
            [*visiting[visiting.index(name) :], name]
        )
        visiting.append(name)
        for target in sorted(graph[name]):
            # a module inside a package imports the package's __init__ too; the package's own
            # re-exports of its modules are not a cycle through them
            if not name.startswith(target + "."):
                visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_the_walk_sees_what_the_checks_need(tmp_path: Path) -> None:
    """Function-level imports, relative imports and private names are all found (a check
    that cannot fail proves nothing)."""
    source = tmp_path / "probe.py"
    source.write_text(
        "def late():\n"
        "    from .rounding import _round_call\n"
        "    from . import torch_path\n"
        "    import stochround.cli\n"
    )
    found = [(target, names) for target, names, _ in imports(source, "stochround.probe")]
    assert ("stochround.rounding", ["_round_call"]) in found
    assert ("stochround.torch_path", []) in found
    assert ("stochround.cli", []) in found
    assert layer("stochround.cli") > layer("stochround.rounding")


def documented_layers() -> list[tuple[str, ...]]:
    """The modules of each row of docs/contributing.md's layer table (its second column,
    names in backquotes; ``x.py`` and ``x/`` stand for the module or package x)."""
    text = (PACKAGE.parents[1] / "docs" / "contributing.md").read_text()
    section = text.split("## Layers", 1)[1]
    table = section[section.index("| layer |") :].split("\n\n", 1)[0]
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return [
        tuple(
            name.removesuffix(".py").removesuffix("/") for name in re.findall(r"`([^`]+)`", row[2])
        )
        for row in rows
    ]


def test_the_documented_layer_table_is_the_one_enforced() -> None:
    assert documented_layers() == LAYERS
