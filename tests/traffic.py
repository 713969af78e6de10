"""The traffic table: one short scenario per disposition and per counter, that every engine must reproduce.

A scenario is named after the counter it exists to reach (`COUNTERS`: one per disposition, then frames_in,
results_emitted and the rest) and builds its frames, with their arrival times, for a given aggregator
configuration (the engines run at different addresses: serve at 127.0.0.1 and an ephemeral port, the
gateware at its built address). What each frame's disposition is and what the counters become is not
written here: the golden model, run on the same frames, says it (`model_outcome`). The tests in
tests/test_traffic_table.py check that the table names every counter and that each scenario reaches its
counter in the model, and run every scenario through every engine, frame for frame.

Four scenarios (`JOB_SCENARIOS`, one per job disposition) need an aggregator that holds job tables: the
engines run them with `registered` on and the scenario's jobs installed. Three install a job with a group and
no routes, which the gateware's tables hold too (`GATEWARE_CONFIG`); `relayed` needs a clique's route to a
parent, which they do not hold, so the gateware is not given it.

Four scenarios hold frames that only a whole-frame engine sees (the model, the gateware): a frame for
another address, or one whose IPv4 header a kernel refuses before any UDP socket does. `FRAME_ONLY` names
them; every other scenario's frames are UDP datagrams that `datagram.wrap` makes again byte for byte, so the
datagram engines (the fast path, `inwire serve`) are given their payloads and sources.
"""

from dataclasses import dataclass, replace

import numpy as np

from inwire.datagram import PAYLOAD_OFFSET, ip_str, wrap
from inwire.jobs import CliqueRoute, JobEntry
from inwire.model import JOB_DISPOSITIONS, Aggregator, AggregatorConfig
from inwire.packets import build_frames, frame_field
from inwire.protocol import FRAME_OFFSETS, INT32_MAX, JOB_VERSION, Disposition, Opcode
from inwire_hdl.job_table import GATEWARE_LIMITS

HOST_MAC = 0x02_00_00_00_00_05
HOST_PORT = 40000
CLIQUE = dict(fanin=3, sender=0, job=3, round=9, clique=1, slot=1, chunk=0, group=0xEF_01_02_03)
"""The frames' default owner and shape: a clique of three, so that one contribution leaves its slot
unfinished."""
ELEMENTS = (1, 2)


def host_ip(config):
    """A member's address: in the aggregator's /24, not the aggregator's own."""
    return (config.ip & 0xFFFFFF00) | (5 if config.ip & 0xFF != 5 else 6)


def parent_ip(config):
    """An aggregator above this one: inside its upstream prefix, neither itself nor the member."""
    network, length = config.upstream_prefix
    span = 1 << (32 - length)
    for offset in (span - 2, span - 3, 1, 2):
        address = network + offset % span
        if address not in (config.ip, host_ip(config)) and config.is_upstream(address):
            return address
    raise ValueError(f"no parent aggregator address in the upstream prefix of {config}")


def frame(config, elements=ELEMENTS, status=None, count=None, **fields):
    """A version 2 frame from the member at `host_ip` to the aggregator of `config`, owner and shape
    `CLIQUE` unless `fields` say otherwise; `count` overrides the count field (a request's names its
    slot's vector, a wrong one makes the lengths disagree)."""
    values = {**dict(eth_dst=config.mac, eth_src=HOST_MAC, ip_src=host_ip(config), ip_dst=config.ip,
                     udp_sport=HOST_PORT, udp_dport=config.port), **CLIQUE, **fields}
    built = bytearray(build_frames(np.array(elements, dtype=np.int64), status=status, **values)[0])
    if count is not None:
        at = FRAME_OFFSETS["count"]
        built[at:at + 2] = count.to_bytes(2, "big")
    return bytes(built)


def contribution(config, **fields):
    return frame(config, opcode=Opcode.CONTRIBUTION, **fields)


def result_request(config, **fields):
    return frame(config, (), opcode=Opcode.RESULT_REQUEST, count=len(ELEMENTS), **fields)


def stats_request(config):
    return frame(config, (), opcode=Opcode.STATS_REQUEST)


TOKEN = 0x7AB1_E5EC_2E70_0003
TREE_CLIQUE = 2
"""The registered job's clique that goes on up to `parent_ip`; its other cliques are rooted here."""


def member(config):
    return host_ip(config), HOST_PORT


def table_jobs(config):
    """The job tables of the job scenarios: the job of `CLIQUE`, the member at `host_ip` its only member,
    unicast results, and clique TREE_CLIQUE below the aggregator at `parent_ip`."""
    return [JobEntry(job=CLIQUE["job"], token=TOKEN, slots=2, members={member(config)}, group=0,
                     routes={TREE_CLIQUE: CliqueRoute(parent=(parent_ip(config), config.port))})]


def grouped_jobs(config):
    """The job of `CLIQUE` with its group and no routes, the member at `host_ip` its only member: tables the
    gateware holds too."""
    return [JobEntry(job=CLIQUE["job"], token=TOKEN, slots=2, members={member(config)}, group=CLIQUE["group"])]


def grouped_frame(config, **fields):
    """A version 3 frame of the job of `grouped_jobs` from its member."""
    return job_frame(config, group=CLIQUE["group"], **fields)


def job_frame(config, elements=ELEMENTS, **fields):
    """A version 3 frame of the registered job (`table_jobs`) from its member, a contribution unless
    `fields` say otherwise."""
    return frame(config, elements, **{"opcode": Opcode.CONTRIBUTION, "version": JOB_VERSION, "token": TOKEN,
                                      "group": 0, **fields})


def job_stats_request(config, **fields):
    """A version 3 stats request of the registered job, from its member unless `fields` say otherwise (its
    group and route fields are read by no check)."""
    return job_frame(config, (), opcode=Opcode.STATS_REQUEST, **fields)


def datagram_frame(config, payload):
    """The frame that carries UDP `payload` from the member to the aggregator, as a kernel delivers it."""
    return wrap(payload, (ip_str(host_ip(config)), HOST_PORT), (ip_str(config.ip), config.port),
                config.mac.to_bytes(6, "big"), HOST_MAC.to_bytes(6, "big"))


def with_byte(data, name, change):
    """`data` with the first byte of field `name` changed by `change` (a function of the byte)."""
    at = FRAME_OFFSETS[name]
    return data[:at] + bytes([change(data[at])]) + data[at + 1:]


@dataclass(frozen=True)
class Scenario:
    reaches: str
    """The counter (a disposition's, or another) this scenario exists to move."""
    story: str
    steps: object
    """config -> [(frame, arrival time in lease ticks)]."""
    jobs: object = None
    """config -> the JobEntry list an engine installs (with `registered` on) before the steps; None: none."""

    def configured(self, config):
        """`config` as this scenario runs at it: holding job tables when the scenario has jobs."""
        return replace(config, registered=True) if self.jobs else config


def at_zero(make):
    return lambda config: [(data, 0) for data in make(config)]


def _completed(config, **fields):
    """A clique of two, completed: the result goes out with the second contribution."""
    return [contribution(config, fanin=2, sender=sender, **fields) for sender in (0, 1)]


def _leased(config):
    first = contribution(config)
    stranger = contribution(config, job=CLIQUE["job"] + 1)
    return [(first, 0), (stranger, config.lease - 1), (stranger, config.lease)]


SCENARIOS = {scenario.reaches: scenario for scenario in (
    Scenario("forwarded", "frames for another address or port pass through", at_zero(lambda c: [
        contribution(c, ip_dst=c.ip ^ 0x0100), contribution(c, udp_dport=c.port ^ 1)])),
    Scenario("accumulated", "a member's contribution to an unused slot", at_zero(lambda c: [contribution(c)])),
    Scenario("answered", "a retransmission and a result request for a completed slot, and a stats request",
             at_zero(lambda c: [*_completed(c), contribution(c, fanin=2, sender=0),
                                result_request(c, fanin=2, sender=1), stats_request(c)])),
    Scenario("drop_runt", "a UDP datagram of 10 bytes: a 52-byte frame",
             at_zero(lambda c: [datagram_frame(c, bytes(10))])),
    Scenario("drop_ip_header", "IPv4 header of 6 words", at_zero(lambda c: [contribution(c, ip_ver_ihl=0x46)])),
    Scenario("drop_ip_fragment", "the more-fragments flag set", at_zero(lambda c: [contribution(c, ip_frag=0x2000)])),
    Scenario("drop_ip_checksum", "IPv4 checksum wrong", at_zero(lambda c: [
        with_byte(contribution(c), "ip_csum", lambda byte: byte ^ 0x5A)])),
    Scenario("drop_length", "a count one above the elements carried, and a header cut short",
             at_zero(lambda c: [contribution(c, count=len(ELEMENTS) + 1),
                                datagram_frame(c, contribution(c)[PAYLOAD_OFFSET:PAYLOAD_OFFSET + 60])])),
    Scenario("drop_version", "magic wrong, then version 3", at_zero(lambda c: [
        contribution(c, magic=0x4956), contribution(c, version=3)])),
    Scenario("drop_opcode", "a result sent to the aggregator, and opcode 7", at_zero(lambda c: [
        frame(c, status=0, opcode=Opcode.RESULT), frame(c, opcode=7)])),
    Scenario("drop_fanin", "fan-in 0, then one above the maximum", at_zero(lambda c: [
        contribution(c, fanin=0), contribution(c, fanin=c.max_fanin + 1)])),
    Scenario("drop_sender", "sender index equal to the fan-in, then a member outside the level",
             at_zero(lambda c: [contribution(c, sender=3), contribution(c, bitmap=0b11, expect=0b101)])),
    Scenario("drop_count", "no elements, then one more than the maximum", at_zero(lambda c: [
        contribution(c, elements=()), contribution(c, elements=range(c.max_elements + 1))])),
    Scenario("drop_group", "a group outside 239.0.0.0/8", at_zero(lambda c: [contribution(c, group=0xE0_00_00_01)])),
    Scenario("drop_slot", "the first slot index beyond the aggregator's", at_zero(lambda c: [
        contribution(c, slot=c.slots)])),
    Scenario("drop_duplicate", "the same member twice", at_zero(lambda c: [contribution(c), contribution(c)])),
    Scenario("drop_mismatch", "a second member with another exponent", at_zero(lambda c: [
        contribution(c), contribution(c, sender=1, exponent=1)])),
    Scenario("drop_collision", "another job while the slot is unfinished and its lease runs", at_zero(lambda c: [
        contribution(c), contribution(c, job=CLIQUE["job"] + 1)])),
    Scenario("drop_no_result", "a result request for an unfinished slot", at_zero(lambda c: [
        contribution(c), result_request(c, sender=1)])),
    Scenario("drop_route", "hop1 is the aggregator itself, then hop2 without hop1", at_zero(lambda c: [
        contribution(c, hop1=c.ip), contribution(c, hop2=parent_ip(c))])),
    Scenario("drop_stale", "an earlier round of the slot owner's job", at_zero(lambda c: [
        contribution(c), contribution(c, sender=1, round=CLIQUE["round"] - 1)])),
    Scenario("frames_in", "a contribution, a runt and a stats request", at_zero(lambda c: [
        contribution(c), datagram_frame(c, bytes(10)), stats_request(c)])),
    Scenario("results_emitted", "a clique of one completes at once", at_zero(lambda c: [
        contribution(c, fanin=1)])),
    Scenario("slots_reclaimed", "a newer round of the job takes the unfinished slot", at_zero(lambda c: [
        contribution(c), contribution(c, round=CLIQUE["round"] + 1)])),
    Scenario("saturations", "two members whose sum exceeds int32", at_zero(lambda c: [
        contribution(c, fanin=2, elements=(INT32_MAX, 0)),
        contribution(c, fanin=2, sender=1, elements=(1, 0))])),
    Scenario("leases_expired", "another job one tick before the lease runs out, then at it", _leased),
    Scenario("partials_emitted", "a level of one member below a parent aggregator", at_zero(lambda c: [
        contribution(c, expect=0b1, hop1=parent_ip(c))])),
    Scenario("drop_job", "the member's version 3 frame, then one naming a job without tables, then a stats "
             "request naming it", at_zero(lambda c: [
                 grouped_frame(c), grouped_frame(c, job=CLIQUE["job"] + 1),
                 job_stats_request(c, job=CLIQUE["job"] + 1)]), grouped_jobs),
    Scenario("drop_token", "the member's version 3 frame with one bit of the token flipped, then a stats request "
             "so", at_zero(lambda c: [grouped_frame(c, token=TOKEN ^ 1 << 40), job_stats_request(c, token=TOKEN ^ 1)]),
             grouped_jobs),
    Scenario("drop_member", "a partial from the member, which is no child aggregator, a contribution from "
             "another port of the member's host, the member's stats request (answered, to it), then the same "
             "from that other port (no reply: it would reflect a larger reply at whoever the source names)",
             at_zero(lambda c: [
                 grouped_frame(c, opcode=Opcode.PARTIAL, status=0, bitmap=0b10, sender=1),
                 grouped_frame(c, udp_sport=HOST_PORT + 1), job_stats_request(c),
                 job_stats_request(c, udp_sport=HOST_PORT + 1)]), grouped_jobs),
    Scenario("relayed", "a member's level below the parent completes (a partial up), the parent's result comes "
             "down: sent to the member, once", at_zero(lambda c: [
                 job_frame(c, fanin=1, clique=TREE_CLIQUE),
                 job_frame(c, fanin=1, clique=TREE_CLIQUE, opcode=Opcode.RESULT, status=0, bitmap=0b1,
                           elements=(5, 6), ip_src=parent_ip(c), udp_sport=c.port)]), table_jobs),
)}

JOB_SCENARIOS = {d.name.lower() for d in JOB_DISPOSITIONS}
"""The scenarios that need job tables."""
assert all(SCENARIOS[name].jobs for name in JOB_SCENARIOS)

FRAME_ONLY = {"forwarded": "not addressed to the service: no socket of it receives the frame",
              "drop_ip_header": "IPv4 options: the kernel delivers only the payload",
              "drop_ip_fragment": "a fragment: the kernel reassembles or discards it",
              "drop_ip_checksum": "the kernel discards a frame with a wrong IPv4 checksum"}
"""Scenarios that datagram engines cannot be given, and why."""


def missing_scenario(name):
    """Why a counter has no scenario, for the engine tests to fail with, by the counter's name."""
    return f"the traffic table has no scenario that exists to reach {name!r} (add one to tests/traffic.py)"


@dataclass(frozen=True)
class Outcome:
    dispositions: tuple
    """Each frame's disposition, by counter name ('none' or 'a+b' when not exactly one moved)."""
    outputs: tuple
    """Each frame's outputs, as UDP payloads."""
    counters: dict
    destinations: tuple | None = None
    """With job tables: each frame's outputs' (IPv4 address as an int, UDP port), which the tables decide."""


def moved_disposition(before, after):
    moved = [d.name.lower() for d in Disposition if after[d.name.lower()] != before[d.name.lower()]]
    return "+".join(moved) or "none"


def payloads(frames):
    return tuple(bytes(data[PAYLOAD_OFFSET:]) for data in frames)


def model_outcome(scenario, config):
    """What the golden model does with the scenario's frames: the expectation every engine is held to."""
    aggregator = Aggregator(scenario.configured(config))
    for entry in scenario.jobs(config) if scenario.jobs else ():
        aggregator.install(entry)
    dispositions, outputs, destinations = [], [], []
    for data, now in scenario.steps(config):
        before = aggregator.stats()
        sent = aggregator.process(data, now)
        outputs.append(payloads(sent))
        destinations.append(tuple((frame_field(out, "ip_dst"), frame_field(out, "udp_dport")) for out in sent))
        dispositions.append(moved_disposition(before, aggregator.stats()))
    return Outcome(tuple(dispositions), tuple(outputs), aggregator.stats(),
                   tuple(destinations) if scenario.jobs else None)


def as_datagram(data, config):
    """(payload, source address as an int, source port) of a frame that is a UDP datagram to the aggregator of `config`
    as a kernel would deliver it (`datagram.wrap` makes it again byte for byte), else None."""
    if len(data) < PAYLOAD_OFFSET:
        return None
    source, destination = frame_field(data, "ip_src"), frame_field(data, "ip_dst")
    port, dport = frame_field(data, "udp_sport"), frame_field(data, "udp_dport")
    payload = bytes(data[PAYLOAD_OFFSET:])
    again = wrap(payload, (ip_str(source), port), (ip_str(destination), dport), bytes(data[:6]), bytes(data[6:12]))
    if again != bytes(data) or (destination, dport) != (config.ip, config.port):
        return None
    return payload, source, port


TABLE_CONFIG = AggregatorConfig()
"""The configuration the software engines run the table at (`Scenario.configured` adds job tables)."""
GATEWARE_CONFIG = replace(TABLE_CONFIG, registered=True, limits=GATEWARE_LIMITS)
"""The gateware's: job tables of the gateware's size beside unregistered frames. The cocotb suite builds the
same (tests/test_gateware_sim.py), so that the table needs no build of its own."""
