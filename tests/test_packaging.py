"""The wheel `python -m build` makes installs and imports in a clean virtual environment.

The build runs without isolation (no network: the installed setuptools builds it) on a copy
of the project's packaging inputs, so the checkout gets no build/ or egg-info folders.  The
virtual environment sees the system's site-packages for torch and the other dependencies
(the wheel goes in with --no-deps), so the test checks that ``stochround`` is imported from
the wheel installed in the environment, not from the checkout's ``src`` (which an editable
install of the checkout puts on the system's path, after the environment's own packages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build", reason="the wheel is built with the `build` package (dev extra)")

ROOT = Path(__file__).resolve().parents[1]
PACKAGING_INPUTS = ("pyproject.toml", "README.md", "LICENSE")


def run(*command: str | Path, cwd: Path | None = None) -> str:
    """Run a command, failing the test with its output when it fails; return its stdout."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the checkout must not leak into the environment's imports
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tmp_path_factory.mktemp("project")
    for name in PACKAGING_INPUTS:
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src",
        project / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )
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
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    scripts = venv / ("Scripts" if os.name == "nt" else "bin")
    python = scripts / ("python.exe" if os.name == "nt" else "python")
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)

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

    command = scripts / ("stochround.exe" if os.name == "nt" else "stochround")
    assert command.exists()
    assert "demo" in run(command, "--help", cwd=tmp_path)
