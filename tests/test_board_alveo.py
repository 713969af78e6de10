"""100 GbE target: the 64-byte wrapper with the aggregator passes Verilator --lint-only, and the Alveo
U200 constraints name only ports and instances that the generated card top has."""

import re
import shutil
import subprocess
from importlib import resources

import pytest
from amaranth.back import verilog

from inwire_hdl.alveo import AlveoCore, AlveoU200Top
from inwire_hdl.board import passthrough_factory

CONSTRAINTS = resources.files("inwire_hdl") / "constraints"
XDC = CONSTRAINTS / "alveo_u200.xdc"
TCL = CONSTRAINTS / "alveo_u200_build.tcl"

# Yosys emits width-mismatched assignments and casez without default; neither is a design error.
LINT_FLAGS = ["--lint-only", "-Wno-WIDTH", "-Wno-CASEINCOMPLETE"]


@pytest.fixture(scope="module")
def wrapper_verilog(tmp_path_factory):
    wrapper = AlveoCore()
    path = tmp_path_factory.mktemp("alveo") / "inwire_alveo_core.v"
    path.write_text(verilog.convert(wrapper, ports=wrapper.ports(), name="inwire_alveo_core", emit_src=False))
    return path


@pytest.fixture(scope="module")
def top_verilog():
    top = AlveoU200Top(passthrough_factory())
    return verilog.convert(top, ports=top.ports(), name="inwire_alveo_u200", emit_src=False)


def test_wrapper_with_aggregator_passes_verilator_lint(wrapper_verilog):
    if shutil.which("verilator") is None:
        pytest.fail("verilator is not on PATH (run `make setup`)")
    result = subprocess.run(["verilator", *LINT_FLAGS, "--top-module", "inwire_alveo_core", str(wrapper_verilog)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "%Warning" not in result.stderr


def test_wrapper_ports_match_cmac_axis(wrapper_verilog):
    text = wrapper_verilog.read_text()
    header = text[text.index("module inwire_alveo_core"):]
    header = header[:header.index(");")]
    for port in (0, 1):
        for field, width in (("tdata", 512), ("tkeep", 64)):
            for direction in ("rx", "tx"):
                assert re.search(rf"\[{width - 1}:0\] cmac{port}_{direction}_axis_{field};", text)
        for name in ("tvalid", "tlast", "tuser"):
            assert f"cmac{port}_rx_axis_{name}" in header and f"cmac{port}_tx_axis_{name}" in header
        assert f"cmac{port}_tx_axis_tready" in header and f"cmac{port}_rx_axis_tready" not in header


def _xdc_ports():
    names = set()
    for match in re.finditer(r"get_ports (?:\{([^}]*)\}|([^\s\]]+))", XDC.read_text()):
        names.update((match.group(1) or match.group(2)).split())
    return names


def test_constraints_name_existing_ports_and_instances(top_verilog):
    header = top_verilog[top_verilog.index("module inwire_alveo_u200"):]
    header = header[:header.index(");")]
    declared = set(re.findall(r"\b(\w+)\b", header))
    for name in _xdc_ports():
        base = re.sub(r"\[(\d+|\*)\]$", "", name)
        if "*" in base:
            assert any(re.fullmatch(base.replace("*", r"\w*"), port) for port in declared), name
        else:
            assert base in declared, name
    for instance in set(re.findall(r"get_pins (\w+)/", XDC.read_text())):
        assert re.search(rf"\s{instance} \(", top_verilog), instance
    # Every vendor IP the top instantiates is created, under that module name, by the build script.
    created = set(re.findall(r"^cmac (\w+) ", TCL.read_text(), re.M))
    created |= set(re.findall(r"-module_name (\w+)", TCL.read_text())) - {"$name"}
    instantiated = set(re.findall(r"^\s+(inwire_\w+) \w+ \(", top_verilog, re.M))
    assert instantiated == {"inwire_cmac_qsfp0", "inwire_cmac_qsfp1", "inwire_core_clk"} == created
