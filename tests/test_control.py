"""The control plane of registered jobs (inwire.control): messages, the operator key, the aggregator's side
and the client API, over loopback."""

import json
import os
import socket
import stat
import threading
import time

import numpy as np
import pytest

from inwire import control
from inwire.control import (
    FRESH_S,
    MAGIC,
    ControlError,
    ControlPlane,
    JobLease,
    KeyFileError,
    Refused,
    RequestError,
    decode,
    encode,
    entry_from_json,
    entry_to_json,
    leave,
    load_key,
    new_job,
    register,
    teardown,
)
from inwire.datagram import (
    MAX_DATAGRAM,
    PAYLOAD_HEADER_BYTES,
    ip_int,
    parse_result,
    parse_stats_reply,
    payload_of,
    stats_request,
)
from inwire.fastpath import compiled
from inwire.jobs import CliqueRoute, JobEntry, JobTable
from inwire.packets import build_frames
from inwire.protocol import COUNTERS, JOB_VERSION, Opcode
from inwire.serve import SoftwareAggregator, serving_in_thread

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
PEER = ("127.0.0.1", 40000)
NOW = 1_800_000_000.0
MEMBER = (ip_int("127.0.0.1"), 5000)


def entry(job=7, token=0x1234, slots=4, members=(MEMBER,), **fields):
    return JobEntry(job=job, token=token, slots=slots, members=frozenset(members), **fields)


OTHER_MEMBER = (ip_int("127.0.0.1"), 5001)


def request(op="register", job_entry=None, nonce="00000000000000aa", issued_s=NOW, **fields):
    body = {"op": op, "nonce": nonce, "issued_ms": int(issued_s * 1000)}
    if op == "register":
        body |= {"ttl_s": 60, **entry_to_json(job_entry or entry())}
    elif op == "leave":
        body |= {"job": (job_entry or entry()).job, "members": entry_to_json(job_entry or entry())["members"]}
    else:
        body["job"] = (job_entry or entry()).job
    return body | fields


@pytest.fixture
def plane():
    table = JobTable(64)
    return ControlPlane(table.install, table.remove, table.leave, key=KEY), table


def answer(plane_, body, key=KEY, now=NOW, peer=PEER):
    reply = plane_.handle(encode(body, key), peer, now)
    return None if reply is None else decode(reply, KEY)


# ---- messages and JSON


def test_message_round_trip_and_tag_check():
    message = encode({"a": 1}, KEY)
    assert message.startswith(MAGIC) and decode(message, KEY) == {"a": 1}
    with pytest.raises(Refused, match="tag"):
        decode(message, OTHER_KEY)
    tampered = message[:-2] + b"2}"
    with pytest.raises(Refused, match="tag"):
        decode(tampered, KEY)


def test_message_bounds():
    with pytest.raises(ControlError, match="more than the 16384"):
        encode({"a": "x" * control.MAX_BODY}, KEY)
    body = b"[" + b" " * control.MAX_BODY + b"]"
    with pytest.raises(Refused, match="more than"):
        decode(MAGIC + control._tag(KEY, body) + body, KEY)
    with pytest.raises(Refused, match="not a control message"):
        decode(b"IWCP" + bytes(10), KEY)


def test_entry_json_round_trip():
    route = CliqueRoute(level=0b11, parent=(ip_int("10.0.0.1"), 18775), children={(ip_int("10.0.0.3"), 9): 0b10})
    original = entry(group=ip_int("239.1.2.3"), routes={5: route})
    text = json.loads(json.dumps(entry_to_json(original)))
    assert text["members"] == ["127.0.0.1:5000"] and text["group"] == "239.1.2.3"
    assert text["token"] == "0000000000001234"
    assert entry_from_json(text) == original


@pytest.mark.parametrize("field, value, message", [
    ("job", 0, r"field job: 0 is outside \[1, 4294967295\]"),
    ("job", "7", 'field job: "7" is not an integer'),
    ("slots", True, "field slots: true is not an integer"),
    ("token", "12", 'field token: "12" is not 16 lowercase hex digits'),
    ("token", "0000000000000000", "token is not a nonzero"),
    ("members", ["127.0.0.1"], r'field members\[0\]: "127.0.0.1" is not a.b.c.d:port'),
    ("members", ["127.0.0.1:0"], r"field members\[0\]"),
    ("members", ["127.0.0.1:65536"], r'field members\[0\]: "127.0.0.1:65536" is not a.b.c.d:port'),
    ("members", "127.0.0.1:1", "field members: .* is not a list"),
    ("group", "10.0.0.1", "group 0xa000001 is not in 239.0.0.0/8"),
    ("group", "239.0.0", 'field group: "239.0.0" is not an IPv4 address'),
    ("routes", {"x": {}}, "field routes.x: the clique 'x' is not a number"),
    ("routes", {"1": {"level": 1, "parent": "1.2.3.4"}}, "field routes.1.parent"),
    ("routes", {"1": {"levels": 1}}, "field routes.1.levels is not one a request has"),
])
def test_entry_json_errors_name_the_field(field, value, message):
    body = entry_to_json(entry()) | {field: value}
    with pytest.raises(RequestError, match=message):
        entry_from_json(body)


# ---- the operator key


def test_key_is_made_once_with_mode_0600(tmp_path, monkeypatch):
    path = tmp_path / "conf" / "operator.key"
    monkeypatch.setenv("INWIRE_KEY_FILE", str(path))
    key = load_key()
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key() == key
    assert os.listdir(path.parent) == ["operator.key"]


def test_key_defaults_to_the_config_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("INWIRE_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    key = load_key()
    assert (tmp_path / ".config" / "inwire" / "operator.key").read_bytes() == key


def test_key_of_the_wrong_size_is_one_clear_error(tmp_path):
    path = tmp_path / "short.key"
    path.write_bytes(b"x" * 31)
    with pytest.raises(KeyFileError, match=r"short.key: 31 bytes, not the 32 of a key") as caught:
        load_key(path)
    assert "\n" not in str(caught.value)


def test_unreadable_key_is_one_clear_error(tmp_path, deadline):
    with pytest.raises(KeyFileError, match=r": a folder, not a regular file \(the operator key is read from a file"):
        load_key(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(KeyFileError, match="fifo: a FIFO, not a regular file"):
        load_key(fifo)
    with pytest.raises(KeyFileError, match="/dev/zero: a character device"):
        load_key("/dev/zero")
    long = tmp_path / "long.key"
    long.write_bytes(bytes(33))
    with pytest.raises(KeyFileError, match="long.key: more than 32 bytes, not the 32 of a key"):
        load_key(long)
    dangling = tmp_path / "config"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(KeyFileError, match="does not exist and cannot be made"):
        load_key(dangling / "operator.key")


def test_two_processes_making_the_key_agree(tmp_path):
    path = tmp_path / "operator.key"
    keys = []
    threads = [threading.Thread(target=lambda: keys.append(load_key(path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and os.listdir(tmp_path) == ["operator.key"]


# ---- the aggregator's side


def test_register_installs_and_replies(plane):
    plane_, table = plane
    reply = answer(plane_, request())
    assert reply == {"ok": True, "nonce": "00000000000000aa", "job": 7, "base": 0, "expires_in_s": 60}
    assert table.entries[7] == entry()
    assert plane_.counters["jobs_registered"] == 1


def test_wrong_key_gets_no_reply(plane):
    plane_, table = plane
    assert answer(plane_, request(), key=OTHER_KEY) is None
    assert not table.entries and plane_.counters["control_refused"] == 1


def test_replay_gets_no_reply(plane):
    plane_, table = plane
    message = encode(request(), KEY)
    assert plane_.handle(message, PEER, NOW) is not None
    table.remove(7)
    assert plane_.handle(message, PEER, NOW + 1) is None
    assert not table.entries and plane_.counters["control_refused"] == 1


@pytest.mark.parametrize("offset", [FRESH_S + 1, -FRESH_S - 1])
def test_stale_gets_no_reply(plane, offset):
    plane_, table = plane
    assert answer(plane_, request(issued_s=NOW + offset)) is None
    assert not table.entries and plane_.counters["control_refused"] == 1


@pytest.mark.parametrize("payload", [
    b"IWCP",
    b"IWCP" + bytes(40),
    b"IWCP" + bytes(control.MAX_MESSAGE),
])
def test_malformed_and_oversized_get_no_reply(plane, payload):
    plane_, _ = plane
    assert plane_.handle(payload, PEER, NOW) is None
    assert plane_.counters["control_refused"] == 1


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"op": "register"}', b'{"nonce": "zz", "issued_ms": 1}'])
def test_authentic_but_malformed_gets_no_reply(plane, body):
    plane_, _ = plane
    assert plane_.handle(MAGIC + control._tag(KEY, body) + body, PEER, NOW) is None
    assert plane_.counters["control_refused"] == 1


def test_invalid_field_is_answered_in_one_line(plane):
    plane_, table = plane
    reply = answer(plane_, request(slots=0))
    assert reply == {"ok": False, "nonce": "00000000000000aa", "error": "field slots: 0 is outside [1, 65536]"}
    assert not table.entries and plane_.counters["control_errors"] == 1


def test_unknown_field_is_answered_by_its_name(plane):
    plane_, table = plane
    reply = answer(plane_, request(colour="red"))
    assert reply["error"] == "field colour is not one a request has"
    assert not table.entries


def test_jobs_at_the_edges_of_the_id_range_register_and_tear_down(plane):
    plane_, table = plane
    for job in (1, (1 << 32) - 1):
        nonces = (f"{job:016x}", f"{job + 1:016x}")
        assert answer(plane_, request(job_entry=entry(job=job), nonce=nonces[0]))["ok"] is True
        assert answer(plane_, request("teardown", job_entry=entry(job=job), nonce=nonces[1]))["removed"] is True
    assert not table.entries


def test_clash_is_refused_in_one_line(plane):
    plane_, table = plane
    answer(plane_, request())
    reply = answer(plane_, request(job_entry=entry(token=99), nonce="00000000000000bb"))
    assert reply["ok"] is False and "a clash" in reply["error"] and "\n" not in reply["error"]
    assert table.entries[7].token == 0x1234


def test_reply_is_bounded(plane):
    plane_, _ = plane

    def refuse(_entry):
        raise RequestError("x" * 5000)
    plane_.install = refuse
    reply = plane_.handle(encode(request(), KEY), PEER, NOW)
    assert len(reply) <= control.MAX_REPLY and decode(reply, KEY)["error"].endswith("...")


def test_registration_expires_unless_renewed(plane):
    plane_, table = plane
    answer(plane_, request(ttl_s=10))
    assert plane_.expire(NOW + 9) == []
    answer(plane_, request(ttl_s=10, nonce="00000000000000bb"), now=NOW + 5)  # renewed: 15 from now on
    assert plane_.expire(NOW + 14) == [] and 7 in table.entries
    assert plane_.expire(NOW + 15) == [7]
    assert not table.entries and table._free_range(64) == 0
    assert plane_.counters["jobs_expired"] == 1 and plane_.counters["jobs_renewed"] == 1


def test_teardown_is_idempotent(plane):
    plane_, table = plane
    answer(plane_, request())
    first = answer(plane_, request("teardown", nonce="00000000000000bb"))
    second = answer(plane_, request("teardown", nonce="00000000000000cc"))
    assert first["removed"] is True and second == {"ok": True, "nonce": "00000000000000cc", "job": 7,
                                                   "removed": False}
    assert not table.entries and plane_.expire(NOW + 100) == []


def test_a_member_leaves_and_the_job_goes_with_its_last_member(plane):
    """Two islands registered their own sockets in one job: one leaves and the job stays for the other, with
    its range and expiry; leaving again changes nothing; the last member's leave removes the job."""
    plane_, table = plane
    first, second = entry(members=(MEMBER,)), entry(members=(OTHER_MEMBER,))
    answer(plane_, request(job_entry=first))
    answer(plane_, request(job_entry=second, nonce="00000000000000bb"))
    reply = answer(plane_, request("leave", job_entry=first, nonce="00000000000000cc"))
    assert reply == {"ok": True, "nonce": "00000000000000cc", "job": 7, "left": 1, "remaining": 1, "removed": False}
    assert table.entries[7].members == {OTHER_MEMBER} and table.bases[7] == 0 and 7 in plane_.expires
    again = answer(plane_, request("leave", job_entry=first, nonce="00000000000000dd"))
    assert (again["left"], again["remaining"], again["removed"]) == (0, 1, False)
    last = answer(plane_, request("leave", job_entry=second, nonce="00000000000000ee"))
    assert (last["left"], last["remaining"], last["removed"]) == (1, 0, True)
    assert not table.entries and table._free_range(64) == 0 and plane_.expire(NOW + 100) == []
    gone = answer(plane_, request("leave", job_entry=second, nonce="00000000000000ff"))
    assert (gone["left"], gone["remaining"], gone["removed"]) == (0, 0, False)
    assert (plane_.counters["members_left"], plane_.counters["jobs_left"]) == (2, 1)


@pytest.mark.parametrize("when", ["replayed", "stale", "other_key"])
def test_a_leave_that_is_not_authentic_and_new_gets_no_reply_and_leaves_the_job(plane, when):
    plane_, table = plane
    answer(plane_, request())
    leave_request = request("leave", nonce="00000000000000bb")
    if when == "replayed":
        assert answer(plane_, leave_request | {"members": ["127.0.0.1:9"]}) is not None
        assert answer(plane_, leave_request, now=NOW + 1) is None
    elif when == "stale":
        assert answer(plane_, request("leave", nonce="00000000000000bb", issued_s=NOW - FRESH_S - 1)) is None
    else:
        assert answer(plane_, leave_request, key=OTHER_KEY) is None
    assert table.entries[7].members == {MEMBER} and plane_.counters["control_refused"] == 1
    assert plane_.counters["members_left"] == 0


@pytest.mark.parametrize("fields, message", [
    ({"members": []}, "field members: [] names no member to leave"),
    ({"members": "127.0.0.1:5000"}, 'field members: "127.0.0.1:5000" is not a list of a.b.c.d:port'),
    ({"members": ["127.0.0.1"]}, 'field members[0]: "127.0.0.1" is not a.b.c.d:port'),
    ({"job": 0}, "field job: 0 is outside [1, 4294967295]"),
    ({"token": "0000000000001234"}, "field token is not one a request has"),
])
def test_a_bad_leave_is_answered_in_one_line_and_leaves_the_job(plane, fields, message):
    plane_, table = plane
    answer(plane_, request())
    reply = answer(plane_, request("leave", nonce="00000000000000bb", **fields))
    assert reply == {"ok": False, "nonce": "00000000000000bb", "error": message}
    assert table.entries[7].members == {MEMBER} and plane_.counters["control_errors"] == 1


def test_nonce_cache_is_bounded(plane, monkeypatch):
    plane_, _ = plane
    monkeypatch.setattr(control, "NONCES", 3)
    for index in range(3):
        assert answer(plane_, request("teardown", nonce=f"{index:016x}")) is not None
    assert answer(plane_, request("teardown", nonce=f"{3:016x}")) is None
    # nonces are forgotten once stale: replays of them are refused as stale anyway
    later = NOW + 2 * FRESH_S + 1
    assert answer(plane_, request("teardown", nonce=f"{4:016x}", issued_s=later), now=later) is not None
    assert len(plane_._nonces) == 1


# ---- the client API, over loopback


@pytest.fixture
def aggregator():
    """A control plane over a job table behind a loopback socket, in a thread: (address, table, plane)."""
    table = JobTable(64)
    plane_ = ControlPlane(table.install, table.remove, table.leave, key=KEY)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                payload, peer = sock.recvfrom(70000)
            except TimeoutError:
                continue
            reply = plane_.handle(payload, peer, time.time())
            if reply is not None:
                sock.sendto(reply, peer)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname(), table, plane_
    stop.set()
    thread.join()
    sock.close()


def test_new_job_is_random_and_nonzero():
    first, second = new_job(["127.0.0.1:5000", ("127.0.0.1", 5001)], slots=4), new_job([MEMBER], slots=4)
    assert first.job != second.job and first.token != second.token and first.job and first.token
    assert first.members == {MEMBER, (MEMBER[0], 5001)} and first.group == 0
    assert new_job([MEMBER], 1, group="239.0.0.9").group == ip_int("239.0.0.9")


def test_register_and_teardown_round_trip(aggregator):
    address, table, _ = aggregator
    job = new_job([MEMBER], slots=8)
    assert register(address, job, key=KEY) == 0
    assert register(f"{address[0]}:{address[1]}", new_job([MEMBER], slots=2), key=KEY) == 8
    assert table.entries[job.job] == job
    assert teardown(address, job, key=KEY) is True
    assert teardown(address, job.job, key=KEY) is False
    assert job.job not in table.entries


def test_register_reports_the_aggregators_error(aggregator):
    address, _, _ = aggregator
    job = new_job([MEMBER], slots=4)
    register(address, job, key=KEY)
    clash = JobEntry(job=job.job, token=job.token ^ 1, slots=4, members=job.members)
    with pytest.raises(ControlError, match=rf"refused the registration of job {job.job}: .*a clash"):
        register(address, clash, key=KEY)


def test_register_with_another_key_gets_no_answer(aggregator):
    address, table, plane_ = aggregator
    job = new_job([MEMBER], slots=4)
    with pytest.raises(ControlError, match=rf"no answer from 127.0.0.1:{address[1]} to the registration of job "
                                           rf"{job.job} \(is inwire serve running there, with the same operator"):
        register(address, job, key=OTHER_KEY, timeout_s=0.1, retries=1)
    assert not table.entries and plane_.counters["control_refused"] == 2


def test_register_without_a_service_gets_no_answer():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unused:
        unused.bind(("127.0.0.1", 0))
        address = unused.getsockname()
    with pytest.raises(ControlError, match="no answer from"):
        register(address, new_job([MEMBER], slots=4), key=KEY, timeout_s=0.1, retries=1)


def test_register_refuses_values_out_of_range_before_sending():
    job = new_job([MEMBER], slots=1)
    with pytest.raises(ValueError, match=r"ttl_s must be .* \[1, 3600\], got 3601"):
        register(("127.0.0.1", 9), job, key=KEY, ttl_s=3601)
    with pytest.raises(ValueError, match=r"retries must be a whole number in \[0, 100\], got -1"):
        register(("127.0.0.1", 9), job, key=KEY, retries=-1)
    with pytest.raises(ValueError, match=r"timeout_s must lie in \(0, 60\] seconds, got 0"):
        teardown(("127.0.0.1", 9), job, key=KEY, timeout_s=0)


def test_lease_registers_renews_and_leaves(aggregator, deadline):
    address, table, plane_ = aggregator
    job = new_job([MEMBER], slots=4)
    with JobLease([address], job, ttl_s=1, key=KEY) as lease:
        assert lease.bases == {address: 0} and job.job in table.entries
        while plane_.counters["jobs_renewed"] < 2:
            time.sleep(0.05)
        assert lease.last_error is None
    assert job.job not in table.entries and plane_.counters["jobs_left"] == 1
    assert plane_.counters["jobs_torn_down"] == 0


def test_a_lease_that_ends_leaves_the_job_to_the_other_islands_lease(aggregator):
    """Two islands each keep their own socket registered in one job: the first one's end takes its member
    out and no other; the second one's removes the job."""
    address, table, plane_ = aggregator
    first = new_job([MEMBER], slots=4)
    second = JobEntry(job=first.job, token=first.token, slots=4, members={OTHER_MEMBER})
    with JobLease([address], second, key=KEY):
        with JobLease([address], first, key=KEY):
            assert table.entries[first.job].members == {MEMBER, OTHER_MEMBER}
        assert table.entries[first.job].members == {OTHER_MEMBER}
    assert first.job not in table.entries
    assert (plane_.counters["members_left"], plane_.counters["jobs_left"], plane_.counters["jobs_torn_down"]) == (
        2, 1, 0)


def test_a_lease_of_a_relay_only_level_ends_without_leaving_and_its_registration_runs_out(aggregator):
    """A tree's aggregator that only sums the levels below it is registered with routes and no members: its
    lease ends cleanly (no one to leave, nothing torn down), and the registration expires with its ttl."""
    address, table, plane_ = aggregator
    relay = JobEntry(job=0x4E1A, token=0x4E1A_4E1A, slots=4, members=frozenset(),
                     routes={0: CliqueRoute(level=0b110, parent=(0x7F000001, 9), children={(0x7F000001, 8): 0b100})})
    with JobLease([address], relay, ttl_s=1, key=KEY):
        assert table.entries[relay.job] == relay
    assert relay.job in table.entries and plane_.counters["members_left"] == plane_.counters["jobs_torn_down"] == 0
    assert plane_.expire(time.time() + 1) == [relay.job] and relay.job not in table.entries


def test_leave_round_trip_and_its_arguments(aggregator):
    address, table, _ = aggregator
    job = new_job([MEMBER, OTHER_MEMBER], slots=4)
    register(address, job, key=KEY)
    assert leave(address, job.job, ["127.0.0.1:5001"], key=KEY) == (1, 1)
    assert leave(address, job, key=KEY) == (1, 0) and job.job not in table.entries
    assert leave(address, job, key=KEY) == (0, 0)
    with pytest.raises(ValueError, match="leave needs the members that leave, or the job's entry"):
        leave(address, job.job, key=KEY)
    with pytest.raises(ValueError, match="leave needs at least one member that leaves"):
        leave(address, job.job, [], key=KEY)


def test_lease_that_fails_to_register_tears_down_the_others(aggregator):
    address, table, _ = aggregator
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unused:
        unused.bind(("127.0.0.1", 0))
        silent = unused.getsockname()
        job = new_job([MEMBER], slots=4)
        with pytest.raises(ControlError, match="no answer"):
            with JobLease([address, silent], job, key=KEY, timeout_s=0.1, retries=0):
                pass
    assert not table.entries


# ---- inwire serve's control port


@pytest.fixture
def service():
    """A SoftwareAggregator taking registered jobs, serving in a thread: (service, its address)."""
    started = []

    def start(engine="golden", **options):
        server = SoftwareAggregator(("127.0.0.1", 0), engine=engine, slots=16, registered=True, key=KEY,
                                    log=lambda line: None, **options)
        context = serving_in_thread(server)
        started.append(context)
        return context.__enter__(), server.address
    yield start
    for context in started:
        context.__exit__(None, None, None)


def bound_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)
    return sock


def job_contribution(job, sender, values, slot=0, fanin=2, round_=1):
    frame = build_frames(np.asarray(values, dtype=np.int32), opcode=Opcode.CONTRIBUTION, version=JOB_VERSION,
                         token=job.token, job=job.job, sender=sender, fanin=fanin, round=round_, clique=0, slot=slot,
                         chunk=0, group=job.group)
    return payload_of(frame[0])


def test_registered_job_aggregates_through_serve(service):
    server, address = service()
    members = [bound_socket(), bound_socket()]
    with members[0], members[1]:
        job = new_job([member.getsockname() for member in members], slots=2)
        assert register(address, job, key=KEY) == 0
        for sender, member in enumerate(members):
            member.sendto(job_contribution(job, sender, [sender + 1, 10]), address)
        for member in members:
            payload, source = member.recvfrom(MAX_DATAGRAM)
            assert source == address and parse_result(payload).elements.tolist() == [3, 20]
        assert server.counters()["jobs_registered"] == 1


@pytest.mark.parametrize("engine", ["golden", "fast"])
def test_serve_answers_a_jobs_stats_request_from_its_members_alone(service, engine):
    """A stats reply is about twice its request, so a version 3 stats request whose source is not a member
    (even with the job and token) is dropped and counted: no socket but a member's can have it reflected."""
    server, address = service(engine=engine)
    with bound_socket() as member, bound_socket() as stranger:
        job = new_job([member.getsockname()], slots=2)
        register(address, job, key=KEY)
        request_ = stats_request(job=job.job, version=JOB_VERSION, token=job.token)
        stranger.sendto(request_, address)
        stranger.sendto(stats_request(job=job.job, version=JOB_VERSION, token=job.token ^ 1), address)
        member.sendto(request_, address)
        payload, source = member.recvfrom(MAX_DATAGRAM)
        counters = parse_stats_reply(payload)
        assert source == address and len(payload) == PAYLOAD_HEADER_BYTES + 4 * len(COUNTERS)
        # the reply counts the frames before it: the stranger's two were decided, and answered with nothing
        assert (counters["drop_member"], counters["drop_token"], counters["answered"]) == (1, 1, 0)
        stranger.setblocking(False)
        with pytest.raises(BlockingIOError):
            stranger.recv(MAX_DATAGRAM)
        assert server.counters()["answered"] == 1


@pytest.mark.parametrize("engine", ["golden", "fast"])
def test_an_island_that_leaves_leaves_the_job_to_the_other(service, engine):
    """Two islands registered their own sockets in one job at inwire serve: after the first leaves, the
    second still completes a sum there (and the first's frames are no longer taken); after the second leaves,
    the job is gone and its frames are drop_job."""
    server, address = service(engine=engine)
    with bound_socket() as first, bound_socket() as second:
        job = new_job([first.getsockname()], slots=2)
        islands = {first: job, second: JobEntry(job=job.job, token=job.token, slots=2,
                                                members={(ip_int("127.0.0.1"), second.getsockname()[1])})}
        assert [register(address, entry, key=KEY) for entry in islands.values()] == [0, 0]
        for sender, island in enumerate(islands):
            island.sendto(job_contribution(job, sender, [sender + 1]), address)
        assert [parse_result(island.recv(MAX_DATAGRAM)).elements.tolist() for island in islands] == [[3], [3]]
        assert leave(address, islands[first], key=KEY) == (1, 1)
        first.sendto(job_contribution(job, 0, [5], fanin=1, round_=2), address)
        second.sendto(job_contribution(job, 0, [7], fanin=1, round_=2, slot=1), address)
        assert parse_result(second.recv(MAX_DATAGRAM)).elements.tolist() == [7]
        assert server.counters()["drop_member"] == 1
        assert leave(address, islands[second], key=KEY) == (1, 0)
        counters = server.counters()
        second.sendto(job_contribution(job, 0, [9], fanin=1, round_=3), address)
        with bound_socket() as asker:  # a frame decided after the contribution above says it was counted
            asker.sendto(stats_request(), address)
            assert parse_stats_reply(asker.recv(MAX_DATAGRAM))["drop_job"] == counters["drop_job"] + 1
        assert (counters["members_left"], counters["jobs_left"], counters["jobs_torn_down"]) == (2, 1, 0)


def test_serve_refuses_what_is_not_authentic_and_new(service):
    server, address = service()
    with bound_socket() as client:
        stale = request("teardown", issued_s=time.time() - FRESH_S - 5, nonce="00000000000000a1")
        fresh = request("teardown", issued_s=time.time(), nonce="00000000000000a2")
        client.sendto(encode(stale, KEY), address)
        client.sendto(encode(fresh | {"nonce": "00000000000000a0"}, OTHER_KEY), address)
        client.sendto(b"IWCP" + bytes(100), address)
        client.sendto(encode(fresh, KEY), address)
        client.sendto(encode(fresh, KEY), address)  # a replay
        client.sendto(encode(request("teardown", issued_s=time.time(), nonce="00000000000000a3"), KEY), address)
        # the two authentic, new requests are the only ones answered, in order
        assert decode(client.recv(MAX_DATAGRAM), KEY)["nonce"] == "00000000000000a2"
        assert decode(client.recv(MAX_DATAGRAM), KEY)["nonce"] == "00000000000000a3"
        assert server.counters()["control_refused"] == 4
        assert server.counters()["drop_version"] == 0


def test_serve_expires_a_registration(service, deadline):
    server, address = service()
    job = new_job([MEMBER], slots=16)
    register(address, job, key=KEY, ttl_s=1)
    assert job.job in server.model.jobs.entries
    while server.counters()["jobs_expired"] == 0:
        time.sleep(0.05)
    assert not server.model.jobs.entries
    # its slots are free: a job needing all of them fits again
    assert register(address, new_job([MEMBER], slots=16), key=KEY) == 0


def test_serve_without_registered_jobs_has_no_control_port():
    server = SoftwareAggregator(("127.0.0.1", 0), engine="golden", log=lambda line: None)
    try:
        assert server.handle(encode(request("teardown"), KEY), PEER) == []
        assert server.counters()["drop_version"] == 1 and "control_refused" not in server.counters()
    finally:
        server.close()


def test_serve_with_registered_jobs_reads_the_default_key_before_binding(operator_key, tmp_path, monkeypatch):
    server = SoftwareAggregator(("127.0.0.1", 0), engine="golden", registered=True, log=lambda line: None)
    try:
        assert server.control.key == load_key(operator_key)
    finally:
        server.close()
    monkeypatch.setenv("INWIRE_KEY_FILE", str(tmp_path))  # a folder
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        with pytest.raises(KeyFileError, match="a folder"):
            # the key error, not "address in use": nothing is bound before the key is read
            SoftwareAggregator(taken.getsockname(), engine="golden", registered=True, log=lambda line: None)


@pytest.mark.skipif(compiled is None, reason="needs the compiled kernel")
def test_fast_service_answers_control_messages(service):
    server, address = service(engine="fast")
    assert server.batch_io
    assert teardown(address, 999, key=KEY) is False
    counters = server.counters()
    assert counters["drop_version"] == 0 and counters["frames_in"] == 0


@pytest.mark.skipif(compiled is None, reason="needs the compiled kernel")
def test_batched_fast_path_hands_control_messages_aside():
    server = SoftwareAggregator(("127.0.0.1", 0), engine="fast", registered=True, key=KEY, log=lambda line: None)
    try:
        data = [contribution_v2(0, [1, 2]), contribution_v2(1, [3, 4])]
        control_message = encode(request("teardown", issued_s=time.time()), KEY)
        datagrams = [data[0], control_message, data[1], b"IWCP" + bytes(50)]
        slot = MAX_DATAGRAM + 1
        buffer = bytearray(slot * len(datagrams))
        for index, datagram in enumerate(datagrams):
            buffer[index * slot:index * slot + len(datagram)] = datagram
        batch = [(len(datagram), ("127.0.0.1", 5000 + index)) for index, datagram in enumerate(datagrams)]
        sends = server.handle_batch(buffer, batch, slot, 0)
        reply, result = sends
        assert reply[1] == ("127.0.0.1", 5001) and decode(reply[0], KEY) == {
            "ok": True, "nonce": "00000000000000aa", "job": 7, "removed": False}
        assert parse_result(result[0]).elements.tolist() == [4, 6]
        counters = server.counters()
        assert counters["control_refused"] == 1 and counters["drop_version"] == 0 and counters["accumulated"] == 2
    finally:
        server.close()


def contribution_v2(sender, values):
    frame = build_frames(np.asarray(values, dtype=np.int32), opcode=Opcode.CONTRIBUTION, sender=sender, fanin=2,
                         job=3, round=1, clique=0, slot=0, chunk=0, group=0xEF490001)
    return payload_of(frame[0])


def test_register_ignores_replies_to_other_requests():
    """An authentic reply that answers no request of this client (an old one, replayed to it) is not its answer."""
    with bound_socket() as fake:
        def answer_twice():
            message, peer = fake.recvfrom(MAX_DATAGRAM)
            nonce = decode(message, KEY)["nonce"]
            fake.sendto(encode({"ok": False, "nonce": "0000000000000000", "error": "an old refusal"}, KEY), peer)
            fake.sendto(encode({"ok": True, "nonce": nonce, "job": 7, "base": 5, "expires_in_s": 60}, KEY), peer)
        thread = threading.Thread(target=answer_twice)
        thread.start()
        assert register(fake.getsockname(), entry(), key=KEY) == 5
        thread.join()


@pytest.mark.skipif(compiled is None, reason="needs the compiled kernel")
def test_batched_fast_path_reads_no_control_message_from_a_runts_stale_bytes():
    """recvmmsg reuses its buffer: a 2-byte runt in a slot that held a control message before is a runt."""
    server = SoftwareAggregator(("127.0.0.1", 0), engine="fast", registered=True, key=KEY, log=lambda line: None)
    try:
        slot = MAX_DATAGRAM + 1
        buffer = bytearray(slot)
        message = encode(request("teardown", issued_s=time.time()), KEY)
        buffer[:len(message)] = message
        assert server.handle_batch(buffer, [(2, PEER)], slot, 0) == []
        counters = server.counters()
        assert counters["drop_runt"] == 1 and counters["control_refused"] == 0
    finally:
        server.close()
