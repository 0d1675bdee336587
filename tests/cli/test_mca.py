"""Tests for stochround.cli.mca: `stochround mca SCRIPT.py` on tiny scripts written to
tmp_path: the worst site is the script's cancelling line, the digits are the library's, the
plot is written, and bad input exits with status 2 before main() runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from helpers import invoke, ok, row

from stochround.emulate.mca import mca

VARIANCE_SCRIPT = """
import torch

X = 1000 + torch.arange(-16, 16, dtype=torch.float64) / 4
CALLS = []


def main():
    CALLS.append(1)
    squares = (X * X).mean()
    mean = X.mean() ** 2
    return {"variance": squares - mean, "total": X.sum()}
"""


def write_script(folder: Path, text: str, name: str = "program.py") -> Path:
    """The script ``text`` saved as ``folder/name``."""
    path = folder / name
    path.write_text(text)
    return path


def load_script_main(path: Path):
    """The script's main(), imported here as the command imports it."""
    namespace: dict[str, object] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["main"]


def test_mca_prints_the_cancelling_line_first_and_writes_the_plot(tmp_path):
    script = write_script(tmp_path, VARIANCE_SCRIPT)
    out = tmp_path / "out"
    text = ok("mca", str(script), "--precision", "24", "--n", "8", "--seed", "3", "--out", str(out))
    # the same run through the library: the table prints its digits, to two decimals
    expected = mca(load_script_main(script), n=8, precision=24, seed=3, trace=True)
    variance_row = row(text, "['variance']")
    assert variance_row[1:3] == ["()", f"{float(expected.digits[0]):.2f}"]
    assert row(text, "['total']")[2] == f"{24 * math.log10(2):.2f}"  # exact sums: std 0
    site = re.compile(rf"{re.escape(str(script))}:\d+ ")
    sites = [line.strip() for line in text.splitlines() if site.match(line.strip())]
    assert len(sites) == 3
    assert sites[0].startswith(f"{script}:12 main")  # the subtraction: worst first
    # the subtraction and X.sum(): two calls on the return line
    assert row(text, f"{script}:12 main")[1:] == ["2", variance_row[2]]
    assert row(text, f"{script}:10 main")[1:] == ["2", f"{24 * math.log10(2):.2f}"]
    assert row(text, f"{script}:11 main")[1:] == ["2", f"{24 * math.log10(2):.2f}"]
    assert "3 of 3 sites" in text
    assert (out / "mca-sites.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out / 'mca-sites.png'}" in text


def test_mca_runs_main_n_times_and_imports_the_script_once(tmp_path):
    """The script prints on import and counts main()'s calls: one import, n calls."""
    script = write_script(
        tmp_path,
        "import torch\nprint('imported')\nCOUNT = [0]\n\n"
        "def main():\n    COUNT[0] += 1\n    print('call', COUNT[0])\n"
        "    return torch.ones(2) * 0.1\n",
    )
    text = ok("mca", str(script), "--format", "bfloat16", "--n", "3", "--out", str(tmp_path))
    assert text.count("imported") == 1
    assert "call 3" in text and "call 4" not in text


def test_a_deterministic_mode_keeps_every_digit_of_the_format(tmp_path):
    script = write_script(tmp_path, VARIANCE_SCRIPT)
    text = ok("mca", str(script), "--format", "bf16", "--mode", "rne", "--out", str(tmp_path))
    variance = row(text, "['variance']")
    assert variance[2] == f"{8 * math.log10(2):.2f}" and variance[4] == "0"
    assert "bfloat16 with rne" in text


def test_main_returning_nothing_still_gets_its_sites(tmp_path):
    script = write_script(
        tmp_path, "import torch\n\ndef main():\n    torch.ones(3).mul(0.1).sum()\n"
    )
    text = ok("mca", str(script), "--precision", "11", "--n", "4", "--out", str(tmp_path))
    assert "main() returned no tensors or numbers" in text
    # ones, mul and sum: three rounded outputs on line 4
    assert row(text, f"{script}:4 main")[1] == "3"


def test_an_error_in_main_is_the_scripts_own(tmp_path):
    """Not bad input: the exception propagates (a traceback, exit status 1)."""
    script = write_script(tmp_path, "def main():\n    raise KeyError('inside main')\n")
    result = invoke("mca", str(script), "--precision", "11", "--out", str(tmp_path))
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)


@pytest.mark.parametrize(
    ("script_text", "options", "message"),
    [
        ("def main():\n    return 1.0\n", [], "give exactly one of --format F"),
        (
            "def main():\n    return 1.0\n",
            ["--format", "bf16", "--precision", "8"],
            "give exactly one of --format F",
        ),
        (
            "def main():\n    return 1.0\n",
            ["--precision", "0"],
            "precision must be an int in 1..53",
        ),
        ("def main():\n    return 1.0\n", ["--format", "bf17"], "unknown format 'bf17'"),
        ("def main():\n    return 1.0\n", ["--precision", "8", "--mode", "up"], "mode must be"),
        ("def main():\n    return 1.0\n", ["--precision", "8", "--n", "1"], "--n must be"),
        ("def main():\n    return 1.0\n", ["--precision", "8", "--seed", "-1"], "--seed must be"),
        ("x = 1\n", ["--precision", "8"], "must define a function main()"),
        ("def main(x):\n    return x\n", ["--precision", "8"], "main() must take no arguments"),
        ("raise ImportError('no such thing')\n", ["--precision", "8"], "raised ImportError"),
    ],
)
def test_bad_input_exits_2_before_main_runs(tmp_path, script_text, options, message):
    script = write_script(tmp_path, script_text)
    result = invoke("mca", str(script), *options, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("name", ["missing.py", "notes.txt"])
def test_a_script_that_is_no_python_file_is_bad_input(tmp_path, name):
    (tmp_path / "notes.txt").write_text("def main(): pass\n")
    result = invoke("mca", str(tmp_path / name), "--precision", "8", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "SCRIPT must be a Python file (.py)" in result.stderr


def test_scripts_import_their_neighbours(tmp_path):
    """The script's folder is on sys.path while it is imported (as `python SCRIPT.py`)."""
    write_script(tmp_path, "import torch\nSCALE = torch.tensor(0.3)\n", name="helper_mod.py")
    script = write_script(
        tmp_path, "from helper_mod import SCALE\n\ndef main():\n    return SCALE * 3\n"
    )
    text = ok("mca", str(script), "--precision", "8", "--n", "4", "--out", str(tmp_path))
    assert row(text, "result")[1] == "()"
