"""Tests for the `stochround` app as a whole (stochround.cli): every command's help, bad
input to any command printing the library's message and exiting with status 2, --version and
`python -m stochround`."""

import contextlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers import invoke, ok

import stochround

SEED_RANGE = "--seed must be an integer in [0, 2**64) (0 to 18446744073709551615)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["info", "e4m3fm"], "closest: e4m3fn"),
        (["round", "1", "--format", "e4m3fm"], "closest: e4m3fn"),
        (["round", "1", "--format", "bf16", "--mode", "nearest"], "mode must be one of"),
        (["round", "1", "--format", "bf16", "--variant", "d"], "variant must be one of"),
        (["round", "1", "--format", "bf16", "--rbits", "0"], "rbits must be None"),
        (["round", "1", "--format", "bf16", "--rbits", "33"], "rbits must be None"),
        (["round", "1", "--format", "bf16", "--mode", "rne", "--rbits", "4"], "mode='sr' only"),
        (["round", "1", "--format", "bf16", "--sat", "clip"], "sat must be one of"),
        (["round", "abc", "--format", "bf16"], "VALUE must be a number"),
        (["round", "1"], "--format is required"),
        (["round", "1", "--hardware", "amd-mi300"], "has 2 units"),
        (["round", "1", "--hardware", "intel-fp16", "--rbits", "8"], "--hardware sets"),
        (["round", "1", "--hardware", "intel-fp16", "--format", "e5m2"], "not to fmt=e5m2"),
        (["hardware", "amd-mi30"], "unknown hardware preset"),
        (["hardware", "--format", "e5m2"], "give NAME too"),
        (["round", "1", "--format", "bf16", "--seed", "abc"], f"{SEED_RANGE}; got 'abc'"),
        (["round", "1", "--format", "bf16", "--seed", "-1"], f"{SEED_RANGE}; got -1"),
        (["run", "limited-bits", "--seed", "18446744073709551616"], f"{SEED_RANGE}; got {2**64}"),
        (["run", "limited-bits", "--seed", "-1"], f"{SEED_RANGE}; got -1"),
        (["run", "limited-bits", "--seed", "1e3"], f"{SEED_RANGE}; got '1e3'"),
        (["demo", "--seed", "abc"], f"{SEED_RANGE}; got 'abc'"),
        (["demo", "--seed", "-5"], f"{SEED_RANGE}; got -5"),
        (["run", "nope"], "NAME must be one of stagnation, summation, limited-bits, "),
        (
            ["run", "limited-bits", "nope", "zz"],
            "optimizer-state, emulate-science, recipes-regime, lm, all; got 'nope', 'zz'",
        ),
        (["run", "all", "stagnation"], "NAME all runs every experiment: give it alone"),
        (["run", "summation", "summation"], "summation given more than once"),
        # a block format has no rounding of one value: its element format is named instead
        (
            ["round", "1.3", "--format", "mxfp4"],
            "--format mxfp4 is a block format (e2m1 elements, one e8m0 scale per 32 elements): "
            "a value's rounding in it depends on its block's scale, which one value does not "
            "have; to round to its elements pass --format e2m1, and see stochround info mxfp4",
        ),
        (
            ["round", "1.3", "--format", "NVFP4"],
            "pass --format e2m1, and see stochround info nvfp4",
        ),
        (
            ["round", "1.3", "--format", "int8_rowwise"],
            "(int8 elements, one binary32 scale per row)",
        ),
        (
            ["round", "1.3", "--format", "mxint8"],
            "its element grid has no format name here: see stochround info mxint8",
        ),
        (
            ["round", "1.3", "--hardware", "nvidia-cvt-rs", "--format", "mxfp4"],
            "--format mxfp4 is a block format",
        ),
        (["hardware", "nvidia-cvt-rs", "--format", "nvfp4"], "pass --format e2m1, and see"),
    ],
)
def test_bad_input_prints_the_message_and_exits_2(args, message):
    """One line on stderr, nothing on stdout (no experiment started), no traceback."""
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["run", "demo"])
def test_a_bad_out_folder_fails_before_any_work_with_one_line(tmp_path, command):
    """A file, a path under a file, a folder no file can be created in: each is refused
    before the first table, with the reason, not with a traceback after the experiments."""
    names = ["limited-bits"] if command == "run" else []
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (a_file, f"--out must be a folder (existing or new); '{a_file}' is not a folder"),
        (a_file / "sub", "--out must be a folder that can be created and written to; "),
    ]
    if sys.platform == "linux":  # a pseudo file system: no folder can be created there
        cases.append((Path("/proc/stochround-out"), "'/proc/stochround-out': No such file"))
    for out, message in cases:
        result = invoke(command, *names, "--out", str(out))
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert message in result.stderr
        assert result.stdout == ""
    assert a_file.read_text() == ""


def test_run_takes_several_names_in_the_order_given_and_the_largest_seed(tmp_path):
    """One report for both, in the order given; 2**64 - 1, the largest seed the streams
    take, is accepted (and recorded)."""
    seed = 2**64 - 1
    args = ("run", "hardware-units", "limited-bits", "--quick", "--seed", str(seed))
    output = ok(*args, "--out", str(tmp_path))
    payload = json.loads((tmp_path / "results.json").read_text())
    assert list(payload) == ["hardware-units", "limited-bits"]
    assert payload["hardware-units"]["settings"]["seed"] == seed
    hardware_title = payload["hardware-units"]["title"]
    limited_title = payload["limited-bits"]["title"]
    assert 0 <= output.index(hardware_title) < output.index(limited_title)
    report = (tmp_path / "report.md").read_text()
    assert report.index(f"## {hardware_title}") < report.index(f"## {limited_title}")


def test_version_prints_the_package_version():
    assert ok("--version") == f"stochround {stochround.__version__}\n"
    # where the package is installed, its metadata says the same (the GPU machine runs the
    # tests from a source tree that was never installed)
    with contextlib.suppress(metadata.PackageNotFoundError):
        assert metadata.version("stochround") == stochround.__version__


def test_python_dash_m_stochround_runs_the_same_app():
    from stochround.__main__ import app  # importing the module runs nothing

    assert app is stochround.cli.app
    result = subprocess.run(
        [sys.executable, "-m", "stochround", "--version"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, f"stochround {stochround.__version__}\n")


def test_help_lists_every_command_and_each_has_help():
    output = ok("--help")
    for command in ("formats", "info", "round", "hardware", "demo"):
        assert command in output
        assert "Usage: stochround " + command in ok(command, "--help")
    round_help = ok("round", "--help")
    for option in ("--format", "--mode", "--rbits", "--variant", "--sat", "--hardware", "--seed"):
        assert option in round_help
