"""Bad or oversized input is refused before any work with one line naming the option (exit 2), and leaves
no output file behind; every option's help shows its default."""

import argparse
import json
import pathlib
from importlib import resources

import pytest

from inwire.cli import COMMANDS, build_parser, main
from inwire.decode import describe_frame
from inwire.pcap import read_frames
from schedules import write_schedule


@pytest.fixture
def schedule(tmp_path):
    return write_schedule(tmp_path / "schedule.json")


def one_line_error(capsys, argv, message):
    """Runs `inwire argv`; it must exit 2 with exactly one line on stderr, holding `message`."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["verilog", "--slots", "65536", "--elements", "65535"], "--elements must lie in [1, 2048]"),
    (["verilog", "--slots", "256", "--elements", "65535"], "--elements must lie in [1, 2048]"),
    (["verilog", "--slots", "256", "--elements", "2048"], "--slots 256 x --elements 2048 = 524,288 sum words"),
    (["verilog", "--slots", "0"], "--slots must lie in [1, 65536]"),
    (["verilog", "--max-fanin", "0"], "--max-fanin must lie in [1, 64]"),
])
def test_gateware_sizes_are_bounded_before_generation(tmp_path, capsys, argv, message):
    output = tmp_path / "core.v"
    one_line_error(capsys, [*argv, "-o", str(output)], message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--elements", "8589934592"], "--elements must be at most 67,108,864"),
    (["--elements", "2000000", "--target", "sim:icarus"], "more than the 131,072 a sim: target runs"),
    (["--elements", "2000000", "--rounds", "40", "--target", "pcap:{tmp}/big.pcap"],
     "more than the 1,048,576 a pcap: target runs"),
    (["--window", "100000"], "more than the 65,536 the slot field numbers"),
    (["--target", "udp://[::1]:5000"], "IPv4 only"),
    (["--target", "iface:nosuchif0"], "no network interface named 'nosuchif0'"),
    (["--target", "pcap:{tmp}/no/such/folder/x.pcap"], "folder"),
])
def test_stream_input_is_bounded_up_front(tmp_path, schedule, capsys, argv, message):
    argv = [part.format(tmp=tmp_path) for part in argv]
    target = [] if "--target" in argv else ["--target", "udp://127.0.0.1:9"]
    one_line_error(capsys, ["stream", "--schedule", str(schedule), *target, *argv], message)
    assert not (tmp_path / "big.pcap").exists()


@pytest.mark.parametrize("argv, message", [
    (["build", "--core-mhz", "0"], "--core-mhz must be a positive number of MHz, got 0.0"),
    (["build", "--core-mhz", "nan"], "--core-mhz must be a positive number of MHz, got nan"),
    (["serve", "--multicast-iface", "eth1"], "--multicast-iface 'eth1' is not an IPv4 address"),
    (["serve", "--listen", "[::1]:0"], "IPv4 only"),
    (["serve", "--max-elements", "65535"], "--max-elements must lie in [1, 2048]"),
    (["serve", "--slots", "0"], "--slots must lie in [1, 65536]"),
])
def test_command_options_are_bounded_up_front(capsys, argv, message):
    one_line_error(capsys, argv, message)


def test_formal_refuses_a_check_it_does_not_have(capsys):
    from inwire_hdl.formal import CHECKS

    err = one_line_error(capsys, ["formal", "--only", "nosuchcheck"], "no check named 'nosuchcheck'")
    assert all(check.name in err for check in CHECKS)
    job = CHECKS[0]
    other = next(width for width in (8, 64) if width != job.width)
    one_line_error(capsys, ["formal", "--only", job.job, "--width", str(other)], f"has no check at --width {other}")


def test_train_refuses_nan_before_training(capsys):
    pytest.importorskip("torch")
    one_line_error(capsys, ["train", "--model-mb", "nan"], "--model-mb must list finite numbers")


def test_a_file_that_is_not_utf8_is_named(tmp_path, capsys):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"topology": "Z\xfcrich"}')
    err = one_line_error(capsys, ["stream", "--target", "udp://127.0.0.1:9", "--schedule", str(latin)],
                         "not a UTF-8 text file")
    assert str(latin) in err


@pytest.fixture
def capture(tmp_path, schedule, capsys):
    path = tmp_path / "round.pcap"
    assert main(["stream", "--target", f"pcap:{path}", "--schedule", str(schedule), "--rounds", "2",
                 "--elements", "2048"]) == 0
    capsys.readouterr()
    return path


@pytest.mark.parametrize("command", ["decode", "replay"])
def test_a_truncated_capture_exits_2(tmp_path, capture, capsys, command):
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(capture.read_bytes()[:-100])
    argv = [command, str(cut)] + ([str(tmp_path / "out.pcap")] if command == "replay" else [])
    one_line_error(capsys, argv, "capture is truncated")
    assert not (tmp_path / "out.pcap").exists()


def test_replay_refuses_fewer_slots_than_the_capture_uses(tmp_path, capture, capsys):
    frames = [describe_frame(frame) for frame in read_frames(capture)]
    needed = max(frame["slot"] for frame in frames if frame["kind"] == "contribution") + 1
    assert needed > 16
    one_line_error(capsys, ["replay", "--slots", "16", str(capture), str(tmp_path / "out.pcap")],
                   f"needs --slots {needed} or more (its frames use slots up to {needed - 1}")


@pytest.mark.parametrize("map_name, message", [
    ("no/such/folder/map.png", "--map"),
    ("map.txt", "name a picture file ending in one of"),
])
def test_schedule_writes_nothing_when_map_fails(tmp_path, capsys, map_name, message):
    out = tmp_path / "schedule.json"
    one_line_error(capsys, ["schedule", "--out", str(out), "--map", str(tmp_path / map_name)], message)
    assert not out.exists()


def test_schedule_header_says_multicast_off_where_no_city_multicasts(tmp_path, capsys):
    topology = json.loads(resources.files("inwire").joinpath("data", "doublezero9.json").read_text())
    for city in topology["cities"]:
        city["multicast"] = False
    path = tmp_path / "nomulticast.json"
    path.write_text(json.dumps(topology))
    assert main(["schedule", "--topology", str(path), "--out", str(tmp_path / "s.json")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "multicast off" in header


def subcommand_parsers():
    for name in COMMANDS:
        parser = build_parser([name])
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        yield name, commands.choices[name]


@pytest.mark.parametrize("name, parser", list(subcommand_parsers()))
def test_every_option_has_help_and_shows_its_default(name, parser):
    assert parser.description and parser.description != COMMANDS[name][1]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"inwire {name} {action.option_strings or action.dest} has no help"
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            shown = " ".join(parser._get_formatter()._get_help_string(action).split())
            assert "default" in shown, f"inwire {name} {action.option_strings} does not show its default"
    assert "Traceback" not in text


def test_the_targets_table_of_docs_host_is_one_table():
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "host.md").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| `udp://HOST:PORT` |"))
    end = next(i for i in range(at, len(lines)) if not lines[i].startswith("|"))
    assert any(line.startswith("| `iface:NAME` |") for line in lines[at:end])


def shown_options(parser):
    return {name for action in parser._actions if action.help != argparse.SUPPRESS for name in action.option_strings}


def test_an_output_is_out_for_a_file_and_out_dir_for_a_folder():
    shown = {name: shown_options(parser) for name, parser in subcommand_parsers()}
    assert [name for name, options in shown.items() if {"-o", "--output"} & options] == []
    for name in ("verilog", "dissector", "bench", "schedule"):
        assert "--out" in shown[name], name
    for name in ("alveo", "build", "run", "train"):
        assert "--out-dir" in shown[name] and "--out" not in shown[name], name
    # One name per quantity: a plan takes one value, --sweep a list (as inwire train's options).
    assert not {"--sizes-mb", "--steps-ms", "--profiles"} & shown["schedule"]


@pytest.mark.parametrize("argv, dest, value", [
    (["verilog", "-o", "core.v"], "out", "core.v"),
    (["verilog", "--output", "core.v"], "out", "core.v"),
    (["dissector", "-o", "inwire.lua"], "out", "inwire.lua"),
    (["alveo", "--out", "cards"], "out_dir", pathlib.Path("cards")),
    (["build", "--out", "board"], "out_dir", pathlib.Path("board")),
    (["schedule", "--sweep", "--sizes-mb", "1,2"], "model_mb", "1,2"),
    (["schedule", "--sweep", "--steps-ms", "0,5"], "step_ms", "0,5"),
    (["schedule", "--sweep", "--profiles", "ideal,port10g"], "aggregator", "ideal,port10g"),
])
def test_earlier_spellings_of_options_still_work(argv, dest, value):
    assert getattr(build_parser(argv).parse_args(argv), dest) == value


def test_simulated_gateware_has_one_default_width():
    """replay, stream sim:, serve --sim and run build the same core width, so a tour builds each
    configuration once."""
    from inwire.simulators import SIM_DEFAULT_WIDTH, parse_simulator

    replay = build_parser(["replay"]).parse_args(["replay", "in.pcap", "out.pcap"])
    assert replay.width == parse_simulator("verilator")[1] == SIM_DEFAULT_WIDTH
