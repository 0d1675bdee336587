"""Tests for the `stochround` app as a whole (stochround.cli): every command's help, and bad
input to any command printing the library's message and exiting with status 2."""

import pytest
from helpers import invoke, ok


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
    ],
)
def test_bad_input_prints_the_message_and_exits_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


def test_help_lists_every_command_and_each_has_help():
    output = ok("--help")
    for command in ("formats", "info", "round", "hardware", "demo"):
        assert command in output
        assert "Usage: stochround " + command in ok(command, "--help")
    round_help = ok("round", "--help")
    for option in ("--format", "--mode", "--rbits", "--variant", "--sat", "--hardware", "--seed"):
        assert option in round_help
