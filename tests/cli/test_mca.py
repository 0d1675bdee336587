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
    """The script prints on import and counts main()'s calls: one import; one unrounded
    call (timed), then one batched call, or n with --serial."""
    script = write_script(
        tmp_path,
        "import torch\nprint('imported')\nCOUNT = [0]\n\n"
        "def main():\n    COUNT[0] += 1\n    print('call', COUNT[0])\n"
        "    return torch.ones(2) * 0.1\n",
    )
    text = ok("mca", str(script), "--format", "bfloat16", "--n", "3", "--out", str(tmp_path))
    assert text.count("imported") == 1
    assert "call 2" in text and "call 3" not in text
    assert "main() run once on 3 samples together" in text
    assert re.search(r"time: main\(\) alone \S+ s \(one unrounded call, first\), MCA \S+ s", text)
    text = ok(
        "mca", str(script), "--format", "bf16", "--n", "3", "--out", str(tmp_path), "--serial"
    )
    assert "call 4" in text and "call 5" not in text
    assert "main() run 3 times" in text


def test_without_format_or_precision_each_dtype_keeps_its_own(tmp_path):
    # float64 at its own 53 bits, each op from its exact result: the naive variance of
    # data around 1000 loses the cancelled digits, no longer the full 15.95
    script = write_script(tmp_path, VARIANCE_SCRIPT)
    text = ok("mca", str(script), "--n", "8", "--estimator", "cnh", "--out", str(tmp_path))
    assert "each dtype's own precision (24 bits for float32, 53 for float64)" in text
    assert "(MCA mode rr, digits by cnh)" in text
    assert float(row(text, "['variance']")[4]) < 12


def test_bernoulli_with_too_few_runs_is_bad_input(tmp_path):
    script = write_script(tmp_path, VARIANCE_SCRIPT)
    result = invoke("mca", str(script), "--n", "8", "--estimator", "bernoulli")
    assert result.exit_code == 2
    assert "needs --n >= 29 samples; got --n 8" in result.stderr


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
    # mul and sum: two rounded outputs on line 4 (ones, a constant fill, is not rounded)
    assert row(text, f"{script}:4 main")[1] == "2"


def failure(tmp_path: Path, text: str, *options: str) -> str:
    """The one stderr line of `stochround mca` on a script ``text`` that fails after its
    import (exit status 2, no traceback, nothing on stdout)."""
    script = write_script(tmp_path, text)
    result = invoke("mca", str(script), "--precision", "11", "--n", "3", *options)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output and result.stdout == ""
    return result.stderr.removeprefix("error: ").rstrip("\n")


def test_an_error_in_main_is_one_line_naming_it_and_the_scripts_line(tmp_path):
    """The exception's type and message, and the script's line that raised it: the
    innermost line of the script, also where the error comes from torch below it."""
    out = str(tmp_path / "out")
    script = tmp_path / "program.py"
    message = failure(tmp_path, "def main():\n    raise KeyError('inside main')\n", "--out", out)
    assert message == f"main() raised KeyError: 'inside main' (at {script}:2 main)"
    text = "import torch\n\ndef main():\n    return torch.ones(2) @ torch.ones(3)\n"
    message = failure(tmp_path, text, "--out", out)
    assert message.startswith("main() raised RuntimeError: ")
    assert message.endswith(f"(at {script}:4 main)")
    bare = failure(tmp_path, "def main():\n    raise ValueError\n", "--out", out)
    assert bare == f"main() raised ValueError (at {script}:2 main)"


def test_sys_exit_in_main_or_at_import_is_one_line(tmp_path):
    out = str(tmp_path / "out")
    script = tmp_path / "program.py"
    message = failure(tmp_path, "import sys\n\ndef main():\n    sys.exit(3)\n", "--out", out)
    assert message == (
        f"main() called sys.exit(3) (at {script}:4 main); mca needs main() to return what "
        "it measures"
    )
    result = invoke(
        "mca",
        str(write_script(tmp_path, "import sys\nsys.exit('usage')\n")),
        "--precision",
        "8",
        "--out",
        out,
    )
    assert result.exit_code == 2
    assert result.stderr == f"error: importing SCRIPT {str(script)!r} called sys.exit('usage')\n"


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (
            "'done'",
            "main() returned str; mca needs a tensor, a Python number (bool, int, float), "
            "None, or tuples, lists and dicts of them",
        ),
        ("{'x': torch.ones(2), 'log': ['ok']}", "main() returned str at ['log'][0]; mca needs"),
        ("torch.ones(2, dtype=torch.complex64)", "main() raised TypeError: emulate does not"),
        (
            "[0.5] * len(CALLS)",
            "main() returned results of different structures, dtypes or shapes in different "
            "runs; mca compares the runs output by output",
        ),
    ],
)
def test_results_mca_cannot_measure_are_one_line(tmp_path, returned, message):
    """main() runs, but what it returns cannot be measured: the library's reason, one line.
    (A list that grows run by run: no ATen op, so the check is mca's, not the trace's;
    --serial: a batched run is one run.)"""
    text = f"import torch\nCALLS = []\n\ndef main():\n    CALLS.append(1)\n    return {returned}\n"
    assert message in failure(tmp_path, text, "--out", str(tmp_path / "out"), "--serial")


def test_integer_and_bool_outputs_every_run_agrees_on_are_exact(tmp_path):
    """Not 15.95 digits (float64's): no rounding touches them, and every run gave them."""
    script = write_script(
        tmp_path,
        "import torch\n\ndef main():\n    x = torch.arange(4.0) * 0.1\n"
        "    return {'count': (x > 0.15).sum(), 'any': bool((x > 0).any()), 'n': 4, "
        "'mean': x.mean()}\n",
    )
    text = ok("mca", str(script), "--precision", "11", "--n", "4", "--out", str(tmp_path))
    assert row(text, "['count']")[1:] == ["()", "exact", "2", "0"]
    assert row(text, "['any']")[1:] == ["()", "exact", "1", "0"]
    assert row(text, "['n']")[1:] == ["()", "exact", "4", "0"]
    assert row(text, "['mean']")[2] != "exact"
    assert "exact: an integer or bool output that every run gave the same" in text


def test_mca_takes_a_mode_in_any_case(tmp_path):
    script = write_script(tmp_path, VARIANCE_SCRIPT)
    text = ok("mca", str(script), "--format", "bf16", "--mode", "RNE", "--out", str(tmp_path))
    assert "bfloat16 with rne" in text
    assert row(text, "['variance']")[4] == "0"


@pytest.mark.parametrize(
    ("script_text", "options", "message"),
    [
        (
            "def main():\n    return 1.0\n",
            ["--format", "bf16", "--precision", "8"],
            "give at most one of --format F",
        ),
        (
            "def main():\n    return 1.0\n",
            ["--mca-mode", "full"],
            "--mca-mode must be one of 'rr', 'pb', 'mca'; got 'full'",
        ),
        (
            "def main():\n    return 1.0\n",
            ["--estimator", "t"],
            "--estimator must be one of 'plain', 'cnh', 'bernoulli'; got 't'",
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
        (
            "def main():\n    return 1.0\n",
            ["--format", "mxfp4"],
            "--format mxfp4 is a block format (e2m1 elements, one e8m0 scale per 32 elements)",
        ),
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


def test_a_script_that_cannot_be_batched_runs_serially_with_a_notice(tmp_path):
    """A branch on a value: the batched run stops at that op; the command says so, naming
    the op and the script's line, and runs main() n times one after another."""
    script = write_script(
        tmp_path,
        "import torch\n\ndef main():\n    x = torch.ones(3) * 0.1\n"
        "    if x.sum() > 0:\n        x = x * 3\n    return x\n",
    )
    text = ok("mca", str(script), "--precision", "11", "--n", "4", "--out", str(tmp_path))
    assert (
        f"notice: aten._local_scalar_dense.default (at {script}:5 main) cannot run on the 4 "
        "MCA samples together: its result is a Python value read from the samples' values."
    ) in text
    assert "; running main() 4 times one after another" in text
    assert "main() run 4 times, every op rounded" in text
    # the digits are the serial runs'
    expected = mca(load_script_main(script), n=4, precision=11, seed=0, batched=False)
    assert row(text, "result")[2] == f"{float(expected.digits[0].min()):.2f}"
