"""Hostile files reported in issue 22: outputs that are devices, FIFOs or symlinks, inputs that never end,
captures that decode to nothing, profiles that plan as zero. Each bad input ends in one line naming the file
and exit status 2, within a deadline and without a file left behind; each good one is written where the user
pointed, without replacing the device, FIFO or symlink that is there."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from importlib import resources

import pytest

from inwire.cli.replay import capture_needs
from inwire.model import Aggregator, AggregatorConfig
from inwire.pcap import read_frames, write_frames
from schedules import write_schedule
from test_inputs import one_line_error

# ---------------------------------------------------------------------------------------------------
# Outputs: a device, a FIFO and /dev/stdout are written in place, a symlink is followed.

WRITERS = {
    "dissector -o": (["dissector", "-o", "{out}"], ".lua"),
    "verilog -o": (["verilog", "--slots", "2", "--elements", "16", "-o", "{out}"], ".v"),
    # A given --job: the default is random, and the outputs are compared byte for byte.
    "stream --target pcap:": (["stream", "--schedule", "{work}/schedule.json", "--target", "pcap:{out}",
                               "--rounds", "1", "--elements", "64", "--job", "7"], ".pcap"),
    "schedule --out": (["schedule", "--out", "{out}"], ".json"),
    "schedule --map": (["schedule", "--out", "{work}/plan.json", "--map", "{out}"], ".png"),
    "replay OUT.pcap": (["replay", "{work}/in.pcap", "{out}"], ".pcap"),
    "bench --out": (["bench", "--only", "", "--out", "{out}"], ".json"),
}
"""Every command that writes through inwire.output.atomic_output (train writes files inside a folder):
its arguments, OUT's extension (schedule --map picks the format by it)."""

SCRATCH = r"""
set -e
mount -t tmpfs tmpfs "$SCRATCH"
case "$KIND" in
    full) mknod "$OUT" c 1 7 ;;
    fifo) mkfifo "$OUT" ;;
    stdout) ln -s /proc/self/fd/1 "$OUT" ;;
    link) echo {} > "$SCRATCH/target$SUFFIX"; ln -s "target$SUFFIX" "$OUT" ;;
esac
if [ "$KIND" = fifo ]; then timeout 300 cat "$OUT" > "$RESULT/got" & reader=$!; fi
set +e
# stdout is a pipe, as in `inwire ... -o /dev/stdout | reader`.
{ (cd "$WORK" && "$@") 2> "$RESULT/stderr"; echo $? > "$RESULT/rc"; } | cat > "$RESULT/stdout"
# A FIFO replaced by a file leaves its reader waiting on the old one: it is stopped, not waited for.
if [ "$KIND" = fifo ]; then if [ -p "$OUT" ]; then wait $reader; else kill $reader; fi; fi
stat -c %F "$OUT" > "$RESULT/type"
ls -A "$SCRATCH" > "$RESULT/listing"
case "$KIND" in
    link) readlink "$OUT" > "$RESULT/readlink"; cp "$SCRATCH/target$SUFFIX" "$RESULT/got" ;;
    stdout) readlink "$OUT" > "$RESULT/readlink"; cp "$RESULT/stdout" "$RESULT/got" ;;
esac
"""
"""Runs the command (its arguments after the script's) in a private mount namespace, with OUT on a tmpfs of
its own, so that the device made there and the rename the command must not do stay there."""


def inwire(*argv):
    return [sys.executable, "-m", "inwire.cli", *argv]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working folder with the inputs the writers read; simulator builds go to its build/."""
    folder = tmp_path_factory.mktemp("work")
    write_schedule(folder / "schedule.json")
    subprocess.run(inwire("stream", "--schedule", "schedule.json", "--target", "pcap:in.pcap", "--rounds", "1",
                          "--elements", "64"), cwd=folder, check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def reference(work):
    """What each writer writes to a regular file."""
    made = {}

    def written(name):
        if name not in made:
            argv, suffix = WRITERS[name]
            out = work / f"reference-{len(made)}{suffix}"
            subprocess.run(inwire(*(part.format(out=out, work=work) for part in argv)), cwd=work, check=True,
                           capture_output=True)
            made[name] = out.read_bytes()
        return made[name]
    return written


def pcap_frames(data):
    """The frames of the classic pcap that starts somewhere in `data` (other output may follow it when it went
    to stdout), up to the first record that does not fit; None when `data` holds no pcap."""
    at = data.find(b"\xd4\xc3\xb2\xa1")
    if at < 0:
        return None
    at, frames = at + 24, []
    while at + 16 <= len(data) and at + 16 + struct.unpack_from("<I", data, at + 8)[0] <= len(data):
        length = struct.unpack_from("<I", data, at + 8)[0]
        frames.append(data[at + 16:at + 16 + length])
        at += 16 + length
    return frames


def holds_output(got, reference, suffix, kind):
    """Whether `got` is the writer's output: a capture's frames (their timestamps differ between runs), other
    outputs byte for byte; through /dev/stdout it comes with what the command prints."""
    if suffix == ".pcap":
        expected = pcap_frames(reference)
        found = pcap_frames(got)
        return found is not None and (found[:len(expected)] if kind == "stdout" else found) == expected
    return reference in got if kind == "stdout" else got == reference


@pytest.mark.parametrize("kind", ["full", "fifo", "stdout", "link"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_outputs_go_into_devices_fifos_and_symlink_targets(tmp_path, work, reference, writer, kind):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1): the devices are made in a private mount namespace")
    argv, suffix = WRITERS[writer]
    scratch, result = tmp_path / "scratch", tmp_path / "result"
    scratch.mkdir()
    result.mkdir()
    out = scratch / f"out{suffix}"
    command = inwire(*(part.format(out=out, work=work) for part in argv))
    environment = {**os.environ, "SCRATCH": str(scratch), "OUT": str(out), "KIND": kind, "SUFFIX": suffix,
                   "RESULT": str(result), "WORK": str(work)}
    # A session of its own: a command that hangs (reading its FIFO, or its stdout, as bench did) is ended
    # together with the shell and the reader around it.
    namespace = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRATCH, "sh",
                                  *command], env=environment, start_new_session=True)
    try:
        assert namespace.wait(timeout=300) == 0
    except subprocess.TimeoutExpired:
        os.killpg(namespace.pid, signal.SIGKILL)
        namespace.wait()
        pytest.fail(f"{writer} to a {kind}: no end within 300 s")
    rc, err = int((result / "rc").read_text()), (result / "stderr").read_text()
    kept = (result / "type").read_text().strip()
    if kind == "full":
        # One line of error, after the progress lines of a replay.
        assert rc == 2 and "Traceback" not in err, err
        assert err.splitlines()[-1] == f"inwire {argv[0]}: cannot write {out}: No space left on device", err
        assert kept == "character special file"
        return
    assert rc == 0, err
    got = (result / "got").read_bytes()
    assert holds_output(got, reference(writer), suffix, kind), f"{writer} to a {kind}: {got[:200]!r}"
    if kind == "fifo":
        assert kept == "fifo"
    else:
        assert kept == "symbolic link"
        assert (result / "readlink").read_text().strip() == ("/proc/self/fd/1" if kind == "stdout"
                                                             else f"target{suffix}")
    # Nothing beside: no temporary file left, no file put where the device or link was.
    expected = {out.name} | ({f"target{suffix}"} if kind == "link" else set())
    assert set((result / "listing").read_text().split()) == expected


# ---------------------------------------------------------------------------------------------------
# Inputs: one line, exit 2, nothing written.

def topology_with_aggregator(aggregator):
    """doublezero9 with `aggregator` as its first city's profile."""
    topology = json.loads(resources.files("inwire").joinpath("data", "doublezero9.json").read_text())
    topology["cities"][0]["aggregator"] = aggregator
    return topology


def make_inputs(tmp):
    """The files the rows below name, in `tmp`."""
    schedule = json.loads(write_schedule(tmp / "schedule.json").read_text())
    (tmp / "zero-topology.json").write_text(json.dumps({**schedule, "topology": "/dev/zero"}))
    (tmp / "report.json").symlink_to("/dev/zero")
    os.mkfifo(tmp / "fifo.json")
    with open(tmp / "huge.json", "wb") as handle:
        handle.truncate(100 * 2**20)
    for name, aggregator in (("ports", {"ports": 0.5, "port_gbps": 10}),
                             ("width", {"data_width": 0.5, "core_mhz": 250})):
        (tmp / f"half-{name}.json").write_text(json.dumps(topology_with_aggregator(aggregator)))
    (tmp / "half-width-report.json").write_text(json.dumps(
        {"board": "versa_ecp5", "core_clock_mhz": 31.25, "data_width": 0.5, "timing_met": True}))
    (tmp / "half-ports-report.json").write_text(json.dumps(
        {"core_clock_mhz": 31.25, "data_width": 8, "ports": 0.5, "port_gbps": 1.0}))


UDP = ["--target", "udp://127.0.0.1:9"]


@pytest.mark.parametrize("argv, message", [
    (["stream", *UDP, "--schedule", "/dev/zero"],
     "/dev/zero: a character device, not a regular file (the schedule is read from a JSON file)"),
    (["stream", *UDP, "--schedule", "/dev/urandom"], "/dev/urandom: a character device, not a regular file"),
    (["stream", *UDP, "--schedule", "{tmp}/zero-topology.json"],
     "zero-topology.json: 'topology' '/dev/zero' is neither a built-in topology (doublezero9, doublezero-public) "
     "nor a topology file ending in .json"),
    (["stream", *UDP, "--schedule", "{tmp}/fifo.json"], "fifo.json: a FIFO, not a regular file (the schedule"),
    (["stream", "--target", "udp:/dev/zero", "--schedule", "{tmp}/schedule.json"],
     "/dev/zero: a character device, not a regular file (the aggregator map"),
    (["stream", *UDP, "--schedule", "{tmp}/huge.json"],
     "huge.json: 104,857,600 bytes, over the 64 MiB cap on a JSON input (the schedule)"),
    (["schedule", "--topology", "/dev/zero"], "/dev/zero: a character device, not a regular file (the topology"),
    (["schedule", "--aggregator", "{tmp}/report.json"],
     "report.json: a character device, not a regular file (the build report"),
    (["schedule", "--topology", "{tmp}/fifo.json"], "fifo.json: a FIFO, not a regular file (the topology"),
    (["schedule", "--topology", "{tmp}/half-ports.json"], "cities[0] (SIN): needs a whole number of 'ports', got 0.5"),
    (["schedule", "--topology", "{tmp}/half-width.json"],
     "cities[0] (SIN): needs a whole number of 'data_width', got 0.5"),
    (["schedule", "--aggregator", "{tmp}/half-width-report.json"], "needs a whole number of 'data_width', got 0.5"),
    (["schedule", "--aggregator", "{tmp}/half-ports-report.json"], "needs a whole number of 'ports', got 0.5"),
])
def test_json_inputs_are_regular_files_of_bounded_size_and_sound_profiles(tmp_path, capsys, deadline, argv,
                                                                          message):
    make_inputs(tmp_path)
    out = ["--out", str(tmp_path / "plan.json")] if argv[0] == "schedule" else []
    one_line_error(capsys, [*(part.format(tmp=tmp_path) for part in argv), *out], message)
    assert not (tmp_path / "plan.json").exists()


# ---------------------------------------------------------------------------------------------------
# Captures that decoded to nothing, or replayed as something else than the model sees.

def block(kind, body):
    body += bytes(-len(body) % 4)
    return struct.pack("<II", kind, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


SECTION = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
FRAME = bytes(range(60))


def interface(linktype=1):
    return block(1, struct.pack("<HHI", linktype, 0, 0))


def enhanced(index):
    return block(6, struct.pack("<5I", index, 0, 0, len(FRAME), len(FRAME)) + FRAME)


SIMPLE = block(3, struct.pack("<I", len(FRAME)) + FRAME)


@pytest.mark.parametrize("capture, message", [
    (SECTION + enhanced(0),
     "block 1 (an enhanced packet block at offset 28) names interface 0, but its section describes no interface "
     "before it"),
    (SECTION + interface() + enhanced(99),
     "block 2 (an enhanced packet block at offset 48) names interface 99, but its section describes only "
     "interface 0 before it"),
    (SECTION + SIMPLE, "block 1 (a simple packet block at offset 28) names interface 0, but its section describes "
                       "no interface"),
    (SECTION + interface() + enhanced(0) + SECTION + enhanced(0),
     "block 4 (an enhanced packet block at offset 168) names interface 0, but its section describes no interface"),
    (SECTION + interface() + interface(101) + enhanced(1),
     "block 2 (an interface description block at offset 48): link type 101 is not Ethernet"),
    (SECTION + interface() + block(6, bytes(8)),
     "block 2 (an enhanced packet block at offset 48) has 8 bytes, fewer than the 20 of its fields"),
], ids=["no interface", "interface 99", "simple packet, no interface", "second section without interface",
        "not Ethernet", "short packet block"])
def test_pcapng_blocks_that_name_no_ethernet_interface_are_refused(tmp_path, capsys, capture, message):
    path = tmp_path / "odd.pcapng"
    path.write_bytes(capture)
    one_line_error(capsys, ["decode", str(path)], f"{path}: {message}")


def test_replay_refuses_empty_records_which_the_gateware_cannot_be_given(tmp_path, capsys):
    """The model counts an empty record as drop_runt, but AXI-Stream has no frame without a byte: replayed, it
    vanished and every counter of the gateware stayed 0. A runt of 1 to 13 bytes goes in and is counted as
    drop_runt by both (tests/test_gateware_sim.py replays one)."""
    capture, out = tmp_path / "empty.pcap", tmp_path / "out.pcap"
    write_frames(capture, [bytes(60)] * 2 + [b""] * 1000)
    one_line_error(capsys, ["replay", str(capture), str(out)],
                   f"{capture}: record 2 is empty (1000 of its 1002 records are)")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# The training study: its files whole or none.

def test_train_refuses_a_step_time_the_clock_cannot_hold_before_training(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "train"
    one_line_error(capsys, ["train", "--step-ms", "1e308", "--steps", "20", "--strategies", "none,global",
                            "--out-dir", str(out)],
                   "--step-ms must list compute times of 0 to 86,400,000 ms (a day) per local step, got '1e308'")
    one_line_error(capsys, ["train", "--device-tflops", "1e-300", "--model-mb", "1", "--steps", "20",
                            "--strategies", "none,global", "--out-dir", str(out)],
                   "--device-tflops 1e-300 makes a local step of")
    assert not out.exists()


def test_a_study_whose_plot_fails_leaves_none_of_its_files(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from inwire.train import training

    def unplottable(cell, target, path):
        raise ValueError("Axis limits cannot be NaN or Inf")

    monkeypatch.setattr(training, "plot_cell", unplottable)
    monkeypatch.setattr(training, "format_study", lambda study: "table\n")
    monkeypatch.setattr(training, "study_json", lambda study: "{}")
    monkeypatch.setattr(training, "cell_file_name", lambda cell: "cell.png")
    with pytest.raises(ValueError, match="Axis limits"):
        training.write_study({"cells": [{}], "target": 0.85}, tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# Icarus and the lanes the gateware leaves undefined.

@pytest.mark.sim
def test_replay_on_icarus_reads_lanes_without_tkeep_as_absent(tmp_path):
    """`inwire stream --target pcap:big.pcap --rounds 2 --elements 65536` on the tour's schedule, then
    `inwire replay --sim icarus big.pcap out.pcap`: 4,608 frames, which failed after 90 s of the 4.5 min the
    whole replay takes here. The gateware has 48 slots (the capture's, not a power of two), so the last
    slot's upper bank ends at the end of the sum memory; a result read from it ends in a partial beat, and
    the lanes past its tkeep come from beyond the memory: X on Icarus, which cocotbext-axi's sink cannot turn
    into an integer. --elements 4096 is the smallest of these captures that reaches it (288 frames): slot 47
    takes chunk 7 of the last clique in round 1 into its lower bank and chunk 15 into its upper bank."""
    if shutil.which("iverilog") is None:
        pytest.fail("iverilog is not on PATH (run `make setup`)")
    for argv in (["schedule", "--out", "schedule.json", "--no-host-tree", "--no-reduce-in-path"],
                 ["stream", "--schedule", "schedule.json", "--target", "pcap:big.pcap", "--rounds", "2",
                  "--elements", "4096"]):
        subprocess.run(inwire(*argv), cwd=tmp_path, check=True, capture_output=True)
    frames = read_frames(tmp_path / "big.pcap")
    slots, elements, *_ = capture_needs(frames)
    assert len(frames) == 288 and slots == 48
    result = subprocess.run(inwire("replay", "--sim", "icarus", "big.pcap", "out.pcap"), cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    model = Aggregator(AggregatorConfig(slots=slots, max_elements=max(elements, AggregatorConfig().max_elements)))
    assert read_frames(tmp_path / "out.pcap") == [out for frame in frames for out in model.process(frame)]
    assert json.loads(result.stdout) == model.stats()
