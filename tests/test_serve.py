"""The software aggregator service: the golden model behind UDP, never dying on bad input."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import services
from inwire.cli import main
from inwire.datagram import (
    PAYLOAD_OFFSET,
    parse_payload_header,
    parse_result,
    parse_stats_reply,
    payload_of,
    stats_request,
    wrap,
)
from inwire.packets import build_frames, parse_header
from inwire.protocol import FRAME_HEADER_BYTES, FRAME_OFFSETS, Opcode
from inwire.serve import SoftwareAggregator, parse_counters_line

GROUP = 0xEF490001


def contribution(sender, values, fanin=2, slot=0, job=7):
    frame = build_frames(np.asarray(values, dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=sender, fanin=fanin,
                         job=job, round=1, clique=0, slot=slot, chunk=0, group=GROUP)
    return payload_of(frame[0])


def result_elements(payload):
    result = parse_result(payload)
    return result.header, result.elements.tolist()


@pytest.fixture
def server():
    servers = []

    def make(host="127.0.0.1", **options):
        instance = SoftwareAggregator((host, 0), log=lambda line: None, **options)
        servers.append(instance)
        return instance
    yield make
    for instance in servers:
        instance.close()


def test_wrapped_datagram_has_a_valid_ipv4_header():
    frame = wrap(b"x" * 100, ("10.0.0.2", 1234), ("10.0.0.1", 18775), bytes(6))
    header = parse_header(frame + bytes(FRAME_HEADER_BYTES))
    assert header["ip_len"] == 128 and header["udp_len"] == 108 and header["udp_sport"] == 1234
    from inwire.packets import ipv4_header_valid
    assert ipv4_header_valid(frame)


def test_multicast_result_goes_to_the_group(server):
    aggregator = server()
    assert aggregator.handle(contribution(0, [1, 2, 3]), ("127.0.0.1", 5000)) == []
    sends = aggregator.handle(contribution(1, [10, -20, 30]), ("127.0.0.1", 5001))
    assert len(sends) == 1
    payload, destination = sends[0]
    assert destination == ("239.73.0.1", aggregator.address[1])
    header, elements = result_elements(payload)
    assert header["opcode"] == Opcode.RESULT and elements == [11, -18, 33] and header["bitmap"] == 3


def test_unicast_fallback_sends_each_member_a_copy_and_answers_a_retransmission_alone(server):
    aggregator = server(unicast=True)
    peers = [("127.0.0.1", 5000), ("127.0.0.2", 5001)]
    aggregator.handle(contribution(0, [5]), peers[0])
    sends = aggregator.handle(contribution(1, [6]), peers[1])
    assert sorted(destination for _, destination in sends) == peers
    assert all(result_elements(payload)[1] == [11] for payload, _ in sends)
    again = aggregator.handle(contribution(0, [5]), peers[0])
    assert [destination for _, destination in again] == [peers[0]]
    assert result_elements(again[0][0])[1] == [11]
    assert aggregator.counters()["answered"] == 1


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"IW\x01", os.urandom(300), b"\x49\x57\x01\x01" + bytes(82),
                                     contribution(0, [1])[:-1], contribution(5, [1])])
def test_malformed_datagrams_are_counted_and_dropped(server, garbage):
    aggregator = server()
    assert aggregator.handle(garbage, ("127.0.0.1", 9)) == []
    counters = aggregator.counters()
    assert counters["frames_in"] == 1
    assert sum(value for name, value in counters.items() if name.startswith("drop_")) == 1
    aggregator.handle(contribution(0, [1]), ("127.0.0.1", 9))
    assert aggregator.counters()["accumulated"] == 1


def test_stats_request_over_the_socket(server):
    aggregator = server()
    thread = threading.Thread(target=aggregator.serve, daemon=True)
    thread.start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(5)
        client.sendto(b"junk", aggregator.address)
        client.sendto(stats_request(), aggregator.address)
        counters = parse_stats_reply(client.recv(65535))
    aggregator.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert counters["frames_in"] == 1 and counters["drop_runt"] == 1


def _start_service(*extra):
    process = subprocess.Popen([sys.executable, "-m", "inwire", "serve", "--listen", "127.0.0.1:0", "--unregistered",
                                *extra],
                               stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()
    assert "listening on udp://127.0.0.1:" in line, line
    port = int(line.split("udp://127.0.0.1:")[1].split(",")[0])
    return process, port


def test_the_counters_line_separates_retransmission_drops_and_reads_back_as_numbers(server):
    """serve's counters line: `drops` counts the drops that mean trouble (a runt here), a copy of a summed
    member goes to `retransmission_drops`, and `parse_counters_line` gives every counter back as a number."""
    aggregator = server(unicast=True)
    peer = ("127.0.0.1", 5000)
    for payload in (b"garbage", contribution(0, [1, 2]), contribution(0, [1, 2])):
        aggregator.handle(payload, peer)
    counters = parse_counters_line(aggregator.counters_line())
    assert {name: counters[name] for name in ("frames_in", "drops", "retransmission_drops", "drop_runt",
                                              "drop_duplicate", "accumulated")} == {
        "frames_in": 3, "drops": 1, "retransmission_drops": 1, "drop_runt": 1, "drop_duplicate": 1,
        "accumulated": 1}


def test_demo_json_holds_the_final_counters_as_numbers(monkeypatch, tmp_path, capsys):
    """`inwire demo --json`: `aggregator_final` is the service's final counters as numbers, not its log line
    (the lab itself, which needs root, replaced by its outcome)."""
    from inwire.cli import demo
    from schedules import write_schedule

    final = "inwire serve: stopped; final counters frames_in=90 drops=0 retransmission_drops=4 accumulated=86"
    monkeypatch.setattr(demo, "unavailable_reason", lambda: None)
    monkeypatch.setattr(demo, "run_lab", lambda plan, config, scale, progress: ({"bit_exact": True}, final))
    assert main(["demo", "--json", "--schedule", str(write_schedule(tmp_path / "schedule.json"))]) == 0
    assert json.loads(capsys.readouterr().out)["aggregator_final"] == {
        "frames_in": 90, "drops": 0, "retransmission_drops": 4, "accumulated": 86}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_service_stops_cleanly_with_a_final_counters_line(signum):
    process, port = _start_service("--stats-interval", "0.1", "--unicast")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(5)
            for payload in (b"garbage", contribution(0, [1, 2]), contribution(1, [3, 4])):
                client.sendto(payload, ("127.0.0.1", port))
            _, elements = result_elements(client.recv(65535))
            assert elements == [4, 6]
        assert "counters frames_in=" in process.stderr.readline()
        process.send_signal(signum)
        rest = process.communicate(timeout=10)[1]
    finally:
        process.kill()
    assert process.returncode == 0
    final = rest.strip().splitlines()[-1]
    assert final.startswith("inwire serve: stopped; final counters frames_in=3 drops=1")
    assert "Traceback" not in rest


def test_port_in_use_is_one_line_and_exit_2(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert main(["serve", "--listen", f"127.0.0.1:{port}"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Address already in use" in error


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", "no.such.host.invalid:5"])
def test_bad_listen_address_is_one_line_and_exit_2(capsys, listen):
    assert main(["serve", "--listen", listen]) == 2
    assert capsys.readouterr().err.startswith("inwire serve: --listen")


def tree_contribution(sender, values, hop1, expect, fanin=3, slot=0, job=7):
    frame = build_frames(np.asarray(values, dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=sender, fanin=fanin,
                         job=job, round=1, clique=0, slot=slot, chunk=0, group=GROUP, bitmap=1 << sender,
                         expect=expect, hop1=hop1)
    return payload_of(frame[0])


@pytest.mark.parametrize("engine", ["golden", "fast"])
def test_a_partial_goes_up_and_the_result_comes_back_down_to_every_member(server, engine):
    """Members 0 and 1 send to a child serve whose level is {0, 1}; member 2 sends to the root."""
    child = server("127.0.0.2", unicast=True, engine=engine)
    root = server("127.0.0.3", unicast=True, engine=engine)
    root_ip = int.from_bytes(socket.inet_aton(root.address[0]), "big")
    peers = [("127.0.0.1", 5000), ("127.0.0.1", 5001), ("127.0.0.1", 5002)]
    assert child.handle(tree_contribution(0, [1, 2], root_ip, 0b011), peers[0]) == []
    (partial, to), = child.handle(tree_contribution(1, [10, 20], root_ip, 0b011), peers[1])
    # The partial goes to hop1 at the service's own port (every aggregator of a tree listens on one port).
    assert to == (root.address[0], child.address[1]) and partial[3] == Opcode.PARTIAL
    assert child.counters()["partials_emitted"] == 1
    assert root.handle(tree_contribution(2, [100, 200], 0, 0), peers[2]) == []
    copies = root.handle(partial, child.address)
    # The root knows member 2 and the child that sent the partial, not members 0 and 1.
    assert sorted(to for _, to in copies) == sorted([peers[2], child.address])
    result = copies[0][0]
    assert result_elements(result)[1] == [111, 222] and parse_result(result).header["bitmap"] == 0b111
    # The child relays the result from its parent to the members it learned, and only from its parent.
    relayed = child.handle(result, (root.address[0], child.address[1]))
    assert sorted(to for _, to in relayed) == peers[:2] and all(body == result for body, _ in relayed)
    assert child.counters()["results_relayed"] == 2
    assert child.handle(result, ("127.0.0.9", child.address[1])) == []
    assert child.counters()["drop_opcode"] == 1


def test_slot_key_of_an_aggregator_without_a_slot_table_says_so():
    """A golden engine that decides as the model does but keeps no slot table (a co-simulation) cannot tell a
    slot's owner: a one-line ServeError naming it, not an AttributeError from inside the service."""
    from inwire.model import Aggregator
    from inwire.serve import ServeError

    class Decides:
        def __init__(self, config):
            self.config, self.model = config, Aggregator(config)

        def process(self, frame, now=None):
            return self.model.process(frame, now)

        def stats(self):
            return self.model.stats()

    server = SoftwareAggregator(("127.0.0.1", 0), make_aggregator=Decides)
    try:
        with pytest.raises(ServeError, match="Decides does not tell who owns its slots"):
            server.slot_key(0)
    finally:
        server.close()


@pytest.mark.parametrize("engine", ["golden", "fast"])
def test_relayed_copies_go_only_to_the_members_the_result_names(server, engine):
    """Copies of a result go to the learned members whose bits its bitmap holds: a result from the parent
    naming member 0 alone reaches member 0 and not member 1, though the child learned both."""
    child = server("127.0.0.2", unicast=True, engine=engine)
    # The fast engine makes its copies in the compiled kernel (_fastpath.c).
    parent_ip = int.from_bytes(socket.inet_aton("127.0.0.3"), "big")
    peers = [("127.0.0.1", 5000), ("127.0.0.1", 5001)]
    assert child.handle(tree_contribution(0, [1, 2], parent_ip, 0b011), peers[0]) == []
    (partial, parent), = child.handle(tree_contribution(1, [10, 20], parent_ip, 0b011), peers[1])
    assert sorted(child.learned[0][1]) == [0, 1]
    result = bytearray(partial)
    result[FRAME_OFFSETS["opcode"] - PAYLOAD_OFFSET] = Opcode.RESULT
    at = FRAME_OFFSETS["bitmap"] - PAYLOAD_OFFSET
    result[at:at + 8] = (0b001).to_bytes(8, "big")
    assert child.handle(bytes(result), parent) == [(bytes(result), peers[0])]
    assert child.counters()["results_relayed"] == 1


def job_frame(entry, opcode, sender, values=(), slot=0, fanin=2, round_=1):
    """A registered job's version 3 datagram (a result request is the bare header)."""
    frame = build_frames(np.asarray([values or [0]], dtype=np.int32), opcode=opcode, version=3, sender=sender,
                         fanin=fanin, job=entry.job, token=entry.token, round=round_, clique=0, slot=slot, chunk=0,
                         group=entry.group)
    payload = payload_of(frame[0])
    return payload[:FRAME_HEADER_BYTES - PAYLOAD_OFFSET] if opcode == Opcode.RESULT_REQUEST else payload


@pytest.mark.parametrize("engine", ["golden", "fast"])
def test_a_registered_tree_with_a_group_relays_a_result_only_to_those_that_asked(server, engine):
    """A lower level of a job with a group and a tree: the root sent the group the result, so the one that
    comes down (the parent's answer to the partial sent up again for a member's retransmission) goes to that
    member alone, not to the group a second time; a second copy from the parent goes nowhere."""
    from inwire.datagram import ip_int
    from inwire.jobs import CliqueRoute, JobEntry

    if engine == "fast":
        pytest.importorskip("inwire._kernel")
    aggregator = server(engine=engine, registered=True, key=bytes(32))
    members, parent = [("127.0.0.1", 5000), ("127.0.0.1", 5001)], ("127.0.0.5", 6000)
    entry = JobEntry(job=0x2B2B, token=0x5EC2E7_0000_0002, slots=1, group=0xEF_00_00_2B,
                     members=frozenset((ip_int(host), port) for host, port in members),
                     routes={0: CliqueRoute(level=0b11, parent=(ip_int(parent[0]), parent[1]))})
    aggregator.install_job(entry)
    contributions = [job_frame(entry, Opcode.CONTRIBUTION, sender, [sender + 1], fanin=3) for sender in (0, 1)]
    assert aggregator.handle(contributions[0], members[0]) == []
    ((partial, to),) = aggregator.handle(contributions[1], members[1])
    assert (partial[3], to) == (Opcode.PARTIAL, parent)
    ((again, to),) = aggregator.handle(contributions[1], members[1])
    assert (again, to) == (partial, parent)
    frame = build_frames(np.asarray([[10]], dtype=np.int32), opcode=Opcode.RESULT, version=3, sender=2, fanin=3,
                         job=entry.job, token=entry.token, round=1, clique=0, slot=0, chunk=0, group=entry.group,
                         bitmap=0b111, status=0)
    result = payload_of(frame[0])
    assert [to for _, to in aggregator.handle(result, parent)] == [members[1]]
    assert aggregator.handle(result, parent) == []
    assert aggregator.counters()["relayed"] == 1


def _udp_sockets(count):
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
    return sockets


def _synced_counters(aggregator, sock):
    """The service's counters once it has sent everything it was going to for the datagrams before: two stats
    round trips (the first one's batch may still be sending when its reply arrives; the second is read after)."""
    for _ in range(2):
        sock.sendto(stats_request(), aggregator.address)
        counters = parse_stats_reply(sock.recv(65535))
    return counters


def _nothing_waiting(sock):
    sock.setblocking(False)
    try:
        sock.recv(65535)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(5)
    return False


@pytest.mark.parametrize("unicast", [True, False], ids=["unicast", "multicast"])
@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_a_registered_job_completes_and_strangers_get_nothing_back(server, engine, unicast):
    """A job installed with its members' sockets: each contributing member gets the result, once, from the
    service, with the job's token; a member whose contribution the slot did not take gets nothing; a stranger
    with the job's id and token (a stolen token) gets 0 bytes back for its contribution and its result requests,
    before and after the job completed, and each is counted (drop_member). A member's result request is answered
    to that member alone. The service's own unicast mode plays no part in it."""
    from inwire.datagram import ip_int
    from inwire.jobs import JobEntry

    if engine == "fast":
        pytest.importorskip("inwire._kernel")
    aggregator = server(engine=engine, unicast=unicast, registered=True, key=bytes(32))
    *members, idle, stranger, observer = _udp_sockets(5)
    endpoints = [sock.getsockname() for sock in (*members, idle)]
    entry = JobEntry(job=0x2A2A, token=0x5EC2E7_0000_0001, slots=2,
                     members=frozenset((ip_int(host), port) for host, port in endpoints))
    assert aggregator.install_job(entry) == 0
    thread = threading.Thread(target=aggregator.serve, daemon=True)
    thread.start()
    try:
        stranger.sendto(job_frame(entry, Opcode.CONTRIBUTION, 1, [1000]), aggregator.address)
        stranger.sendto(job_frame(entry, Opcode.RESULT_REQUEST, 1), aggregator.address)
        members[0].sendto(job_frame(entry, Opcode.CONTRIBUTION, 0, [5, -7]), aggregator.address)
        members[1].sendto(job_frame(entry, Opcode.CONTRIBUTION, 1, [6, 9]), aggregator.address)
        results = []
        for member in members:
            body, source = member.recvfrom(65535)
            results.append(body)
            assert source == aggregator.address
        for body in results:
            header = parse_payload_header(body)
            assert (header["version"], header["opcode"], header["token"], header["bitmap"]) == (3, Opcode.RESULT,
                                                                                               entry.token, 0b11)
            assert np.frombuffer(body, ">i4", 2, FRAME_HEADER_BYTES - PAYLOAD_OFFSET).tolist() == [11, 2]
        stranger.sendto(job_frame(entry, Opcode.RESULT_REQUEST, 0), aggregator.address)
        members[1].sendto(job_frame(entry, Opcode.RESULT_REQUEST, 1), aggregator.address)
        assert members[1].recv(65535) == results[1]
        counters = _synced_counters(aggregator, observer)
        assert _nothing_waiting(stranger) and _nothing_waiting(members[0]) and _nothing_waiting(idle)
        # answered: the member's result request and the first stats request (a reply counts what came before it)
        assert (counters["drop_member"], counters["accumulated"], counters["answered"]) == (3, 2, 2)
        assert counters["results_emitted"] == 3
    finally:
        aggregator.stop()
        thread.join(5)
        for sock in (*members, idle, stranger, observer):
            sock.close()


@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_a_version_3_result_is_never_relayed_by_the_service_s_own_machinery(server, engine):
    """With `unicast`, the service relays a version 1 or 2 result from the aggregator it sent a slot's partial
    to. A version 3 result that looks like that relay (same job, round, clique, chunk and slot number, from
    that address, which is also the job's parent) is the aggregator's to decide: here its slot is past the job's
    quota, so it is dropped (drop_slot) and nothing is relayed."""
    from inwire.datagram import ip_int
    from inwire.jobs import CliqueRoute, JobEntry

    if engine == "fast":
        pytest.importorskip("inwire._kernel")
    aggregator = server(engine=engine, unicast=True, registered=True, key=bytes(32))
    parent = ("127.0.0.2", aggregator.address[1])
    member = ("127.0.0.1", 5000)
    entry = JobEntry(job=0x77, token=0xABCDEF, slots=2, members=frozenset({(ip_int(member[0]), member[1])}),
                     routes={0: CliqueRoute(parent=(ip_int(parent[0]), parent[1]))})
    aggregator.install_job(entry)
    up = build_frames(np.array([[4]], dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=0, fanin=1, job=entry.job,
                      round=1, clique=0, slot=5, chunk=0, group=GROUP, hop1=ip_int(parent[0]))
    assert [to for _, to in aggregator.handle(payload_of(up[0]), member)] == [parent]
    down = build_frames(np.array([[4]], dtype=np.int32), status=0, opcode=Opcode.RESULT, version=3, sender=0,
                        fanin=1, job=entry.job, token=entry.token, round=1, clique=0, slot=5, chunk=0, bitmap=1)
    assert aggregator.handle(payload_of(down[0]), parent) == []
    counters = aggregator.counters()
    assert (counters["drop_slot"], counters["results_relayed"]) == (1, 0)


@pytest.fixture(scope="module")
def served_gateware(tmp_path_factory):
    """`inwire serve --sim icarus:8` on loopback, registered jobs only, its results multicast out of lo: its
    address, the operator key its control port takes, and its listening line."""
    from inwire.control import load_key

    key_file = tmp_path_factory.mktemp("operator") / "operator.key"
    with services.served_gateware("--slots", "4", "--max-elements", "8", "--key-file", str(key_file)) as (port, line):
        yield ("127.0.0.1", port), load_key(key_file), line


@pytest.mark.sim
def test_the_served_gateware_completes_a_job_registered_at_its_control_port_until_its_teardown(served_gateware):
    """A job with a group, registered through `inwire serve --sim`'s control port: its members' version 3
    contributions complete, and the result goes to the job's group (multicast on lo), once, from the service;
    a stranger's contribution with the job's id but another token is counted as drop_token. A member's result
    request is answered to it; once the job is torn down it is drop_job, and once the job is registered again
    its range is empty (drop_no_result). The counters are read with a version 3 stats request from a member,
    which the service answers to that member."""
    from inwire.control import leave, register, teardown
    from inwire.datagram import ip_int
    from inwire.jobs import JobEntry

    address, key, listening = served_gateware
    group = "239.73.0.36"
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind((group, address[1]))
    listener.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group)
                        + socket.inet_aton("127.0.0.1"))
    listener.settimeout(30)
    *members, stranger = _udp_sockets(3)
    for member in members:
        member.settimeout(30)  # the first frames of a fresh co-simulation take their time on a loaded machine
    entry = JobEntry(job=0x3636, token=0x5EC2E7_0000_0036, slots=2, group=ip_int(group),
                     members=frozenset((ip_int(host), port) for host, port in (sock.getsockname() for sock in members)))
    try:
        assert register(address, entry, key=key) == 0
        forged = JobEntry(job=entry.job, token=entry.token + 1, slots=1, members=entry.members, group=entry.group)
        stranger.sendto(job_frame(forged, Opcode.CONTRIBUTION, 1, [1000]), address)
        members[0].sendto(job_frame(entry, Opcode.CONTRIBUTION, 0, [5, -7]), address)
        members[1].sendto(job_frame(entry, Opcode.CONTRIBUTION, 1, [6, 9]), address)
        body, source = listener.recvfrom(65535)
        assert source == address
        header = parse_payload_header(body)
        assert (header["version"], header["opcode"], header["token"], header["bitmap"]) == (3, Opcode.RESULT,
                                                                                           entry.token, 0b11)
        assert np.frombuffer(body, ">i4", 2, FRAME_HEADER_BYTES - PAYLOAD_OFFSET).tolist() == [11, 2]
        members[1].sendto(job_frame(entry, Opcode.RESULT_REQUEST, 1), address)
        assert members[1].recv(65535) == body
        assert teardown(address, entry.job, key=key)
        members[0].sendto(job_frame(entry, Opcode.RESULT_REQUEST, 0), address)
        assert register(address, entry, key=key) == 0
        members[0].sendto(job_frame(entry, Opcode.RESULT_REQUEST, 0), address)
        assert leave(address, entry.job, [members[1].getsockname()], key=key) == (1, 1)
        members[1].sendto(job_frame(entry, Opcode.RESULT_REQUEST, 1), address)
        request = build_frames(np.zeros((1, 0), dtype=np.int32), opcode=Opcode.STATS_REQUEST, version=3, sender=0,
                               job=entry.job, token=entry.token, group=entry.group)
        members[0].sendto(payload_of(request[0]), address)
        # the first datagram back to the member: a result request of a torn-down job or of an empty range gets none
        reply = members[0].recv(65535)
        assert parse_payload_header(reply)["opcode"] == Opcode.STATS_REPLY
        counters = parse_stats_reply(reply)
        assert {name: counters[name] for name in ("drop_token", "accumulated", "results_emitted", "drop_job",
                                                  "drop_no_result", "drop_member")} == {
            "drop_token": 1, "accumulated": 2, "results_emitted": 2, "drop_job": 1, "drop_no_result": 1,
            "drop_member": 1}
        assert _nothing_waiting(listener) and _nothing_waiting(stranger) and _nothing_waiting(members[1])
        assert listening.endswith(", registered jobs only"), listening
    finally:
        for sock in (listener, *members, stranger):
            sock.close()


@pytest.mark.sim
def test_the_served_gateware_refuses_a_job_without_a_group_in_one_line(served_gateware):
    """The gateware sends a result as one frame, to its job's group: a registration without a group is
    refused through the control plane's reply, in the line the model's job tables give."""
    from inwire.control import ControlError, register
    from inwire.jobs import JobEntry

    address, key, _ = served_gateware
    entry = JobEntry(job=0x3637, token=0x36, slots=1, members=frozenset({(0x7F000001, 5000)}))
    with pytest.raises(ControlError) as refused:
        register(address, entry, key=key)
    assert str(refused.value) == (
        f"{address[0]}:{address[1]} refused the registration of job {entry.job}: job {entry.job}: without a group "
        f"its results go out as one copy per member, which this aggregator cannot send: give the job a multicast "
        f"group")


def test_the_service_clock_starts_once_its_engine_is_up(monkeypatch):
    """A datagram's arrival time counts from when the engine is ready: a co-simulated gateware takes seconds to
    build, which its first frame would otherwise be driven through as lease ticks, a simulated cycle each."""
    import inwire.serve as serve_module
    from inwire.model import Aggregator

    clock = [1000.0]
    monkeypatch.setattr(serve_module.time, "monotonic", lambda: clock[0])

    def slow_engine(config):
        clock[0] += 30.0
        return Aggregator(config)

    aggregator = SoftwareAggregator(("127.0.0.1", 0), log=lambda line: None, make_aggregator=slow_engine)
    try:
        assert aggregator.ticks() == 0
        clock[0] += 0.25
        assert aggregator.ticks() == 250
    finally:
        aggregator.close()


@pytest.mark.parametrize("registered", [False, True], ids=["data", "control_port"])
@pytest.mark.parametrize("engine", ["fast", "golden"])
def test_handle_is_the_one_decision_path_whatever_the_engine_and_control_port(engine, registered):
    """`handle` is one method for every engine, with or without the control port: a service that overrides it
    (to note arrivals, as tests/test_island_client.py's does) sees each datagram handed to it, and the answers
    are the base class's."""
    seen = []

    class Noting(SoftwareAggregator):
        def handle(self, payload, peer, now=None):
            seen.append(bytes(payload))
            return super().handle(payload, peer, now)

    aggregator = Noting(("127.0.0.1", 0), log=lambda line: None, engine=engine, registered=registered,
                        key=bytes(32) if registered else None)
    try:
        first, second = contribution(0, [1, 2]), contribution(1, [10, 20])
        assert aggregator.handle(first, ("127.0.0.1", 5000)) == []
        (result, destination), = aggregator.handle(second, ("127.0.0.1", 5001))
    finally:
        aggregator.close()
    assert seen == [first, second]
    assert destination == ("239.73.0.1", aggregator.address[1]) and result_elements(result)[1] == [11, 22]
