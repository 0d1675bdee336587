"""Packaging: the wheel `python -m build` makes installs and imports in a clean virtual
environment, and the README's main job runs on a fresh machine as written.

Both build virtual environments without the system's site-packages, from the interpreter
that runs pytest, so they work whether pytest runs in a virtual environment or not.

- The wheel (built without isolation, so without network, on a copy of the project's
  packaging inputs: the checkout gets no build/ or egg-info folders) goes in with
  --no-deps; torch and the other dependencies come from the running interpreter's own
  site-packages, named in a ``.pth`` file, which adds those folders to ``sys.path`` but
  does not run their ``.pth`` files, so an editable install of the checkout there stays
  out.  The test checks that ``stochround`` is imported from the installed wheel.
- The main job (`README_MAIN_JOB`) installs the library with its dependencies and no
  extras (no Triton) from the package index and runs every quick experiment: a few
  minutes on two cores.  It is marked ``firstrun`` and left out of the default run (the
  ``-m "not firstrun"`` in pyproject.toml's addopts); ``.ci/run`` runs it on its own,
  beside the static checks and the docs build and before the suite, with ``python -m
  pytest -m firstrun tests/test_packaging.py``.  It reads the command from README.md, so
  the README and CI cannot drift.  It is the one whole demo of a CI run: it checks the
  tables the demo printed and the report it wrote (`helpers.assert_demo_report`: every
  quick experiment in results.json and report.md, its figures, the key numbers), which
  tests/cli/test_experiments.py checks on a demo whose slow experiments are stood in for.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import assert_demo_report

ROOT = Path(__file__).resolve().parents[1]
PACKAGING_INPUTS = ("pyproject.toml", "README.md", "LICENSE")
# what `pip install -c constraints-ci.txt -e .` reads in a clone
PROJECT_INPUTS = (*PACKAGING_INPUTS, "constraints-ci.txt")
BIN = "Scripts" if os.name == "nt" else "bin"
EXE = ".exe" if os.name == "nt" else ""


def run(*command: str | Path, cwd: Path | None = None) -> str:
    """Run a command, failing the test with its output when it fails; return its stdout."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the checkout must not leak into the environment's imports
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def copy_project(names: tuple[str, ...], project: Path) -> Path:
    """A copy of the checkout's files ``names`` and its ``src`` (no caches, no egg-info)."""
    project.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src",
        project / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )
    return project


def fresh_venv(path: Path) -> Path:
    """A virtual environment at ``path`` made without the system's site-packages, by the
    interpreter running the tests; returns its scripts folder."""
    run(sys.executable, "-m", "venv", path)
    return path / BIN


def readme_main_job() -> str:
    """The command of README.md's "Set-up: two commands" section: its first bash block."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Set-up: two commands\n", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL)
    assert block is not None, "README.md's set-up section has no bash block"
    return block.group(1).strip()


README_MAIN_JOB = readme_main_job()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the wheel is built with the `build` package (dev extra)")
    project = copy_project(PACKAGING_INPUTS, tmp_path_factory.mktemp("project"))
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, project)
    (built,) = dist.glob("stochround-*.whl")
    return built


def test_the_wheel_holds_the_package_its_type_marker_and_the_license(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "stochround/__init__.py" in names
    assert "stochround/py.typed" in names
    assert any(name.startswith("stochround/kernels/") for name in names)
    assert any(".dist-info/" in name and name.endswith("LICENSE") for name in names)
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[console_scripts]" in scripts
    assert "stochround = stochround.cli" in scripts


def test_the_wheel_installs_and_imports_in_a_fresh_virtual_environment(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    scripts = fresh_venv(venv)
    python = scripts / f"python{EXE}"
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)
    # the dependencies: the running interpreter's site-packages, after the environment's own
    environment_site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    (Path(environment_site.strip()) / "dependencies.pth").write_text("\n".join(sorted(ours)))

    probe = (
        "import pathlib, sys, torch, stochround as sr\n"
        "package = pathlib.Path(sr.__file__).resolve().parent\n"
        "print(package)\n"
        "print((package / 'py.typed').is_file())\n"
        "print(sr.round(torch.tensor([1.3]), 'e4m3fn').item())\n"
    )
    package, typed, rounded = run(python, "-c", probe, cwd=tmp_path).splitlines()
    assert Path(package).is_relative_to(venv.resolve()), f"imported from {package}"
    assert not Path(package).is_relative_to(ROOT / "src")
    assert typed == "True"
    assert rounded == "1.25"

    command = scripts / f"stochround{EXE}"
    assert command.exists()
    assert "demo" in run(command, "--help", cwd=tmp_path)


def test_the_readme_names_the_main_job_that_ci_runs() -> None:
    assert README_MAIN_JOB == (
        "pip install -c constraints-ci.txt -e . && stochround demo --out stochround-report"
    )


@pytest.mark.firstrun
def test_the_readme_main_job_runs_in_a_fresh_environment(tmp_path: Path) -> None:
    """The README's main job, as written, in a copy of the project and a fresh virtual
    environment (no system site-packages, no extras): it installs the CPU build of torch
    that the constraints pin (no CUDA wheels), no Triton, and writes the whole report:
    every quick experiment, with the numbers and files `assert_demo_report` checks."""
    project = copy_project(PROJECT_INPUTS, tmp_path / "project")
    scripts = fresh_venv(tmp_path / "venv")
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # the checkout must not leak into the environment's imports
    env.pop("TRITON_INTERPRET", None)  # as on a fresh machine
    env["COLUMNS"] = "200"  # a wide terminal's: the demo's tables are read back unwrapped
    result = subprocess.run(
        ["bash", "-c", README_MAIN_JOB], cwd=project, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{README_MAIN_JOB} failed:\n{result.stdout}\n{result.stderr}"

    python = scripts / f"python{EXE}"
    probe = (
        "import importlib.util, torch\n"
        "print(torch.__version__, torch.version.cuda)\n"
        "print(importlib.util.find_spec('triton') is None)\n"
    )
    versions, no_triton = run(python, "-c", probe).splitlines()
    assert versions.endswith("+cpu None"), versions
    assert no_triton == "True"
    assert_demo_report(result.stdout, project / "stochround-report")
