"""What an in-line aggregator can carry: its ports and its core's rate.

An aggregator sits in a city's switch path. Contributions enter through its ingress ports, its core sums
them at data width x clock bytes per second, and results (or partial sums) leave through its egress
ports. Profiles name the boards this project builds; a build report (`inwire build`'s report.json) gives
the figures of the bitstream actually built.
"""

import math
import os
from dataclasses import dataclass
from typing import Any

from ..model import AggregatorConfig
from .errors import ScheduleError
from .jsonfile import read_json


@dataclass(frozen=True)
class AggregatorProfile:
    """Port pairs of `port_gbps` each (every pair carries that much in and out) and a core of
    `data_width` bytes per clock at `core_mhz`; None for a figure means it never limits."""
    name: str
    ports: int | None = None
    port_gbps: float | None = None
    data_width: int | None = None
    core_mhz: float | None = None
    source: str = ""
    max_fanin: int | None = None
    """Most contributions one slot takes (the gateware drops a frame whose fan-in is above it); None: no limit."""
    max_elements: int | None = None
    """Most elements a frame may carry into it; None: as many as a frame holds."""

    @property
    def ingress_bps(self) -> float:
        if self.ports is None or self.port_gbps is None:
            return math.inf
        return self.ports * self.port_gbps * 1e9

    @property
    def egress_bps(self) -> float:
        return self.ingress_bps

    @property
    def core_bps(self) -> float:
        if self.data_width is None or self.core_mhz is None:
            return math.inf
        return 8 * self.data_width * self.core_mhz * 1e6

    @property
    def ideal(self) -> bool:
        return math.isinf(self.ingress_bps) and math.isinf(self.core_bps)

    def to_json(self) -> dict[str, Any]:
        def gbps(bps: float) -> float | None:
            return None if math.isinf(bps) else round(bps / 1e9, 6)
        return {"profile": self.name, "ports": self.ports, "port_gbps": self.port_gbps,
                "data_width": self.data_width, "core_mhz": self.core_mhz,
                "ingress_gbps": gbps(self.ingress_bps), "egress_gbps": gbps(self.egress_bps),
                "core_gbps": gbps(self.core_bps), "source": self.source, "max_fanin": self.max_fanin,
                "max_elements": self.max_elements}


BOARD_FANIN, BOARD_ELEMENTS = AggregatorConfig.max_fanin, AggregatorConfig.max_elements
"""The boards' core has the default AggregatorConfig's fan-in and elements (the Versa's adds job tables:
hdl/inwire_hdl/board_control.py's BOARD_CONFIG)."""

# The board figures are those of hdl/inwire_hdl (board.py, board_build.py, alveo.py; docs/board.md);
# tests/test_schedule.py checks that they still agree.
PROFILES = {
    "ideal": AggregatorProfile("ideal", source="no limit: every aggregator takes in all its contributions at once"),
    "versa_ecp5": AggregatorProfile("versa_ecp5", 1, 1.0, 8, 31.25,
                                    "Lattice ECP5 Versa: one RGMII 1 GbE port pair, core 8 bytes at 31.25 MHz",
                                    BOARD_FANIN, BOARD_ELEMENTS),
    "alveo_u200": AggregatorProfile("alveo_u200", 1, 100.0, 64, 250.0,
                                    "AMD Alveo U200: one QSFP28 100 GbE port pair, core 64 bytes at 250 MHz",
                                    BOARD_FANIN, BOARD_ELEMENTS),
    "port10g": AggregatorProfile("port10g", 1, 10.0, source="one 10 Gb/s port pair, core not limiting"),
}

BOARD_PORTS = {"versa_ecp5": (1, 1.0), "alveo_u200": (1, 100.0)}
"""Port pairs and speed of each board `inwire build` knows, for reports written before they carried them."""


def finite_number(value: object) -> float | None:
    """The float a JSON figure stands for, or None when it is no finite number: a bool, a string, infinity, or
    an integer of hundreds of digits, which no float holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: object) -> str:
    """`value` as a message quotes it; an integer too long to read is given by its number of digits."""
    digits = len(str(abs(value))) if isinstance(value, int) else 0
    return f"an integer of {digits} digits" if digits > 20 else repr(value)


def _positive(report: dict[str, Any], key: str, where: str) -> Any:
    value = report.get(key)
    number = finite_number(value)
    if number is None or not number > 0:
        raise ScheduleError(f"{where}: needs a positive '{key}', got {shown(value)}")
    return value


def _count(report: dict[str, Any], key: str, where: str) -> int:
    """A positive whole number (port pairs, bytes of data width): int() would make 0.5 ports 0."""
    value = _positive(report, key, where)
    if value != int(value):
        raise ScheduleError(f"{where}: needs a whole number of '{key}', got {value!r}")
    return int(value)


def profile_from_report(report: object, where: str) -> AggregatorProfile:
    """A profile from a build report (a dict): its core clock and width, and its ports."""
    if not isinstance(report, dict):
        raise ScheduleError(f"{where}: a build report must be a JSON object")
    if report.get("timing_met") is False:
        raise ScheduleError(f"{where}: the build missed timing, so its core clock cannot be relied on")
    core_mhz = _positive(report, "core_clock_mhz", where)
    data_width = _count(report, "data_width", where)
    board = report.get("board")
    if "port_gbps" in report or "ports" in report:
        ports, port_gbps = _count(report, "ports", where), _positive(report, "port_gbps", where)
    elif board in BOARD_PORTS:
        ports, port_gbps = BOARD_PORTS[board]
    else:
        raise ScheduleError(f"{where}: no 'ports' and 'port_gbps', and board {board!r} is not one whose ports "
                            f"are known ({', '.join(BOARD_PORTS)})")
    return AggregatorProfile(f"{board or 'board'} build", ports, port_gbps, data_width, core_mhz,
                             f"build report {where}", BOARD_FANIN, BOARD_ELEMENTS)


def load_aggregator(spec: "str | os.PathLike[str] | AggregatorProfile") -> AggregatorProfile:
    """A named profile, or the build report (report.json) at path `spec`."""
    if isinstance(spec, AggregatorProfile):
        return spec
    if spec in PROFILES:
        return PROFILES[spec]
    if not str(spec).endswith(".json"):
        raise ScheduleError(f"unknown aggregator profile {spec!r} (profiles: {', '.join(PROFILES)}; "
                            f"or a build report.json)")
    return profile_from_report(read_json(spec, "build report", ScheduleError), str(spec))


def profile_from_entry(entry: object, where: str) -> AggregatorProfile:
    """A topology file's per-city `aggregator`: a profile name or an object of figures."""
    if isinstance(entry, str):
        if entry not in PROFILES:
            raise ScheduleError(f"{where}: unknown aggregator profile {entry!r} (profiles: {', '.join(PROFILES)})")
        return PROFILES[entry]
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"name", "ports", "port_gbps", "data_width", "core_mhz"})
        if unknown:
            raise ScheduleError(f"{where}: unknown aggregator field {unknown[0]!r}")
        ports = _count(entry, "ports", where) if "ports" in entry or "port_gbps" in entry else None
        port_gbps = _positive(entry, "port_gbps", where) if ports is not None else None
        width = _count(entry, "data_width", where) if "data_width" in entry or "core_mhz" in entry else None
        core_mhz = _positive(entry, "core_mhz", where) if width is not None else None
        return AggregatorProfile(str(entry.get("name", "custom")), ports, port_gbps, width, core_mhz, where)
    raise ScheduleError(f"{where}: aggregator must be a profile name or an object, got {entry!r}")
