"""The Lua dissector: generated from the protocol table, and decoding real captures in tshark."""

import shutil
import subprocess

import numpy as np
import pytest

from inwire.cli import main
from inwire.datagram import opcode_of, payload_of, stats_request, wrap
from inwire.decode import describe_frame
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames
from inwire.pcap import read_frames, write_frames
from inwire.protocol import AGGREGATION_FIELDS, INWIRE_PORT, Opcode
from inwire.wireshark import committed_dissector, lua_dissector
from schedules import PERIOD, write_schedule

TSHARK = shutil.which("tshark")
FIELDS = ("opcode", "version", "job", "round", "clique", "slot", "chunk", "sender", "fanin", "exponent", "count",
          "group")
TREE_FIELDS = ("expect", "hop1", "hop1_expect", "hop2", "hop2_expect")


def cli(*argv):
    return main(argv)


def test_committed_dissector_is_the_generated_one():
    assert committed_dissector() == lua_dissector(), "regenerate: inwire dissector --out sw/inwire/data/inwire.lua"


def test_dissector_names_every_header_field():
    source = lua_dissector()
    for field in AGGREGATION_FIELDS:
        assert f'"inwire.{field.name}"' in source
    assert f"add({INWIRE_PORT}, inwire)" in source


def test_dissector_command_writes_the_file(tmp_path):
    assert cli("dissector", "-o", str(tmp_path / "inwire.lua")) == 0
    assert (tmp_path / "inwire.lua").read_text() == lua_dissector()


def tshark_fields(capture, lua, fields):
    command = [TSHARK, "-X", f"lua_script:{lua}", "-r", str(capture), "-T", "fields", "-E", "occurrence=a",
               *(part for name in fields for part in ("-e", f"inwire.{name}"))]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [line.split("\t") for line in run.stdout.splitlines()]


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")
def test_tshark_decodes_a_stream_capture(tmp_path, capsys):
    lua = tmp_path / "inwire.lua"
    lua.write_text(lua_dissector())
    capture = tmp_path / "round.pcap"
    schedule = write_schedule(tmp_path / "schedule.json", rounds=PERIOD[:1])
    assert cli("stream", "--target", f"pcap:{capture}", "--schedule", str(schedule), "--rounds", "2",
               "--elements", "300", "--json") == 0
    capsys.readouterr()
    # Add what an aggregator answers (results with their trailer, a stats reply) to the islands' frames.
    frames = read_frames(capture)
    model = Aggregator(AggregatorConfig(slots=64))
    answers = [out for frame in frames for out in model.process(frame)]
    request = wrap(stats_request(job=9), ("10.73.1.1", INWIRE_PORT), ("10.73.87.1", INWIRE_PORT),
                   AggregatorConfig().mac.to_bytes(6, "big"))
    answers += model.process(request)
    # A level below the root: two members' contributions make a partial for hop1, whose hops move up.
    tree = dict(fanin=3, job=5, round=1, slot=40, group=0xEF000002, expect=0b011, hop1=0x0A495702,
                hop1_expect=0b111, hop2=0x0A495703, hop2_expect=0b1111, ip_dst=AggregatorConfig().ip)
    leaves = [build_frames(np.array([[s + 1, -s]]), sender=s, **tree)[0].tobytes() for s in (0, 1)]
    partials = [out for frame in leaves for out in model.process(frame)]
    assert [opcode_of(payload_of(frame)) for frame in partials] == [Opcode.PARTIAL]
    everything = frames + answers + leaves + partials
    write_frames(capture, everything)

    names = FIELDS + ("element", "bitmap", "contributors", "status", "counter") + TREE_FIELDS
    rows = tshark_fields(capture, lua, names)
    assert len(rows) == len(everything)
    for frame, row in zip(everything, rows, strict=True):
        expected = describe_frame(frame)
        decoded = dict(zip(names, row, strict=True))
        assert decoded["opcode"] == str(int(Opcode[expected["kind"].upper()]))
        for name in FIELDS[1:]:
            want = expected[name] if name in expected else 0
            assert decoded[name] == str(want), (name, decoded, expected)
        for name in ("hop1", "hop2"):
            assert decoded[name] == expected.get(name, "0.0.0.0"), (name, decoded, expected)
        for name in ("expect", "hop1_expect", "hop2_expect"):
            assert int(decoded[name], 16) == expected.get(name, 0), (name, decoded, expected)
        if expected["kind"] == "stats_reply":
            assert [int(v) for v in decoded["counter"].split(",")] == list(expected["counters"].values())
            continue
        assert [int(v) for v in decoded["element"].split(",")] == expected["elements"]
        if expected["kind"] in ("result", "partial"):
            assert int(decoded["bitmap"], 16) == expected["bitmap"]
            assert int(decoded["contributors"]) == expected["contributors"]
            assert int(decoded["status"], 16) == int(expected["overflow"])
    assert sum(opcode_of(payload_of(frame)) == Opcode.RESULT for frame in everything) == len(answers) - 1
    partial = dict(zip(names, rows[-1], strict=True))
    assert (partial["hop1"], int(partial["expect"], 16), partial["hop2"], partial["status"]) == (
        "10.73.87.3", 0b111, "0.0.0.0", "0x00000000")
