"""Tests for stochround.cli.hardware: `stochround hardware [NAME]`."""

from helpers import ok, row

from stochround import hardware


def test_hardware_lists_every_preset_with_its_formats_and_bits():
    output = ok("hardware")
    for name, unit in hardware.PRESETS.items():
        flush = "-" if unit.flush_below is None else "below 2^-25"
        assert row(output, name)[1:] == [
            unit.source_format,
            unit.target_format,
            str(unit.rbits),
            unit.variant,
            unit.sat,
            flush,
        ]
    assert "amd-mi300, amd-mi350, nvidia-cvt-rs, graphcore-ipu, intel" in output


def test_hardware_documents_one_unit_found_by_name_or_family():
    output = ok("hardware", "amd-mi300", "--format", "e5m2fnuz")
    unit = hardware.preset("amd-mi300-bf8")
    assert row(output, "name")[1] == "amd-mi300-bf8"
    assert row(output, "random bits")[1] == "21"
    assert row(output, "target format")[1] == "e5m2fnuz"
    for text in (unit.description, unit.source, unit.decisions, unit.exact_domain):
        assert text in output
    assert ok("hardware", "intel-fp16") == ok("hardware", "intel", "--format", "fp16")
