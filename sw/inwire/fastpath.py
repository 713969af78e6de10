"""The fast software aggregator: `model.Aggregator`'s decisions taken on the UDP payload itself, in C.

`inwire serve` receives UDP payloads. The golden path wraps each one in the Ethernet/IPv4/UDP header it
would have carried and hands the frame to the model; this path skips the frame. What the wrapping makes
certain is not checked again: a wrapped datagram is always IPv4/UDP addressed to the service, its IPv4
header is 0x45, not a fragment and its checksum is right (`datagram.wrap` computed it). Version 1 and
version 2 datagrams are taken, as the model takes them (a version 1 one is a flat one-member contribution,
answered in version 1), and, with job tables (`AggregatorConfig.registered`), version 3 datagrams of the
registered jobs, whose answers go where the tables say. Everything else is checked in the model's order,
so every datagram gets the model's disposition and output, bit for bit, and the model's counters. The model
stays the definition: `tests/test_fastpath.py` feeds both the same random and adversarial streams and
compares every output, destination and counter, and shows the comparison failing on a decider with one of
its numbers wrong.

`FastAggregator` hands each datagram to the compiled kernel's `Decider` (_fastpath.c, in `inwire._kernel`),
which holds the slot table and decides in one call per datagram; for `inwire serve` it also keeps serve.py's
learning table (who sent each slot's contributions and partials) and makes a result's unicast copies. Where
the kernel is not built, `inwire serve` runs the golden model instead. No disposition, opcode, header offset,
counter index or other protocol number is written in the C code: `decider_parameters` passes them in from
the protocol tables.

Where the time goes in the decider: the header's fields are read in place; a slot's sums live in its output
payload (big-endian int32, clipped per contribution: clipping once at the end is not the model, MAX + MAX -
MAX must give 0 with the overflow flag), so completing it writes only the header and status; answering a
retransmission or request patches only what its asker decides (version, opcode, sender index and route: a
partial to the asker's hop1, or the result); a slot's lease stamp is the arrival time of its last accepted
contribution, compared only when another owner wants an unfinished slot.
"""

from collections.abc import Iterable
from dataclasses import replace

from .datagram import PAYLOAD_HEADER_BYTES, PAYLOAD_OFFSET
from .datagram import payload_at as _at
from .jobs import Endpoint, JobEntry, JobTable
from .kernel import compiled
from .model import TIME_BITS, AggregatorConfig, _prefix_mask
from .protocol import (
    AGGREGATION_FIELDS,
    COUNTERS,
    ELEMENT_BYTES,
    FIELDS_BY_NAME,
    FRAME_HEADER_BYTES,
    IPV4_BYTES,
    JOB_VERSION,
    MAGIC,
    MAX_FANIN,
    MIN_FRAME_BYTES,
    MULTICAST_MASK,
    MULTICAST_PREFIX,
    RESULT_TRAILER_BYTES,
    STATUS_OVERFLOW,
    UDP_BYTES,
    VERSION,
    VERSIONS,
    Disposition,
    Opcode,
)

ROUTE_AT, ROUTE_END = _at("expect"), _at("reserved")
"""The route of an output: `expect`, `hop1`, `hop1_expect`, `hop2`, `hop2_expect`."""
HOP1_AT, HOP1_EXPECT_AT = _at("hop1"), _at("hop1_expect")
# A partial's route is its asker's from `hop1_expect` on, moved to `expect`, in one copy (_fastpath.c's
# write_route): expect <- hop1_expect, hop1 <- hop2, hop1_expect <- hop2_expect.
assert (_at("hop2") - HOP1_EXPECT_AT, _at("hop2_expect") - HOP1_EXPECT_AT) == (HOP1_AT - ROUTE_AT,
                                                                                HOP1_EXPECT_AT - ROUTE_AT)
RUNT_PAYLOAD = MIN_FRAME_BYTES - PAYLOAD_OFFSET
"""Payloads shorter than this make frames shorter than 60 bytes."""
MAX_PAYLOAD = 0xFFFF - IPV4_BYTES - UDP_BYTES
"""Longest payload whose IPv4 total length fits 16 bits; a longer one wraps the length field."""
_V1 = VERSIONS[0]
_COUNTER_INDEX = {name: index for index, name in enumerate(COUNTERS)}
_TIME_MASK = 2**TIME_BITS - 1
assert STATUS_OVERFLOW < 0x100, "a partial's carried overflow is read from the trailer's last byte"
assert MAX_FANIN <= 8 * FIELDS_BY_NAME["bitmap"].nbytes, "a member bitmap holds every member"
assert FRAME_HEADER_BYTES - PAYLOAD_OFFSET == PAYLOAD_HEADER_BYTES


def decider_parameters(config: AggregatorConfig) -> tuple[dict[str, tuple[int, int]], dict[str, int], dict[str, int]]:
    """(fields, constants, config) of the compiled `Decider` for `config`: each aggregation header field's
    (offset within the payload, width), and every number it decides with, named as `_fastpath.c` reads them,
    from the protocol tables."""
    fields = {field.name: (_at(field.name), field.nbytes) for field in AGGREGATION_FIELDS}
    constants = {
        "header_bytes": PAYLOAD_HEADER_BYTES, "element_bytes": ELEMENT_BYTES, "trailer_bytes": RESULT_TRAILER_BYTES,
        "runt_payload": RUNT_PAYLOAD, "max_payload": MAX_PAYLOAD, "max_members": MAX_FANIN, "magic": MAGIC,
        "version": VERSION, "version_1": _V1, "version_job": JOB_VERSION, "multicast_mask": MULTICAST_MASK,
        "multicast_prefix": MULTICAST_PREFIX,
        "status_overflow": STATUS_OVERFLOW, "time_mask": _TIME_MASK, "counters": len(COUNTERS),
        **{opcode.name.lower(): int(opcode) for opcode in Opcode},
        **{member.name.lower(): int(member) for member in Disposition},
        **{name: _COUNTER_INDEX[name] for name in ("frames_in", "results_emitted", "slots_reclaimed", "saturations",
                                                    "leases_expired", "partials_emitted")}}
    return fields, constants, _decider_config(config)


def _decider_config(config: AggregatorConfig) -> dict[str, int]:
    network, length = config.upstream_prefix
    return {"slots": config.slots, "max_fanin": config.max_fanin, "max_elements": config.max_elements,
            "lease": config.lease, "ip": config.ip, "port": config.port, "upstream_network": network,
            "upstream_mask": _prefix_mask(length), "registered": int(config.registered),
            "unregistered": int(config.unregistered), "unicast_results": int(config.limits.unicast_results)}


def _tables(entry: JobEntry, base: int) -> tuple[int, int, int, int, int, list[tuple[int, int]], list[tuple]]:
    """`entry` at `base` as the compiled decider's `install_job` takes it."""
    routes = [(clique, route.level, route.parent, sorted(route.children.items()))
              for clique, route in entry.routes.items()]
    return entry.job, entry.token, base, entry.slots, entry.group, sorted(entry.members), routes


class FastAggregator:
    """The compiled decider for `config`: `handle(payload, now=None, source=0, peer=None)` -> (disposition,
    answer payload or None) of one datagram that arrived at `now` (lease ticks; None: no time passed since the
    previous one) from IPv4 address `source` (an int, or a dotted string as a socket gives it, read only when
    the datagram names a next hop), counted, with the model's state and counters; given `peer` it learns
    serve's table too. `serve_batch` (a recvmmsg batch) takes serve's common case, `learned` is serve's learning
    table and `copies` makes a result's unicast copies (`_kernel.Decider`): `serve.LearningTable`'s interface.

    Registered jobs (version 3): `install(entry)` and `remove(job)` are the model's. `jobs` (a `jobs.JobTable`)
    allocates each job's range and merges its members, as the model's does; the decider holds a copy of each
    entry, checks version 3 frames against it and answers them with the list of (payload, (host, port)) that
    the job's tables send to (`source` is then the datagram's (host, port))."""

    def __init__(self, config: AggregatorConfig) -> None:
        if compiled is None:
            raise ValueError("the compiled fast path (inwire._kernel) is not built; run `make setup`")
        self._config = config
        self._decider = compiled.Decider(*decider_parameters(config))
        self.jobs = JobTable(config.slots, config.limits)
        # The compiled methods themselves: no Python frame around them, once per datagram.
        self.handle = self._decider.handle
        self.serve_batch = self._decider.serve_batch
        self.copies = self._decider.copies
        self.learned = self._decider.learned

    @property
    def config(self) -> AggregatorConfig:
        return self._config

    @config.setter
    def config(self, config: AggregatorConfig) -> None:
        """Another configuration (addresses, limits, lease) for the same number of slots; the state stays."""
        if config.slots != self._config.slots:
            raise ValueError(f"the fast path has {self._config.slots} slots; a configuration cannot change that")
        self._decider.configure(_decider_config(config))
        self._config = config

    def install(self, entry: JobEntry) -> int:
        """Install or renew a job's tables (`model.Aggregator.install`); returns the first slot of its range."""
        if not self._config.registered:
            raise ValueError("this aggregator holds no job tables (AggregatorConfig.registered is off)")
        held = self.jobs.entries.get(entry.job)
        base = self.jobs.install(entry)
        try:
            self._decider.install_job(*_tables(self.jobs.entries[entry.job], base))
        except BaseException:
            # The decider refused or ran out of memory: the table stays as the decider has it.
            if held is None:
                self.jobs.remove(entry.job)
            else:
                self.jobs.entries[entry.job] = held
            raise
        return base

    def remove(self, job: int) -> bool:
        """Tear a job down (`model.Aggregator.remove`): its slots become free and forget their sums."""
        self._decider.remove_job(job)
        return self.jobs.remove(job)

    def leave(self, job: int, members: Iterable[Endpoint]) -> tuple[int, int]:
        """`members` leave `job` (`model.Aggregator.leave`): the decider's copy of the job's tables is
        replaced by one without them, its slots kept; the last member's leave removes the job."""
        entry, members = self.jobs.entries.get(job), frozenset(members)
        if entry is None:
            return 0, 0
        staying = entry.members - members
        if not staying:
            self.remove(job)
            return len(entry.members), 0
        if staying != entry.members:
            # The decider first: should it refuse, the table stays as the decider has it.
            self._decider.install_job(*_tables(replace(entry, members=staying), self.jobs.bases[job]))
        return self.jobs.leave(job, members)

    def stats(self) -> dict[str, int]:
        return dict(zip(COUNTERS, self._decider.counts(), strict=True))

    def slot_key(self, slot: int) -> tuple[int, int, int, int] | None:
        return self._decider.slot_key(slot)


def next_hop(payload: bytes | bytearray | memoryview) -> int:
    """The IPv4 address (an int) that a partial answering datagram `payload` goes to: the payload's hop1
    (to the aggregators' common port). Only meaningful when the answer is a partial."""
    return int.from_bytes(payload[HOP1_AT:HOP1_EXPECT_AT], "big")
