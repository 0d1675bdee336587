"""No public name is defined in two modules of the package: one constant or helper has one
home, and two helpers that differ carry names that say how.

The names are read from the source (an AST walk over each module's top-level statements):
functions, classes and assignments whose name does not start with an underscore.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "stochround"

# Experiments share a protocol, not code: every experiment module defines `run` (the entry
# the CLI calls) and its own constants (`QUICK`, `FORMATS`, `MODES`, `STREAM_OFFSET`,
# `STEPS`, ...) that configure that experiment alone.  A name defined only in experiment
# modules, or in experiment modules and the one lower module whose name the experiment
# constant shadows on purpose (`formats.FORMATS`, `reference.MODES`, ...), is allowed.
EXPERIMENTS = "experiments/"
SHADOWED = {"formats.py", "reference.py"}

# `main` is the console entry of the CLI (cli/__init__.py) and the torchrun entry of the
# distributed language-model experiment (experiments/lm_distributed.py): each is the
# `main` its launcher looks for, so the name is fixed by the launcher, not by us.
ALLOWED = {"main"}

# The torchtitan integration has one implementation of its API for each torchtitan release
# it supports (0.3.0 in `integrations/torchtitan/`, 0.2.2 in its `v0_2/` package); the
# package exports the installed release's (`integrations/torchtitan/__init__.py`), so an
# API name (`titan_config`, `StochroundConverter`, ...) is defined once in each.
TITAN = "integrations/torchtitan/"
TITAN_V0_2 = TITAN + "v0_2/"

# Names still defined twice, to be given one home or distinct names.
PENDING: set[str] = set()


def is_type_variable(node: ast.stmt) -> bool:
    """Whether the statement is `T = TypeVar(...)`: a type variable is local to the
    generics of its own module."""
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "TypeVar"
    )


def top_level_names(tree: ast.Module) -> list[str]:
    """The public names a module defines at its top level (`__all__` aside)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and not is_type_variable(node):
            for target in node.targets:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("_")]


def definitions() -> dict[str, list[str]]:
    """Each public top-level name and the modules (paths under the package) defining it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for name in top_level_names(ast.parse(path.read_text(), str(path))):
            if module not in found[name]:
                found[name].append(module)
    return found


def allowed(name: str, modules: list[str]) -> bool:
    if name in ALLOWED or name in PENDING:
        return True
    if len(modules) == 2 and is_release_twin(*modules):
        return True
    outside = [m for m in modules if not m.startswith(EXPERIMENTS)]
    return len(outside) == 0 or (len(outside) == 1 and outside[0] in SHADOWED)


def is_release_twin(first: str, second: str) -> bool:
    """Whether two modules are the torchtitan integration's two releases' (`TITAN`)."""
    releases = sorted((first, second), key=lambda m: m.startswith(TITAN_V0_2))
    return (
        releases[0].startswith(TITAN)
        and not releases[0].startswith(TITAN_V0_2)
        and (releases[1].startswith(TITAN_V0_2))
    )


def test_no_public_name_is_defined_in_two_modules() -> None:
    twice = {
        name: modules
        for name, modules in definitions().items()
        if len(modules) > 1 and not allowed(name, modules)
    }
    assert twice == {}


def test_pending_names_are_still_defined_twice() -> None:
    """The pending list shrinks as names get one home: a name fixed leaves it."""
    found = definitions()
    assert [name for name in sorted(PENDING) if len(found[name]) < 2] == []
