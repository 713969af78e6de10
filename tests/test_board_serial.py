"""`inwire job board`: a Versa's job tables written over its serial device, here one end of a pty pair whose
other end reads what a board's UART would receive."""

import json
import os
import select
import termios
import threading

import pytest

from inwire import control
from inwire.cli import main
from inwire.cli.job import read_job_file
from inwire_hdl.board_control import BOARD_CONFIG, board_writes
from inwire_hdl.job_table import RECORD_BYTES, RECORD_CHECK, RECORD_PREAMBLE, RECORD_SYNC, ControlMap

MAP = ControlMap(BOARD_CONFIG.limits.jobs, BOARD_CONFIG.limits.members)


def decode(data):
    """The writes in a byte stream of control records, checked the way the board checks them."""
    assert data.startswith(RECORD_PREAMBLE)
    data = data[len(RECORD_PREAMBLE):]
    assert len(data) % RECORD_BYTES == 0
    writes = []
    for start in range(0, len(data), RECORD_BYTES):
        record = data[start:start + RECORD_BYTES]
        assert record[0] == RECORD_SYNC and record[-1] == RECORD_CHECK.compute(record[1:-1]), record.hex()
        writes.append((int.from_bytes(record[1:3], "big"), int.from_bytes(record[3:7], "big")))
    return writes


@pytest.fixture
def pty_pair():
    """(the tool's end of the pair, its path, `received()`: every byte that reached the board's end)."""
    board, device = os.openpty()
    read, stop = bytearray(), threading.Event()

    def reader():
        while True:
            ready, _, _ = select.select([board], [], [], 0.05)
            if ready:
                read.extend(os.read(board, 4096))
            elif stop.is_set():
                return

    def received():
        # What the tool wrote is in the pty before it returns: the reader stops once the board's end is empty.
        stop.set()
        thread.join()
        return bytes(read)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        yield device, os.ttyname(device), received
    finally:
        received()
        os.close(board)
        os.close(device)


def job_file(tmp_path, name, members, slots, group="239.1.2.3"):
    entry = control.new_job(members, slots=slots, group=int.from_bytes(bytes(map(int, group.split("."))), "big")
                            if group else 0)
    path = tmp_path / name
    path.write_text(json.dumps(control.entry_to_json(entry)))
    return path


def test_the_board_end_receives_the_writes_that_place_the_jobs(pty_pair, tmp_path, capsys):
    device, path, received = pty_pair
    # Port 10 puts a 0x0a byte into a record: a tty left translating output would send 0x0d 0x0a.
    files = [job_file(tmp_path, "a.json", ["10.0.0.1:10", "10.0.0.2:5000"], 4),
             job_file(tmp_path, "b.json", ["10.0.0.3:5001"], 6)]
    assert main(["job", "board", "--device", path, *map(str, files)]) == 0
    read = received()
    expected, placed = board_writes([read_job_file(file) for file in files])
    assert [index for _, index, _, _ in placed] == [0, 1]
    assert decode(read) == expected
    assert b"\n" in read
    iflag, oflag, cflag, lflag, ispeed, ospeed, _ = termios.tcgetattr(device)
    assert ispeed == ospeed == termios.B115200
    assert cflag & termios.CSIZE == termios.CS8 and not cflag & (termios.PARENB | termios.CSTOPB | termios.CRTSCTS)
    assert not oflag & termios.OPOST and not lflag & (termios.ICANON | termios.ECHO) and not iflag & termios.IXON
    out = capsys.readouterr().out
    assert "entry 0 of the board's tables: its slots are 0 to 3" in out
    assert "entry 1 of the board's tables: its slots are 4 to 9" in out


def test_no_jobs_empty_the_tables(pty_pair):
    _, path, received = pty_pair
    assert main(["job", "board", "--device", path]) == 0
    emptied = [(MAP.word(index, "valid"), 0) for index in range(MAP.jobs)]
    emptied += [(MAP.clear_address, slot) for slot in range(BOARD_CONFIG.slots)]
    assert decode(received()) == emptied


def test_a_job_the_tables_cannot_hold_sends_nothing(pty_pair, tmp_path, capsys):
    _, path, received = pty_pair
    good = job_file(tmp_path, "good.json", ["10.0.0.1:5000"], 4)
    unicast = job_file(tmp_path, "unicast.json", ["10.0.0.1:5000"], 4, group=None)
    assert main(["job", "board", "--device", path, str(good), str(unicast)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inwire job: job ") and "without a group" in err and len(err.splitlines()) == 1
    assert received() == b""


def test_a_job_given_twice_sends_nothing(pty_pair, tmp_path, capsys):
    _, path, received = pty_pair
    job = str(job_file(tmp_path, "job.json", ["10.0.0.1:5000"], 4))
    assert main(["job", "board", "--device", path, job, job]) == 2
    entry = read_job_file(job)
    assert capsys.readouterr().err == (f"inwire job: job {entry.job} is given twice: the board's tables hold a job "
                                       f"once\n")
    assert received() == b""


def test_a_device_that_is_no_serial_port_is_refused_in_one_line(tmp_path, capsys):
    job = str(job_file(tmp_path, "job.json", ["10.0.0.1:5000"], 4))
    assert main(["job", "board", "--device", str(tmp_path / "ttyUSB9"), job]) == 2
    assert capsys.readouterr().err == f"inwire job: {tmp_path / 'ttyUSB9'}: No such file or directory\n"
    assert main(["job", "board", "--device", os.devnull, job]) == 2
    assert capsys.readouterr().err == f"inwire job: --device {os.devnull}: not a serial device (not a terminal)\n"
    regular = tmp_path / "regular"
    regular.write_bytes(b"kept")
    assert main(["job", "board", "--device", str(regular), job]) == 2
    assert capsys.readouterr().err == (f"inwire job: --device {regular}: not a serial device (a character device "
                                       f"such as /dev/ttyUSB1)\n")
    assert regular.read_bytes() == b"kept"
